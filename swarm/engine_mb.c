/* engine_mb.c - micro-batches through the stages: the window in flight,
 * each FWD and BWD to the replica the policy picks, work a dead peer held
 * redone, results in. The step's gradients: engine_step.c.
 */
#include "engine_int.h"

#include <assert.h>

// A FWD/BWD reply's held= (s at the node) and busy= (s of compute): the
// rest of its time dt was the network's round trip.
static void s_peer_timing(peer_t *pe, int bwd, const msg_reply_t *y, double dt)
{
    if (!y->has_timing)
        return; // a node that does not say (or says nonsense)
    double held = y->held, busy = y->busy;
    // a request that reached a busy node waited in its socket, which looks
    // like network: follow a lower sample at once, a higher one slowly
    double net = dt > held ? dt - held : 0.0;
    pe->rtt = pe->rtt > 0 && net > pe->rtt ? 0.95 * pe->rtt + 0.05 * net : net;
    pe->busy[bwd] = pe->busy[bwd] > 0 ? 0.8 * pe->busy[bwd] + 0.2 * busy : busy;
}

// What swarm_policy_window needs, from the ready peers' measurements.
static void s_window_in(const swarm_engine_t *r, swarm_window_in_t *in)
{
    int S = r->stages, unknown_slots[SWARM_MAX_STAGES] = {0};
    *in = (swarm_window_in_t) { .stages = S, .micro_batches = r->G };
    double work[SWARM_MAX_STAGES] = {0}, rate[SWARM_MAX_STAGES] = {0};
    int measured[SWARM_MAX_STAGES] = {0};
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
void engine_window_update(swarm_engine_t *r)
{
    if (r->window_mode != WIN_FIXED) {
        swarm_window_in_t in;
        s_window_in(r, &in);
        in.all = r->window_mode == WIN_ALL;
        r->window = swarm_policy_window(&in);
        if (!r->window_shown || 4 * abs(r->window - r->window_shown) >= r->window_shown) {
            engine_say(r, "swarm router: step %ld: window %d of %d micro-batches (round trip %.0f ms%s)\n",
                       r->step, r->window, r->G, 1000.0 * in.rtt,
                       in.work[0] > 0 ? "" : ", stages not measured yet");
            r->window_shown = r->window;
        }
    }
    r->window_sum += r->window;
    r->window_n++;
}

// What micro-batch b owes now: the backward of each stage whose forward
// ran (or runs) and whose BWD is not sent, in forward up to the stage it
// is at, in backward below it (the last stage's runs in its FWD); none
// while evaluating. Each owing peer holds it in owed[] (2 thirds of a
// micro-batch's work: the router prefers to send the BWD there, where the
// activations are).
static int s_owing(const swarm_engine_t *r, const mb_t *b)
{
    int S = r->stages;
    int owes = r->evaluating || b->stage < 0 || b->stage >= S ? 0
             : b->backward ? b->stage : b->stage + 1;
    return owes < S - 1 ? owes : S - 1;
}

// Micro-batch b's part in owed[] added (sign 1, at its place now) or taken
// away (-1).
static void s_owes(swarm_engine_t *r, mb_t *b, int sign)
{
    if (sign > 0)
        b->owes = s_owing(r, b);
    for (int k = 0; k < b->owes; k++) {
        r->owed[b->fwd_peer[k]] += 2 * sign;
        engine_route_touch(r, b->fwd_peer[k]);
    }
    if (sign < 0)
        b->owes = 0;
}

void engine_mb_at(swarm_engine_t *r, int i, int stage, int backward, int fwd_peer)
{
    mb_t *b = &r->mbs[i];
    int S = r->stages;
    s_owes(r, b, -1);
    r->mb_count[engine_mb_place(S, b->stage, b->backward)]--;
    b->stage = stage;
    b->backward = backward;
    if (fwd_peer >= 0)
        b->fwd_peer[stage] = fwd_peer;
    r->mb_count[engine_mb_place(S, stage, backward)]++;
    s_owes(r, b, 1);
    if (stage == -1 && i < r->mb_next)
        r->mb_next = i;
}

int engine_mb_count(const swarm_engine_t *r, int lo, int hi)
{
    int n = 0;
    for (int k = lo; k < hi; k++)
        n += r->mb_count[k];
    return n;
}

int engine_outputs_used(const swarm_engine_t *r, int p)
{
    for (int i = 0; r->mbs && i < r->G; i++)
        for (int s = 0; s < r->stages; s++)
            if ((r->mbs[i].fwd_peer[s] == p && r->mbs[i].in[s + 1]) || r->mbs[i].dx_peer[s] == p)
                return 1;
    return 0;
}

int engine_mb_recount(const swarm_engine_t *r)
{
    int S = r->stages, count[MB_PLACES] = {0}, queued = 0, bad = 0;
    int *owed = calloc((size_t) r->peers_cap + 1, sizeof *owed);
    if (!owed)
        return -ENOMEM;
    for (int i = 0; i < r->G; i++) {
        const mb_t *b = &r->mbs[i];
        count[engine_mb_place(S, b->stage, b->backward)]++;
        bad |= b->stage == -1 && !b->tokens && i < r->mb_next;
        bad |= b->owes != s_owing(r, b);
        for (int k = 0; k < b->owes; k++)
            owed[b->fwd_peer[k]] += 2;
        queued += b->retry_kind != 0;
    }
    bad |= queued != r->retry_n;
    for (int q = 0; q < 2; q++)
        for (int s = 0; s < S; s++)
            for (int i = r->retry_head[q][s]; i >= 0; i = r->mbs[i].retry_next)
                bad |= r->mbs[i].retry_kind != (q ? R_BWD : R_FWD), queued--;
    for (int s = 0; s < S; s++) {
        int wanted = 0;
        for (int i = 0; i < r->G; i++)
            wanted += r->mbs[i].redo_wanted[s];
        for (int i = r->redo_head[s]; i >= 0; i = r->mbs[i].redo_next[s])
            bad |= !r->mbs[i].redo_wanted[s], wanted--;
        bad |= wanted != 0;
    }
    bad |= queued != 0 || engine_mb_count(r, 0, MB_PLACES) != r->G;
    for (int k = 0; k < MB_PLACES; k++)
        bad |= count[k] != r->mb_count[k];
    for (int p = 0; p < r->peers_cap; p++)
        bad |= owed[p] != r->owed[p];
    free(owed);
    return bad ? -EPROTO : 0;
}

// Micro-batch b's buffers freed, itself idle (-1) and in no queue.
static void s_mb_free(swarm_engine_t *r, mb_t *b)
{
    for (int s = 0; s <= r->stages; s++)
        net_msg_destroy(&b->in[s]);
    free(b->tokens);
    free(b->targets);
    for (int s = 0; s < r->stages; s++)
        net_msg_destroy(&b->dy[s]);
    for (int s = 0; b->spot && s < r->stages; s++) {
        r->spots_open -= b->spot[s].n > 0;
        for (int k = 0; k < 3; k++)
            free(b->spot[s].out[k]);
    }
    free(b->spot);
    *b = (mb_t) { .stage = -1, .retry_next = -1 };
    for (int s = 0; s < r->stages; s++)
        b->grad_peer[s] = b->dx_peer[s] = b->redo_next[s] = -1;
    r->grad_gen++; // (engine_share)
}

void engine_mbs_clear(swarm_engine_t *r)
{
    for (int i = 0; r->mbs && i < r->G; i++) {
        s_owes(r, &r->mbs[i], -1);
        s_mb_free(r, &r->mbs[i]);
    }
    memset(r->mb_count, 0, sizeof r->mb_count);
    r->mb_count[engine_mb_place(r->stages, -1, 0)] = r->G;
    r->mb_next = 0;
    r->retry_n = 0;
    for (int s = 0; s < SWARM_MAX_STAGES; s++)
        r->retry_head[0][s] = r->retry_head[1][s] = r->retry_tail[0][s] = r->retry_tail[1][s]
            = r->redo_head[s] = r->redo_tail[s] = -1;
}

// The FWD message of micro-batch i at stage s.
net_msg_t *engine_fwd_msg(swarm_engine_t *r, int i, int s)
{
    mb_t *b = &r->mbs[i];
    int S = r->stages, T = r->hp.cfg.T, micro = r->hp.micro;
    net_msg_t *m = net_msg_new(NET_MSG_FWD);
    net_head_t *h = net_msg_head(m);
    h->step = (uint64_t) r->step;
    h->stage = (uint32_t) s;
    h->mb = (uint32_t) (r->evaluating ? EVAL_MB + i : i);
    uint32_t tok_dims[2] = { (uint32_t) micro, (uint32_t) T };
    char meta[256] = "";
    int rc = s == 0 ? net_msg_add_raw(m, NET_DTYPE_I32, tok_dims, 2, b->tokens, r->tok_bytes)
                    : engine_acts_add(r, m, b->in[s], b->in_pow2[s], meta, sizeof meta);
    if (rc == 0 && s == S - 1) {
        rc = net_msg_add_raw(m, NET_DTYPE_I32, tok_dims, 2, b->targets, r->tok_bytes);
        if (r->evaluating)
            strcat(meta, "eval=1\n");
        else
            snprintf(meta + strlen(meta), sizeof meta - strlen(meta), "scale=%a\n",
                     1.0f / (float) ((double) r->hp.batch * T));
    }
    if (rc == 0 && meta[0])
        rc = engine_meta(m, "%s", meta);
    if (rc != 0)
        net_msg_destroy(&m);
    return m;
}

// The BWD message of micro-batch i at stage s (< S-1): its input and dy.
net_msg_t *engine_bwd_msg(swarm_engine_t *r, int i, int s)
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
    int rc = s == 0 ? net_msg_add_raw(m, NET_DTYPE_I32, tok_dims, 2, b->tokens, r->tok_bytes)
                    : engine_acts_add(r, m, b->in[s], b->in_pow2[s], meta, sizeof meta);
    if (rc == 0)
        rc = engine_acts_add(r, m, b->dy[s], b->dy_pow2[s], meta, sizeof meta);
    if (rc == 0 && meta[0])
        rc = engine_meta(m, "%s", meta);
    if (rc != 0)
        net_msg_destroy(&m);
    return m;
}

