/* policy.c - where the router sends work: pure functions of the peer table
 * (no I/O, no clock: time is an argument), so they can be tested exactly.
 *
 * Routing picks the replica with the earliest projected finish, and a
 * step's forwards one that is done by the stage's projected end of step;
 * assignment puts a joining node on the stage with the least total
 * throughput; refilling moves one peer into a stage that lost every
 * replica (rebalancing, the best split, is policy_plan.c's); a cut of the
 * model fits the nodes' memory when each stage has a node to hold it, and
 * of the cuts that fit, the one chosen has the highest best split's bound
 * (within CUT_GAIN: two replicas a stage first, then fewer stages); the
 * window is how many micro-batches keep every stage busy.
 */
#include "swarm.h"

#include <math.h>
#include <stddef.h>

#define CUT_GAIN 0.10 // cuts whose bounds are this near count as equal (cut_choose)

// x / r against t without the division where a product settles it: the
// two round within 2^-52 of each other, far inside the margin of 2^-50, so
// where neither of these holds the division decides, and every answer is
// the division's. (A pick reads every replica's row: a division each was
// most of its time.)
static int s_surely_after(double x, double r, double t)
{
    return x > t * r * (1.0 + 0x1p-50);
}

static int s_surely_before(double x, double r, double t)
{
    return x < t * r * (1.0 - 0x1p-50);
}

// A replica's tok_s as a pick reads it: at least 1.
static double s_rate(const swarm_peer_view_t *p)
{
    return p->tok_s > 1.0 ? p->tok_s : 1.0;
}

int swarm_policy_pick(const swarm_peer_view_t *peers, int n, int stage, int prefer, double work)
{
    int best = -1;
    double best_t = 0.0;
    for (int i = 0; i < n; i++) {
        const swarm_peer_view_t *p = &peers[i];
        if (!p->ready || p->stage != stage)
            continue;
        // seconds until it is through everything it holds and this; the
        // peer holding the activations has the work counted already and
        // wins ties
        double rate = s_rate(p), x = p->backlog + (i == prefer ? 0.0 : work);
        if (best >= 0 && s_surely_after(x, rate, best_t))
            continue; // later than the best: neither earlier nor a tie
        double t = x / rate;
        if (best < 0 || t < best_t || (t == best_t && i == prefer)) {
            best = i;
            best_t = t;
        }
    }
    return best;
}

// About to run out of work: fewer than two requests in flight (the one it
// computes and one queued behind it), or less compute in flight than two
// of its round trips: the answers on their way back still count as in
// flight, and a new request reaches it only a round trip after the answer
// that freed it left.
static int s_dry(const swarm_peer_view_t *p)
{
    return p->inflight < 2 || p->ahead < 2.0 * p->rtt;
}

void swarm_policy_sums(const swarm_peer_view_t *peers, int n, int stage, double *held, double *rate)
{
    *held = *rate = 0.0;
    for (int i = 0; i < n; i++) {
        if (peers[i].ready && peers[i].stage == stage) {
            *held += peers[i].backlog;
            *rate += s_rate(&peers[i]);
        }
    }
}

int swarm_policy_pick_fit(const swarm_peer_view_t *peers, int n, int stage, double work, int left)
{
    double held, rate;
    swarm_policy_sums(peers, n, stage, &held, &rate);
    if (rate == 0.0) // (each ready row adds at least 1)
        return -1;
    double end = (held + (left > 1 ? left : 1) * work) / rate, lim = end * (1.0 + 1e-9);
    int dry = -1, fits = 0;
    for (int i = 0; i < n; i++) {
        const swarm_peer_view_t *p = &peers[i];
        if (!p->ready || p->stage != stage)
            continue;
        double r = s_rate(p), x = p->backlog + work;
        if (s_surely_after(x, r, lim) || (!s_surely_before(x, r, lim) && x / r > lim))
            continue; // not done in time
        fits++;
        if (s_dry(p) && (dry < 0 || p->inflight < peers[dry].inflight
                         || (p->inflight == peers[dry].inflight && r > peers[dry].tok_s)))
            dry = i;
    }
    if (dry >= 0)
        return dry;
    if (fits)
        return SWARM_HOLD; // a replica in time is busy: it takes it when it runs dry
    int e = swarm_policy_pick(peers, n, stage, -1, work);
    return e >= 0 && !s_dry(&peers[e]) ? SWARM_HOLD : e;
}

