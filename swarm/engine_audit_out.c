/* engine_audit_out.c - which sums a step audits and who recomputes each:
 * the step's secret draw once every stage's sums are in, and the hand-out
 * of the shares drawn to the replicas that finish them first (what an
 * audit is and how it is judged: engine_audit.c).
 */
#include "engine_int.h"

// Candidates the fastest first, then by index.
static int s_cmp_cand(const void *x, const void *y)
{
    const audit_cand_t *a = x, *b = y;
    return a->sp != b->sp ? (a->sp < b->sp ? 1 : -1) : (a->p > b->p) - (a->p < b->p);
}

// Stage s's replicas that can recompute a share (ready, not failed) into
// audit_cand, the fastest first, with the running sums of their speeds and
// of what they have still to recompute (s_hand_out). Their number.
static int s_cands(swarm_engine_t *r, int s)
{
    if (r->audit_cand_cap < r->peers_cap) {
        audit_cand_t *c = realloc(r->audit_cand, (size_t) r->peers_cap * sizeof *c);
        if (!c)
            abort(); // bookkeeping (STYLE.md: small allocations may abort)
        r->audit_cand = c;
        r->audit_cand_cap = r->peers_cap;
    }
    audit_cand_t *c = r->audit_cand;
    int n = 0;
    for (int k = 0; k < r->ready[s].n; k++) {
        const peer_t *pe = &r->peers[r->ready[s].peer[k]];
        if (pe->failed)
            continue;
        c[n++] = (audit_cand_t) {
            .p = r->ready[s].peer[k],
            .sp = pe->tok_s > 1e-3 ? pe->tok_s : 1e-3,
            .load = pe->audit_of >= 0 ? pe->part.left : 0,
        };
    }
    qsort(c, (size_t) n, sizeof *c, s_cmp_cand);
    double sp = 0.0, load = 0.0;
    for (int k = 0; k < n; k++) {
        c[k].psp = sp, c[k].pload = load; // of those before it
        sp += c[k].sp, load += c[k].load;
        r->peers[c[k].p].audit_rank = k;
    }
    return n;
}

// Replicas of stage s that could recompute t's share, free now or not:
// ready, not failed, not t, not among not[].
int engine_audit_candidates(const swarm_engine_t *r, int s, int t, const int *not, int nnot)
{
    int n = 0;
    for (int k = 0; k < r->ready[s].n; k++) {
        int p = r->ready[s].peer[k], skip = p == t || r->peers[p].failed;
        for (int j = 0; j < nnot; j++)
            skip |= p == not[j];
        n += !skip;
    }
    return n;
}

// A share is split among several free verifiers, each a part in
// proportion to its speed, when its single verifier (or the pool of busy
// faster ones) would take SWARM_AUDIT_SPLIT_GAIN (swarm.h, which the
// plans' model of an audit follows) times as long as the split, and
// as long as the stage's balanced time (every share waiting and being
// recomputed, over every candidate's speed): the shares of a stage of
// equal replicas all audited go one to each, as a split would leave the
// target idle. A part is of AUDIT_PART_MIN micro-batches at least: each
// costs its verifier a sum sent to the router. A GPU's share recomputed
// by the fastest of the six CPUs beside it took 3 times as long as split
// among them (docs/scale.md, "A share split among its verifiers").
#define AUDIT_PART_MIN 2

// The free candidates from c[j] on that may take a part of target t's
// share of n micro-batches (not t, nor barred from parts: no_split), the
// fastest first, at most SWARM_AUDIT_PARTS, into v[], and their parts into
// mbs[]: in proportion to their speeds, the slowest left out until every
// part is of AUDIT_PART_MIN or more. Their number (under 2: no split),
// and their summed speed in *sp.
static int s_parts(const swarm_engine_t *r, const audit_cand_t *c, int ncand, int j, int t,
                   int n, int *v, int *mbs, double *sp)
{
    double speed[SWARM_AUDIT_PARTS];
    int m = 0;
    for (int i = j; i < ncand && m < SWARM_AUDIT_PARTS; i++) {
        const peer_t *pe = &r->peers[c[i].p];
        if (c[i].p != t && pe->audit_of < 0 && !pe->no_split)
            v[m] = c[i].p, speed[m++] = c[i].sp;
    }
    for (; m >= 2; m--) {
        double total = 0.0;
        for (int k = 0; k < m; k++)
            total += speed[k];
        int given = 0;
        for (int k = 0; k < m; k++)
            given += mbs[k] = (int) (n * speed[k] / total);
        for (int k = 0; given < n; k = (k + 1) % m) // what rounding left, the fastest first
            mbs[k]++, given++;
        if (mbs[m - 1] >= AUDIT_PART_MIN) {
            *sp = total;
            return m;
        }
    }
    return 0;
}