// The best ready peer of stage s, but none of not[], for `work` (of a
// micro-batch's training work: 1/3 a forward alone; a forward and the
// backward it brings, or a backward recomputed away from its activations,
// 1); prefer: who holds the activations, or -1. -EAGAIN when none can.
// The policy sees the stage's ready peers only (their rows,
// engine_route_views), in index order as in the whole table, so it picks
// the same peer.
int engine_pick_but(swarm_engine_t *r, int s, int prefer, double work, const int *not, int nnot)
{
    int n, was[4];
    swarm_peer_view_t *views = engine_route_views(r, s, &n);
    const swarm_rows_t *rows = engine_route_rows(r, s); // (the same rows, by speed)
    assert(nnot <= (int) (sizeof was / sizeof was[0]));
    for (int k = 0; k < nnot; k++) { // out of this pick only
        int at = engine_ready_at(r, s, not[k]);
        was[k] = at >= 0 ? views[at].ready : 0;
        if (at >= 0)
            views[at].ready = 0;
    }
    int holder = engine_ready_at(r, s, prefer);
    double tokens = work * r->hp.micro * r->hp.cfg.T;
    int k = swarm_policy_pick_in(rows, s, holder, tokens);
#ifdef SWARM_CHECK
    assert(k == swarm_policy_pick(views, n, s, holder, tokens));
#endif
    for (int j = nnot - 1; j >= 0; j--) {
        int at = engine_ready_at(r, s, not[j]);
        if (at >= 0)
            views[at].ready = was[j];
    }
    return k < 0 ? -EAGAIN : r->ready[s].peer[k];
}

