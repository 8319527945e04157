/* sim_peer.c - a simulated peer of swarm sim: it answers the engine's
 * messages as a node does (the same types and metas, the step check, the
 * order a node serves its queue in), in compute time from its speed, with
 * constants for activations and known vectors for gradients, and checks
 * that every update it applies is the sum of exactly its step's
 * micro-batches. Killing one, as SIGKILL does, is here too.
 */
#include "sim_int.h"

// Micro-batch i's gradient at stage s, element j: a small integer, so that
// any sum of them is exact in fp32.
static float s_grad_of(int i, int s, size_t j)
{
    return (float) ((int) ((i * 31u + j * 7u + (unsigned) s * 13u) % 7u) - 3);
}

// The sum of a whole step's micro-batches at stage st (the same every
// step), made once.
static const float *s_step_sum(sim_t *s, int st)
{
    if (!s->step_sum[st]) {
        size_t n = s->c->stage_n[st];
        if (!(s->step_sum[st] = calloc(n ? n : 1, sizeof(float))))
            abort();
        for (size_t j = 0; j < n; j++)
            for (int i = 0; i < s->G; i++)
                s->step_sum[st][j] += s_grad_of(i, st, j);
    }
    return s->step_sum[st];
}

static void s_accumulate(sim_t *s, sim_peer_t *pe, int mb)
{
    size_t n = s->c->stage_n[pe->stage];
    if (mb < 0 || mb >= s->G)
        return;
    for (size_t j = 0; j < n; j++)
        pe->grad[j] += s_grad_of(mb, pe->stage, j);
    pe->count[mb]++;
}

// Every micro-batch of the step went into the sum exactly once: 0, or -1
// and the violation.
static int s_exactly_once(sim_t *s, const sim_peer_t *pe, const int *count, long step)
{
    for (int i = 0; i < s->G; i++) {
        if (count[i] != 1) {
            sim_violate(s, "step %ld, stage %d: micro-batch %d counted %d times in %s's update",
                      step, pe->stage, i, count[i], pe->name);
            return -1;
        }
    }
    return 0;
}

// The bits of state float k.
static uint64_t s_bits(const sim_peer_t *pe, int k)
{
    uint32_t bits;
    memcpy(&bits, &pe->state[k], sizeof bits);
    return bits;
}

static void s_checksum(const sim_peer_t *pe, char hex[65])
{
    uint64_t h = 0x5157u;
    for (int k = 0; k < SIM_STATE_FLOATS; k++) {
        uint64_t x = h ^ s_bits(pe, k);
        h = swarm_splitmix64(&x);
    }
    for (int k = 0; k < 4; k++)
        snprintf(hex + 16 * k, 17, "%016llx", (unsigned long long) (h ^ (uint64_t) k));
}

// An update applied: the state moves by a hash of what was applied.
static void s_apply(sim_peer_t *pe, const float *sum, size_t n, long t, double scale)
{
    uint64_t h = (uint64_t) t * 0x9E3779B97F4A7C15ull ^ (uint64_t) (scale * 1e6);
    for (size_t j = 0; j < n; j++) {
        uint64_t x = h ^ (uint64_t) (int64_t) sum[j];
        h = swarm_splitmix64(&x);
    }
    for (int k = 0; k < SIM_STATE_FLOATS; k++) {
        uint64_t x = h ^ s_bits(pe, k);
        pe->state[k] = (float) (swarm_splitmix64(&x) & 0x1fffff);
    }
    memset(pe->grad, 0, n * sizeof(float));
    pe->step = t;
}

static double s_meta_num(const net_msg_t *m, const char *key)
{
    char text[64];
    return net_msg_meta_get(m, key, text, sizeof text) == 0 ? strtod(text, NULL) : 0.0;
}

static int s_meta_is(const net_msg_t *m, const char *key)
{
    char text[8];
    return net_msg_meta_get(m, key, text, sizeof text) == 0 && !strcmp(text, "1");
}

static net_msg_t *s_error(const net_msg_t *req, const char *why)
{
    net_msg_t *e = net_msg_reply(req, NET_MSG_ERROR);
    char meta[256];
    snprintf(meta, sizeof meta, "reason=%s", why);
    if (net_msg_set_meta(e, meta) != 0)
        abort();
    return e;
}

