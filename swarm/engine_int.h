/* engine_int.h - what the files of the router engine share: its peer
 * table, request table, micro-batches and step state (swarm_engine_t),
 * and the functions one file calls in another. Private to swarm/engine*.c
 * (the engine's API is swarm.h's).
 */
#ifndef SWARM_ENGINE_INT_H
#define SWARM_ENGINE_INT_H

#include "engine_audit.h"
#include "net.h"
#include "swarm.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PEERS_KEEP_DEAD 64  // dead entries kept for their bans before the oldest is reused
#define REQ_BLOCK 1024       // requests a block of the table holds (blocks never move)
#define LINK_SECS 256        // seconds of the router's link counts kept (engine_link_wait_ms)
#define REQ_SLOT_BITS 24     // a request's id: a sequence number, then its slot

enum { P_JOINING = 1, P_READY, P_DEAD };
enum { GRAD_KEPT = 1, GRAD_NONE }; // a GRAD's values kept; none sent (a sum of none, or norm only)
enum { R_FWD = 1, R_BWD, R_STEP, R_UPDATE, R_STATE_GET, R_STATE, R_ASSIGN, R_VERIFY, R_DISCARD,
       R_AUDIT, R_AUDIT_SUM };
// A request a node computes a FWD or BWD for (its queue serves BWDs first).
static inline int engine_req_computes(int kind)
{
    return kind == R_FWD || kind == R_BWD || kind == R_VERIFY || kind == R_AUDIT;
}

// Where a micro-batch of S stages is (engine_mb_place): 0, 1 waiting
// (stage -2: an evaluation one no peer took yet; -1: not started), 2 + s
// in forward at stage s, 2 + S through, 3 + S + s in backward at stage s.
#define MB_PLACES (2 * SWARM_MAX_STAGES + 3)

// What a stage's tensors (their RMS) and gradient sums (their norm a
// micro-batch) are judged by: the median of the last BOUND_WINDOW values
// accepted and learned from (engine_bound_*, engine_audit.c).
#define BOUND_WINDOW 32
typedef struct {
    double v[BOUND_WINDOW];  // a ring of learned values
    long n;                  // learned, all told (< 4: no bound yet)
    double median;           // of the ring, remade at each value learned
} engine_bound_t;

typedef struct engine_history engine_history_t;

// A node sends a HEARTBEAT every beat_ms the router tells it (1 s until told)
// and a HELLO every two seconds while it waits: a peer that sends more than
// ROUTER_BURST unasked messages in a second floods the router, and fails.
#define ROUTER_BURST 100

// Lines of peers joining and dying (engine_member_line): a peer's at once
// and a second, everybody's at once and a second. A node killed and started
// again makes five in a second (gone, dead, its parts run again, back,
// joining); a crowd of keys that come and go makes ten a second.
#define MEMBER_LINES_PEER_BURST 10.0
#define MEMBER_LINES_PEER_RATE 1.0
#define MEMBER_LINES_BURST 40.0
#define MEMBER_LINES_RATE 10.0

// The HEARTBEAT interval: a second up to BEAT_RATE live peers, a second
// more for each BEAT_RATE beyond, at most BEAT_MAX_MS, so that the router
// reads about BEAT_RATE heartbeats a second from the whole swarm (at
// 10,000 peers a second each would be half the messages it handles). A
// peer is dead after the longer of SILENT_MS and BEAT_SILENT beats of
// silence (engine_fail.c, s_beat; swarm_engine_silence_ms).
#define BEAT_MS 1000
#define BEAT_RATE 2000
#define BEAT_MAX_MS 5000
#define BEAT_SILENT 3
#define SILENT_MS 10000