static int s_pick(swarm_engine_t *r, int s, int prefer, double work)
{
    return engine_pick_but(r, s, prefer, work, NULL, 0);
}

// Forwards of this step not yet sent to stage s: micro-batches waiting
// or in forward before it.
static int s_forwards_left(const swarm_engine_t *r, int s)
{
    return engine_mb_count(r, 0, engine_mb_place(r->stages, s, 0));
}

// The replica of stage s for a training forward, `left` forwards of the
// step still to go there (swarm_policy_pick_fit). -EAGAIN when none can.
// A forward held back is held again, without a look at the rows, until one
// of them changes or the forwards left do: the policy would answer the same.
static int s_pick_fit(swarm_engine_t *r, int s, int left)
{
    engine_route_t *rt = &r->route[s];
    if (rt->held_gen == rt->gen && rt->held_left == left)
        return -EAGAIN;
    const swarm_rows_t *rows = engine_route_rows(r, s);
    double work = (double) r->hp.micro * r->hp.cfg.T;
    int k = swarm_policy_pick_fit_in(rows, s, work, left);
#ifdef SWARM_CHECK
    assert(k == swarm_policy_pick_fit(rows->view, rows->n, s, work, left));
#endif
    if (k == SWARM_HOLD) {
        rt->held_gen = rt->gen;
        rt->held_left = left;
    }
    return k < 0 ? -EAGAIN : r->ready[s].peer[k];
}

