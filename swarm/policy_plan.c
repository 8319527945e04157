/* policy_plan.c - which stage each peer should serve: the assignment that
 * keeps the pipeline's bottleneck (the least, over stages, of the summed
 * speeds of its replicas) highest, and the moves that take the swarm
 * there (swarm.h). Pure: no I/O, no clock.
 *
 * A peer's speed on another stage is its measured one scaled by the two
 * stages' costs, so each peer has one weight w = tok_s * cost[its stage]
 * and adds w / cost[s] to stage s. Finding the best split is a
 * partition problem (NP-hard in general), so:
 *   - up to PLAN_EXACT_PEERS movable peers, an exact branch and bound
 *     over the peers sorted by weight (heaviest first; the pruning bound
 *     gives each stage everything still to place);
 *   - beyond, a local search. The search moves one peer into the
 *     bottleneck stage, or swaps two between it and another, while that
 *     lifts both stages above the bottleneck's old total: the stages'
 *     sorted totals rise at every step, so it ends, and a swap gets out of
 *     the traps one-peer moves stop in. A plan starts it from where the
 *     peers are and takes the first k of its steps that are worth most
 *     once their state fetches are paid for (s_priced); the best split
 *     (swarm_policy_best) also starts it from a greedy split (each peer,
 *     heaviest first, to the stage with the least) and keeps the better.
 * While a plan's moves leave a stage, it keeps two ready replicas when it
 * has three or more, else one (no more than the plan leaves it, never
 * none): a newcomer fetches its state from one, and a big stage serves on
 * if the other fails meanwhile. The moves go in waves (s_waves): a move
 * that would leave its stage short waits until the peers coming to that
 * stage are ready, so a stage's only replica can be moved once another
 * has taken its place. The exact search weighs every split that waves
 * reach; the local search keeps, more simply, the replicas each stage must
 * keep among its own. No plan moves a peer moved within `hold` seconds,
 * nor one to a stage it cannot hold.
 * In an open swarm (pl->audit > 0), a split is weighed by what a step
 * makes with its audits (plan_value), not by its bound alone: a fast replica
 * beside only slow ones makes every audited step wait for them to redo its
 * share. The exact search weighs it throughout; the local search of more
 * peers places them by the bound (its steps would each cost a pass over
 * the peers), and a repair after it (plan_repair), up to PLAN_AUDIT_PEERS,
 * moves peers into the stages of the longest audits.
 */
#include "policy_int.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PLAN_EXACT_NODES 2000000  // its search nodes at most (then the best found)
#define PLAN_SEARCH_STEPS 4096    // improvements of one local search at most
#define PLAN_KEEP 2               // a stage of more ready replicas keeps this many of them

int plan_holds(const plan_ctx_t *c, int i, int s)
{
    return swarm_policy_holds(&c->v[i], c->pl->need, s);
}

// Peer i is one of stage s's own ready replicas.
static int s_mine(const plan_ctx_t *c, int i, int s)
{
    return s == c->from[i] && c->v[i].ready;
}

static void s_totals(plan_ctx_t *c)
{
    for (int s = 0; s < c->S; s++)
        c->T[s] = 0.0, c->count[s] = 0, c->own[s] = 0;
    for (int i = 0; i < c->n; i++) {
        int s = c->at[i];
        if (s < 0)
            continue;
        c->T[s] += c->w[i] / c->pl->cost[s];
        c->count[s]++;
        c->own[s] += s_mine(c, i, s);
    }
}

double plan_low(const plan_ctx_t *c, int *which)
{
    int b = 0;
    for (int s = 1; s < c->S; s++)
        b = c->T[s] < c->T[b] ? s : b;
    if (which)
        *which = b;
    return c->T[b];
}

// Peer i leaves stage s under `at`: s keeps a peer, and the own replicas
// it must.
int plan_may_leave(const plan_ctx_t *c, int i, int s)
{
    return c->count[s] >= 2 && (!s_mine(c, i, s) || c->own[s] > c->keep_own[s]);
}

// Peer i to stage s under `at`, the totals kept (either may be -1: none).
void plan_put(plan_ctx_t *c, int i, int s)
{
    int a = c->at[i];
    if (a >= 0) {
        c->T[a] -= c->w[i] / c->pl->cost[a];
        c->count[a]--;
        c->own[a] -= s_mine(c, i, a);
    }
    c->at[i] = s;
    if (s >= 0) {
        c->T[s] += c->w[i] / c->pl->cost[s];
        c->count[s]++;
        c->own[s] += s_mine(c, i, s);
    }
}

