/* worker.h - a node's work, without its socket: the stage a router assigned,
 * its activation cache, and the answer to each of the router's requests
 * (FWD, BWD, STEP, UPDATE, STATE, STATE_GET) as docs/swarm.md says. `swarm
 * node` (daemon.c) wraps it in a connection, a queue and timers; `swarm sim
 * --numeric` (sim.c) runs one per simulated peer. Everything in a request
 * is checked before use: a bad one gets an error naming the problem.
 */
#ifndef SWARM_NODE_WORKER_H
#define SWARM_NODE_WORKER_H

#include "net.h"
#include "node.h"

// Ways a worker lies (tests/test_hostile.sh, swarm sim --liars): a NaN in
// its activations, activations 1000x too large, the right values in the
// wrong places, parameters that drift from its replicas' after each update;
// a gradient sum pointing the other way (grad), a norm-only sum of squares
// of 1e300 (sumsq), the true loss with its input gradient reversed (dx),
// a stage state other than the one its checksum is of (state), a gradient
// sum true but for one element of FLT_MAX, which overflows any fp16 sum
// and, added to the others', every norm (gradinf); activations and input
// gradients each 1.5 times the size of the last (rmswalk: up a bound that
// learned from each); the checksum of the parameters its replicas hold
// while it computes with others (checksum); the sums it recomputes of
// another replica's share for an audit pointing the other way, its own
// true (recount).
enum { NODE_LIE_NONE, NODE_LIE_NAN, NODE_LIE_SCALE, NODE_LIE_DRIFT, NODE_LIE_SHUFFLE,
       NODE_LIE_GRAD, NODE_LIE_SUMSQ, NODE_LIE_DX, NODE_LIE_STATE, NODE_LIE_GRADINF,
       NODE_LIE_RMSWALK, NODE_LIE_CHECKSUM, NODE_LIE_RECOUNT };

typedef struct node_worker_s node_worker_t;

typedef struct {
    blas_backend_t *be;      // compute (not owned)
    long cache_mb;           // MiB of cached activations at most
    size_t memory;           // bytes it may hold for its stage (node_plan_stage_memory), 0 any
    double slowdown;         // >= 1: sleep so that work takes this many times longer
    // a notable line (assigned, state loaded, every tenth update), without
    // a newline; NULL: none
    void (*log)(void *ctx, const char *line);
    void *ctx;
} node_worker_config_t;

typedef struct {
    int stage;               // assigned stage, -1 none
    int stages;              // of S
    int ready;               // a state is loaded
    long step;               // updates applied
    double tok_s;            // training tokens/s measured on its stage, 0 none yet
    double busy;             // s: compute of the last FWD or BWD
    size_t slots;            // micro-batches the activation cache holds (0 before the first)
    long samples_total;      // micro-batches of gradient computed, all steps
    size_t memory_used;      // bytes its stage holds now: state, buffers, the cache's slots
} node_worker_status_t;

node_worker_t *node_worker_new(const node_worker_config_t *c);
void node_worker_destroy(node_worker_t **self_p);
// --slowdown's sleep of `extra` s after a request: nap(want) sleeps and
// returns the seconds it really slept. It naps for extra less what earlier
// naps overran (*overran, carried from call to call, kept to at most one
// sleep's worth: a node stopped in its sleep is not owed that stop), and
// returns the seconds slept, which the node's tok/s counts.
double node_worker_slow_sleep(double extra, double *overran, double (*nap)(double want));
// From step `from` on, lie in this way (NODE_LIE_*).
void node_worker_lie(node_worker_t *self, int mode, long from);
// ASSIGN: build the stage it names. 0 built, 1 the same assignment (kept),
// or -errno with the reason in err.
__attribute__((warn_unused_result))
int node_worker_assign(node_worker_t *self, const net_msg_t *msg, char *err, size_t errlen);
// A request of the router: 0 and the reply (NULL for none), or -errno with
// the reason in err (answer it with node_worker_error).
__attribute__((warn_unused_result))
int node_worker_serve(node_worker_t *self, const net_msg_t *req, net_msg_t **reply, char *err,
                      size_t errlen);
// The ERROR reply to req: reason=TEXT on one line.
net_msg_t *node_worker_error(const net_msg_t *req, const char *reason);
void node_worker_status(const node_worker_t *self, node_worker_status_t *out);
// msg's meta set to text, or "key=value" lines added after what it has
// (both abort when the meta cannot hold them: our own metas are short).
void node_meta_set(net_msg_t *msg, const char *text);
void node_meta_add(net_msg_t *msg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
