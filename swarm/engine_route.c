/* engine_route.c - each stage's ready peers and the rows a routing pick
 * reads: the ready lists kept in index order as peers come and go, the
 * views the policy sees (of the whole table, or a stage's rows), a peer
 * not measured yet routed at its guess, and the rows' order by speed and
 * their sums (swarm_rows_t), kept as the rows change.
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
static void s_row_out(engine_route_t *rt, int n, int k);
static void s_row_in(engine_route_t *rt, int n, int k);

void engine_peer_state(swarm_engine_t *r, int p, int state)
{
    peer_t *pe = &r->peers[p];
    assert(pe->state != P_READY || (pe->stage >= 0 && pe->stage < r->stages));
    assert(state != P_READY || (pe->stage >= 0 && pe->stage < r->stages));
    if (pe->state == P_READY) {
        engine_ready_t *l = &r->ready[pe->stage];
        engine_route_t *rt = &r->route[pe->stage];
        int k = s_ready_slot(l, p);
        s_row_out(rt, l->n, k);
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
        int *order = realloc(rt->order, (size_t) l->cap * sizeof *order);
        if (!view || !order)
            abort(); // bookkeeping (STYLE.md: small allocations may abort)
        rt->view = view;
        rt->order = order;
        int k = s_ready_slot(l, p);
        memmove(&view[k + 1], &view[k], (size_t) (l->n - 1 - k) * sizeof view[0]);
        view[k] = (swarm_peer_view_t) { .stage = pe->stage }; // not ready: in no sum, at speed 1
        s_row_in(rt, l->n, k);
        s_ready_places(r, l, k);
        engine_route_touch(r, p); // (and its place in the order, and the sums)
        engine_audits_touch(r, pe->stage);
    }
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

// A row's tok_s as the policy's picks read it (at least 1), and whether a
// row of speed ra and index a comes before one of rb and b in their order:
// the faster, then the lower index.
static double s_rate(const swarm_peer_view_t *v)
{
    return v->tok_s > 1.0 ? v->tok_s : 1.0;
}

static int s_before(double ra, int a, double rb, int b)
{
    return ra > rb || (ra == rb && a < b);
}

// The place in order[0..n) of the first row not before (r, k), row k of
// them at the speed it is sorted by, r_k (its row may show a new one).
static int s_order_at(const engine_route_t *rt, int n, double r, int k, double r_k)
{
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2, m = rt->order[mid];
        if (s_before(m == k ? r_k : s_rate(&rt->view[m]), m, r, k))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

// x + now - was, its rounding added to *err: each step's at most half an
// ulp of a value no larger than |x| + |was| + |now|.
static double s_sum_follow(double x, double was, double now, double *err)
{
    *err += (fabs(x) + fabs(was) + fabs(now)) * 0x1p-52;
    return x - was + now;
}

// Row k of n leaves: out of the order (the rows after it are renumbered)
// and out of the sums. O(replicas), no sort.
static void s_row_out(engine_route_t *rt, int n, int k)
{
    const swarm_peer_view_t *was = &rt->view[k];
    if (rt->order_ok) {
        int from = s_order_at(rt, n, s_rate(was), k, s_rate(was));
        assert(from < n && rt->order[from] == k);
        memmove(&rt->order[from], &rt->order[from + 1], (size_t) (n - 1 - from) * sizeof *rt->order);
        for (int j = 0; j < n - 1; j++)
            rt->order[j] -= rt->order[j] > k;
    }
    if (rt->sums_ok && was->ready) {
        swarm_rows_t *w = &rt->rows;
        w->held = s_sum_follow(w->held, was->backlog, 0.0, &w->held_err);
        w->rate = s_sum_follow(w->rate, s_rate(was), 0.0, &w->rate_err);
    }
}

// Row k of n is new, a row not ready at speed 1 (the rows from k on were
// renumbered): into the order. O(replicas), no sort.
static void s_row_in(engine_route_t *rt, int n, int k)
{
    if (!rt->order_ok)
        return;
    for (int j = 0; j < n - 1; j++)
        rt->order[j] += rt->order[j] >= k;
    int to = s_order_at(rt, n - 1, 1.0, k, 1.0);
    memmove(&rt->order[to + 1], &rt->order[to], (size_t) (n - 1 - to) * sizeof *rt->order);
    rt->order[to] = k;
}

// Row k of stage rt was *was: its place in the order (found by its old
// speed, moved to its new one: O(log replicas) and a move of the rows
// between) and the sums follow it.
static void s_row_changed(const swarm_engine_t *r, engine_route_t *rt, int k,
                          const swarm_peer_view_t *was)
{
    const swarm_peer_view_t *now = &rt->view[k];
    int n = r->ready[now->stage].n;
    double r_was = s_rate(was), r_now = s_rate(now);
    if (rt->order_ok && r_now != r_was) {
        int from = s_order_at(rt, n, r_was, k, r_was);
        assert(from < n && rt->order[from] == k);
        memmove(&rt->order[from], &rt->order[from + 1], (size_t) (n - 1 - from) * sizeof *rt->order);
        int to = s_order_at(rt, n - 1, r_now, k, r_now); // (k is out of it)
        memmove(&rt->order[to + 1], &rt->order[to], (size_t) (n - 1 - to) * sizeof *rt->order);
        rt->order[to] = k;
    }
    if (rt->sums_ok) {
        swarm_rows_t *w = &rt->rows;
        w->held = s_sum_follow(w->held, was->ready ? was->backlog : 0.0,
                               now->ready ? now->backlog : 0.0, &w->held_err);
        w->rate = s_sum_follow(w->rate, was->ready ? r_was : 0.0, now->ready ? r_now : 0.0,
                               &w->rate_err);
    }
}

void engine_route_touch(swarm_engine_t *r, int p)
{
    const peer_t *pe = &r->peers[p];
    if (pe->state != P_READY)
        return;
    engine_route_t *rt = &r->route[pe->stage];
    int k = engine_ready_at(r, pe->stage, p);
    assert(k >= 0);
    swarm_peer_view_t was = rt->view[k];
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
        s_row_changed(r, rt, k, &was);
        return;
    }
    s_row_changed(r, rt, k, &was);
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
        int p = rt->unmeasured.peer[j], k = engine_ready_at(r, s, p);
        swarm_peer_view_t was = rt->view[k];
        rt->view[k].tok_s = engine_routed_tok_s(r, &r->peers[p], rt->fastest);
        s_row_changed(r, rt, k, &was);
    }
    rt->rows_fastest = rt->fastest;
    return rt->view;
}

// qsort_r's order of rows i and j of `rows`.
static int s_cmp_rows(const void *a, const void *b, void *rows)
{
    const swarm_peer_view_t *view = rows;
    int i = *(const int *) a, j = *(const int *) b;
    double ri = s_rate(&view[i]), rj = s_rate(&view[j]);
    return s_before(ri, i, rj, j) ? -1 : s_before(rj, j, ri, i) ? 1 : 0;
}

// The sums kept by differences are summed afresh in index order once
// their roundings since may come to more than this (of the held work, or
// of a micro-batch's at least, and of the summed speed): a pick in doubt
// of a row's fit by as little reads every row.
#define ROWS_ERR 1e-12

const swarm_rows_t *engine_route_rows(swarm_engine_t *r, int s)
{
    static const swarm_rows_t none = { 0 };
    int n;
    const swarm_peer_view_t *view = engine_route_views(r, s, &n); // (may rewrite rows)
    if (!view)
        return &none; // no such stage
    engine_route_t *rt = &r->route[s];
    swarm_rows_t *w = &rt->rows;
    if (!rt->order_ok && n > 0) { // O(replicas log replicas): a row came, went or was rewritten
        for (int k = 0; k < n; k++)
            rt->order[k] = k;
        qsort_r(rt->order, (size_t) n, sizeof *rt->order, s_cmp_rows, (void *) view);
    }
    rt->order_ok = 1;
    double micro = (double) r->hp.micro * r->hp.cfg.T, u = n * 0x1p-53;
    if (!rt->sums_ok || w->held_err > (u + ROWS_ERR) * fmax(w->held, micro)
        || w->rate_err > (u + ROWS_ERR) * w->rate) {
        swarm_policy_sums(view, n, s, &w->held, &w->rate);
        // in index order, n additions: each sum within n half-ulps of the
        // true one (as the sums afresh a pick would read are of theirs)
        w->held_err = u * w->held;
        w->rate_err = u * w->rate;
        rt->sums_ok = 1;
    }
    w->view = view;
    w->n = n;
    w->order = rt->order;
    return w;
}

// Stage s's order, where it is kept, sorted and each row once; its sums
// within their errors of the sums afresh. 0 or 1.
static int s_rows_check(swarm_engine_t *r, int s)
{
    const engine_route_t *rt = &r->route[s];
    int n = r->ready[s].n, bad = 0;
    if (rt->order_ok) {
        char *seen = calloc((size_t) n + 1, 1);
        if (!seen)
            abort();
        for (int j = 0; j < n; j++) {
            int k = rt->order[j];
            bad |= k < 0 || k >= n || seen[k]++;
            if (!bad && j > 0)
                bad |= !s_before(s_rate(&rt->view[rt->order[j - 1]]), rt->order[j - 1],
                                 s_rate(&rt->view[k]), k);
        }
        free(seen);
    }
    if (rt->sums_ok) {
        double held, rate;
        swarm_policy_sums(rt->view, n, s, &held, &rate);
        double u = n * 0x1p-53; // the sum afresh's own rounding, at most
        bad |= !(fabs(held - rt->rows.held) <= rt->rows.held_err + u * held)
               || !(fabs(rate - rt->rows.rate) <= rt->rows.rate_err + u * rate);
    }
    return bad;
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
        bad |= s_rows_check(r, s);
    }
    return bad ? -EPROTO : 0;
}