// STATUS answered at most STATUS_RATE a second in all (a burst of
// STATUS_BURST) and STATUS_KEY_RATE a second to one key (a burst of
// STATUS_KEY_BURST): its answer is the largest the router sends unasked
// for work, to anyone who can reach its port (engine_status.c).
#define STATUS_RATE 20.0
#define STATUS_BURST 40.0
#define STATUS_KEY_RATE 5.0
#define STATUS_KEY_BURST 10.0
#define STATUS_KEYS 64       // recent askers whose own budget is kept
typedef struct {
    char key[NET_KEY_Z85_LEN + 1];
    double tokens;           // its budget left, at `at`
    int64_t at;              // ms
} status_asker_t;
typedef struct {
    double tokens;           // the budget of all askers left, at `at`
    int64_t at;              // ms
    int primed;              // a STATUS came: tokens and at are set
    status_asker_t askers[STATUS_KEYS];
    int next;                // the entry a new asker takes (the oldest)
    uint64_t refused;        // STATUS refused for the budget
} status_budget_t;

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
    int ready_k;             // its place among its stage's ready peers (engine_ready_at), once
    double tok_s;            // tokens per second, EMA over its requests
    int inflight;            // requests outstanding
    int working;             // of them FWD/BWD (its busy time runs while > 0)
    int queue;               // queue depth from its last heartbeat
    int64_t last_seen;       // ms (net_clock_ms)
    int64_t probed;          // ms: when s_probe last sent it a HEARTBEAT
    int beat_ms;             // the HEARTBEAT interval it was told (ASSIGN, s_beat), 0 none
    char checksum[65];       // after the last update
    int updated;             // acked the current UPDATE
    int update_stage;        // the stage of the UPDATE it acked last (its checksum is of)
    int failed;              // a send to it failed: to be declared dead
    double moved_at;         // s (engine_secs) of its last rebalancing move, -1e30 never
    int moving;              // joining its new stage after a move
    int plan_to;             // 1 + the stage a plan's later wave sends it to (0: none)
    double plan_weight;      // its speed over the rebalancing checks, times its stage's cost
    int left_stage;          // the stage it last moved from, and its speed there (0: none)
    double left_tok_s;
    double banned_until;     // s: refused until then (a failure's back-off)
    double ban_s;            // length of its last ban: doubles with each failure
    int failures;            // requests it failed (deadline, refusal, bad result)
    int state_missed;        // STATE_GET deadlines it missed: drawn as a source after the rest
    int ban_told;            // it was told of its current ban
    int divergences;         // steps after which its checksum differed from its stage's
    int agreed;              // checksum votes it agreed with since it loaded its stage's state
    char sent_sum[65];       // joining: the checksum of the state it was sent, "" none
    int64_t burst_from;      // ms: start of the second its unasked messages are counted in
    int burst;               // unasked messages (not replies) in that second
    int claim_doubted;       // its HEARTBEAT speed is far above what the router measures
    int claim_low;           // unmeasured, its HEARTBEAT speed is below the deadlines' floor
    char why[96];            // why it was last declared dead or banned
    int64_t busy_from;       // ms: start of its busy period (requests in flight)
    double busy_s;           // seconds with requests in flight, in all
    double work;             // training tokens of work it finished (see s_work)
    double rate_busy, rate_work; // busy_s and work at its last speed sample
    double check_busy, check_work; // busy_s and work at the last rebalancing check
    int samples;             // speed samples taken (since it joined or moved)
    double node_tok_s;       // what the node says it sustains (HEARTBEAT)
    int64_t worked_at;       // ms: the last compute it did was done (engine_req_computes)
    int64_t drained_at;      // ms: compute the router forgot it holds should be through
    double hello_tok_s;      // what it measured at start (HELLO)
    double rtt;              // s: network round trip (a request's time less its time at
                             // the node), quick to fall, slow to rise; 0 unknown
    double busy[2];          // s: compute of one FWD [0] / BWD [1], EMA; 0 unknown
    int slots;               // micro-batches its activation cache holds; 0 unknown
    int held_thirds;         // training work of its requests in flight (req_t.thirds)
    int held_kind[2];        // its FWD [0] and BWD [1] requests in flight
    // its part in the current step (a fresh entry has none; the entry of a
    // dead peer whose part still counts is not reused before the step ends)
    float *grad;             // its GRAD's values (the largest stage's size); NULL: none came, or died
    float *audit_sums;       // a dispute's target: its verifiers' sums, for a later one to
                             // decide (AUDIT_VOTERS - 1 of the largest stage's; NULL none yet);
                             // the first, before, adds up a split round's parts
    int got_grad;            // its GRAD arrived: GRAD_KEPT, its values in grad; GRAD_NONE, none
    int in_step;             // it was sent this step's STEP
    int norm_only;           // its stage has no other replica: it keeps its gradient
    double sumsq;            // with norm_only: its gradient's sum of squares
    int self_to;             // UPDATE(self_step) once its norm is in: 1 with the sum, 2 norm only
    double memory;           // bytes it may hold for its stage (HELLO), 0 unknown: any
    double memory_used;      // bytes its stage holds, as it says (HEARTBEAT), 0 unknown
    double rss;              // its process's resident bytes (HEARTBEAT), 0 unknown
    double memory_heap;      // heap it added since before any stage (HEARTBEAT), 0 unknown
    double rss_grown;        // resident bytes added since before any stage (HEARTBEAT), 0 unknown
    double device_used;      // GPU memory it took (HEARTBEAT), 0 unknown or none
    int no_fit;              // it could hold no stage when it last asked (s_no_stage_fits)
    int back_waits;          // dead, spoke while its sum counted: heard once sums are in
    audit_t audit;           // the audit of its sum of this step
    int audits_passed;       // audits passed in a row since it joined (SWARM_AUDIT_PROVEN)
    int share;               // engine_share's count of it at stage share_stage, valid
    int share_stage;         // while share_gen is engine's grad_gen + 1
    uint64_t share_gen;
    int audit_of;            // the peer whose share it recomputes now, -1 none
    audit_part_t part;       // what of that share it recomputes
    int no_split;            // a split round it was in failed a sum that was then confirmed:
                             // it takes no part of a share until it recomputes one whole
                             // that two confirm, and is handed whole ones first
    int audit_rank;          // its place in the last hand-out's candidates (audit_cand)
} peer_t;

// The ready peers of one stage (state P_READY, failed or not), kept as
// their state and stage change (engine_peer_state), in ascending index: a
// routing pick sees only these, and the policy breaks ties by index, so it
// chooses exactly as it would over the whole table.
typedef struct {
    int *peer;               // [cap] indices into peers, ascending
    int n;                   // of them in use
    int cap;                 // allocated
} engine_ready_t;

// What a routing pick of one stage reads (engine_route_rows): a row, the
// peer's view, for each of its ready peers, view[k] of ready[s].peer[k],
// rewritten whenever something of the peer the view shows changes
// (engine_route_touch), so that a pick reads rows and builds nothing; the
// rows' order by speed and their sums follow. A row shows the peer's own
// tok_s; one not measured yet is shown as fast as the fastest measured one,
// unless its claim puts it far slower (engine_routed_tok_s): its row is
// rewritten when it changes, and all of them when the fastest or the
// stage's ratio does. Checked against views built afresh (engine_route_check).
typedef struct {
    swarm_peer_view_t *view; // [ready[s].cap]
    engine_ready_t unmeasured; // its ready peers with no speed sample yet
    double fastest;          // the fastest measured ready peer's tok_s (0 none), unless fastest_peer is -1
    double ratio;            // median of its measured ready peers' tok_s / HELLO claim (0 none)
    int fastest_peer;        // which; -1: to be found again, -2: none is measured
    double rows_fastest;     // the fastest the unmeasured rows were worked out with (-1: again)
    uint64_t gen;            // changes with every row and with the ready peers
    uint64_t held_gen;       // gen when a training forward was last held back
    int held_left;           // the forwards left then (-1 none): held again until either changes
    int *order;              // [ready[s].cap] the rows fastest first (swarm_rows_t.order)
    int order_ok, sums_ok;   // 0: sorted, summed afresh at the next pick (engine_route_rows)
    swarm_rows_t rows;       // what a pick reads: the sums kept as each row changes
} engine_route_t;

