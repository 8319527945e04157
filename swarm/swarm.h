/* swarm.h - the swarm module: training data and its batch order, the
 * policy, and the router engine that runs a swarm's training.
 *
 * The data order is a pure function of (seed, step, window), so any process
 * can draw any micro-batch of any step, and a replay sees the same bytes.
 * The engine does no I/O and reads no clock: messages and time come in as
 * arguments, and what it sends, logs and writes leaves through the
 * callbacks its caller gives it (swarm_engine_io_t). It knows stages as
 * parameter counts and costs, not the model.
 */
#ifndef SWARM_SWARM_H
#define SWARM_SWARM_H

#include "net.h"

#include <stddef.h>
#include <stdint.h>

// ---- data ----

typedef struct swarm_data_s swarm_data_t;

// Read a file of raw bytes. Returns 0, or -errno with a reason in err.
__attribute__((warn_unused_result))
int swarm_data_load(const char *path, swarm_data_t **out, char *err, size_t errlen);
// Wrap bytes the caller keeps alive (e.g. the built-in corpus).
swarm_data_t *swarm_data_wrap(const uint8_t *bytes, size_t n, const char *name);
void swarm_data_destroy(swarm_data_t **self_p);
const char *swarm_data_name(const swarm_data_t *self);
size_t swarm_data_size(const swarm_data_t *self);
// The splits: train = first int(0.9 n) bytes, val = the rest.
const uint8_t *swarm_data_split(const swarm_data_t *self, int val, size_t *n);
// 0 when both splits are long enough for windows of T+1 bytes, else -EINVAL
// with a reason naming the file and the sizes.
__attribute__((warn_unused_result))
int swarm_data_check(const swarm_data_t *self, int T, char *err, size_t errlen);

// splitmix64: advance *state and return the next value.
uint64_t swarm_splitmix64(uint64_t *state);
// The sum of squares of x[0..n) in double, in four chains of adds (a
// quarter of one chain's latency): the same as one chain's where every
// square and partial sum is exact (small integers and halves, as the
// sim's gradients), within rounding of it otherwise.
double swarm_sumsq(const float *x, size_t n);

// Windows [first, first + count) of training step `step` (B windows a step,
// one stream from `seed` running on across steps): x, y are (count, T).
void swarm_data_train_batch(const swarm_data_t *self, uint64_t seed, long step, int B,
                            int first, int count, int T, int32_t *x, int32_t *y);
// The next `count` windows of a split from a running stream (evaluation).
void swarm_data_draw(const swarm_data_t *self, int val, uint64_t *state,
                     int count, int T, int32_t *x, int32_t *y);

// ---- policy (pure: no I/O, no clock) ----

typedef struct {
    int stage;        // assigned stage, -1 none
    int ready;        // serving its stage
    int joining;      // assigned, loading its state
    int inflight;     // requests we have outstanding at it
    int queue;        // requests it reported queued
    double backlog;   // training tokens of work it holds: requests in flight
                      // and the backwards it owes for forwards it ran
    double ahead;     // s: compute of its requests in flight, as it reports it
    double rtt;       // s: its network round trip
    double tok_s;     // tokens per second, EMA
    double moved_at;  // seconds (caller's clock) of its last stage move; -1e30 never
    double memory;    // bytes it may hold for a stage; 0 unknown (any)
} swarm_peer_view_t;

// Peer v can hold stage s: need[s] (bytes a node holds for it) within its
// memory. Without a need (NULL, or 0) or a budget (0), it can.
int swarm_policy_holds(const swarm_peer_view_t *v, const double *need, int s);

// The ready peer of `stage` that would finish all it holds soonest if
// given `work` more training tokens of work: (backlog + work) / tok_s.
// `prefer` (an index or -1) already holds this work in its backlog (a
// backward it owes for the forward it ran): it finishes at backlog / tok_s,
// and loses only to a peer that would be done before that even with the
// work recomputed. Balancing finish times is what makes every replica of a
// stage end a step together. -1 when the stage has no ready peer.
int swarm_policy_pick(const swarm_peer_view_t *peers, int n, int stage, int prefer, double work);

