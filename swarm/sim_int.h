/* sim_int.h - what the simulator's files share (private to swarm/sim*.c):
 * its events, its peers and the run's state.
 */
#ifndef SWARM_SIM_INT_H
#define SWARM_SIM_INT_H

#include "engine_int.h"

#define SIM_TICK_MS 50       // the shell's loop: a tick at least this often
#define SIM_GONE_MS 200      // a killed peer's connection is found gone after this
#define SIM_HEARTBEAT_MS 1000
#define SIM_JOINHOLD_MS 3000  // a joinhold liar holds its state this long, then leaves
#define SIM_STATE_FLOATS 3   // a replica's state: the first 3 floats of its stage
#define SIM_RTO_MS 200       // a lost segment's retransmission (Linux's least RTO)
#define SIM_NOISE_MS 10000   // --speed-noise: a peer's speed factor is drawn this often

enum { EV_TO_ENGINE = 1, EV_TO_PEER, EV_PEER_FREE, EV_TICK, EV_HEARTBEAT, EV_KILL, EV_JOIN, EV_GONE,
       EV_STALL, EV_RESUME, EV_CHURN, EV_LEAVE, EV_BACK };

typedef struct {
    int64_t t;               // ms of virtual time
    uint64_t seq;            // order among events at the same time
    int type;                // EV_*
    int peer;                // index into peers, -1 none
    net_msg_t *m;            // EV_TO_*: the message; EV_PEER_FREE: the reply it sends
                             // then (NULL none)
} event_t;

typedef struct {
    net_msg_t **q;           // requests waiting, in arrival order
    int64_t *at;             // [cap] when each arrived, ms
    int n, cap;
} queue_t;

enum { LINK_DOWN, LINK_UP }; // router -> peer, peer -> router

// The hash the last exact update of a stage moved its replicas' states by.
typedef struct {
    int made;                // 0 none yet
    long t;                  // of step t
    double scale;            // at this clip factor
    uint64_t h;
} sim_applied_t;

typedef struct {
    net_peer_t who;          // its key and connection
    char name[32];           // crowdN
    int alive;               // not killed
    int killed;              // killed by the sim: its bans and deaths are expected
    int64_t killed_at;       // ms: when
    int left_empty;          // killed the last healthy replica of its stage (sim_leaves said so)
    int stalled;             // stalled by the sim (now or before): the same
    int64_t stall_until;     // ms: it serves nothing before this
    int lie;                 // SIM_LIE_*: a liar's bans are expected too
    long lie_from;           // the step it starts lying at
    int caught;              // the engine banned or expelled it (a liar)
    int64_t away_until;      // ms: a joinhold liar that left is started again then
    long first_lie;          // the step of its first lying gradient sum, -1 none yet
    int copy;                // --churn: the copy of the trace it belongs to, -1 none
    void *node;              // --numeric: its node (swarm_sim_nodes_t)
    int64_t latency_ms;      // its link's, one way
    double bandwidth_mbit;   // its link's, each way; 0 unlimited
    double wire_free[2];     // ms: each direction of its link is free to send from then
                             // (fractions kept: a message's time on the wire is not
                             // rounded up to a whole ms, only its arrival)
    int64_t last_in[2];      // ms: the last arrival each way (a stream keeps its order)
    int stage;               // from ASSIGN, -1 none
    int ready;               // a state is loaded
    long step;               // updates applied (as a node counts them)
    float state[SIM_STATE_FLOATS]; // what its stage's checksum is of
    int diverged;            // a drift liar whose state is not its replicas' (sim_peer.c)
    int drift_copy;          // its state came from a drift liar that no replica could contradict
    int outvoted;            // an honest replica a diverged drift liar outvoted one against one
    double speed;            // training tokens a second on a stage of mean cost
    double noise;            // --speed-noise: what it runs at now, a factor of speed (1 none)
    int64_t noise_until;     // ms: its factor is drawn again from then
    double work_owed_ms;     // the fraction of a ms its last work took beyond the whole
                             // ms it was given: the next work takes it (sim_serve)
    double beat_tok;         // the tok_s its last HEARTBEAT said, and as text (%.6g
    char beat_tok_text[24];  // was a twentieth of a 10,000-peer run under churn: kept)
    double memory;           // bytes it may hold for a stage (its HELLO's); 0 unknown
    int busy;                // computing a request
    int beat_due;            // its HEARTBEAT fell due while it computed: sent when done
    int beat_ms;             // its HEARTBEAT interval (the router's beat_ms), 0 until told
    queue_t queue;           // requests waiting
    float *grad;             // [max_stage_n] its gradient sum since the last update
    int *count;              // [G] times each micro-batch of the step went into grad
    int counted;             // their sum (the STEP's samples)
    int twice;               // additions to a micro-batch already counted
    int count_lo, count_hi;  // the micro-batches counted lie within these (lo > hi: none)
    int norm_only;           // its STEP said norm_only=1: it keeps grad for UPDATE
    double sumsq;            // the sum of squares its last STEP answered
    double walk;             // rmswalk: its last lie's factor (0 before the first)
    float *audit;            // [max_stage_n] another replica's share recomputed (audit=1)
    int audit_n;             // micro-batches in it
    long audit_step;         // the step it is of, -1 none
    int audit_open;          // it accumulates (the next audit starts afresh)
    long grad_sent;          // the step whose gradient sum it sent (not norm only), -1 none
} sim_peer_t;

typedef struct {
    int *p;
    int n, cap;
} sim_live_t;