typedef struct {
    uint64_t id;             // request id, 0 = free slot
    int kind;                // R_*
    int peer;                // index into peers
    int mb;                  // micro-batch index within the step
    int stage;               // stage
    int64_t sent;            // ms
    int redo;                // re-run of work a dead peer had accumulated
    int thirds;              // training work in thirds of a micro-batch (s_req_thirds)
    int ahead_thirds;        // the work its peer held when it was sent (queued before it)
    int64_t out;             // ms: when its bytes are through the router's link, as the
                             // router reckons it (engine_send); its clock runs from then
    uint64_t link_at;        // the router's link_sent once it was sent
    uint64_t recv_at;        // the router's link_recv then
    uint64_t reply_bytes;    // what its reply carries, about (in the router's reply_due)
    uint64_t due_at, asked_at; // the router's reply_due and reply_asked once it was sent
    int64_t wire_ms;         // its bytes and its reply's over its peer's link, at the least
                             // rate deadlines allow a link (LINK_FLOOR; a state's deadline
                             // counts them itself: 0)
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
    int fwd_peer[SWARM_MAX_STAGES]; // who ran its forward at each stage
    int32_t *tokens, *targets; // stage 0's input and the last stage's targets (micro, T)
    net_msg_t *in[SWARM_MAX_STAGES + 1]; // the RESULT whose tensor 0 is stage s's input (s > 0),
                             // kept whole: a later request shares its frame (net_msg_add_shared)
    net_msg_t *dy[SWARM_MAX_STAGES]; // the same of the output gradient each stage's BWD got
    int grad_peer[SWARM_MAX_STAGES]; // who accumulated its gradient at each stage, -1 none
    int dx_peer[SWARM_MAX_STAGES]; // who returned the input gradient of each stage (dy[s - 1])
    int owes;                // fwd_peer[0 .. owes - 1] owe its backward (counted in owed[])
    int retry_kind;          // R_FWD/R_BWD that could not be sent yet, 0 none
    int retry_next;          // the next micro-batch in its stage's queue, -1 none
    unsigned char redo_wanted[SWARM_MAX_STAGES]; // stage work to re-run once a peer is free
    int redo_next[SWARM_MAX_STAGES]; // the next in the stage's redo queue, -1 none
    float loss;              // from the last stage
    spot_t *spot;            // per stage, from its first check on (NULL: none yet)
    int8_t in_pow2[SWARM_MAX_STAGES + 1];   // in[s]'s 2^k scale (meta pow2_I)
    int8_t dy_pow2[SWARM_MAX_STAGES];       // dy[s]'s
} mb_t;

// ---- a message from a peer, decoded once (engine_decode.c) ----
// Each meta field the engine reads, parsed and checked there; a handler
// reads these, never the meta text. What a field that fails its check
// costs the peer is its handler's: the decoder only says so.

// HELLO: who the node is. Text is sanitized (engine_sanitize).
typedef struct {
    int proto_ok;            // proto= is "1", the protocol this router speaks
    char proto[16];          // proto= as said; "" when absent or longer than 15 chars
    char name[64];           // name=; "?" when absent or longer than 63 chars
    char device[128];        // device=; "?" when absent or longer than 127 chars
    int has_tok_s;           // tok_s= is a number in (0, 1e12)
    double tok_s;            // tokens per second it measured at start; 0 without has_tok_s
    double memory;           // bytes it may hold for a stage; 0 when absent or bad (any)
} msg_hello_t;

// HEARTBEAT: a field absent leaves what the peer said before; one present
// but bad reads as the value noted.
typedef struct {
    int has_queue;           // queue= is there
    int queue;               // requests waiting, 0..999999; 0 when not a whole number in range
    int has_tok_s;           // tok_s= is there
    double tok_s;            // tokens per second it says it sustains, [0, 1e12); 0 when bad
    int has_slots;           // slots= is there
    int slots;               // micro-batches its activation cache holds, >= 0; -1 when bad
    double memory_used;      // bytes its stage holds, as it counts them; 0 unknown
    double rss;              // its process's resident bytes; 0 unknown
    double memory_heap;      // heap its allocations added since before any stage; 0 unknown
    double rss_grown;        // resident bytes it added since before any stage; 0 unknown
    double device_used;      // GPU memory it took since its start; 0 unknown or none
} msg_heartbeat_t;

// Any other message (RESULT, GRAD, STATE, ERROR, and whatever a peer sends
// as a reply): what a reply's check and its handler read. A field that
// fails its check is absent.
typedef struct {
    int has_loss;            // loss= is a finite number >= 0 (fp32)
    float loss;              // the last stage's loss; NAN without has_loss
    int has_checksum;        // checksum= is 64 lowercase hex digits
    char checksum[65];       // those digits; "" without has_checksum
    int has_sumsq;           // sumsq= is a finite number >= 0
    int has_samples;         // samples= is a whole number >= 0
    long samples;            // micro-batches in a gradient sum; 0 without has_samples
    double sumsq;            // its gradient's sum of squares; 0 without has_sumsq
    int has_timing;          // held= and busy= are both numbers in [0, 1e6)
    double held;             // s the request spent at the node; 0 without has_timing
    double busy;             // s of that it computed; 0 without has_timing
    char reason[128];        // reason= (sanitized); "no reason given" when absent or longer
} msg_reply_t;

typedef struct {
    const net_msg_t *msg;    // the message (borrowed): its tensors, and the request a reply answers
    const net_head_t *head;  // its header (borrowed): type, flags, id, step, tensor shapes
    union {                  // by head->type:
        msg_hello_t hello;   // NET_MSG_HELLO
        msg_heartbeat_t heartbeat; // NET_MSG_HEARTBEAT
        msg_reply_t reply;   // any other
    };
} msg_in_t;

