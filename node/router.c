/* router.c - `swarm router`: owns the plan, the data and the step clock.
 * It assigns joining nodes to stages, hands them their stage's state, sends
 * every micro-batch through the stages (a window of them in flight), sums
 * each stage's gradients over its replicas, and has every replica apply the
 * same AdamW update; replicas' checksums are compared after every step.
 * Nothing a peer sends is used before it is checked; peers that fail,
 * stall, lie or die are banned, resynced or expelled and their work is
 * redone elsewhere, so every step averages exactly its micro-batches.
 *
 * The protocol and its failure handling are docs/swarm.md; the threat
 * model is SECURITY.md. The router does no compute of its own.
 */
#include "node.h"
#include "net.h"
#include "swarm.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define PEERS_KEEP_DEAD 64  // dead entries kept for their bans before the oldest is reused
#define REQ_BLOCK 1024       // requests a block of the table holds (blocks never move)
#define REQ_SLOT_BITS 24     // a request's id: a sequence number, then its slot

enum { P_JOINING = 1, P_READY, P_DEAD };
enum { R_FWD = 1, R_BWD, R_STEP, R_UPDATE, R_STATE_GET, R_STATE, R_ASSIGN, R_VERIFY, R_DISCARD };

typedef struct {
    net_peer_t who;          // identity: public key, and the connection that speaks for it
    net_peer_t rival;        // another connection with its key that said HELLO, or zeroes
    int64_t rival_since;     // ms: when the rival first said HELLO
    int rival_told;          // the refusal of that rival was logged and told
    int id;                  // small id for logs, in join order
    char name[64];           // node's name
    char device[128];        // node's device
    int stage;               // assigned stage, -1 before
    int state;               // P_*
    double tok_s;            // tokens per second, EMA over its requests
    int inflight;            // requests outstanding
    int working;             // of them FWD/BWD (its busy time runs while > 0)
    int queue;               // queue depth from its last heartbeat
    int64_t last_seen;       // ms (net_clock_ms)
    int64_t probed;          // ms: when s_probe last sent it a HEARTBEAT
    char checksum[65];       // after the last update
    int updated;             // acked the current UPDATE
    int failed;              // a send to it failed: to be declared dead
    double moved_at;         // s (s_secs) of its last rebalancing move, -1e30 never
    int moving;              // joining its new stage after a move
    double banned_until;     // s: refused until then (a failure's back-off)
    double ban_s;            // length of its last ban: doubles with each failure
    int failures;            // requests it failed (deadline, refusal, bad result)
    int ban_told;            // it was told of its current ban
    int divergences;         // steps after which its checksum differed from its stage's
    int64_t burst_from;      // ms: start of the second its unasked messages are counted in
    int burst;               // unasked messages (not replies) in that second
    int claim_doubted;       // its HEARTBEAT speed is far above what the router measures
    char why[96];            // why it was last declared dead or banned
    int64_t busy_from;       // ms: start of its busy period (requests in flight)
    double busy_s;           // seconds with requests in flight, in all
    double work;             // training tokens of work it finished (see s_work)
    double rate_busy, rate_work; // busy_s and work at its last speed sample
    double check_busy, check_work; // busy_s and work at the last rebalancing check
    int samples;             // speed samples taken (since it joined or moved)
    double node_tok_s;       // what the node says it sustains (HEARTBEAT)
    double hello_tok_s;      // what it measured at start (HELLO)
    double rtt;              // s: network round trip (a request's time less its time at
                             // the node), quick to fall, slow to rise; 0 unknown
    double busy[2];          // s: compute of one FWD [0] / BWD [1], EMA; 0 unknown
    int slots;               // micro-batches its activation cache holds; 0 unknown
    int held_thirds;         // training work of its requests in flight (req_t.thirds)
    int held_kind[2];        // its FWD [0] and BWD [1] requests in flight
    // its part in the current step (a fresh entry has none; the entry of a
    // dead peer whose part still counts is not reused before the step ends)
    float *grad;             // its GRAD of this step (the largest stage's size: it may move)
    int got_grad;            // its GRAD arrived
    int in_step;             // it was sent this step's STEP
    int norm_only;           // its stage has no other replica: it keeps its gradient
    double sumsq;            // with norm_only: its gradient's sum of squares
    int self_to;             // UPDATE(self_step) once its norm is in: 1 with the sum, 2 norm only
} peer_t;

typedef struct {
    uint64_t id;             // request id, 0 = free slot
    int kind;                // R_*
    int peer;                // index into peers
    int mb;                  // micro-batch index within the step
    int stage;               // stage
    int64_t sent;            // ms
    int redo;                // re-run of work a dead peer had accumulated
    int thirds;              // training work in thirds of a micro-batch (s_req_thirds)
} req_t;

// A spot check of one micro-batch's FWD at one stage (s_spot_*): the
// outputs of the peer under test ([0]) and of up to two other replicas.
typedef struct {
    float *out[3];           // stage outputs (NULL at the last stage: losses only)
    float loss[3];           // last stage: the losses
    int peer[3];             // who produced each
    int n;                   // results in; 0: no check open
} spot_t;

typedef struct {
    int stage;               // stage it is at; -1 idle, S = done
    int backward;            // in backward
    int fwd_peer[NODE_MAX_LAYERS]; // who ran its forward at each stage
    void *in[NODE_MAX_LAYERS + 1]; // wire bytes of each stage's input (stage 0: tokens)
    int32_t *targets;        // (micro, T)
    void *dy[NODE_MAX_LAYERS]; // wire bytes of the output gradient each stage's BWD got
    int grad_peer[NODE_MAX_LAYERS]; // who accumulated its gradient at each stage, -1 none
    int retry_kind;          // R_FWD/R_BWD that could not be sent yet, 0 none
    int retry_stage;         // its stage
    unsigned char redo_wanted[NODE_MAX_LAYERS]; // stage work to re-run once a peer is free
    float loss;              // from the last stage
    spot_t *spot;            // per stage, from its first check on (NULL: none yet)
    uint8_t in_dtype[NODE_MAX_LAYERS + 1]; // NET_DTYPE_* of in[s] (s > 0)
    int8_t in_pow2[NODE_MAX_LAYERS + 1];   // its 2^k scale (meta pow2_I)
    uint8_t dy_dtype[NODE_MAX_LAYERS];     // NET_DTYPE_* of dy[s]
    int8_t dy_pow2[NODE_MAX_LAYERS];       // its 2^k scale
} mb_t;

typedef struct {
    node_train_opts_t o;     // model and training flags
    node_hparams_t hp;       // the same, resolved
    node_plan_t plan;        // stages
    size_t stage_n[NODE_MAX_LAYERS]; // parameters per stage
    size_t stage_off[NODE_MAX_LAYERS]; // offset of each stage in the model
    size_t max_stage_n;      // the largest of stage_n
    swarm_data_t *data;      // training bytes
    float *params, *m, *v;   // model-sized: initial state, then checkpoints
    float *grad_sum;         // model-sized: this step's summed gradients
    const char *listen;      // bind endpoint
    const char *key_name;    // router key pair NAME
    const char *allow_path;  // allow-list file, NULL = open
    int min_nodes;           // ready nodes needed before training starts
    double rebalance_every;  // seconds between rebalancing checks, 0 = never
    double last_rebalance;   // s of the last check
    int rebalance_id;        // the move the last check found: peer id (0 none) ...
    int rebalance_to;        // ... to this stage; made when the next check finds it too
    int window;              // micro-batches in flight
    net_key_t *key;          // router key
    net_allow_t *allow;      // allow-list
    net_server_t *srv;       // ROUTER
    swarm_loglimit_t loglimit; // lines about what peers send (a flood fills no disk)
    int64_t now_ms;          // the time (net_clock_ms) of what the router handles now: set by
                             // s_loop for each message and turn, read by everything else
    peer_t *peers;           // every node seen (dead ones while they are banned, and a few more)
    int npeers;              // used entries
    int peers_cap;           // allocated entries, of peers and of the scratch below
    swarm_peer_view_t *views; // [peers_cap] scratch of a routing pick (s_pick_but, s_pick_fit)
    double *backlog, *ahead; // [peers_cap] scratch of s_views_as
    int next_peer_id;        // ids for logs, in join order (entries may be reused)
    req_t **req_blocks;      // the request table: blocks of REQ_BLOCK, slot k at
                             // req_blocks[k / REQ_BLOCK][k % REQ_BLOCK]; id 0 = free slot
    int req_slots;           // slots in use or freed (the table's high-water mark)
    int *req_free;           // freed slots, a stack
    int req_nfree;           // its size
    uint64_t next_id;        // request ids' sequence numbers
    uint64_t last_id;        // the id of the request made last
    mb_t *mbs;               // [G] micro-batches of the current step
    int G;                   // micro-batches per step
    long step;               // optimizer updates done
    long first;              // step the run started at
    int started;             // training has begun (state lives on the nodes now)
    size_t tok_bytes;        // wire bytes of one (micro, T) int32 tensor
    double loss_avg;         // EMA of the loss
    float last_loss;         // last step's loss
    double train_time;       // seconds in steps
    double t_start;          // wall clock at start
    node_curve_t logs;       // --loss-log and DIR/loss.csv
    float *curve;            // [iters] losses for the plot
    int checksum_mismatches; // replicas that disagreed with their stage after a step
    int resyncs;             // of them, resynced from a replica that agrees
    int expelled;            // peers expelled for diverging twice
    int phase;               // PH_*
    int pending;             // STEP or UPDATE replies still to come
    int update_pending;      // replies to an UPDATE the next step did not wait for
    long update_step;        // the step that UPDATE closed
    int self_peer;           // applying step self_step's update itself (STEP apply=1), -1 none
    long self_step;          // that step
    double self_others;      // the other stages' sum of squares it was sent
    double self_lr;          // that step's learning rate
    int self_told;           // the log has said once that a stage applies its own update
    int redo_pending;        // re-runs of a dead peer's work still to come
    int stepped[NODE_MAX_LAYERS]; // the stage's replicas were sent this step's STEP
    int ckpt_pending;        // STATE replies still to come for a checkpoint
    long ck_step;            // the step the checkpoint being fetched holds
    int ck_lost;             // a replica it was fetched from died: it is skipped
    float *ck_state;         // [3 * params]: that checkpoint's params, m, v as they come
    pthread_t ck_writer;     // writes the last checkpoint to --save DIR (s_ckpt_part)
    int ck_writing;          // ck_writer runs: params/m/v are not to change
    double step_t0;          // when the current step started (s)
    int done;                // the schedule is finished
    int want_eval;           // evaluate before the next step
    int want_ckpt;           // checkpoint before the next step
    int evaluating;          // micro-batches are evaluation batches
    int eval_split;          // 0 train, 1 val
    int eval_iter;           // batches of the split evaluated
    uint64_t eval_state;     // the split's splitmix64 stream
    double eval_sum;         // sum of batch losses of the split
    double eval_loss[2];     // train and val results
    node_evals_t evals;      // every evaluation's results, for DIR/loss.svg
    long ckpt_step;          // the step params/m/v hold (the last checkpoint)
    int rollbacks;           // times every replica of a stage was lost
    uint64_t bytes_in;       // tensor bytes received
    uint64_t bytes_out;      // tensor bytes sent (requests)
    float *scratch;          // (micro, T, C): a reply's tensor, decoded for checks
    double rms[2][NODE_MAX_LAYERS]; // running RMS of each stage's outputs (0) and input gradients (1)
    long rms_n[2][NODE_MAX_LAYERS]; // tensors it has seen
    double tensor_bound;     // --tensor-bound: RMS above this times the running RMS fails
    int assign_even;         // --assign even: joiners fill stages evenly, speeds unheard
    double verify;           // --verify: fraction of FWDs re-run on a second replica
    int spot_checks;         // FWDs verified
    int spot_undecided;      // verifications two replicas disagreed on, with no third to decide
    int restarts;            // steps started over (a liar's outputs had been used)
    int wire;                // NET_DTYPE_* of activations and their gradients (--wire)
    int grad_wire;           // NET_DTYPE_* of replicas' gradient sums (--grad-wire)
    const char *trace_path;  // --trace FILE
    FILE *trace;             // a line per request sent and done, per step ended
    int window_mode;         // --window: WIN_FIXED, WIN_AUTO (Little's law) or WIN_ALL (the
                             // default: the step's micro-batches within the caches)
    int window_shown;        // the window last logged, 0 none
    double window_sum;       // sum of the windows steps began with, for the mean
    long window_n;           // steps begun
    uint64_t wire_in[3];     // tensor bytes received by class (W_*)
    uint64_t wire_out[3];    // tensor bytes sent by class (W_*)
} router_t;

enum { PH_WAIT = 0, PH_MB, PH_GRAD, PH_UPDATE, PH_CKPT, PH_EVAL, PH_DISCARD };
enum { WIN_FIXED = 0, WIN_AUTO, WIN_ALL }; // --window W, auto, all
#define MB_APPLY 2           // mb of an R_STEP that applies the update (STEP apply=1)
#define EVAL_MB 1000000      // evaluation micro-batch ids start here on the wire

static volatile sig_atomic_t s_stop;
static volatile sig_atomic_t s_hup;     // SIGHUP: re-read the --allow file

