/* policy_audit.c - what audits cost a split of the peers over the stages:
 * the time a stage's audit takes as the router hands its shares out
 * (swarm_policy_audit_s), the value a plan weighs a split by with them
 * (plan_value), and, past the exact search, the repair that moves peers
 * into the stages of the longest audits (plan_repair). Pure, as
 * policy_plan.c, whose context it works in (policy_int.h).
 */
#include "policy_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PLAN_REPAIR_MOVES 64      // moves one plan's audit repair makes at most
#define PLAN_REPAIR_EXACT 8       // a repair move's candidates valued exactly
#define PLAN_REPAIR_GAP 2.0       // a stage's audit repaired when over this many of its steps
#define PLAN_REPAIR_PATIENCE 8    // moves in a row that raise no value, then the repair ends

static int s_by_speed(const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;
    return x > y ? -1 : x < y;
}

double swarm_policy_audit_s(double *tok_s, int k)
{
    double total = 0.0, most = 0.0;
    int n = 0;
    for (int i = 0; i < k; i++)
        if (tok_s[i] > 0.0)
            total += tok_s[n++] = tok_s[i];
    if (n < 2)
        return 0.0;
    qsort(tok_s, (size_t) n, sizeof *tok_s, s_by_speed); // the largest share first
    double few[64] = { 0 }, *done = n <= 64 ? few : calloc((size_t) n, sizeof *done);
    if (!done)
        return 0.0; // (counted as no audit)
    // the largest share, all free: split among the fastest others when one
    // would take SWARM_AUDIT_SPLIT_GAIN times the split and the stage's step
    double others = 0.0, first = tok_s[0] / total;
    for (int j = 1; j <= SWARM_AUDIT_PARTS && j < n; j++)
        others += tok_s[j];
    int split = n >= 3
                && first / tok_s[1] >= SWARM_AUDIT_SPLIT_GAIN * fmax(first / others, 1.0 / total);
    for (int j = 1; split && j <= SWARM_AUDIT_PARTS && j < n; j++)
        done[j] = most = first / others;
    for (int i = split; i < n; i++) {
        int by = -1;
        double share = tok_s[i] / total, end = INFINITY;
        for (int j = 0; j < n; j++)
            if (j != i && done[j] + share / tok_s[j] < end)
                by = j, end = done[j] + share / tok_s[j];
        // the last free replica whose share is handed out (by < i) leaves
        // the shares that wait none but their own: the fastest free one
        // whose share waits, w, takes this one instead where it finishes
        // it before by would this one and then w's (s_verifier in
        // engine_audit_out.c), and equal replicas' shares go round
        if (by < i && done[by] == 0.0) {
            int handed = 0, w = -1; // other free ones handed out; the first waiting
            for (int j = 0; j < n; j++)
                if (j != i && j != by && done[j] == 0.0) {
                    handed += j < i;
                    w = w < 0 && j > i ? j : w;
                }
            if (handed == 0 && w >= 0 && share / tok_s[w] < (share + tok_s[w] / total) / tok_s[by])
                by = w, end = share / tok_s[w];
        }
        done[by] = end;
        most = fmax(most, end);
    }
    if (done != few)
        free(done);
    return most;
}

// Stage s's audit (swarm_policy_audit_s, seconds a token) under `at`, with
// peer `add` on it and peer `drop` off it (-1: none).
static double s_audit_of(plan_ctx_t *c, int s, int add, int drop)
{
    int k = 0;
    for (int i = 0; i < c->n; i++)
        if ((c->at[i] == s && i != drop) || i == add)
            c->u[k++] = c->w[i] / c->pl->cost[s];
    return swarm_policy_audit_s(c->u, k);
}

// What the plan weighs a split by: its bound (plan_low) in a swarm without
// audits; with them (c->audit, the fraction of steps audited), the tokens
// a second of a step's mean time, a step taking a token k times the
// bottleneck's time (c->k: what steps without audits measured) and, in
// that fraction of them, the slowest stage's audit too (every stage's
// audits run side by side, after the step's sums are in). A fast replica
// whose share only a slow one can recompute costs the steps audited four
// times or more their time (scripts/bench-hetero.sh: 1.7 s a step, 7.6
// audited), so a split that pairs replicas of like speed can beat one of
// a higher bound. With audits, each stage's into A[].
static double s_value(plan_ctx_t *c, double *A)
{
    double low = plan_low(c, NULL), most = 0.0;
    if (!(c->audit > 0.0))
        return low;
    for (int s = 0; s < c->S; s++)
        most = fmax(most, A[s] = s_audit_of(c, s, -1, -1));
    return low > 0.0 ? 1.0 / (c->k / low + c->audit * most) : low;
}

double plan_value(plan_ctx_t *c)
{
    double A[SWARM_MAX_STAGES];
    return s_value(c, A);
}

// ---- past the exact search: moves that shorten the longest audit ----
//
// The searches of more than PLAN_EXACT_PEERS peers place them by the bound
// alone (weighing each step's audits would cost a pass over the peers), and
// leave stages where a fast replica's only verifiers are far slower: a GPU
// beside one CPU in the volunteer mix of docs/scale.md, every audited step
// waiting 25 of the stage's steps for the CPU. After them, up to
// PLAN_AUDIT_PEERS peers, a repair (plan_repair) moves peers into and out
// of the stage of the longest audit. A peer leaves a stage of three or
// more only: a stage's last verifier is never taken, which would end its
// audits instead of shortening them.