// The run's numbers the engine reads (swarm_engine_config_t's, under the
// names the code has always used: hp as the hyperparameters, o as the run).
typedef struct {
    swarm_shape_t cfg;       // the model's shape, for ASSIGN and the tensors' dims
    int batch;               // windows a step
    int micro;               // windows a micro-batch
    long iters;              // steps of the schedule
    uint64_t seed;           // the data order
    int eval_iters;          // batches an evaluation averages per split
    double weight_decay;     // AdamW's, sent with each update
    double grad_clip;        // the global norm's bound, sent to a stage applying its own update
} engine_hparams_t;

typedef struct {
    int save;                // checkpoints are taken (the caller writes them)
    int save_every;          // every this many steps, 0 only at the end
    int eval_every;          // steps between evaluations, 0 never
    long steps;              // steps to run this time, 0 = to iters
} engine_run_t;

struct swarm_engine_s {
    swarm_engine_io_t io;    // what the engine does to the world: every send, line, file
    engine_run_t o;          // the run
    engine_hparams_t hp;     // its numbers
    int stages;              // S
    size_t stage_n[SWARM_MAX_STAGES]; // parameters per stage
    size_t stage_off[SWARM_MAX_STAGES]; // offset of each stage in the model
    char cut[SWARM_CUT_MAX];            // the cut's text for ASSIGN (config's cut), "" none
    double stage_cost[SWARM_MAX_STAGES]; // forward FLOPs a token through each stage
    double stage_need[SWARM_MAX_STAGES]; // bytes a node holds for each stage, 0 unknown
    size_t nparams;          // the model's parameters
    size_t max_stage_n;      // the largest of stage_n
    const swarm_data_t *data; // training bytes (the caller's)
    float *params, *m, *v;   // model-sized: initial state, then checkpoints
    float *grad_sum;         // model-sized: this step's summed gradients
    int min_nodes;           // ready nodes needed before training starts
    double rebalance_every;  // seconds between rebalancing checks, 0 = never
    double last_rebalance;   // s of the last check
    int64_t reaped_at;       // ms of engine_reap's last pass
    int spots_open;          // spot checks open (engine_spots_open)
    int failed_any;          // a peer was marked failed since engine_reap last looked
    int rebalance_seen;      // the last check found a plan worth making: the next one makes its own
    int rebalance_rest;      // the last plan made left moves waiting (peer_t plan_to)
    int rebalance_landing;   // a wave of it was sent, and waits to be ready (s_wave_landed)
    int window;              // micro-batches in flight
    swarm_loglimit_t loglimit; // lines about what peers send (a flood fills no disk)
    swarm_loglimit_t members; // lines of peers joining, leaving, dying (engine_member_line)
    uint64_t members_held;   // of them held back since the last one shown
    int beat_ms;             // the HEARTBEAT interval peers are told now (s_beat)
    int open_swarm;          // STATUS hides names from strangers (engine_status_reply)
    char operator_key[NET_KEY_Z85_LEN + 1]; // the router's own key: STATUS shows it all
    int64_t now_ms;          // the time of what the engine handles now (ms, the caller's
                             // clock): an argument of each call in, read by everything
    peer_t *peers;           // every node seen (dead ones while they are banned, and a few more)
    int npeers;              // used entries
    int peers_cap;           // allocated entries, of peers and of the scratch below
    int *key_index;          // [key_cap] the peers by key (engine_peer_find), open addressing
    int key_cap;             // its slots, a power of two, at most half used
    int key_used;            // of them holding a peer or a removed entry
    engine_ready_t ready[SWARM_MAX_STAGES]; // each stage's ready peers
    engine_route_t route[SWARM_MAX_STAGES]; // and their rows for routing
    engine_ready_t joining;  // the peers in P_JOINING, as their state changes
    swarm_peer_view_t *views; // [peers_cap] scratch of engine_views_as
    double *by_peer;         // [peers_cap] scratch, by peer index (a median of speeds)
    int next_peer_id;        // ids for logs, in join order (entries may be reused)
    req_t **req_blocks;      // the request table: blocks of REQ_BLOCK, slot k at
                             // req_blocks[k / REQ_BLOCK][k % REQ_BLOCK]; id 0 = free slot
    int req_slots;           // slots in use or freed (the table's high-water mark)
    int *req_free;           // freed slots, a stack
    int req_nfree;           // its size
    uint64_t next_id;        // request ids' sequence numbers
    uint64_t last_id;        // the id of the request made last
    int steps_open[SWARM_MAX_STAGES]; // R_STEP requests in the table, by stage
    mb_t *mbs;               // [G] micro-batches of the current step
    int G;                   // micro-batches per step
    // kept as the micro-batches move (engine_mb_at), so that what a request
    // asks of them costs O(stages), not O(G):
    int mb_count[MB_PLACES]; // how many are at each place (engine_mb_place)
    int mb_next;             // none below it is unstarted
    int *owed;               // [peers_cap] thirds of a micro-batch's work each peer
                             // owes: the backwards of the forwards it ran (mb_t.owes)
    int retry_n;             // micro-batches in a retry queue
    int retry_head[2][SWARM_MAX_STAGES]; // [FWD, BWD][stage]: first to send, -1 none
    int retry_tail[2][SWARM_MAX_STAGES];
    int redo_head[SWARM_MAX_STAGES]; // each stage's work to re-run, first in first out
    int redo_tail[SWARM_MAX_STAGES];
    long step;               // optimizer updates done
    long first;              // step the run started at
    int started;             // training has begun (state lives on the nodes now)
    size_t tok_bytes;        // wire bytes of one (micro, T) int32 tensor
    double loss_avg;         // EMA of the loss
    float last_loss;         // last step's loss
    double train_time;       // seconds in steps
    long timed_steps;        // the steps train_time holds (a step run again counts again)
    long audited_steps;      // of them, those whose update waited for an audit, and their
    double audited_time;     // seconds (what the audits cost: engine_step_end)
    double plain_step_s;     // a step the audits' draw did not pick: a running mean (s)
    int checksum_mismatches; // replicas that disagreed with their stage after a step
    int resyncs;             // of them, resynced from a replica that agrees
    int expelled;            // peers expelled for the run (diverged twice, caught lying)
    int phase;               // PH_*
    int pending;             // STEP or UPDATE replies still to come
    int update_pending;      // replies to an UPDATE the next step did not wait for
    long update_step;        // the step that UPDATE closed
    int self_peer;           // applying step self_step's update itself (s_step_apply_ask), -1 none
    long self_step;          // that step
    double self_others;      // the other stages' sum of squares it was sent
    double self_lr;          // that step's learning rate
    int self_told;           // the log has said once that a stage applies its own update
    int redo_pending;        // re-runs of a dead peer's work still to come
    int stepped[SWARM_MAX_STAGES]; // the stage's replicas were sent this step's STEP
    int ckpt_pending;        // STATE replies still to come for a checkpoint
    long ck_step;            // the step the checkpoint being fetched holds
    int ck_lost;             // a replica it was fetched from died: it is skipped
    float *ck_state;         // [3 * params]: that checkpoint's params, m, v as they come
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
    long ckpt_step;          // the step params/m/v hold (the last checkpoint)
    int rollbacks;           // times every replica of a stage was lost
    uint64_t bytes_in;       // tensor bytes received
    uint64_t bytes_out;      // tensor bytes sent (requests)
    double link_rate;        // bytes a ms the router's own link carries each way: what it
                             // was told (--router-bandwidth)
    double link_free;        // ms: its link is through what the router sent by then, as
                             // reckoned at link_rate and corrected by replies (engine_link_*)
    uint64_t link_sent;      // bytes the router has sent in all (tensors and a header each)
    uint64_t link_recv;      // bytes it has received in all (the same)
    uint64_t reply_due;      // bytes the replies to the requests in flight carry, about
    uint64_t reply_asked;    // bytes the replies to every request sent carry, about
    uint64_t link_hist[LINK_SECS][2]; // reply_asked, link_recv at the end of each second
    int64_t link_sec;        // (the second now: link_hist holds those before it)
    float *scratch;          // (micro, T, C): a reply's tensor, decoded for checks
    engine_bound_t rms[2][SWARM_MAX_STAGES]; // RMS of stages' outputs [0], input gradients [1]
    double tensor_bound;     // --tensor-bound: RMS above this times the median, or below
                             // the median over this, fails
    uint64_t secret;         // the key of the checks' draws (spot checks, audits): no peer's
    double audit_rate, audit_proven; // --audit, --audit-proven: fractions of sums recomputed
    unsigned char audit_drawn[SWARM_MAX_STAGES]; // the stage's audits of this attempt are drawn
    unsigned audit_gen[SWARM_MAX_STAGES];  // bumped when a stage's hand-out would change
    unsigned audit_seen[SWARM_MAX_STAGES]; // audit_gen at its last hand-out
    audit_cand_t *audit_cand; // [audit_cand_cap] scratch of a hand-out
    int audit_cand_cap;
    int audit_any, audit_hit; // some stage's are; the draw audits some sum (audit_steps)
    int audit_waits;         // some sum's audit was wanted: the update waits (audited_steps)
    int rejoin;              // the step starts over by way of PH_WAIT (engine_referee)
    int backs_waiting;       // dead peers' back_waits set (engine_backs)
    int64_t join_held_ms;    // how long joins have held the swarm (engine_join_held)
    int64_t join_hold_from;  // when the hold now on began (0: none)
    int64_t join_hold_t0;    // the clock the run's share of holds is of
    int join_hold_spent;     // the share is spent (said once)
    engine_ready_t audited[SWARM_MAX_STAGES]; // each stage's peers whose audit was wanted
                             // this attempt (by index; some may be gone since): what
                             // engine_audits_turn looks at, not every replica
    float *audit_sum;        // [max_stage_n] a verifier's sum, decoded (NULL before the first)
    float *audit_dx;         // (micro, T, C): the target's input gradient, decoded
    int audits;              // audits settled
    int audit_steps;         // attempts at a step whose draw audited them
    int audit_caught;        // of them, a liar expelled
    long unreadable;         // messages dropped unread: a type no node sends unasked (engine_on_message)
    int audit_undecided;     // disputes no third replica could decide (the step redone)
    int audit_lost;          // given up: the verifier died
    int audit_splits;        // split rounds begun (a share among several verifiers)
    int split_barred;        // peers ever barred from parts (no_split): 0, none to look for
    engine_bound_t norms[SWARM_MAX_STAGES]; // gradient norms a micro-batch of each stage
    int assign_even;         // --assign even: joiners fill stages evenly, speeds unheard
    double verify;           // --verify: fraction of FWDs re-run on a second replica
    int spot_checks;         // FWDs verified
    int spot_undecided;      // verifications two replicas disagreed on, with no third to decide
    int restarts;            // steps started over (a liar's outputs had been used)
    int wire;                // NET_DTYPE_* of activations and their gradients (--wire)
    int grad_wire;           // NET_DTYPE_* of replicas' gradient sums (--grad-wire)
    int window_mode;         // --window: WIN_FIXED, WIN_AUTO (Little's law) or WIN_ALL (the
                             // default: the step's micro-batches within the caches)
    int window_shown;        // the window last logged, 0 none
    double window_sum;       // sum of the windows steps began with, for the mean
    long window_n;           // steps begun
    uint64_t wire_in[3];     // tensor bytes received by class (W_*)
    uint64_t wire_out[3];    // tensor bytes sent by class (W_*)
    uint64_t grad_gen;       // changes of any micro-batch's grad_peer (engine_share)
    uint64_t share_gen[SWARM_MAX_STAGES]; // grad_gen + 1 of each stage's last count
    status_budget_t status_budget; // how many STATUS it answers (engine_status.c)
    double speed_floor;      // the least speed a deadline takes (engine_fail.c)
    int64_t speed_floor_at;  // ms: when it was last worked out
    int bans;                // peers banned (for a while or for the run)
    int checkpoints;         // checkpoints whole (the caller wrote them)
    engine_history_t *hist;  // what swarm status --serve draws (engine_history.c)
    int64_t replan_from;     // ms: since when a stage has had no node (engine_replan), 0 none
    int64_t replan_tried;    // ms: the last look for a new cut
    char replan_said[240];   // the last line saying no cut fits (said once)
};