// A step's training forward: the stage still has `left` forwards of `work`
// each to take this step (this one included), so it ends the step at about
// end = (all it holds + left * work) / its summed tok_s. A replica about to
// run dry (fewer than two requests in flight, or less compute in flight
// than two of its round trips) that would be done by then takes it: the
// fewest in flight, then the fastest. Else SWARM_HOLD: the caller keeps the
// forward and asks again when a replica has answered, so forwards are
// bound late and none waits in a slow replica's queue behind the backwards
// it is sent (a node serves a BWD first) while a faster one could run it.
// When no replica would be done by then (the step's tail): the earliest
// finish (swarm_policy_pick) once it is about to run dry, else SWARM_HOLD.
// A stage's only replica too takes it once it is about to run dry, so that
// a replica that joins the stage meanwhile can take its share; -1 when
// the stage has no ready peer.
#define SWARM_HOLD (-2)
int swarm_policy_pick_fit(const swarm_peer_view_t *peers, int n, int stage, double work, int left);
// A stage's rows for picks that read only the rows that could be chosen:
// in the order of their speed, the fastest first, a pick stops at the first
// row that is too slow to finish the work in time (or before the best
// found) with nothing held, and every row after it is slower still. The
// stage's sums are kept alongside, as the caller updates its rows.
typedef struct {
    const swarm_peer_view_t *view; // [n]
    int n;
    const int *order; // [n] the rows by max(tok_s, 1), fastest first; ties: the lower index first
    double held;      // the ready rows' summed backlog and summed max(tok_s, 1) as
    double rate;      // swarm_policy_sums gives them, within held_err and rate_err
    double held_err, rate_err;
} swarm_rows_t;
// The ready rows' sums of `stage`, in index order: backlog, max(tok_s, 1).
void swarm_policy_sums(const swarm_peer_view_t *peers, int n, int stage, double *held, double *rate);
// swarm_policy_pick and swarm_policy_pick_fit over rows->view, the same
// answers (where the sums kept leave a row's fit in doubt, or a row's tok_s
// is under 1, it reads them all).
int swarm_policy_pick_in(const swarm_rows_t *rows, int stage, int prefer, double work);
int swarm_policy_pick_fit_in(const swarm_rows_t *rows, int stage, double work, int left);
// The stage a joining node `me` (its view, for its memory) should serve,
// among those it can hold (need: bytes a node holds for each, NULL none):
// least total throughput of its ready and joining peers, then fewest
// replicas, then the lowest index. -1 when it can hold none.
int swarm_policy_assign(const swarm_peer_view_t *peers, int n, int stages, const double *need,
                        const swarm_peer_view_t *me);
// The same by count alone: the stage with the fewest ready and joining
// peers, then the lowest index (speeds are not consulted).
int swarm_policy_assign_even(const swarm_peer_view_t *peers, int n, int stages, const double *need,
                             const swarm_peer_view_t *me);

// A cut of the model (--stages auto), whose S stages need need[S] bytes
// each on a node: 1 when nodes of budgets mem[n] (bytes each may hold for
// a stage; 0 unknown: any) hold `replicas` replicas of every stage, the
// largest stage on the largest nodes, the next on the next, with to[i]
// the stage of node i (-1 for the nodes left over); else 0, every to[i]
// -1.
int swarm_policy_cut_fits(const double *need, int S, int replicas, const double *mem, int n,
                          int *to);

// The needs and costs (forward FLOPs a token) of the cut into S stages,
// need[S] and cost[S]: 0, or -1 when there is none.
typedef int (*swarm_cut_need_fn)(void *ctx, int S, double *need, double *cost);
// The cut to train with, for nodes of budgets mem[n] and speeds w[n]
// (tokens/s through the whole model, any one unit; 0 unknown: 1). Each cut
// into 1 .. most stages that the nodes hold a replica of every stage of
// (swarm_policy_cut_fits) is weighed by the bound of its best split of
// the nodes (swarm_policy_best, each node within its memory: one that
// holds no stage counts nothing). Of the cuts within 10% of the highest
// bound, one the nodes hold two replicas of every stage of comes first (a
// stage's only replica lost is a rollback), then the fewest stages (a
// stage more is a pipeline's fill and drain, and activations on the
// wire). The stages, with *replicas 2 or 1 and to[] as
// swarm_policy_cut_fits gives them for that many; -1 (*replicas 0) when
// no cut fits. bounds[SWARM_MAX_STAGES], when not NULL, gets each cut's
// bound at bounds[S - 1] (in the units of w over cost), -1 for a cut the
// nodes cannot hold, or one not weighed (more stages than most, n or the
// model has). (policy_plan.c)
int swarm_policy_cut_choose(int most, const double *mem, const double *w, int n,
                            swarm_cut_need_fn need_of, void *ctx, int *replicas, int *to,
                            double *bounds);

