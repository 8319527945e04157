/* engine_audit.c - what a replica's gradient sum is checked against: the
 * micro-batches the router had it accumulate, a norm within the stage's
 * honest history, and, for a secret random draw of the step's sums, another
 * replica recomputing the whole share and its input gradients (an audit).
 */
#include "engine_int.h"

// ---- the norm bound ----------------------------------------------------------

// A stage's gradient sums are judged by their norm per micro-batch against
// the median of the last BOUND_WINDOW accepted ones of the stage (norm-only
// sums of squares count as the same quantity). Above NORM_CEIL times the
// median, or below the median over NORM_FLOOR, a sum fails; each sum is
// learned as at most NORM_LEARN from the median, so the bound follows
// honest drift but a liar cannot walk it up (or down) faster than by
// NORM_LEARN every half window (engine_bound_learn). With fewer than 4 in the
// window there is no bound yet (audits still check); a rollback empties
// the window (the steps it runs again had larger gradients). Honest
// training has spikes (350x the window's median in tests/test_rollback.sh's
// run), so at a stage with other replicas a sum outside the bound is
// audited rather than refused (engine_audit_force); a stage's only
// replica, which nothing can recompute, is refused only far outside it
// (NORM_ALONE either way): the sums of squares of 1e300 that would clip
// every stage's update to nothing.
#define NORM_CEIL 100.0
#define NORM_FLOOR 256.0
#define NORM_ALONE 1e6
#define NORM_LEARN 4.0

