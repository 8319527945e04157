/* worker_int.h - what worker.c and worker_read.c share (private to
 * node/worker*.c): the worker's state, and the checked reading of a
 * request's fields and tensors.
 */
#ifndef SWARM_NODE_WORKER_INT_H
#define SWARM_NODE_WORKER_INT_H

#include "worker.h"

#include <stdint.h>

#define WORKER_SLOTS_MAX 256        // micro-batches of cached activations at most

typedef struct {
    node_acts_t *acts;        // activations of one micro-batch (micro windows)
    uint64_t step;            // key: step of the FWD that filled it
    uint32_t mb;              // key: micro-batch of that FWD
    uint64_t seq;             // fill order (larger = newer); 0 = free
} slot_t;

typedef struct {
    node_config_t cfg;        // model shape
    int stages;               // S
    int stage;                // s
    int micro;                // windows per micro-batch
    long peer;                // the router's id for us (logs), -1 unknown
    long step;                // the swarm's step
    int wire;                 // NET_DTYPE_* of the activations and dx we send (meta wire)
    int grad_wire;            // NET_DTYPE_* of the gradient sums we send (meta grad_wire)
    int cut;                  // 1: the router said its cut (meta cut=), in plan
    node_plan_t plan;         // that cut; else node_plan_make's of S
} assign_t;

#define WORKER_LIE_KEPT 4096 // parameters a checksum liar changes after each update

struct node_worker_s {
    node_worker_config_t c;
    assign_t as;                           // what we were assigned
    node_memory_t mem;                     // what its stage holds (node_plan_stage_memory)
    node_plan_t plan;                      // stages of as.cfg
    node_stage_t *stage;                   // NULL until ASSIGN
    int ready;                             // 1 once STATE loaded the stage
    long step;                             // updates applied
    long samples;                          // micro-batches accumulated since UPDATE
    long samples_total;                    // micro-batches of gradient computed here, all steps
    int norm_only;                         // the last STEP asked only for the sum of squares
    double sumsq;                          // the sum of squares that STEP answered
    long grad_sent;                        // the step whose gradient sum STEP sent, -1 none
    long audit_step;                       // the step an audit recomputes into the gradient
                                           // buffer (its own sum sent), -1 none
    long audit_samples;                    // micro-batches of that audit
    int audit_open;                        // it accumulates (the next audit starts afresh)
    int32_t *tokens, *targets;             // (micro, T)
    float *x, *dy, *out;                   // (micro, T, C)
    slot_t slots[WORKER_SLOTS_MAX];        // activation cache, nslots used
    int nslots;                            // slots with acts allocated
    uint64_t seq;                          // last slot fill number
    double tok_s;                          // training tokens/s on its stage (0 = none yet)
    double work_tok, work_s;               // decaying sums behind tok_s (s_tok_s_note)
    double busy;                           // s: compute of the last FWD/BWD (with --slowdown)
    double usual_s[3];                     // s: usual compute of a FWD, BWD, fused pair (0 = none yet)
    double overslept;                      // s: what --slowdown's sleeps overran, owed back
    int lie;                               // NODE_LIE_*
    long lie_from;                         // the step it starts at
    double lie_walk;                       // rmswalk: the next lie's factor (1 before the first)
    float lie_kept[WORKER_LIE_KEPT];       // checksum: the true values of the parameters it
    size_t lie_kept_n;                     // changed since its update, 0 none
};

// Whether w lies in this way now.
static inline int worker_lying(const node_worker_t *w, int mode)
{
    return w->lie == mode && w->step >= w->lie_from;
}

// ---- reading requests (worker_read.c): 0, or -EPROTO with the reason ----

// Meta key as a whole number in lo..hi.
int worker_meta_long(const net_msg_t *msg, const char *key, long lo, long hi, long *out,
                     char *err, size_t n);
// Meta key as a finite number in lo..hi (-ENOENT when absent).
int worker_meta_double(const net_msg_t *msg, const char *key, double lo, double hi, double *out,
                       char *err, size_t n);
// req has exactly `want` tensors.
int worker_count_check(const net_msg_t *req, int want, char *err, size_t n);
// Tokens or targets, tensor i: i32 (micro, T), each a byte value.
int worker_tokens_get(node_worker_t *w, const net_msg_t *req, int i, int32_t *dst,
                      const char *what, char *err, size_t n);
// Activations, tensor i: floats (micro, T, C).
int worker_acts_get(node_worker_t *w, const net_msg_t *req, int i, float *dst, const char *what,
                    char *err, size_t n);
// A stage-sized vector, tensor i: f32 [n], exact.
int worker_vector_get(node_worker_t *w, const net_msg_t *req, int i, float *dst,
                      const char *what, char *err, size_t n);
// A stage-sized gradient sum, tensor i: f32 [n], or the fp16/int8 of --grad-wire.
int worker_grad_get(node_worker_t *w, const net_msg_t *req, int i, float *dst, char *err,
                    size_t n);
// The stage input, tensor 0: tokens on stage 0, else x, into w's buffers.
int worker_input_get(node_worker_t *w, const net_msg_t *req, char *err, size_t n);
// A request for the stage we hold.
int worker_check_stage(const node_worker_t *w, const net_msg_t *req, char *err, size_t n);
// A request for our stage (and, need_step, our step) with a state loaded.
int worker_check_request(node_worker_t *w, const net_msg_t *req, int need_step, char *err,
                         size_t n);
// Append an activation-shaped tensor (micro, T, C) of src to msg, in the
// assigned wire format (or as a liar sends it).
int worker_acts_add(node_worker_t *w, net_msg_t *msg, const float *src, const char *what,
                    char *err, size_t n);
// ASSIGN's meta, checked, into a.
int worker_assign_parse(const net_msg_t *msg, assign_t *a, char *err, size_t n);
// a is what w holds already.
int worker_assign_same(const node_worker_t *w, const assign_t *a);

#endif
