/* sim_peer.c - a simulated peer of swarm sim: it answers the engine's
 * messages as a node does (the same types and metas, the step check, the
 * order a node serves its queue in), in compute time from its speed, with
 * constants for activations and known vectors for gradients, and checks
 * that every update it applies is the sum of exactly its step's
 * micro-batches. Killing one, as SIGKILL does, is here too.
 */
#include "sim_int.h"

// Whether pe lies in this way now.
static int s_lying(const sim_peer_t *pe, int how)
{
    return pe->lie == how && pe->step >= pe->lie_from;
}

// Micro-batch i's gradient at stage s, each element of it: a small
// integer, so that any sum of them is exact in fp32, and positive, so that
// no sum of them is zero (the router refuses a zero sum of work:
// engine_grad_plausible).
static float s_grad_of(int i, int s)
{
    return (float) ((i * 31u + (unsigned) s * 13u) % 7u + 1u);
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
                s->step_sum[st][j] += s_grad_of(i, st);
    }
    return s->step_sum[st];
}

// Work with diverged parameters: a drift liar's, from the update it
// drifted in until it loads its stage's state again (pe->diverged), and
// anything computed from such work. Its activations and input gradients
// are SIM_TAINT where the truth is 1, and each micro-batch of it adds a
// half to the first value of the gradient it goes into: an UPDATE that
// carries one is off its step's exact sum (a step that used such work
// must start over), and an audit of such a sum by an untainted replica
// disagrees with it.
#define SIM_TAINT (1.0f + 1.0f / 1024.0f)

// Whether req (a FWD or BWD) carries work of diverged parameters: an
// activation or input gradient of SIM_TAINT. Only read when a drift liar
// may be among the peers (decoding every tensor costs).
static int s_tainted(sim_t *s, const net_msg_t *req)
{
    if (s->o->liars == 0 || !(s->o->lies & (1u << SIM_LIE_DRIFT)))
        return 0;
    size_t n = (size_t) s->c->micro * s->c->shape.T * s->c->shape.C;
    if (!s->in && !(s->in = malloc(n * sizeof(float))))
        abort();
    for (int k = 0; k < (int) net_msg_head_const(req)->ntensors; k++)
        if (net_msg_tensor(req, k, s->in, n) == 0 && fabsf(s->in[0] - SIM_TAINT) < 1.0f / 4096)
            return 1; // (tokens and other shapes are not decoded)
    return 0;
}

// Micro-batch mb's gradient into g (pe's sum, or its audit sum).
static void s_grad_add(sim_t *s, const sim_peer_t *pe, float *g, int mb, int tainted)
{
    size_t n = s->c->stage_n[pe->stage];
    float x = s_grad_of(mb, pe->stage);
    for (size_t j = 0; j < n; j++)
        g[j] += x;
    if (tainted && n > 0)
        g[0] += 0.5f;
}

static void s_accumulate(sim_t *s, sim_peer_t *pe, int mb, int tainted)
{
    if (mb < 0 || mb >= s->G)
        return;
    s_grad_add(s, pe, pe->grad, mb, tainted);
    pe->twice += pe->count[mb]++ > 0;
    pe->counted++;
    pe->count_lo = mb < pe->count_lo ? mb : pe->count_lo;
    pe->count_hi = mb > pe->count_hi ? mb : pe->count_hi;
}

// A new step's (or state's) counts: only the span counted is cleared (a
// peer of a big swarm counts a micro-batch or two of thousands a step).
static void s_count_clear(sim_t *s, sim_peer_t *pe)
{
    if (pe->count_lo <= pe->count_hi)
        memset(pe->count + pe->count_lo, 0, (size_t) (pe->count_hi - pe->count_lo + 1) * sizeof(int));
    pe->counted = pe->twice = 0;
    pe->count_lo = s->G;
    pe->count_hi = -1;
}

// audit=1 (a FWD of the last stage, a BWD elsewhere): micro-batch mb of
// another replica's share, into pe's audit sum, as a node recomputes it.
static void s_audit_add(sim_t *s, sim_peer_t *pe, int mb, int tainted)
{
    size_t n = s->c->stage_n[pe->stage];
    if (!pe->audit && !(pe->audit = calloc(s->e->max_stage_n, sizeof(float))))
        abort();
    if (pe->audit_step != pe->step || !pe->audit_open) {
        memset(pe->audit, 0, n * sizeof(float));
        pe->audit_n = 0;
        pe->audit_step = pe->step;
        pe->audit_open = 1;
    }
    if (mb >= 0 && mb < s->G)
        s_grad_add(s, pe, pe->audit, mb, tainted);
    pe->audit_n++;
}