// ---- picks over a stage's rows by speed (swarm_rows_t) ----
//
// Each reads the rows fastest first and stops at a row whose work alone,
// work / rate, ends after what it looks for: that row's and every slower
// row's (backlog + work) / rate, rounded as the division rounds, cannot be
// less (backlog >= 0, and rounding keeps the order). Ties are settled as
// a read in index order settles them, so every answer is the same.

int swarm_policy_pick_in(const swarm_rows_t *rows, int stage, int prefer, double work)
{
    const swarm_peer_view_t *v = rows->view;
    int best = -1;
    double best_t = 0.0;
    if (prefer >= 0 && prefer < rows->n && v[prefer].ready && v[prefer].stage == stage) {
        best = prefer; // its work counted already: it wins ties
        best_t = v[prefer].backlog / s_rate(&v[prefer]);
    }
    for (int j = 0; j < rows->n; j++) {
        int i = rows->order[j];
        const swarm_peer_view_t *p = &v[i];
        double rate = s_rate(p);
        if (best >= 0 && work / rate > best_t)
            break; // it and every slower row: done later than the best
        if (i == prefer || !p->ready || p->stage != stage)
            continue;
        double t = (p->backlog + work) / rate;
        if (best < 0 || t < best_t || (t == best_t && best != prefer && i < best)) {
            best = i;
            best_t = t;
        }
    }
    return best;
}

int swarm_policy_pick_fit_in(const swarm_rows_t *rows, int stage, double work, int left)
{
    const swarm_peer_view_t *v = rows->view;
    if (!(rows->rate >= 0.5)) // no ready row, or sums worth nothing: all of them
        return swarm_policy_pick_fit(v, rows->n, stage, work, left);
    double num = rows->held + (left > 1 ? left : 1) * work;
    double lim = num / rows->rate * (1.0 + 1e-9);
    // how far lim may be from the one of the sums a read in index order
    // makes: the kept sums' errors, that read's own (n additions of values
    // >= 0: n half-ulps of each sum), and a few roundings of each division
    double doubt = lim * (rows->held_err / num + rows->rate_err / rows->rate + rows->n * 0x1p-52
                          + 0x1p-48);
    double lo = lim - doubt, hi = lim + doubt;
    int dry = -1, fits = 0;
    for (int j = 0; j < rows->n; j++) {
        int i = rows->order[j];
        const swarm_peer_view_t *p = &v[i];
        double r = s_rate(p);
        if (work / r > hi)
            break; // it and every slower row: not done by the end of step
        if (!p->ready || p->stage != stage)
            continue;
        double t = (p->backlog + work) / r;
        if ((t > lo && t <= hi) || !(p->tok_s >= 1.0))
            return swarm_policy_pick_fit(v, rows->n, stage, work, left); // in doubt
        if (t > hi)
            continue; // not done in time
        fits++;
        // fastest first, ties by index: the first dry row of the fewest in
        // flight is the one a read in index order keeps (tok_s >= 1 here)
        if (s_dry(p) && (dry < 0 || p->inflight < v[dry].inflight))
            dry = i;
    }
    if (dry >= 0)
        return dry;
    if (fits)
        return SWARM_HOLD;
    int e = swarm_policy_pick_in(rows, stage, -1, work);
    return e >= 0 && !s_dry(&v[e]) ? SWARM_HOLD : e;
}

int swarm_policy_holds(const swarm_peer_view_t *v, const double *need, int s)
{
    return !need || !(need[s] > 0.0) || !(v->memory > 0.0) || need[s] <= v->memory;
}