// FWD of micro-batch i at stage s to the best ready peer.
int engine_fwd(swarm_engine_t *r, int i, int s)
{
    // a training forward brings its backward (the last stage runs both)
    int p = r->evaluating ? s_pick(r, s, -1, 1.0 / 3.0) : s_pick_fit(r, s, s_forwards_left(r, s));
    net_msg_t *m = p >= 0 ? engine_fwd_msg(r, i, s) : NULL;
    if (!m)
        return p < 0 ? p : -ENOMEM;
    engine_mb_at(r, i, s, 0, p);
    return engine_send(r, p, &m, R_FWD, i, s);
}

// BWD of micro-batch i at stage s (< S-1), to its forward's peer, which
// holds the activations. Once the stage has no forwards left to do this
// step, a replica that would be through everything it holds sooner, even
// recomputing the forward, takes it instead: a slow replica's backwards
// do not hold up the end of the step.
static int s_bwd(swarm_engine_t *r, int i, int s)
{
    int holder = r->mbs[i].fwd_peer[s];
    int p = holder >= 0 && holder < r->npeers && r->peers[holder].state == P_READY
                    && !r->peers[holder].failed && r->peers[holder].stage == s
                    && s_forwards_left(r, s) > 0
                ? holder
                : s_pick(r, s, holder, 1.0);
    net_msg_t *m = p >= 0 ? engine_bwd_msg(r, i, s) : NULL;
    if (!m)
        return p < 0 ? p : -ENOMEM;
    engine_mb_at(r, i, s, 1, -1);
    return engine_send(r, p, &m, R_BWD, i, s);
}

// Re-run the gradient-accumulating work of micro-batch i at stage s (a
// dead peer held it) on another replica; its outputs are not needed.
static int s_redo(swarm_engine_t *r, int i, int s)
{
    int last = s == r->stages - 1;
    int p = s_pick(r, s, -1, 1.0);
    net_msg_t *m = p < 0 ? NULL : last ? engine_fwd_msg(r, i, s) : engine_bwd_msg(r, i, s);
    if (!m)
        return p < 0 ? p : -ENOMEM;
    engine_grad_peer_set(r, i, s, -1);
    int rc = engine_send(r, p, &m, last ? R_FWD : R_BWD, i, s);
    if (rc == 0) {
        engine_req_find(r, r->last_id)->redo = 1;
        r->redo_pending++;
    }
    return rc;
}

// Micro-batch i's next request, `kind` at stage s, waits for a peer: at
// the end of that stage's queue of its kind (engine_retry sends it).
static void s_retry_put(swarm_engine_t *r, int i, int kind, int s)
{
    mb_t *b = &r->mbs[i];
    int q = kind == R_BWD;
    assert(!b->retry_kind); // a micro-batch has one request to make at a time
    b->retry_kind = kind;
    b->retry_next = -1;
    if (r->retry_tail[q][s] >= 0)
        r->mbs[r->retry_tail[q][s]].retry_next = i;
    else
        r->retry_head[q][s] = i;
    r->retry_tail[q][s] = i;
    r->retry_n++;
}