// An activation-shaped tensor of ones (made once).
static void s_add_acts(sim_t *s, net_msg_t *m)
{
    uint32_t dims[3] = { (uint32_t) s->c->micro, (uint32_t) s->c->shape.T,
                         (uint32_t) s->c->shape.C };
    size_t n = (size_t) dims[0] * dims[1] * dims[2];
    if (!s->ones) {
        if (!(s->ones = malloc(n * sizeof(float))))
            abort();
        for (size_t j = 0; j < n; j++)
            s->ones[j] = 1.0f;
    }
    if (net_msg_add_tensor(m, s->c->wire, dims, 3, s->ones) != 0)
        abort();
}

static void s_add_checksum(const sim_peer_t *pe, net_msg_t *m, const char *more)
{
    char hex[65], meta[256];
    s_checksum(pe, hex);
    snprintf(meta, sizeof meta, "%schecksum=%s", more ? more : "", hex);
    if (net_msg_set_meta(m, meta) != 0)
        abort();
}

// The answer of peer pe to req, as a node gives it; NULL for none.
static net_msg_t *s_answer(sim_t *s, sim_peer_t *pe, const net_msg_t *req)
{
    const net_head_t *h = net_msg_head_const(req);
    int S = s->c->stages;
    char why[128];
    if (h->type == NET_MSG_ASSIGN) { // in its turn, as a node serves it
        pe->stage = (int) h->stage;
        pe->ready = 0;
        return NULL;
    }
    if (h->type == NET_MSG_ERROR || h->type == NET_MSG_BYE || (h->flags & NET_FLAG_REPLY))
        return NULL;
    if (h->type == NET_MSG_STATE) {
        pe->stage = (int) h->stage;
        pe->step = (long) h->step;
        size_t n = s->c->stage_n[pe->stage];
        float *params = malloc(n * sizeof(float));
        if (!params || net_msg_tensor(req, 0, params, n) != 0)
            abort();
        memcpy(pe->state, params, sizeof pe->state); // what STATE_GET sends back
        free(params);
        memset(pe->grad, 0, s->c->stage_n[pe->stage] * sizeof(float));
        memset(pe->count, 0, (size_t) s->G * sizeof(int));
        pe->norm_only = 0;
        pe->ready = 1;
        net_msg_t *r = net_msg_reply(req, NET_MSG_RESULT);
        s_add_checksum(pe, r, NULL);
        return r;
    }
    if (h->type == NET_MSG_STATE_GET) {
        size_t n = s->c->stage_n[pe->stage];
        float *x = calloc(n, sizeof(float));
        if (!x)
            abort();
        memcpy(x, pe->state, sizeof pe->state);
        net_msg_t *r = net_msg_reply(req, NET_MSG_STATE);
        net_msg_head(r)->step = (uint64_t) pe->step;
        uint32_t dims[1] = { (uint32_t) n };
        for (int k = 0; k < 3; k++)
            if (net_msg_add_tensor(r, NET_DTYPE_F32, dims, 1, x) != 0)
                abort();
        free(x);
        return r;
    }
    if (!pe->ready || h->stage != (uint32_t) pe->stage)
        return s_error(req, "no state loaded for that stage");
    if (h->step != (uint64_t) pe->step) {
        snprintf(why, sizeof why, "step %llu, this node is at step %ld",
                 (unsigned long long) h->step, pe->step);
        return s_error(req, why);
    }
    int last = pe->stage == S - 1, eval = s_meta_is(req, "eval");
    if (h->type == NET_MSG_FWD) {
        net_msg_t *r = net_msg_reply(req, NET_MSG_RESULT);
        if (last) {
            char meta[64];
            snprintf(meta, sizeof meta, "loss=%.9g", 5.0 - 1e-3 * (double) (h->step % 1000));
            if (net_msg_set_meta(r, meta) != 0)
                abort();
            if (!eval)
                s_accumulate(s, pe, (int) h->mb);
            if (S > 1 && !eval)
                s_add_acts(s, r);
        } else {
            s_add_acts(s, r);
        }
        return r;
    }
    if (h->type == NET_MSG_BWD) {
        s_accumulate(s, pe, (int) h->mb);
        net_msg_t *r = net_msg_reply(req, NET_MSG_RESULT);
        if (pe->stage > 0)
            s_add_acts(s, r);
        return r;
    }
    size_t n = s->c->stage_n[pe->stage];
    if (h->type == NET_MSG_STEP) {
        if (s_meta_is(req, "discard")) {
            memset(pe->grad, 0, n * sizeof(float));
            memset(pe->count, 0, (size_t) s->G * sizeof(int));
            return net_msg_reply(req, NET_MSG_RESULT);
        }
        pe->norm_only = s_meta_is(req, "norm_only");
        net_msg_t *r = net_msg_reply(req, NET_MSG_GRAD);
        double sumsq = 0.0;
        for (size_t j = 0; j < n; j++)
            sumsq += (double) pe->grad[j] * pe->grad[j];
        char meta[128];
        snprintf(meta, sizeof meta, "sumsq=%a\n", sumsq);
        if (pe->norm_only && s_meta_is(req, "apply")) {
            if (s_exactly_once(s, pe, pe->count, pe->step) == 0) {
                double scale = s->model.clip_scale(s->model.ctx, sqrt(s_meta_num(req, "others") + sumsq));
                s_apply(pe, pe->grad, n, (long) s_meta_num(req, "t"), scale);
            }
            memset(pe->count, 0, (size_t) s->G * sizeof(int));
            pe->norm_only = 0;
            s_add_checksum(pe, r, meta);
            return r;
        }
        if (pe->norm_only) {
            if (net_msg_set_meta(r, meta) != 0)
                abort();
            return r;
        }
        uint32_t dims[1] = { (uint32_t) n };
        if (net_msg_add_tensor(r, s->c->grad_wire, dims, 1, pe->grad) != 0)
            abort();
        return r;
    }
    if (h->type == NET_MSG_UPDATE) {
        long t = (long) s_meta_num(req, "t");
        double scale = s_meta_num(req, "scale");
        if (pe->norm_only) {
            if (s_exactly_once(s, pe, pe->count, pe->step) == 0)
                s_apply(pe, pe->grad, n, t, scale);
        } else {
            float *sum = malloc(n * sizeof(float));
            if (!sum || net_tensor_get(req, 0, sum, n) != 0)
                abort();
            const float *want = s_step_sum(s, pe->stage);
            for (size_t j = 0; j < n; j++) {
                if (sum[j] != want[j]) {
                    sim_violate(s, "step %ld, stage %d: %s's UPDATE element %zu is %g, the sum of "
                                "the step's %d micro-batches is %g", pe->step, pe->stage, pe->name,
                                j, sum[j], s->G, want[j]);
                    break;
                }
            }
            s_apply(pe, sum, n, t, scale);
            free(sum);
        }
        memset(pe->count, 0, (size_t) s->G * sizeof(int));
        pe->norm_only = 0;
        net_msg_t *r = net_msg_reply(req, NET_MSG_RESULT);
        s_add_checksum(pe, r, NULL);
        return r;
    }
    return NULL; // a probe, an unasked ASSIGN
}

