/* engine_peers.c - the peer table: HELLO, admission to a stage, the
 * entries of the dead and their reuse, each stage's ready peers, the views
 * the policy sees (of the whole table, or of one stage's ready peers for a
 * routing pick), and joiners getting their stage's state. Deaths and bans:
 * engine_fail.c.
 */
#include "engine_int.h"

#include <assert.h>

// ---- each stage's ready peers (engine_ready_t): kept in ascending index
// as peers come and go, so that finding them costs O(replicas), not a scan
// of the table ----

// Where p is or would go in l: the first entry not below it.
static int s_ready_slot(const engine_ready_t *l, int p)
{
    int lo = 0, hi = l->n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (l->peer[mid] < p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

void engine_list_add(engine_ready_t *l, int p)
{
    int k = s_ready_slot(l, p);
    if (k < l->n && l->peer[k] == p)
        return;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 8;
        int *peer = realloc(l->peer, (size_t) cap * sizeof *peer);
        if (!peer)
            abort(); // bookkeeping (STYLE.md: small allocations may abort)
        l->peer = peer;
        l->cap = cap;
    }
    memmove(&l->peer[k + 1], &l->peer[k], (size_t) (l->n - k) * sizeof l->peer[0]);
    l->peer[k] = p;
    l->n++;
}

static void s_ready_del(engine_ready_t *l, int p)
{
    int k = s_ready_slot(l, p);
    assert(k < l->n && l->peer[k] == p);
    memmove(&l->peer[k], &l->peer[k + 1], (size_t) (l->n - k - 1) * sizeof l->peer[0]);
    l->n--;
}

// Ready peers of l from place k on were moved: each is told its place.
static void s_ready_places(swarm_engine_t *r, const engine_ready_t *l, int k)
{
    for (; k < l->n; k++)
        r->peers[l->peer[k]].ready_k = k;
}

static void s_route_forget(engine_route_t *rt, int p);
static void s_list_del(engine_ready_t *l, int p);

void engine_peer_state(swarm_engine_t *r, int p, int state)
{
    peer_t *pe = &r->peers[p];
    assert(pe->state != P_READY || (pe->stage >= 0 && pe->stage < r->stages));
    assert(state != P_READY || (pe->stage >= 0 && pe->stage < r->stages));
    if (pe->state == P_READY) {
        engine_ready_t *l = &r->ready[pe->stage];
        engine_route_t *rt = &r->route[pe->stage];
        int k = s_ready_slot(l, p);
        memmove(&rt->view[k], &rt->view[k + 1], (size_t) (l->n - k - 1) * sizeof rt->view[0]);
        s_ready_del(l, p);
        s_ready_places(r, l, k);
        s_route_forget(rt, p);
        rt->gen++;
        engine_audits_touch(r, pe->stage);
    }
    if (pe->state == P_JOINING)
        s_list_del(&r->joining, p);
    if (state == P_JOINING)
        engine_list_add(&r->joining, p);
    pe->state = state;
    if (state == P_READY) {
        assert(engine_ready_at(r, pe->stage, p) < 0);
        engine_ready_t *l = &r->ready[pe->stage];
        engine_route_t *rt = &r->route[pe->stage];
        engine_list_add(l, p);
        swarm_peer_view_t *view = realloc(rt->view, (size_t) l->cap * sizeof *view);
        if (!view)
            abort(); // bookkeeping (STYLE.md: small allocations may abort)
        rt->view = view;
        int k = s_ready_slot(l, p);
        memmove(&view[k + 1], &view[k], (size_t) (l->n - 1 - k) * sizeof view[0]);
        s_ready_places(r, l, k);
        engine_route_touch(r, p);
        engine_audits_touch(r, pe->stage);
    }
}

int engine_joining_to(const swarm_engine_t *r, int stage)
{
    for (int k = 0; k < r->joining.n; k++)
        if (r->peers[r->joining.peer[k]].stage == stage)
            return 1;
    return 0;
}

// Peer p's place among the ready peers of `stage`, or -1 when it is not one:
// the place it was given (s_ready_places), where it still holds, else a
// binary search (a routing pick's peer is looked up several times a reply).
int engine_ready_at(const swarm_engine_t *r, int stage, int p)
{
    if (stage < 0 || stage >= r->stages || p < 0)
        return -1;
    const engine_ready_t *l = &r->ready[stage];
    int k = r->peers[p].ready_k;
    if (k >= 0 && k < l->n && l->peer[k] == p)
        return k;
    k = s_ready_slot(l, p);
    return k < l->n && l->peer[k] == p ? k : -1;
}


int engine_ready_count(const swarm_engine_t *r, int stage)
{
    if (stage >= 0)
        return stage < r->stages ? r->ready[stage].n : 0;
    int n = 0;
    for (int s = 0; s < r->stages; s++)
        n += r->ready[s].n;
    return n;
}

// ---- the views the policy sees ----

// What peer p holds, in training tokens (swarm_peer_view_t.backlog): its
// FWD/BWD requests in flight and the backwards it owes for the forwards it
// ran this step whose BWD is not sent yet (owed[], engine_mb_at).
static double s_backlog(const swarm_engine_t *r, int p)
{
    return (double) r->hp.micro * r->hp.cfg.T * (r->peers[p].held_thirds + r->owed[p]) / 3.0;
}

// Peer p as the policy sees it, with its speed tok_s and backlog.
static swarm_peer_view_t s_view(const peer_t *p, double tok_s, double backlog)
{
    return (swarm_peer_view_t) {
        .stage = p->stage, .ready = p->state == P_READY && !p->failed,
        .joining = p->state == P_JOINING, .inflight = p->inflight, .queue = p->queue,
        .backlog = backlog, .rtt = p->rtt, .tok_s = tok_s, .moved_at = p->moved_at,
        .memory = p->memory,
        // the seconds of compute its requests in flight take, as it reports
        // them (the router's own speed of a peer counts its link's time too)
        .ahead = p->held_kind[0] * p->busy[0] + p->held_kind[1] * p->busy[1],
    };
}

// A peer not measured yet is routed as fast as its stage's fastest measured
// replica (or its own first guess, when higher), so that it is handed work
// and measured: a guess a little low would lose every tie. But a guess
// under 1/GUESS_NEAR of that fastest is believed: its HELLO's claim (the
// node's benchmark) times the median, over the stage's measured replicas,
// of measure over claim. A slow joiner then gets a forward only where it
// is done by its stage's end of step (docs/scale.md, "A joiner far slower
// than its stage"). One under 1/GUESS_FAR is a liar's (slowclaim says a
// millionth of its speed): routed as the fastest, its work is held to the
// fastest's deadline too (a peer not measured yet whose word is under the
// deadlines' floor is timed as it is routed, engine_fail.c's s_work_ms),
// not to that floor, which, 1/20 of the median measured, is no line between
// the two (every CPU joining a stage of GPUs is under it).
#define GUESS_NEAR 4.0
#define GUESS_FAR 1000.0

// Peer pe's first guess (not measured yet, on a stage).
static double s_guess(const swarm_engine_t *r, const peer_t *pe)
{
    double ratio = r->route[pe->stage].ratio;
    return ratio > 0.0 && pe->hello_tok_s > 0.0 ? pe->hello_tok_s * ratio : pe->tok_s;
}

double engine_routed_tok_s(const swarm_engine_t *r, const peer_t *pe, double fastest)
{
    if (pe->samples > 0 || pe->stage < 0)
        return pe->tok_s;
    double guess = s_guess(r, pe);
    if (guess * GUESS_NEAR < fastest && guess * GUESS_FAR >= fastest)
        return guess;
    return fastest > pe->tok_s ? fastest : pe->tok_s;
}

int engine_claim_unbelieved(const swarm_engine_t *r, const peer_t *pe)
{
    if (pe->samples > 0 || pe->stage < 0 || pe->stage >= r->stages)
        return 0;
    return s_guess(r, pe) * GUESS_FAR < r->route[pe->stage].fastest;
}

int engine_route_held_back(swarm_engine_t *r, int p)
{
    const peer_t *pe = &r->peers[p];
    if (pe->state != P_READY || pe->samples > 0)
        return 0;
    int n;
    const swarm_peer_view_t *rows = engine_route_views(r, pe->stage, &n); // (and the fastest)
    return rows[engine_ready_at(r, pe->stage, p)].tok_s < r->route[pe->stage].fastest;
}

// What the measured ready replicas of stage s measure over what they
// claimed at start, into ratio[] from ratio[n]: the new n.
static int s_claims_worth(const swarm_engine_t *r, int s, double *ratio, int n)
{
    const engine_ready_t *l = &r->ready[s];
    for (int k = 0; k < l->n; k++) {
        const peer_t *pe = &r->peers[l->peer[k]];
        if (pe->samples > 0 && pe->hello_tok_s > 0.0)
            ratio[n++] = pe->tok_s / pe->hello_tok_s;
    }
    return n;
}

void engine_route_ratios(swarm_engine_t *r)
{
    double *ratio = r->by_peer; // scratch
    for (int s = 0; s < r->stages; s++) {
        engine_route_t *rt = &r->route[s];
        int n = s_claims_worth(r, s, ratio, 0);
        double was = rt->ratio;
        rt->ratio = n ? engine_median(ratio, n) : 0.0;
        if (rt->ratio != was && rt->unmeasured.n > 0) {
            rt->gen++; // its unmeasured rows read differently now
            rt->rows_fastest = -1.0;
        }
    }
}

// The peer table as the policy sees it: for routing (optimistic), a peer
// not measured yet at engine_routed_tok_s; rebalancing sees the speeds as
// measured (a newcomer at its first guess). O(peers): for what runs per
// event (admission, refills, rebalancing), not per request.
void engine_views_as(const swarm_engine_t *r, swarm_peer_view_t *v, int optimistic)
{
    double fastest[SWARM_MAX_STAGES] = {0};
    for (int i = 0; i < r->npeers; i++) {
        const peer_t *p = &r->peers[i];
        if (p->state == P_READY && p->samples > 0 && p->stage >= 0 && p->tok_s > fastest[p->stage])
            fastest[p->stage] = p->tok_s;
    }
    for (int i = 0; i < r->npeers; i++) {
        const peer_t *p = &r->peers[i];
        double tok_s = optimistic && p->stage >= 0 ? engine_routed_tok_s(r, p, fastest[p->stage])
                                                   : p->tok_s;
        v[i] = s_view(p, tok_s, s_backlog(r, i));
    }
}

void engine_views(const swarm_engine_t *r, swarm_peer_view_t *v)
{
    engine_views_as(r, v, 1);
}

// The speed a peer counts at in the bound (engine_stage_capacity): what
// the node says it sustains, unless the router doubts it or has not heard
// it yet (then the router's own measure, tok_s).
double engine_bound_speed(const peer_t *pe)
{
    return !pe->claim_doubted && pe->node_tok_s > 0.0 ? pe->node_tok_s : pe->tok_s;
}

// ---- the rows a routing pick reads (engine_route_t) ----

static void s_list_del(engine_ready_t *l, int p)
{
    int k = s_ready_slot(l, p);
    if (k < l->n && l->peer[k] == p)
        s_ready_del(l, p);
}

// p is no longer one of the stage's ready peers.
static void s_route_forget(engine_route_t *rt, int p)
{
    s_list_del(&rt->unmeasured, p);
    if (rt->fastest_peer == p)
        rt->fastest_peer = -1;
}

void engine_route_touch(swarm_engine_t *r, int p)
{
    const peer_t *pe = &r->peers[p];
    if (pe->state != P_READY)
        return;
    engine_route_t *rt = &r->route[pe->stage];
    int k = engine_ready_at(r, pe->stage, p);
    assert(k >= 0);
    rt->view[k] = s_view(pe, pe->tok_s, s_backlog(r, p));
    rt->gen++;
    if (pe->samples == 0) {
        engine_list_add(&rt->unmeasured, p);
        if (rt->fastest_peer == p)
            rt->fastest_peer = -1;
        if (rt->fastest_peer == -1)
            rt->rows_fastest = -1.0; // every row, once the fastest is found again
        else
            rt->view[k].tok_s = engine_routed_tok_s(r, pe, rt->fastest);
        return;
    }
    s_list_del(&rt->unmeasured, p);
    if (rt->fastest_peer != -1 && pe->tok_s >= rt->fastest) {
        rt->fastest = pe->tok_s;
        rt->fastest_peer = p;
    } else if (rt->fastest_peer == p) {
        rt->fastest_peer = -1; // slower now: another may be the fastest
    }
}

swarm_peer_view_t *engine_route_views(swarm_engine_t *r, int s, int *n)
{
    *n = 0;
    if (s < 0 || s >= r->stages)
        return NULL;
    const engine_ready_t *l = &r->ready[s];
    engine_route_t *rt = &r->route[s];
    *n = l->n;
    if (rt->unmeasured.n == 0)
        return rt->view;
    if (rt->fastest_peer == -1) { // found again: O(replicas), once each time the fastest slows or goes
        rt->fastest = 0.0;
        rt->fastest_peer = -2; // none measured
        for (int k = 0; k < l->n; k++) {
            const peer_t *pe = &r->peers[l->peer[k]];
            if (pe->samples > 0 && pe->tok_s > rt->fastest) {
                rt->fastest = pe->tok_s;
                rt->fastest_peer = l->peer[k];
            }
        }
    }
    if (rt->rows_fastest == rt->fastest)
        return rt->view;
    for (int j = 0; j < rt->unmeasured.n; j++) {
        int p = rt->unmeasured.peer[j];
        rt->view[engine_ready_at(r, s, p)].tok_s = engine_routed_tok_s(r, &r->peers[p], rt->fastest);
    }
    rt->rows_fastest = rt->fastest;
    return rt->view;
}

int engine_route_check(swarm_engine_t *r)
{
    int bad = 0;
    for (int s = 0; s < r->stages; s++) {
        int n;
        const swarm_peer_view_t *v = engine_route_views(r, s, &n);
        const engine_ready_t *l = &r->ready[s];
        double fastest = 0.0;
        int unmeasured = 0;
        for (int k = 0; k < l->n; k++) {
            const peer_t *pe = &r->peers[l->peer[k]];
            unmeasured += pe->samples == 0;
            if (pe->samples > 0 && pe->tok_s > fastest)
                fastest = pe->tok_s;
        }
        bad |= unmeasured != r->route[s].unmeasured.n;
        for (int k = 0; k < l->n; k++) {
            const peer_t *pe = &r->peers[l->peer[k]];
            swarm_peer_view_t w = s_view(pe, engine_routed_tok_s(r, pe, fastest), s_backlog(r, l->peer[k]));
            const swarm_peer_view_t *h = &v[k];
            bad |= w.stage != h->stage || w.ready != h->ready || w.joining != h->joining
                   || w.inflight != h->inflight || w.queue != h->queue || w.backlog != h->backlog
                   || w.ahead != h->ahead || w.rtt != h->rtt || w.tok_s != h->tok_s
                   || w.moved_at != h->moved_at || w.memory != h->memory;
        }
    }
    return bad ? -EPROTO : 0;
}

// Send a stage's state (params, m, v of the stage) to peer p.
static int s_send_state(swarm_engine_t *r, int p, const float *params, const float *m, const float *v)
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
    return engine_send(r, p, &msg, R_STATE, -1, s);
}