typedef struct {
    swarm_engine_t *e;
    const swarm_engine_config_t *c;
    const swarm_sim_opts_t *o;
    swarm_engine_io_t model; // the caller's lr_at, clip_scale, log (after the sim reads it)
    int64_t now;             // ms
    uint64_t rng;            // splitmix64 state
    uint64_t seq;
    event_t *heap;           // events, a binary min-heap on (t, seq)
    int nheap, capheap;
    sim_peer_t *peers;
    int npeers, cappeers;
    // the live peers, for a kill's draw of the k-th in index order in
    // O(log peers) (a table of every peer that ever joined grows to
    // hundreds of thousands under churn): a Fenwick tree of the alive flags
    // over [0, cappeers), and each churn copy's live peers in index order
    int live;
    int *fenwick;
    sim_live_t *copy_live;   // [ncopies]
    double router_free[2];   // ms: each direction of the router's own link is free from then
    double router_bytes[2];  // bytes each way on the router's link (--direct: without activations)
    int G;                   // micro-batches a step
    float *step_sum[SWARM_MAX_STAGES]; // a whole step's gradient sum at each stage, once made
    sim_applied_t applied[SWARM_MAX_STAGES]; // each stage's last exact update's hash
    float *ones;             // (micro, T, C) ones: every activation a peer sends
    net_msg_t *ones_wire;    // the same as tensor 0, encoded in --wire once (its frame shared)
    float *lies[SIM_LIES];   // the same shape, as a liar sends it (NaN, scale), once made
    float *in;               // the same shape: an input decoded, to read (sim_peer.c)
    float *sum;              // [max_stage_n] an UPDATE's sum decoded (sim_peer.c)
    struct churn_copy *copies; // --churn: each copy's place in the trace
    int ncopies;
    double churn_f;          // machines of the trace to peers of a copy
    double mean_cost;        // mean of the stages' costs
    int emptied;             // faults that left a stage with no live ready honest replica
    int kills, stalls, joins, liars_caught;
    // 1 + a step a liar's gradient sum of the stage lied in, at that step's
    // parity: a slow replica applies one step's update while the next
    // step's sums come in (the router's overlap is one step)
    long lied[SWARM_MAX_STAGES][2];
    long applied_at[SWARM_MAX_STAGES]; // 1 + the last step such a lie was counted applied at
    int lies_applied;        // stage updates a lying sum reached (it was not audited)
    // 1 + a step a stage's only ready replica worked in with diverged
    // parameters, at that step's parity: nothing compares its checksum
    long drift_alone[2];
    long drift_at[SWARM_MAX_STAGES]; // 1 + the last step such work was counted applied at
    int drift_applied;       // stage updates such work reached
    int copies_lost;         // honest copies of such a liar's state expelled (one against one)
    long catch_steps;        // the most steps from a liar's first lying sum to its catch, -1 none
    int peers_held;          // the most peers the engine may hold at once so far (sim_memory)
    size_t memory, memory_bound; // the engine's bytes at its fullest, and its formula's then
    int rollbacks;           // the engine's, from its log
    char violation[512];     // the first invariant broken, "" none
    long requests;           // messages the engine sent
    int check;               // SWARM_SIM_CHECK set: the engine's own counts checked after each call
    double engine_s;         // CPU seconds inside the engine (the one measurement)
    int64_t train_from;      // ms: the first step began
    long train_from_step;
} sim_t;

void sim_push(sim_t *s, int64_t t, int type, int peer, net_msg_t *m);
// When m, sent at `sent` on peer p's link one way (LINK_*), arrives
int64_t sim_arrival(sim_t *s, int p, int way, const net_msg_t *m, int64_t sent);
double sim_uniform(sim_t *s);
double sim_noise(sim_t *s, sim_peer_t *pe); // --speed-noise: pe's speed factor now
void sim_violate(sim_t *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// The checksum a simulated peer reports for its state (the first
// SIM_STATE_FLOATS floats of what its STATE_GET sends)
void sim_state_checksum(const float *state, char hex[65]);
// The HEARTBEAT interval the router's ASSIGN or HEARTBEAT m tells pe, as a
// node takes it (one that is no interval is a violation: the engine's own)
void sim_beat_told(sim_t *s, sim_peer_t *pe, const net_msg_t *m);
// a simulated peer (sim_peer.c)
void sim_serve(sim_t *s, int p);
void sim_heartbeat(sim_t *s, int p);
int sim_peer_new(sim_t *s, int copy);
void sim_peer_free(sim_t *s, sim_peer_t *pe);
// a random live peer (of churn copy `copy`, -1 any), -1 none
int sim_pick_live(sim_t *s, int copy);
// live peers (of churn copy `copy`; -1 all)
int sim_live_count(const sim_t *s, int copy);
// the live peers' index (sim_churn.c): peer p came, went; the table grew
void sim_live_put(sim_t *s, int p);
void sim_live_drop(sim_t *s, int p);
void sim_live_grown(sim_t *s);
void sim_kill(sim_t *s, int p);
// A joinhold liar leaves with a BYE (EV_LEAVE), its process started again a
// second later with its key (EV_BACK): it says HELLO again.
void sim_leave(sim_t *s, int p);
void sim_back(sim_t *s, int p);
void sim_stall(sim_t *s, int p);
// the stage the engine holds peer p ready on, -1 none
int sim_ready_on(const sim_t *s, int p);
// whether stage st has an honest replica live, ready and answering, not p
int sim_healthy(const sim_t *s, int st, int p);
// p no longer counts as a replica: its stage emptied if nobody healthy is
// left (1: counted so)
int sim_leaves(sim_t *s, int p);
// pe is the only replica ready on its stage but copies of a drift liar's
// state (with `honest`, drift liars too): nothing to compare it with
int sim_alone(const sim_t *s, const sim_peer_t *pe, int honest);
// --churn (sim_churn.c)
void sim_churn_start(sim_t *s);
void sim_churn_event(sim_t *s, int copy);

#endif