// What stage s keeps ready while moves leave it: what it keeps of its own
// (keep_own: two of three or more, else one), but no more than c->at
// leaves it (c->count) and never none.
static int s_keep_now(const plan_ctx_t *c, int s)
{
    int keep = c->keep_own[s] < c->count[s] ? c->keep_own[s] : c->count[s];
    return keep > 1 ? keep : 1;
}

// The waves of moves that take the peers from where they are to c->at
// (its counts kept): in each, every waiting move whose stage keeps
// s_keep_now ready replicas without it starts; once the wave is through,
// its peers count as ready where they went (so do the peers joining now).
// c->wave[i] gets the wave peer i's move starts in (0: now, which may be
// none while peers are joining; -1: it stays). How many waves, or -1 when
// some move could never start (two stages' only replicas traded).
static int s_waves(plan_ctx_t *c)
{
    int ready[SWARM_MAX_STAGES], keep[SWARM_MAX_STAGES], left = 0, joins = 0;
    for (int s = 0; s < c->S; s++)
        ready[s] = c->ready[s], keep[s] = s_keep_now(c, s), joins += c->joining[s];
    for (int k = 0; k < c->nmov; k++) {
        int i = c->mov[k];
        c->wave[i] = c->at[i] == c->from[i] ? -1 : INT_MAX;
        left += c->wave[i] != -1;
    }
    int waves = 0;
    while (left > 0) {
        int arrive[SWARM_MAX_STAGES] = { 0 }, started = 0;
        for (int k = 0; k < c->nmov; k++) {
            int i = c->mov[k], f = c->from[i];
            if (c->wave[i] != INT_MAX || ready[f] - 1 < keep[f])
                continue;
            ready[f]--;
            arrive[c->at[i]]++;
            c->wave[i] = waves;
            started++;
        }
        if (!started && !(waves == 0 && joins)) // (a first wave may wait for them alone)
            return -1;
        for (int s = 0; s < c->S; s++)
            ready[s] += arrive[s] + (waves == 0 ? c->joining[s] : 0);
        left -= started;
        waves++;
    }
    return waves;
}

typedef struct {
    int i, j;      // move i into the bottleneck; with j >= 0, j goes to i's stage
    double value;  // the lower of the two stages' totals after it
} step_t;

static int s_by_weight(const void *a, const void *b)
{
    const wi_t *x = a, *y = b;
    return x->w < y->w ? -1 : x->w > y->w ? 1 : x->i - y->i;
}

// The best swap of peer i (on stage s) with one of `list` (stage b's
// movable peers, by weight): the one nearest the weight that levels the
// two stages, or a neighbour of it that is allowed.
static void s_best_swap(const plan_ctx_t *c, int i, int b, const wi_t *list, int nl, step_t *best)
{
    int s = c->at[i];
    double cb = c->pl->cost[b], cs = c->pl->cost[s];
    double want = c->w[i] - (c->T[s] - c->T[b]) / (1.0 / cb + 1.0 / cs);
    int lo = 0, hi = nl;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (list[mid].w < want)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (int k = lo - 4; k < lo + 4; k++) {
        if (k < 0 || k >= nl)
            continue;
        int j = list[k].i;
        double d = c->w[i] - c->w[j];
        if (!(d > 0.0) || !plan_holds(c, j, s))
            continue;
        // own replicas after: s loses i and gains j, b the other way
        int own_s = c->own[s] - s_mine(c, i, s) + s_mine(c, j, s);
        int own_b = c->own[b] - s_mine(c, j, b) + s_mine(c, i, b);
        if (own_s < c->keep_own[s] || own_b < c->keep_own[b])
            continue;
        double tb = c->T[b] + d / cb, ts = c->T[s] - d / cs;
        double value = tb < ts ? tb : ts;
        if (value > best->value)
            *best = (step_t) { i, j, value };
    }
}