// Assign peer p to `stage` (as the answer to req, or unasked when NULL);
// its state follows between steps (engine_joins). 0 or -errno.
int engine_send_assign(swarm_engine_t *r, int p, int stage, const net_msg_t *req)
{
    peer_t *pe = &r->peers[p];
    net_msg_t *a = req ? net_msg_reply(req, NET_MSG_ASSIGN) : net_msg_new(NET_MSG_ASSIGN);
    net_msg_head(a)->stage = (uint32_t) stage;
    net_msg_head(a)->step = (uint64_t) r->step;
    const swarm_shape_t *c = &r->hp.cfg;
    int rc = engine_meta(a, "V=%d\nT=%d\nC=%d\nL=%d\nH=%d\nS=%d\nstage=%d\nmicro=%d\npeer=%d\n"
                         "beat_ms=%d\nwire=%s\ngrad_wire=%s\n%s%s%s", c->V, c->T, c->C, c->L, c->H,
                         r->stages, stage, r->hp.micro, pe->id, r->beat_ms, net_dtype_name(r->wire),
                         net_dtype_name(r->grad_wire), r->cut[0] ? "cut=" : "", r->cut,
                         r->cut[0] ? "\n" : "");
    if (rc == 0 && (rc = engine_emit(r, &pe->who, &a)) != 0) {
        pe->failed = r->failed_any = 1; // not connected: engine_reap finds it dead
        engine_route_touch(r, p);
    }
    net_msg_destroy(&a);
    if (rc != 0)
        return rc;
    engine_peer_state(r, p, P_JOINING); // out of its old stage's ready peers, if it was one
    pe->stage = stage;
    pe->beat_ms = r->beat_ms;
    pe->no_fit = 0;
    engine_member_line(r, p, 0, "swarm router: peer %d (%s, %s) joins stage %d\n", pe->id, pe->name,
                       pe->device, stage);
    return 0;
}