// The first of stage s's queue q (0 FWD, 1 BWD) was sent: off the queue.
static void s_retry_pop(swarm_engine_t *r, int q, int s)
{
    mb_t *b = &r->mbs[r->retry_head[q][s]];
    r->retry_head[q][s] = b->retry_next;
    if (b->retry_next < 0)
        r->retry_tail[q][s] = -1;
    b->retry_kind = 0;
    b->retry_next = -1;
    r->retry_n--;
}

void engine_redo_want(swarm_engine_t *r, int i, int s)
{
    mb_t *b = &r->mbs[i];
    if (b->redo_wanted[s])
        return;
    b->redo_wanted[s] = 1;
    b->redo_next[s] = -1;
    if (r->redo_tail[s] >= 0)
        r->mbs[r->redo_tail[s]].redo_next[s] = i;
    else
        r->redo_head[s] = i;
    r->redo_tail[s] = i;
}

// The first of stage s's work to re-run was sent: off the queue.
static void s_redo_pop(swarm_engine_t *r, int s)
{
    mb_t *b = &r->mbs[r->redo_head[s]];
    r->redo_head[s] = b->redo_next[s];
    if (b->redo_next[s] < 0)
        r->redo_tail[s] = -1;
    b->redo_wanted[s] = 0;
    b->redo_next[s] = -1;
    r->redo_pending--; // counted when it was wanted
}

// Send the next request of micro-batch i, or queue it for a later turn
// when no peer of the stage can take it now (never lose a micro-batch).
int engine_next(swarm_engine_t *r, int i, int kind, int s)
{
    int rc = kind == R_FWD ? engine_fwd(r, i, s) : s_bwd(r, i, s);
    if (rc != 0)
        s_retry_put(r, i, kind, s);
    return 0;
}

// Send what waits, each stage's queues first in first out: a stage that
// holds a forward back (swarm_policy_pick_fit) holds the ones behind it
// too until something changes, and a BWD or a re-run that finds no peer
// (none is ready) the ones behind it. O(stages) when nothing waits.
void engine_retry(swarm_engine_t *r)
{
    for (int s = 0; (r->retry_n > 0 || r->redo_pending > 0) && s < r->stages; s++) {
        for (int q = 0; q < 2; q++) {
            while (r->retry_head[q][s] >= 0) {
                int i = r->retry_head[q][s];
                if ((q ? s_bwd(r, i, s) : engine_fwd(r, i, s)) != 0)
                    break;
                s_retry_pop(r, q, s);
            }
        }
        while (r->redo_head[s] >= 0 && s_redo(r, r->redo_head[s], s) == 0)
            s_redo_pop(r, s);
    }
}

// Start micro-batch i of the current step.
int engine_mb_start(swarm_engine_t *r, int i)
{
    mb_t *b = &r->mbs[i];
    int T = r->hp.cfg.T, micro = r->hp.micro;
    b->tokens = malloc(r->tok_bytes);
    b->targets = malloc(r->tok_bytes);
    if (!b->tokens || !b->targets)
        abort();
    swarm_data_train_batch(r->data, r->hp.seed, r->step, r->hp.batch, i * micro, micro, T,
                           b->tokens, b->targets);
    int rc = engine_fwd(r, i, 0);
    if (rc != 0) {
        engine_mb_at(r, i, -1, 0, -1);
        s_mb_free(r, b);
    }
    return rc;
}

// Keep a FWD/BWD reply whose tensor 0 is activations or their gradient in
// any float format in *dst (replacing what was there; its frames shared,
// not copied), and its scale; the next stage decodes it. -EPROTO when it
// is not.
static int s_acts_keep(const swarm_engine_t *r, const net_msg_t *m, net_msg_t **dst, int8_t *pow2)
{
    const net_head_t *h = net_msg_head_const(m);
    size_t bytes = 0;
    int k = 0, dt = h->ntensors > 0 ? h->tensors[0].dtype : 0;
    if ((dt != NET_DTYPE_F32 && dt != NET_DTYPE_F16 && dt != NET_DTYPE_I8)
        || net_tensor_pow2(m, 0, &k) != 0)
        return -EPROTO;
    const void *p = net_msg_raw(m, 0, &bytes);
    if (!p || bytes != net_codec_bytes(dt, engine_acts_count(r)))
        return -EPROTO;
    net_msg_destroy(dst);
    if (!(*dst = net_msg_dup(m)))
        abort(); // bookkeeping (STYLE.md: small allocations may abort)
    *pow2 = (int8_t) k;
    return 0;
}