// Rebalancing (policy_plan.c): which stage each peer should serve so
// that the pipeline's bound, the least over stages of the summed tok_s of
// its ready and joining replicas, is highest. cost[s] is stage s's work
// per token (any unit): a peer doing tok_s on stage a does about
// tok_s * cost[a] / cost[b] on stage b.
typedef struct {
    int stages;            // S, 1..SWARM_MAX_STAGES
    const double *cost;    // [S] work per token
    const double *need;    // [S] bytes a node holds for it (swarm_policy_holds), NULL none
    const double *move_s;  // [S] seconds a moved peer's state takes to fetch, NULL 0; a
                           // plan's fetches go one after another (all through the router)
    double now, hold;      // a peer moved within `hold` seconds of `now` stays
    double margin;         // a plan must raise the bound by more than this (0.05 = 5%)
    double horizon;        // s: over this, its gain must be more than its fetches cost
    double wave_s;         // s from one wave of a plan's moves to the next (a check's
                           // interval): counted with the fetches, 0 none
    double audit;          // the fraction of steps whose gradient sums are audited (--audit),
                           // 0 none: up to 2,000 peers, every bound below is then the tokens/s
                           // of a step's mean time, audits counted (policy_audit.c, plan_value)
    double step_k;         // with audits, a step takes this many times what the bound says
                           // (its pipeline's fill and drain, its links: measured), 0 once
} swarm_plan_t;

// Seconds a token of a stage's step takes to audit (engine_audit.c) when
// its k replicas train at tok_s[k] (sorted here, fastest first): each
// replica's share, its speed over the stage's, recomputed by another, the
// largest share first, each by the replica that would finish it first,
// as the router hands them out (equal replicas' shares going round:
// engine_audit_out.c, s_verifier); the largest split among the
// SWARM_AUDIT_PARTS fastest others, each a part in proportion to its
// speed, when one of them would take SWARM_AUDIT_SPLIT_GAIN times as long
// as the split and as the stage's step; 0 for fewer than two replicas
// (none to audit). A stage's step itself takes 1 / (the summed tok_s) a
// token.
#define SWARM_AUDIT_PARTS 8
#define SWARM_AUDIT_SPLIT_GAIN 1.25
double swarm_policy_audit_s(double *tok_s, int k);
// The bound of assignment `at` (a stage for each peer; NULL: where they are).
double swarm_policy_bound(const swarm_peer_view_t *peers, int n, const swarm_plan_t *plan,
                          const int *at);
// The best assignment of every counted peer from scratch (hold ignored),
// into at[n] when not NULL, and its bound: exact up to 12 peers, a local
// search's beyond (policy_plan.c says how).
double swarm_policy_best(const swarm_peer_view_t *peers, int n, const swarm_plan_t *plan, int *at);
// swarm_policy_best of nodes known only by their budgets mem[n] (0: any)
// and their work a second w[n] (tok_s times the cost of a stage: on stage
// s each does w / cost[s]; 0 or less: 1), each starting on from[n] (-1,
// or from NULL: the first stage it holds); a node that holds no stage
// counts nothing.
double swarm_policy_best_of(const double *mem, const double *w, const int *from, int n,
                            const swarm_plan_t *plan);
// The moves that take the swarm to the best assignment it can reach now:
// to[i] each peer's stage after them (its own when it stays), and how many
// they are; 0 (to[] unchanged) when none is worth making: the new bound
// must beat the old by more than the margin, and its gain over the
// horizon be more than the whole bound for the fetches' summed seconds
// (every stage waits for them). Past 12 movable peers, of the local
// search's steps the plan takes the first k that are worth most. Only ready
// peers move, none moved within `hold`, none to a stage it cannot hold.
// While moves leave a stage it keeps two ready replicas when it has three
// or more, else one (the state a newcomer fetches, and a spare if one
// fails meanwhile), or what the plan leaves it when that is fewer: the
// moves go in waves (swarm_policy_wave), a stage's only replica leaving
// once a newcomer is ready in its place. Past 12 movable peers each stage
// keeps those among its own. A stage with none is refill's, and no plan
// is made.
// *now_bound and *new_bound get the bound before and after (no search is
// made, and the two are equal, when the bound is within the margin of the
// fractional one, every stage its exact share, which no split beats).
int swarm_policy_plan(const swarm_peer_view_t *peers, int n, const swarm_plan_t *plan, int *to,
                      double *now_bound, double *new_bound);
// The moves of plan `to` (swarm_policy_plan's, for the same peers) that
// start now, its first wave: to[i] of each move that must wait for the
// newcomers of the stage it leaves to be ready is set back to the peer's
// stage; of the moves between two stages the lightest start first, so a
// stage keeps its heaviest leavers while it waits. How many wait; -1 (and
// none start) when some never could.
int swarm_policy_wave(const swarm_peer_view_t *peers, int n, const swarm_plan_t *plan, int *to);