// Local search from `at` (see the top of the file), by the bound.
// trail (when not NULL) gets each step's peers and where they went, four
// ints a step, and *steps how many.
static void s_improve(plan_ctx_t *c, wi_t *list, int *trail, int *nsteps)
{
    s_totals(c);
    if (nsteps)
        *nsteps = 0;
    for (int steps = 0; steps < PLAN_SEARCH_STEPS; steps++) {
        int b;
        double low = plan_low(c, &b);
        step_t best = { -1, -1, low * (1.0 + 1e-9) + 1e-12 };
        int nl = 0;
        for (int i = 0; i < c->n; i++)
            if (c->movable[i] && c->at[i] == b && plan_may_leave(c, i, b))
                list[nl++] = (wi_t) { c->w[i], i };
        qsort(list, (size_t) nl, sizeof *list, s_by_weight);
        for (int i = 0; i < c->n; i++) {
            int s = c->at[i];
            if (!c->movable[i] || s < 0 || s == b || !plan_holds(c, i, b))
                continue;
            if (plan_may_leave(c, i, s)) {
                double tb = c->T[b] + c->w[i] / c->pl->cost[b];
                double ts = c->T[s] - c->w[i] / c->pl->cost[s];
                double value = tb < ts ? tb : ts;
                if (value > best.value)
                    best = (step_t) { i, -1, value };
            }
            s_best_swap(c, i, b, list, nl, &best);
        }
        if (best.i < 0)
            break;
        int s = c->at[best.i];
        plan_put(c, best.i, b);
        if (best.j >= 0)
            plan_put(c, best.j, s);
        if (trail) {
            int *t = &trail[4 * (*nsteps)++];
            t[0] = best.i, t[1] = b, t[2] = best.j, t[3] = s;
        }
    }
}

// The unmovable where they are, the movable nowhere yet.
static void s_unplace(plan_ctx_t *c)
{
    for (int i = 0; i < c->n; i++)
        c->at[i] = c->movable[i] ? -1 : c->from[i];
    s_totals(c);
}

// Greedy from scratch into `at`: the unmovable where they are, then every
// movable peer, heaviest first, to the stage it can hold with the least.
static void s_greedy(plan_ctx_t *c, const wi_t *order, int m)
{
    s_unplace(c);
    for (int k = m - 1; k >= 0; k--) {
        int i = order[k].i, best = -1;
        for (int s = 0; s < c->S; s++)
            if (plan_holds(c, i, s) && (best < 0 || c->T[s] < c->T[best]))
                best = s;
        plan_put(c, i, best >= 0 ? best : c->from[i]);
    }
}

typedef struct {
    plan_ctx_t *c;
    const int *order;  // movable peers, heaviest first
    int m;
    double rest[PLAN_EXACT_PEERS + 1]; // weight from order[k] on
    int *best_at;
    double best;
    int best_moves, moves;
    long nodes;
    double floor;      // > 0: the fewest moves to a bound of at least this
} exact_t;

// At most what a split reached from exact search node k may be worth
// (plan_value), its bound at most `hope`: with audits, at a stage of two
// replicas or more, the fastest's share (its speed over the most the
// stage may reach) is redone by all the others at best, split among them
// (the most they may reach: the rest of the stage's). A faster peer still
// to place only makes the largest share larger.
static double s_hope(const exact_t *x, int k, double hope)
{
    const plan_ctx_t *c = x->c;
    double most = 0.0;
    if (!(c->audit > 0.0) || !(hope > 0.0) || !isfinite(hope))
        return hope;
    for (int s = 0; s < c->S; s++) {
        double w1 = 0.0, w2 = 0.0; // weights: a stage's speeds in the same order
        for (int i = 0; i < c->n; i++) {
            if (c->at[i] != s)
                continue;
            if (c->w[i] > w1)
                w2 = w1, w1 = c->w[i];
            else if (c->w[i] > w2)
                w2 = c->w[i];
        }
        double reach = c->T[s] + x->rest[k] / c->pl->cost[s];
        if (w2 > 0.0)
            most = fmax(most, w1 / (reach * (reach * c->pl->cost[s] - w1)));
    }
    return 1.0 / (c->k / hope + c->audit * most);
}