// A budget's size for the order of the largest first: unknown is any.
static double s_budget(double memory)
{
    return memory > 0.0 ? memory : INFINITY;
}

int swarm_policy_cut_fits(const double *need, int S, int replicas, const double *mem, int n,
                          int *to)
{
    for (int i = 0; i < n; i++)
        to[i] = -1;
    if (S < 1 || S > SWARM_MAX_STAGES || replicas < 1 || (long) S * replicas > n)
        return 0;
    int left[SWARM_MAX_STAGES]; // replicas each stage still needs
    for (int s = 0; s < S; s++)
        left[s] = replicas;
    for (int k = 0; k < S * replicas; k++) {
        int s = -1, node = -1; // the largest stage left, the largest node left
        for (int j = 0; j < S; j++)
            if (left[j] > 0 && (s < 0 || need[j] > need[s]))
                s = j;
        for (int i = 0; i < n; i++)
            if (to[i] < 0 && (node < 0 || s_budget(mem[i]) > s_budget(mem[node])))
                node = i;
        if (need[s] > 0.0 && s_budget(mem[node]) < need[s]) {
            for (int i = 0; i < n; i++)
                to[i] = -1;
            return 0;
        }
        left[s]--;
        to[node] = s;
    }
    return 1;
}

int swarm_policy_cut_choose(int most, const double *mem, const double *w, int n,
                            swarm_cut_need_fn need_of, void *ctx, int *replicas, int *to,
                            double *bounds)
{
    double need[SWARM_MAX_STAGES], cost[SWARM_MAX_STAGES], bound[SWARM_MAX_STAGES + 1];
    unsigned char two[SWARM_MAX_STAGES + 1] = { 0 };
    double top = 0.0;
    most = most < n ? most : n;
    most = most < SWARM_MAX_STAGES ? most : SWARM_MAX_STAGES;
    for (int S = 1; S <= most; S++) {
        bound[S] = -1.0; // (no such cut, or the nodes hold no replica of a stage of it)
        if (need_of(ctx, S, need, cost) != 0 || !swarm_policy_cut_fits(need, S, 1, mem, n, to))
            continue;
        swarm_plan_t plan = { .stages = S, .cost = cost, .need = need };
        bound[S] = swarm_policy_best_of(mem, w, NULL, n, &plan);
        two[S] = (unsigned char) swarm_policy_cut_fits(need, S, 2, mem, n, to);
        top = bound[S] > top ? bound[S] : top;
    }
    for (int S = 1; bounds && S <= SWARM_MAX_STAGES; S++)
        bounds[S - 1] = S <= most ? bound[S] : -1.0;
    // of the cuts within CUT_GAIN of the highest bound: two replicas a
    // stage before one, then the fewest stages
    int chosen = -1;
    for (int k = 2; k >= 1 && chosen < 0; k--)
        for (int S = 1; S <= most && chosen < 0; S++)
            if (bound[S] >= 0.0 && bound[S] * (1.0 + CUT_GAIN) >= top && (k == 1 || two[S]))
                chosen = S;
    *replicas = 0;
    if (chosen < 0 || need_of(ctx, chosen, need, cost) != 0)
        return -1;
    *replicas = two[chosen] ? 2 : 1;
    swarm_policy_cut_fits(need, chosen, *replicas, mem, n, to);
    return chosen;
}

int swarm_policy_assign(const swarm_peer_view_t *peers, int n, int stages, const double *need,
                        const swarm_peer_view_t *me)
{
    int best = -1;
    double best_tok = -1.0;
    int best_count = 0;
    for (int s = 0; s < stages; s++) {
        if (me && !swarm_policy_holds(me, need, s))
            continue;
        double tok = 0.0;
        int count = 0;
        for (int i = 0; i < n; i++) {
            if (peers[i].stage == s && (peers[i].ready || peers[i].joining)) {
                tok += peers[i].tok_s;
                count++;
            }
        }
        // least throughput; on a tie the fewest replicas, then the first stage
        if (best_tok < 0.0 || tok < best_tok || (tok == best_tok && count < best_count)) {
            best = s;
            best_tok = tok;
            best_count = count;
        }
    }
    return best;
}