// Refilling: the ready peer to move into stage `empty`, which has lost every
// replica, or -1 when no stage has two or more. Of those, the move that
// leaves the highest bottleneck over the stages that have replicas (another
// stage that is empty too waits for its own refill); no margin, no hold.
int swarm_policy_refill(const swarm_peer_view_t *peers, int n, int stages, const double *cost,
                        const double *need, int empty);

// ---- log limits (pure: time is an argument) ----

#define SWARM_LOGLIMIT_SENDERS 64  // senders tracked at once (the least recent is forgotten)

typedef struct {
    char key[48];            // the sender, truncated; "" = free
    double tokens;           // lines it may write now (token bucket)
    int64_t last_ms;         // when tokens was last brought up to date
    uint64_t held;           // its lines held back since its last one written
} swarm_loglimit_sender_t;

// What the router logs about what peers send: a burst of 5 lines, then one
// line a second per sender, and at most 10 a second (burst 20) in all, so a
// flood cannot fill a disk. Zeroed = ready, with those rates; a limiter of
// other rates sets them first.
typedef struct {
    double sender_burst, sender_rate; // lines at once, and a second, per sender (0: 5, 1)
    double all_burst, all_rate;       // the same for every sender together (0: 20, 10)
    swarm_loglimit_sender_t senders[SWARM_LOGLIMIT_SENDERS]; // recent senders
    double tokens;           // lines anyone may write now
    int64_t last_ms;         // when tokens was last brought up to date
    uint64_t held;           // lines held back of senders no longer tracked
    int started;             // tokens and last_ms are set
} swarm_loglimit_t;

// May a line about `key` be written at now_ms (any monotonic ms)? 1: write
// it, followed by note (" (N similar lines not shown)" or ""); 0: it is
// held back and counted.
int swarm_loglimit_pass(swarm_loglimit_t *self, const char *key, int64_t now_ms, char *note,
                        size_t cap);

// The window: how many micro-batches the router keeps in flight. Enough to
// keep the bottleneck stage busy while the others and the network work
// (Little's law), bounded by the step and by the activation caches.
#define SWARM_WINDOW_STAGES 256

typedef struct {
    int stages;                          // S, 1..SWARM_WINDOW_STAGES
    int micro_batches;                   // G: micro-batches of the step (the upper bound)
    double rtt;                          // s: a round trip router <-> node, network only
    double work[SWARM_WINDOW_STAGES];    // s: compute of one micro-batch at stage s on one
                                         // replica (forward + backward); <= 0 unknown
    int replicas[SWARM_WINDOW_STAGES];   // ready replicas of stage s
    double pace[SWARM_WINDOW_STAGES];    // s: how often stage s's replicas together finish a
                                         // micro-batch, 1 / sum of 1 / their work (uneven
                                         // replicas); <= 0: work / replicas
    int slots[SWARM_WINDOW_STAGES];      // micro-batches stage s's replicas can cache in
                                         // all; <= 0 unknown (no bound)
    int all;                             // 1: no Little's-law bound, only G and the caches
} swarm_window_in_t;

// The window for `in`: ceil(cycle / beat) + 1, where cycle = the stages' work
// plus 2S - 1 router round trips (a micro-batch's time from its first FWD
// to its last BWD) and beat = max over stages of the pace (how often the
// bottleneck finishes one), clamped to 1..G and to the smallest cache
// of the stages 0..S-2 (the last stage caches nothing). G when a stage's
// work is unknown (nothing measured yet: every micro-batch of the step).
// With in->all: G within the caches (--window all).
int swarm_policy_window(const swarm_window_in_t *in);

// ---- the router engine (swarm/engine*.c; docs/swarm.md) ----

#define SWARM_MAX_STAGES 256
#define SWARM_CUT_MAX (4 * (SWARM_MAX_STAGES + 1) + 1) // a cut's text: S + 1 numbers < 1000
enum { SWARM_WINDOW_FIXED = 0, SWARM_WINDOW_AUTO, SWARM_WINDOW_ALL }; // --window W, auto, all

typedef struct swarm_engine_s swarm_engine_t;