// Compute time of req at peer pe, ms.
static int64_t s_cost_ms(const sim_t *s, const sim_peer_t *pe, const net_msg_t *req)
{
    const net_head_t *h = net_msg_head_const(req);
    double thirds = h->type == NET_MSG_BWD ? 2
                  : h->type == NET_MSG_FWD ? (pe->stage == s->c->stages - 1 && !s_meta_is(req, "eval") ? 3 : 1)
                  : 0;
    if (thirds == 0)
        return 0;
    double cost = pe->stage >= 0 ? s->c->stage_cost[pe->stage] / s->mean_cost : 1.0;
    double tokens = (double) s->c->micro * s->c->shape.T * thirds / 3.0;
    return (int64_t) ceil(1000.0 * tokens * cost / pe->speed);
}

// The next message pe serves, as a node picks it: a BWD before the FWDs
// ahead of it, a FWD or BWD before a STATE_GET ahead of it, and nothing
// overtakes any other control message (ASSIGN, STATE, STEP, UPDATE).
static int s_next_index(const queue_t *q)
{
    int work = q->n;
    for (int i = 0; i < q->n; i++) {
        int type = net_msg_head_const(q->q[i])->type;
        if (type == NET_MSG_BWD)
            return i;
        if (type == NET_MSG_FWD && work == q->n)
            work = i;
        if (type != NET_MSG_FWD && type != NET_MSG_STATE_GET)
            break;
    }
    return work < q->n ? work : 0;
}