static void s_exact(exact_t *x, int k)
{
    plan_ctx_t *c = x->c;
    if (++x->nodes > PLAN_EXACT_NODES)
        return;
    // peers still to come: one for an empty stage, the own ones to keep
    // (a plan's search keeps them by its waves instead)
    int wanted = 0;
    for (int s = 0; s < c->S; s++) {
        int short_own = c->waves ? 0 : c->keep_own[s] - c->own[s];
        wanted += short_own > 0 ? short_own : c->count[s] == 0;
    }
    if (wanted > x->m - k)
        return;
    // at best every stage gets all that is left (its audits, s_hope)
    double hope = INFINITY;
    for (int s = 0; s < c->S; s++) {
        double t = c->T[s] + x->rest[k] / c->pl->cost[s];
        hope = t < hope ? t : hope;
    }
    hope = s_hope(x, k, hope);
    double tol = 1e-9 * (x->best > 0 ? x->best : 1.0);
    if (x->floor > 0.0 ? hope < x->floor || x->moves > x->best_moves
                       : hope < x->best - tol || (hope <= x->best + tol && x->moves >= x->best_moves))
        return;
    if (k == x->m) {
        double low = plan_value(c);
        if (c->waves && s_waves(c) < 0)
            return;
        int better = x->floor > 0.0
                   ? low >= x->floor && (x->moves < x->best_moves || low > x->best + tol)
                   : low > x->best + tol || (low >= x->best - tol && x->moves < x->best_moves);
        if (better) {
            x->best = low;
            x->best_moves = x->moves;
            memcpy(x->best_at, c->at, (size_t) c->n * sizeof *c->at);
        }
        return;
    }
    int i = x->order[k], home = c->from[i];
    for (int pass = 0; pass < 2; pass++) { // its own stage first: fewest moves found early
        for (int s = 0; s < c->S; s++) {
            if ((pass == 0) != (s == home) || !plan_holds(c, i, s))
                continue;
            plan_put(c, i, s);
            x->moves += s != home;
            s_exact(x, k + 1);
            x->moves -= s != home;
            plan_put(c, i, -1);
        }
    }
}

// Assignment `at` into c->at, its totals summed afresh (the searches'
// running sums drift in the last bits); its bound.
static double s_settle(plan_ctx_t *c, const int *at)
{
    if (at != c->at)
        memcpy(c->at, at, (size_t) c->n * sizeof *c->at);
    s_totals(c);
    return plan_value(c);
}

// The best assignment into c->at (starting from c->at as it is); its bound.
// A plan's (c->waves) is the one of fewest moves within its margin of the
// best, when the best is worth a plan: a move more must gain the margin
// too.
static double s_solve_bound(plan_ctx_t *c)
{
    wi_t *order = c->order, *list = c->list;
    int *scratch = c->scratch;
    int m = 0;
    for (int i = 0; i < c->n; i++)
        if (c->movable[i])
            order[m++] = (wi_t) { c->w[i], i };
    qsort(order, (size_t) m, sizeof *order, s_by_weight); // lightest first
    double now = plan_value(c);
    s_improve(c, list, NULL, NULL); // (audits are weighed by the exact search only)
    double low = plan_value(c);
    memcpy(scratch, c->at, (size_t) c->n * sizeof *c->at);
    if (m <= PLAN_EXACT_PEERS) {
        exact_t x = { .c = c, .m = m, .best_at = scratch, .best = low, .best_moves = 0 };
        for (int i = 0; i < c->n; i++)
            x.best_moves += c->at[i] != c->from[i];
        int heavy[PLAN_EXACT_PEERS];
        for (int k = 0; k < m; k++)
            heavy[k] = order[m - 1 - k].i;
        x.order = heavy;
        x.rest[m] = 0.0;
        for (int k = m - 1; k >= 0; k--)
            x.rest[k] = x.rest[k + 1] + c->w[heavy[k]];
        s_unplace(c);
        s_exact(&x, 0);
        double margin = 1.0 + c->pl->margin, worth = now * margin * (1.0 + 1e-9);
        if (c->waves && c->pl->margin > 0.0 && x.best > worth) {
            x.floor = x.best / margin > worth ? x.best / margin : worth;
            x.nodes = 0;
            s_unplace(c);
            s_exact(&x, 0);
        }
        return s_settle(c, scratch);
    }
    // a start from scratch, kept when it is clearly better
    s_greedy(c, order, m);
    s_improve(c, list, NULL, NULL);
    double fresh = plan_value(c);
    return fresh > low * 1.02 ? s_settle(c, c->at) : s_settle(c, scratch);
}