// --audit's default in an open swarm (a private one: 0): the fraction of
// replicas' gradient sums that another replica recomputes (docs/swarm.md,
// "What the router checks"): a liar that lies in every sum is caught
// within 20 steps with probability 1 - 0.7^20 > 0.999
#define SWARM_AUDIT_DEFAULT 0.3
// A replica whose sums have passed SWARM_AUDIT_PROVEN audits in a row
// since it last joined is *proven*: its sums are drawn at --audit-proven,
// by default SWARM_AUDIT_PROVEN_SHARE of --audit (all of them with --audit
// 1). A liar that lies from its first sum never passes one, so it is drawn
// at --audit until it is caught (docs/swarm.md, "What the router checks").
#define SWARM_AUDIT_PROVEN 5
#define SWARM_AUDIT_PROVEN_SHARE 0.1

typedef struct {
    int V, T, C, L, H;       // vocabulary, block (tokens), channels, layers, heads
} swarm_shape_t;

typedef struct {
    swarm_shape_t shape;     // what ASSIGN tells the nodes, and the tensors' dims
    int stages;              // S, 1..SWARM_MAX_STAGES
    size_t stage_n[SWARM_MAX_STAGES];    // parameters of each stage
    size_t stage_off[SWARM_MAX_STAGES];  // its offset in the model's parameters
    double stage_cost[SWARM_MAX_STAGES]; // forward FLOPs a token through it
    double stage_need[SWARM_MAX_STAGES]; // bytes a node holds for it (node_plan_stage_memory:
                                         // its state, one micro-batch's activations, buffers);
                                         // 0 unknown: any node may take it
    char cut[SWARM_CUT_MAX]; // the cut as the caller's nodes read it (ASSIGN's cut=: the
                             // first block of each stage), "" none: S= alone says it
    size_t nparams;          // the model's parameters
    float *params, *m, *v;   // [nparams] the state the run starts from (the engine takes
                             // them; m and v may be NULL: zeros)
    long step;               // the step that state is of
    int batch, micro;        // windows a step; windows a micro-batch (divides batch)
    long iters;              // steps of the schedule
    long steps;              // steps to run now, 0 = to iters
    uint64_t seed;           // the data order
    int eval_every;          // steps between evaluations (and at the end), 0 never
    int eval_iters;          // batches an evaluation averages per split
    int save;                // take checkpoints (io.checkpoint writes them)
    int save_every;          // every this many steps, 0 only at the end
    double weight_decay;     // AdamW's, sent with each update
    double grad_clip;        // the global norm's bound
    const swarm_data_t *data; // training bytes (the caller keeps them)
    int min_nodes;           // ready nodes needed before training starts
    double rebalance_every;  // s between rebalancing checks, 0 never
    int window;              // micro-batches in flight with SWARM_WINDOW_FIXED
    int window_mode;         // SWARM_WINDOW_*
    int assign_even;         // joiners fill stages by count, speeds unheard
    double verify;           // fraction of training forwards re-run on a second replica
    double audit;            // fraction of replicas' gradient sums (of stages with two
                             // replicas or more) recomputed by another (engine_audit.c)
    double audit_proven;     // the same for a proven replica's sums (SWARM_AUDIT_PROVEN)
    uint64_t secret;         // the key the checks are drawn with: the caller draws it at
                             // random and tells no peer (the sim: from its seed)
    double tensor_bound;     // a reply's RMS above this times the running RMS fails
    int wire, grad_wire;     // NET_DTYPE_* of activations; of gradient sums
    double router_mbit;      // what the router's own link carries each way, Mbit/s: deadlines
                             // count what it has queued ahead of a request, and a move the
                             // time of its state (0: SWARM_ROUTER_MBIT)
    int open_swarm;          // any key may join: STATUS shows peers' names and keys, and
                             // the log's events, only to a member or to operator_key
    char operator_key[NET_KEY_Z85_LEN + 1]; // the router's own public key, "" none
} swarm_engine_config_t;

#define SWARM_ROUTER_MBIT 100.0 // the router's link as the engine takes it, unless told

// A step ended: what the caller logs and plots.
typedef struct {
    long step;               // the step that ended (0-based: step + 1 are done)
    long iters;              // steps of the schedule
    long stop;               // the step this run ends at: iters, or fewer with --steps
    float loss;              // the step's mean loss
    double lr;               // its learning rate
    double tok_s;            // training tokens a second since the run started
    double eta_s;            // s to stop at that rate
    int ready;               // ready peers
} swarm_engine_step_t;

#define SWARM_LOG_HELD 2