// Whether p's own sum is drawn and waits for a verifier.
static int s_waits(const swarm_engine_t *r, int p)
{
    const audit_t *a = &r->peers[p].audit;
    return a->want && !a->open && !a->done;
}

// Who recomputes t's share of n micro-batches whole, c[j] being the
// fastest free candidate. When c[j]'s own share is handed out already and
// no other such replica is free, a share still waiting would find none
// but its own replica free at its turn, and wait for a busy one: then the
// fastest free replica w whose share waits takes t's instead, where it
// finishes it sooner than c[j] would t's and then w's. Each taking the
// fastest free one, two of three equal replicas recomputed each other's
// share and the third's waited for one of them, and the stage's audit
// took two shares' time (`swarm sim`, 6 equal peers on 2 stages, every
// sum audited, no rebalancing: 0.43 of the throughput unaudited, now
// 0.52). The shares go round this way, and the plans' model
// (swarm_policy_audit_s) hands them out alike.
static int s_verifier(const swarm_engine_t *r, const audit_cand_t *c, int ncand, int j, int t,
                      double n)
{
    int w = -1;
    if (s_waits(r, c[j].p))
        return c[j].p;
    for (int i = 0; i < ncand; i++) {
        int p = c[i].p;
        if (i == j || p == t || r->peers[p].audit_of >= 0)
            continue; // (not free)
        if (!s_waits(r, p))
            return c[j].p; // another free one for the shares that wait
        w = w < 0 ? i : w;
    }
    if (w < 0 || !(n / c[w].sp < (n + r->peers[c[w].p].audit.share) / c[j].sp))
        return c[j].p;
    return c[w].p;
}

// Target t's audit opens: the scratch its verifiers' results are decoded
// into is made at the first.
static void s_open(swarm_engine_t *r, int t)
{
    if (!r->audit_sum && !(r->audit_sum = malloc(r->max_stage_n * sizeof(float))))
        abort();
    if (!r->audit_dx && !(r->audit_dx = malloc(engine_acts_count(r) * sizeof(float))))
        abort();
    r->peers[t].audit.open = 1;
}

// Whether stage s's sums are all in: every ready replica's, none norm only.
static int s_stage_in(const swarm_engine_t *r, int s)
{
    if (!r->stepped[s] || r->ready[s].n < 2 || r->steps_open[s] > 0)
        return 0; // (a STEP not answered yet: of a replica whose sum is not in)
    for (int k = 0; k < r->ready[s].n; k++) {
        const peer_t *pe = &r->peers[r->ready[s].peer[k]];
        if (!pe->got_grad || pe->norm_only)
            return 0;
    }
    return 1;
}

// The audits of l that wait for a verifier, as keys into key[] in the
// order they get one: the largest share first (each takes the fastest free
// replica, so a fast replica's share of a hundred micro-batches is not
// recomputed by a slow one while the fast ones recompute shares of one:
// swarm sim's first step at 3,000 peers waited 150 s for that), then the
// lowest index. A key is -(share * (peers_cap + 1) + peers_cap - t), a
// whole number a double holds exactly; their number.
static int s_waiting_by_share(const swarm_engine_t *r, const engine_ready_t *l, double *key)
{
    double base = (double) r->peers_cap + 1.0;
    int n = 0;
    for (int k = 0; k < l->n; k++) {
        int t = l->peer[k];
        if (s_waits(r, t))
            key[n++] = -((double) r->peers[t].audit.share * base + (double) (r->peers_cap - t));
    }
    qsort(key, (size_t) n, sizeof *key, engine_cmp_double);
    return n;
}

// The target a key of s_waiting_by_share names.
static int s_target_of(const swarm_engine_t *r, double key)
{
    return r->peers_cap - (int) fmod(-key, (double) r->peers_cap + 1.0);
}

// Whether every stage with two or more replicas has all its sums in (the
// stages' STEPs first: until the last stage's is answered, no replica's
// sum is looked at).
static int s_all_in(const swarm_engine_t *r)
{
    for (int s = 0; s < r->stages; s++)
        if (r->ready[s].n >= 2 && (!r->stepped[s] || r->steps_open[s] > 0))
            return 0;
    for (int s = 0; s < r->stages; s++)
        if (r->ready[s].n >= 2 && !s_stage_in(r, s))
            return 0;
    return 1;
}