// A peer's speed is measured, not believed: training tokens of work it
// finished per second it was busy (a token's forward is a third of its
// work, its backward two thirds; the last stage does both at once, and an
// audit, which recomputes the forward for its backward, both too). It is
// sampled every half second of busy time into an average, so a peer that
// queues requests is not mistaken for a slow one. Its routing row is
// written afresh (with what the caller measured of the reply before).
void engine_work_done(swarm_engine_t *r, const req_t *q)
{
    peer_t *pe = &r->peers[q->peer];
    double tokens = (double) r->hp.micro * r->hp.cfg.T;
    int last = q->stage == r->stages - 1;
    pe->work += q->kind == R_AUDIT ? tokens : q->kind == R_BWD ? tokens * 2.0 / 3.0
              : last && !r->evaluating ? tokens : tokens / 3.0;
    double busy = engine_busy_s(pe, r->now_ms);
    if (busy - pe->rate_busy >= 0.2) {
        double rate = (pe->work - pe->rate_work) / (busy - pe->rate_busy);
        pe->tok_s = pe->samples > 0 ? 0.5 * pe->tok_s + 0.5 * rate : rate;
        pe->samples++;
        pe->rate_busy = busy;
        pe->rate_work = pe->work;
    }
    engine_route_touch(r, q->peer);
}

// A RESULT of FWD or BWD for micro-batch q->mb. -EPROTO for a bad reply.
int engine_on_result(swarm_engine_t *r, const req_t *q, const msg_in_t *e)
{
    const net_msg_t *m = e->msg;
    int S = r->stages, s = q->stage;
    s_peer_timing(&r->peers[q->peer], q->kind == R_BWD, &e->reply,
                  (double) (r->now_ms - q->sent) / 1000.0);
    engine_work_done(r, q); // (one touch of its row for both)
    if (q->mb < 0)
        return 0; // of a step its stage finished itself (s_step_apply_ask): counted
    mb_t *b = &r->mbs[q->mb];
    int accumulates = !r->evaluating && (q->kind == R_BWD || s == S - 1);
    if (accumulates)
        engine_grad_peer_set(r, q->mb, s, q->peer);
    if (q->redo) {
        r->redo_pending--;
        return 0;
    }
    if (q->kind == R_FWD && s < S - 1) {
        if (s_acts_keep(r, m, &b->in[s + 1], &b->in_pow2[s + 1]) != 0)
            return -EPROTO;
        engine_spot_begin(r, q, 0.0f); // (the scratch still holds the outputs)
        return engine_next(r, q->mb, R_FWD, s + 1);
    }
    if (q->kind == R_FWD) {
        if (!e->reply.has_loss)
            return -EPROTO; // (checked already: s_check_loss)
        b->loss = e->reply.loss;
        engine_spot_begin(r, q, b->loss);
        if (S == 1 || r->evaluating) {
            engine_mb_at(r, q->mb, S, b->backward, -1);
            return 0;
        }
        if (s_acts_keep(r, m, &b->dy[S - 2], &b->dy_pow2[S - 2]) != 0)
            return -EPROTO;
        b->dx_peer[S - 1] = q->peer;
        return engine_next(r, q->mb, R_BWD, S - 2);
    }
    if (s == 0) {
        engine_mb_at(r, q->mb, S, b->backward, -1); // through
        return 0;
    }
    if (s_acts_keep(r, m, &b->dy[s - 1], &b->dy_pow2[s - 1]) != 0)
        return -EPROTO;
    b->dx_peer[s] = q->peer;
    return engine_next(r, q->mb, R_BWD, s - 1);
}