// What the engine does to the world, each through its caller. Time is
// the caller's monotonic clock in ms, given with every call in.
typedef struct {
    void *ctx;               // passed to each
    int (*send)(void *ctx, const net_peer_t *to, net_msg_t **m); // takes *m; 0 or -errno
    // a line, newline included; to_stderr | SWARM_LOG_HELD: one the log's
    // limit holds back (a join or death past its rate: the next one shown
    // counts it), which a terminal drops and the simulator reads as any
    void (*log)(void *ctx, int to_stderr, const char *line);
    void (*trace)(void *ctx, const char *line);  // a --trace line (newline included); NULL none
    double (*lr_at)(void *ctx, long step);       // the learning rate of step
    float (*clip_scale)(void *ctx, double norm); // the factor the global norm's clip gives
    void (*stepped)(void *ctx, const swarm_engine_step_t *step);
    void (*evaluated)(void *ctx, long step, double train, double val);
    // a checkpoint of `step` is whole: write it (params, m, v stay as they
    // are until checkpoint_wait returns, which the engine calls first)
    void (*checkpoint)(void *ctx, long step, const float *params, const float *m, const float *v);
    void (*checkpoint_wait)(void *ctx);
    // the checksum of a stage's parameters as its nodes compute it (64 hex
    // digits): a state a replica sends (a checkpoint's part, a joiner's) is
    // checked against the checksum it reported; NULL: not checked
    void (*checksum)(void *ctx, const float *params, size_t n, char hex[65]);
    // the model cut into `stages` for nodes of budgets mem[nmem] (0: any),
    // at the run's micro-batch: each stage's parameters n, offset off, cost
    // and need (swarm_engine_config_t's stage_*), and its text for ASSIGN
    // into text[SWARM_CUT_MAX] (swarm_engine_config_t's cut); 0, or -1
    // when it has no such cut. Given (--stages auto), the engine cuts the
    // model again when no node can hold a stage of its cut
    // (engine_replan.c); NULL: the cut stays the config's
    int (*cut)(void *ctx, int stages, const double *mem, int nmem, size_t *n, size_t *off,
               double *cost, double *need, char *text);
} swarm_engine_io_t;

// What a run did, for its summary lines.
typedef struct {
    long first, step, iters; // the step it started at, the step it is at, of the schedule
    int done;                // the schedule (or --steps) is finished
    double train_time;       // s in steps
    long timed_steps;        // the steps it holds (a step run again after a rollback counts again)
    long audited_steps;      // of them, those whose update waited for an audit
    double audited_time;     // and their seconds
    double tok_s;            // training tokens a second over them
    int ready;               // ready peers now
    int checksum_mismatches, resyncs, expelled, rollbacks;
    int spot_checks, spot_undecided, restarts;
    int audits, audit_caught, audit_undecided, audit_lost;
    int audit_steps;         // attempts at a step the audits' draw picked
    int audit_splits;        // shares split among several verifiers (engine_audit_out.c)
    uint64_t bytes_in, bytes_out;      // tensor bytes received, sent
    uint64_t wire_in[3], wire_out[3];  // of them activations, gradient sums, state
    double window_mean;      // micro-batches in flight, on average over the steps
    int micro_batches;       // G, a step's
} swarm_engine_summary_t;

// A new engine for config c, its effects through io, at now_ms. 0, or
// -ENOMEM / -EINVAL with a reason in err. It takes c->params, m and v.
__attribute__((warn_unused_result))
int swarm_engine_new(const swarm_engine_config_t *c, const swarm_engine_io_t *io, int64_t now_ms,
                     swarm_engine_t **out, char *err, size_t errlen);
void swarm_engine_destroy(swarm_engine_t **self_p);
// A message from a peer's connection (checked by net, not yet by the engine).
void swarm_engine_message(swarm_engine_t *self, int64_t now_ms, const net_peer_t *who,
                          net_msg_t *m);
// Bytes from the connection of key that are no message (net's reason).
void swarm_engine_bad_message(swarm_engine_t *self, int64_t now_ms, const char *key,
                              const char *why);
// The transport says the connection of who is gone.
void swarm_engine_gone(swarm_engine_t *self, int64_t now_ms, const net_peer_t *who);
// Peers whose key allowed() no longer accepts are told, once, and dropped
// (a dead one too: banned, say); their entries forget their keys.
void swarm_engine_drop_unless(swarm_engine_t *self, int64_t now_ms,
                              int (*allowed)(void *ctx, const char *key), void *ctx);
