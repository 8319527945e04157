/* router_int.h - what `swarm router` and `swarm sim` share (private to
 * node/): the shell's state (router_t), its flags and set-up, and the
 * engine callbacks that belong to the model (the schedule, the clip) and
 * to the terminal (log lines, the progress line and the loss log).
 */
#ifndef NODE_ROUTER_INT_H
#define NODE_ROUTER_INT_H

#include "node.h"
#include "net.h"
#include "swarm.h"

#include <pthread.h>
#include <stdio.h>

_Static_assert(SWARM_MAX_STAGES == NODE_MAX_LAYERS, "a plan's stages fit the engine's tables");

typedef struct {
    node_train_opts_t o;     // model and training flags
    node_hparams_t hp;       // the same, resolved
    node_plan_t plan;        // stages
    swarm_engine_config_t c; // what the engine is made with (the flags and the plan)
    swarm_engine_t *engine;  // the router's logic
    swarm_data_t *data;      // training bytes (the engine reads them)
    const char *listen;      // bind endpoint
    const char *key_name;    // router key pair NAME
    const char *allow_path;  // allow-list file, NULL = open
    net_key_t *key;          // router key
    net_allow_t *allow;      // allow-list
    net_server_t *srv;       // ROUTER
    int64_t reaped_at;       // ms: the last look for silent peers (router.c)
    const char *trace_path;  // --trace FILE
    FILE *trace;             // a line per request sent and done, per step ended
    node_curve_t logs;       // --loss-log and DIR/loss.csv
    float *curve;            // [iters + 1] losses for the plot
    node_evals_t evals;      // every evaluation's results, for DIR/loss.svg
    pthread_t ck_writer;     // writes the last checkpoint to --save DIR
    int ck_writing;          // ck_writer runs: the engine's params/m/v are not to change
    long ck_step;            // the step it writes
    const float *ck_params, *ck_m, *ck_v; // the engine's state it writes
    double t_start;          // s (net_clock_ms) at the start of the run
    int auto_stages;         // --stages auto: planned once nodes have joined (router_plan.c)
    int auto_replicas;       // the replicas a stage its plan was chosen for (2, else 1)
    double need_scale;       // each stage's state (in its need) times this (swarm sim
                             // --as-params), 0: 1
    void *gathered;          // the HELLOs kept meanwhile, for the engine
    int ngathered;           // of them
} router_t;

// Exact steps fill and drain the pipeline once a step: over S equal stages
// each waits about (S - 1) / (G + S - 1) of it for G micro-batches.
#define MICRO_IDLE 0.10      // the share of a step the router accepts for it
#define MICRO_MIN_TOKENS 64

// Flags of swarm router and swarm train, the data, the initial state, the
// plan; 1 for --help, 0, or -errno with a reason in err.
int router_setup(router_t *r, int argc, char **argv, char *err, size_t n);
// The engine's config from the model, the plan and the flags.
void router_config(router_t *r);
// What a node holds for a stage of memory m (node_memory_need), its state
// times need_scale.
double router_need(const router_t *r, node_memory_t m);
// Each stage's parameters, offset, cost and need (swarm_engine_config_t's
// stage_*) in the cut `plan`, at the run's micro-batch.
void router_cut_tables(const router_t *r, const node_plan_t *plan, size_t *n, size_t *off,
                       double *cost, double *need);
// swarm_engine_io_t.cut with --stages auto (router_plan.c), ctx a router_t.
int router_io_cut(void *ctx, int stages, const double *mem, int nmem, size_t *n, size_t *off,
                  double *cost, double *need, char *text);
double router_fill_idle(int G, int S);
// The smallest batch of micro-batches of `micro` windows whose fill and
// drain over S stages is at most MICRO_IDLE of a step (what the start-up
// line suggests when the batch is too small for the pipeline).
int router_batch_for(int micro, int S);
// The micro-batch the router picks without --micro-batch for S stages of
// R replicas each (router_setup.c).
int router_micro_choose(int batch, int T, int S, int R);
// --stages auto (router_plan.c): listen until the nodes that joined can
// hold a plan, then set it (r->plan, r->o.stages, r->hp.micro, r->c);
// 0, or -EINTR on *stop. The HELLOs kept go to the engine with
// router_gathered_replay once it exists.
int router_gather(router_t *r, volatile sig_atomic_t *stop, char *err, size_t n);
void router_gathered_replay(router_t *r);
// The plan for nodes of budgets mem[n] (0: any) and speeds speed[n] (as
// their HELLOs say; 0 unknown), as router_gather chooses it
// (swarm_policy_cut_choose, which fills bounds[SWARM_MAX_STAGES] when not
// NULL): 0 with r->plan, r->o.stages, r->hp.micro set; -EAGAIN with what
// the swarm would need in why.
int router_plan_for(router_t *r, const double *mem, const double *speed, int n, double *bounds,
                    char *why, size_t wn);
// The start-up line of what a node holds for each stage, and
// router_cut_say's.
void router_needs_say(const router_t *r);
// When the cut is not node_plan_make's, a line "WHO: the model is cut
// within the nodes' memory, ..." with each stage's blocks.
void router_cut_say(const router_t *r, const char *who);
int router_tty(void);
// swarm_engine_io_t callbacks, ctx a router_t
void router_io_log(void *ctx, int to_stderr, const char *line);
void router_io_trace(void *ctx, const char *line); // to --trace FILE
double router_io_lr_at(void *ctx, long step);
float router_io_clip_scale(void *ctx, double norm);
void router_io_stepped(void *ctx, const swarm_engine_step_t *st);

#endif