// Learn x, an accepted value, into b's window: as the edge of the band
// around the median where it is outside it. Learning only the values inside
// the band froze the median where honest values left it (a stage's outputs
// grew 3.6x in one early step), until honest values failed the bound;
// clamped, the median follows a drift of any size, and a liar who sends
// the most the bound allows moves it at most `band` times in about half a
// window of values (BOUND_WINDOW / 2), the stage's other replicas' values
// holding it back.
void engine_bound_learn(engine_bound_t *b, double x, double band)
{
    if (!(x > 0.0 && isfinite(x)))
        return; // zeros never: a median of 0 would fail every honest value
    if (engine_bound_known(b))
        x = fmin(fmax(x, b->median / band), band * b->median);
    b->v[b->n++ % BOUND_WINDOW] = x;
    int n = b->n < BOUND_WINDOW ? (int) b->n : BOUND_WINDOW;
    double v[BOUND_WINDOW];
    memcpy(v, b->v, (size_t) n * sizeof *v);
    for (int i = 1; i < n; i++) // insertion sort: BOUND_WINDOW values
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    b->median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A sum of `samples` micro-batches of stage s whose sum of squares is
// sumsq, from its only replica (alone) or not: 0, or -ERANGE (outside the
// norm bound) or -EPROTO, and why.
int engine_grad_plausible(swarm_engine_t *r, int s, long samples, double sumsq, int alone,
                          char *why, size_t wn)
{
    if (samples <= 0) {
        if (sumsq == 0.0)
            return 0;
        snprintf(why, wn, "sent a gradient sum of no micro-batches that is not zero");
        return -EPROTO;
    }
    double norm = sqrt(sumsq) / (double) samples;
    engine_bound_t *b = &r->norms[s];
    double med = b->median;
    double ceil = alone ? NORM_ALONE : NORM_CEIL, floor = alone ? NORM_ALONE : NORM_FLOOR;
    if (engine_bound_known(b) && r->tensor_bound > 0 && (norm > ceil * med || norm < med / floor)) {
        snprintf(why, wn, "sent a gradient sum of norm %.3g a micro-batch, %.3gx the stage's "
                 "median %.3g", norm, med > 0 ? norm / med : INFINITY, med);
        return -ERANGE;
    }
    engine_bound_learn(b, norm, NORM_LEARN);
    return 0;
}

// Peer p's audit at stage s is wanted: among the stage's to look at (in
// index order, as the ready peers are).
void engine_audit_mark(swarm_engine_t *r, int s, int p)
{
    if (s >= 0 && s < r->stages) {
        engine_list_add(&r->audited[s], p);
        r->audit_waits = 1;
        engine_audits_touch(r, s);
    }
}

// Replica p of stage s sent a sum outside the norm bound (why) while its
// stage has other replicas: an honest replica's sum is that large when its
// input gradients were, so instead of refusing it the router audits it,
// and the replicas of stage s + 1 whose input gradients went into it (a
// liar among them is caught there). A sum its audit reproduces is used.
void engine_audit_force(swarm_engine_t *r, int p, int s, const char *why)
{
    peer_t *pe = &r->peers[p];
    engine_warn(r, "swarm router: step %ld: peer %d (%s) %s: it is audited, and the replicas whose "
                "input gradients went into it\n", r->step, pe->id, pe->name, why);
    pe->audit.forced = 2;
    pe->audit.want = 1;
    engine_audit_mark(r, s, p);
    for (int i = 0; s + 1 < r->stages && i < r->G; i++) {
        int d = r->mbs[i].grad_peer[s] == p ? r->mbs[i].dx_peer[s + 1] : -1;
        if (d >= 0 && r->peers[d].state == P_READY && r->peers[d].stage == s + 1
            && !r->peers[d].audit.done) {
            r->peers[d].audit.forced = r->peers[d].audit.forced ? r->peers[d].audit.forced : 1;
            r->peers[d].audit.want = 1;
            engine_audit_mark(r, s + 1, d);
        }
    }
}

// The probability that replica p's sum of a step is audited: --audit until
// it has passed SWARM_AUDIT_PROVEN audits in a row since it joined, then
// --audit-proven. A liar that lies in every sum passes none, so it stays
// at --audit (1 - 0.7^20 > 0.999 within 20 steps at the default); honest
// replicas, once proven, cost a tenth of that. What this gives up: a liar
// that sends honest sums until it is proven, and only then lies, is drawn
// at --audit-proven (SECURITY.md).
double engine_audit_rate_of(const swarm_engine_t *r, int p)
{
    return r->peers[p].audits_passed >= SWARM_AUDIT_PROVEN ? r->audit_proven : r->audit_rate;
}

// The fraction of the steps in the next `horizon` seconds the draw audits,
// as a plan weighs it. Now, it is the highest rate among the replicas of
// stages of two or more: --audit while one of them is unproven. The steps
// drawn audit them all at once, so they are proven once the draw has
// picked as many steps as the one that lacks most of SWARM_AUDIT_PROVEN
// passes lacks (that over --audit steps, expected), and --audit-proven
// holds after; steps are taken at the mean time of those so far. Weighed
// at --audit alone, the 100-peer mix's first plan, made while every
// replica was unproven, gave up 40% of the bound to shorten audits that
// the next few audited steps made rare (docs/scale.md).
double engine_audit_rate_ahead(const swarm_engine_t *r, double horizon)
{
    double now = 0.0;
    int lack = 0;
    for (int s = 0; s < r->stages; s++)
        for (int k = 0; r->ready[s].n >= 2 && k < r->ready[s].n; k++) {
            int p = r->ready[s].peer[k];
            now = fmax(now, engine_audit_rate_of(r, p));
            if (SWARM_AUDIT_PROVEN - r->peers[p].audits_passed > lack)
                lack = SWARM_AUDIT_PROVEN - r->peers[p].audits_passed;
        }
    long steps = r->step - r->first;
    double step_s = steps > 0 ? r->train_time / (double) steps : 0.0;
    if (!(now > r->audit_proven) || !(step_s > 0.0) || !(horizon > 0.0))
        return now;
    double ahead = horizon / step_s, unproven = lack / now; // steps
    return unproven >= ahead ? now : (lack + (ahead - unproven) * r->audit_proven) / ahead;
}

// What a plan weighs audits by (swarm_plan_t): the rate over its horizon,
// and with it a step against what the bound says it takes (step_k: a
// pipeline's fill and drain, its links' latency, as the steps the draw did
// not pick measured), without which a plan that gave up bound to shorten
// audits once made 100 volunteer peers' steps longer than it saved
// (docs/scale.md, "Audits weighed past the exact search"). The bound now,
// audits left out, when it weighs them (the log's "the bound: A to B"),
// else 0.
double engine_audit_plan(const swarm_engine_t *r, const swarm_peer_view_t *views, swarm_plan_t *plan)
{
    plan->audit = engine_audit_rate_ahead(r, plan->horizon);
    plan->step_k = 0.0;
    if (!(plan->audit > 0.0))
        return 0.0;
    swarm_plan_t bare = *plan;
    bare.audit = 0.0;
    double bound = swarm_policy_bound(views, r->npeers, &bare, NULL);
    double tokens = (double) r->hp.batch * r->hp.cfg.T;
    if (bound > 0.0 && r->plain_step_s > 0.0)
        plan->step_k = fmin(fmax(r->plain_step_s * bound / tokens, 1.0), 100.0);
    return bound;
}

void engine_grad_peer_set(swarm_engine_t *r, int i, int s, int p)
{
    r->mbs[i].grad_peer[s] = p;
    r->grad_gen++;
}

int engine_share(swarm_engine_t *r, int p, int s)
{
    uint64_t now = r->grad_gen + 1;
    if (r->share_gen[s] != now) { // every replica's count at s, in one pass
        for (int i = 0; i < r->G; i++) {
            int q = r->mbs[i].grad_peer[s];
            if (q < 0 || q >= r->npeers)
                continue;
            peer_t *pq = &r->peers[q];
            if (pq->share_gen != now || pq->share_stage != s)
                pq->share = 0, pq->share_gen = now, pq->share_stage = s;
            pq->share++;
        }
        r->share_gen[s] = now;
    }
    const peer_t *pe = &r->peers[p];
    if (pe->share_gen != now)
        return 0; // the pass met none of its
    if (pe->share_stage == s)
        return pe->share;
    int n = 0; // its parts at two stages (it moved in the step): counted here
    for (int i = 0; i < r->G; i++)
        n += r->mbs[i].grad_peer[s] == p;
    return n;
}

// ---- audits ----------------------------------------------------------------------

// Once every stage with two or more replicas has its gradient sums in, the
// step's sums are audited with probability --audit, drawn once for the step
// (engine_audits_turn) with the run's secret key, which no peer knows (a
// liar cannot tell which of its sums are checked): for each, another
// replica recomputes the target's share of the step
// (the micro-batches it accumulated, whose inputs and output gradients the
// router holds) with BWD audit=1 (the last stage: FWD audit=1, which runs
// its backward), at most AUDIT_INFLIGHT requests at a time, then STEP
// audit=1 for the sum, which the node serves after them. A replica
// recomputes one share at a time (its gradient buffer holds one); a
// stage's audits run side by side. The step's update waits for them all. The two
// agree when every input gradient the target returned is within 1e-3
// relative L2 of the recomputed one (the last stage's loss within 1e-4),
// the micro-batch counts are equal, and the sums are within 1e-3 relative
// L2 (1e-2 over fp16 or int8 gradients). When they do not, a third replica
// recomputes the share: the replica two of the three contradict is
// expelled, and, since its sum or its input gradients are in the step, the
// step starts over without it. With no third replica the disagreement
// cannot be attributed: the step starts over, both stay, and it is counted.
#define AUDIT_INFLIGHT 16

static double s_sum_tolerance(const swarm_engine_t *r)
{
    return r->grad_wire == NET_DTYPE_F32 ? 1e-3 : 1e-2;
}

// The next micro-batch of target t's share at stage s after index i, or G.
static int s_next_mb(const swarm_engine_t *r, int t, int s, int i)
{
    while (++i < r->G && r->mbs[i].grad_peer[s] != t)
        ;
    return i;
}

// The audit peer v recomputes (as its verifier), or NULL.
static audit_t *s_audit_by(swarm_engine_t *r, int v)
{
    int t = v >= 0 && v < r->npeers ? r->peers[v].audit_of : -1;
    return t >= 0 && r->peers[t].audit.open ? &r->peers[t].audit : NULL;
}

// Send verifier v what it may hold of its part of its target's share,
// then the STEP that asks for its sum. A send that fails leaves the
// verifier failed: engine_reap finds it, and engine_audit_lost gives the
// audit to another.
static void s_audit_feed(swarm_engine_t *r, int v)
{
    int t = r->peers[v].audit_of, s = r->peers[t].stage, last = s == r->stages - 1;
    audit_part_t *p = &r->peers[v].part;
    if (r->peers[t].audit.abandoned)
        return;
    while (p->inflight < AUDIT_INFLIGHT && p->next < p->end) {
        net_msg_t *m = last ? engine_fwd_msg(r, p->next, s) : engine_bwd_msg(r, p->next, s);
        if (m && engine_meta_add(m, "audit=1") != 0)
            net_msg_destroy(&m);
        if (!m || engine_send(r, v, &m, R_AUDIT, p->next, s) != 0)
            return;
        p->inflight++;
        p->next = s_next_mb(r, t, s, p->next);
    }
    if (p->next < p->end || p->asked_sum)
        return; // (STEP queues behind the part's requests at the node: no round trip)
    net_msg_t *m = engine_step_msg(r, s, "audit=1\n");
    if (m && engine_send(r, v, &m, R_AUDIT_SUM, -1, s) == 0)
        p->asked_sum = 1;
}

// Verifier v is to recompute target t's micro-batches of `mbs`, from
// index `from` to `end`.
static void s_part_ask(swarm_engine_t *r, int t, int v, int from, int end, int mbs)
{
    r->peers[v].part = (audit_part_t) { .next = from, .end = end, .mbs = mbs, .left = mbs };
    r->peers[v].audit_of = t;
    s_audit_feed(r, v);
}

// Ask replica v to recompute target t's share, whole.
void engine_audit_ask(swarm_engine_t *r, int t, int v)
{
    audit_t *a = &r->peers[t].audit;
    a->by[a->n++] = v;
    s_part_ask(r, t, v, s_next_mb(r, t, r->peers[t].stage, -1), r->G, a->share);
}

// Split target t's share among the m verifiers v[], in share order: v[k]
// recomputes mbs[k] of its micro-batches (engine_audit_out.c chooses).
void engine_audit_split(swarm_engine_t *r, int t, const int *v, const int *mbs, int m)
{
    audit_t *a = &r->peers[t].audit;
    int s = r->peers[t].stage, i = s_next_mb(r, t, s, -1);
    a->parts = a->parts_out = m;
    a->parts_in = a->split_bad = a->split_lost = 0;
    r->audit_splits++;
    for (int k = 0; k < m; k++) {
        int from = i;
        for (int j = 0; j < mbs[k]; j++)
            i = s_next_mb(r, t, s, i);
        a->split_by[k] = v[k];
        s_part_ask(r, t, v[k], from, k == m - 1 ? r->G : i, mbs[k]);
    }
}

// Target t's audit is over (settled or given up): its verifiers are free.
void engine_audit_end(swarm_engine_t *r, int t)
{
    audit_t *a = &r->peers[t].audit;
    for (int k = 0; k < a->n + a->parts; k++) {
        int v = k < a->n ? a->by[k] : a->split_by[k - a->n];
        if (r->peers[v].audit_of == t)
            r->peers[v].audit_of = -1;
    }
    *a = (audit_t) { .done = 1 };
    engine_audits_touch(r, r->peers[t].stage);
}

// Verifier q->peer's result for micro-batch q->mb (checked: its input
// gradient decoded in scratch, at the last stage its loss in e): does it
// match what the target returned?
void engine_audit_result(swarm_engine_t *r, const req_t *q, const msg_in_t *e)
{
    audit_t *a = s_audit_by(r, q->peer);
    if (!a)
        return; // stale
    int s = q->stage, t = r->peers[q->peer].audit_of;
    audit_part_t *p = &r->peers[q->peer].part;
    engine_work_done(r, q); // work like any other: its speed counts it
    p->inflight--;
    p->left--;
    if (a->abandoned)
        return;
    const mb_t *b = &r->mbs[q->mb];
    size_t n = engine_acts_count(r);
    if (s > 0 && b->dx_peer[s] == t && b->dy[s - 1]) {
        // what the target sent the stage before, decoded as that stage's BWD did
        size_t bytes = 0;
        const void *dy = net_msg_raw(b->dy[s - 1], 0, &bytes);
        int bad = net_codec_decode(net_msg_head_const(b->dy[s - 1])->tensors[0].dtype, dy, bytes,
                                   r->audit_dx, n);
        for (size_t j = 0; !bad && b->dy_pow2[s - 1] && j < n; j++)
            r->audit_dx[j] = ldexpf(r->audit_dx[j], -b->dy_pow2[s - 1]);
        if (bad || !engine_close(r->scratch, r->audit_dx, n, 1e-3))
            p->dx_bad = 1;
        for (size_t j = 0; j < n; j++) { // weights in [-1, 1) that no lie is built around
            double x = r->scratch[j], w = (uint32_t) (j * 2654435761u) * 0x1p-31 - 1.0;
            p->dx_fp[0] += x * x;
            p->dx_fp[1] += w * x;
        }
    }
    if (s == r->stages - 1 && b->dx_peer[s] == t) {
        p->dx_fp[2] += e->reply.loss;
        if (!engine_loss_close(e->reply.loss, b->loss))
            p->dx_bad = 1;
    }
    s_audit_feed(r, q->peer);
}

// Target t's audit found the replicas liars[0..n) out (n 0: nobody can
// tell). When no two of three agree, at most one of them is honest (honest
// replicas reproduce each other): a target audited for its own tensor or
// sum outside its stage's bound fails then (it would be audited again in
// every attempt at the step, and the step started over for good); so it
// does when one verifier contradicts it and no other replica can come to
// decide (seed 70 of a lie campaign: 8 peers, 4 liars, a stage of one
// liar and one honest replica started step 2 over for ever).
void engine_audit_verdict(swarm_engine_t *r, int t, const int *liars, int n)
{
    audit_t *a = &r->peers[t].audit;
    int s = r->peers[t].stage, asked = a->n, by[AUDIT_VOTERS], suspect = a->forced == 2;
    memcpy(by, a->by, sizeof by);
    int mbs = engine_share(r, t, s);
    engine_audit_end(r, t);
    if (n == 0) {
        r->audit_undecided++;
        char who[256];
        int len = snprintf(who, sizeof who, "peers %d (%s)", r->peers[t].id, r->peers[t].name);
        for (int k = 0; k < asked && len < (int) sizeof who; k++)
            len += snprintf(who + len, sizeof who - (size_t) len, "%s%d (%s)",
                            k == asked - 1 ? " and " : ", ", r->peers[by[k]].id, r->peers[by[k]].name);
        engine_warn(r, "swarm router: step %ld: stage %d: %s %s the gradient of %d micro-batches; "
                    "%s\n", r->step, s, who, asked > 1 ? "each find another" : "disagree on", mbs,
                    asked > 1 ? "no two agree, and no other replica is left to ask"
                              : "no third replica to decide");
        if (asked > 1 && suspect)
            engine_peer_fail(r, t, "sent a tensor outside its stage's bound, and no replica "
                             "reproduces its gradient sum");
        engine_step_restart(r, "a gradient sum in it is disputed");
        // the next attempt has one more replica: with two, a third; with
        // three of which no two agree, at most one is honest, and one more
        // that is can agree with it (seed 13 of test_sim's liars once
        // started a step over for ever: an honest replica and two liars)
        if (engine_referee(r, s) < 0 && !engine_joining_to(r, s) && asked == 1 && suspect)
            engine_peer_fail(r, t, "sent a tensor outside its stage's bound, and its replica does "
                             "not reproduce its gradient sum");
        return;
    }
    for (int k = 0; k < n; k++) {
        char why[96];
        snprintf(why, sizeof why, "%s a stage %d gradient that two replicas contradict",
                 liars[k] == t ? "returned" : "recomputed", s);
        r->audit_caught++;
        engine_peer_expel(r, liars[k], why);
    }
    if (r->phase == PH_MB || r->phase == PH_GRAD) // not rolled back by the expulsions
        engine_step_restart(r, "a peer whose gradient it used was caught lying");
    else
        engine_audits_reset(r);
}

// Verifiers i and j of target t's audit found the same: the same count,
// the same verdict on the input gradients, the same input gradients and
// losses (by their fingerprints: two liars that both contradict the
// target's differently do not agree), sums within the tolerance (verifier
// j's is the one just decoded in audit_sum; i's was kept). The
// fingerprints' tolerances are ten times what honest recomputations that
// pass engine_close at 1e-3 can differ by: a lie is far outside them.
static int s_verifiers_agree(const swarm_engine_t *r, int t, int i)
{
    const peer_t *pt = &r->peers[t];
    const audit_t *a = &pt->audit;
    int j = a->n - 1, s = pt->stage;
    const double *fi = a->dx_fps[i], *fj = a->dx_fps[j];
    double sq = fmax(fi[0], fj[0]);
    return a->counted[i] && a->counted[j] && a->dx_bads[i] == a->dx_bads[j]
           && fabs(fi[0] - fj[0]) <= 2e-2 * sq && fabs(fi[1] - fj[1]) <= 1e-2 * sqrt(sq)
           && fabs(fi[2] - fj[2]) <= 1e-3 * (fmax(fabs(fi[2]), fabs(fj[2])) + a->share)
           && engine_close(r->audit_sum, pt->audit_sums + (size_t) i * r->max_stage_n,
                           r->stage_n[s], s_sum_tolerance(r));
}

// Target t's audit_sums: its verifiers' sums (AUDIT_VOTERS - 1 of them),
// made at the first that is kept.
static float *s_sums(swarm_engine_t *r, int t)
{
    peer_t *pt = &r->peers[t];
    if (!pt->audit_sums
        && !(pt->audit_sums = malloc((AUDIT_VOTERS - 1) * r->max_stage_n * sizeof(float))))
        abort();
    return pt->audit_sums;
}

// Target t's sum is confirmed (two agree on it): one more audit passed.
// When a split round did not reproduce it first, one or more of that
// round's verifiers lied (which, their parts' sum cannot tell): each is
// barred from parts (no_split) and handed whole shares first
// (engine_audit_out.c), where two contradict a lie and expel it; one whose
// whole share two confirm takes parts again.
static void s_confirmed(swarm_engine_t *r, int t)
{
    peer_t *pt = &r->peers[t];
    const audit_t *a = &pt->audit;
    pt->audits_passed++;
    if (!a->whole || a->split_lost)
        return;
    char who[256] = "";
    for (int k = 0, len = 0; k < a->parts; k++) {
        peer_t *pv = &r->peers[a->split_by[k]];
        r->split_barred += !pv->no_split;
        pv->no_split = 1;
        if (len < (int) sizeof who)
            len += snprintf(who + len, sizeof who - (size_t) len, "%s%d (%s)", k ? ", " : "",
                            pv->id, pv->name);
    }
    engine_warn(r, "swarm router: step %ld: stage %d: peers %s split the share of peer %d (%s) "
                "and did not reproduce its gradient, which two replicas confirm: each recomputes "
                "a share whole before it takes a part again\n", r->step, pt->stage, who, pt->id,
                pt->name);
}

// A split round of target t's audit has every part's sum in (or lost):
// it passes when every part was of its count, reproduced the target's
// input gradients, and the parts add up to the target's sum (within a
// whole sum's tolerance); else one verifier recomputes the share whole.
static void s_split_settle(swarm_engine_t *r, int t)
{
    peer_t *pt = &r->peers[t];
    audit_t *a = &pt->audit;
    int s = pt->stage;
    if (a->abandoned) {
        engine_audit_end(r, t);
        return;
    }
    if (!a->split_bad && a->parts_in == a->parts
        && engine_close(pt->audit_sums, pt->grad, r->stage_n[s], s_sum_tolerance(r))) {
        r->audits++;
        s_confirmed(r, t);
        engine_audit_end(r, t);
        engine_audits_turn(r);
        return;
    }
    if (!a->split_lost)
        engine_warn(r, "swarm router: step %ld: stage %d: the %d replicas that split the share of "
                    "peer %d (%s) do not reproduce its gradient; one replica recomputes it whole\n",
                    r->step, s, a->parts, pt->id, pt->name);
    a->whole = 1;
    a->open = 0; // for one verifier, once one is free
    engine_audits_touch(r, s);
    engine_audits_turn(r);
}

// Verifier v's sum of its part of a split round of target t's audit
// (decoded in audit_sum, its count in e): added to the round's.
static void s_part_sum(swarm_engine_t *r, int t, int v, const msg_in_t *e)
{
    peer_t *pt = &r->peers[t];
    audit_t *a = &pt->audit;
    const audit_part_t *p = &r->peers[v].part;
    r->peers[v].audit_of = -1; // its node has closed it: free for another
    engine_audits_touch(r, pt->stage);
    if (!a->abandoned) {
        float *sum = s_sums(r, t);
        a->split_bad |= p->dx_bad || e->reply.samples != p->mbs;
        for (size_t j = 0; j < r->stage_n[pt->stage]; j++)
            sum[j] = a->parts_in ? sum[j] + r->audit_sum[j] : r->audit_sum[j];
        a->parts_in++;
    }
    if (--a->parts_out == 0)
        s_split_settle(r, t);
}

// Verifier q->peer's sum of the share (checked: decoded in audit_sum, its
// count in e). Two that agree decide: the target and a verifier (every
// verifier before it lied), or two verifiers against the target (it lied,
// and so did any other verifier). Until two agree, another replica is
// asked, up to AUDIT_VOTERS verifiers: two liars that lie differently
// neither outvote an honest target nor hold the stage for ever.
void engine_audit_sum(swarm_engine_t *r, const req_t *q, const msg_in_t *e)
{
    audit_t *a = s_audit_by(r, q->peer);
    if (!a)
        return; // stale
    int t = r->peers[q->peer].audit_of, s = q->stage, k = a->n - 1;
    peer_t *pt = &r->peers[t];
    const audit_part_t *p = &r->peers[q->peer].part;
    if (a->parts_out > 0) {
        s_part_sum(r, t, q->peer, e);
        return;
    }
    if (a->abandoned) {
        engine_audit_end(r, t); // its verifier's node has closed it: free for another
        return;
    }
    a->counted[k] = e->reply.samples == engine_share(r, t, s);
    a->dx_bads[k] = p->dx_bad;
    memcpy(a->dx_fps[k], p->dx_fp, sizeof p->dx_fp);
    a->agree[k] = !p->dx_bad && a->counted[k]
                  && engine_close(r->audit_sum, pt->grad, r->stage_n[s], s_sum_tolerance(r));
    r->peers[q->peer].audit_of = -1; // free for another audit
    engine_audits_touch(r, s);
    if (k == 0 && a->agree[k]) {
        r->audits++;
        s_confirmed(r, t);
        r->peers[q->peer].no_split = 0; // it recomputed a share whole as two agree: parts again
        engine_audit_end(r, t);
        engine_audits_turn(r);
        return;
    }
    int liars[AUDIT_VOTERS + 1] = {0}, n = 0;
    if (a->agree[k]) {
        for (int i = 0; i < k; i++)
            liars[n++] = a->by[i]; // each disagreed with the target, which two confirm
        s_confirmed(r, t);
    } else {
        for (int j = 0; j < k && n == 0; j++) {
            if (!s_verifiers_agree(r, t, j))
                continue;
            liars[n++] = t;
            for (int i = 0; i < k; i++)
                if (i != j)
                    liars[n++] = a->by[i];
        }
    }
    if (n > 0) {
        r->audits++;
        engine_audit_verdict(r, t, liars, n);
        return;
    }
    int more = k + 1 < AUDIT_VOTERS ? engine_audit_candidates(r, s, t, a->by, a->n)
                                    : 0; // free now or not
    if (k == 0)
        engine_warn(r, "swarm router: step %ld: stage %d: peer %d (%s) does not reproduce the "
                    "gradient of peer %d (%s)%s\n", r->step, s, r->peers[a->by[0]].id,
                    r->peers[a->by[0]].name, pt->id, pt->name,
                    more > 0 ? "; asking a third replica" : "");
    else
        engine_warn(r, "swarm router: step %ld: stage %d: peer %d (%s) agrees with none of the %d "
                    "before it on the gradient of peer %d (%s)%s\n", r->step, s,
                    r->peers[a->by[k]].id, r->peers[a->by[k]].name, k + 1, pt->id, pt->name,
                    more > 0 ? "; asking another replica" : "");
    if (more == 0) {
        engine_audit_verdict(r, t, liars, 0);
        return;
    }
    // what this verifier found, for the next one's to be held to
    memcpy(s_sums(r, t) + (size_t) k * r->max_stage_n, r->audit_sum, r->stage_n[s] * sizeof(float));
    a->open = 0; // for the next, once one is free
    engine_audits_turn(r);
}

// Target t is dead. Its audit is given up (counted as lost); the step's
// update no longer waits for it (engine_audits_open counts ready targets).
// One not started ends here. An open one sends nothing more, and its
// verifier stays taken until the audit's STEP audit=1 answers, or to the
// step's end when that was not sent yet: its node holds the part of the
// share it was sent, which another audit in the same step would add to
// (the sim found an honest verifier contradicted that way), and a feed
// that went on into the next step reached a node already past it (which
// refused: an audit before it sent its own sum).
void engine_audit_target_gone(swarm_engine_t *r, int t)
{
    audit_t *a = &r->peers[t].audit;
    if (!a->want || a->done || a->abandoned)
        return;
    r->audit_lost++;
    if (!a->open)
        engine_audit_end(r, t);
    else
        a->abandoned = 1;
}

// Verifier p is gone (dead, or a request to it could not be sent) before
// it answered: its audit goes to another replica when one is free
// (engine_audits_turn), from the start (a split round's, once its other
// parts are in: whole). Called for each of its requests
// and once more when it dies (it may have none left).
void engine_audit_lost(swarm_engine_t *r, int p)
{
    audit_t *a = s_audit_by(r, p);
    int t = r->peers[p].audit_of;
    r->peers[p].audit_of = -1;
    if (!a)
        return;
    r->audit_lost++;
    engine_audits_touch(r, r->peers[p].stage); // (p is free: for the one it was to recompute)
    if (a->parts_out > 0) { // a part of a split round: the rest go on, and it goes whole
        a->split_bad = a->split_lost = 1;
        if (--a->parts_out == 0)
            s_split_settle(r, t);
        return;
    }
    audit_t fresh = { .want = 1, .forced = a->forced, .share = a->share, .whole = a->whole,
                      .parts = a->parts, .split_lost = a->split_lost };
    memcpy(fresh.split_by, a->split_by, sizeof fresh.split_by);
    r->peers[t].audit = fresh;
    engine_audit_mark(r, r->peers[t].stage, t);
}