// Time passes: deadlines, probes, and every phase that is ready now.
void swarm_engine_tick(swarm_engine_t *self, int64_t now_ms);
// The run is over (and nothing it owes is still to come).
int swarm_engine_finished(const swarm_engine_t *self);
// How long a peer may be silent before it is dead, ms: 10 s, longer when
// a big swarm's peers are told to beat less often (the transport's dead_ms).
int swarm_engine_silence_ms(const swarm_engine_t *self);
// The HEARTBEAT interval a router's ASSIGN or HEARTBEAT tells a node, ms:
// 0 when m says none, -1 when what it says is no interval (a node ignores
// it and says so: said, when not NULL, holds it printable, control bytes
// as '?'), else 1,000-60,000.
int swarm_beat_ms(const net_msg_t *m, char *said, size_t cap);
// Tell every live peer that the run ends (BYE: done, step, steps).
void swarm_engine_bye(swarm_engine_t *self);
void swarm_engine_summary(const swarm_engine_t *self, swarm_engine_summary_t *out);
// What audits cost a run, in words, into out[n]: of `steps` steps taking
// `steps_s` seconds, `audited` waited for an audit and took `audited_s`;
// against the mean of the others, the time the audited ones took beyond
// it, as a share of all: "12 of 200 steps waited for audits, 2.91 s each
// against 0.95 s for the others: about 12% of the time in steps".
void swarm_audit_cost_text(long steps, double steps_s, long audited, double audited_s, char *out,
                           size_t n);

// ---- the simulator (swarm/sim.c; docs/architecture.md) ----

// The nodes of --numeric: the caller's real node code (swarm/ knows no
// model), one per simulated peer, answering the engine's messages as a
// node does.
typedef struct {
    void *ctx;
    // a fresh node for sim peer `peer` that lies in way `lie` (SIM_LIE_*;
    // 0 honest) from step `from`
    void *(*open)(void *ctx, int peer, int lie, long from);
    // its answer to msg (ASSIGN, FWD, BWD, STEP, UPDATE, STATE, STATE_GET):
    // a reply, an ERROR saying why, or NULL for none
    net_msg_t *(*answer)(void *ctx, void *node, const net_msg_t *msg);
    // what it holds: its stage (-1 none), whether a state is loaded, its step
    void (*status)(void *ctx, void *node, int *stage, int *ready, long *step);
    void (*close)(void *ctx, void *node);
} swarm_sim_nodes_t;

// How a simulated liar lies (tests/test_hostile.sh's liars): a NaN in its
// activations, activations 1000x too large, the right values in the wrong
// places (--numeric only: constants reversed are the same), parameters
// that drift from its replicas' after each update, a speed 1000x its own,
// a gradient sum pointing the other way (synthetic: 1-4 times its size,
// each liar its own factor), a norm-only sum of squares of 1e300, input
// gradients pointing the other way, a state other than the one its
// checksum is of, activations each 1.5x the size of the last (a walk up
// the RMS bound) (NODE_LIE_* of worker.h); and the stalls the sim plays
// itself: a claimed speed a millionth of its own then no work answered, no
// STATE_GET answered, a joiner that holds its state and leaves (again);
// and a verifier that lies only in the sums it recomputes of another's
// share (its own honest; asked for by name).
enum { SIM_LIE_NONE, SIM_LIE_NAN, SIM_LIE_SCALE, SIM_LIE_DRIFT, SIM_LIE_SHUFFLE, SIM_LIE_SPEED,
       SIM_LIE_GRAD, SIM_LIE_SUMSQ, SIM_LIE_DX, SIM_LIE_STATE, SIM_LIE_RMSWALK, SIM_LIE_SLOWCLAIM,
       SIM_LIE_CKPTSTALL, SIM_LIE_JOINHOLD, SIM_LIE_RECOUNT, SIM_LIES };

// A churn trace (swarm_sim_churn_load): how many of its machines were up,
// as a step function of time.
typedef struct {
    int64_t *t_ms;           // [n] ascending times of its changes, from the trace's start
    int *up;                 // [n] machines up from t_ms[i] on
    int n;
    int64_t span_ms;         // the trace's length (its last time)
    int most;                // the most machines up at once
} swarm_sim_churn_t;

