/* sim.c - `swarm sim`: the router engine against a simulated swarm, in
 * virtual time, deterministic from a seed. Simulated peers answer the
 * engine's messages as nodes do (the same message types, metas, shapes,
 * step checks and queue order), with compute time from their speed and
 * links of a fixed latency; peers are killed and replaced as the options
 * say. Synthetic mode: activations are constants, and each micro-batch's
 * gradient at a stage is a known vector of small integers, so every sum
 * the engine forms is exact and checked: each UPDATE must carry the sum of
 * exactly its step's micro-batches. The invariants are checked as it runs;
 * the first violation stops the run and is reported.
 *
 * No model and no socket; time is virtual (a clock only measures the
 * engine's CPU per request, the one number of a run that is not
 * deterministic). What the engine logs reaches the caller's log callback
 * after the sim has read it. The peers are sim_peer.c.
 */
#include "sim_int.h"

#include <time.h>

// ---- events -----------------------------------------------------------------

static int s_before(const event_t *a, const event_t *b)
{
    return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

void sim_push(sim_t *s, int64_t t, int type, int peer, net_msg_t *m)
{
    if (s->nheap == s->capheap) {
        s->capheap = s->capheap ? 2 * s->capheap : 1024;
        s->heap = realloc(s->heap, (size_t) s->capheap * sizeof *s->heap);
        if (!s->heap)
            abort();
    }
    event_t ev = { t, s->seq++, type, peer, m };
    int i = s->nheap++;
    for (; i > 0 && s_before(&ev, &s->heap[(i - 1) / 2]); i = (i - 1) / 2)
        s->heap[i] = s->heap[(i - 1) / 2]; // parents move down into the hole
    s->heap[i] = ev;
}

// The earliest event. The hole at the top goes down the earlier child all
// the way to a leaf (one comparison a level, not two: most of a big sim's
// events are far from the first), then the last event rises into it from
// there. Ties cannot happen (seq), so the order is the order of any heap.
static event_t s_pop(sim_t *s)
{
    event_t top = s->heap[0], last = s->heap[--s->nheap];
    int i = 0, n = s->nheap;
    if (n == 0)
        return top;
    for (int l = 1; l < n; l = 2 * i + 1) {
        int c = l + 1 < n && s_before(&s->heap[l + 1], &s->heap[l]) ? l + 1 : l;
        s->heap[i] = s->heap[c];
        i = c;
    }
    while (i > 0 && s_before(&last, &s->heap[(i - 1) / 2])) {
        s->heap[i] = s->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    s->heap[i] = last;
    return top;
}

double sim_uniform(sim_t *s)
{
    return (double) (swarm_splitmix64(&s->rng) >> 11) * 0x1p-53;
}

// --speed-noise: the factor pe runs at now, drawn again every SIM_NOISE_MS
// (uniform in 1 +/- the noise: its mean speed is its speed). Drawn as its
// work and its HEARTBEATs need it; without the flag no draw is made, and a
// run is what it was.
double sim_noise(sim_t *s, sim_peer_t *pe)
{
    if (s->o->speed_noise <= 0.0)
        return 1.0;
    if (pe->noise <= 0.0 || s->now >= pe->noise_until) {
        pe->noise = 1.0 + s->o->speed_noise * (2.0 * sim_uniform(s) - 1.0);
        pe->noise_until = s->now + SIM_NOISE_MS;
    }
    return pe->noise;
}

void sim_violate(sim_t *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sim_violate(sim_t *s, const char *fmt, ...)
{
    if (s->violation[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->violation, sizeof s->violation, fmt, ap);
    va_end(ap);
}

// The checksum of a replica's synthetic state, as its node's would be of
// its parameters (64 hex digits).
void sim_state_checksum(const float *state, char hex[65])
{
    uint64_t h = 0x5157u;
    for (int k = 0; k < SIM_STATE_FLOATS; k++) {
        uint32_t bits;
        memcpy(&bits, &state[k], sizeof bits);
        uint64_t x = h ^ bits;
        h = swarm_splitmix64(&x);
    }
    for (int k = 0; k < 4; k++)
        snprintf(hex + 16 * k, 17, "%016llx", (unsigned long long) (h ^ (uint64_t) k));
}

// ---- links ------------------------------------------------------------------

// A link is one TCP stream each way: a message waits for the wire to be free
// of what went before it, takes its bytes' time on it (--bandwidth), then
// the latency and a draw of --jitter; one that loses a segment (--loss)
// waits a retransmission, and nothing behind it on the stream arrives
// before it does.
int64_t sim_arrival(sim_t *s, int p, int way, const net_msg_t *m, int64_t sent)
{
    sim_peer_t *pe = &s->peers[p];
    const swarm_sim_opts_t *o = s->o;
    double free_at = (double) sent > pe->wire_free[way] ? (double) sent : pe->wire_free[way];
    if (pe->bandwidth_mbit > 0) {
        size_t bytes = engine_payload(m) + 64; // the header and meta, about
        free_at += (double) bytes * 8.0 / (pe->bandwidth_mbit * 1e3);
    }
    pe->wire_free[way] = free_at;
    int64_t start = (int64_t) ceil(free_at);
    // the router's link, shared by all (with --direct, the tensors of a
    // FWD, a BWD and their RESULT go from node to node: only their headers
    // are the router's)
    int type = net_msg_head_const(m)->type;
    int acts = type == NET_MSG_FWD || type == NET_MSG_BWD || type == NET_MSG_RESULT;
    double bytes = o->direct && acts ? 64.0 : (double) engine_payload(m) + 64.0;
    s->router_bytes[way] += bytes;
    if (o->router_mbit > 0) {
        double from = (double) sent > s->router_free[way] ? (double) sent : s->router_free[way];
        s->router_free[way] = from + bytes * 8.0 / (o->router_mbit * 1e3);
        if ((double) start < s->router_free[way])
            start = (int64_t) ceil(s->router_free[way]);
    }
    int64_t t = start + pe->latency_ms;
    if (o->jitter_ms > 0)
        t += (int64_t) (sim_uniform(s) * (double) (o->jitter_ms + 1));
    if (o->loss > 0 && sim_uniform(s) < o->loss)
        t += SIM_RTO_MS;
    if (t < pe->last_in[way])
        t = pe->last_in[way];
    pe->last_in[way] = t;
    return t;
}

// ---- the engine's world -----------------------------------------------------

// The sim peer a connection is: its number follows the '/' (sim_peer_new).
static int s_peer_of(const sim_t *s, const net_peer_t *who)
{
    const char *slash = strchr(who->conn, '/');
    long p = slash ? strtol(slash + 1, NULL, 10) - 1 : -1;
    return p >= 0 && p < s->npeers && !strcmp(s->peers[p].who.conn, who->conn) ? (int) p : -1;
}

// The engine learns of dead peer p's death now (the transport found its
// connection gone, or a send to it failed): a plan may have moved its
// stage's other replicas away since it died (the engine held it ready),
// and the stage is empty from here (swarm sim seeds 1361 and 1491).
static void s_death_learned(sim_t *s, int p)
{
    if (!s->peers[p].left_empty)
        s->peers[p].left_empty = sim_leaves(s, p);
}

static int s_io_send(void *ctx, const net_peer_t *to, net_msg_t **m)
{
    sim_t *s = ctx;
    int p = s_peer_of(s, to);
    s->requests++;
    if (p < 0 || !s->peers[p].alive) {
        if (p >= 0) // (maybe before the transport finds it gone: seed 1491)
            s_death_learned(s, p);
        net_msg_destroy(m);
        return -EHOSTUNREACH; // its connection is gone
    }
    int64_t at = sim_arrival(s, p, LINK_DOWN, *m, s->now);
    size_t meta = 0;
    if (net_msg_head_const(*m)->type == NET_MSG_HEARTBEAT && !net_msg_meta(*m, &meta)) {
        net_msg_destroy(m); // the router's probe of the link: a node drops it unread
        return 0;
    }
    sim_push(s, at, EV_TO_PEER, p, *m);
    *m = NULL;
    return 0;
}

// A replica counts once the engine holds it ready there: one reloading
// its stage (its STATE behind a stall) is not one yet.
int sim_ready_on(const sim_t *s, int p)
{
    int e = engine_peer_find(s->e, &s->peers[p].who);
    return e >= 0 && s->e->peers[e].state == P_READY ? s->e->peers[e].stage : -1;
}

// Peer p leaves the replicas that count (killed, stopped, banned): a stage
// it leaves with none is one a rollback may follow (1: counted).
int sim_leaves(sim_t *s, int p)
{
    int st = sim_ready_on(s, p);
    if (st < 0 || sim_healthy(s, st, p))
        return 0;
    s->emptied++;
    return 1;
}

int sim_healthy(const sim_t *s, int st, int p)
{
    for (int q = 0; q < s->npeers; q++) {
        const sim_peer_t *o = &s->peers[q];
        if (q != p && o->alive && !o->lie && s->now >= o->stall_until && sim_ready_on(s, q) == st)
            return 1; // (one is enough: a stage's replicas are about every stages-th peer)
    }
    return 0;
}

// Whether pe is the only replica the engine holds ready on its stage
// (copies of a drift liar's state aside; with `honest`, drift liars too):
// its checksum has nothing to be compared with.
int sim_alone(const sim_t *s, const sim_peer_t *pe, int honest)
{
    for (int q = 0; q < s->npeers; q++) {
        const sim_peer_t *o = &s->peers[q];
        if (o != pe && o->alive && sim_ready_on(s, q) == pe->stage && !o->drift_copy
            && !(honest && o->diverged))
            return 0;
    }
    return 1;
}

// The sim peer a "swarm router: peer N (simK..." line is of, or -1: simK is
// peer K - 1 (sim_peer_new).
static int s_named(const sim_t *s, const char *line)
{
    const char *at = strstr(line, "swarm router: peer ");
    const char *open = at ? strchr(at, '(') : NULL;
    if (!open || strncmp(open + 1, "sim", 3) != 0)
        return -1;
    char *end;
    long p = strtol(open + 4, &end, 10) - 1;
    return (*end == ',' || *end == ')') && p >= 0 && p < s->npeers ? (int) p : -1;
}

// Whether line (a resync of honest pe) is a vote of one against one that
// a diverged drift liar won: "..., 1 of its replicas X" where X is the
// checksum of a live diverged peer's state. Of two replicas that disagree
// the vote keeps the one that agreed more before (docs/swarm.md, "Replica
// consensus"); where that is the liar, nothing the router holds tells the
// two apart (a copy of a lone liar's state, drift_copy, is the same case).
static int s_outvoted(const sim_t *s, const sim_peer_t *pe, const char *line)
{
    static const char key[] = ", 1 of its replicas ";
    const char *at = strstr(line, key);
    for (int q = 0; at && q < s->npeers; q++) {
        const sim_peer_t *o = &s->peers[q];
        char hex[65];
        if (o == pe || !o->alive || !o->diverged)
            continue;
        sim_state_checksum(o->state, hex);
        if (!strncmp(hex, at + sizeof key - 1, 16))
            return 1;
    }
    return 0;
}

// What the engine logs is read for what must never happen: an honest peer
// lost, banned, expelled or resynced; a rollback no fault caused.
static void s_io_log(void *ctx, int to_stderr, const char *line)
{
    sim_t *s = ctx;
    static const char *const losses[] = { ": dead\n", "banned for", "expelled for the run",
                                          "it fetches their state again", "refused" };
    int p = s_named(s, line);
    sim_peer_t *pe = p >= 0 ? &s->peers[p] : NULL;
    int faulty = pe && (pe->killed || pe->stalled || pe->lie);
    for (size_t k = 0; pe && k < sizeof losses / sizeof losses[0]; k++) {
        if (!strstr(line, losses[k]))
            continue;
        // A copy of a lone drift liar's state is contradicted by the
        // liar's next checksum, one against one: the vote keeps the older
        // replica's (docs/swarm.md, "Replica consensus"), so the copy
        // fetches it again, and is expelled when that happens twice
        // (or an honest replica outvoted one against one by such a liar)
        pe->outvoted |= k == 3 && !pe->lie && s_outvoted(s, pe, line);
        int copy = (pe->drift_copy || pe->outvoted)
                   && (k == 3 || (k == 2 && strstr(line, "diverged from")));
        if (!faulty && !copy)
            sim_violate(s, "an honest peer was lost: %.*s", (int) strcspn(line, "\n"), line);
        s->copies_lost += copy && k == 2;
        // a liar or a stalled peer leaves when the engine says so (the line
        // comes before the engine marks it); a kill's is counted when it dies.
        // A liar resynced leaves its stage's ready replicas too (fetching
        // the state again): the last of them leaves the stage empty
        if ((k < 3 || (k == 3 && (pe->lie || pe->drift_copy || pe->outvoted))) && !pe->killed)
            sim_leaves(s, p);
        if (k < 3 && pe->lie && !pe->caught++) {
            s->liars_caught++;
            long after = pe->first_lie >= 0 ? s->e->step - pe->first_lie : -1;
            s->catch_steps = after > s->catch_steps ? after : s->catch_steps;
        }
    }
    if (strstr(line, "lost every replica at step") && ++s->rollbacks > s->emptied)
        sim_violate(s, "a rollback no fault caused: %.*s", (int) strcspn(line, "\n"), line);
    if (strstr(line, "training from step") && s->train_from < 0) {
        s->train_from = s->now;
        s->train_from_step = s->c->step;
    }
    if (s->model.log)
        s->model.log(s->model.ctx, to_stderr, line);
}

// A state's checksum: as the real nodes compute it (--numeric), or as the
// simulated ones do.
static void s_io_checksum(void *ctx, const float *params, size_t n, char hex[65])
{
    sim_t *s = ctx;
    s->model.checksum(s->model.ctx, params, n, hex);
}

static void s_io_sim_checksum(void *ctx, const float *params, size_t n, char hex[65])
{
    (void) ctx;
    (void) n; // (a stage holds SIM_STATE_FLOATS at least)
    sim_state_checksum(params, hex);
}

// A step ended: none of its audits may still be open (its update waited
// for them all, whichever way it was applied).
static void s_io_stepped(void *ctx, const swarm_engine_step_t *step)
{
    sim_t *s = ctx;
    for (int p = 0; p < s->e->npeers; p++) {
        const audit_t *a = &s->e->peers[p].audit;
        if (s->e->peers[p].state == P_READY && a->want && !a->done)
            sim_violate(s, "step %ld ended with the audit of %s's gradient sum open", step->step,
                        s->e->peers[p].name);
    }
    if (s->model.stepped)
        s->model.stepped(s->model.ctx, step);
}

static void s_io_trace(void *ctx, const char *line)
{
    sim_t *s = ctx;
    s->model.trace(s->model.ctx, line);
}

static double s_io_lr(void *ctx, long step)
{
    sim_t *s = ctx;
    return s->model.lr_at(s->model.ctx, step);
}

static float s_io_clip(void *ctx, double norm)
{
    sim_t *s = ctx;
    return s->model.clip_scale(s->model.ctx, norm);
}

// Seconds on a monotonic clock: the engine's time in a call (the sim is one
// thread, so its wall time is its CPU time; clock() is a system call, this
// is not, and at ten thousand peers it ran to a tenth of the run).
static double s_cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double) t.tv_sec + 1e-9 * (double) t.tv_nsec;
}

// With SWARM_SIM_CHECK in the environment (the tests), what the engine
// keeps counted as it goes (its micro-batches' places, the rows a pick
// reads) is checked against its tables after each call: O(peers + G) a call.
static void s_engine_check(sim_t *s)
{
    if (s->check && !s->violation[0]
        && (engine_mb_recount(s->e) != 0 || engine_route_check(s->e) != 0))
        sim_violate(s, "the engine's counts (of micro-batches, or of its routing rows) "
                    "disagree with its tables at %.3f s", (double) s->now / 1000.0);
}

// A call into the engine at now, its CPU time counted.
static void s_engine_message(sim_t *s, const net_peer_t *who, net_msg_t *m)
{
    double t0 = s_cpu_s();
    swarm_engine_message(s->e, s->now, who, m);
    swarm_engine_tick(s->e, s->now);
    s->engine_s += s_cpu_s() - t0;
    s_engine_check(s);
}

// ---- the run ------------------------------------------------------------------

// Milliseconds to the next kill: --kill-every's period, or the gap of a
// Poisson process of --leave-rate departures a live peer an hour.
static int64_t s_kill_gap_ms(sim_t *s)
{
    if (s->o->leave_rate <= 0)
        return (int64_t) (1000.0 * s->o->kill_every_s);
    int live = sim_live_count(s, -1);
    double rate = s->o->leave_rate / 3.6e6 * (live > 0 ? live : 1); // a millisecond
    double gap = -log(1.0 - sim_uniform(s)) / rate;
    return gap < 1.0 ? 1 : gap > 1e12 ? (int64_t) 1e12 : (int64_t) gap;
}

void sim_beat_told(sim_t *s, sim_peer_t *pe, const net_msg_t *m)
{
    int ms = swarm_beat_ms(m, NULL, 0);
    if (ms < 0)
        sim_violate(s, "%s was told a heartbeat interval that is none", pe->name);
    else if (ms > 0)
        pe->beat_ms = ms;
}

// A peer's next HEARTBEAT comes this long after its last. (A node told a
// shorter interval sends its next one sooner; here it comes when it was
// due, which only a swarm that shrinks meets.)
static int64_t s_beat_ms(const sim_peer_t *pe)
{
    return pe->beat_ms > 0 ? pe->beat_ms : SIM_HEARTBEAT_MS;
}

static void s_event(sim_t *s, event_t ev)
{
    sim_peer_t *pe = ev.peer >= 0 ? &s->peers[ev.peer] : NULL;
    switch (ev.type) {
    case EV_TO_ENGINE:
        if (pe->alive)
            s_engine_message(s, &pe->who, ev.m);
        net_msg_destroy(&ev.m);
        break;
    case EV_TO_PEER: {
        if (!pe->alive || net_msg_head_const(ev.m)->type == NET_MSG_HEARTBEAT) {
            if (pe->alive) // a new interval: read as it comes, not queued
                sim_beat_told(s, pe, ev.m);
            net_msg_destroy(&ev.m);
        } else {
            queue_t *q = &pe->queue;
            if (q->n == q->cap) {
                q->cap = q->cap ? 2 * q->cap : 16;
                q->q = realloc(q->q, (size_t) q->cap * sizeof *q->q);
                q->at = realloc(q->at, (size_t) q->cap * sizeof *q->at);
                if (!q->q || !q->at)
                    abort();
            }
            q->at[q->n] = s->now;
            q->q[q->n++] = ev.m;
            sim_serve(s, ev.peer);
        }
        break;
    }
    case EV_PEER_FREE:
        if (ev.m && pe->alive) // its reply, sent now (sim_serve)
            sim_push(s, sim_arrival(s, ev.peer, LINK_UP, ev.m, s->now), EV_TO_ENGINE, ev.peer, ev.m);
        else
            net_msg_destroy(&ev.m);
        pe->busy = 0;
        if (pe->alive && pe->beat_due) { // its loop's timers, between two requests
            pe->beat_due = 0;
            sim_heartbeat(s, ev.peer);
            sim_push(s, s->now + s_beat_ms(pe), EV_HEARTBEAT, ev.peer, NULL);
        }
        sim_serve(s, ev.peer);
        break;
    case EV_TICK: {
        double t0 = s_cpu_s();
        swarm_engine_tick(s->e, s->now);
        s->engine_s += s_cpu_s() - t0;
        s_engine_check(s);
        sim_push(s, s->now + SIM_TICK_MS, EV_TICK, -1, NULL);
        break;
    }
    case EV_HEARTBEAT:
        // a node is one thread: one computing says nothing until it is done
        if (pe->alive && pe->busy) {
            pe->beat_due = 1;
        } else if (pe->alive) {
            sim_heartbeat(s, ev.peer);
            sim_push(s, s->now + s_beat_ms(pe), EV_HEARTBEAT, ev.peer, NULL);
        }
        break;
    case EV_KILL: { // a random live peer; a new one joins a second later
        int p = sim_pick_live(s, -1);
        if (p >= 0) {
            sim_kill(s, p);
            sim_push(s, s->now + 1000, EV_JOIN, -1, NULL);
        }
        sim_push(s, s->now + s_kill_gap_ms(s), EV_KILL, -1, NULL);
        break;
    }
    case EV_JOIN:
        sim_peer_new(s, -1);
        break;
    case EV_STALL: {
        int p = sim_pick_live(s, -1);
        if (p >= 0 && s->now >= s->peers[p].stall_until)
            sim_stall(s, p);
        sim_push(s, s->now + (int64_t) (1000.0 * s->o->stall_every_s), EV_STALL, -1, NULL);
        break;
    }
    case EV_RESUME:
        if (pe->alive && s->now >= pe->stall_until)
            sim_serve(s, ev.peer);
        break;
    case EV_CHURN:
        sim_churn_event(s, ev.peer);
        break;
    case EV_GONE:
        s_death_learned(s, ev.peer);
        swarm_engine_gone(s->e, s->now, &pe->who);
        break;
    case EV_LEAVE:
        sim_leave(s, ev.peer);
        break;
    case EV_BACK:
        sim_back(s, ev.peer);
        break;
    }
}

// The engine's memory against its formula (engine_memory_bound), for P the
// most peers it may hold at once so far: the live ones, the liars (banned
// or expelled, their entries kept for it), and the killed ones whose
// entries may still count in the step they died in (a step here is done
// in well under 30 s of virtual time).
static void s_memory(sim_t *s)
{
    int held = 0;
    for (int p = 0; p < s->npeers; p++) {
        const sim_peer_t *pe = &s->peers[p];
        held += pe->alive || pe->lie || s->now - pe->killed_at < 30000;
    }
    s->peers_held = held > s->peers_held ? held : s->peers_held;
    size_t mem = engine_memory(s->e), bound = engine_memory_bound(s->e, s->peers_held);
    if (mem > s->memory) {
        s->memory = mem;
        s->memory_bound = bound;
    }
    if (mem > bound)
        sim_violate(s, "the engine holds %zu bytes, more than its formula's %zu for %d peers "
                    "(docs/architecture.md, \"The engine's memory\")", mem, bound, s->peers_held);
}

// The best bound any assignment of the live peers could reach, from above:
// their summed speed over the stages' summed relative costs (a split that
// gives every stage exactly its share); a peer whose memory holds no stage
// counts nothing.
static double s_best(const sim_t *s)
{
    double speed = 0.0, cost = 0.0, least = 0.0;
    for (int st = 0; st < s->c->stages; st++)
        least = st == 0 || s->c->stage_need[st] < least ? s->c->stage_need[st] : least;
    for (int p = 0; p < s->npeers; p++)
        if (s->peers[p].alive && !(s->peers[p].memory > 0 && s->peers[p].memory < least))
            speed += s->peers[p].speed;
    for (int st = 0; st < s->c->stages; st++)
        cost += s->c->stage_cost[st] / s->mean_cost;
    return cost > 0 ? speed / cost : 0.0;
}

// The best split of the live peers that the policy finds within their
// memory, by their true speeds (swarm_policy_best, from where the engine
// put them and from a greedy split: each peer on a stage it holds, one
// that holds none counted out): what the engine's own plans aim for,
// where s_best ignores which stage each peer can hold.
static double s_best_held(const sim_t *s)
{
    double *mem = calloc(2 * (size_t) (s->npeers > 0 ? s->npeers : 1), sizeof *mem);
    int *from = calloc((size_t) (s->npeers > 0 ? s->npeers : 1), sizeof *from);
    if (!mem || !from) {
        free(mem), free(from);
        return 0.0;
    }
    double *w = mem + s->npeers;
    int n = 0;
    for (int p = 0; p < s->npeers; p++)
        if (s->peers[p].alive) {
            mem[n] = s->peers[p].memory;
            w[n] = s->peers[p].speed * s->mean_cost; // (speed is on a stage of mean cost)
            from[n++] = s->peers[p].stage;
        }
    swarm_plan_t plan = { .stages = s->c->stages, .cost = s->c->stage_cost,
                          .need = s->c->stage_need };
    double best = swarm_policy_best_of(mem, w, from, n, &plan);
    free(mem), free(from);
    return best;
}

// The bound of the engine's assignment: the least over stages of the
// summed speeds of the stage's live ready replicas.
static double s_bound(const sim_t *s)
{
    double sum[SWARM_MAX_STAGES] = { 0 }, low = -1.0;
    for (int p = 0; p < s->npeers; p++) {
        const sim_peer_t *pe = &s->peers[p];
        if (pe->alive && pe->ready && pe->stage >= 0 && pe->stage < s->c->stages)
            sum[pe->stage] += pe->speed * s->mean_cost / s->c->stage_cost[pe->stage];
    }
    for (int st = 0; st < s->c->stages; st++)
        low = low < 0 || sum[st] < low ? sum[st] : low;
    return low > 0 ? low : 0.0;
}

int swarm_sim_run(const swarm_engine_config_t *c, const swarm_sim_opts_t *o,
                  const swarm_engine_io_t *model, swarm_sim_result_t *res, char *err, size_t errlen)
{
    sim_t *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    *res = (swarm_sim_result_t) { 0 };
    s->c = c;
    s->o = o;
    s->model = *model;
    s->rng = o->seed;
    s->catch_steps = -1;
    s->train_from = -1;
    s->check = getenv("SWARM_SIM_CHECK") != NULL;
    s->G = c->batch / c->micro;
    for (int st = 0; st < c->stages; st++)
        s->mean_cost += c->stage_cost[st] / c->stages;
    if (s->mean_cost <= 0)
        s->mean_cost = 1.0;
    swarm_engine_io_t io = { .ctx = s, .send = s_io_send, .log = s_io_log, .lr_at = s_io_lr,
                             .clip_scale = s_io_clip,
                             .stepped = s_io_stepped,
                             .trace = model->trace ? s_io_trace : NULL,
                             .checksum = o->nodes ? (model->checksum ? s_io_checksum : NULL)
                                                  : s_io_sim_checksum };
    int rc = swarm_engine_new(c, &io, 0, &s->e, err, errlen);
    if (rc != 0) {
        free(s);
        return rc;
    }
    for (int p = 0; p < o->peers && !o->churn; p++) {
        s->now = 10 * p; // they start within moments of each other
        sim_peer_new(s, -1);
    }
    s->now = 0;
    if (o->churn)
        sim_churn_start(s);
    sim_push(s, 0, EV_TICK, -1, NULL);
    if (o->kill_every_s > 0 || o->leave_rate > 0)
        sim_push(s, s_kill_gap_ms(s), EV_KILL, -1, NULL);
    if (o->stall_every_s > 0 && o->stall_s > 0)
        sim_push(s, (int64_t) (1000.0 * o->stall_every_s), EV_STALL, -1, NULL);
    double bound_sum = 0.0, best_sum = 0.0;
    long samples = 0;
    int64_t next_sample = 0;
    while (s->nheap > 0 && !swarm_engine_finished(s->e) && !s->violation[0]) {
        event_t ev = s_pop(s);
        s->now = ev.t;
        if (s->now > (int64_t) (1000.0 * o->limit_s)) {
            swarm_engine_summary_t at;
            swarm_engine_summary(s->e, &at);
            sim_violate(s, "the run did not finish within %.0f s of virtual time (at step %ld)",
                      o->limit_s, at.step);
            net_msg_destroy(&ev.m);
            break;
        }
        if (s->train_from >= 0 && s->now >= next_sample) {
            bound_sum += s_bound(s);
            best_sum += s_best(s);
            s_memory(s);
            samples++;
            next_sample = s->now + 1000;
        }
        s_event(s, ev);
    }
    swarm_engine_summary_t sum;
    swarm_engine_summary(s->e, &sum);
    if (!s->violation[0] && swarm_engine_finished(s->e)) {
        long stop = c->steps > 0 && c->step + c->steps < c->iters ? c->step + c->steps : c->iters;
        if (sum.step != stop)
            sim_violate(s, "the run ended at step %ld, not at its last step %ld", sum.step, stop);
        // nothing of the training may be left in flight; a joiner's state
        // (STATE_GET for it, STATE to it) may: the run ended before it joined
        static const char *const kinds[] = { "?", "FWD", "BWD", "STEP", "UPDATE", "STATE_GET",
                                             "STATE", "ASSIGN", "VERIFY", "DISCARD" };
        char what[256] = "";
        int left = 0;
        for (int k = 0; k < s->e->req_slots; k++) {
            const req_t *q = engine_req_at(s->e, k);
            int joining = (q->kind == R_STATE_GET && q->mb >= 0) || q->kind == R_STATE;
            if (!q->id || joining)
                continue;
            left++;
            if (strlen(what) < sizeof what - 40)
                snprintf(what + strlen(what), sizeof what - strlen(what), " %s(mb %d, stage %d, "
                         "%s)", q->kind > 0 && q->kind <= R_DISCARD ? kinds[q->kind] : "?",
                         q->mb, q->stage, s->e->peers[q->peer].name);
        }
        if (left > 0)
            sim_violate(s, "%d requests of the training left in flight at the end:%s", left, what);
        if (s->e->update_pending != 0) // each step's vote on its checksums waits for these
            sim_violate(s, "%d pipelined UPDATEs still counted at the end (a step's checksums "
                        "were never compared)", s->e->update_pending);
        int drifters = 0; // a drifting liar's checksum differs from its stage's by design
        for (int p = 0; p < s->npeers; p++)
            drifters += s->peers[p].lie == SIM_LIE_DRIFT;
        if (sum.checksum_mismatches != 0 && drifters == 0)
            sim_violate(s, "%d replicas disagreed with their stage", sum.checksum_mismatches);
    }
    double secs = s->train_from >= 0 ? (double) (s->now - s->train_from) / 1000.0 : 0.0;
    int loose = 0, idle = 0;
    for (int p = 0; p < s->npeers; p++) {
        loose += s->peers[p].first_lie >= 0 && !s->peers[p].caught;
        idle += s->peers[p].alive && s->peers[p].stage < 0;
    }
    *res = (swarm_sim_result_t) {
        .steps = sum.step - s->train_from_step, .seconds = secs,
        .tok_s = secs > 0 ? (sum.step - s->train_from_step) * (double) c->batch * c->shape.T / secs : 0,
        .bound = samples ? bound_sum / samples : 0, .best = samples ? best_sum / samples : 0,
        .us_per_request = s->requests ? 1e6 * s->engine_s / s->requests : 0,
        .router_mb_s = { s->now > 0 ? s->router_bytes[LINK_DOWN] / 1e3 / (double) s->now : 0,
                         s->now > 0 ? s->router_bytes[LINK_UP] / 1e3 / (double) s->now : 0 },
        .engine_core = s->now > 0 ? s->engine_s / ((double) s->now / 1000.0) : 0,
        .rollbacks = s->rollbacks, .kills = s->kills, .stalls = s->stalls, .joins = s->joins,
        .liars_caught = s->liars_caught, .lies_applied = s->lies_applied,
        .drift_applied = s->drift_applied, .copies_lost = s->copies_lost,
        .catch_steps = s->catch_steps, .liars_loose = loose, .audits = sum.audits,
        .audit_steps = sum.audit_steps, .audit_splits = sum.audit_splits, .copies = s->ncopies,
        .timed_steps = sum.timed_steps, .audited_steps = sum.audited_steps,
        .train_time = sum.train_time, .audited_time = sum.audited_time,
        .memory = s->memory,
        .memory_bound = s->memory_bound, .idle = idle,
        .bound_end = s_bound(s), .best_held = s_best_held(s),
    };
    snprintf(res->violation, sizeof res->violation, "%s", s->violation);
    while (s->nheap > 0) {
        event_t ev = s_pop(s);
        net_msg_destroy(&ev.m);
    }
    free(s->heap);
    for (int p = 0; p < s->npeers; p++)
        sim_peer_free(s, &s->peers[p]);
    free(s->peers);
    for (int st = 0; st < c->stages; st++)
        free(s->step_sum[st]);
    free(s->ones);
    net_msg_destroy(&s->ones_wire);
    free(s->in);
    free(s->sum);
    for (int k = 0; k < SIM_LIES; k++)
        free(s->lies[k]);
    free(s->copies);
    for (int k = 0; s->copy_live && k < s->ncopies; k++)
        free(s->copy_live[k].p);
    free(s->copy_live);
    free(s->fenwick);
    swarm_engine_destroy(&s->e);
    free(s);
    return 0;
}