// A gradient sum of n floats to m, or as a liar sends it: pointing the
// other way, 1-4 times the size (by its index: liars that do not collude
// lie differently) (noted: an UPDATE it reaches is not exact).
static void s_add_grad(sim_t *s, sim_peer_t *pe, net_msg_t *m, const float *g, size_t n)
{
    float k = -(float) (1 + (pe - s->peers) % 4);
    uint32_t dims[1] = { (uint32_t) n };
    int own = s_lying(pe, SIM_LIE_GRAD), recount = g == pe->audit && s_lying(pe, SIM_LIE_RECOUNT);
    float *lie = own || recount ? malloc(n * sizeof(float)) : NULL;
    if (own) // (a recount reaches no update)
        s->lied[pe->stage][(pe->step + 1) & 1] = pe->step + 1;
    if (lie && pe->first_lie < 0)
        pe->first_lie = pe->step;
    for (size_t j = 0; lie && j < n; j++)
        lie[j] = k * g[j];
    if (net_msg_add_tensor(m, s->c->grad_wire, dims, 1, lie ? lie : g) != 0)
        abort();
    free(lie);
}

// Every micro-batch of the step went into pe's sum exactly once (G
// counted, none twice: O(1)): 0, or -1 and the violation.
static int s_exactly_once(sim_t *s, const sim_peer_t *pe)
{
    if (pe->counted == s->G && pe->twice == 0)
        return 0;
    for (int i = 0; i < s->G; i++) {
        if (pe->count[i] != 1) {
            sim_violate(s, "step %ld, stage %d: micro-batch %d counted %d times in %s's update",
                      pe->step, pe->stage, i, pe->count[i], pe->name);
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
    sim_state_checksum(pe->state, hex);
}

// An UPDATE of step t1 - 1 is off its exact sum: whether by a lie nothing
// could check, marked for t1 (`mark`); counted in *n once a stage and step
// (*at: the last t1 it was counted at).
static int s_unchecked(long mark, long t1, long *at, int *n)
{
    if (mark != t1)
        return 0;
    *n += *at != t1;
    *at = t1;
    return 1;
}

// An update applied: the state moves by a hash of every element applied.
// Every replica of a stage applies the same exact sum (the step's): its
// hash is worked out once a stage, step and clip factor, not once a
// replica (a tenth of a 1,000-peer run). A drift liar's then drifts by its
// own amount (liars that do not collude do not agree with each other
// either: one more than its index).
static void s_apply(sim_t *s, sim_peer_t *pe, const float *sum, size_t n, long t, double scale)
{
    int st = pe->stage;
    int exact = st >= 0 && st < s->c->stages && n == s->c->stage_n[st]
             && memcmp(sum, s_step_sum(s, st), n * sizeof(float)) == 0;
    uint64_t h = (uint64_t) t * 0x9E3779B97F4A7C15ull ^ (uint64_t) (scale * 1e6);
    if (exact && s->applied[st].made && s->applied[st].t == t && s->applied[st].scale == scale) {
        h = s->applied[st].h;
    } else {
        for (size_t j = 0; j < n; j++) {
            uint64_t x = h ^ (uint64_t) (int64_t) sum[j];
            h = swarm_splitmix64(&x);
        }
        if (exact)
            s->applied[st] = (sim_applied_t) { .made = 1, .t = t, .scale = scale, .h = h };
    }
    for (int k = 0; k < SIM_STATE_FLOATS; k++) {
        uint64_t x = h ^ s_bits(pe, k);
        pe->state[k] = (float) (swarm_splitmix64(&x) & 0x1fffff);
    }
    if (s_lying(pe, SIM_LIE_DRIFT)) {
        pe->state[0] += (float) (1 + (pe - s->peers)); // parameters that drift from its replicas'
        pe->diverged = 1;
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

// A liar's own pattern of signs, a quarter -1 (liars alike are colluders, SECURITY.md).
static float s_own_sign(const sim_t *s, const sim_peer_t *pe, size_t j)
{
    return ((uint32_t) j * 2654435761u + (uint32_t) (pe - s->peers) * 0x9e3779b9u) >> 30 ? 1.0f : -1.0f;
}

// An activation-shaped tensor of ones (made once), or as a liar sends it:
// with a NaN in it, 1000 times too large, (an input gradient, dx) pointing
// the other way (these two signed in the liar's pattern, s_own_sign), or
// each 1.5 times the last, signed so too (raw f32, past the encoder's
// checks, as a lying node's); of SIM_TAINT when it is work of diverged
// parameters (`tainted`).
static void s_add_acts(sim_t *s, sim_peer_t *pe, net_msg_t *m, int dx, int tainted)
{
    uint32_t dims[3] = { (uint32_t) s->c->micro, (uint32_t) s->c->shape.T,
                         (uint32_t) s->c->shape.C };
    size_t n = (size_t) dims[0] * dims[1] * dims[2];
    if (s_lying(pe, SIM_LIE_RMSWALK)) {
        pe->walk = pe->walk > 0.0 ? fmin(1.5 * pe->walk, 1e30) : 1.5; // finite
        float *x = malloc(n * sizeof(float));
        if (!x)
            abort();
        for (size_t j = 0; j < n; j++)
            x[j] = s_own_sign(s, pe, j) * (float) pe->walk;
        if (net_msg_add_raw(m, NET_DTYPE_F32, dims, 3, x, n * sizeof(float)) != 0)
            abort();
        free(x);
        return;
    }
    int how = s_lying(pe, SIM_LIE_NAN) ? SIM_LIE_NAN : s_lying(pe, SIM_LIE_SCALE) ? SIM_LIE_SCALE
            : dx && s_lying(pe, SIM_LIE_DX) ? SIM_LIE_DX : tainted ? SIM_LIE_DRIFT : 0;
    float **x = how ? &s->lies[how] : &s->ones;
    if (!*x) {
        if (!(*x = malloc(n * sizeof(float))))
            abort();
        for (size_t j = 0; j < n; j++)
            (*x)[j] = how == SIM_LIE_SCALE ? 1000.0f : how == SIM_LIE_DX ? -1.0f
                    : how == SIM_LIE_DRIFT ? SIM_TAINT : 1.0f;
        if (how == SIM_LIE_NAN)
            (*x)[n / 2] = NAN;
    }
    for (size_t j = 0; (how == SIM_LIE_DX || how == SIM_LIE_SCALE) && j < n; j++)
        (*x)[j] = s_own_sign(s, pe, j) * (how == SIM_LIE_DX ? -1.0f : 1000.0f);
    int raw = how && how != SIM_LIE_DRIFT; // a lie past the encoder's checks (drift's are plausible)
    if (!how && !s->ones_wire) { // the honest ones, encoded once
        if (!(s->ones_wire = net_msg_new(NET_MSG_RESULT))
            || net_msg_add_tensor(s->ones_wire, s->c->wire, dims, 3, s->ones) != 0)
            abort();
    }
    int rc = raw   ? net_msg_add_raw(m, NET_DTYPE_F32, dims, 3, *x, n * sizeof(float))
           : !how ? net_msg_add_shared(m, s->ones_wire, 0, dims, 3)
                  : net_msg_add_tensor(m, s->c->wire, dims, 3, *x);
    if (rc != 0)
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

// The answer of peer pe's real node to req (--numeric).
static net_msg_t *s_node_answer(sim_t *s, sim_peer_t *pe, const net_msg_t *req)
{
    const swarm_sim_nodes_t *nodes = s->o->nodes;
    const net_head_t *h = net_msg_head_const(req);
    if (h->type != NET_MSG_ASSIGN // which answers HELLO
        && (h->type == NET_MSG_ERROR || h->type == NET_MSG_BYE || (h->flags & NET_FLAG_REPLY)))
        return NULL;
    net_msg_t *r = nodes->answer(nodes->ctx, pe->node, req);
    nodes->status(nodes->ctx, pe->node, &pe->stage, &pe->ready, &pe->step);
    return r;
}

// The answer of peer pe to req, as a node gives it; NULL for none.
static net_msg_t *s_answer(sim_t *s, sim_peer_t *pe, const net_msg_t *req)
{
    const net_head_t *h = net_msg_head_const(req);
    int S = s->c->stages;
    char why[128];
    if (h->type == NET_MSG_ASSIGN && h->stage < (uint32_t) S && pe->memory > 0
        && s->c->stage_need[h->stage] > pe->memory)
        sim_violate(s, "%s (--memory %.1f MiB) was given stage %u, which needs %.1f MiB", pe->name,
                    pe->memory / 1048576.0, h->stage, s->c->stage_need[h->stage] / 1048576.0);
    if (h->type == NET_MSG_ASSIGN)
        sim_beat_told(s, pe, req);
    if (s->o->nodes)
        return s_node_answer(s, pe, req);
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
        pe->diverged = 0; // its replicas' parameters (or those of the one it came from),
        pe->drift_copy = !sim_alone(s, pe, 0) && sim_alone(s, pe, 1); // a lone drift liar's
        memset(pe->grad, 0, s->c->stage_n[pe->stage] * sizeof(float));
        s_count_clear(s, pe);
        pe->norm_only = 0;
        pe->audit_step = -1;
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
        if (s_lying(pe, SIM_LIE_STATE))
            x[0] += 1.0f; // a state other than the one its checksum is of
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
    int last = pe->stage == S - 1, eval = s_meta_is(req, "eval"), audit = s_meta_is(req, "audit");
    if (audit && (h->type == NET_MSG_FWD || h->type == NET_MSG_BWD) && pe->grad_sent != pe->step)
        return s_error(req, "an audit before this node sent its own gradient sum");
    int tainted = (h->type == NET_MSG_FWD || h->type == NET_MSG_BWD)
                  && (pe->diverged || s_tainted(s, req));
    if (tainted && pe->diverged && sim_alone(s, pe, 0))
        s->drift_alone[(pe->step + 1) & 1] = pe->step + 1;
    if (h->type == NET_MSG_FWD) {
        net_msg_t *r = net_msg_reply(req, NET_MSG_RESULT);
        if (last) {
            char meta[64];
            snprintf(meta, sizeof meta, "loss=%.9g", 5.0 - 1e-3 * (double) (h->step % 1000));
            if (net_msg_set_meta(r, meta) != 0)
                abort();
            if (audit)
                s_audit_add(s, pe, (int) h->mb, tainted);
            else if (!eval)
                s_accumulate(s, pe, (int) h->mb, tainted);
            if (S > 1 && !eval)
                s_add_acts(s, pe, r, 1, tainted);
        } else {
            s_add_acts(s, pe, r, 0, tainted);
        }
        return r;
    }
    if (h->type == NET_MSG_BWD) {
        if (audit)
            s_audit_add(s, pe, (int) h->mb, tainted);
        else
            s_accumulate(s, pe, (int) h->mb, tainted);
        net_msg_t *r = net_msg_reply(req, NET_MSG_RESULT);
        if (pe->stage > 0)
            s_add_acts(s, pe, r, 1, tainted);
        return r;
    }
    size_t n = s->c->stage_n[pe->stage];
    if (h->type == NET_MSG_STEP) {
        if (s_meta_is(req, "discard")) {
            memset(pe->grad, 0, n * sizeof(float));
            s_count_clear(s, pe);
            pe->audit_step = pe->grad_sent = -1;
            s->lied[pe->stage][(pe->step + 1) & 1] = 0; // the step starts over: its lies are void
            return net_msg_reply(req, NET_MSG_RESULT);
        }
        if (s_meta_is(req, "audit")) {
            if (pe->audit_step != pe->step || !pe->audit_open)
                return s_error(req, "STEP audit=1, but no audit of this step is open here");
            pe->audit_open = 0;
            char meta[64];
            snprintf(meta, sizeof meta, "samples=%d", pe->audit_n);
            net_msg_t *r = net_msg_reply(req, NET_MSG_GRAD);
            if (net_msg_set_meta(r, meta) != 0)
                abort();
            s_add_grad(s, pe, r, pe->audit, n);
            return r;
        }
        pe->norm_only = s_meta_is(req, "norm_only");
        net_msg_t *r = net_msg_reply(req, NET_MSG_GRAD);
        // a sum of no micro-batches is zero, sent as its count alone (as a node does)
        int none = pe->counted == 0 && !pe->norm_only && !s_lying(pe, SIM_LIE_GRAD);
        double sumsq = none ? 0.0 : swarm_sumsq(pe->grad, n); // (halves and small integers: exact)
        if (s_lying(pe, SIM_LIE_SUMSQ))
            sumsq = 1e300; // a norm that clips every stage's update to nothing
        char meta[128];
        snprintf(meta, sizeof meta, "samples=%d\nsumsq=%a\n", pe->counted, sumsq);
        pe->sumsq = sumsq;
        if (pe->norm_only) {
            if (net_msg_set_meta(r, meta) != 0)
                abort();
            return r;
        }
        if (net_msg_set_meta(r, meta) != 0)
            abort();
        if (!none)
            s_add_grad(s, pe, r, pe->grad, n);
        pe->grad_sent = pe->step;
        return r;
    }
    if (h->type == NET_MSG_UPDATE) {
        long t = (long) s_meta_num(req, "t");
        double scale = s_meta_num(req, "scale");
        char others[64];
        if (pe->norm_only && net_msg_meta_get(req, "others", others, sizeof others) == 0)
            // sent right behind its STEP: the clip factor formed here, as a node does
            scale = s->model.clip_scale(s->model.ctx, sqrt(strtod(others, NULL) + pe->sumsq));
        if (pe->norm_only) {
            if (s_exactly_once(s, pe) == 0)
                s_apply(s, pe, pe->grad, n, t, scale);
        } else {
            if (!s->sum && !(s->sum = malloc(s->e->max_stage_n * sizeof(float))))
                abort();
            float *sum = s->sum;
            if (net_tensor_get(req, 0, sum, n) != 0)
                abort();
            const float *want = s_step_sum(s, pe->stage);
            long t1 = pe->step + 1;
            int same = memcmp(sum, want, n * sizeof(float)) == 0; // (want holds no NaN)
            for (size_t j = 0; !same && j < n; j++) {
                if (sum[j] == want[j])
                    continue;
                // a liar's sum that no audit drew, or the work of a stage's
                // only replica, diverged: lies nothing could check
                if (s_unchecked(s->lied[pe->stage][t1 & 1], t1, &s->applied_at[pe->stage],
                                &s->lies_applied)
                    || s_unchecked(s->drift_alone[t1 & 1], t1, &s->drift_at[pe->stage],
                                   &s->drift_applied))
                    break;
                sim_violate(s, "step %ld, stage %d: %s's UPDATE element %zu is %g, the sum of "
                            "the step's %d micro-batches is %g", pe->step, pe->stage, pe->name, j,
                            sum[j], s->G, want[j]);
                break;
            }
            s_apply(s, pe, sum, n, t, scale);
        }
        s_count_clear(s, pe);
        pe->norm_only = 0;
        net_msg_t *r = net_msg_reply(req, NET_MSG_RESULT);
        s_add_checksum(pe, r, NULL);
        return r;
    }
    return NULL; // an unasked ASSIGN
}

// Compute time of req at peer pe, ms.
// Whole ms: a micro-batch of a fast peer takes a ms or two, and each
// rounded up made it a quarter slower than its speed (bench-hetero's
// peers in the sim kept 0.80-0.92 of their bound for it); what the
// rounding down leaves is owed by its next work, so that its work over a
// run takes what its speed says.
static int64_t s_cost_ms(sim_t *s, sim_peer_t *pe, const net_msg_t *req)
{
    const net_head_t *h = net_msg_head_const(req);
    double thirds = h->type == NET_MSG_BWD ? 2
                  : h->type == NET_MSG_FWD ? (pe->stage == s->c->stages - 1 && !s_meta_is(req, "eval") ? 3 : 1)
                  : 0;
    if (thirds == 0)
        return 0;
    double cost = pe->stage >= 0 ? s->c->stage_cost[pe->stage] / s->mean_cost : 1.0;
    double tokens = (double) s->c->micro * s->c->shape.T * thirds / 3.0;
    double ms = 1000.0 * tokens * cost / (pe->speed * sim_noise(s, pe)) + pe->work_owed_ms;
    int64_t took = (int64_t) ms;
    pe->work_owed_ms = ms - (double) took;
    return took;
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
    if (!pe->alive || pe->busy || pe->queue.n == 0 || s->now < pe->stall_until
        || s->now < pe->away_until)
        return;
    queue_t *q = &pe->queue;
    int i = s_next_index(q);
    net_msg_t *req = q->q[i];
    int64_t arrived = q->at[i];
    memmove(&q->q[i], &q->q[i + 1], (size_t) (q->n - i - 1) * sizeof *q->q);
    memmove(&q->at[i], &q->at[i + 1], (size_t) (q->n - i - 1) * sizeof *q->at);
    q->n--;
    int type = net_msg_head_const(req)->type;
    // a slowclaim liar holds the work it is given, a ckptstall liar every
    // STATE_GET (a checkpoint's read, a joiner's state), for good; a
    // joinhold liar the state it is sent to join with, and leaves before
    // the deadline
    int holds_state = type == NET_MSG_STATE && !(net_msg_head_const(req)->flags & NET_FLAG_REPLY)
                      && s_lying(pe, SIM_LIE_JOINHOLD);
    int held = ((type == NET_MSG_FWD || type == NET_MSG_BWD) && s_lying(pe, SIM_LIE_SLOWCLAIM))
            || (type == NET_MSG_STATE_GET && s_lying(pe, SIM_LIE_CKPTSTALL)) || holds_state;
    if (held && pe->first_lie < 0)
        pe->first_lie = pe->step;
    if (holds_state)
        sim_push(s, s->now + SIM_JOINHOLD_MS, EV_LEAVE, p, NULL);
    net_msg_t *reply = held ? NULL : s_answer(s, pe, req);
    int64_t took = held ? 0 : s_cost_ms(s, pe, req);
    net_msg_destroy(&req);
    pe->busy = 1;
    if (reply && (type == NET_MSG_FWD || type == NET_MSG_BWD)
        && net_msg_head_const(reply)->type == NET_MSG_RESULT) {
        // how long it held the request and how much of that was work, as
        // a node says (the router tells the link's round trip from them)
        char meta[1024];
        size_t len = 0;
        const char *old = net_msg_meta(reply, &len);
        snprintf(meta, sizeof meta, "%.*s%sheld=%.6f\nbusy=%.6f", (int) len, old ? old : "",
                 len ? "\n" : "", (double) (s->now + took - arrived) / 1000.0, took / 1000.0);
        if (net_msg_set_meta(reply, meta) != 0)
            abort();
    }
    // the reply leaves when the work is done (EV_PEER_FREE): the router's
    // link is taken in the order messages are sent, and a slow peer's reply
    // reckoned onto it ahead of time held every faster one's behind it
    sim_push(s, s->now + took, EV_PEER_FREE, p, reply);
}

// What a peer claims of its speed, as a factor of its own: a speed liar
// 1000x (in heartbeats from its first lie on: its HELLO's, always), a
// slowclaim liar 1e-6x, from its first word (as the test build's node).
static double s_claimed(const sim_peer_t *pe, int heartbeat)
{
    if (pe->lie == SIM_LIE_SPEED && (!heartbeat || s_lying(pe, SIM_LIE_SPEED)))
        return 1000.0;
    return pe->lie == SIM_LIE_SLOWCLAIM ? 1e-6 : 1.0;
}

static void s_hello(sim_t *s, int p)
{
    sim_peer_t *pe = &s->peers[p];
    char meta[160];
    snprintf(meta, sizeof meta, "proto=1\nname=%s\ndevice=sim\ntok_s=%.6g\n", pe->name,
             pe->speed * s_claimed(pe, 0));
    if (pe->memory > 0)
        snprintf(meta + strlen(meta), sizeof meta - strlen(meta), "memory=%.0f\n", pe->memory);
    net_msg_t *m = net_msg_new(NET_MSG_HELLO);
    if (net_msg_set_meta(m, meta) != 0)
        abort();
    sim_push(s, s->now + pe->latency_ms, EV_TO_ENGINE, p, m);
}

void sim_heartbeat(sim_t *s, int p)
{
    sim_peer_t *pe = &s->peers[p];
    char meta[160];
    if (s->now < pe->stall_until || s->now < pe->away_until)
        return; // a stopped process says nothing, nor one not started again yet
    if (s_lying(pe, SIM_LIE_JOINHOLD) && pe->ready && pe->first_lie < 0) {
        sim_leave(s, p); // the first time: it leaves to join again
        return;
    }
    // as a node says it: its speed on the stage it serves (a stage's cost
    // scales it), the HELLO's yardstick before it has one
    double cost = pe->stage >= 0 ? s->c->stage_cost[pe->stage] / s->mean_cost : 1.0;
    double tok = pe->speed * sim_noise(s, pe) / cost * s_claimed(pe, 1);
    if (tok != pe->beat_tok || !pe->beat_tok_text[0]) {
        pe->beat_tok = tok;
        snprintf(pe->beat_tok_text, sizeof pe->beat_tok_text, "%.6g", tok);
    }
    snprintf(meta, sizeof meta, "stage=%d\nqueue=%d\ntok_s=%s\nstep=%ld\nslots=%d", pe->stage,
             pe->queue.n, pe->beat_tok_text, pe->step, s->G);
    net_msg_t *m = net_msg_new(NET_MSG_HEARTBEAT);
    if (net_msg_set_meta(m, meta) != 0)
        abort();
    sim_push(s, s->now + pe->latency_ms, EV_TO_ENGINE, p, m);
}

// The way peer p lies (0 honest): the last --liars of the peers that join
// at the start (so that an honest replica joined its stage first), each
// drawing one of --lies' ways and a step to start at.
static void s_liar_maybe(sim_t *s, sim_peer_t *pe, int p)
{
    int ways[SIM_LIES], n = 0;
    for (int k = 1; k < SIM_LIES; k++)
        if (s->o->lies & (1u << k))
            ways[n++] = k;
    if (n == 0 || p >= s->o->peers || p < s->o->peers - s->o->liars)
        return;
    int k = (int) (sim_uniform(s) * n);
    pe->lie = ways[k < n ? k : 0];
    pe->lie_from = 1 + (long) (sim_uniform(s) * 4); // (drawn either way: the same swarm)
    if (s->o->lie_from > 0)
        pe->lie_from = s->o->lie_from;
}

// A new peer joins (of churn copy `copy`, -1 none): a key of its own, a
// speed from the mix.
int sim_peer_new(sim_t *s, int copy)
{
    if (s->npeers == s->cappeers) {
        s->cappeers = s->cappeers ? 2 * s->cappeers : 64;
        s->peers = realloc(s->peers, (size_t) s->cappeers * sizeof *s->peers);
        if (!s->peers)
            abort();
        sim_live_grown(s);
    }
    int p = s->npeers++;
    sim_peer_t *pe = &s->peers[p];
    *pe = (sim_peer_t) { .alive = 1, .stage = -1, .copy = copy };
    sim_live_put(s, p);
    // a key as a node's looks (random from its first character: the
    // router's index compares keys), unique by its last eight digits
    uint64_t h = (uint64_t) p + 1;
    uint64_t k1 = swarm_splitmix64(&h), k2 = swarm_splitmix64(&h);
    snprintf(pe->who.key, sizeof pe->who.key, "%016llx%016llx%08d", (unsigned long long) k1,
             (unsigned long long) k2, p + 1);
    snprintf(pe->who.conn, sizeof pe->who.conn, "%040d/%016d", p + 1, p + 1);
    snprintf(pe->name, sizeof pe->name, "sim%d", p + 1);
    const swarm_sim_opts_t *o = s->o;
    // with --memory or --shares the peers that join at the start are the
    // mixes in their shares, in order (as --stages auto plans); others draw
    int shares = (o->nmemories > 0 || o->shares) && !o->churn && p < o->peers;
    int k = o->nspeeds <= 0 ? 0
          : shares ? (int) ((long) p * o->nspeeds / o->peers)
                   : (int) (sim_uniform(s) * o->nspeeds);
    pe->speed = o->nspeeds > 0 ? o->speeds[k < o->nspeeds ? k : 0] : 20000.0;
    // its link: one of the range when there is one (no draw otherwise: a
    // seed's runs stay what they were)
    int64_t wide = o->latency_hi_ms - o->latency_ms;
    pe->latency_ms = o->latency_ms + (wide > 0 ? (int64_t) (sim_uniform(s) * (double) (wide + 1)) : 0);
    double span = o->bandwidth_hi_mbit - o->bandwidth_mbit;
    pe->bandwidth_mbit = o->bandwidth_mbit + (span > 0 ? sim_uniform(s) * span : 0.0);
    if (o->nmemories > 0 && o->nmemories == o->nspeeds) { // a device's speed and memory
        pe->memory = o->memories[k < o->nspeeds ? k : 0];
    } else if (o->nmemories > 0) { // (as above: no draw without a mix)
        int m = shares ? (int) ((long) p * o->nmemories / o->peers)
                       : (int) (sim_uniform(s) * o->nmemories);
        pe->memory = o->memories[m < o->nmemories ? m : 0];
    }
    s_liar_maybe(s, pe, p);
    if (s->o->nodes) {
        const swarm_sim_nodes_t *nodes = s->o->nodes;
        // the sim says its speed, and holds what it holds
        int lie = pe->lie == SIM_LIE_SPEED || pe->lie == SIM_LIE_SLOWCLAIM
                  || pe->lie == SIM_LIE_CKPTSTALL || pe->lie == SIM_LIE_JOINHOLD ? 0 : pe->lie;
        if (!(pe->node = nodes->open(nodes->ctx, p, lie, pe->lie_from)))
            abort(); // a bookkeeping allocation
    } else {
        pe->grad = calloc(s->e->max_stage_n, sizeof(float)); // the largest stage: it may move
        pe->count = calloc((size_t) s->G, sizeof(int));
        if (!pe->grad || !pe->count)
            abort();
        pe->count_lo = s->G; // none counted
        pe->count_hi = -1;
    }
    pe->audit_step = pe->grad_sent = -1;
    pe->first_lie = -1;
    pe->diverged = pe->drift_copy = pe->outvoted = 0;
    s->joins++;
    s_hello(s, p);
    sim_push(s, s->now + SIM_HEARTBEAT_MS, EV_HEARTBEAT, p, NULL); // (not told yet)
    return p;
}

// What waits at a peer's process, gone with it.
static void s_queue_drop(queue_t *q)
{
    for (int i = 0; i < q->n; i++)
        net_msg_destroy(&q->q[i]);
    q->n = 0;
}

void sim_peer_free(sim_t *s, sim_peer_t *pe)
{
    s_queue_drop(&pe->queue);
    free(pe->queue.q);
    free(pe->queue.at);
    free(pe->grad);
    free(pe->audit);
    pe->audit = NULL;
    free(pe->count);
    pe->queue.q = NULL;
    pe->queue.at = NULL;
    pe->grad = NULL;
    pe->count = NULL;
    if (pe->node)
        s->o->nodes->close(s->o->nodes->ctx, pe->node);
    pe->node = NULL;
}

// Kill peer p, as SIGKILL does: it answers nothing more, and the transport
// finds its connection gone.
void sim_kill(sim_t *s, int p)
{
    sim_peer_t *pe = &s->peers[p];
    pe->left_empty = sim_leaves(s, p);
    pe->alive = 0;
    sim_live_drop(s, p);
    pe->killed = 1;
    pe->killed_at = s->now;
    s->kills++;
    sim_peer_free(s, pe);
    sim_push(s, s->now + SIM_GONE_MS, EV_GONE, p, NULL);
}

void sim_leave(sim_t *s, int p)
{
    sim_peer_t *pe = &s->peers[p];
    if (!pe->alive || s->now < pe->away_until)
        return;
    sim_leaves(s, p);
    net_msg_t *bye = net_msg_new(NET_MSG_BYE);
    sim_push(s, sim_arrival(s, p, LINK_UP, bye, s->now), EV_TO_ENGINE, p, bye);
    s_queue_drop(&pe->queue); // the process is gone, and what it held
    pe->stage = -1;
    pe->ready = 0;
    pe->away_until = s->now + 1000;
    sim_push(s, pe->away_until, EV_BACK, p, NULL);
}

void sim_back(sim_t *s, int p)
{
    sim_peer_t *pe = &s->peers[p];
    if (!pe->alive || s->now < pe->away_until)
        return;
    s_queue_drop(&pe->queue); // sent to the process that left
    s_hello(s, p);
}

// Stop peer p for --stall seconds, as SIGSTOP does: its connection stays,
// what reaches it waits, and it answers nothing until it goes on.
void sim_stall(sim_t *s, int p)
{
    sim_peer_t *pe = &s->peers[p];
    sim_leaves(s, p);
    pe->stalled = 1;
    pe->stall_until = s->now + (int64_t) (1000.0 * s->o->stall_s);
    s->stalls++;
    sim_push(s, pe->stall_until, EV_RESUME, p, NULL);
}