void sim_serve(sim_t *s, int p)
{
    sim_peer_t *pe = &s->peers[p];
    if (!pe->alive || pe->busy || pe->queue.n == 0)
        return;
    int i = s_next_index(&pe->queue);
    net_msg_t *req = pe->queue.q[i];
    memmove(&pe->queue.q[i], &pe->queue.q[i + 1], (size_t) (pe->queue.n - i - 1) * sizeof req);
    pe->queue.n--;
    net_msg_t *reply = s_answer(s, pe, req);
    int64_t took = s_cost_ms(s, pe, req);
    net_msg_destroy(&req);
    pe->busy = 1;
    sim_push(s, s->now + took, EV_PEER_FREE, p, NULL);
    if (reply)
        sim_push(s, s->now + took + s->o->latency_ms, EV_TO_ENGINE, p, reply);
}

static void s_hello(sim_t *s, int p)
{
    sim_peer_t *pe = &s->peers[p];
    char meta[128];
    snprintf(meta, sizeof meta, "proto=1\nname=%s\ndevice=sim\ntok_s=%.1f\n", pe->name, pe->speed);
    net_msg_t *m = net_msg_new(NET_MSG_HELLO);
    if (net_msg_set_meta(m, meta) != 0)
        abort();
    sim_push(s, s->now + s->o->latency_ms, EV_TO_ENGINE, p, m);
}

void sim_heartbeat(sim_t *s, int p)
{
    sim_peer_t *pe = &s->peers[p];
    char meta[160];
    snprintf(meta, sizeof meta, "stage=%d\nqueue=%d\ntok_s=%.1f\nstep=%ld\nslots=%d", pe->stage,
             pe->queue.n, pe->speed, pe->step, s->G);
    net_msg_t *m = net_msg_new(NET_MSG_HEARTBEAT);
    if (net_msg_set_meta(m, meta) != 0)
        abort();
    sim_push(s, s->now + s->o->latency_ms, EV_TO_ENGINE, p, m);
}

// A new peer joins: a key of its own, a speed from the mix.
int sim_peer_new(sim_t *s)
{
    if (s->npeers == s->cappeers) {
        s->cappeers = s->cappeers ? 2 * s->cappeers : 64;
        s->peers = realloc(s->peers, (size_t) s->cappeers * sizeof *s->peers);
        if (!s->peers)
            abort();
    }
    int p = s->npeers++;
    sim_peer_t *pe = &s->peers[p];
    *pe = (sim_peer_t) { .alive = 1, .stage = -1 };
    snprintf(pe->who.key, sizeof pe->who.key, "%040d", p + 1);
    snprintf(pe->who.conn, sizeof pe->who.conn, "%040d/%016d", p + 1, p + 1);
    snprintf(pe->name, sizeof pe->name, "sim%d", p + 1);
    int k = s->o->nspeeds > 0 ? (int) (sim_uniform(s) * s->o->nspeeds) : 0;
    pe->speed = s->o->nspeeds > 0 ? s->o->speeds[k < s->o->nspeeds ? k : 0] : 20000.0;
    pe->grad = calloc(s->e->max_stage_n, sizeof(float)); // the largest stage: it may move
    pe->count = calloc((size_t) s->G, sizeof(int));
    if (!pe->grad || !pe->count)
        abort();
    s_hello(s, p);
    sim_push(s, s->now + SIM_HEARTBEAT_MS, EV_HEARTBEAT, p, NULL);
    return p;
}

// Kill a live peer at random (as SIGKILL does: it answers nothing more, and
// the transport finds its connection gone); a new one joins a second later.
void sim_kill(sim_t *s)
{
    int live = 0;
    for (int p = 0; p < s->npeers; p++)
        live += s->peers[p].alive;
    if (live == 0)
        return;
    int k = (int) (sim_uniform(s) * live), p = 0;
    for (; p < s->npeers; p++)
        if (s->peers[p].alive && k-- == 0)
            break;
    sim_peer_t *pe = &s->peers[p];
    pe->alive = 0;
    pe->killed = 1;
    int left = 0;
    for (int q = 0; q < s->npeers; q++)
        left += s->peers[q].alive && s->peers[q].ready && s->peers[q].stage == pe->stage;
    if (pe->ready && left == 0)
        s->emptied++;
    for (int i = 0; i < pe->queue.n; i++)
        net_msg_destroy(&pe->queue.q[i]);
    pe->queue.n = 0;
    sim_push(s, s->now + SIM_GONE_MS, EV_GONE, p, NULL);
    sim_push(s, s->now + 1000, EV_JOIN, -1, NULL);
}
