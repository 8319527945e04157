/* swarm.h - the swarm module: training data and its batch order (and, as the
 * swarm grows, the router, its policy and status).
 *
 * The data order is a pure function of (seed, step, window), so any process
 * can draw any micro-batch of any step, and a replay sees the same bytes.
 * Nothing here knows the model's parameters or touches a socket.
 */
#ifndef SWARM_SWARM_H
#define SWARM_SWARM_H

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
} swarm_peer_view_t;

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
// A stage's only replica takes it at once; -1 when it has no ready peer.
#define SWARM_HOLD (-2)
int swarm_policy_pick_fit(const swarm_peer_view_t *peers, int n, int stage, double work, int left);
// The stage a joining node should serve: least total throughput of its
// ready and joining peers, then fewest replicas, then the lowest index.
int swarm_policy_assign(const swarm_peer_view_t *peers, int n, int stages);
// The same by count alone: the stage with the fewest ready and joining
// peers, then the lowest index (speeds are not consulted).
int swarm_policy_assign_even(const swarm_peer_view_t *peers, int n, int stages);

// Rebalancing: the peer to move from the strongest stage to the weakest,
// or -1. cost[s] is stage s's work per token (any unit): a peer doing
// tok_s on stage a does about tok_s * cost[a] / cost[b] on stage b. A move
// must raise the pipeline's bottleneck (min over stages of summed tok_s) by
// more than `margin` (0.2 = 20%), may not empty a stage, and may not move a
// peer moved within `hold` seconds of `now`. *to gets the new stage.
int swarm_policy_rebalance(const swarm_peer_view_t *peers, int n, int stages, const double *cost,
                           double now, double margin, double hold, int *to);

// Refilling: the ready peer to move into stage `empty`, which has lost every
// replica, or -1 when no stage has two or more. Of those, the move that
// leaves the highest bottleneck over the stages that have replicas (another
// stage that is empty too waits for its own refill); no margin, no hold.
int swarm_policy_refill(const swarm_peer_view_t *peers, int n, int stages, const double *cost,
                        int empty);

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
// flood cannot fill a disk. Zeroed = ready.
typedef struct {
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

#endif