// What moving to `at` from where the peers are costs: the state fetches,
// one after another (they all pass through the router), seconds; *moves
// how many.
static double s_fetch(const plan_ctx_t *c, int *moves)
{
    double f = 0.0;
    *moves = 0;
    for (int i = 0; i < c->n; i++) {
        if (c->from[i] < 0 || c->at[i] == c->from[i])
            continue;
        ++*moves;
        f += c->pl->move_s ? c->pl->move_s[c->at[i]] : 0.0;
    }
    return f;
}

// What a plan from bound `low` to `high` at fetch seconds `f` gains over
// the horizon, in tokens: the bound's rise for the time after the fetches,
// less the whole bound for their time (every stage waits for them).
double plan_worth(const swarm_plan_t *pl, double low, double high, double f)
{
    return (high - low) * (pl->horizon - f) - low * f;
}

// The best assignment into c->at (s_solve_bound), and past the exact
// search's peers, its audits repaired (plan_repair); its value.
static double s_solve(plan_ctx_t *c)
{
    double audit = c->audit;
    if (!(audit > 0.0) || c->counted <= PLAN_EXACT_PEERS)
        return s_solve_bound(c); // audits weighed throughout, or none
    c->audit = 0.0;
    s_solve_bound(c); // (settled: c->T is of c->at)
    c->audit = audit;
    plan_repair(c, c->waves);
    return s_settle(c, c->at);
}

// Step k of a search's trail, made again.
static void s_replay(plan_ctx_t *c, const int *trail, int k)
{
    const int *t = &trail[4 * k];
    plan_put(c, t[0], t[1]);
    if (t[2] >= 0)
        plan_put(c, t[2], t[3]);
}

// Many peers: the local search from where they are, and of its steps the
// first k that are worth most (each step's moves cost their fetches: a
// plan does not move a thousand peers for what a dozen give). Into c->at;
// its bound.
static double s_priced(plan_ctx_t *c, int *trail)
{
    double audit = c->audit;
    c->audit = 0.0; // by the bound; its audits repaired after (plan_repair)
    double low = plan_value(c);
    int steps = 0;
    s_improve(c, c->list, trail, &steps);
    // replay the steps from the start, pricing each prefix
    memcpy(c->at, c->from, (size_t) c->n * sizeof *c->at);
    s_totals(c);
    int best_k = 0, moves;
    double best_worth = 0.0;
    for (int k = 0; k < steps; k++) {
        s_replay(c, trail, k);
        double high = plan_value(c), f = s_fetch(c, &moves);
        double w = plan_worth(c->pl, low, high, f);
        if (high > low * (1.0 + c->pl->margin) && w > best_worth)
            best_k = k + 1, best_worth = w;
    }
    memcpy(c->at, c->from, (size_t) c->n * sizeof *c->at);
    s_totals(c);
    for (int k = 0; k < best_k; k++)
        s_replay(c, trail, k);
    c->audit = audit;
    if (audit > 0.0)
        plan_repair(c, 1);
    return s_settle(c, c->at);
}