int swarm_policy_assign_even(const swarm_peer_view_t *peers, int n, int stages, const double *need,
                             const swarm_peer_view_t *me)
{
    int best = -1, best_count = -1;
    for (int s = 0; s < stages; s++) {
        if (me && !swarm_policy_holds(me, need, s))
            continue;
        int count = 0;
        for (int i = 0; i < n; i++)
            if (peers[i].stage == s && (peers[i].ready || peers[i].joining))
                count++;
        if (best_count < 0 || count < best_count) {
            best = s;
            best_count = count;
        }
    }
    return best;
}

int swarm_policy_refill(const swarm_peer_view_t *peers, int n, int stages, const double *cost,
                        const double *need, int empty)
{
    double tot[SWARM_MAX_STAGES];
    int count[SWARM_MAX_STAGES];
    if (stages < 2 || stages > SWARM_MAX_STAGES || empty < 0 || empty >= stages
        || !(cost[empty] > 0.0))
        return -1;
    for (int s = 0; s < stages; s++)
        tot[s] = 0.0, count[s] = 0;
    for (int i = 0; i < n; i++) {
        if (peers[i].ready && peers[i].stage >= 0 && peers[i].stage < stages) {
            tot[peers[i].stage] += peers[i].tok_s;
            count[peers[i].stage]++;
        }
    }
    // the ready peer whose move leaves the highest bottleneck, never the
    // last of its stage; no margin, no hold; another empty stage does not
    // count (it waits for its own refill)
    int best = -1;
    double floor = -1.0;
    for (int i = 0; i < n; i++) {
        const swarm_peer_view_t *p = &peers[i];
        int from = p->stage;
        if (!p->ready || from < 0 || from >= stages || from == empty || count[from] < 2
            || !swarm_policy_holds(p, need, empty))
            continue;
        double after = 1e300;
        for (int s = 0; s < stages; s++) {
            if (count[s] == 0 && s != empty)
                continue;
            double t = tot[s] - (s == from ? p->tok_s : 0.0)
                     + (s == empty ? p->tok_s * cost[from] / cost[empty] : 0.0);
            after = t < after ? t : after;
        }
        if (after > floor) {
            best = i;
            floor = after;
        }
    }
    return best;
}

// Little's law for `in`: micro-batches in flight that keep the bottleneck
// busy, at most G; 0 while a stage is not measured.
static int s_window_need(const swarm_window_in_t *in, int G)
{
    int S = in->stages;
    double cycle = (2.0 * S - 1.0) * (in->rtt > 0.0 ? in->rtt : 0.0), beat = 0.0;
    for (int s = 0; s < S; s++) {
        if (!(in->work[s] > 0.0) || in->replicas[s] < 1)
            return 0;
        cycle += in->work[s];
        double each = in->pace[s] > 0.0 ? in->pace[s] : in->work[s] / in->replicas[s];
        beat = each > beat ? each : beat;
    }
    // one spare (a queued request hides jitter); 1e-9: 0.32 / 0.01 is not 32.0000001
    double need = ceil(cycle / beat - 1e-9) + 1.0;
    return need < (double) G ? (int) need : G;
}

int swarm_policy_window(const swarm_window_in_t *in)
{
    int S = in->stages, G = in->micro_batches;
    if (G < 1)
        return 1;
    if (S < 1 || S > SWARM_WINDOW_STAGES)
        return G;
    int window = in->all ? G : s_window_need(in, G);
    if (window == 0)
        return G; // not measured yet: everything in flight, as before
    for (int s = 0; s + 1 < S; s++)
        if (in->slots[s] > 0 && in->slots[s] < window)
            window = in->slots[s];
    return window > 1 ? window : 1;
}