typedef struct {
    int peers;               // peers that join at the start
    uint64_t seed;           // everything random in the run
    const double *speeds;    // device speeds (training tokens/s on a stage of mean cost),
    int nspeeds;             // each peer draws one; none: 20,000 each
    const double *memories;  // budgets (bytes a peer may hold for a stage, said in its HELLO),
    int nmemories;           // each peer draws one (as many as speeds: the one at its speed's
                             // place, a device's speed and memory together); none: any stage.
                             // Given, the --peers that join at the start (no churn) take
                             // the mixes in their shares, in order, not by draws
    int shares;              // so do they without memories (--shares): the swarm is the mix
    int64_t latency_ms;      // one way, router <-> each peer
    int64_t latency_hi_ms;   // more than latency_ms: each peer draws its own in between
    double bandwidth_mbit;   // each peer's link, each way (a message takes its bytes' time
                             // on the wire, one after another); 0 unlimited
    double bandwidth_hi_mbit; // more than bandwidth_mbit: each peer draws its own in between
    double router_mbit;      // the router's own link, each way, shared by every message; 0
                             // unlimited
    int direct;              // activations go node to node: a FWD/BWD/RESULT's tensors take the
                             // peers' links, not the router's (a projection of that design)
    int64_t jitter_ms;       // up to this much more latency, drawn per message (a link
                             // keeps its order: one TCP stream)
    double speed_noise;      // each peer's speed drifts: a factor drawn in 1 +/- this
                             // every SIM_NOISE_MS (a machine that others share); 0 none
    double loss;             // the fraction of messages that lose a segment: they and
                             // what follows them on the link wait a retransmission
    double kill_every_s;     // a random live peer is killed this often (and a new one
                             // joins 1 s later); 0 never
    double leave_rate;       // or: each live peer leaves at this rate an hour, a Poisson
                             // process (a new one joins 1 s later); 0 never
    double limit_s;          // virtual seconds before the run counts as stuck
    const swarm_sim_nodes_t *nodes; // --numeric: real nodes; NULL: synthetic peers
    int liars;               // peers of the first `peers` that lie (drawn by the seed)
    unsigned lies;           // the ways they may lie: bits 1 << SIM_LIE_*, each liar draws one
    long lie_from;           // the step they start lying at; 0: each draws one of 1..4
    double stall_every_s;    // a random live peer stops answering this often; 0 never
    double stall_s;          // for this long (its queue waits, as under SIGSTOP)
    const swarm_sim_churn_t *churn; // machines come and go as this trace says; NULL none
    double churn_scale;      // the trace runs this many times faster
} swarm_sim_opts_t;

typedef struct {
    long steps;              // steps trained
    double seconds;          // virtual seconds they took
    double tok_s;            // training tokens a virtual second
    double router_mb_s[2];   // MB a virtual second on the router's link, to the peers and from
    double engine_core;      // the engine's CPU seconds a virtual second (1: a whole core)
    double bound;            // mean over the run of the engine's assignment's bound
    double best;             // the same for the best split of the live peers (an upper bound)
    double us_per_request;   // CPU microseconds in the engine per message it sent
    int rollbacks;           // the engine's
    int kills, stalls, joins; // faults and joins the sim made
    int liars_caught;        // liars the engine banned or expelled
    int lies_applied;        // UPDATEs a lying gradient sum reached (not audited)
    int drift_applied;       // UPDATEs work of a stage's only replica, diverged, reached
    int copies_lost;         // honest copies of such a replica's state the vote expelled
    long catch_steps;        // the most steps from a liar's first lying sum to its catch, -1 none
    int liars_loose;         // liars that sent a lying sum and were never caught
    int audits, audit_steps; // gradient sums audited, and in how many attempts at a step
    long timed_steps, audited_steps; // as the engine's summary has them (swarm_audit_cost_text)
    double train_time, audited_time;
    int audit_splits;        // shares split among several verifiers
    int copies;              // --churn: copies of the trace tiled over the peers
    int idle;                // live peers at the end that hold no stage (--memory: none fits)
    double bound_end;        // the engine's assignment's bound at the end
    double best_held;        // the policy's best split of the live peers at the end, within
                             // their memory where it is known (swarm_policy_best)
    size_t memory;           // the engine's bytes at its fullest
    size_t memory_bound;     // what its formula allowed then
    char violation[512];     // the first invariant broken, "" none
} swarm_sim_result_t;

// Run config c's training on a simulated swarm. model gives lr_at and
// clip_scale (and log, which sees every engine line after the sim);
// c->params is taken, as by swarm_engine_new. 0 (res says how it went), or
// -errno with a reason in err when the engine cannot be made.
// Read a churn trace in either format of ../shared/data/traces/:
// "time_ms,add|remove,NAME" lines, or "seconds,instances" (a step
// function). 0, or -errno with a reason naming the file and line.
__attribute__((warn_unused_result))
int swarm_sim_churn_load(const char *path, swarm_sim_churn_t *out, char *err, size_t errlen);
void swarm_sim_churn_free(swarm_sim_churn_t *churn);

__attribute__((warn_unused_result))
int swarm_sim_run(const swarm_engine_config_t *c, const swarm_sim_opts_t *o,
                  const swarm_engine_io_t *model, swarm_sim_result_t *res, char *err,
                  size_t errlen);

#endif