// Hand the shares of stage s that wait for a verifier out, the largest
// first, each to the replica that would finish it first: a free one now,
// several free ones that split it (s_parts), or (when sooner) the faster
// replicas recomputing other shares, taken as one pool of their summed
// speed (a share of a hundred micro-batches is not recomputed by a slow
// CPU while a GPU is a moment from free, nor a CPU's share by a CPU while
// the GPUs can take it). A share that waits is
// handed out again once a verifier is free (audit_gen). 1 when a dispute
// has nobody left to decide it (the step started over), else 0.
static int s_hand_out(swarm_engine_t *r, int s)
{
    // settled audits, and targets gone, are done with for this attempt
    engine_ready_t *l = &r->audited[s];
    int kept = 0;
    for (int k = 0; k < l->n; k++)
        if (engine_ready_in(r, s, l->peer[k]) && !r->peers[l->peer[k]].audit.done)
            l->peer[kept++] = l->peer[k];
    l->n = kept;
    double *order = r->by_peer; // scratch
    int waiting = s_waiting_by_share(r, l, order);
    if (waiting == 0)
        return 0;
    int ncand = s_cands(r, s), first = 0; // (every candidate before first is busy)
    const audit_cand_t *c = r->audit_cand;
    double held = 0.0, taken = 0.0; // shares waiting for the pool; shares given to free ones
    double balanced = ncand > 0 ? c[ncand - 1].pload + c[ncand - 1].load : 0.0;
    for (int k = 0; k < waiting; k++)
        balanced += r->peers[s_target_of(r, order[k])].audit.share;
    if (ncand > 0)
        balanced /= c[ncand - 1].psp + c[ncand - 1].sp;
    for (int k = 0; k < waiting; k++) {
        int t = s_target_of(r, order[k]);
        audit_t *a = &r->peers[t].audit;
        int left = ncand - !r->peers[t].failed, j = -1; // t's candidates; the fastest free
        for (int m = 0; m < a->n; m++) // (not t, nor its verifiers so far)
            left -= a->by[m] != t && engine_ready_in(r, s, a->by[m]) && !r->peers[a->by[m]].failed;
        if (left == 0) {
            // the replicas that could are gone (dead or failed)
            if (a->n >= 1) {
                engine_audit_verdict(r, t, NULL, 0); // a dispute nobody is left to decide
                return 1;
            }
            r->audit_lost++;
            engine_audit_end(r, t);
            continue;
        }
        while (first < ncand && r->peers[c[first].p].audit_of >= 0)
            first++;
        // the fastest free one, and the fastest free one barred from parts
        // (s_confirmed), which recomputes whole first: if it lied in a part
        // and lies again, two contradict it
        int suspect = -1;
        for (int i = first; i < ncand && (j < 0 || (r->split_barred && suspect < 0)); i++) {
            int out = c[i].p == t || r->peers[c[i].p].audit_of >= 0;
            for (int m = 0; m < a->n; m++)
                out |= c[i].p == a->by[m];
            j = j < 0 && !out ? i : j;
            suspect = !out && r->peers[c[i].p].no_split ? i : -1;
        }
        if (j < 0)
            continue; // when one is free
        if (suspect >= 0) {
            s_open(r, t);
            taken += a->share;
            engine_audit_ask(r, t, c[suspect].p);
            continue;
        }
        // the pool: the candidates before j, busy now, less t and its verifiers
        double n = a->share > 0 ? a->share : 1, sp = c[j].psp, load = c[j].pload + taken + held;
        for (int m = -1; m < a->n; m++) {
            int x = m < 0 ? t : a->by[m], at = r->peers[x].audit_rank;
            if ((m < 0 || x != t) && at >= 0 && at < j && c[at].p == x)
                sp -= c[at].sp, load -= c[at].load;
        }
        double one = n / c[j].sp, pool = sp > 1e-9 ? (load + n) / sp : INFINITY, split = 0.0;
        int v[SWARM_AUDIT_PARTS], mbs[SWARM_AUDIT_PARTS], m = 0;
        if (a->n == 0 && !a->whole && fmin(one, pool) >= SWARM_AUDIT_SPLIT_GAIN * balanced)
            m = s_parts(r, c, ncand, j, t, a->share, v, mbs, &split); // (no scan where none pays)
        if (m >= 2 && fmin(one, pool) < SWARM_AUDIT_SPLIT_GAIN * fmax(n / split, balanced))
            m = 0;
        if (m == 0 && pool < one) {
            held += n; // sooner from the faster ones, busy now
            continue;
        }
        s_open(r, t);
        taken += n;
        if (m >= 2)
            engine_audit_split(r, t, v, mbs, m);
        else
            engine_audit_ask(r, t, a->n == 0 ? s_verifier(r, c, ncand, j, t, n) : c[j].p);
    }
    return 0;
}