// A peer is gone (its work is redone elsewhere); fail also bans it.
static void s_peer_dead(router_t *r, int p, const char *why);
static void s_peer_fail(router_t *r, int p, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

// For a call whose failure is reported where it happens (or is harmless).
static inline void s_ignore(int rc)
{
    (void) rc;
}

static void s_on_signal(int sig)
{
    if (sig == SIGHUP)
        s_hup = 1;
    else
        s_stop = 1;
}

// 1 when a line about peer `key` may be logged now (swarm_loglimit_pass).
static int s_loud(router_t *r, const char *key, char *note, size_t cap)
{
    return swarm_loglimit_pass(&r->loglimit, key, r->now_ms, note, cap);
}

// Now, in seconds: the router reads no clock but s_loop's (time is an
// argument of what it does, as it will be in the simulator).
static double s_secs(const router_t *r)
{
    return (double) r->now_ms / 1000.0;
}

// Every message the router sends leaves here: to the connection `to`
// (takes *m). 0 or -errno.
static int s_emit(router_t *r, const net_peer_t *to, net_msg_t **m)
{
    return net_server_send(r->srv, to, m);
}

// ---- requests --------------------------------------------------------------

// --trace: "MS EVENT STEP KIND MB STAGE PEER", EVENT send (a request went
// out), done (answered, or given up: its peer died, the step restarted) or
// step (STEP ended; the rest are "-"); MS is the monotonic clock in ms.
// What scripts/trace-steps.sh reads.
static void s_trace(const router_t *r, const char *event, int kind, int mb, int stage, int peer)
{
    static const char *const names[] = { "?", "FWD", "BWD", "STEP", "UPDATE", "STATE_GET",
                                         "STATE", "ASSIGN", "VERIFY", "DISCARD" };
    if (!r->trace)
        return;
    if (peer < 0)
        fprintf(r->trace, "%lld %s %ld - - - -\n", (long long) r->now_ms, event, r->step);
    else
        fprintf(r->trace, "%lld %s %ld %s %d %d %d\n", (long long) r->now_ms, event, r->step,
                kind > 0 && kind <= R_DISCARD ? names[kind] : "?", mb, stage, r->peers[peer].id);
}

// Slot k of the request table (k < req_slots). Loops over the requests
// in flight run over the slots up to the high-water mark: the most
// requests ever in flight at once, not a fixed table.
static req_t *s_req_at(const router_t *r, int k)
{
    return &r->req_blocks[k / REQ_BLOCK][k % REQ_BLOCK];
}

// Training work of a request of `kind` at `stage`, in thirds of a
// micro-batch's forward and backward: a forward 1, a backward 2, the last
// stage's fused pair 3 (an evaluation's forward 1), control 0.
static int s_req_thirds(const router_t *r, int kind, int stage)
{
    if (kind == R_BWD)
        return 2;
    if (kind == R_VERIFY)
        return 1;
    if (kind == R_FWD)
        return stage == r->plan.stages - 1 && !r->evaluating ? 3 : 1;
    return 0;
}

// A free slot for a new request (a freed one, else the next, in a new block
// when the last is full); NULL when out of memory or slots.
static req_t *s_req_slot(router_t *r, int *slot)
{
    if (r->req_nfree > 0) {
        *slot = r->req_free[--r->req_nfree];
        return s_req_at(r, *slot);
    }
    if (r->req_slots == 1 << REQ_SLOT_BITS)
        return NULL;
    if (r->req_slots % REQ_BLOCK == 0) {
        int n = r->req_slots / REQ_BLOCK;
        req_t **blocks = realloc(r->req_blocks, (size_t) (n + 1) * sizeof *blocks);
        if (!blocks)
            return NULL;
        r->req_blocks = blocks;
        int *free_ = realloc(r->req_free, (size_t) (n + 1) * REQ_BLOCK * sizeof *free_);
        if (!free_)
            return NULL;
        r->req_free = free_;
        if (!(blocks[n] = calloc(REQ_BLOCK, sizeof **blocks)))
            return NULL;
    }
    *slot = r->req_slots++;
    return s_req_at(r, *slot);
}

static req_t *s_req_new(router_t *r, int kind, int peer, int mb, int stage)
{
    int slot;
    req_t *q = s_req_slot(r, &slot);
    if (!q)
        return NULL;
    uint64_t id = r->last_id = (++r->next_id << REQ_SLOT_BITS) | (uint64_t) slot;
    *q = (req_t) { id, kind, peer, mb, stage, r->now_ms, 0, s_req_thirds(r, kind, stage) };
    s_trace(r, "send", kind, mb, stage, peer);
    peer_t *pe = &r->peers[peer];
    pe->inflight++;
    pe->held_thirds += q->thirds;
    if (kind == R_FWD || kind == R_BWD) {
        pe->held_kind[kind == R_BWD]++;
        if (pe->working++ == 0)
            pe->busy_from = q->sent;
    }
    return q;
}

// The request a reply names, by the slot in its id: O(1).
static req_t *s_req_find(router_t *r, uint64_t id)
{
    uint64_t slot = id & ((1u << REQ_SLOT_BITS) - 1);
    if (id == 0 || slot >= (uint64_t) r->req_slots)
        return NULL;
    req_t *q = s_req_at(r, (int) slot);
    return q->id == id ? q : NULL;
}

static void s_req_done(router_t *r, req_t *q)
{
    peer_t *pe = &r->peers[q->peer];
    s_trace(r, "done", q->kind, q->mb, q->stage, q->peer);
    if (pe->inflight > 0)
        pe->inflight--;
    pe->held_thirds -= q->thirds;
    if (q->kind == R_FWD || q->kind == R_BWD) {
        pe->held_kind[q->kind == R_BWD]--;
        if (pe->working > 0 && --pe->working == 0)
            pe->busy_s += (double) (r->now_ms - pe->busy_from) / 1000.0;
    }
    r->req_free[r->req_nfree++] = (int) (q->id & ((1u << REQ_SLOT_BITS) - 1));
    q->id = 0;
}

// Seconds peer p has had FWD/BWD work in flight, in all.
static double s_busy_s(const peer_t *pe, int64_t now)
{
    return pe->busy_s + (pe->working > 0 ? (double) (now - pe->busy_from) / 1000.0 : 0.0);
}

// Peer pe's speed is measured afresh from now (it joined, or moved stage).
static void s_speed_restart(peer_t *pe, int64_t now)
{
    pe->rate_busy = pe->check_busy = s_busy_s(pe, now);
    pe->rate_work = pe->check_work = pe->work;
    pe->samples = 0;
}

// Tensor bytes a message carries on the wire.
static uint64_t s_payload(const net_msg_t *m)
{
    const net_head_t *h = net_msg_head_const(m);
    uint64_t n = 0;
    for (int i = 0; i < h->ntensors; i++)
        n += h->tensors[i].bytes;
    return n;
}

// ---- wire formats: what each kind of tensor travels as ----------------------

enum { W_ACTS = 0, W_GRADS, W_STATE }; // activations and their gradients; gradient sums; state

// Count m's tensor bytes into by[] by what they carry.
static void s_wire_count(const net_msg_t *m, uint64_t by[3])
{
    int type = net_msg_head_const(m)->type;
    by[type == NET_MSG_GRAD || type == NET_MSG_UPDATE ? W_GRADS
       : type == NET_MSG_STATE ? W_STATE : W_ACTS] += s_payload(m);
}

// Floats in one activation tensor (micro, T, C).
static size_t s_acts_count(const router_t *r)
{
    return (size_t) r->hp.micro * r->hp.cfg.T * r->hp.cfg.C;
}

// Append activations kept as wire bytes (dtype, 2^pow2 scale) to m as
// tensor i: the pow2 goes into meta (*meta, appended).
static int s_acts_add(const router_t *r, net_msg_t *m, const void *bytes, int dtype, int pow2,
                      char *meta, size_t cap)
{
    uint32_t dims[3] = { (uint32_t) r->hp.micro, (uint32_t) r->hp.cfg.T, (uint32_t) r->hp.cfg.C };
    int i = net_msg_head_const(m)->ntensors;
    if (pow2 != 0)
        snprintf(meta + strlen(meta), cap - strlen(meta), "pow2_%d=%d\n", i, pow2);
    return net_msg_add_raw(m, dtype, dims, 3, bytes, net_codec_bytes(dtype, s_acts_count(r)));
}

static void s_step_unask(router_t *r);

// Send m to peer p as request kind; 0 or -errno (logged).
static int s_send(router_t *r, int p, net_msg_t **m, int kind, int mb, int stage)
{
    req_t *q = s_req_new(r, kind, p, mb, stage);
    if (!q) {
        net_msg_destroy(m);
        fprintf(stderr, "swarm router: out of memory for the request table (%d requests)\n",
                r->req_slots - r->req_nfree);
        return -ENOSPC;
    }
    net_msg_head(*m)->id = q->id;
    r->bytes_out += s_payload(*m);
    s_wire_count(*m, r->wire_out);
    int rc = s_emit(r, &r->peers[p].who, m);
    if (rc != 0) {
        // not connected (or its queue is full): dead for this run; the next
        // turn hands its work to others (s_reap), not in the middle of this one
        if (!r->peers[p].failed)
            fprintf(stderr, "swarm router: peer %d (%s): send failed: %s\n", r->peers[p].id,
                    r->peers[p].name, strerror(-rc));
        r->peers[p].failed = 1;
        s_req_done(r, q);
    } else if ((kind == R_BWD || (kind == R_FWD && stage == r->plan.stages - 1 && !r->evaluating))
               && stage >= 0 && stage < r->plan.stages && r->stepped[stage]) {
        // gradient work for a stage already asked for its gradients (a dead
        // peer's request sent again): its replicas' answers would miss it
        s_step_unask(r);
    }
    return rc;
}

static int s_meta(net_msg_t *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int s_meta(net_msg_t *m, const char *fmt, ...)
{
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    return net_msg_set_meta(m, text);
}

// ---- peers -----------------------------------------------------------------

static int s_peer_find(router_t *r, const net_peer_t *who)
{
    for (int i = 0; i < r->npeers; i++)
        if (!strcmp(r->peers[i].who.key, who->key))
            return i;
    return -1;
}

// What each peer holds, in training tokens (swarm_peer_view_t.backlog):
// its FWD/BWD requests in flight, and the backward it owes for every
// forward it ran this step whose BWD is not sent yet (the router prefers to
// send it there, where the activations are). ahead[]: the seconds of
// compute its requests in flight take, as it reports them (the router's
// own speed of a peer counts the time on its link too).
static void s_backlog(const router_t *r, double *backlog, double *ahead)
{
    double tokens = (double) r->hp.micro * r->hp.cfg.T;
    for (int p = 0; p < r->npeers; p++) {
        const peer_t *pe = &r->peers[p];
        backlog[p] = tokens * pe->held_thirds / 3.0;
        ahead[p] = pe->held_kind[0] * pe->busy[0] + pe->held_kind[1] * pe->busy[1];
    }
    if (r->evaluating || !r->mbs)
        return;
    int S = r->plan.stages;
    for (int i = 0; i < r->G; i++) {
        const mb_t *b = &r->mbs[i];
        // stages whose forward ran (or runs) and whose backward is not sent:
        // in forward up to the stage it is at, in backward below it
        int owed = b->stage < 0 || b->stage >= S ? 0 : b->backward ? b->stage : b->stage + 1;
        for (int k = 0; k < owed && k < S - 1; k++)
            if (b->fwd_peer[k] >= 0 && b->fwd_peer[k] < r->npeers)
                backlog[b->fwd_peer[k]] += tokens * 2.0 / 3.0;
    }
}

// The peer table as the policy sees it. For routing (optimistic) a ready
// peer the router has not measured yet is taken to be as fast as the
// fastest measured peer of its stage, so that it gets work and is measured
// (otherwise a first guess below the others' could starve it for the whole
// run); rebalancing sees the speeds as measured.
static void s_views_as(const router_t *r, swarm_peer_view_t *v, int optimistic)
{
    double fastest[NODE_MAX_LAYERS] = {0}, *backlog = r->backlog, *ahead = r->ahead;
    s_backlog(r, backlog, ahead);
    for (int i = 0; i < r->npeers; i++) {
        const peer_t *p = &r->peers[i];
        if (p->state == P_READY && p->samples > 0 && p->stage >= 0 && p->tok_s > fastest[p->stage])
            fastest[p->stage] = p->tok_s;
    }
    for (int i = 0; i < r->npeers; i++) {
        const peer_t *p = &r->peers[i];
        double tok_s = p->tok_s;
        if (optimistic && p->samples == 0 && p->stage >= 0 && fastest[p->stage] > tok_s)
            tok_s = fastest[p->stage];
        v[i] = (swarm_peer_view_t) {
            .stage = p->stage, .ready = p->state == P_READY && !p->failed,
            .joining = p->state == P_JOINING, .inflight = p->inflight, .queue = p->queue,
            .backlog = backlog[i], .ahead = ahead[i], .rtt = p->rtt, .tok_s = tok_s,
            .moved_at = p->moved_at,
        };
    }
}

static void s_views(const router_t *r, swarm_peer_view_t *v)
{
    s_views_as(r, v, 1);
}

static int s_ready_count(const router_t *r, int stage)
{
    int n = 0;
    for (int i = 0; i < r->npeers; i++)
        if (r->peers[i].state == P_READY && (stage < 0 || r->peers[i].stage == stage))
            n++;
    return n;
}

// Send a stage's state (params, m, v of the stage) to peer p.
static int s_send_state(router_t *r, int p, const float *params, const float *m, const float *v)
{
    int s = r->peers[p].stage;
    uint32_t dims[1] = { (uint32_t) r->stage_n[s] };
    size_t off = r->stage_off[s];
    net_msg_t *msg = net_msg_new(NET_MSG_STATE);
    net_head_t *h = net_msg_head(msg);
    h->stage = (uint32_t) s;
    h->step = (uint64_t) r->step;
    const float *parts[3] = { params + off, m + off, v + off };
    for (int i = 0; i < 3; i++) {
        int rc = net_msg_add_tensor(msg, NET_DTYPE_F32, dims, 1, parts[i]);
        if (rc != 0) {
            net_msg_destroy(&msg);
            return rc;
        }
    }
    return s_send(r, p, &msg, R_STATE, -1, s);
}

// Text from a peer goes into logs and JSON: printable ASCII only, no quotes.
static void s_sanitize(char *text)
{
    for (char *c = text; *c; c++)
        if (*c < 0x20 || *c > 0x7e || *c == '"' || *c == '\\')
            *c = '?';
}

// Assign peer p to `stage` (as the answer to req, or unasked when NULL);
// its state follows between steps (s_joins). 0 or -errno.
static int s_send_assign(router_t *r, int p, int stage, const net_msg_t *req)
{
    peer_t *pe = &r->peers[p];
    net_msg_t *a = req ? net_msg_reply(req, NET_MSG_ASSIGN) : net_msg_new(NET_MSG_ASSIGN);
    net_msg_head(a)->stage = (uint32_t) stage;
    net_msg_head(a)->step = (uint64_t) r->step;
    const node_config_t *c = &r->hp.cfg;
    int rc = s_meta(a, "V=%d\nT=%d\nC=%d\nL=%d\nH=%d\nS=%d\nstage=%d\nmicro=%d\npeer=%d\n"
                    "wire=%s\ngrad_wire=%s\n", c->V, c->T, c->C, c->L, c->H, r->plan.stages, stage,
                    r->hp.micro, pe->id, node_wire_name(r->wire), node_wire_name(r->grad_wire));
    if (rc == 0 && (rc = s_emit(r, &pe->who, &a)) != 0)
        pe->failed = 1; // not connected: s_reap finds it dead
    net_msg_destroy(&a);
    if (rc != 0)
        return rc;
    pe->stage = stage;
    pe->state = P_JOINING;
    printf("swarm router: peer %d (%s, %s) joins stage %d\n", pe->id, pe->name, pe->device, stage);
    fflush(stdout);
    return 0;
}

static int s_cmp_double(const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

// A joiner's speed in the router's units (training tokens/s on a stage,
// see s_work_done): what it measured at start, scaled by how the measured
// peers' speeds compare with what they measured at start (the median, so
// that one peer's false claim does not skew it).
static double s_hello_speed(const router_t *r, double hello)
{
    double *ratio = r->backlog; // scratch (s_views_as does not run meanwhile)
    int n = 0;
    for (int i = 0; i < r->npeers; i++) {
        const peer_t *pe = &r->peers[i];
        if (pe->state == P_READY && pe->samples > 0 && pe->hello_tok_s > 0.0)
            ratio[n++] = pe->tok_s / pe->hello_tok_s;
    }
    if (!n)
        return hello;
    qsort(ratio, (size_t) n, sizeof ratio[0], s_cmp_double);
    return hello * ratio[n / 2];
}

// Give peer p a stage (as the answer to req, or unasked): a newcomer, or a
// dead one coming back once its ban is over.
static void s_admit(router_t *r, int p, const net_msg_t *req)
{
    peer_t *pe = &r->peers[p];
    pe->failed = 0;
    pe->tok_s = s_hello_speed(r, pe->hello_tok_s);
    s_speed_restart(pe, r->now_ms);
    swarm_peer_view_t *views = r->views;
    s_views(r, views);
    int stage = r->assign_even ? swarm_policy_assign_even(views, r->npeers, r->plan.stages)
                               : swarm_policy_assign(views, r->npeers, r->plan.stages);
    s_ignore(s_send_assign(r, p, stage, req));
}

// A peer the router declared dead talks again (HELLO or HEARTBEAT): once
// its ban is over it joins again, with fresh state; until then it is told
// once why it waits.
static void s_on_dead_peer(router_t *r, int p, const net_msg_t *m)
{
    peer_t *pe = &r->peers[p];
    double now = s_secs(r);
    if (now >= pe->banned_until) {
        printf("swarm router: peer %d (%s) is back after it %s; it joins again\n", pe->id,
               pe->name, pe->why);
        fflush(stdout);
        s_admit(r, p, net_msg_head_const(m)->type == NET_MSG_HELLO ? m : NULL);
    } else if (!pe->ban_told) {
        net_msg_t *e = net_msg_new(NET_MSG_ERROR);
        int rc = isinf(pe->banned_until)
                 ? s_meta(e, "reason=expelled for the run: it %s", pe->why)
                 : s_meta(e, "reason=banned for %.0f s more: it %s", pe->banned_until - now, pe->why);
        if (rc == 0)
            s_ignore(s_emit(r, &pe->who, &e));
        net_msg_destroy(&e);
        pe->ban_told = 1;
    }
}

// Peer p's entry is named by the current step: gradient work it holds or
// sent, its part in STEP or UPDATE, a request in flight. (A forward it ran
// may name it too: the backward then goes to whoever takes the entry,
// which recomputes, as any replica can.)
static int s_peer_in_step(const router_t *r, int p)
{
    const peer_t *pe = &r->peers[p];
    if (pe->got_grad || pe->in_step || pe->self_to || pe->inflight > 0 || r->self_peer == p)
        return 1;
    for (int i = 0; r->mbs && i < r->G; i++)
        for (int s = 0; s < r->plan.stages; s++)
            if (r->mbs[i].grad_peer[s] == p)
                return 1;
    return 0;
}

// An entry for a new peer: that of the peer dead longest whose ban is over
// and that has no part in this step, once PEERS_KEEP_DEAD entries are
// dead (a dead peer's entry keeps its ban and its back-off, should it
// return), else a new one. -ENOMEM.
static int s_peer_slot(router_t *r)
{
    int best = -1, dead = 0;
    double now = s_secs(r);
    for (int p = 0; p < r->npeers; p++) {
        const peer_t *pe = &r->peers[p];
        if (pe->state != P_DEAD)
            continue;
        dead++;
        if (pe->banned_until <= now && !s_peer_in_step(r, p)
            && (best < 0 || pe->last_seen < r->peers[best].last_seen))
            best = p;
    }
    if (best >= 0 && dead >= PEERS_KEEP_DEAD) {
        free(r->peers[best].grad);
        return best;
    }
    if (r->npeers == r->peers_cap) {
        int cap = r->peers_cap ? 2 * r->peers_cap : 16;
        peer_t *peers = realloc(r->peers, (size_t) cap * sizeof *peers);
        if (peers)
            r->peers = peers;
        swarm_peer_view_t *views = peers ? realloc(r->views, (size_t) cap * sizeof *views) : NULL;
        if (views)
            r->views = views;
        double *backlog = views ? realloc(r->backlog, (size_t) cap * sizeof *backlog) : NULL;
        if (backlog)
            r->backlog = backlog;
        double *ahead = backlog ? realloc(r->ahead, (size_t) cap * sizeof *ahead) : NULL;
        if (!ahead)
            return -ENOMEM;
        r->ahead = ahead;
        r->peers_cap = cap;
    }
    return r->npeers++;
}

// A HELLO: check the protocol, assign a stage, answer ASSIGN. The state
// follows when the swarm is between steps (s_joins).
static void s_on_hello(router_t *r, const net_peer_t *who, const net_msg_t *hello)
{
    char proto[16] = "", name[64] = "?", device[128] = "?", tok[32] = "0", note[64];
    if (net_msg_meta_get(hello, "proto", proto, sizeof proto) != 0 || strcmp(proto, "1") != 0) {
        net_msg_t *err = net_msg_reply(hello, NET_MSG_ERROR);
        s_sanitize(proto);
        s_meta(err, "reason=protocol version %s, router speaks 1; upgrade swarm", proto[0] ? proto : "?");
        if (s_loud(r, who->key, note, sizeof note))
            fprintf(stderr, "swarm router: refused %.8s...: protocol version %s, not 1%s\n",
                    who->key, proto[0] ? proto : "missing", note);
        s_ignore(s_emit(r, who, &err));
        return;
    }
    s_ignore(net_msg_meta_get(hello, "name", name, sizeof name));
    s_ignore(net_msg_meta_get(hello, "device", device, sizeof device));
    s_ignore(net_msg_meta_get(hello, "tok_s", tok, sizeof tok));
    int p = s_peer_find(r, who);
    if (p < 0) {
        if ((p = s_peer_slot(r)) < 0) {
            fprintf(stderr, "swarm router: out of memory for the peer table (%d peers); "
                    "ignoring %s\n", r->npeers, name);
            return;
        }
        r->peers[p] = (peer_t) { .who = *who, .id = ++r->next_peer_id, .stage = -1, .moved_at = -1e30 };
    }
    peer_t *pe = &r->peers[p];
    s_sanitize(name);
    s_sanitize(device);
    snprintf(pe->name, sizeof pe->name, "%s", name);
    snprintf(pe->device, sizeof pe->device, "%s", device);
    double t = strtod(tok, NULL);
    pe->hello_tok_s = isfinite(t) && t > 0 && t < 1e12 ? t : 1000.0;
    pe->last_seen = r->now_ms;
    if (pe->state == P_READY || pe->state == P_JOINING)
        return; // a repeated HELLO: the ASSIGN is on its way
    if (pe->state == P_DEAD)
        s_on_dead_peer(r, p, hello);
    else
        s_admit(r, p, hello);
}

// Between steps: hand joining peers their stage's state, from the router's
// own copy before training starts, else from a ready replica (STATE_GET).
static void s_joins(router_t *r)
{
    for (int p = 0; p < r->npeers; p++) {
        peer_t *pe = &r->peers[p];
        if (pe->state != P_JOINING || pe->inflight > 0)
            continue;
        if (!r->started) {
            s_ignore(s_send_state(r, p, r->params, r->m, r->v));
            continue;
        }
        for (int q = 0; q < r->npeers; q++) {
            if (r->peers[q].state == P_READY && r->peers[q].stage == pe->stage) {
                net_msg_t *g = net_msg_new(NET_MSG_STATE_GET);
                net_msg_head(g)->stage = (uint32_t) pe->stage;
                // the reply is forwarded to the joiner: remember it in mb
                s_ignore(s_send(r, q, &g, R_STATE_GET, p, pe->stage));
                pe->inflight++; // held until its state arrives
                break;
            }
        }
    }
}

// ---- the window: micro-batches in flight ----------------------------------

// A FWD/BWD reply's meta held= (s at the node) and busy= (s of compute):
// the rest of its time dt was the network's round trip.
static void s_peer_timing(peer_t *pe, int bwd, const net_msg_t *m, double dt)
{
    char text[2][32];
    if (net_msg_meta_get(m, "held", text[0], sizeof text[0]) != 0
        || net_msg_meta_get(m, "busy", text[1], sizeof text[1]) != 0)
        return; // a node that does not say
    double held = strtod(text[0], NULL), busy = strtod(text[1], NULL);
    if (!(held >= 0 && held < 1e6 && busy >= 0 && busy < 1e6))
        return;
    // a request that reached a busy node waited in its socket, which looks
    // like network: follow a lower sample at once, a higher one slowly
    double net = dt > held ? dt - held : 0.0;
    pe->rtt = pe->rtt > 0 && net > pe->rtt ? 0.95 * pe->rtt + 0.05 * net : net;
    pe->busy[bwd] = pe->busy[bwd] > 0 ? 0.8 * pe->busy[bwd] + 0.2 * busy : busy;
}

// What swarm_policy_window needs, from the ready peers' measurements.
static void s_window_in(const router_t *r, swarm_window_in_t *in)
{
    int S = r->plan.stages, unknown_slots[NODE_MAX_LAYERS] = {0};
    *in = (swarm_window_in_t) { .stages = S, .micro_batches = r->G };
    double work[NODE_MAX_LAYERS] = {0}, rate[NODE_MAX_LAYERS] = {0};
    int measured[NODE_MAX_LAYERS] = {0};
    for (int p = 0; p < r->npeers; p++) {
        const peer_t *pe = &r->peers[p];
        int s = pe->stage;
        if (pe->state != P_READY || pe->failed || s < 0 || s >= S)
            continue;
        in->replicas[s]++;
        in->rtt = pe->rtt > in->rtt ? pe->rtt : in->rtt; // the slowest link sets the pace
        // the last stage's backward runs inside its FWD
        if (pe->busy[0] > 0 && (s == S - 1 || pe->busy[1] > 0)) {
            double each = pe->busy[0] + (s == S - 1 ? 0.0 : pe->busy[1]);
            work[s] += each;
            rate[s] += 1.0 / each;
            measured[s]++;
        }
        in->slots[s] += pe->slots;
        unknown_slots[s] |= pe->slots <= 0;
    }
    for (int s = 0; s < S; s++) {
        in->work[s] = measured[s] ? work[s] / measured[s] : 0.0; // the measured replicas' mean
        // every replica busy (the unmeasured ones as fast as the mean)
        in->pace[s] = measured[s] ? 1.0 / (rate[s] * in->replicas[s] / measured[s]) : 0.0;
        if (unknown_slots[s])
            in->slots[s] = 0;
    }
}

// At the start of a step, with --window auto: the window for the swarm as
// it is now; said when it changes by a quarter or more.
static void s_window_update(router_t *r)
{
    if (r->window_mode != WIN_FIXED) {
        swarm_window_in_t in;
        s_window_in(r, &in);
        in.all = r->window_mode == WIN_ALL;
        r->window = swarm_policy_window(&in);
        if (!r->window_shown || 4 * abs(r->window - r->window_shown) >= r->window_shown) {
            printf("swarm router: step %ld: window %d of %d micro-batches (round trip %.0f ms%s)\n",
                   r->step, r->window, r->G, 1000.0 * in.rtt,
                   in.work[0] > 0 ? "" : ", stages not measured yet");
            fflush(stdout);
            r->window_shown = r->window;
        }
    }
    r->window_sum += r->window;
    r->window_n++;
}

static void s_step_end(router_t *r);
static int s_apply_here(const router_t *r, int s);
static void s_step_apply_ask(router_t *r, int s);
static void s_consensus(router_t *r, long step);

// Latency hiding across steps: the next step may start right behind this
// step's UPDATEs, before the replicas confirm them (a node serves UPDATE
// before anything sent after it, so the next FWDs see the new parameters);
// saves a round trip a step. The checksums are compared when the
// confirmations are in (R_UPDATE requests with mb = 1). Not on the run's
// last step: the run would end before them.
static int s_update_pipelined(const router_t *r)
{
    long stop = r->o.steps > 0 && r->first + r->o.steps < r->hp.iters ? r->first + r->o.steps
                                                                      : r->hp.iters;
    return r->step + 1 < stop && r->update_pending == 0 && r->self_peer < 0;
}

// ---- micro-batches ---------------------------------------------------------

static void *s_dup_bytes(const void *src, size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        abort();
    memcpy(p, src, n);
    return p;
}

static void s_mb_clear(router_t *r, mb_t *b)
{
    for (int s = 0; s <= r->plan.stages; s++) {
        free(b->in[s]);
        b->in[s] = NULL;
    }
    free(b->targets);
    for (int s = 0; s < r->plan.stages; s++) {
        free(b->dy[s]);
        b->dy[s] = NULL;
    }
    for (int s = 0; b->spot && s < r->plan.stages; s++)
        for (int k = 0; k < 3; k++)
            free(b->spot[s].out[k]);
    free(b->spot);
    *b = (mb_t) { .stage = -1 };
    for (int s = 0; s < r->plan.stages; s++)
        b->grad_peer[s] = -1;
}

// The FWD message of micro-batch i at stage s.
static net_msg_t *s_fwd_msg(router_t *r, int i, int s)
{
    mb_t *b = &r->mbs[i];
    int S = r->plan.stages, T = r->hp.cfg.T, micro = r->hp.micro;
    net_msg_t *m = net_msg_new(NET_MSG_FWD);
    net_head_t *h = net_msg_head(m);
    h->step = (uint64_t) r->step;
    h->stage = (uint32_t) s;
    h->mb = (uint32_t) (r->evaluating ? EVAL_MB + i : i);
    uint32_t tok_dims[2] = { (uint32_t) micro, (uint32_t) T };
    char meta[256] = "";
    int rc = s == 0 ? net_msg_add_raw(m, NET_DTYPE_I32, tok_dims, 2, b->in[0], r->tok_bytes)
                    : s_acts_add(r, m, b->in[s], b->in_dtype[s], b->in_pow2[s], meta, sizeof meta);
    if (rc == 0 && s == S - 1) {
        rc = net_msg_add_raw(m, NET_DTYPE_I32, tok_dims, 2, b->targets, r->tok_bytes);
        if (r->evaluating)
            strcat(meta, "eval=1\n");
        else
            snprintf(meta + strlen(meta), sizeof meta - strlen(meta), "scale=%a\n",
                     1.0f / (float) ((double) r->hp.batch * T));
    }
    if (rc == 0 && meta[0])
        rc = s_meta(m, "%s", meta);
    if (rc != 0)
        net_msg_destroy(&m);
    return m;
}

// The BWD message of micro-batch i at stage s (< S-1): its input and dy.
static net_msg_t *s_bwd_msg(router_t *r, int i, int s)
{
    mb_t *b = &r->mbs[i];
    int T = r->hp.cfg.T, micro = r->hp.micro;
    net_msg_t *m = net_msg_new(NET_MSG_BWD);
    net_head_t *h = net_msg_head(m);
    h->step = (uint64_t) r->step;
    h->stage = (uint32_t) s;
    h->mb = (uint32_t) i;
    uint32_t tok_dims[2] = { (uint32_t) micro, (uint32_t) T };
    char meta[128] = "";
    int rc = s == 0 ? net_msg_add_raw(m, NET_DTYPE_I32, tok_dims, 2, b->in[0], r->tok_bytes)
                    : s_acts_add(r, m, b->in[s], b->in_dtype[s], b->in_pow2[s], meta, sizeof meta);
    if (rc == 0)
        rc = s_acts_add(r, m, b->dy[s], b->dy_dtype[s], b->dy_pow2[s], meta, sizeof meta);
    if (rc == 0 && meta[0])
        rc = s_meta(m, "%s", meta);
    if (rc != 0)
        net_msg_destroy(&m);
    return m;
}

// The best ready peer of stage s, but none of not[], for `work` (of a
// micro-batch's training work: 1/3 a forward alone; a forward and the
// backward it brings, or a backward recomputed away from its activations,
// 1); prefer: who holds the activations, or -1. -EAGAIN when none can.
static int s_pick_but(router_t *r, int s, int prefer, double work, const int *not, int nnot)
{
    swarm_peer_view_t *views = r->views;
    s_views(r, views);
    for (int k = 0; k < nnot; k++)
        if (not[k] >= 0)
            views[not[k]].ready = 0;
    int p = swarm_policy_pick(views, r->npeers, s, prefer, work * r->hp.micro * r->hp.cfg.T);
    return p < 0 ? -EAGAIN : p;
}

static int s_pick(router_t *r, int s, int prefer, double work)
{
    return s_pick_but(r, s, prefer, work, NULL, 0);
}

static int s_forwards_left(const router_t *r, int s);

// The replica of stage s for a training forward, `left` forwards of the
// step still to go there (swarm_policy_pick_fit). -EAGAIN when none can.
static int s_pick_fit(router_t *r, int s, int left)
{
    swarm_peer_view_t *views = r->views;
    s_views(r, views);
    int p = swarm_policy_pick_fit(views, r->npeers, s, r->hp.micro * r->hp.cfg.T, left);
    return p < 0 ? -EAGAIN : p;
}

// FWD of micro-batch i at stage s to the best ready peer.
static int s_fwd(router_t *r, int i, int s)
{
    // a training forward brings its backward (the last stage runs both)
    int p = r->evaluating ? s_pick(r, s, -1, 1.0 / 3.0) : s_pick_fit(r, s, s_forwards_left(r, s));
    net_msg_t *m = p >= 0 ? s_fwd_msg(r, i, s) : NULL;
    if (!m)
        return p < 0 ? p : -ENOMEM;
    r->mbs[i].stage = s;
    r->mbs[i].fwd_peer[s] = p;
    return s_send(r, p, &m, R_FWD, i, s);
}

// Forwards of this step not yet sent to stage s.
static int s_forwards_left(const router_t *r, int s)
{
    int n = 0;
    for (int i = 0; i < r->G; i++)
        n += r->mbs[i].stage < s && !r->mbs[i].backward;
    return n;
}

// BWD of micro-batch i at stage s (< S-1), to its forward's peer, which
// holds the activations. Once the stage has no forwards left to do this
// step, a replica that would be through everything it holds sooner, even
// recomputing the forward, takes it instead: a slow replica's backwards
// do not hold up the end of the step.
static int s_bwd(router_t *r, int i, int s)
{
    int holder = r->mbs[i].fwd_peer[s];
    int p = holder >= 0 && holder < r->npeers && r->peers[holder].state == P_READY
                    && !r->peers[holder].failed && r->peers[holder].stage == s
                    && s_forwards_left(r, s) > 0
                ? holder
                : s_pick(r, s, holder, 1.0);
    net_msg_t *m = p >= 0 ? s_bwd_msg(r, i, s) : NULL;
    if (!m)
        return p < 0 ? p : -ENOMEM;
    r->mbs[i].stage = s;
    r->mbs[i].backward = 1;
    return s_send(r, p, &m, R_BWD, i, s);
}

// Re-run the gradient-accumulating work of micro-batch i at stage s (a
// dead peer held it) on another replica; its outputs are not needed.
static int s_redo(router_t *r, int i, int s)
{
    int last = s == r->plan.stages - 1;
    int p = s_pick(r, s, -1, 1.0);
    net_msg_t *m = p < 0 ? NULL : last ? s_fwd_msg(r, i, s) : s_bwd_msg(r, i, s);
    if (!m)
        return p < 0 ? p : -ENOMEM;
    r->mbs[i].grad_peer[s] = -1;
    int rc = s_send(r, p, &m, last ? R_FWD : R_BWD, i, s);
    if (rc == 0) {
        s_req_find(r, r->last_id)->redo = 1;
        r->redo_pending++;
    }
    return rc;
}

// Send the next request of micro-batch i, or remember it for the next turn
// when no peer of the stage can take it now (never lose a micro-batch).
static int s_next(router_t *r, int i, int kind, int s)
{
    int rc = kind == R_FWD ? s_fwd(r, i, s) : s_bwd(r, i, s);
    r->mbs[i].retry_kind = rc == 0 ? 0 : kind;
    r->mbs[i].retry_stage = s;
    return 0;
}

// Retry what could not be sent: chain requests and lost work to re-run.
static void s_retry(router_t *r)
{
    // a stage that held a forward back (swarm_policy_pick_fit) holds the
    // others too until something changes: not asked again this turn
    int held[NODE_MAX_LAYERS] = {0};
    for (int i = 0; i < r->G; i++) {
        mb_t *b = &r->mbs[i];
        int at = b->retry_stage, fwd = b->retry_kind == R_FWD && at >= 0 && at < NODE_MAX_LAYERS;
        if (b->retry_kind && !(fwd && held[at])) {
            s_ignore(s_next(r, i, b->retry_kind, at));
            if (fwd && b->retry_kind)
                held[at] = 1;
        }
        for (int s = 0; s < r->plan.stages; s++) {
            if (b->redo_wanted[s] && s_redo(r, i, s) == 0) {
                b->redo_wanted[s] = 0;
                r->redo_pending--; // counted when it was wanted
            }
        }
    }
}

// Start micro-batch i of the current step.
static int s_mb_start(router_t *r, int i)
{
    mb_t *b = &r->mbs[i];
    int T = r->hp.cfg.T, micro = r->hp.micro;
    b->in[0] = malloc(r->tok_bytes);
    b->targets = malloc(r->tok_bytes);
    if (!b->in[0] || !b->targets)
        abort();
    swarm_data_train_batch(r->data, r->hp.seed, r->step, r->hp.batch, i * micro, micro, T,
                           b->in[0], b->targets);
    int rc = s_fwd(r, i, 0);
    if (rc != 0)
        s_mb_clear(r, b);
    return rc;
}

// Keep tensor 0 of a FWD/BWD reply, activations or their gradient in any
// float format, as its wire bytes in *dst (replacing what was there) with
// its format and scale; the next stage decodes it. -EPROTO when it is not.
static int s_acts_keep(const router_t *r, const net_msg_t *m, void **dst, uint8_t *dtype,
                       int8_t *pow2)
{
    const net_head_t *h = net_msg_head_const(m);
    size_t bytes = 0;
    int k = 0, dt = h->ntensors > 0 ? h->tensors[0].dtype : 0;
    if ((dt != NET_DTYPE_F32 && dt != NET_DTYPE_F16 && dt != NET_DTYPE_I8)
        || node_wire_pow2(m, 0, &k) != 0)
        return -EPROTO;
    const void *p = net_msg_raw(m, 0, &bytes);
    if (!p || bytes != net_codec_bytes(dt, s_acts_count(r)))
        return -EPROTO;
    free(*dst);
    *dst = s_dup_bytes(p, bytes);
    *dtype = (uint8_t) dt;
    *pow2 = (int8_t) k;
    return 0;
}

// A peer's speed is measured, not believed: training tokens of work it
// finished per second it was busy (a token's forward is a third of its
// work, its backward two thirds; the last stage does both at once). It is
// sampled every half second of busy time into an average, so a peer that
// queues requests is not mistaken for a slow one.
static void s_work_done(router_t *r, const req_t *q)
{
    peer_t *pe = &r->peers[q->peer];
    double tokens = (double) r->hp.micro * r->hp.cfg.T;
    int last = q->stage == r->plan.stages - 1;
    pe->work += q->kind == R_BWD ? tokens * 2.0 / 3.0
              : last && !r->evaluating ? tokens : tokens / 3.0;
    double busy = s_busy_s(pe, r->now_ms);
    if (busy - pe->rate_busy < 0.2)
        return;
    double rate = (pe->work - pe->rate_work) / (busy - pe->rate_busy);
    pe->tok_s = pe->samples > 0 ? 0.5 * pe->tok_s + 0.5 * rate : rate;
    pe->samples++;
    pe->rate_busy = busy;
    pe->rate_work = pe->work;
}

// ---- spot verification ------------------------------------------------------
// A fraction (--verify) of training FWDs is run again on a second replica of
// the stage while the micro-batch goes on with the first result; the step's
// update waits until every check of the step is settled (s_spots_open).
// Two results agree when the outputs are within 1e-3 relative L2 (at the
// last stage, run forward-only, the losses within 1e-4). When they
// disagree, a third replica decides; the one it contradicts is expelled,
// and since its outputs have fed the step, the step starts over without
// it. With no third replica the disagreement is logged and counted, and
// the run goes on.

// Whether FWD of micro-batch i at stage s of this step is verified: a fixed
// draw from (seed, step, i, s), so that a replay checks the same ones.
static int s_spot_sampled(const router_t *r, int i, int s)
{
    if (r->verify <= 0.0 || r->evaluating)
        return 0;
    uint64_t x = (uint64_t) r->hp.seed * 0x9e3779b97f4a7c15ull ^ (uint64_t) r->step << 24
               ^ (uint64_t) i << 8 ^ (uint64_t) s;
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return (double) (x >> 11) * 0x1p-53 < r->verify;
}

// The FWD of micro-batch i at stage s again, to peer p: at the last stage
// forward-only (eval=1: nothing accumulates).
static int s_spot_send(router_t *r, int i, int s, int p)
{
    net_msg_t *m = s_fwd_msg(r, i, s);
    if (m && s == r->plan.stages - 1 && net_msg_set_meta(m, "eval=1\n") != 0)
        net_msg_destroy(&m);
    if (!m)
        return -ENOMEM;
    return s_send(r, p, &m, R_VERIFY, i, s);
}

// The open check of micro-batch q->mb at stage q->stage, or NULL.
static spot_t *s_spot_of(const router_t *r, const req_t *q)
{
    if (q->mb < 0 || q->mb >= r->G || q->stage < 0 || q->stage >= r->plan.stages)
        return NULL;
    spot_t *c = r->mbs[q->mb].spot ? &r->mbs[q->mb].spot[q->stage] : NULL;
    return c && c->n > 0 ? c : NULL;
}

// The check is settled (or given up).
static void s_spot_release(spot_t *c)
{
    for (int k = 0; k < 3; k++) {
        free(c->out[k]);
        c->out[k] = NULL;
    }
    c->n = 0;
}

// Checks of this step not settled yet: the update waits for them.
static int s_spots_open(const router_t *r)
{
    int n = 0;
    for (int i = 0; r->mbs && i < r->G; i++)
        for (int s = 0; r->mbs[i].spot && s < r->plan.stages; s++)
            n += r->mbs[i].spot[s].n > 0;
    return n;
}

// When sampled (never while evaluating), keep micro-batch q->mb's FWD
// result from peer q->peer (decoded in scratch, or its loss) and ask
// another replica for it; the micro-batch goes on meanwhile. A result that
// comes again (the FWD re-sent after its peer died) while the check is
// open is not checked twice.
static void s_spot_begin(router_t *r, const req_t *q, float loss)
{
    mb_t *b = &r->mbs[q->mb];
    if (!s_spot_sampled(r, q->mb, q->stage) || s_spot_of(r, q))
        return;
    int other = s_pick_but(r, q->stage, -1, 1.0 / 3.0, &q->peer, 1);
    if (other < 0 || (!b->spot && !(b->spot = calloc((size_t) r->plan.stages, sizeof *b->spot))))
        return;
    spot_t *c = &b->spot[q->stage];
    c->n = 1;
    c->peer[0] = q->peer;
    c->loss[0] = loss;
    if (q->stage < r->plan.stages - 1)
        c->out[0] = s_dup_bytes(r->scratch, s_acts_count(r) * sizeof(float));
    if (s_spot_send(r, q->mb, q->stage, other) != 0)
        s_spot_release(c);
}

static int s_spot_same(const router_t *r, const spot_t *c, int x, int y)
{
    if (!c->out[x] || !c->out[y])
        return fabsf(c->loss[x] - c->loss[y]) <= 1e-4f * fmaxf(1.0f, fabsf(c->loss[y]));
    double d = 0.0, n = 0.0;
    for (size_t j = 0; j < s_acts_count(r); j++) {
        double e = (double) c->out[x][j] - c->out[y][j];
        d += e * e;
        n += (double) c->out[y][j] * c->out[y][j];
    }
    return d <= 1e-6 * (n > 1e-30 ? n : 1e-30);
}

// A peer caught returning wrong results: expelled for the run.
// Peer p failed: it is dead and refused for `seconds` (INFINITY: for the
// run); the log says `line`, swarm status `why`. Its work is redone.
static void s_peer_ban(router_t *r, int p, double seconds, const char *why, const char *line)
{
    peer_t *pe = &r->peers[p];
    pe->failures++;
    pe->banned_until = s_secs(r) + seconds;
    pe->ban_told = 0;
    s_peer_dead(r, p, line);
    snprintf(pe->why, sizeof pe->why, "%s", why);
}

static void s_peer_expel(router_t *r, int p, const char *why)
{
    if (r->peers[p].state == P_DEAD)
        return;
    char line[160], shown[128];
    snprintf(line, sizeof line, "%s: expelled for the run", why);
    snprintf(shown, sizeof shown, "%s: expelled", why);
    r->expelled++;
    s_peer_ban(r, p, INFINITY, shown, line);
}

// A STEP of this step to stage s with meta (or none); NULL if it cannot be
// made.
static net_msg_t *s_step_msg(router_t *r, int s, const char *meta)
{
    net_msg_t *m = net_msg_new(NET_MSG_STEP);
    net_msg_head(m)->step = (uint64_t) r->step;
    net_msg_head(m)->stage = (uint32_t) s;
    if (meta && s_meta(m, "%s", meta) != 0)
        net_msg_destroy(&m);
    return m;
}

// Start the current step over: every replica drops what it accumulated
// (STEP discard=1) and every micro-batch runs again from the start.
static void s_step_restart(router_t *r, const char *why)
{
    fprintf(stderr, "swarm router: step %ld: starting the step over (%s)\n", r->step, why);
    for (int i = 0; i < r->req_slots; i++) {
        req_t *q = s_req_at(r, i);
        if (q->id && !(q->kind == R_STEP && q->mb == MB_APPLY))
            s_req_done(r, q); // their answers are stale now (not the last step's)
    }
    for (int i = 0; i < r->G; i++)
        s_mb_clear(r, &r->mbs[i]);
    r->pending = r->redo_pending = 0;
    for (int p = 0; p < r->npeers; p++) {
        if (r->peers[p].state != P_READY)
            continue;
        net_msg_t *m = s_step_msg(r, r->peers[p].stage, "discard=1\n");
        if (m && s_send(r, p, &m, R_DISCARD, -1, r->peers[p].stage) == 0)
            r->pending++;
    }
    r->restarts++;
    r->phase = PH_DISCARD;
}

// A verifying replica's answer (checked; outputs decoded in scratch).
static void s_spot_result(router_t *r, const req_t *q, const net_msg_t *m)
{
    spot_t *c = s_spot_of(r, q);
    char text[64];
    if (!c || c->n > 2)
        return; // stale
    int k = c->n++, s = q->stage;
    c->peer[k] = q->peer;
    c->loss[k] = net_msg_meta_get(m, "loss", text, sizeof text) == 0 ? strtof(text, NULL) : NAN;
    c->out[k] = c->out[0] ? s_dup_bytes(r->scratch, s_acts_count(r) * sizeof(float)) : NULL;
    const peer_t *a = &r->peers[c->peer[0]], *v = &r->peers[q->peer];
    if (k == 1 && s_spot_same(r, c, 0, 1)) {
        r->spot_checks++;
        s_spot_release(c);
        return;
    }
    if (k == 1) {
        int not[2] = { c->peer[0], q->peer };
        int third = s_pick_but(r, s, -1, 1.0 / 3.0, not, 2);
        fprintf(stderr, "swarm router: step %ld: stage %d: peers %d (%s) and %d (%s) disagree on "
                "micro-batch %d%s\n", r->step, s, a->id, a->name, v->id, v->name, q->mb,
                third >= 0 ? "; asking a third replica" : "; no third replica to decide");
        if (third < 0 || s_spot_send(r, q->mb, s, third) != 0) {
            r->spot_undecided++;
            s_spot_release(c);
        }
        return;
    }
    r->spot_checks++;
    int liar = s_spot_same(r, c, 0, 2) && !s_spot_same(r, c, 1, 2) ? c->peer[1]
             : s_spot_same(r, c, 1, 2) && !s_spot_same(r, c, 0, 2) ? c->peer[0] : -1;
    if (liar < 0) {
        r->spot_undecided++;
        s_spot_release(c);
        return;
    }
    char why[96];
    snprintf(why, sizeof why, "returned a stage %d forward that two replicas contradict", s);
    s_peer_expel(r, liar, why);
    if (r->phase == PH_MB || r->phase == PH_GRAD) // not rolled back by the expulsion
        s_step_restart(r, "a peer whose outputs it used was caught lying");
}

// A verifying replica is gone before it answered: go on without it.
static void s_spot_lost(router_t *r, const req_t *q)
{
    spot_t *c = s_spot_of(r, q);
    if (c) {
        if (c->n == 2)
            r->spot_undecided++;
        s_spot_release(c);
    }
}

// A RESULT of FWD or BWD for micro-batch q->mb. -EPROTO for a bad reply.
static int s_on_result(router_t *r, const req_t *q, const net_msg_t *m)
{
    int S = r->plan.stages, s = q->stage;
    s_work_done(r, q);
    s_peer_timing(&r->peers[q->peer], q->kind == R_BWD, m,
                  (double) (r->now_ms - q->sent) / 1000.0);
    if (q->mb < 0)
        return 0; // of a step its stage finished itself (s_step_apply_ask): counted
    mb_t *b = &r->mbs[q->mb];
    int accumulates = !r->evaluating && (q->kind == R_BWD || s == S - 1);
    if (accumulates)
        b->grad_peer[s] = q->peer;
    if (q->redo) {
        r->redo_pending--;
        return 0;
    }
    if (q->kind == R_FWD && s < S - 1) {
        if (s_acts_keep(r, m, &b->in[s + 1], &b->in_dtype[s + 1], &b->in_pow2[s + 1]) != 0)
            return -EPROTO;
        s_spot_begin(r, q, 0.0f); // (the scratch still holds the outputs)
        return s_next(r, q->mb, R_FWD, s + 1);
    }
    if (q->kind == R_FWD) {
        char loss[64];
        if (net_msg_meta_get(m, "loss", loss, sizeof loss) != 0)
            return -EPROTO;
        b->loss = strtof(loss, NULL);
        if (!isfinite(b->loss))
            return -EPROTO;
        s_spot_begin(r, q, b->loss);
        if (S == 1 || r->evaluating) {
            b->stage = S;
            return 0;
        }
        if (s_acts_keep(r, m, &b->dy[S - 2], &b->dy_dtype[S - 2], &b->dy_pow2[S - 2]) != 0)
            return -EPROTO;
        return s_next(r, q->mb, R_BWD, S - 2);
    }
    if (s == 0) {
        b->stage = S; // through
        return 0;
    }
    if (s_acts_keep(r, m, &b->dy[s - 1], &b->dy_dtype[s - 1], &b->dy_pow2[s - 1]) != 0)
        return -EPROTO;
    return s_next(r, q->mb, R_BWD, s - 1);
}

// ---- the step --------------------------------------------------------------

static void s_step_begin(router_t *r)
{
    for (int i = 0; i < r->G; i++)
        s_mb_clear(r, &r->mbs[i]);
    for (int p = 0; p < r->npeers; p++)
        r->peers[p].got_grad = r->peers[p].in_step = 0; // nobody's gradient of this step is in yet
    memset(r->stepped, 0, sizeof r->stepped);
    r->pending = 0;
    r->phase = PH_MB;
    r->step_t0 = s_secs(r);
    s_window_update(r);
}

// Every micro-batch's loss is in: each is through or in its backward.
static int s_losses_in(const router_t *r)
{
    for (int i = 0; i < r->G; i++)
        if (r->mbs[i].stage != r->plan.stages && !r->mbs[i].backward)
            return 0;
    return 1;
}

// Every micro-batch's gradient work at stage s has been sent this step:
// its BWD (the last stage: its FWD, which runs the backward too).
static int s_stage_sent(const router_t *r, int s)
{
    int S = r->plan.stages;
    for (int i = 0; i < r->G; i++) {
        const mb_t *b = &r->mbs[i];
        if (b->stage == S)
            continue;
        if (b->stage < 0 || (s < S - 1 ? !(b->backward && b->stage <= s)
                                       : !(b->backward || b->stage == S - 1)))
            return 0;
        if (b->retry_kind || b->redo_wanted[s])
            return 0;
    }
    return 1;
}

// STEP to every ready replica of stage s: send your gradient (a stage's
// only replica keeps it and sends its norm).
static void s_step_ask(router_t *r, int s)
{
    r->stepped[s] = 1;
    int only = s_ready_count(r, s) == 1;
    for (int p = 0; p < r->npeers; p++) {
        if (r->peers[p].state != P_READY || r->peers[p].stage != s)
            continue;
        r->peers[p].in_step = 0;
        r->peers[p].got_grad = 0;
        r->peers[p].norm_only = only;
        net_msg_t *m = s_step_msg(r, s, only ? "norm_only=1\n" : NULL);
        if (m && s_send(r, p, &m, R_STEP, -1, s) == 0) {
            r->peers[p].in_step = 1;
            r->pending++;
        }
    }
}

// Every STEP of this step is void (a dead peer's work is being redone, and
// the survivors' sums must include it): they are asked again.
static void s_step_unask(router_t *r)
{
    for (int k = 0; k < r->req_slots; k++) {
        req_t *q = s_req_at(r, k);
        if (q->id && q->kind == R_STEP && q->mb != MB_APPLY)
            s_req_done(r, q); // their answers are stale now (not the last step's)
    }
    for (int q = 0; q < r->npeers; q++)
        if (r->peers[q].state != P_DEAD)
            r->peers[q].got_grad = 0; // a dead peer's gradient that came in still counts
    memset(r->stepped, 0, sizeof r->stepped);
    r->pending = 0;
    if (r->phase == PH_GRAD)
        r->phase = PH_MB;
}

// Keep `window` micro-batches in flight; ask each stage for its gradients
// once its work is all sent; when all are through, sum them (PH_GRAD).
static void s_step_micro(router_t *r)
{
    s_retry(r);
    int flying = 0, done = 0, S = r->plan.stages;
    for (int i = 0; i < r->G; i++) {
        if (r->mbs[i].stage == S)
            done++;
        else if (r->mbs[i].stage >= 0)
            flying++;
    }
    for (int i = 0; i < r->G && flying < r->window; i++) {
        if (r->mbs[i].stage == -1 && !r->mbs[i].in[0]) {
            if (s_mb_start(r, i) != 0)
                return; // no ready peer right now; try again on the next turn
            flying++;
        }
    }
    // a stage with all its gradient work sent is asked for its gradients
    // now: the STEP queues behind that work at each replica (served in
    // order), so the later stages' sums travel while stage 0 finishes its
    // backwards, and over slow links the STEP is not a round trip late
    int stepped = 0;
    for (int s = 0; s < S; s++) {
        if (!r->stepped[s] && r->redo_pending == 0 && s_stage_sent(r, s)) {
            int here = s_losses_in(r) ? s_apply_here(r, s) : 0;
            if (here > 0 && s_spots_open(r) > 0)
                continue; // that STEP applies the update: after the checks
            if (here > 0) {
                s_step_apply_ask(r, s);
                return;
            }
            if (here == 0)
                s_step_ask(r, s);
        }
        stepped += r->stepped[s];
    }
    if (done < r->G || r->redo_pending > 0 || stepped < S)
        return;
    r->phase = PH_GRAD;
}

// A GRAD (checked, and decoded into peer_grad by s_check_reply).
static int s_on_grad(router_t *r, const req_t *q, const net_msg_t *m)
{
    char text[64];
    if (r->peers[q->peer].norm_only && net_msg_meta_get(m, "sumsq", text, sizeof text) == 0)
        r->peers[q->peer].sumsq = strtod(text, NULL);
    r->peers[q->peer].got_grad = 1;
    r->pending--;
    return 0;
}

// Sum each stage's gradients over its replicas whose GRAD is in, in peer
// order, into grad_sum; the sum of squares of everything that came in (the
// stages' sums and the norms of stages with one replica).
static double s_grad_reduce(router_t *r)
{
    double sumsq = 0.0;
    int summed[NODE_MAX_LAYERS] = {0};
    for (int p = 0; p < r->npeers; p++) {
        if (!r->peers[p].got_grad)
            continue;
        if (r->peers[p].norm_only) {
            sumsq += r->peers[p].sumsq;
            continue;
        }
        int s = r->peers[p].stage;
        float *dst = r->grad_sum + r->stage_off[s];
        if (!summed[s]++)
            memset(dst, 0, r->stage_n[s] * sizeof(float));
        for (size_t j = 0; j < r->stage_n[s]; j++)
            dst[j] += r->peers[p].grad[j];
    }
    // the stages whose gradients came here
    for (int s = 0; s < r->plan.stages; s++)
        for (size_t j = 0; summed[s] && j < r->stage_n[s]; j++)
            sumsq += (double) r->grad_sum[r->stage_off[s] + j] * r->grad_sum[r->stage_off[s] + j];
    return sumsq;
}

// UPDATE of `step` to peer p: its stage's summed gradient (unless its
// stage has one replica, which kept its own) and the optimizer's scalars.
// A pipelined UPDATE (the next step does not wait for it) is counted in
// update_pending, any other in pending. 0 or -errno.
static int s_update_to(router_t *r, int p, long step, double lr, float scale, int norm_only,
                       int pipelined)
{
    int s = r->peers[p].stage;
    uint32_t dims[1] = { (uint32_t) r->stage_n[s] };
    net_msg_t *m = net_msg_new(NET_MSG_UPDATE);
    net_msg_head(m)->step = (uint64_t) step;
    net_msg_head(m)->stage = (uint32_t) s;
    int pow2 = 0, rc = 0;
    if ((!norm_only && (rc = node_wire_add(m, r->grad_wire, dims, 1, r->grad_sum + r->stage_off[s],
                                           &pow2)) != 0)
        || (rc = s_meta(m, "lr=%a\nscale=%a\nwd=%a\nt=%ld\npow2_0=%d\n", lr, (double) scale,
                        r->hp.weight_decay, step + 1, pow2)) != 0) {
        net_msg_destroy(&m);
        return rc;
    }
    if ((rc = s_send(r, p, &m, R_UPDATE, pipelined ? 1 : -1, s)) == 0) {
        if (pipelined)
            r->update_pending++;
        else
            r->pending++;
    }
    return rc;
}

// What peer pe is sent in an UPDATE: 0 none, 1 its stage's sum, 2 its own
// gradient kept (self: the UPDATE after a stage applied its own, self_to).
static int s_update_kind(const peer_t *pe, int self)
{
    return self ? pe->self_to : pe->in_step ? (pe->norm_only ? 2 : 1) : 0;
}

// UPDATE of `step` to each ready peer with an s_update_kind, stage by
// stage: the next step's first forward reaches stage 0 first, then stage
// 1, and waits at each replica behind its UPDATE.
static void s_update_all(router_t *r, int self, long step, double lr, float scale, int pipelined)
{
    for (int s = 0; s < r->plan.stages; s++) {
        for (int p = 0; p < r->npeers; p++) {
            int to = s_update_kind(&r->peers[p], self);
            if (to && r->peers[p].stage == s && r->peers[p].state == P_READY)
                s_ignore(s_update_to(r, p, step, lr, scale, to == 2, pipelined));
        }
    }
}

// All gradients are in: sum each stage's over its replicas in peer order,
// clip by the global norm, and send every replica its stage's sum.
static void s_step_update(router_t *r)
{
    double sumsq = s_grad_reduce(r);
    double lr = node_lr_at(r->step, r->hp.iters, r->hp.warmup, r->hp.lr, r->hp.min_lr);
    float scale = node_clip_scale(sqrt(sumsq), (float) r->hp.grad_clip);
    r->pending = 0;
    int pipelined = s_update_pipelined(r);
    for (int p = 0; p < r->npeers; p++)
        r->peers[p].updated = 0;
    s_update_all(r, 0, r->step, lr, scale, pipelined);
    r->phase = PH_UPDATE;
    if (pipelined) {
        r->update_step = r->step;
        s_step_end(r); // the next step starts now, behind the UPDATEs
    }
}

// Stage 0 is the last to finish a step and has one replica, and every
// other stage's gradients are in: that replica is sent the others' sum of
// squares with its STEP and applies the update itself (STEP apply=1), and
// the next step starts at once, behind it. The other stages get their
// UPDATE when its norm comes back (s_on_applied), before any work of the
// next step reaches them: that work starts at this replica, and reaches
// stage 1 only in reply to a FWD queued behind the STEP. Any other stage
// finishing last (its work redone after a replica died) takes the
// ordinary STEP: the next step's first forwards would reach stage 0
// before its UPDATE. Over links of 50 ms this saves the round trip from
// stage 0 to the router and back at the end of every step (docs/swarm.md).
// 1 when stage s (all its work sent, every forward through) should finish
// the step so, -1 when it should wait for the others' sums still coming,
// 0 when it takes the ordinary STEP.
static int s_apply_here(const router_t *r, int s)
{
    if (s != 0 || s_ready_count(r, s) != 1 || !s_update_pipelined(r))
        return 0;
    for (int k = 0; k < r->plan.stages; k++)
        if (k != s && !r->stepped[k])
            return 0;
    // nothing is due between this step and the next: a checkpoint or an
    // evaluation needs every stage updated, a rebalance or a joiner's state
    // every replica settled
    long next = r->step + 1;
    if ((r->o.save && r->o.save_every > 0 && next % r->o.save_every == 0)
        || (r->o.eval_every > 0 && (next % r->o.eval_every == 0 || next == r->hp.iters))
        || (r->rebalance_every > 0 && s_secs(r) - r->last_rebalance >= r->rebalance_every))
        return 0;
    for (int p = 0; p < r->npeers; p++)
        if (r->peers[p].state == P_JOINING)
            return 0;
    return r->pending == 0 ? 1 : -1;
}

static void s_step_apply_ask(router_t *r, int s)
{
    int p = 0;
    while (r->peers[p].state != P_READY || r->peers[p].stage != s)
        p++; // s_apply_here: there is one
    double others = s_grad_reduce(r); // stage s's is not in: the others'
    double lr = node_lr_at(r->step, r->hp.iters, r->hp.warmup, r->hp.lr, r->hp.min_lr);
    char meta[256];
    snprintf(meta, sizeof meta, "norm_only=1\napply=1\nothers=%a\nclip=%a\nlr=%a\nwd=%a\nt=%ld\n",
             others, r->hp.grad_clip, lr, r->hp.weight_decay, r->step + 1);
    net_msg_t *m = s_step_msg(r, s, meta);
    if (!m || s_send(r, p, &m, R_STEP, MB_APPLY, s) != 0)
        return; // it is gone: the stage is empty, and the swarm rolls back
    if (!r->self_told) {
        printf("swarm router: step %ld: stage %d's only replica applies its own update at the end "
               "of each step it finishes last (one round trip less)\n", r->step, s);
        fflush(stdout);
        r->self_told = 1;
    }
    for (int q = 0; q < r->npeers; q++) {
        r->peers[q].self_to = q != p && r->peers[q].in_step && r->peers[q].state == P_READY
                        ? (r->peers[q].norm_only ? 2 : 1) : 0;
        r->peers[q].updated = 0;
    }
    // its backwards still in flight belong to no micro-batch of the next
    // step: their replies are only counted (its stage has no other replica
    // to redo them on; if it dies, the swarm rolls back)
    for (int i = 0; i < r->req_slots; i++) {
        req_t *q = s_req_at(r, i);
        if (q->id && (q->kind == R_FWD || q->kind == R_BWD))
            q->mb = -1;
    }
    r->stepped[s] = 1;
    r->peers[p].in_step = r->peers[p].norm_only = 1;
    r->self_peer = p;
    r->self_step = r->step;
    r->self_others = others;
    r->self_lr = lr;
    r->pending = 0;
    s_step_end(r); // the next step's work queues behind this STEP
}

// The reply to STEP apply=1: that replica has updated; the others get
// their UPDATE with the clip factor formed from the same two numbers.
static int s_on_applied(router_t *r, const req_t *q, const net_msg_t *m)
{
    char text[64];
    peer_t *pe = &r->peers[q->peer];
    s_ignore(net_msg_meta_get(m, "sumsq", text, sizeof text)); // checked
    double sumsq = strtod(text, NULL);
    s_ignore(net_msg_meta_get(m, "checksum", pe->checksum, sizeof pe->checksum));
    pe->updated = pe->state == P_READY;
    float scale = node_clip_scale(sqrt(r->self_others + sumsq), (float) r->hp.grad_clip);
    r->self_peer = -1;
    r->update_step = r->self_step;
    s_update_all(r, 1, r->self_step, r->self_lr, scale, 1);
    for (int p = 0; p < r->npeers; p++)
        r->peers[p].self_to = 0;
    if (r->update_pending == 0)
        s_consensus(r, r->update_step);
    return 0;
}

static int s_on_updated(router_t *r, const req_t *q, const net_msg_t *m)
{
    peer_t *pe = &r->peers[q->peer];
    if (net_msg_meta_get(m, "checksum", pe->checksum, sizeof pe->checksum) != 0
        || strlen(pe->checksum) != 64)
        return -EPROTO;
    pe->updated = pe->state == P_READY; // not one moved to another stage since
    if (q->mb != 1) {
        r->pending--;
    } else if (--r->update_pending == 0) {
        s_consensus(r, r->update_step);
    }
    return 0;
}

// Replicas of a stage must hold the same bits after the same update. The
// checksum most of them report is the stage's (on a tie, that of the
// replica that joined first); a replica that reports another is resynced
// from one that agrees (it fetches the stage's state again between steps)
// and expelled for the rest of the run if it diverges a second time.
static int s_voter(const peer_t *pe, int s)
{
    return pe->updated && pe->state == P_READY && pe->stage == s; // the dead do not vote
}

static void s_consensus(router_t *r, long step)
{
    for (int s = 0; s < r->plan.stages; s++) {
        int best = -1, best_votes = 0;
        for (int p = 0; p < r->npeers; p++) {
            if (!s_voter(&r->peers[p], s))
                continue;
            int votes = 0;
            for (int q = 0; q < r->npeers; q++)
                votes += s_voter(&r->peers[q], s)
                         && !strcmp(r->peers[q].checksum, r->peers[p].checksum);
            if (votes > best_votes) {
                best = p;
                best_votes = votes;
            }
        }
        for (int p = 0; p < r->npeers && best >= 0; p++) {
            peer_t *pe = &r->peers[p];
            if (!s_voter(pe, s) || !strcmp(pe->checksum, r->peers[best].checksum))
                continue;
            r->checksum_mismatches++;
            pe->updated = 0;
            if (++pe->divergences >= 2) {
                s_peer_expel(r, p, "diverged from its replicas a second time");
                continue;
            }
            r->resyncs++;
            char why[160];
            snprintf(why, sizeof why, "reports checksum %.16s after step %ld, %d of its replicas "
                     "%.16s: it fetches their state again", pe->checksum, step, best_votes,
                     r->peers[best].checksum);
            // the next step may have begun (pipelined updates): what it did
            // there is redone by the others, as for a peer that died
            s_peer_dead(r, p, why);
            pe->state = P_JOINING; // s_joins asks a replica that agrees
        }
    }
}

// ---- end of a step: logs, progress, checkpoints ----------------------------

static void s_progress(router_t *r, double lr)
{
    long steps = r->step - r->first;
    double tps = r->train_time > 0 ? steps * (double) r->hp.batch * r->hp.cfg.T / r->train_time : 0;
    double eta = tps > 0 ? (r->hp.iters - r->step) * (double) r->hp.batch * r->hp.cfg.T / tps : 0;
    int ready = s_ready_count(r, -1);
    if (isatty(STDERR_FILENO) && !getenv("SWARM_PLAIN")) {
        fprintf(stderr, "\r\033[Kstep %ld/%ld | loss %.4f | lr %.2e | %.0f tok/s | peers %d | ETA %.0f s",
                r->step, r->hp.iters, r->last_loss, lr, tps, ready, eta);
    } else if (r->step % r->o.log_every == 0 || r->step == r->hp.iters) {
        fprintf(stderr, "step %ld/%ld | loss %.4f | lr %.2e | %.0f tok/s | peers %d | ETA %.0f s\n",
                r->step, r->hp.iters, r->last_loss, lr, tps, ready, eta);
    }
}

// Between steps: STATE_GET to the slowest ready replica of each stage (the
// read takes about as long on any, and the slowest one's time is worth
// least to the stage). It queues behind the step's UPDATE at each node, so
// every answer holds the state after it, and the next step starts at once
// (the node serves the work queued behind it first and reads its state in
// a gap): a checkpoint stalls no step (the run's last waits for its own).
// The parts gather in ck_state; params/m/v, which a rollback restores, take
// them only once all are in (s_ckpt_part).
static void s_ckpt_begin(router_t *r)
{
    size_t np = node_config_params(&r->hp.cfg);
    if (!r->ck_state && !(r->ck_state = malloc(3 * np * sizeof(float))))
        abort();
    r->ckpt_pending = 0;
    r->ck_step = r->step;
    r->ck_lost = 0;
    for (int s = 0; s < r->plan.stages; s++) {
        int from = -1, sent = 0;
        for (int p = 0; p < r->npeers; p++)
            if (r->peers[p].state == P_READY && !r->peers[p].failed && r->peers[p].stage == s
                && (from < 0 || r->peers[p].tok_s < r->peers[from].tok_s))
                from = p;
        if (from >= 0) {
            net_msg_t *g = net_msg_new(NET_MSG_STATE_GET);
            net_msg_head(g)->stage = (uint32_t) s;
            sent = s_send(r, from, &g, R_STATE_GET, -1, s) == 0;
            r->ckpt_pending += sent;
        }
        r->ck_lost |= !sent;
    }
    if (r->done)
        r->phase = PH_CKPT; // the run ends with it
}

static void s_ckpt_write(router_t *r)
{
    char err[512];
    node_ckpt_meta_t meta = {
        .cfg = r->hp.cfg, .step = r->ckpt_step, .seed = r->hp.seed, .iters = r->hp.iters,
        .warmup = r->hp.warmup, .batch = r->hp.batch, .lr = r->hp.lr, .min_lr = r->hp.min_lr,
        .weight_decay = r->hp.weight_decay, .grad_clip = r->hp.grad_clip,
    };
    if (node_ckpt_save(r->o.save, &meta, r->params, r->m, r->v, err, sizeof err) != 0)
        fprintf(stderr, "swarm router: checkpoint not written: %s\n", err);
    else
        printf("swarm router: checkpoint of step %ld in %s\n", r->ckpt_step, r->o.save);
    fflush(stdout);
}

static void *s_ckpt_thread(void *arg)
{
    s_ckpt_write(arg);
    return NULL;
}

// The file of the last checkpoint is written (params/m/v may change).
static void s_ckpt_wait(router_t *r)
{
    if (r->ck_writing)
        pthread_join(r->ck_writer, NULL);
    r->ck_writing = 0;
}

// Write params/m/v to --save DIR on a thread of its own: an atomic write
// with its fsyncs takes 30-50 ms, a stall of every stage if the router
// waited. Signals stay with the main thread. Synchronously if no thread.
static void s_ckpt_save(router_t *r)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    r->ck_writing = pthread_create(&r->ck_writer, NULL, s_ckpt_thread, r) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!r->ck_writing)
        s_ckpt_write(r);
}

// One stage's part of the checkpoint came in (ok) or was lost with the
// replica holding it: the last one completes it, or skips it if a part
// was lost (params/m/v keep the previous checkpoint: never a mix of steps).
static void s_ckpt_part(router_t *r, int ok)
{
    r->ck_lost |= !ok;
    if (--r->ckpt_pending > 0)
        return;
    if (r->ck_lost) {
        fprintf(stderr, "swarm router: checkpoint of step %ld skipped: a replica it was read from "
                "is gone; the last one is of step %ld\n", r->ck_step, r->ckpt_step);
    } else {
        size_t np = node_config_params(&r->hp.cfg);
        s_ckpt_wait(r); // the one before is on disk
        memcpy(r->params, r->ck_state, np * sizeof(float));
        memcpy(r->m, r->ck_state + np, np * sizeof(float));
        memcpy(r->v, r->ck_state + 2 * np, np * sizeof(float));
        r->ckpt_step = r->ck_step; // params/m/v now hold this step, written or not
        s_ckpt_save(r);
    }
    if (r->phase == PH_CKPT)
        r->phase = PH_WAIT;
}

static void s_step_end(router_t *r)
{
    double loss = 0.0;
    for (int i = 0; i < r->G; i++)
        loss += r->mbs[i].loss;
    r->last_loss = (float) (loss / r->G);
    r->loss_avg = r->step == r->first ? r->last_loss : 0.9 * r->loss_avg + 0.1 * r->last_loss;
    double lr = node_lr_at(r->step, r->hp.iters, r->hp.warmup, r->hp.lr, r->hp.min_lr);
    s_consensus(r, r->step);
    node_curve_add(&r->logs, r->step, r->last_loss, lr);
    if (r->curve && r->step < r->hp.iters)
        r->curve[r->step] = r->last_loss;
    r->train_time += s_secs(r) - r->step_t0;
    s_trace(r, "step", 0, 0, 0, -1);
    r->step++;
    s_progress(r, lr);
    long stop = r->o.steps > 0 && r->first + r->o.steps < r->hp.iters ? r->first + r->o.steps
                                                                      : r->hp.iters;
    r->done = r->step >= stop;
    r->want_ckpt = r->o.save && (r->done || (r->o.save_every > 0 && r->step % r->o.save_every == 0));
    r->want_eval = r->o.eval_every > 0 && (r->step % r->o.eval_every == 0 || r->step == r->hp.iters);
    r->phase = PH_WAIT;
}

// ---- evaluation: the fixed batches of swarm train, forward only ------------

static void s_eval_batch(router_t *r)
{
    for (int i = 0; i < r->G; i++) {
        mb_t *b = &r->mbs[i];
        s_mb_clear(r, b);
        b->in[0] = malloc(r->tok_bytes);
        b->targets = malloc(r->tok_bytes);
        if (!b->in[0] || !b->targets)
            abort();
        swarm_data_draw(r->data, r->eval_split, &r->eval_state, r->hp.micro, r->hp.cfg.T,
                        b->in[0], b->targets);
        b->stage = 0;
        if (s_fwd(r, i, 0) != 0)
            b->stage = -2; // no peer now: s_eval_turn retries it
    }
}

static void s_eval_begin(router_t *r)
{
    r->want_eval = 0;
    r->evaluating = 1;
    r->eval_split = 0;
    r->eval_iter = 0;
    r->eval_sum = 0.0;
    r->eval_state = r->hp.seed + 1000;
    r->phase = PH_EVAL;
    s_eval_batch(r);
}

static void s_eval_turn(router_t *r)
{
    int S = r->plan.stages;
    s_retry(r);
    for (int i = 0; i < r->G; i++) {
        if (r->mbs[i].stage == -2 && s_fwd(r, i, 0) != 0)
            r->mbs[i].stage = -2;
        if (r->mbs[i].stage != S)
            return;
    }
    double batch = 0.0;
    for (int i = 0; i < r->G; i++)
        batch += r->mbs[i].loss;
    r->eval_sum += (float) (batch / r->G);
    if (++r->eval_iter < r->hp.eval_iters) {
        s_eval_batch(r);
        return;
    }
    r->eval_loss[r->eval_split] = r->eval_sum / r->hp.eval_iters;
    if (r->eval_split == 0) {
        r->eval_split = 1;
        r->eval_iter = 0;
        r->eval_sum = 0.0;
        r->eval_state = r->hp.seed + 2000;
        s_eval_batch(r);
        return;
    }
    long steps = r->step - r->first;
    double tps = r->train_time > 0 ? steps * (double) r->hp.batch * r->hp.cfg.T / r->train_time : 0;
    if (isatty(STDERR_FILENO) && !getenv("SWARM_PLAIN"))
        fprintf(stderr, "\r\033[K");
    printf("step %5ld | train %.4f | val %.4f | elapsed %.1f s | tok/s %.0f\n", r->step,
           r->eval_loss[0], r->eval_loss[1], s_secs(r) - r->t_start, tps);
    fflush(stdout);
    node_evals_add(&r->evals, r->step, r->eval_loss[0], r->eval_loss[1]);
    r->evaluating = 0;
    for (int i = 0; i < r->G; i++)
        s_mb_clear(r, &r->mbs[i]);
    r->phase = PH_WAIT;
}

// ---- messages --------------------------------------------------------------

// What stage s's ready replicas say they sustain together (their HEARTBEATs).
static double s_stage_capacity(const router_t *r, int s)
{
    double tok = 0.0;
    for (int p = 0; p < r->npeers; p++)
        if (r->peers[p].state == P_READY && r->peers[p].stage == s)
            tok += r->peers[p].claim_doubted ? r->peers[p].tok_s : r->peers[p].node_tok_s;
    return tok;
}

// The swarm's bound: the least, over stages, of what the stage's replicas
// sustain together; no schedule can beat it.
static double s_bound(const router_t *r)
{
    double low = -1.0;
    for (int s = 0; s < r->plan.stages; s++) {
        double t = s_stage_capacity(r, s);
        low = low < 0 || t < low ? t : low;
    }
    return low > 0 ? low : 0.0;
}

// ---- the status document (docs/swarm.md "Status") ---------------------------

// v rounded to `decimals` places as a JSON number (an integer for 0
// places), or null when it is not finite: JSON has no inf or nan.
static json_t *s_json_num(double v, int decimals)
{
    if (!isfinite(v))
        return json_null();
    double scale = pow(10.0, decimals), rounded = round(v * scale) / scale;
    if (!isfinite(rounded))
        rounded = v; // v * scale overflowed
    if (decimals == 0 && fabs(rounded) < 9e15)
        return json_integer((json_int_t) rounded);
    return json_real(rounded);
}

// Text as a JSON string: kept as it is when it is valid UTF-8 (jansson
// escapes quotes and control codes), else as printable ASCII.
static json_t *s_json_text(const char *text)
{
    json_t *s = json_string(text);
    if (s)
        return s;
    char safe[256];
    snprintf(safe, sizeof safe, "%s", text);
    s_sanitize(safe);
    return json_string(safe);
}

// Stage s's entry of "stages"; NULL out of memory.
static json_t *s_status_stage(const router_t *r, int s)
{
    double tok = 0;
    int queue = 0;
    for (int p = 0; p < r->npeers; p++) {
        if (r->peers[p].state == P_READY && r->peers[p].stage == s) {
            tok += r->peers[p].tok_s;
            queue += r->peers[p].queue;
        }
    }
    double flops = node_plan_stage_cost(&r->hp.cfg, &r->plan, s);
    return json_pack("{s:i, s:i, s:o, s:o, s:i, s:o}", "stage", s,
                     "replicas", s_ready_count(r, s), "tok_s", s_json_num(tok, 1),
                     "node_tok_s", s_json_num(s_stage_capacity(r, s), 1), "queue", queue,
                     "flops_per_token", s_json_num(flops, 0));
}

// A peer's entry of "peers"; NULL out of memory. An expelled peer's ban
// never ends: "banned_s" null and "expelled" true.
static json_t *s_status_peer(const peer_t *pe, int64_t now)
{
    int dead = pe->state == P_DEAD, expelled = dead && isinf(pe->banned_until);
    double ban = dead ? pe->banned_until - (double) now / 1000.0 : 0.0;
    const char *state = pe->state == P_READY ? "ready"
                      : pe->state == P_JOINING ? (pe->moving ? "moving" : "joining")
                      : ban > 0 ? "banned" : "dead";
    return json_pack("{s:i, s:o, s:s, s:o, s:i, s:o, s:o, s:i, s:o, s:s, s:i, s:o, s:b, s:o}",
                     "id", pe->id, "name", s_json_text(pe->name), "key", pe->who.key,
                     "device", s_json_text(pe->device), "stage", pe->stage,
                     "tok_s", s_json_num(pe->tok_s, 1), "node_tok_s", s_json_num(pe->node_tok_s, 1),
                     "inflight", pe->inflight,
                     "heartbeat_age_s", s_json_num((double) (now - pe->last_seen) / 1000.0, 1),
                     "state", state, "failures", pe->failures,
                     "banned_s", expelled ? json_null() : s_json_num(ban > 0 ? ban : 0.0, 0),
                     "expelled", expelled, "why", s_json_text(dead ? pe->why : ""));
}

// The whole document; NULL out of memory.
static json_t *s_status_doc(const router_t *r)
{
    long steps = r->step - r->first;
    double tps = r->train_time > 0 ? steps * (double) r->hp.batch * r->hp.cfg.T / r->train_time : 0;
    double eta = tps > 0 ? (r->hp.iters - r->step) * (double) r->hp.batch * r->hp.cfg.T / tps : 0;
    int known = r->step > r->first; // a loss before the first step is not known
    json_t *doc = json_pack("{s:I, s:I, s:o, s:o, s:o, s:o, s:o, s:s, s:[], s:[], s:i}",
                            "step", (json_int_t) r->step, "iters", (json_int_t) r->hp.iters,
                            "loss", s_json_num(known ? r->last_loss : NAN, 4),
                            "loss_avg", s_json_num(known ? r->loss_avg : NAN, 4),
                            "tok_s", s_json_num(tps, 1), "bound_tok_s", s_json_num(s_bound(r), 1),
                            "eta_s", s_json_num(r->started && !r->done && tps > 0 ? eta : NAN, 1),
                            "state", r->done ? "done" : r->started ? "training" : "waiting",
                            "stages", "peers", "peers_omitted", 0);
    json_t *stages = json_object_get(doc, "stages"), *peers = json_object_get(doc, "peers");
    int rc = doc ? 0 : -1;
    for (int s = 0; rc == 0 && s < r->plan.stages; s++)
        rc = json_array_append_new(stages, s_status_stage(r, s));
    int64_t now = r->now_ms;
    for (int p = 0; rc == 0 && p < r->npeers; p++)
        rc = json_array_append_new(peers, s_status_peer(&r->peers[p], now));
    if (rc != 0)
        json_decref(doc);
    return rc == 0 ? doc : NULL;
}

// doc as text of at most NET_META_MAX bytes (free it): when the peer table
// does not fit, peers are left off the end of "peers" and "peers_omitted"
// says how many. NULL when not even the table without peers fits, or out
// of memory.
static char *s_status_text(json_t *doc, size_t *len)
{
    json_t *peers = json_object_get(doc, "peers");
    size_t all = json_array_size(peers);
    for (;;) {
        char *text = json_dumps(doc, JSON_ENSURE_ASCII | JSON_REAL_PRECISION(15));
        size_t n = json_array_size(peers);
        *len = text ? strlen(text) : 0;
        if (!text || *len <= NET_META_MAX)
            return text;
        free(text);
        if (n == 0)
            return NULL;
        // leave off about the excess, at the average size of an entry (an
        // overestimate: the rest of the document counts in it), at least one
        size_t drop = (*len - NET_META_MAX) / (*len / n + 1) + 1;
        for (size_t k = 0; k < drop && k < n; k++)
            json_array_remove(peers, n - 1 - k);
        json_t *omitted = json_object_get(doc, "peers_omitted");
        json_integer_set(omitted, (json_int_t) (all - json_array_size(peers)));
    }
}

static void s_status_reply(router_t *r, const net_peer_t *who, const net_msg_t *req)
{
    json_t *doc = s_status_doc(r);
    size_t len = 0;
    char *text = doc ? s_status_text(doc, &len) : NULL;
    net_msg_t *m = net_msg_reply(req, text ? NET_MSG_STATUS : NET_MSG_ERROR);
    int rc = text ? net_msg_set_meta(m, text)
           : len > NET_META_MAX ? s_meta(m, "reason=the status (%zu bytes without its peers) "
                                         "exceeds a message's %u bytes", len, NET_META_MAX)
           : s_meta(m, "reason=out of memory building the status");
    if (rc != 0)
        net_msg_destroy(&m);
    else
        s_ignore(s_emit(r, who, &m));
    free(text);
    json_decref(doc);
}

// A STATE reply: for a checkpoint (q->mb < 0) or to forward to a joiner.
static int s_on_state(router_t *r, const req_t *q, const net_msg_t *m)
{
    int s = q->stage;
    size_t n = r->stage_n[s], off = r->stage_off[s];
    if (q->mb >= 0) {
        peer_t *joiner = &r->peers[q->mb];
        joiner->inflight--;
        if (joiner->state != P_JOINING)
            return 0;
        if (net_msg_head_const(m)->step != (uint64_t) r->step)
            return 0; // not the state this step starts from: asked again between steps
        net_msg_t *fwd = net_msg_dup(m); // its header step: the updates it holds
        if (!fwd)
            return -ENOMEM;
        net_msg_head(fwd)->flags = 0;
        return s_send(r, q->mb, &fwd, R_STATE, -1, s);
    }
    size_t np = node_config_params(&r->hp.cfg);
    for (int i = 0; i < 3; i++) {
        if (net_msg_tensor(m, i, r->ck_state + i * np + off, n) != 0) {
            s_ckpt_part(r, 0);
            return -EPROTO;
        }
    }
    s_ckpt_part(r, 1);
    return 0;
}

// Tensor i of m: n finite values whose RMS is within --tensor-bound times
// the running RMS of what stage s sent that way (dir 0 forward, 1 backward);
// the running RMS learns from accepted tensors. 0, or -EPROTO and why.
static int s_check_values(router_t *r, const net_msg_t *m, int i, size_t n, int s, int dir,
                          char *why, size_t wn)
{
    int rc = node_wire_get(m, i, r->scratch, n);
    if (rc != 0) {
        // the decoders refuse non-finite values (-EPROTO); -EINVAL: shape, type
        snprintf(why, wn, rc == -EPROTO ? "sent a non-finite value"
                                        : "sent a tensor of the wrong shape or type");
        return -EPROTO;
    }
    double sumsq = 0.0;
    for (size_t j = 0; j < n; j++) {
        if (!isfinite(r->scratch[j])) {
            snprintf(why, wn, "sent a non-finite value (element %zu)", j);
            return -EPROTO;
        }
        sumsq += (double) r->scratch[j] * r->scratch[j];
    }
    double rms = sqrt(sumsq / (double) (n ? n : 1));
    double *run = &r->rms[dir][s];
    if (r->rms_n[dir][s] >= 8 && r->tensor_bound > 0 && rms > r->tensor_bound * *run) {
        snprintf(why, wn, "sent a tensor of RMS %.3g, %.0fx the stage's running %.3g", rms,
                 rms / *run, *run);
        return -EPROTO;
    }
    *run = r->rms_n[dir][s]++ ? 0.95 * *run + 0.05 * rms : rms;
    return 0;
}

// The last stage's answer carries a finite, non-negative loss. 0 or -EPROTO.
static int s_check_loss(const net_msg_t *m, char *why, size_t wn)
{
    char text[64];
    float loss = net_msg_meta_get(m, "loss", text, sizeof text) == 0 ? strtof(text, NULL) : NAN;
    if (isfinite(loss) && loss >= 0)
        return 0;
    snprintf(why, wn, "sent no finite loss");
    return -EPROTO;
}

// Check a reply to request q before anything uses it: the right type, and
// every tensor of the shape the plan says, finite and of plausible size.
// 0, or -EPROTO and why.
// m's meta checksum= is 64 lowercase hex digits (a parameter checksum).
static int s_has_checksum(const net_msg_t *m)
{
    char text[80];
    return net_msg_meta_get(m, "checksum", text, sizeof text) == 0 && strlen(text) == 64
           && strspn(text, "0123456789abcdef") == 64;
}

static int s_check_reply(router_t *r, const req_t *q, const net_msg_t *m, char *why, size_t wn)
{
    const net_head_t *h = net_msg_head_const(m);
    int S = r->plan.stages, s = q->stage;
    size_t x_n = s_acts_count(r);
    char text[128];
    static const int want[] = { [R_FWD] = NET_MSG_RESULT, [R_BWD] = NET_MSG_RESULT,
                                [R_STEP] = NET_MSG_GRAD, [R_UPDATE] = NET_MSG_RESULT,
                                [R_STATE_GET] = NET_MSG_STATE, [R_STATE] = NET_MSG_RESULT,
                                [R_ASSIGN] = NET_MSG_RESULT, [R_VERIFY] = NET_MSG_RESULT,
                                [R_DISCARD] = NET_MSG_RESULT };
    if (h->type == NET_MSG_ERROR) {
        if (net_msg_meta_get(m, "reason", text, sizeof text) != 0)
            snprintf(text, sizeof text, "no reason given");
        s_sanitize(text);
        snprintf(why, wn, "refused a request (%s)", text);
        return -EPROTO;
    }
    if (h->type != want[q->kind]) {
        snprintf(why, wn, "answered with %s", net_msg_type_name(h->type));
        return -EPROTO;
    }
    switch (q->kind) {
    case R_FWD:
        if (s == S - 1) {
            if (s_check_loss(m, why, wn) != 0)
                return -EPROTO;
            if (q->redo || S == 1 || r->evaluating)
                return 0;
            return s_check_values(r, m, 0, x_n, s, 1, why, wn);
        }
        return q->redo ? 0 : s_check_values(r, m, 0, x_n, s, 0, why, wn);
    case R_BWD:
        return q->redo || s == 0 ? 0 : s_check_values(r, m, 0, x_n, s, 1, why, wn);
    case R_VERIFY:
        return s == S - 1 ? s_check_loss(m, why, wn) : s_check_values(r, m, 0, x_n, s, 0, why, wn);
    case R_STEP:
        if (q->mb == MB_APPLY && !s_has_checksum(m)) {
            snprintf(why, wn, "sent no parameter checksum after applying its update");
            return -EPROTO;
        }
        if (r->peers[q->peer].norm_only || q->mb == MB_APPLY) {
            double v = net_msg_meta_get(m, "sumsq", text, sizeof text) == 0 ? strtod(text, NULL)
                                                                            : NAN;
            if (isfinite(v) && v >= 0)
                return 0;
            snprintf(why, wn, "sent no finite gradient norm");
            return -EPROTO;
        }
        // the largest stage's size: a peer may move between stages
        if (!r->peers[q->peer].grad && !(r->peers[q->peer].grad = malloc(r->max_stage_n * sizeof(float))))
            abort();
        int rc = node_wire_get(m, 0, r->peers[q->peer].grad, r->stage_n[s]);
        if (rc != 0) {
            snprintf(why, wn, rc == -EPROTO ? "sent a non-finite gradient"
                                            : "sent a gradient of the wrong shape or type");
            return -EPROTO;
        }
        for (size_t j = 0; j < r->stage_n[s]; j++) {
            if (!isfinite(r->peers[q->peer].grad[j])) {
                snprintf(why, wn, "sent a non-finite gradient (element %zu)", j);
                return -EPROTO;
            }
        }
        return 0;
    case R_UPDATE:
    case R_STATE:
        if (!s_has_checksum(m)) {
            snprintf(why, wn, "sent no parameter checksum");
            return -EPROTO;
        }
        return 0;
    case R_STATE_GET:
        for (int i = 0; i < 3; i++) {
            if (h->ntensors != 3 || h->tensors[i].ndims != 1 || h->tensors[i].dtype != NET_DTYPE_F32
                || h->tensors[i].dims[0] != r->stage_n[s]) {
                snprintf(why, wn, "sent a stage state of the wrong shape");
                return -EPROTO;
            }
        }
        return 0;
    }
    return 0;
}

// A reply: checked first; a peer that answers wrongly fails (banned, and
// the request's work goes to another replica with the rest of its work).
static void s_on_reply(router_t *r, int p, const net_msg_t *m)
{
    const net_head_t *h = net_msg_head_const(m);
    req_t *q = s_req_find(r, h->id);
    if (!q || q->peer != p)
        return; // stale or not ours: dropped
    char why[160];
    if (s_check_reply(r, q, m, why, sizeof why) != 0) {
        s_peer_fail(r, p, "%s", why); // q is still its request: redone elsewhere
        return;
    }
    req_t copy = *q;
    s_req_done(r, q);
    int rc = 0;
    switch (copy.kind) {
    case R_FWD:
    case R_BWD:
        rc = s_on_result(r, &copy, m);
        break;
    case R_STEP:
        rc = copy.mb == MB_APPLY ? s_on_applied(r, &copy, m) : s_on_grad(r, &copy, m);
        break;
    case R_UPDATE:
        rc = s_on_updated(r, &copy, m);
        break;
    case R_STATE_GET:
        rc = s_on_state(r, &copy, m);
        break;
    case R_VERIFY:
        s_spot_result(r, &copy, m);
        break;
    case R_DISCARD:
        r->pending--;
        break;
    case R_STATE:
        if (h->step != (uint64_t) r->step || r->phase == PH_GRAD || r->phase == PH_UPDATE
            || (r->phase == PH_MB && r->peers[p].stage >= 0 && r->stepped[r->peers[p].stage])) {
            // loaded a state the swarm has moved past, or the step's update
            // has begun without it: it would be behind; fetch again between
            // steps
            break;
        }
        r->peers[p].state = P_READY;
        r->peers[p].moving = 0;
        s_ignore(net_msg_meta_get(m, "checksum", r->peers[p].checksum, sizeof r->peers[p].checksum));
        printf("swarm router: peer %d (%s) ready on stage %d, checksum %.16s\n", r->peers[p].id,
               r->peers[p].name, r->peers[p].stage, r->peers[p].checksum);
        fflush(stdout);
        break;
    }
    if (rc != 0)
        fprintf(stderr, "swarm router: peer %d (%s): %s reply not used: %s\n", r->peers[p].id,
                r->peers[p].name, net_msg_type_name(h->type), strerror(-rc));
}

// A node sends a HEARTBEAT a second and a HELLO every two while it waits:
// a peer that sends more than ROUTER_BURST unasked messages in a second
// floods the router, and fails.
#define ROUTER_BURST 100

static int s_flooding(router_t *r, int p, const net_head_t *h)
{
    peer_t *pe = &r->peers[p];
    int64_t now = r->now_ms;
    if (h->flags & NET_FLAG_REPLY)
        return 0;
    if (now - pe->burst_from >= 1000) {
        pe->burst_from = now;
        pe->burst = 0;
    }
    if (++pe->burst <= ROUTER_BURST)
        return 0;
    if (pe->state != P_DEAD)
        s_peer_fail(r, p, "flooded the router (more than %d messages in a second)", ROUTER_BURST);
    return 1; // over the limit: dropped unread
}

// The speed a node reports is used only for the bound in swarm status; one
// that claims ten times what the router measures is not believed there.
static void s_doubt_claim(router_t *r, int p)
{
    peer_t *pe = &r->peers[p];
    int doubt = pe->samples > 0 && pe->node_tok_s > 10.0 * pe->tok_s;
    if (doubt && !pe->claim_doubted)
        fprintf(stderr, "swarm router: peer %d (%s) says it sustains %.0f tok/s; the router "
                "measures %.0f and uses that\n", pe->id, pe->name, pe->node_tok_s, pe->tok_s);
    pe->claim_doubted = doubt;
}

// Another connection speaks with peer p's key: a second node with a copy
// of the key, or the peer's node restarted while the router still holds
// the old connection. Its HELLOs get an answer once it is clear which:
// when the old connection has been heard from since the rival's first
// HELLO, it is live and the rival is refused (both told, in a line each);
// when it has been silent RIVAL_MS since (a live node says HEARTBEAT every
// second), it is gone, and the rival takes the peer's place as a node that
// comes back. Nothing else the rival sends is the peer's: it is dropped.
#define RIVAL_MS 3000

static void s_on_rival(router_t *r, int p, const net_peer_t *who, const net_msg_t *m)
{
    peer_t *pe = &r->peers[p];
    int64_t now = r->now_ms;
    if (net_msg_head_const(m)->type != NET_MSG_HELLO)
        return;
    if (strcmp(pe->rival.conn, who->conn) != 0) {
        pe->rival = *who;
        pe->rival_since = now;
        pe->rival_told = 0;
        return;
    }
    if (pe->last_seen > pe->rival_since) {
        net_msg_t *e = net_msg_reply(m, NET_MSG_ERROR);
        s_meta(e, "reason=this node's key %.8s... is in use by peer %d (%s), which is connected; "
               "each node needs a key of its own: start this one without --key (swarm picks a "
               "free one) or with --key NAME of another pair (swarm keygen NAME)\nfatal=1",
               who->key, pe->id, pe->name);
        s_ignore(s_emit(r, who, &e));
        if (pe->rival_told)
            return;
        pe->rival_told = 1;
        fprintf(stderr, "swarm router: refused a second node with the key %.8s... of peer %d (%s), "
                "which is connected (a copy of its key?)\n", who->key, pe->id, pe->name);
        net_msg_t *t = net_msg_new(NET_MSG_ERROR);
        s_meta(t, "reason=another node with this node's key tried to join and was refused; this "
               "node goes on (a copy of this key elsewhere needs a key of its own)\nnotice=1");
        s_ignore(s_emit(r, &pe->who, &t));
        return;
    }
    if (now - pe->rival_since < RIVAL_MS)
        return;
    printf("swarm router: peer %d (%s): a new process with its key says HELLO and the old one "
           "has been silent %.1f s: it takes the peer's place\n", pe->id, pe->name,
           (now - pe->last_seen) / 1000.0);
    fflush(stdout);
    if (pe->state != P_DEAD)
        s_peer_dead(r, p, "was replaced by a new process with its key");
    pe->who = *who;
    memset(&pe->rival, 0, sizeof pe->rival);
    s_on_hello(r, who, m);
}

static void s_on_message(router_t *r, const net_peer_t *who, net_msg_t *m)
{
    const net_head_t *h = net_msg_head_const(m);
    int p = s_peer_find(r, who);
    char note[64];
    if (p >= 0 && h->type != NET_MSG_STATUS && strcmp(r->peers[p].who.conn, who->conn) != 0) {
        // a dead peer's key on a new connection speaks for it, unless the
        // old connection (a banned node, alive) is still heard from
        if (r->peers[p].state != P_DEAD || r->now_ms - r->peers[p].last_seen < RIVAL_MS) {
            s_on_rival(r, p, who, m);
            return;
        }
        r->peers[p].who = *who;
    }
    if (p >= 0)
        r->peers[p].last_seen = r->now_ms;
    if (p >= 0 && s_flooding(r, p, h))
        return;
    if (h->type == NET_MSG_HELLO) {
        s_on_hello(r, who, m);
    } else if (h->type == NET_MSG_STATUS) {
        s_status_reply(r, who, m);
    } else if (p < 0) {
        if (s_loud(r, who->key, note, sizeof note))
            fprintf(stderr, "swarm router: %s from %.8s..., which never said HELLO: dropped%s\n",
                    net_msg_type_name(h->type), who->key, note);
    } else if (h->type == NET_MSG_HEARTBEAT) {
        char q[32];
        if (net_msg_meta_get(m, "queue", q, sizeof q) == 0)
            r->peers[p].queue = atoi(q) >= 0 && atoi(q) < 1000000 ? atoi(q) : 0;
        if (net_msg_meta_get(m, "tok_s", q, sizeof q) == 0) {
            double t = strtod(q, NULL);
            r->peers[p].node_tok_s = isfinite(t) && t >= 0 && t < 1e12 ? t : 0.0;
            s_doubt_claim(r, p);
        }
        if (r->peers[p].state == P_DEAD)
            s_on_dead_peer(r, p, m);
        if (net_msg_meta_get(m, "slots", q, sizeof q) == 0)
            r->peers[p].slots = atoi(q) >= 0 && atoi(q) <= r->G ? atoi(q) : r->G;
    } else if (h->type == NET_MSG_BYE) {
        s_peer_dead(r, p, "left (BYE)");
    } else if (h->flags & NET_FLAG_REPLY) {
        s_on_reply(r, p, m);
    }
}

// ---- the loop --------------------------------------------------------------

// Exact steps: the gradients a dead peer accumulated this step are lost
// with it, so each micro-batch's work it did is run again on a survivor of
// its stage before the step closes. If it died while the gradients were
// being gathered, the gathering starts over once the re-runs are in (the
// survivors' sums then include them).
static void s_redo_lost(router_t *r, int p)
{
    if (r->evaluating || (r->phase != PH_MB && r->phase != PH_GRAD) || r->peers[p].got_grad)
        return;
    int redone = 0;
    for (int i = 0; i < r->G; i++) {
        for (int s = 0; s < r->plan.stages; s++) {
            if (r->mbs[i].grad_peer[s] != p)
                continue;
            r->mbs[i].grad_peer[s] = -1;
            r->mbs[i].redo_wanted[s] = 1; // sent by s_retry this turn
            r->redo_pending++;
            redone++;
        }
    }
    if (redone > 0 || r->peers[p].in_step) // the sums must include the re-runs
        s_step_unask(r);
    fprintf(stderr, "swarm router: step %ld: %d micro-batch parts it held are run again on "
            "other replicas\n", r->step, redone);
}

// Move ready peer p to stage `to` (cost[]: the stages' work per token, to
// carry its measured speed over); the router log says why. 0 or -errno.
static int s_move(router_t *r, int p, int to, const double *cost, const char *why)
{
    peer_t *pe = &r->peers[p];
    printf("swarm router: step %ld: moving peer %d (%s, %.0f tok/s) from stage %d %s\n", r->step,
           pe->id, pe->name, pe->tok_s, pe->stage, why);
    fflush(stdout);
    double from_cost = cost[pe->stage];
    int rc = s_send_assign(r, p, to, NULL);
    if (rc != 0) {
        fprintf(stderr, "swarm router: peer %d (%s): cannot be reached (%s): not moved\n", pe->id,
                pe->name, strerror(-rc));
        return rc;
    }
    pe->tok_s *= from_cost / cost[to];
    s_speed_restart(pe, r->now_ms); // its next speed sample is of the new stage
    pe->moving = 1;
    pe->moved_at = s_secs(r);
    return 0;
}

// Stage s has no ready replica and none joining: the peer that another
// stage can best spare (swarm_policy_refill: the move that leaves the
// highest bottleneck, never emptying a stage) is assigned to it, or -1
// when no stage has two. A peer that cannot be reached is passed over (the
// next turn finds it dead). Every stage reloads the checkpoint anyway, so
// the move costs nothing a new node would not.
static int s_refill(router_t *r, int s)
{
    for (int p = 0; p < r->npeers; p++)
        if (r->peers[p].state == P_JOINING && r->peers[p].stage == s)
            return -1; // a newcomer is already on its way
    swarm_peer_view_t *views = r->views; // s_move picks nothing
    double cost[NODE_MAX_LAYERS];
    for (int k = 0; k < r->plan.stages; k++)
        cost[k] = node_plan_stage_cost(&r->hp.cfg, &r->plan, k);
    for (int tries = 0; tries < r->npeers; tries++) {
        s_views_as(r, views, 0);
        int p = swarm_policy_refill(views, r->npeers, r->plan.stages, cost, s);
        if (p < 0)
            return -1;
        char why[128];
        snprintf(why, sizeof why, "(%d replicas) to stage %d, which lost every replica",
                 s_ready_count(r, r->peers[p].stage), s);
        if (s_move(r, p, s, cost, why) == 0)
            return p;
    }
    return -1;
}

// After a rollback, every stage with no replica takes a spare one (also a
// stage emptied while the swarm reloads); say: log those left waiting.
static void s_refill_all(router_t *r, int say)
{
    for (int k = 0; k < r->plan.stages; k++)
        if (s_ready_count(r, k) == 0 && s_refill(r, k) < 0 && say)
            fprintf(stderr, "swarm router: stage %d: no other stage has a replica to spare; "
                    "waiting for a node to serve it\n", k);
}

// Every replica of stage s is gone, and its state with them: the whole
// swarm goes back to the last checkpoint (held in params/m/v), every live
// node reloads its stage from it, stage s takes a spare replica of another
// stage or waits for a node, and the run replays. The curve after it
// equals an uninterrupted run's.
static void s_rollback(router_t *r, int s)
{
    fprintf(stderr, "swarm router: stage %d lost every replica at step %ld: rolling back to "
            "step %ld%s\n", s, r->step, r->ckpt_step,
            r->o.save ? "" : " (the start: run with --save DIR to keep checkpoints)");
    s_refill_all(r, 1); // every empty stage takes a spare replica of another, else waits
    for (int i = 0; i < r->req_slots; i++)
        if (s_req_at(r, i)->id)
            s_req_done(r, s_req_at(r, i)); // (s_req_done frees the slot: the loop goes on)
    for (int i = 0; i < r->G; i++)
        s_mb_clear(r, &r->mbs[i]);
    for (int p = 0; p < r->npeers; p++) {
        r->peers[p].inflight = r->peers[p].working = 0;
        if (r->peers[p].state == P_READY)
            r->peers[p].state = P_JOINING; // reloads the checkpoint (s_joins)
    }
    r->pending = r->redo_pending = r->ckpt_pending = r->update_pending = 0;
    r->self_peer = -1;
    for (int p = 0; p < r->npeers; p++)
        r->peers[p].self_to = 0;
    r->evaluating = r->want_eval = r->want_ckpt = 0;
    r->step = r->ckpt_step;
    r->started = 0; // joins get the router's copy again
    r->rollbacks++;
    r->phase = PH_WAIT;
}

// A dead peer: its FWD/BWD requests go to another replica, the gradients it
// held are rebuilt elsewhere, and it no longer counts for STEP/UPDATE.
static void s_peer_dead(router_t *r, int p, const char *why)
{
    if (r->peers[p].state == P_DEAD)
        return;
    fprintf(stderr, "swarm router: peer %d (%s) %s\n", r->peers[p].id, r->peers[p].name, why);
    snprintf(r->peers[p].why, sizeof r->peers[p].why, "%s", why);
    r->peers[p].moving = 0;
    int was_ready = r->peers[p].state == P_READY;
    r->peers[p].state = P_DEAD;
    for (int i = 0; i < r->req_slots; i++) {
        req_t q = *s_req_at(r, i);
        if (q.id == 0 || q.peer != p)
            continue;
        s_req_done(r, s_req_at(r, i));
        if (q.redo) {
            r->mbs[q.mb].redo_wanted[q.stage] = 1; // still counted in redo_pending
        } else if ((q.kind == R_FWD || q.kind == R_BWD) && q.mb >= 0)
            s_ignore(s_next(r, q.mb, q.kind, q.stage));
        else if (q.kind == R_UPDATE && q.mb == 1) {
            if (--r->update_pending == 0)
                s_consensus(r, r->update_step);
        } else if (q.kind == R_STEP && q.mb == MB_APPLY)
            r->self_peer = -1; // its stage had no other replica: the swarm rolls back
        else if (q.kind == R_STEP || q.kind == R_UPDATE || q.kind == R_DISCARD)
            r->pending--;
        else if (q.kind == R_VERIFY)
            s_spot_lost(r, &q);
        else if (q.kind == R_STATE_GET && q.mb < 0)
            s_ckpt_part(r, 0); // the checkpoint of this step is skipped
        else if (q.kind == R_STATE_GET)
            r->peers[q.mb].inflight--; // the joiner asks again between steps
    }
    if (was_ready)
        s_redo_lost(r, p);
    for (int s = 0; s < r->plan.stages; s++) {
        if (r->started && s_ready_count(r, s) == 0) {
            s_rollback(r, s);
            break;
        }
    }
}

// A peer that failed a request (missed its deadline, refused it, answered
// it wrongly) is dead and banned: 5 s the first time, twice as long each
// time after, up to 10 minutes. Its work is redone elsewhere.
static void s_peer_fail(router_t *r, int p, const char *fmt, ...)
{
    peer_t *pe = &r->peers[p];
    if (pe->state == P_DEAD)
        return;
    char why[96], line[192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    pe->ban_s = pe->ban_s > 0 ? fmin(2.0 * pe->ban_s, 600.0) : 5.0;
    snprintf(line, sizeof line, "%s: banned for %.0f s (failure %d)", why, pe->ban_s,
             pe->failures + 1);
    s_peer_ban(r, p, pe->ban_s, why, line);
}

// A request's deadline: 20 times what the peer's measured speed says it
// should take, and never under 5 s (a loaded machine is not a dead one).
static int64_t s_deadline_ms(const router_t *r, int p)
{
    double tokens = (double) r->hp.micro * r->hp.cfg.T;
    double expect = 1000.0 * tokens / (r->peers[p].tok_s > 1.0 ? r->peers[p].tok_s : 1.0);
    return 20.0 * expect > 5000.0 ? (int64_t) (20.0 * expect) : 5000;
}

// A joiner's state on its way (the STATE_GET to a replica, the STATE to
// the joiner) holds the next step (s_join_held): 30 s, and a second more
// for each MB of the stage's state (parameters and both moments), so that
// a joiner that does not answer or a link that cannot carry the state
// stalls the swarm that long at most. It is then failed (banned).
static int64_t s_state_deadline_ms(const router_t *r, int stage)
{
    double mb = stage >= 0 && stage < r->plan.stages ? 3.0 * 4.0 * r->stage_n[stage] / 1e6 : 0.0;
    return 30000 + (int64_t) (1000.0 * mb);
}

// A joiner's state is on its way: the next step waits for it, because the
// state is of the step about to start, and a joiner whose state arrived a
// step later would be an update behind (over slow links a stage's state
// takes longer than a step). Joins cost the swarm that transfer once.
static int s_join_held(const router_t *r)
{
    if (!r->started)
        return 0;
    for (int p = 0; p < r->npeers; p++)
        if (r->peers[p].state == P_JOINING && r->peers[p].inflight > 0)
            return 1;
    return 0;
}

// A peer whose process died (killed, crashed) dropped its connection: a
// send to it fails at once. Peers that hold work and have said nothing for
// PROBE_MS get an empty HEARTBEAT, so that such a death costs PROBE_MS, not
// the deadline of the work it held. Only a connection lost within
// PROBE_FRESH_MS of the peer's last word counts: later, it may be the
// transport's own heartbeat giving up on a stalled process (3 s), which the
// deadline judges as before; a machine that loses power or a link that goes
// quiet keeps the connection open: deadlines and silence find those.
#define PROBE_MS 200
#define PROBE_FRESH_MS 2000

static void s_probe(router_t *r, int64_t now)
{
    for (int p = 0; p < r->npeers; p++) {
        peer_t *pe = &r->peers[p];
        if (pe->state == P_DEAD || pe->failed || pe->inflight == 0 || now - pe->last_seen < PROBE_MS
            || now - pe->last_seen > PROBE_FRESH_MS || now - pe->probed < PROBE_MS)
            continue;
        pe->probed = now;
        net_msg_t *m = net_msg_new(NET_MSG_HEARTBEAT);
        if (m && s_emit(r, &pe->who, &m) == -EHOSTUNREACH) {
            fprintf(stderr, "swarm router: peer %d (%s): its connection is gone\n", pe->id, pe->name);
            pe->failed = 1;
        }
    }
}

static void s_reap(router_t *r)
{
    net_peer_t dead[16];
    size_t n = 0;
    int64_t now = r->now_ms;
    s_probe(r, now);
    for (int i = 0; i < r->req_slots; i++) {
        const req_t *q = s_req_at(r, i);
        int state = q->kind == R_STATE || q->kind == R_STATE_GET;
        if (!q->id || (q->kind == R_STATE_GET && q->mb < 0)) // checkpoints hold nothing up
            continue;
        if (state ? now - q->sent > s_state_deadline_ms(r, q->stage)
                  : now - q->sent > s_deadline_ms(r, q->peer))
            s_peer_fail(r, q->peer, "missed the deadline of a %s request",
                        q->kind == R_FWD || q->kind == R_VERIFY ? "FWD" : q->kind == R_BWD ? "BWD"
                        : q->kind == R_UPDATE ? "UPDATE" : q->kind == R_STEP ? "STEP"
                        : q->kind == R_STATE ? "STATE" : "STATE_GET");
    }
    for (int p = 0; p < r->npeers; p++)
        if (r->peers[p].failed && r->peers[p].state != P_DEAD)
            s_peer_dead(r, p, "is not connected: dead");
    net_server_reap(r->srv, r->now_ms, dead, 16, &n);
    for (size_t k = 0; k < n; k++) {
        int p = s_peer_find(r, &dead[k]);
        if (p >= 0)
            s_peer_dead(r, p, "is silent: dead");
    }
}

static int s_all_stages_ready(const router_t *r)
{
    for (int s = 0; s < r->plan.stages; s++)
        if (s_ready_count(r, s) == 0)
            return 0;
    // --min-nodes gates the start only: later the swarm trains on what it has
    return r->started || r->rollbacks > 0 || s_ready_count(r, -1) >= r->min_nodes;
}

// Rebalancing judges each peer by its speed over the whole span since the
// last check (work done over time busy, once it was busy a second), not by
// the routing average, which follows the last second or so: on a shared
// host that swings by a third from one second to the next, and a move
// chosen on such a swing can leave the stage it takes from the new, worse
// bottleneck.
static void s_views_checked(router_t *r, swarm_peer_view_t *views)
{
    int64_t now = r->now_ms;
    for (int q = 0; q < r->npeers; q++) {
        peer_t *pe = &r->peers[q];
        double busy = s_busy_s(pe, now) - pe->check_busy;
        if (views[q].ready && busy >= 1.0)
            views[q].tok_s = (pe->work - pe->check_work) / busy;
        pe->check_busy += busy;
        pe->check_work = pe->work;
    }
}

// Between steps, every --rebalance-every seconds: move one peer from the
// strongest stage to the weakest when the bottleneck gains 10% and the
// check before found the same move (measured speeds swing by a tenth from
// one check to the next); it gets the new stage's state from a live
// replica (s_joins) before the next step.
static void s_rebalance(router_t *r)
{
    double now = s_secs(r);
    if (r->rebalance_every <= 0 || now - r->last_rebalance < r->rebalance_every)
        return;
    r->last_rebalance = now;
    for (int q = 0; q < r->npeers; q++)
        if (r->peers[q].state == P_READY && r->peers[q].samples < 1)
            return; // judge speeds once every ready peer has been measured
    swarm_peer_view_t *views = r->views; // s_move picks nothing
    double cost[NODE_MAX_LAYERS];
    s_views_as(r, views, 0);
    s_views_checked(r, views);
    for (int s = 0; s < r->plan.stages; s++)
        cost[s] = node_plan_stage_cost(&r->hp.cfg, &r->plan, s);
    int to = -1, p = swarm_policy_rebalance(views, r->npeers, r->plan.stages, cost, now, 0.1,
                                            6.0 * r->rebalance_every, &to);
    int seen = p >= 0 && r->rebalance_id == r->peers[p].id && r->rebalance_to == to;
    r->rebalance_id = p >= 0 && !seen ? r->peers[p].id : 0;
    r->rebalance_to = to;
    if (!seen)
        return;
    peer_t *pe = &r->peers[p];
    double before[NODE_MAX_LAYERS] = {0};
    for (int q = 0; q < r->npeers; q++)
        if (views[q].ready)
            before[views[q].stage] += views[q].tok_s;
    char why[128];
    snprintf(why, sizeof why, "(%.0f tok/s in all) to stage %d (%.0f tok/s), the bottleneck",
             before[pe->stage], to, before[to]);
    pe->tok_s = views[p].tok_s; // its new stage's first guess scales this one
    s_move(r, p, to, cost, why);
}

static void s_turn(router_t *r)
{
    switch (r->phase) {
    case PH_WAIT:
        if (r->self_peer >= 0) {
            // a stage applies the last update itself (s_step_apply_ask):
            // the next step queues behind it; nothing else is due
            if (!r->done && s_all_stages_ready(r))
                s_step_begin(r);
            break;
        }
        if (r->want_eval && s_all_stages_ready(r)) {
            s_eval_begin(r);
            break;
        }
        if (r->want_ckpt) {
            if (r->ckpt_pending > 0)
                break; // the previous one is still coming in
            r->want_ckpt = 0;
            s_ckpt_begin(r);
            if (r->phase == PH_CKPT)
                break;
        }
        if (r->started)
            s_rebalance(r);
        else if (r->rollbacks > 0)
            s_refill_all(r, 0);
        s_joins(r);
        if (!r->done && s_all_stages_ready(r) && !s_join_held(r)) {
            if (!r->started) {
                printf("swarm router: every stage has a peer; training from step %ld\n", r->step);
                fflush(stdout);
            }
            r->started = 1;
            s_step_begin(r);
        }
        break;
    case PH_MB:
        s_step_micro(r);
        break;
    case PH_GRAD:
        if (r->pending <= 0 && s_spots_open(r) == 0) // a lie caught starts the step over
            s_step_update(r);
        break;
    case PH_UPDATE:
        if (r->pending <= 0)
            s_step_end(r);
        break;
    case PH_CKPT:
        if (r->ckpt_pending <= 0)
            r->phase = PH_WAIT;
        break;
    case PH_EVAL:
        s_eval_turn(r);
        break;
    case PH_DISCARD:
        if (r->pending <= 0)
            s_step_begin(r);
        break;
    }
}

// SIGHUP: re-read --allow FILE. A peer whose key left it is told so and
// dropped (net refuses its messages from now on); a file that cannot be
// read keeps the old list.
static void s_allow_reload(router_t *r)
{
    char err[512];
    s_hup = 0;
    if (!r->allow) {
        fprintf(stderr, "swarm router: SIGHUP: an open swarm has no allow-list to reload\n");
        return;
    }
    if (net_allow_reload(r->allow, r->allow_path, err, sizeof err) != 0) {
        fprintf(stderr, "swarm router: SIGHUP: %s; keeping the allow-list in use (%zu keys)\n",
                err, net_allow_size(r->allow));
        return;
    }
    printf("swarm router: allow-list %s reloaded: %zu keys\n", r->allow_path,
           net_allow_size(r->allow));
    fflush(stdout);
    for (int p = 0; p < r->npeers; p++) {
        if (r->peers[p].state == P_DEAD || net_allow_contains(r->allow, r->peers[p].who.key))
            continue;
        net_msg_t *bye = net_msg_new(NET_MSG_ERROR);
        s_meta(bye, "reason=this node's key was removed from the swarm's allow-list\nfatal=1");
        s_ignore(s_emit(r, &r->peers[p].who, &bye));
        s_peer_dead(r, p, "was removed from the allow-list: dropped");
    }
}

static int s_loop(router_t *r)
{
    char err[512];
    while (!s_stop && !(r->done && r->phase == PH_WAIT && !r->want_eval && !r->want_ckpt)) {
        net_peer_t who;
        net_msg_t *m = NULL;
        int rc = net_server_recv(r->srv, net_clock_ms() + 50, &who, &m, err, sizeof err);
        r->now_ms = net_clock_ms(); // what follows happens at this time
        if (rc == 0) {
            r->bytes_in += s_payload(m);
            s_wire_count(m, r->wire_in);
            s_on_message(r, &who, m);
            net_msg_destroy(&m);
        } else if (rc == -EPROTO) {
            char note[64];
            if (s_loud(r, who.key, note, sizeof note))
                fprintf(stderr, "swarm router: bad message from %.8s...: %s%s\n", who.key, err, note);
        } else if (rc != -ETIMEDOUT && rc != -EINTR && rc != -EAGAIN) {
            fprintf(stderr, "swarm router: receive failed: %s\n", strerror(-rc));
            return rc;
        }
        if (s_hup)
            s_allow_reload(r);
        s_reap(r);
        // advance through every phase that is ready now, not on the next message
        int before;
        do {
            before = r->phase;
            s_turn(r);
        } while (r->phase != before && !(r->done && r->phase == PH_WAIT && !r->want_eval
                                          && !r->want_ckpt));
    }
    return s_stop ? -EINTR : 0;
}

// ---- set-up ----------------------------------------------------------------

static void s_help(FILE *out)
{
    fprintf(out,
        "usage: swarm router --stages S [--listen tcp://*:7070] [--key NAME] [--allow FILE | --open]\n"
        "                    [--min-nodes N] [--window all|auto|W] [--wire F] [--grad-wire F]\n"
        "                    [training flags of swarm train]\n"
        "Run a swarm: nodes join with the line this prints, each serves one stage.\n"
        "  --listen EP     where nodes connect (default tcp://*:7070; port 0 picks a free one)\n"
        "  --key NAME      router key pair NAME.key/NAME.pub (default ~/.config/swarm/router,\n"
        "                  under $XDG_CONFIG_HOME/swarm when that is set; created if missing)\n"
        "  --allow FILE    private swarm: only these public keys (one per line) may join\n"
        "  --open          open swarm: any key may join (the default)\n"
        "  --min-nodes N   wait for N ready nodes before training (default: one per stage)\n"
        "  --window all|auto|W  micro-batches in flight (default all): all, every one\n"
        "                  of the step the nodes' activation caches hold; auto, as many\n"
        "                  as keep every stage busy across the measured round trips\n"
        "                  (Little's law), within the same bounds; W fixes it\n"
        "  --wire F        activations and their gradients between stages as fp32\n"
        "                  (exact), fp16 or int8 (blockwise) (default fp32)\n"
        "  --grad-wire F   replicas' gradient sums as fp32 or fp16 (default fp32)\n"
        "  --assign speed|even  stage for a joining node (default speed): speed, the one\n"
        "                  with the least throughput by the speed nodes report; even, the\n"
        "                  one with the fewest nodes (rebalancing then moves peers by the\n"
        "                  speed the router measures)\n"
        "  --rebalance-every SECONDS  every so often, move a peer from the strongest stage\n"
        "                  to the weakest when that lifts the bottleneck by more than 10%%\n"
        "                  two checks in a row (default 5; 0 = never)\n"
        "  --tensor-bound K  a peer whose activation or gradient has an RMS above K times\n"
        "                  its stage's running RMS is banned and its work redone\n"
        "                  (default 100; 0 = check finiteness only)\n"
        "  --verify F      run a fraction F of forwards again on a second replica and\n"
        "                  compare; a third decides a disagreement and the peer it\n"
        "                  contradicts is expelled (default 0.05; 0 = never)\n"
        "  --trace FILE    write a line per request sent and answered and per step to\n"
        "                  FILE, for scripts/trace-steps.sh (where a step's time goes)\n"
        "training flags (as swarm train, but without --micro-batch the router chooses it from\n"
        "--batch, --block and --stages, as its start-up line says):\n");
    node_train_help(out);
}

// --wire, --grad-wire, --window: 1 when `a` is one of them (set from v),
// 0 when it is not, -EINVAL for a bad value.
static int s_wire_flag(router_t *r, const char *a, const char *v, char *err, size_t n)
{
    long x;
    if (!strcmp(a, "--wire") || !strcmp(a, "--grad-wire"))
        return node_wire_parse(a + 2, v, !strcmp(a, "--wire") ? &r->wire : &r->grad_wire, err,
                               n) == 0 ? 1 : -EINVAL;
    if (strcmp(a, "--window") != 0)
        return 0;
    r->window_mode = !strcmp(v, "all") ? WIN_ALL : !strcmp(v, "auto") ? WIN_AUTO : WIN_FIXED;
    if (r->window_mode != WIN_FIXED)
        return 1;
    if (node_parse_long("window", v, 1, 1L << 20, &x, err, n) != 0) {
        snprintf(err, n, "--window %s: expected all, auto or a whole number of micro-batches >= 1",
                 v);
        return -EINVAL;
    }
    r->window = (int) x;
    return 1;
}

// Take the router's own flags out of argv; the rest are training flags.
static int s_router_flags(router_t *r, int *argc, char **argv, char *err, size_t n)
{
    int out = 1, rc;
    r->listen = "tcp://*:7070";
    r->rebalance_every = 5.0;
    r->tensor_bound = 100.0;
    r->verify = 0.05;
    r->wire = r->grad_wire = NET_DTYPE_F32;
    r->window_mode = WIN_ALL;
    for (int i = 1; i < *argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < *argc ? argv[i + 1] : NULL;
        int takes = !strcmp(a, "--listen") || !strcmp(a, "--key") || !strcmp(a, "--allow")
                 || !strcmp(a, "--min-nodes") || !strcmp(a, "--window")
                 || !strcmp(a, "--rebalance-every") || !strcmp(a, "--tensor-bound")
                 || !strcmp(a, "--verify") || !strcmp(a, "--assign")
                 || !strcmp(a, "--wire") || !strcmp(a, "--grad-wire") || !strcmp(a, "--trace");
        if (takes && !v) {
            snprintf(err, n, "%s needs a value; see 'swarm router --help'", a);
            return -EINVAL;
        }
        if (!strcmp(a, "--listen")) {
            r->listen = v;
        } else if (!strcmp(a, "--key")) {
            r->key_name = v;
        } else if (!strcmp(a, "--allow")) {
            r->allow_path = v;
        } else if (!strcmp(a, "--trace")) {
            r->trace_path = v;
        } else if ((rc = s_wire_flag(r, a, v, err, n)) != 0) {
            if (rc < 0)
                return rc;
        } else if (!strcmp(a, "--min-nodes")) {
            long x;
            if (node_parse_long(a + 2, v, 0, 1000000, &x, err, n) != 0)
                return -EINVAL;
            r->min_nodes = (int) x;
        } else if (!strcmp(a, "--rebalance-every") || !strcmp(a, "--tensor-bound")) {
            char *end;
            double x = strtod(v, &end);
            if (*v == '\0' || *end || !(x >= 0 && x <= 86400)) {
                snprintf(err, n, "%s %s: expected a number 0..86400 (0 = never)", a, v);
                return -EINVAL;
            }
            *(!strcmp(a, "--tensor-bound") ? &r->tensor_bound : &r->rebalance_every) = x;
        } else if (!strcmp(a, "--verify")) {
            char *end;
            r->verify = strtod(v, &end);
            if (*v == '\0' || *end || !(r->verify >= 0 && r->verify <= 1)) {
                snprintf(err, n, "--verify %s: expected a fraction 0..1 of forwards to check", v);
                return -EINVAL;
            }
        } else if (!strcmp(a, "--assign")) {
            if (strcmp(v, "speed") != 0 && strcmp(v, "even") != 0) {
                snprintf(err, n, "--assign %s: expected speed or even", v);
                return -EINVAL;
            }
            r->assign_even = !strcmp(v, "even");
        } else if (!strcmp(a, "--open")) {
            r->allow_path = NULL;
            continue;
        } else {
            argv[out++] = argv[i];
            continue;
        }
        i++;
    }
    *argc = out;
    return 0;
}

// The router's key pair: --key NAME, or one kept in the user's config folder.
static int s_load_key(router_t *r, char *err, size_t n)
{
    char path[PATH_MAX];
    if (r->key_name)
        return net_key_load(r->key_name, &r->key, err, n);
    const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
    snprintf(path, sizeof path, "%s%s/swarm", xdg ? xdg : home ? home : ".", xdg ? "" : "/.config");
    char parent[PATH_MAX];
    snprintf(parent, sizeof parent, "%s", path);
    *strrchr(parent, '/') = '\0';
    mkdir(parent, 0700);
    mkdir(path, 0700);
    strncat(path, "/router", sizeof path - strlen(path) - 1);
    if (net_key_load(path, &r->key, err, n) == 0)
        return 0;
    int rc = net_key_generate(&r->key);
    if (rc == 0)
        rc = net_key_save(r->key, path, 0, err, n);
    if (rc == 0)
        printf("swarm router: created a key pair in %s.key / %s.pub\n", path, path);
    return rc;
}

// Exact steps fill and drain the pipeline once a step: over S equal stages
// each waits about (S - 1) / (G + S - 1) of it for G micro-batches.
#define MICRO_IDLE 0.10      // the share of a step the router accepts for it
#define MICRO_MIN_TOKENS 64

static double s_fill_idle(int G, int S)
{
    return (double) (S - 1) / (G + S - 1);
}

// Without --micro-batch the router picks it: the largest divisor of the
// batch that keeps the fill and drain within MICRO_IDLE; but none of fewer
// than MICRO_MIN_TOKENS tokens (windows x T), under which each request's
// fixed costs (the router's hop, waking the node, decoding) eat what the
// pipeline gains (docs/performance.md). When no divisor does both, the
// smallest with enough tokens; one stage (no pipeline), the whole batch.
static int s_micro_choose(int batch, int T, int S)
{
    int best = batch;
    for (int m = batch; m >= 1 && (long) m * T >= MICRO_MIN_TOKENS; m--) {
        if (batch % m != 0)
            continue;
        best = m;
        if (s_fill_idle(batch / m, S) <= MICRO_IDLE)
            break;
    }
    return best;
}

static int s_setup(router_t *r, int argc, char **argv, char *err, size_t n)
{
    int rc = s_router_flags(r, &argc, argv, err, n);
    if (rc == 0)
        rc = node_train_parse(argc, argv, &r->o, err, n);
    if (rc != 0)
        return rc;
    if (r->trace_path) {
        if (!(r->trace = fopen(r->trace_path, "w"))) {
            snprintf(err, n, "--trace %s: %s", r->trace_path, strerror(errno));
            return -EINVAL;
        }
        setvbuf(r->trace, NULL, _IOLBF, 0); // whole lines, also if the router is killed
    }
    if (r->o.data) {
        rc = swarm_data_load(r->o.data, &r->data, err, n);
    } else {
        size_t len;
        const uint8_t *bytes = node_corpus(&len);
        r->data = swarm_data_wrap(bytes, len, "(built-in corpus)");
    }
    if (rc == 0)
        rc = node_train_weights(&r->o, &r->params, &r->m, &r->v, &r->step, err, n);
    if (rc != 0)
        return rc;
    r->first = r->step;
    r->ckpt_step = r->step;
    r->hp = node_train_hparams(&r->o);
    if (r->o.micro == 0 && r->hp.batch >= 1) // no --micro-batch given
        r->hp.micro = s_micro_choose(r->hp.batch, r->hp.cfg.T, r->o.stages);
    r->want_eval = r->o.eval_every > 0 && r->step == 0;
    if (r->hp.micro < 1 || r->hp.batch % r->hp.micro != 0) {
        snprintf(err, n, "--micro-batch %d must divide --batch %d", r->hp.micro, r->hp.batch);
        return -EINVAL;
    }
    rc = node_config_check(&r->hp.cfg, err, n);
    if (rc == 0)
        rc = node_plan_make(&r->hp.cfg, r->o.stages, &r->plan, err, n);
    if (rc == 0)
        rc = swarm_data_check(r->data, r->hp.cfg.T, err, n);
    return rc;
}

// Parameters per stage, and the state arrays every stage's slice lives in.
static int s_layout(router_t *r, char *err, size_t n)
{
    size_t total = node_config_params(&r->hp.cfg);
    for (int s = 0; s < r->plan.stages; s++)
        node_plan_stage_range(&r->hp.cfg, &r->plan, s, &r->stage_off[s], &r->stage_n[s]);
    for (int s = 0; s < r->plan.stages; s++)
        r->max_stage_n = r->stage_n[s] > r->max_stage_n ? r->stage_n[s] : r->max_stage_n;
    if (!r->m)
        r->m = calloc(total, sizeof(float));
    if (!r->v)
        r->v = calloc(total, sizeof(float));
    r->grad_sum = calloc(total, sizeof(float));
    r->G = r->hp.batch / r->hp.micro;
    r->mbs = calloc((size_t) r->G, sizeof(mb_t));
    r->curve = calloc((size_t) r->hp.iters + 1, sizeof(float));
    if (!r->m || !r->v || !r->grad_sum || !r->mbs || !r->curve) {
        snprintf(err, n, "out of memory for the model's state (%zu parameters)", total);
        return -ENOMEM;
    }
    for (int i = 0; i < r->G; i++)
        s_mb_clear(r, &r->mbs[i]);
    if (r->window <= 0 || r->window > r->G)
        r->window = r->G; // and with --window auto, until the peers are measured
    r->tok_bytes = (size_t) r->hp.micro * r->hp.cfg.T * sizeof(int32_t);
    if (!(r->scratch = malloc(s_acts_count(r) * sizeof(float)))) {
        snprintf(err, n, "out of memory for a (%d, %d, %d) activation", r->hp.micro, r->hp.cfg.T,
                 r->hp.cfg.C);
        return -ENOMEM;
    }
    return 0;
}

// The rest of the start-up line when the router chose the micro-batch
// (s_micro_choose): why, and what the pipeline's fill and drain cost.
static void s_micro_why(const router_t *r, double idle)
{
    int S = r->plan.stages;
    if (S == 1)
        printf(" (chosen: the whole batch, as swarm train: one stage has no pipeline to fill; "
               "--micro-batch sets it)\n");
    else if (idle <= MICRO_IDLE)
        printf(" (chosen: %d a step over %d stages keeps the pipeline's fill and drain to ~%.0f%% "
               "of a step; --micro-batch sets it)\n", r->G, S, 100.0 * idle);
    else
        printf(" (chosen: %d a step over %d stages, the most of %d tokens or more; the pipeline's "
               "fill and drain take ~%.0f%% of a step, a larger --batch shrinks that; "
               "--micro-batch sets it)\n", r->G, S, MICRO_MIN_TOKENS, 100.0 * idle);
}

static int s_listen(router_t *r, char *err, size_t n)
{
    int rc = s_load_key(r, err, n);
    if (rc != 0)
        return rc;
    if (r->allow_path) {
        r->allow = net_allow_new();
        rc = net_allow_load(r->allow, r->allow_path, err, n);
        if (rc != 0)
            return rc;
    }
    size_t state_bytes = 3 * node_config_params(&r->hp.cfg) * sizeof(float);
    net_server_config_t cfg = {
        .endpoint = r->listen, .key = r->key, .allow = r->allow,
        .limits = {
            .max_tensors = 3, .max_dims = 3, .max_dim = 1u << 30,
            .max_payload = state_bytes + 4096 < NET_PAYLOAD_MAX ? state_bytes + 4096 : NET_PAYLOAD_MAX,
            .max_meta = 4096,
        },
        .timing = { .dead_ms = 10000 },
    };
    rc = net_server_new(&cfg, &r->srv, err, n);
    if (rc != 0)
        return rc;
    const char *ep = net_server_endpoint(r->srv);
    printf("swarm router: listening on %s\n", ep);
    printf("swarm router: public key %s\n", net_key_public(r->key));
    printf("swarm router: %s swarm; %d stages of L=%d H=%d C=%d T=%d; batch %d in micro-batches of %d",
           r->allow ? "private" : "open", r->plan.stages, r->hp.cfg.L, r->hp.cfg.H, r->hp.cfg.C,
           r->hp.cfg.T, r->hp.batch, r->hp.micro);
    int S = r->plan.stages;
    double idle = s_fill_idle(r->G, S);
    if (r->o.micro == 0)
        s_micro_why(r, idle);
    else
        printf("\n");
    if (idle > MICRO_IDLE && r->o.micro != 0)
        printf("swarm router: %d micro-batch%s a step over %d stages: filling and draining the "
               "pipeline leaves each stage idle about %.0f%% of every step; a larger --batch "
               "(or a smaller --micro-batch) shrinks that share\n",
               r->G, r->G == 1 ? "" : "es", S, 100.0 * idle);
    if (r->o.resume)
        printf("swarm router: resumed from %s at step %ld\n", r->o.resume, r->step);
    node_join_print(stdout, ep, net_key_public(r->key));
    fflush(stdout);
    return 0;
}

// Bytes on the wire per step by what they carry and in which format, and
// the window.
static void s_wire_summary(const router_t *r, long steps)
{
    double k = steps > 0 ? 1e6 * steps : 1e6;
    const char *window = r->window_mode == WIN_ALL    ? "all"
                       : r->window_mode == WIN_AUTO ? "auto"
                                                    : "fixed";
    printf("wire | activations %s: %.3f MB/step in, %.3f out | gradient sums %s: %.3f in, "
           "%.3f out | state: %.3f in, %.3f out | window %s, mean %.1f of %d\n",
           node_wire_name(r->wire), r->wire_in[W_ACTS] / k, r->wire_out[W_ACTS] / k,
           node_wire_name(r->grad_wire), r->wire_in[W_GRADS] / k, r->wire_out[W_GRADS] / k,
           r->wire_in[W_STATE] / k, r->wire_out[W_STATE] / k, window,
           r->window_n > 0 ? r->window_sum / r->window_n : (double) r->window, r->G);
}

// The loss curve of this run and its evaluations as an SVG plot in DIR/loss.svg.
static void s_plot(router_t *r)
{
    if (r->o.save && r->curve && r->step > r->first)
        node_plot_save(r->o.save, "swarm router", r->curve, r->first, r->step, &r->evals, 0);
}

static void s_teardown(router_t *r)
{
    // tell the nodes the run is over
    for (int p = 0; r->srv && p < r->npeers; p++) {
        if (r->peers[p].state == P_DEAD)
            continue;
        net_msg_t *bye = net_msg_new(NET_MSG_BYE);
        s_meta(bye, "done=%d\nstep=%ld\nsteps=%ld", r->done, r->step, (long) r->hp.iters);
        s_ignore(s_emit(r, &r->peers[p].who, &bye));
    }
    for (int p = 0; p < r->npeers; p++)
        free(r->peers[p].grad);
    free(r->peers);
    for (int k = 0; k < (r->req_slots + REQ_BLOCK - 1) / REQ_BLOCK; k++)
        free(r->req_blocks[k]);
    free(r->req_blocks);
    free(r->req_free);
    free(r->views);
    free(r->backlog);
    free(r->ahead);
    for (int i = 0; r->mbs && i < r->G; i++)
        s_mb_clear(r, &r->mbs[i]);
    free(r->mbs);
    free(r->params);
    free(r->ck_state);
    free(r->m);
    free(r->v);
    free(r->grad_sum);
    free(r->scratch);
    free(r->curve);
    node_evals_free(&r->evals);
    node_curve_close(&r->logs);
    if (r->trace)
        fclose(r->trace);
    net_server_destroy(&r->srv);
    net_allow_destroy(&r->allow);
    net_key_destroy(&r->key);
    swarm_data_destroy(&r->data);
}

int cmd_router(int argc, char **argv)
{
    router_t *r = calloc(1, sizeof *r);
    char err[1024] = "";
    if (!r)
        abort();
    r->self_peer = -1;
    r->now_ms = net_clock_ms();
    int rc = s_setup(r, argc, argv, err, sizeof err);
    if (rc == 1) {
        s_help(stdout);
        free(r);
        return 0;
    }
    if (rc == 0)
        rc = s_layout(r, err, sizeof err);
    if (rc == 0)
        rc = node_curve_open(&r->o, &r->logs, err, sizeof err);
    if (rc == 0)
        rc = s_listen(r, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "swarm router: %s\n", err);
        s_teardown(r);
        free(r);
        return 1;
    }
    struct sigaction sa = { .sa_handler = s_on_signal };
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    r->now_ms = net_clock_ms();
    r->t_start = s_secs(r);
    rc = s_loop(r);
    s_ckpt_wait(r);
    r->now_ms = net_clock_ms();
    if (isatty(STDERR_FILENO))
        fprintf(stderr, "\n");
    long steps = r->step - r->first;
    double tps = r->train_time > 0 ? steps * (double) r->hp.batch * r->hp.cfg.T / r->train_time : 0;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu = ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + 1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
    printf("summary | iters %ld | wall %.2f s (train %.2f s) | tok/s %.0f | peers %d | "
           "checksum mismatches %d (resynced %d, expelled %d)\n", steps, s_secs(r) - r->t_start,
           r->train_time, tps, s_ready_count(r, -1), r->checksum_mismatches, r->resyncs, r->expelled);
    printf("checks | forwards verified %d, undecided %d | steps started over %d\n", r->spot_checks,
           r->spot_undecided, r->restarts);
    printf("router | cpu %.2f s | max rss %.1f MiB | wire %.2f MB/step in, %.2f MB/step out\n", cpu,
           ru.ru_maxrss / 1024.0, steps ? r->bytes_in / 1e6 / steps : 0.0,
           steps ? r->bytes_out / 1e6 / steps : 0.0);
    s_wire_summary(r, steps);
    s_plot(r);
    s_teardown(r);
    free(r);
    if (rc == -EINTR)
        fprintf(stderr, "swarm router: stopped\n");
    return rc == 0 ? 0 : 1; // a replica that diverged was resynced or expelled
}
