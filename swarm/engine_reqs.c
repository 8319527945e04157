/* engine_reqs.c - the router's requests: the table of those in flight (a
 * request is found by the slot in its id), sending one, its trace line,
 * what its tensors carry on the wire, and when the router's own link is
 * through with it. Time and every send come from here (s_loop sets the
 * time; engine_emit is the one way out).
 */
#include "engine_int.h"

// 1 when a line about peer `key` may be logged now (swarm_loglimit_pass).
int engine_loud(swarm_engine_t *r, const char *key, char *note, size_t cap)
{
    return swarm_loglimit_pass(&r->loglimit, key, r->now_ms, note, cap);
}

// Now, in seconds: the router reads no clock but s_loop's (time is an
// argument of what it does, as it will be in the simulator).
double engine_secs(const swarm_engine_t *r)
{
    return (double) r->now_ms / 1000.0;
}

// Every message the router sends leaves here: to the connection `to`
// (takes *m). 0 or -errno.
int engine_emit(swarm_engine_t *r, const net_peer_t *to, net_msg_t **m)
{
    return r->io.send(r->io.ctx, to, m);
}

// A line of the log, through the caller: stdout (say) or stderr (warn).
static void s_log(const swarm_engine_t *r, int to_stderr, const char *fmt, va_list ap)
{
    char line[1024];
    vsnprintf(line, sizeof line, fmt, ap);
    engine_history_event(r, to_stderr, line);
    r->io.log(r->io.ctx, to_stderr, line);
}

void engine_say(const swarm_engine_t *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    s_log(r, 0, fmt, ap);
    va_end(ap);
}

void engine_warn(const swarm_engine_t *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    s_log(r, 1, fmt, ap);
    va_end(ap);
}

// A line of peer p joining, leaving or dying: a peer's at most one a second
// and all of them ten (after bursts of 10 and 40: MEMBER_LINES_*), so
// that a crowd of keys that join and leave, or a big swarm's churn (73,000
// joins in 1,000 steps of 10,000 spot machines), fills no disk and no
// screen. A line held back still reaches the caller, as SWARM_LOG_HELD (the
// simulator reads every one); the next shown says how many were.
void engine_member_line(swarm_engine_t *r, int p, int to_stderr, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (!swarm_loglimit_pass(&r->members, r->peers[p].who.key, r->now_ms, NULL, 0)) {
        r->members_held++;
        r->io.log(r->io.ctx, to_stderr | SWARM_LOG_HELD, line);
        return;
    }
    size_t end = strcspn(line, "\n");
    if (r->members_held)
        snprintf(line + end, sizeof line - end, " (%llu more lines of joins and deaths not shown)\n",
                 (unsigned long long) r->members_held);
    r->members_held = 0;
    engine_history_event(r, to_stderr, line);
    r->io.log(r->io.ctx, to_stderr, line);
}

// --trace: "MS EVENT STEP KIND MB STAGE PEER", EVENT send (a request went
// out), done (answered, or given up: its peer died, the step restarted) or
// step (STEP ended; the rest are "-"); MS is the monotonic clock in ms.
// What scripts/trace-steps.sh reads.
void engine_trace(const swarm_engine_t *r, const char *event, int kind, int mb, int stage, int peer)
{
    static const char *const names[] = { "?", "FWD", "BWD", "STEP", "UPDATE", "STATE_GET",
                                         "STATE", "ASSIGN", "VERIFY", "DISCARD", "AUDIT",
                                         "AUDIT_STEP" };
    char line[160];
    if (!r->io.trace)
        return;
    if (peer < 0)
        snprintf(line, sizeof line, "%lld %s %ld - - - -\n", (long long) r->now_ms, event, r->step);
    else
        snprintf(line, sizeof line, "%lld %s %ld %s %d %d %d\n", (long long) r->now_ms, event,
                 r->step, kind > 0 && kind <= R_AUDIT_SUM ? names[kind] : "?", mb, stage,
                 r->peers[peer].id);
    r->io.trace(r->io.ctx, line);
}