// The peers that count: ready or joining on a stage; the others (from -1)
// are left out of every total. 0, or -1 for bad arguments or no memory.
static int s_ctx(plan_ctx_t *c, const swarm_peer_view_t *v, int n, const swarm_plan_t *pl, int keep)
{
    *c = (plan_ctx_t) { .v = v, .pl = pl, .n = n, .S = pl->stages };
    if (c->S < 1 || c->S > SWARM_MAX_STAGES || n < 0)
        return -1;
    for (int s = 0; s < c->S; s++)
        if (!(pl->cost[s] > 0.0))
            return -1;
    size_t k = (size_t) (n > 0 ? n : 1);
    c->w = malloc(2 * k * sizeof *c->w);
    c->from = malloc(6 * k * sizeof *c->from);
    c->order = malloc(2 * k * sizeof *c->order);
    if (!c->w || !c->from || !c->order) {
        free(c->w);
        free(c->from);
        free(c->order);
        return -1;
    }
    c->u = c->w + k;
    c->movable = c->from + k, c->at = c->from + 2 * k, c->scratch = c->from + 3 * k;
    c->wave = c->from + 4 * k, c->mov = c->from + 5 * k;
    c->list = c->order + k;
    for (int i = 0; i < n; i++) {
        const swarm_peer_view_t *p = &v[i];
        int counted = (p->ready || p->joining) && p->stage >= 0 && p->stage < c->S;
        c->from[i] = counted ? p->stage : -1;
        c->w[i] = counted ? (p->tok_s > 0.0 ? p->tok_s : 0.0) * pl->cost[p->stage] : 0.0;
        c->movable[i] = counted && p->ready && !(pl->now - p->moved_at < pl->hold);
        c->at[i] = c->from[i];
        if (c->movable[i])
            c->mov[c->nmov++] = i;
        if (counted) {
            c->ready[p->stage] += p->ready;
            c->joining[p->stage] += !p->ready;
        }
    }
    s_totals(c);
    int counted = 0;
    for (int s = 0; s < c->S; s++)
        counted += c->ready[s] + c->joining[s];
    c->counted = counted;
    c->k = pl->step_k > 1.0 ? pl->step_k : 1.0;
    c->audit = counted <= PLAN_AUDIT_PEERS && pl->audit > 0.0 ? fmin(pl->audit, 1.0) : 0.0;
    // two of three or more, one of one or two (a move from two is allowed)
    for (int s = 0; s < c->S; s++)
        c->keep_own[s] = !keep ? 0 : c->own[s] > PLAN_KEEP ? PLAN_KEEP : c->own[s] > 0;
    return 0;
}

static void s_ctx_free(plan_ctx_t *c)
{
    free(c->w);
    free(c->from);
    free(c->order);
}

double swarm_policy_bound(const swarm_peer_view_t *peers, int n, const swarm_plan_t *plan,
                          const int *at)
{
    plan_ctx_t c;
    if (s_ctx(&c, peers, n, plan, 0) != 0)
        return 0.0;
    if (at)
        for (int i = 0; i < n; i++)
            c.at[i] = c.from[i] >= 0 ? at[i] : -1;
    s_totals(&c);
    double low = plan_value(&c);
    s_ctx_free(&c);
    return low;
}

double swarm_policy_best(const swarm_peer_view_t *peers, int n, const swarm_plan_t *plan, int *at)
{
    plan_ctx_t c;
    if (s_ctx(&c, peers, n, plan, 0) != 0)
        return 0.0;
    for (int i = 0; i < n; i++)
        c.movable[i] = c.from[i] >= 0; // every peer, moved or joining, from scratch
    double best = s_solve(&c);
    if (at)
        for (int i = 0; i < n; i++)
            at[i] = c.from[i] >= 0 ? c.at[i] : peers[i].stage;
    s_ctx_free(&c);
    return best;
}

int swarm_policy_plan(const swarm_peer_view_t *peers, int n, const swarm_plan_t *plan, int *to,
                      double *now_bound, double *new_bound)
{
    plan_ctx_t c;
    *now_bound = *new_bound = 0.0;
    for (int i = 0; i < n; i++)
        to[i] = peers[i].stage;
    if (s_ctx(&c, peers, n, plan, 1) != 0)
        return 0;
    c.waves = 1;
    double low = plan_value(&c), best = low, weight = 0.0, costs = 0.0;
    int empty = 0, movable = 0;
    for (int s = 0; s < c.S; s++)
        empty += c.count[s] == 0, costs += plan->cost[s];
    for (int i = 0; i < n; i++)
        movable += c.movable[i], weight += c.w[i];
    // no split beats every stage its exact share (weight / costs): when that
    // is within the margin of the bound now, no plan can be worth making
    int hopeless = weight / costs * (1.0 + 1e-9) <= low * (1.0 + plan->margin);
    int *trail = movable > PLAN_EXACT_PEERS && !hopeless
               ? malloc(4 * PLAN_SEARCH_STEPS * sizeof *trail) : NULL;
    if (empty || hopeless) // an empty stage is refill's (swarm_policy_refill)
        ;
    else if (movable <= PLAN_EXACT_PEERS)
        best = s_solve(&c);
    else if (trail)
        best = s_priced(&c, trail);
    free(trail);
    // worth it: more than the margin (speeds swing), and the gain over the
    // horizon more than what the fetches cost
    // (a wave after the first waits a check's interval, the whole bound's
    // time as a fetch's)
    int moves, waves = s_waves(&c);
    double fetch = s_fetch(&c, &moves) + (waves > 1 ? waves - 1 : 0) * plan->wave_s;
    *now_bound = low;
    *new_bound = best;
    int worth = moves > 0 && best > low * (1.0 + plan->margin)
             && plan_worth(plan, low, best, fetch) > 0;
    if (worth)
        for (int i = 0; i < n; i++)
            to[i] = c.from[i] >= 0 ? c.at[i] : peers[i].stage;
    s_ctx_free(&c);
    return worth ? moves : 0;
}