enum { PH_WAIT = 0, PH_MB, PH_GRAD, PH_UPDATE, PH_CKPT, PH_EVAL, PH_DISCARD };
enum { WIN_FIXED = SWARM_WINDOW_FIXED, WIN_AUTO = SWARM_WINDOW_AUTO, WIN_ALL = SWARM_WINDOW_ALL };
#define MB_APPLY 2           // mb of an R_STEP that applies the update (STEP apply=1)
#define EVAL_MB 1000000      // evaluation micro-batch ids start here on the wire

enum { W_ACTS = 0, W_GRADS, W_STATE }; // activations and their gradients; gradient sums; state

// For a call whose failure is reported where it happens (or is harmless).
static inline void s_ignore(int rc) { (void) rc; }

// ---- across the router's files ----

// v rounded to `decimals` places as a JSON number (an integer for 0
// places), or null when it is not finite: JSON has no inf or nan.
json_t *engine_json_num(double v, int decimals);

// The history STATUS carries (engine_history.c).
engine_history_t *engine_history_new(void);
size_t engine_history_size(void);    // its bytes: fixed (engine_memory)
void engine_history_step(swarm_engine_t *r, double step_s);
void engine_history_eval(swarm_engine_t *r, double train, double val);
void engine_history_rollback(swarm_engine_t *r, long step);
void engine_history_event(const swarm_engine_t *r, int warn, const char *line);
// Its points and events newer than cursor `since` (all of them when the
// cursor predates a rewrite): the document's "history"; NULL out of memory.
json_t *engine_history_json(const swarm_engine_t *r, uint64_t since);