// Slot k of the request table (k < req_slots). Loops over the requests
// in flight run over the slots up to the high-water mark: the most
// requests ever in flight at once, not a fixed table.
req_t *engine_req_at(const swarm_engine_t *r, int k)
{
    return &r->req_blocks[k / REQ_BLOCK][k % REQ_BLOCK];
}

// Training work of a request of `kind` at `stage`, in thirds of a
// micro-batch's forward and backward: a forward 1, a backward 2, the last
// stage's fused pair 3 (an evaluation's forward 1), control 0.
static int s_req_thirds(const swarm_engine_t *r, int kind, int stage)
{
    if (kind == R_BWD)
        return 2;
    if (kind == R_VERIFY)
        return 1;
    if (kind == R_AUDIT) // a forward and its backward
        return 3;
    if (kind == R_FWD)
        return stage == r->stages - 1 && !r->evaluating ? 3 : 1;
    return 0;
}

// A free slot for a new request (a freed one, else the next, in a new block
// when the last is full); NULL when out of memory or slots.
static req_t *s_req_slot(swarm_engine_t *r, int *slot)
{
    if (r->req_nfree > 0) {
        *slot = r->req_free[--r->req_nfree];
        return engine_req_at(r, *slot);
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
    return engine_req_at(r, *slot);
}

static req_t *s_req_new(swarm_engine_t *r, int kind, int peer, int mb, int stage)
{
    int slot;
    req_t *q = s_req_slot(r, &slot);
    if (!q)
        return NULL;
    uint64_t id = r->last_id = (++r->next_id << REQ_SLOT_BITS) | (uint64_t) slot;
    peer_t *pe = &r->peers[peer];
    *q = (req_t) { .id = id, .kind = kind, .peer = peer, .mb = mb, .stage = stage,
                   .sent = r->now_ms, .thirds = s_req_thirds(r, kind, stage),
                   .ahead_thirds = pe->held_thirds, .out = r->now_ms };
    engine_trace(r, "send", kind, mb, stage, peer);
    pe->inflight++;
    pe->held_thirds += q->thirds;
    if (kind == R_FWD || kind == R_BWD) {
        pe->held_kind[kind == R_BWD]++;
        if (pe->working++ == 0)
            pe->busy_from = q->sent;
    }
    if (kind == R_STEP && stage >= 0 && stage < SWARM_MAX_STAGES)
        r->steps_open[stage]++;
    engine_route_touch(r, peer);
    return q;
}

// The request a reply names, by the slot in its id: O(1).
req_t *engine_req_find(swarm_engine_t *r, uint64_t id)
{
    uint64_t slot = id & ((1u << REQ_SLOT_BITS) - 1);
    if (id == 0 || slot >= (uint64_t) r->req_slots)
        return NULL;
    req_t *q = engine_req_at(r, (int) slot);
    return q->id == id ? q : NULL;
}

void engine_req_done(swarm_engine_t *r, req_t *q)
{
    peer_t *pe = &r->peers[q->peer];
    engine_trace(r, "done", q->kind, q->mb, q->stage, q->peer);
    if (pe->inflight > 0)
        pe->inflight--;
    pe->held_thirds -= q->thirds;
    if (engine_req_computes(q->kind))
        pe->worked_at = r->now_ms;
    if (q->kind == R_FWD || q->kind == R_BWD) {
        pe->held_kind[q->kind == R_BWD]--;
        if (pe->working > 0 && --pe->working == 0)
            pe->busy_s += (double) (r->now_ms - pe->busy_from) / 1000.0;
    }
    if (q->kind == R_STEP && q->stage >= 0 && q->stage < SWARM_MAX_STAGES)
        r->steps_open[q->stage]--;
    r->reply_due -= q->reply_bytes;
    r->req_free[r->req_nfree++] = (int) (q->id & ((1u << REQ_SLOT_BITS) - 1));
    q->id = 0;
    engine_route_touch(r, q->peer);
}

// Seconds peer p has had FWD/BWD work in flight, in all.
double engine_busy_s(const peer_t *pe, int64_t now)
{
    return pe->busy_s + (pe->working > 0 ? (double) (now - pe->busy_from) / 1000.0 : 0.0);
}

// Peer pe's speed is measured afresh from now (it joined, or moved stage).
void engine_speed_restart(peer_t *pe, int64_t now)
{
    pe->rate_busy = pe->check_busy = engine_busy_s(pe, now);
    pe->rate_work = pe->check_work = pe->work;
    pe->samples = 0;
}

// Tensor bytes a message carries on the wire.
uint64_t engine_payload(const net_msg_t *m)
{
    const net_head_t *h = net_msg_head_const(m);
    uint64_t n = 0;
    for (int i = 0; i < h->ntensors; i++)
        n += h->tensors[i].bytes;
    return n;
}

// Count m's tensor bytes into by[] by what they carry.
void engine_wire_count(const net_msg_t *m, uint64_t by[3])
{
    int type = net_msg_head_const(m)->type;
    by[type == NET_MSG_GRAD || type == NET_MSG_UPDATE ? W_GRADS
       : type == NET_MSG_STATE ? W_STATE : W_ACTS] += engine_payload(m);
}

// Floats in one activation tensor (micro, T, C).
size_t engine_acts_count(const swarm_engine_t *r)
{
    return (size_t) r->hp.micro * r->hp.cfg.T * r->hp.cfg.C;
}

// Append activations kept in the message src that carried them (its tensor
// 0, shared: no copy; 2^pow2 scale) to m as tensor i: the pow2 goes into
// meta (*meta, appended).
int engine_acts_add(const swarm_engine_t *r, net_msg_t *m, const net_msg_t *src, int pow2, char *meta,
                    size_t cap)
{
    uint32_t dims[3] = { (uint32_t) r->hp.micro, (uint32_t) r->hp.cfg.T, (uint32_t) r->hp.cfg.C };
    int i = net_msg_head_const(m)->ntensors;
    if (pow2 != 0)
        snprintf(meta + strlen(meta), cap - strlen(meta), "pow2_%d=%d\n", i, pow2);
    return net_msg_add_shared(m, src, 0, dims, 3);
}

// ---- the router's own link ---------------------------------------------------

// The router's link carries what it sends in the order it was sent, one
// queue for all its peers (as a saturated uplink does): a request's bytes
// are through once everything sent before them is, at link_rate, and its
// deadline's clock runs from then. So a router whose link is slower than
// what it sends at once (the updates of a big model, a joiner's state)
// does not ban the peers whose requests wait in it. The rate is what the
// router was told (--router-bandwidth, SWARM_ROUTER_MBIT unless); a reply
// shows its request, and all sent before it, through: the reckoning never
// runs ahead of what the replies show, so a link faster than the rate
// costs deadlines nothing. The other way, a reply may wait behind every
// reply that came in since its request was sent and every one still due
// (each replica's gradient sum at a step's end comes at once): its
// deadline allows them at link_rate (what came in, up to the most a step
// can ask to come in at once). On its peer's own link a request and its
// reply take their bytes at LINK_FLOOR at the most (as a state's deadline
// allows it a second a megabyte).
#define LINK_FLOOR 1000.0  // bytes a ms (8 Mbit/s)

// Bytes the reply to q carries, about: a gradient sum for a STEP, an
// activation or its gradient for a compute request, a state for a read.
static uint64_t s_reply_bytes(const swarm_engine_t *r, const req_t *q)
{
    size_t n = q->stage >= 0 && q->stage < r->stages ? r->stage_n[q->stage] : 0;
    if (q->kind == R_STEP || q->kind == R_AUDIT_SUM)
        return net_codec_bytes(r->grad_wire, n);
    if (q->kind == R_STATE_GET)
        return 12 * (uint64_t) n;
    return engine_req_computes(q->kind) ? net_codec_bytes(r->wire, engine_acts_count(r)) : 0;
}

void engine_link_second(swarm_engine_t *r)
{
    int64_t sec = r->now_ms / 1000;
    for (int64_t k = sec - r->link_sec > LINK_SECS ? sec - LINK_SECS : r->link_sec; k < sec; k++) {
        r->link_hist[k % LINK_SECS][0] = r->reply_asked;
        r->link_hist[k % LINK_SECS][1] = r->link_recv;
    }
    r->link_sec = sec > r->link_sec ? sec : r->link_sec;
}

// reply_asked (what 0) or link_recv (1) as it was at `ms`, or later (as it
// is now, past the seconds kept)
static uint64_t s_link_at(const swarm_engine_t *r, int64_t ms, int what)
{
    int64_t sec = ms / 1000;
    if (ms < 0 || sec >= r->link_sec || r->link_sec - sec > LINK_SECS)
        return what ? r->link_recv : r->reply_asked;
    return r->link_hist[sec % LINK_SECS][what];
}

static void s_link_send(swarm_engine_t *r, req_t *q, uint64_t bytes)
{
    double from = r->link_free > (double) r->now_ms ? r->link_free : (double) r->now_ms;
    r->link_free = from + (double) (bytes + LINK_HEAD) / r->link_rate;
    r->link_sent += bytes + LINK_HEAD;
    q->link_at = r->link_sent;
    q->out = (int64_t) ceil(r->link_free);
    q->recv_at = r->link_recv;
    q->reply_bytes = s_reply_bytes(r, q);
    r->reply_due += q->reply_bytes;
    engine_link_second(r);
    r->reply_asked += q->reply_bytes;
    q->due_at = r->reply_due;
    q->asked_at = r->reply_asked;
    int state = q->kind == R_STATE || q->kind == R_STATE_GET;
    q->wire_ms = state ? 0 : (int64_t) ((double) (bytes + q->reply_bytes) / LINK_FLOOR);
}

double engine_link_most(const swarm_engine_t *r)
{
    return (double) engine_ready_count(r, -1) * (double) net_codec_bytes(r->grad_wire, r->max_stage_n)
         + 12.0 * (double) r->max_stage_n;
}

// A reply's wait behind others on a link as slow as told, busy since the
// reply would be in its queue (`by`, its peer in time; what came in since
// is half what link_rate carries or more) and no faster since q was sent
// (half more, at the most), may be longer than `most` allows. The queue is
// in the order the replies came: q's waits behind what was in it when q's
// came in, all of which came in since or is due still, and all of which
// was due when q was sent or asked for by `by`. (A swarm sim router of 5
// Mbit/s with a kill every 20 s banned honest peers: 47 MB came in while
// a state of 5 MB waited, its stage's gradient sums and joiners' states.)
int64_t engine_link_wait_ms(const swarm_engine_t *r, const req_t *q, double most, int64_t by)
{
    double came = (double) (r->link_recv - q->recv_at), due = (double) r->reply_due;
    double wait = (came < most ? came : most) + due;
    if (came > most && r->now_ms > by && came <= 1.5 * (double) (r->now_ms - q->sent) * r->link_rate
        && (double) (r->link_recv - s_link_at(r, by, 1)) >= 0.5 * (double) (r->now_ms - by) * r->link_rate) {
        double ahead = (double) (q->due_at + s_link_at(r, by, 0) - q->asked_at);
        double fifo = came + due < ahead ? came + due : ahead;
        wait = fifo > wait ? fifo : wait;
    }
    return (int64_t) (wait / r->link_rate);
}

void engine_link_heard(swarm_engine_t *r, const req_t *q)
{
    double left = (double) r->now_ms + (double) (r->link_sent - q->link_at) / r->link_rate;
    if (left < r->link_free)
        r->link_free = left;
}

// Send m to peer p as request kind; 0 or -errno (logged).
int engine_send(swarm_engine_t *r, int p, net_msg_t **m, int kind, int mb, int stage)
{
    req_t *q = s_req_new(r, kind, p, mb, stage);
    if (!q) {
        net_msg_destroy(m);
        engine_warn(r, "swarm router: out of memory for the request table (%d requests)\n",
                    r->req_slots - r->req_nfree);
        return -ENOSPC;
    }
    net_msg_head(*m)->id = q->id;
    uint64_t bytes = engine_payload(*m);
    r->bytes_out += bytes;
    engine_wire_count(*m, r->wire_out);
    s_link_send(r, q, bytes);
    int rc = engine_emit(r, &r->peers[p].who, m);
    if (rc != 0) {
        // not connected (or its queue is full): dead for this run; the next
        // turn hands its work to others (engine_reap), not in the middle of this one
        if (!r->peers[p].failed)
            engine_warn(r, "swarm router: peer %d (%s): send failed: %s\n", r->peers[p].id,
                        r->peers[p].name, strerror(-rc));
        r->peers[p].failed = r->failed_any = 1;
        engine_req_done(r, q); // (its row shows it failed)
    } else if ((kind == R_BWD || (kind == R_FWD && stage == r->stages - 1 && !r->evaluating))
               && stage >= 0 && stage < r->stages && r->stepped[stage]) {
        // gradient work for a stage already asked for its gradients (a dead
        // peer's request sent again): its replicas' answers would miss it
        engine_step_unask(r);
    }
    return rc;
}

int engine_meta(net_msg_t *m, const char *fmt, ...)
{
    char text[1024 + SWARM_CUT_MAX]; // (an ASSIGN's cut= of up to SWARM_MAX_STAGES stages)
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    return net_msg_set_meta(m, text);
}

int engine_meta_add(net_msg_t *m, const char *line)
{
    char text[1024];
    size_t len = 0;
    const char *old = net_msg_meta(m, &len);
    if (old && len > 0 && old[len - 1] != '\n')
        snprintf(text, sizeof text, "%.*s\n%s\n", (int) len, old, line);
    else
        snprintf(text, sizeof text, "%.*s%s\n", old ? (int) len : 0, old ? old : "", line);
    return net_msg_set_meta(m, text);
}

int engine_close(const float *a, const float *b, size_t n, double tol)
{
    double d = 0.0, m = 0.0;
    for (size_t j = 0; j < n; j++) {
        double e = (double) a[j] - b[j];
        d += e * e;
        m += (double) b[j] * b[j];
    }
    return d <= tol * tol * (m > 1e-30 ? m : 1e-30);
}

double swarm_sumsq(const float *x, size_t n)
{
    double sq[4] = {0.0, 0.0, 0.0, 0.0};
    size_t j = 0;
    for (; j + 4 <= n; j += 4)
        for (int k = 0; k < 4; k++)
            sq[k] += (double) x[j + k] * x[j + k];
    for (; j < n; j++)
        sq[0] += (double) x[j] * x[j];
    return (sq[0] + sq[1]) + (sq[2] + sq[3]);
}

int engine_loss_close(float a, float b)
{
    return fabsf(a - b) <= 1e-4f * fmaxf(1.0f, fabsf(b));
}

static uint64_t s_mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

double engine_draw(const swarm_engine_t *r, int what, long a, long b)
{
    uint64_t x = s_mix(r->secret ^ (uint64_t) what * 0x9e3779b97f4a7c15ull);
    x = s_mix(x ^ (uint64_t) r->step);
    x = s_mix(x ^ (uint64_t) r->restarts);
    x = s_mix(x ^ (uint64_t) a);
    x = s_mix(x ^ (uint64_t) b);
    return (double) (x >> 11) * 0x1p-53;
}

void *engine_dup_bytes(const void *src, size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        abort();
    memcpy(p, src, n);
    return p;
}