// A move of a plan: the stage it leaves, the one it goes to, its weight, its peer.
typedef struct {
    int f, d;
    double w;
    int i;
} leave_t;

static int s_by_route_weight(const void *a, const void *b)
{
    const leave_t *x = a, *y = b;
    if (x->f != y->f || x->d != y->d)
        return x->f != y->f ? x->f - y->f : x->d - y->d;
    return x->w < y->w ? -1 : x->w > y->w ? 1 : x->i - y->i;
}

// Of the moves from one stage to another, s_waves starts the first ones
// by index; which of them go first changes no later wave (a wave counts
// the peers that reach a stage, not which), so the lightest go now and
// the stage they leave keeps its heaviest until its stand-ins are ready.
// Started by index, scripts/bench-hetero.sh's stage of four slow nodes
// kept its slowest, a sixth of its speed, through two steps of 4.3-6.0 s
// where the steps around them took 1-2 s. -1 when out of memory.
static int s_wave_lightest(plan_ctx_t *c)
{
    leave_t *l = malloc((size_t) (c->n > 0 ? c->n : 1) * sizeof *l);
    if (!l)
        return -1;
    int m = 0;
    for (int i = 0; i < c->n; i++)
        if (c->movable[i] && c->at[i] != c->from[i] && c->wave[i] >= 0)
            l[m++] = (leave_t) { c->from[i], c->at[i], c->w[i], i };
    qsort(l, (size_t) m, sizeof *l, s_by_route_weight);
    for (int a = 0, b; a < m; a = b) {
        int now = 0;
        for (b = a; b < m && l[b].f == l[a].f && l[b].d == l[a].d; b++)
            now += c->wave[l[b].i] == 0;
        for (int k = a; k < b; k++) // (a later wave's number: only the first's matters)
            c->wave[l[k].i] = k - a < now ? 0 : 1;
    }
    free(l);
    return 0;
}

int swarm_policy_wave(const swarm_peer_view_t *peers, int n, const swarm_plan_t *plan, int *to)
{
    plan_ctx_t c;
    if (s_ctx(&c, peers, n, plan, 1) != 0)
        return -1;
    for (int i = 0; i < n; i++)
        c.at[i] = c.movable[i] ? to[i] : c.from[i];
    s_totals(&c);
    int waves = s_waves(&c), waiting = 0;
    if (waves >= 0 && s_wave_lightest(&c) != 0)
        waves = -1; // (out of memory: none starts)
    for (int i = 0; i < n; i++) {
        int moves = c.from[i] >= 0 && to[i] != peers[i].stage;
        if (moves && (waves < 0 || !c.movable[i] || c.wave[i] != 0))
            to[i] = peers[i].stage, waiting++;
    }
    s_ctx_free(&c);
    return waves < 0 ? -1 : waiting;
}

double swarm_policy_best_of(const double *mem, const double *w, const int *from, int n,
                            const swarm_plan_t *plan)
{
    swarm_peer_view_t *v = calloc((size_t) (n > 0 ? n : 1), sizeof *v);
    if (!v)
        return 0.0;
    for (int i = 0; i < n; i++) {
        v[i] = (swarm_peer_view_t) { .stage = from ? from[i] : -1, .memory = mem[i],
                                     .moved_at = -1e30 };
        for (int s = 0; s < plan->stages && v[i].stage < 0; s++)
            if (swarm_policy_holds(&v[i], plan->need, s))
                v[i].stage = s;
        v[i].joining = v[i].stage >= 0;
        v[i].tok_s = v[i].joining ? (w[i] > 0.0 ? w[i] : 1.0) / plan->cost[v[i].stage] : 0.0;
    }
    double bound = swarm_policy_best(v, n, plan, NULL);
    free(v);
    return bound;
}