// Decode m (borrowed: it must outlive *out) into *out. Never fails: each
// field is decoded or marked absent (the rules: engine_decode.c).
void engine_msg_decode(const net_msg_t *m, msg_in_t *out);
// Text from a peer, made printable ASCII without quotes (for logs, JSON).
void engine_sanitize(char *text);

int engine_loud(swarm_engine_t *r, const char *key, char *note, size_t cap);
double engine_secs(const swarm_engine_t *r);
long engine_stop(const swarm_engine_t *r); // the step this run ends at (--steps, else iters)
double engine_tok_s(const swarm_engine_t *r); // training tokens a second over the steps so far
double engine_eta_s(const swarm_engine_t *r); // s to engine_stop at that rate (0: no rate yet)
int engine_emit(swarm_engine_t *r, const net_peer_t *to, net_msg_t **m);
void engine_say(const swarm_engine_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3))),
    engine_warn(const swarm_engine_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void engine_trace(const swarm_engine_t *r, const char *event, int kind, int mb, int stage, int peer);
req_t *engine_req_at(const swarm_engine_t *r, int k);
req_t *engine_req_find(swarm_engine_t *r, uint64_t id);
void engine_req_done(swarm_engine_t *r, req_t *q);
double engine_busy_s(const peer_t *pe, int64_t now);
void engine_speed_restart(peer_t *pe, int64_t now);
uint64_t engine_payload(const net_msg_t *m);
void engine_wire_count(const net_msg_t *m, uint64_t by[3]);
size_t engine_acts_count(const swarm_engine_t *r);
int engine_acts_add(const swarm_engine_t *r, net_msg_t *m, const net_msg_t *src, int pow2, char *meta,
                    size_t cap);
int engine_send(swarm_engine_t *r, int p, net_msg_t **m, int kind, int mb, int stage);
#define LINK_HEAD 64         // bytes of a message's header and meta, about
// A reply to q came: q's bytes, and everything the router sent before
// them, are through its link (engine_send reckons when they would be).
void engine_link_heard(swarm_engine_t *r, const req_t *q);
// Bytes a step's end may ask to come in at once: every ready replica's
// gradient sum and a stage's state (a link faster than link_rate, that
// carries more, holds deadlines off no longer than these take).
double engine_link_most(const swarm_engine_t *r);
// Ms q's reply may have waited in the router's link behind others: what came in
// since q was sent, up to `most` (engine_link_most), and what is still due, at
// link_rate; more on a link busy at that rate since `by` (q's reply in its queue).
int64_t engine_link_wait_ms(const swarm_engine_t *r, const req_t *q, double most, int64_t by);
void engine_link_second(swarm_engine_t *r); // link_hist up to now, before its counts change
int engine_meta(net_msg_t *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void engine_member_line(swarm_engine_t *r, int p, int to_stderr, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
// a is b within relative L2 tol (|a - b| <= tol |b|, b taken as at least
// 1e-15 in norm): two replicas' outputs, input gradients, gradient sums
int engine_close(const float *a, const float *b, size_t n, double tol);
// Two losses of the same micro-batch agree: within 1e-4 relative (of at least 1).
int engine_loss_close(float a, float b);
// "key=value" lines added after what m's meta has: 0 or -errno.
int engine_meta_add(net_msg_t *m, const char *line);
// A uniform draw in [0, 1) from the run's secret key, the step, the
// attempt at it and (what, a, b): DRAW_*.
enum { DRAW_SPOT = 1, DRAW_AUDIT, DRAW_SOURCE };
double engine_draw(const swarm_engine_t *r, int what, long a, long b);
int engine_peer_find(swarm_engine_t *r, const net_peer_t *who);
// Index peer p by its key (its entry holds it): 0 or -ENOMEM; or forget it.
int engine_key_put(swarm_engine_t *r, int p);
void engine_key_del(swarm_engine_t *r, int p);
int engine_cmp_double(const void *a, const void *b); // qsort, ascending
// v[n / 2] of v (n >= 1) sorted ascending, found in O(n) (a sort finishes
// what 64 rounds of selection did not): v is reordered
double engine_median(double *v, int n);
// Every change of a peer's state goes through here (its stage changes only
// in engine_send_assign, which makes it P_JOINING first): ready[] follows.
void engine_peer_state(swarm_engine_t *r, int p, int state);
int engine_ready_at(const swarm_engine_t *r, int stage, int p);
// Ready peer p is not measured yet and routed at its guess, far under its
// stage's fastest: it gets work only where it finishes in time, and may
// never be measured there.
int engine_route_held_back(swarm_engine_t *r, int p);
// Whether a peer is joining `stage` (loading its state): O(joiners).
int engine_joining_to(const swarm_engine_t *r, int stage);
// p into the sorted list l, unless it is there.
void engine_list_add(engine_ready_t *l, int p);
void engine_views_as(const swarm_engine_t *r, swarm_peer_view_t *v, int optimistic);
void engine_views(const swarm_engine_t *r, swarm_peer_view_t *v);
double engine_bound_speed(const peer_t *pe);
// Peer p's view changed: its row follows (engine_route_t); nothing for one not ready.
void engine_route_touch(swarm_engine_t *r, int p);
// Stage s's rows, n of them, as engine_views (optimistic) would show its
// ready peers; the policy's index k is ready[s].peer[k]. O(unmeasured). And
// by speed with their sums for the picks: O(replicas) when sorted afresh.
swarm_peer_view_t *engine_route_views(swarm_engine_t *r, int s, int *n);
const swarm_rows_t *engine_route_rows(swarm_engine_t *r, int s);
// The speed a routing pick takes peer pe at, `fastest` its stage's fastest
// measured tok_s (0 none): its own measure once it has one; before, as
// fast as `fastest`, or at its guess when that is far slower.
double engine_routed_tok_s(const swarm_engine_t *r, const peer_t *pe, double fastest);
// Peer pe is not measured yet and its guess is under 1/1000 of its stage's
// fastest measured replica (route[].fastest, as last worked out): a claim
// no routing pick believes, nor a deadline.
int engine_claim_unbelieved(const swarm_engine_t *r, const peer_t *pe);
// Each stage's worth of a HELLO's claim (engine_route_t's ratio), which
// engine_routed_tok_s reads, worked out again: the rows it changes read
// differently. O(ready peers), once a second.
void engine_route_ratios(swarm_engine_t *r);
// Every row against a view built afresh: 0, or -EPROTO (a change missed).
int engine_route_check(swarm_engine_t *r);
int engine_ready_count(const swarm_engine_t *r, int stage);
int engine_send_assign(swarm_engine_t *r, int p, int stage, const net_msg_t *req);
// Give peer p a stage (as the answer to req, or unasked): a newcomer, a
// dead one coming back once its ban is over, or one a new cut places
// (engine_replan.c). `stage` < 0: the policy's choice of those it holds
// (told it holds none when it holds none).
void engine_admit(swarm_engine_t *r, int p, int stage, const net_msg_t *req);
void engine_on_dead_peer(swarm_engine_t *r, int p, const msg_in_t *e);
void engine_backs(swarm_engine_t *r);
void engine_on_hello(swarm_engine_t *r, const net_peer_t *who, const msg_in_t *e);
void engine_joins(swarm_engine_t *r);
// The ready replica of stage s to read its state from (a checkpoint's
// part, a joiner's state): drawn with the run's secret key (draw, from
// engine_draw), a failed one passed over, and one that missed a
// STATE_GET's deadline before only when no other is left. -1 none.
int engine_state_source(const swarm_engine_t *r, int s, double draw);
void engine_window_update(swarm_engine_t *r);
void *engine_dup_bytes(const void *src, size_t n);
// Every micro-batch idle again, the queues empty (a new step, eval batch,
// restart, rollback).
void engine_mbs_clear(swarm_engine_t *r);
// Micro-batch i is now at `stage` (-2 .. S), in backward or not, with
// fwd_peer[stage] = fwd_peer when that is >= 0: every change of either goes
// through here, the counts and what each peer owes follow.
void engine_mb_at(swarm_engine_t *r, int i, int stage, int backward, int fwd_peer);
static inline int engine_mb_place(int S, int stage, int backward)
{
    return stage < 0 ? stage + 2 : stage >= S ? 2 + S : backward ? 3 + S + stage : 2 + stage;
}
// Micro-batches at places lo .. hi - 1 (engine_mb_place).
int engine_mb_count(const swarm_engine_t *r, int lo, int hi);
// Whether this step has used outputs of peer p: a stage input it made, or
// an input gradient it returned.
int engine_outputs_used(const swarm_engine_t *r, int p);
// 0 when the counts, what each peer owes and the queues are what the
// micro-batches say, counted again (O(G S): for tests), else -EPROTO.
int engine_mb_recount(const swarm_engine_t *r);
net_msg_t *engine_fwd_msg(swarm_engine_t *r, int i, int s);
net_msg_t *engine_bwd_msg(swarm_engine_t *r, int i, int s);
int engine_pick_but(swarm_engine_t *r, int s, int prefer, double work, const int *not, int nnot);
int engine_fwd(swarm_engine_t *r, int i, int s);
int engine_next(swarm_engine_t *r, int i, int kind, int s);
// Stage s's work of micro-batch i (its gradient, a dead peer's) to re-run:
// queued for engine_retry (the caller counts it in redo_pending).
void engine_redo_want(swarm_engine_t *r, int i, int s);
void engine_retry(swarm_engine_t *r);
int engine_mb_start(swarm_engine_t *r, int i);
int engine_spots_open(const swarm_engine_t *r);
void engine_spot_begin(swarm_engine_t *r, const req_t *q, float loss);
void engine_peer_expel(swarm_engine_t *r, int p, const char *why); // wrong results: for the run
net_msg_t *engine_step_msg(swarm_engine_t *r, int s, const char *meta);
void engine_spot_result(swarm_engine_t *r, const req_t *q, const msg_in_t *e);
void engine_spot_lost(swarm_engine_t *r, const req_t *q);
// Start the current step over: every replica drops what it accumulated.
void engine_step_restart(swarm_engine_t *r, const char *why);
// The bound has a median to judge by (4 values learned or more).
static inline int engine_bound_known(const engine_bound_t *b)
{
    return b->n >= 4;
}
// Learn x > 0: within `band` times the median, or any while none is known.
void engine_bound_learn(engine_bound_t *b, double x, double band);
int engine_grad_plausible(swarm_engine_t *r, int s, long samples, double sumsq, int alone,
                          char *why, size_t wn);
// Micro-batches of this step whose gradient peer p accumulated at stage s:
// one pass over the step's micro-batches a stage while none changes hands
// (engine_grad_peer_set), so that a STEP's check is not a pass each.
int engine_share(swarm_engine_t *r, int p, int s);
// Micro-batch i's gradient at stage s is peer p's (-1 nobody's).
void engine_grad_peer_set(swarm_engine_t *r, int i, int s, int p);
void engine_audit_force(swarm_engine_t *r, int p, int s, const char *why);
double engine_audit_rate_of(const swarm_engine_t *r, int p);
double engine_audit_rate_ahead(const swarm_engine_t *r, double horizon);
double engine_audit_plan(const swarm_engine_t *r, const swarm_peer_view_t *views, swarm_plan_t *plan);
void engine_audits_turn(swarm_engine_t *r);
void engine_audits_touch(swarm_engine_t *r, int s);
int engine_audits_open(swarm_engine_t *r);
void engine_audits_reset(swarm_engine_t *r);
int engine_audits_begun(const swarm_engine_t *r);
void engine_audit_result(swarm_engine_t *r, const req_t *q, const msg_in_t *e);
void engine_audit_sum(swarm_engine_t *r, const req_t *q, const msg_in_t *e);
void engine_audit_lost(swarm_engine_t *r, int p);
void engine_audit_target_gone(swarm_engine_t *r, int t);
// Between engine_audit.c (an audit's requests and verdicts) and
// engine_audit_out.c (the draw and the hand-out of shares to verifiers).
void engine_audit_mark(swarm_engine_t *r, int s, int p);
void engine_audit_ask(swarm_engine_t *r, int t, int v);
void engine_audit_split(swarm_engine_t *r, int t, const int *v, const int *mbs, int m);
void engine_audit_end(swarm_engine_t *r, int t);
void engine_audit_verdict(swarm_engine_t *r, int t, const int *liars, int n);
int engine_audit_candidates(const swarm_engine_t *r, int s, int t, const int *not, int nnot);
// Peer t is a ready replica of stage s.
static inline int engine_ready_in(const swarm_engine_t *r, int s, int t)
{
    return r->peers[t].state == P_READY && r->peers[t].stage == s;
}
int engine_referee(swarm_engine_t *r, int s);
int engine_on_result(swarm_engine_t *r, const req_t *q, const msg_in_t *e);
// The work of answered request q (FWD, BWD, audit) into its peer's measured speed.
void engine_work_done(swarm_engine_t *r, const req_t *q);
void engine_step_begin(swarm_engine_t *r);
void engine_step_unask(swarm_engine_t *r);
void engine_step_micro(swarm_engine_t *r);
int engine_on_grad(swarm_engine_t *r, const req_t *q, const msg_in_t *e);
void engine_step_update(swarm_engine_t *r);
int engine_on_applied(swarm_engine_t *r, const req_t *q, const msg_in_t *e);
int engine_on_updated(swarm_engine_t *r, const req_t *q, const msg_in_t *e);
void engine_consensus(swarm_engine_t *r, long step);
void engine_ckpt_wait(swarm_engine_t *r);
void engine_ckpt_part(swarm_engine_t *r, int ok);
void engine_step_end(swarm_engine_t *r);
double engine_stage_capacity(const swarm_engine_t *r, int s);
double engine_bound(const swarm_engine_t *r);
void engine_status_reply(swarm_engine_t *r, const net_peer_t *who, const net_msg_t *req);
void engine_on_message(swarm_engine_t *r, const net_peer_t *who, net_msg_t *m);
void engine_refill_all(swarm_engine_t *r, int say);
void engine_peer_dead(swarm_engine_t *r, int p, const char *why);
void engine_peer_fail(swarm_engine_t *r, int p, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int engine_join_held(swarm_engine_t *r);
// Peer p left (BYE) or lost its connection (why): dead, the log saying
// `line`; a joiner that held the swarm is banned.
void engine_peer_gone(swarm_engine_t *r, int p, const char *why, const char *line);
void engine_reap(swarm_engine_t *r);
// The requests in flight are about to be forgotten (a rollback, a restart),
// but the nodes still compute theirs: each peer's drained_at says until when.
void engine_work_forgotten(swarm_engine_t *r);
int engine_all_stages_ready(const swarm_engine_t *r);
void engine_rebalance(swarm_engine_t *r);
int engine_rebalance_due(const swarm_engine_t *r);
// --stages auto, while the swarm waits for its state: a stage no node has
// served for a while, and no node can, makes a new cut of the model for
// the nodes known (engine_replan.c).
void engine_replan(swarm_engine_t *r);
void engine_turn(swarm_engine_t *r);
// The bytes the engine holds now (engine_memory.c), and a bound of them
// from the model, the step and live_peers, the most peers held at once
// (docs/architecture.md, "The engine's memory").
size_t engine_memory(const swarm_engine_t *r);
size_t engine_memory_bound(const swarm_engine_t *r, int live_peers);

#endif