// Start what can start: the step's draw once every stage with two or more
// replicas has all its sums in (once per attempt at the step), and each
// drawn sum's audit as soon as a replica is free for it.
//
// One draw for the whole step, not one for each sum: a number u drawn in
// secret, and each sum audited whose replica's rate (engine_audit_rate_of)
// is above it. Every sum is still audited with its replica's probability,
// but the audits of a step run side by side, each replica recomputing
// another's share, so a step that audits every sum takes as long as one
// that audits one. Drawn for each sum, a step of k sums is audited with
// probability 1 - (1 - F)^k (0.76 for four sums at F = 0.3, nearly every
// step in a big swarm), and each of those steps waits for its audits;
// drawn once, with the highest rate among them: --audit while a replica is
// unproven, --audit-proven once all are proven. Below rates of 1, no stage
// starts its audits before the others' sums are in: a peer of a stage told
// to recompute could tell a peer of another stage, which has not sent its
// sum yet, that this step is checked.
void engine_audits_turn(swarm_engine_t *r)
{
    if (r->audit_rate <= 0.0 || r->evaluating || (r->phase != PH_MB && r->phase != PH_GRAD))
        return;
    int all_in = -1, every = r->audit_rate >= 1.0 && r->audit_proven >= 1.0;
    double u = -1.0; // the step's draw, once some stage needs it
    for (int s = 0; s < r->stages; s++) {
        if (!r->audit_drawn[s]) {
            if (every ? !s_stage_in(r, s) : r->ready[s].n < 2)
                continue; // (every sum checked every step: nothing to tell by starting early)
            if (!every && all_in < 0)
                all_in = s_all_in(r);
            if (!every && !all_in)
                continue;
            if (u < 0.0)
                u = engine_draw(r, DRAW_AUDIT, 0, 0);
            r->audit_drawn[s] = 1;
            r->audit_any = 1;
            for (int k = 0; k < r->ready[s].n; k++)
                r->peers[r->ready[s].peer[k]].audit.share = 0;
            for (int i = 0; i < r->G; i++) { // each replica's share, in one pass
                int p = r->mbs[i].grad_peer[s];
                if (p >= 0 && engine_ready_in(r, s, p))
                    r->peers[p].audit.share++;
            }
            for (int k = 0; k < r->ready[s].n; k++) {
                int p = r->ready[s].peer[k];
                peer_t *pe = &r->peers[p];
                int forced = pe->audit.forced; // (engine_audit_force)
                int share = pe->grad ? pe->audit.share : 0;
                int drawn = share > 0 && u < engine_audit_rate_of(r, p);
                pe->audit = (audit_t) {
                    .want = (forced || drawn) && share > 0,
                    .forced = forced,
                    .share = share,
                };
                if (drawn && !r->audit_hit)
                    r->audit_hit = 1, r->audit_steps++;
                if (pe->audit.want)
                    engine_audit_mark(r, s, p);
            }
        }
        if (r->audit_seen[s] == r->audit_gen[s])
            continue; // no share wants a verifier and none was freed since the last hand-out
        r->audit_seen[s] = r->audit_gen[s];
        if (s_hand_out(r, s) != 0)
            return; // a dispute nobody is left to decide: the step starts over
    }
}

// Something a hand-out of stage s's shares looks at changed: a replica came
// or went, a verifier is free, a share wants one (engine_audits_turn).
void engine_audits_touch(swarm_engine_t *r, int s)
{
    if (s >= 0 && s < SWARM_MAX_STAGES)
        r->audit_gen[s]++;
}

// Audits of this step still to settle: the update waits for them.
int engine_audits_open(swarm_engine_t *r)
{
    engine_audits_turn(r);
    int n = 0;
    for (int s = 0; s < r->stages && r->audit_rate > 0.0 && !r->evaluating; s++) {
        if (!r->audit_drawn[s]) {
            n += s_stage_in(r, s); // (drawn on the next turn)
            continue;
        }
        for (int k = 0; k < r->audited[s].n; k++) {
            int t = r->audited[s].peer[k];
            n += engine_ready_in(r, s, t) && r->peers[t].audit.want && !r->peers[t].audit.done;
        }
    }
    return n;
}

// Forget the step's audits: a new step, or this one starts over (their
// requests are gone with it).
void engine_audits_reset(swarm_engine_t *r)
{
    for (int p = 0; p < r->npeers; p++) {
        r->peers[p].audit = (audit_t) {0};
        r->peers[p].audit_of = -1;
    }
    memset(r->audit_drawn, 0, sizeof r->audit_drawn);
    for (int s = 0; s < SWARM_MAX_STAGES; s++) {
        r->audited[s].n = 0;
        r->audit_gen[s]++;
    }
    r->audit_any = r->audit_hit = r->audit_waits = 0;
}

int engine_audits_begun(const swarm_engine_t *r)
{
    return r->audit_any;
}