typedef struct {
    int i, to;
    double v; // its score
} cand_t;

// Keep x among the best `most` of top[*n] by score.
static void s_keep(cand_t *top, int *n, int most, cand_t x)
{
    if (*n == most && !(x.v > top[*n - 1].v))
        return;
    int k = *n < most ? (*n)++ : most - 1;
    for (; k > 0 && x.v > top[k - 1].v; k--)
        top[k] = top[k - 1];
    top[k] = x;
}

// Moves of one peer at a time into or out of the stage of the longest
// audit (see above), into c->at. Where several stages share the longest
// (three of a GPU beside one CPU), no one move shortens it, and each costs
// the bound something: a move is scored as if the stages that share the
// longest were all made as its own are (the value, with the longest audit
// of the other stages), the move that scores best is made, and the moves
// are kept up to where the value (plan_value) was highest; a plan's
// (priced) only when that gain over the horizon pays for their fetches.
// It ends when no stage's audit takes over PLAN_REPAIR_GAP of its step
// (one whose replicas redo its whole work side by side takes one): 300
// peers, their stages of 37, spent 127 us of the engine a request, not
// 2.7, on moves that gained nothing.
void plan_repair(plan_ctx_t *c, int priced)
{
    int *trail = malloc(2 * PLAN_REPAIR_MOVES * sizeof *trail);
    unsigned char *moved = calloc((size_t) (c->n > 0 ? c->n : 1), 1);
    if (!trail || !moved) {
        free(trail), free(moved);
        return; // (the plan by the bound)
    }
    double A[SWARM_MAX_STAGES]; // each stage's audit under `at`, as s_value leaves them
    double start = s_value(c, A), top_v = start, fetch = 0.0, top_fetch = 0.0;
    int moves = 0, top_moves = 0; // made, and kept
    while (moves < PLAN_REPAIR_MOVES) {
        int m = 0, far = 0;
        for (int s = 0; s < c->S; s++) {
            m = A[s] > A[m] ? s : m;
            far |= A[s] * c->T[s] > PLAN_REPAIR_GAP;
        }
        if (!far || !(plan_low(c, NULL) > 0.0))
            break;
        double rest = 0.0; // the longest audit of the stages that do not share m's
        for (int s = 0; s < c->S; s++)
            rest = A[s] < A[m] * (1.0 - 1e-9) && A[s] > rest ? A[s] : rest;
        // the best PLAN_REPAIR_EXACT moves by a score that takes each
        // stage's audit as it is but m's (a peer more rarely lengthens
        // one), then those scored exactly
        cand_t top[PLAN_REPAIR_EXACT];
        int ntop = 0;
        for (int i = 0; i < c->n; i++) {
            int s = c->at[i];
            if (!c->movable[i] || moved[i] || s < 0 || c->count[s] < 3 || !plan_may_leave(c, i, s))
                continue;
            double am = s == m ? s_audit_of(c, m, -1, i) : 0.0;
            for (int t = 0; t < c->S; t++) {
                if (t == s || (s != m && t != m) || !plan_holds(c, i, t))
                    continue; // into m, or out of it
                double lo = INFINITY;
                for (int u = 0; u < c->S; u++) {
                    double T = c->T[u] + (u == t ? c->w[i] / c->pl->cost[t] : 0.0)
                             - (u == s ? c->w[i] / c->pl->cost[s] : 0.0);
                    lo = T < lo ? T : lo;
                }
                double a = t == m ? s_audit_of(c, m, i, -1) : am; // m's after the move
                if (!(a < A[m] * (1.0 - 1e-9)) || !(lo > 0.0))
                    continue; // no shorter
                double most = fmax(fmax(a, rest), A[t == m ? s : t]);
                s_keep(top, &ntop, PLAN_REPAIR_EXACT,
                       (cand_t) { i, t, 1.0 / (c->k / lo + c->audit * most) });
            }
        }
        cand_t best = { -1, -1, 0.0 };
        for (int k = 0; k < ntop; k++) {
            int i = top[k].i, s = c->at[i], t = top[k].to;
            double as = s_audit_of(c, s, -1, i), a_to = s_audit_of(c, t, i, -1);
            plan_put(c, i, t);
            double lo = plan_low(c, NULL);
            plan_put(c, i, s);
            double v = 1.0 / (c->k / lo + c->audit * fmax(fmax(as, a_to), rest));
            if (best.i < 0 || v > best.v)
                best = (cand_t) { i, t, v };
        }
        if (best.i < 0)
            break;
        trail[2 * moves] = best.i, trail[2 * moves + 1] = c->at[best.i];
        moves++;
        moved[best.i] = 1;
        plan_put(c, best.i, best.to);
        fetch += c->pl->move_s ? c->pl->move_s[best.to] : 0.0;
        double v = s_value(c, A);
        if (v > top_v * (1.0 + 1e-9))
            top_v = v, top_moves = moves, top_fetch = fetch;
        else if (moves - top_moves >= PLAN_REPAIR_PATIENCE)
            break;
    }
    if (priced && top_moves > 0 && !(plan_worth(c->pl, start, top_v, top_fetch) > 0.0))
        top_moves = 0;
    while (moves > top_moves) { // back to where the value was highest
        moves--;
        plan_put(c, trail[2 * moves], trail[2 * moves + 1]);
    }
    free(trail), free(moved);
}