int swarm_beat_ms(const net_msg_t *m, char *said, size_t cap)
{
    char text[16], *end = NULL;
    int rc = net_msg_meta_get(m, "beat_ms", text, sizeof text);
    if (rc == -ENOENT)
        return 0;
    if (said && cap) {
        snprintf(said, cap, "%s", rc == 0 ? text : "(too long to be one)");
        for (char *c = said; *c; c++)
            *c = (unsigned char) *c < 0x20 || *c == 0x7f ? '?' : *c;
    }
    long ms = rc == 0 ? strtol(text, &end, 10) : -1;
    return rc == 0 && end != text && !*end && ms >= BEAT_MS && ms <= 60000 ? (int) ms : -1;
}

int engine_cmp_double(const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

double engine_median(double *v, int n)
{
    int k = n / 2, lo = 0, hi = n - 1;
    // Hoare's selection, the middle of three as the pivot; values ordered
    // to defeat the pivot (speeds peers claim are among them) are sorted
    // once 64 rounds have not found it
    for (int round = 0; lo < hi; round++) {
        if (round == 64) {
            qsort(v + lo, (size_t) (hi - lo + 1), sizeof *v, engine_cmp_double);
            break;
        }
        int mid = lo + (hi - lo) / 2;
        double a = v[lo], b = v[mid], c = v[hi];
        double pivot = a < b ? (b < c ? b : a < c ? c : a) : (a < c ? a : b < c ? c : b);
        int i = lo, j = hi;
        while (i <= j) {
            while (v[i] < pivot)
                i++;
            while (v[j] > pivot)
                j--;
            if (i <= j) {
                double t = v[i];
                v[i++] = v[j];
                v[j--] = t;
            }
        }
        if (k <= j)
            hi = j;
        else if (k >= i)
            lo = i;
        else
            break; // v[j+1 .. i-1] all equal the pivot
    }
    return v[k];
}

// A joiner's speed in the router's units (training tokens/s on a stage,
// see engine_work_done): what it measured at start, scaled by how the measured
// peers' speeds compare with what they measured at start (the median, so
// that one peer's false claim does not skew it).
static double s_hello_speed(const swarm_engine_t *r, double hello)
{
    double *ratio = r->by_peer; // scratch
    int n = 0;
    for (int s = 0; s < r->stages; s++)
        n = s_claims_worth(r, s, ratio, n);
    if (!n)
        return hello;
    return hello * engine_median(ratio, n);
}

// Peer p can hold no stage of the plan in the memory it has: it is told
// (a notice: it waits, and asks again with its next HELLO), the log says so
// once, and its entry waits as dead, with no ban, so its next HELLO is
// judged again.
static void s_no_stage_fits(swarm_engine_t *r, int p, const net_msg_t *req)
{
    peer_t *pe = &r->peers[p];
    int small = 0;
    for (int s = 1; s < r->stages; s++)
        small = r->stage_need[s] < r->stage_need[small] ? s : small;
    char why[96];
    snprintf(why, sizeof why, "holds no stage: its memory %.1f MiB < the %.1f MiB of stage %d",
             pe->memory / 1048576.0, r->stage_need[small] / 1048576.0, small);
    net_msg_t *m = req ? net_msg_reply(req, NET_MSG_ERROR) : net_msg_new(NET_MSG_ERROR);
    if (engine_meta(m, "reason=no stage of this swarm fits your --memory %.1f MiB: the smallest, "
                    "stage %d of %d, needs %.1f MiB (its state, a micro-batch's activations, "
                    "buffers); this node waits: start it with --memory %.0fM or more if the "
                    "machine has it\nnotice=1", pe->memory / 1048576.0, small, r->stages,
                    r->stage_need[small] / 1048576.0, ceil(r->stage_need[small] / 1048576.0)) == 0)
        s_ignore(engine_emit(r, &pe->who, &m));
    net_msg_destroy(&m);
    if (pe->state != P_DEAD)
        engine_peer_dead(r, p, why); // (its first time: the line)
    pe->banned_until = engine_secs(r);
    pe->no_fit = 1;
    snprintf(pe->why, sizeof pe->why, "%s", why);
}

void engine_admit(swarm_engine_t *r, int p, int stage, const net_msg_t *req)
{
    peer_t *pe = &r->peers[p];
    pe->failed = 0;
    pe->tok_s = s_hello_speed(r, pe->hello_tok_s);
    engine_speed_restart(pe, r->now_ms);
    if (stage >= 0) {
        s_ignore(engine_send_assign(r, p, stage, req));
        return;
    }
    swarm_peer_view_t *views = r->views;
    engine_views_as(r, views, 0);
    // the stages weighed as the bound and rebalancing weigh them: a ready
    // peer at what it sustains on its stage, a newcomer still joining at
    // its first guess (s_hello_speed: of a stage of the stages' mean cost)
    // on its stage (unscaled when the costs are unknown)
    double mean = 0.0;
    for (int k = 0; k < r->stages; k++)
        mean += r->stage_cost[k] / r->stages;
    for (int q = 0; q < r->npeers; q++) {
        const peer_t *pq = &r->peers[q];
        double cost = pq->stage >= 0 ? r->stage_cost[pq->stage] : 0.0;
        if (q != p && pq->state == P_READY)
            views[q].tok_s = engine_bound_speed(pq);
        else if (q != p && pq->state == P_JOINING && pq->samples == 0 && !pq->moving
                 && mean > 0.0 && cost > 0.0)
            views[q].tok_s = pq->tok_s * mean / cost;
    }
    swarm_peer_view_t me = views[p];
    stage = r->assign_even ? swarm_policy_assign_even(views, r->npeers, r->stages, r->stage_need, &me)
                           : swarm_policy_assign(views, r->npeers, r->stages, r->stage_need, &me);
    if (stage < 0) {
        s_no_stage_fits(r, p, req);
        return;
    }
    s_ignore(engine_send_assign(r, p, stage, req));
}

// The step's gradient sums are being gathered: a dead peer's sum that came
// in counts in its stage's update (engine_on_dead_peer, engine_backs).
static int s_sums_open(const swarm_engine_t *r)
{
    return r->phase == PH_MB || r->phase == PH_GRAD;
}

// A peer the router declared dead talks again (HELLO or HEARTBEAT; e NULL:
// it did so while its sum counted): once its ban is over it joins again,
// with fresh state; until then it is told once why it waits. One whose
// gradient sum came in before it died waits while the step's sums are
// gathered too: its sum counts in its stage's update (its micro-batches
// are not redone), and joining would give its entry, sum and all, another
// stage. It is heard once they are in (engine_backs).
void engine_on_dead_peer(swarm_engine_t *r, int p, const msg_in_t *e)
{
    peer_t *pe = &r->peers[p];
    double now = engine_secs(r);
    if (pe->got_grad && s_sums_open(r)) {
        pe->back_waits = 1;
        r->backs_waiting = 1;
        return;
    }
    pe->back_waits = 0;
    if (now >= pe->banned_until) {
        if (!pe->no_fit) // (one that fits no stage asks again quietly)
            engine_member_line(r, p, 0, "swarm router: peer %d (%s) is back after it %s; it joins "
                               "again\n", pe->id, pe->name, pe->why);
        engine_admit(r, p, -1, e && e->head->type == NET_MSG_HELLO ? e->msg : NULL);
    } else if (!pe->ban_told) {
        net_msg_t *err = net_msg_new(NET_MSG_ERROR);
        int rc = isinf(pe->banned_until)
                 ? engine_meta(err, "reason=expelled for the run: it %s", pe->why)
                 : engine_meta(err, "reason=banned for %.0f s more: it %s", pe->banned_until - now, pe->why);
        if (rc == 0)
            s_ignore(engine_emit(r, &pe->who, &err));
        net_msg_destroy(&err);
        pe->ban_told = 1;
    }
}

// The dead peers that spoke while their sums counted, heard once the
// step's sums are in, or void, or a new step began (engine_turn,
// engine_step_begin, before its phase is the gathering's).
void engine_backs(swarm_engine_t *r)
{
    if (!r->backs_waiting || s_sums_open(r))
        return;
    r->backs_waiting = 0;
    for (int p = 0; p < r->npeers; p++) {
        if (!r->peers[p].back_waits)
            continue;
        if (r->peers[p].state == P_DEAD)
            engine_on_dead_peer(r, p, NULL);
        else
            r->peers[p].back_waits = 0;
    }
}

// Peer p's entry is named by the current step: gradient work it holds or
// sent, its part in STEP or UPDATE, a request in flight. (A forward it ran
// may name it too: the backward then goes to whoever takes the entry,
// which recomputes, as any replica can.)
static int s_peer_in_step(const swarm_engine_t *r, int p)
{
    const peer_t *pe = &r->peers[p];
    if (pe->got_grad || pe->in_step || pe->self_to || pe->inflight > 0 || r->self_peer == p)
        return 1;
    for (int i = 0; r->mbs && i < r->G; i++)
        for (int s = 0; s < r->stages; s++)
            if (r->mbs[i].grad_peer[s] == p)
                return 1;
    return 0;
}

// An entry for a new peer: that of the peer dead longest whose ban is over
// and that has no part in this step, once PEERS_KEEP_DEAD entries are
// dead (a dead peer's entry keeps its ban and its back-off, should it
// return), else a new one. -ENOMEM.
static int s_peer_slot(swarm_engine_t *r)
{
    int best = -1, dead = 0;
    double now = engine_secs(r);
    for (int p = 0; p < r->npeers; p++) {
        const peer_t *pe = &r->peers[p];
        if (pe->state != P_DEAD)
            continue;
        dead++;
        if (pe->banned_until <= now && (best < 0 || pe->last_seen < r->peers[best].last_seen)
            && !s_peer_in_step(r, p)) // (a scan of the step's micro-batches: last)
            best = p;
    }
    if (best >= 0 && dead >= PEERS_KEEP_DEAD) {
        free(r->peers[best].grad);
        free(r->peers[best].audit_sums);
        engine_key_del(r, best);
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
        double *by_peer = views ? realloc(r->by_peer, (size_t) cap * sizeof *by_peer) : NULL;
        if (by_peer)
            r->by_peer = by_peer;
        int *owed = by_peer ? realloc(r->owed, (size_t) cap * sizeof *owed) : NULL;
        if (!owed)
            return -ENOMEM;
        memset(owed + r->peers_cap, 0, (size_t) (cap - r->peers_cap) * sizeof *owed);
        r->owed = owed;
        r->peers_cap = cap;
    }
    return r->npeers++;
}

// A HELLO: check the protocol, assign a stage, answer ASSIGN. The state
// follows when the swarm is between steps (engine_joins).
void engine_on_hello(swarm_engine_t *r, const net_peer_t *who, const msg_in_t *e)
{
    const msg_hello_t *hello = &e->hello;
    char note[64];
    if (!hello->proto_ok) {
        const char *proto = hello->proto;
        net_msg_t *err = net_msg_reply(e->msg, NET_MSG_ERROR);
        engine_meta(err, "reason=protocol version %s, router speaks 1; upgrade swarm", proto[0] ? proto : "?");
        if (engine_loud(r, who->key, note, sizeof note))
            engine_warn(r, "swarm router: refused %.8s...: protocol version %s, not 1%s\n",
                        who->key, proto[0] ? proto : "missing", note);
        s_ignore(engine_emit(r, who, &err));
        return;
    }
    int p = engine_peer_find(r, who);
    if (p < 0) {
        if ((p = s_peer_slot(r)) < 0) {
            engine_warn(r, "swarm router: out of memory for the peer table (%d peers); "
                        "ignoring %s\n", r->npeers, hello->name);
            return;
        }
        r->peers[p] = (peer_t) { .who = *who, .id = ++r->next_peer_id, .stage = -1, .moved_at = -1e30,
                                 .audit_of = -1 };
        if (engine_key_put(r, p) != 0) {
            engine_warn(r, "swarm router: out of memory for the peer index (%d peers); "
                        "ignoring %s\n", r->npeers, hello->name);
            engine_peer_state(r, p, P_DEAD); // an entry no message can reach, reused later
            return;
        }
    }
    peer_t *pe = &r->peers[p];
    snprintf(pe->name, sizeof pe->name, "%s", hello->name);
    snprintf(pe->device, sizeof pe->device, "%s", hello->device);
    pe->hello_tok_s = hello->has_tok_s ? hello->tok_s : 1000.0;
    pe->memory = hello->memory;
    pe->last_seen = r->now_ms;
    engine_route_touch(r, p);
    if (pe->state == P_READY || pe->state == P_JOINING)
        return; // a repeated HELLO: the ASSIGN is on its way
    if (pe->state == P_DEAD)
        engine_on_dead_peer(r, p, e);
    else
        engine_admit(r, p, -1, e->msg);
}

int engine_state_source(const swarm_engine_t *r, int s, double draw)
{
    const engine_ready_t *l = &r->ready[s];
    int n = l->n, from = -1;
    for (int k = 0; k < n; k++) { // from the drawn one on
        int p = l->peer[((int) (draw * n) + k) % n];
        const peer_t *pe = &r->peers[p];
        if (pe->failed || (from >= 0 && pe->state_missed >= r->peers[from].state_missed))
            continue;
        from = p;
        if (pe->state_missed == 0)
            break;
    }
    return from;
}

// Between steps: hand joining peers their stage's state, from the router's
// own copy before training starts, else from a ready replica (STATE_GET).
void engine_joins(swarm_engine_t *r)
{
    for (int k = 0; k < r->joining.n; k++) { // (what it sends changes no peer's state)
        int p = r->joining.peer[k];
        peer_t *pe = &r->peers[p];
        if (pe->inflight > 0)
            continue;
        if (!r->started) {
            s_ignore(s_send_state(r, p, r->params, r->m, r->v));
            continue;
        }
        // a ready replica drawn with the run's secret key: a liar cannot make
        // itself the source (and the state is checked against its checksum)
        int from = engine_state_source(r, pe->stage, engine_draw(r, DRAW_SOURCE, pe->stage, pe->id));
        if (from >= 0) {
            net_msg_t *g = net_msg_new(NET_MSG_STATE_GET);
            net_msg_head(g)->stage = (uint32_t) pe->stage;
            // the reply is forwarded to the joiner: remember it in mb. Held
            // until its state arrives; a send that failed holds nothing (the
            // replica is found dead, and the joiner asks again)
            if (engine_send(r, from, &g, R_STATE_GET, p, pe->stage) == 0)
                pe->inflight++;
        }
    }
}

// What stage s's ready replicas say they sustain together (their HEARTBEATs).
double engine_stage_capacity(const swarm_engine_t *r, int s)
{
    double tok = 0.0;
    for (int k = 0; k < r->ready[s].n; k++) {
        const peer_t *pe = &r->peers[r->ready[s].peer[k]];
        tok += engine_bound_speed(pe);
    }
    return tok;
}

// The swarm's bound: the least, over stages, of what the stage's replicas
// sustain together; no schedule can beat it.
double engine_bound(const swarm_engine_t *r)
{
    double low = -1.0;
    for (int s = 0; s < r->stages; s++) {
        double t = engine_stage_capacity(r, s);
        low = low < 0 || t < low ? t : low;
    }
    return low > 0 ? low : 0.0;
}
