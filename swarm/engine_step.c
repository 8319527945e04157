/* engine_step.c - the end of a step's work: STEP to each stage once its
 * work is sent, the replicas' gradients summed in peer order, the global
 * clip, UPDATE (or a stage's only replica applying its own), and the
 * replicas' checksums compared.
 */
#include "engine_int.h"

// Latency hiding across steps: the next step may start right behind this
// step's UPDATEs, before the replicas confirm them (a node serves UPDATE
// before anything sent after it, so the next FWDs see the new parameters);
// saves a round trip a step. The checksums are compared when the
// confirmations are in (R_UPDATE requests with mb = 1). Not on the run's
// last step: the run would end before them.
static int s_update_pipelined(const swarm_engine_t *r)
{
    return r->step + 1 < engine_stop(r) && r->update_pending == 0 && r->self_peer < 0;
}

// A STEP of this step to stage s with meta (or none); NULL if it cannot be
// made.
net_msg_t *engine_step_msg(swarm_engine_t *r, int s, const char *meta)
{
    net_msg_t *m = net_msg_new(NET_MSG_STEP);
    net_msg_head(m)->step = (uint64_t) r->step;
    net_msg_head(m)->stage = (uint32_t) s;
    if (meta && engine_meta(m, "%s", meta) != 0)
        net_msg_destroy(&m);
    return m;
}

void engine_step_begin(swarm_engine_t *r)
{
    engine_mbs_clear(r);
    for (int p = 0; p < r->npeers; p++) {
        peer_t *pe = &r->peers[p];
        pe->got_grad = pe->in_step = 0; // nobody's gradient of this step is in yet
        if (pe->state == P_DEAD) {
            free(pe->grad); // the last step's sum of a peer that died: counted, done with
            pe->grad = NULL;
        }
    }
    engine_backs(r); // (such a peer that spoke meanwhile joins again)
    memset(r->stepped, 0, sizeof r->stepped);
    engine_audits_reset(r);
    r->pending = 0;
    r->phase = PH_MB;
    r->step_t0 = engine_secs(r);
    engine_window_update(r);
}

// Every micro-batch's loss is in: each is through or in its backward
// (none waits or is in forward).
static int s_losses_in(const swarm_engine_t *r)
{
    return engine_mb_count(r, 0, engine_mb_place(r->stages, r->stages, 0)) == 0;
}

// Every micro-batch's gradient work at stage s has been sent this step:
// its BWD (the last stage: its FWD, which runs the backward too). None
// waits to be sent, nor any of stage s's work to be run again.
static int s_stage_sent(const swarm_engine_t *r, int s)
{
    int S = r->stages;
    if (r->retry_n > 0 || r->redo_head[s] >= 0)
        return 0;
    if (s == S - 1) // none waits or is in forward before the last stage
        return engine_mb_count(r, 0, engine_mb_place(S, S - 1, 0)) == 0;
    // none waits or is in forward, none in backward above s
    return engine_mb_count(r, 0, engine_mb_place(S, S, 0)) == 0
           && engine_mb_count(r, engine_mb_place(S, s + 1, 1), engine_mb_place(S, S - 1, 1)) == 0;
}

// Replicas of stage s whose gradient sum came in this step and that died
// since (engine_step_unask keeps it): the stage's update is their sums and
// the survivors', so no survivor may keep its own.
static int s_dead_grads(const swarm_engine_t *r, int s)
{
    int n = 0;
    for (int p = 0; p < r->npeers; p++)
        n += r->peers[p].got_grad && r->peers[p].state == P_DEAD && r->peers[p].stage == s;
    return n;
}

// STEP to every ready replica of stage s: send your gradient (a stage's
// only replica keeps it and sends its norm, unless a dead replica's sum is
// in already).
static void s_step_ask(swarm_engine_t *r, int s)
{
    r->stepped[s] = 1;
    int only = engine_ready_count(r, s) == 1 && s_dead_grads(r, s) == 0;
    for (int p = 0; p < r->npeers; p++) {
        if (r->peers[p].state != P_READY || r->peers[p].stage != s)
            continue;
        r->peers[p].in_step = 0;
        r->peers[p].got_grad = 0;
        r->peers[p].norm_only = only;
        net_msg_t *m = engine_step_msg(r, s, only ? "norm_only=1\n" : NULL);
        if (m && engine_send(r, p, &m, R_STEP, -1, s) == 0) {
            r->peers[p].in_step = 1;
            r->pending++;
        }
    }
}

// Every STEP of this step is void (a dead peer's work is being redone, and
// the survivors' sums must include it): they are asked again.
void engine_step_unask(swarm_engine_t *r)
{
    if (engine_audits_begun(r)) {
        // the verifiers' buffers hold the audits' sums, not their own
        engine_step_restart(r, "a replica's work was lost during the step's audits");
        return;
    }
    for (int k = 0; k < r->req_slots; k++) {
        req_t *q = engine_req_at(r, k);
        if (q->id && q->kind == R_STEP && q->mb != MB_APPLY)
            engine_req_done(r, q); // their answers are stale now (not the last step's)
    }
    for (int q = 0; q < r->npeers; q++)
        if (r->peers[q].state != P_DEAD)
            r->peers[q].got_grad = 0; // a dead peer's gradient that came in still counts
    memset(r->stepped, 0, sizeof r->stepped);
    r->pending = 0;
    if (r->phase == PH_GRAD)
        r->phase = PH_MB;
}

// A GRAD (checked, and decoded into peer_grad by s_check_reply).
int engine_on_grad(swarm_engine_t *r, const req_t *q, const msg_in_t *e)
{
    if (r->peers[q->peer].norm_only && e->reply.has_sumsq) // (s_check_reply made sure)
        r->peers[q->peer].sumsq = e->reply.sumsq;
    // a sum sent as its count alone (s_check_grad: of no micro-batches) is zero
    r->peers[q->peer].got_grad = net_msg_head_const(e->msg)->ntensors ? GRAD_KEPT : GRAD_NONE;
    r->pending--;
    return 0;
}

// Sum each stage's gradients over its replicas whose GRAD is in, in peer
// order, into grad_sum; the sum of squares of everything that came in (the
// stages' sums and the norms of stages with one replica).
static double s_grad_reduce(swarm_engine_t *r)
{
    double sumsq = 0.0;
    int summed[SWARM_MAX_STAGES] = {0};
    for (int p = 0; p < r->npeers; p++) {
        if (!r->peers[p].got_grad)
            continue;
        if (r->peers[p].norm_only) {
            sumsq += r->peers[p].sumsq;
            continue;
        }
        int s = r->peers[p].stage;
        float *dst = r->grad_sum + r->stage_off[s];
        if (!summed[s]++)
            memset(dst, 0, r->stage_n[s] * sizeof(float));
        // a zero sum adds nothing: from +0, a float sum is never -0, so
        // the bits are those of adding its zeros
        if (r->peers[p].got_grad == GRAD_NONE)
            continue;
        for (size_t j = 0; j < r->stage_n[s]; j++)
            dst[j] += r->peers[p].grad[j];
    }
    // the stages whose gradients came here
    for (int s = 0; s < r->stages; s++)
        for (size_t j = 0; summed[s] && j < r->stage_n[s]; j++)
            sumsq += (double) r->grad_sum[r->stage_off[s] + j] * r->grad_sum[r->stage_off[s] + j];
    return sumsq;
}

// Stage s's summed gradient as its UPDATEs carry it (r->grad_wire, its
// 2^pow2 scale): tensor 0 of a message, encoded once and shared by all of
// the stage's UPDATEs (1,250 replicas a stage at 10,000 peers). NULL on OOM.
static net_msg_t *s_update_sum(const swarm_engine_t *r, int s, int *pow2)
{
    uint32_t dims[1] = { (uint32_t) r->stage_n[s] };
    net_msg_t *m = net_msg_new(NET_MSG_UPDATE);
    if (m && net_tensor_add(m, r->grad_wire, dims, 1, r->grad_sum + r->stage_off[s], pow2) != 0)
        net_msg_destroy(&m);
    return m;
}

// UPDATE of `step` to peer p: its stage's summed gradient (sum, from
// s_update_sum, with its pow2; NULL: its stage has one replica, which
// kept its own, and pow2 is not read) and the optimizer's scalars; others >= 0 (its own kept,
// sent before its norm is known): the other stages' sum of squares and
// the clip bound in place of the clip factor, which the node forms as the
// router would. A pipelined UPDATE (the next step does not wait for it)
// is counted in update_pending, any other in pending. 0 or -errno.
static int s_update_to(swarm_engine_t *r, int p, long step, double lr, float scale, double others,
                       const net_msg_t *sum, int pow2, int pipelined)
{
    int s = r->peers[p].stage;
    uint32_t dims[1] = { (uint32_t) r->stage_n[s] };
    net_msg_t *m = net_msg_new(NET_MSG_UPDATE);
    net_msg_head(m)->step = (uint64_t) step;
    net_msg_head(m)->stage = (uint32_t) s;
    int rc = 0;
    char clip[96];
    if (others >= 0.0)
        snprintf(clip, sizeof clip, "others=%a\nclip=%a", others, r->hp.grad_clip);
    else
        snprintf(clip, sizeof clip, "scale=%a", (double) scale);
    if ((sum && (rc = net_msg_add_shared(m, sum, 0, dims, 1)) != 0)
        || (rc = engine_meta(m, "lr=%a\n%s\nwd=%a\nt=%ld\npow2_0=%d\n", lr, clip,
                             r->hp.weight_decay, step + 1, sum ? pow2 : 0)) != 0) {
        net_msg_destroy(&m);
        return rc;
    }
    if ((rc = engine_send(r, p, &m, R_UPDATE, pipelined ? 1 : -1, s)) == 0) {
        if (pipelined)
            r->update_pending++;
        else
            r->pending++;
    }
    return rc;
}

// What peer pe is sent in an UPDATE: 0 none, 1 its stage's sum, 2 its own
// gradient kept (self: the UPDATE after a stage applied its own, self_to).
static int s_update_kind(const peer_t *pe, int self)
{
    return self ? pe->self_to : pe->in_step ? (pe->norm_only ? 2 : 1) : 0;
}

// UPDATE of `step` to each ready peer with an s_update_kind, stage by
// stage: the next step's first forward reaches stage 0 first, then stage
// 1, and waits at each replica behind its UPDATE.
static void s_update_all(swarm_engine_t *r, int self, long step, double lr, float scale, int pipelined)
{
    for (int s = 0; s < r->stages; s++) {
        net_msg_t *sum = NULL;
        int pow2 = 0;
        for (int p = 0; p < r->npeers; p++) {
            int to = s_update_kind(&r->peers[p], self);
            if (!to || r->peers[p].stage != s || r->peers[p].state != P_READY)
                continue;
            if (to == 1 && !sum && !(sum = s_update_sum(r, s, &pow2)))
                continue; // out of memory: as a send that failed
            s_ignore(s_update_to(r, p, step, lr, scale, -1.0, to == 1 ? sum : NULL, pow2, pipelined));
        }
        net_msg_destroy(&sum);
    }
}

// Replicas of a stage must hold the same bits after the same update. The
// checksum most of them report is the stage's. On a tie (two replicas
// that disagree: which one drifted cannot be told), that of the replicas
// that have agreed with their stage's vote the most times since they
// loaded its state (a replica just resynced, moved or joined has the
// least standing), then of the one first in the table (it joined first).
// A replica that reports another is resynced from one that agrees (it
// fetches the stage's state again between steps) and expelled for the
// rest of the run if it diverges a second time. With updates pipelined
// the vote comes during the next step: when that step has used the
// diverged replica's outputs or holds its gradient sum (work done with
// the wrong parameters), the step starts over.
static int s_voter(const peer_t *pe, int s)
{
    // one moved to another stage since it applied the update votes on the
    // stage it applied it on (a stage's replicas can all move but one, and
    // that one's drift was then never compared); the dead do not vote
    return pe->updated && pe->state != P_DEAD && pe->update_stage == s;
}

static int s_by_checksum(const void *a, const void *b)
{
    const peer_t *x = *(const peer_t *const *) a, *y = *(const peer_t *const *) b;
    int c = strcmp(x->checksum, y->checksum);
    return c ? c : (x < y ? -1 : x > y);
}

// The voter of stage s whose checksum most of its voters share (of the
// most shared, the group whose members agreed the most times before, and
// in it the first in peer order), and how many share it; -1 when the stage
// has none. O(n log n): voters sorted by checksum (then by peer), runs
// counted.
static int s_majority(swarm_engine_t *r, int s, const peer_t **by, int *votes, int *best_votes)
{
    int n = 0;
    for (int p = 0; p < r->npeers; p++)
        if (s_voter(&r->peers[p], s))
            by[n++] = &r->peers[p];
    qsort(by, (size_t) n, sizeof *by, s_by_checksum);
    int most = 0;
    for (int i = 0, j; i < n; i = j) {
        for (j = i; j < n && !strcmp(by[j]->checksum, by[i]->checksum); j++)
            ;
        for (int k = i; k < j; k++)
            votes[by[k] - r->peers] = j - i;
        most = j - i > most ? j - i : most;
    }
    int best = -1;
    long best_agreed = 0;
    for (int i = 0; i < n; i += votes[by[i] - r->peers]) { // run by run
        if (votes[by[i] - r->peers] != most)
            continue;
        long agreed = 0;
        for (int k = i; k < i + most; k++)
            agreed += by[k]->agreed;
        int first = (int) (by[i] - r->peers); // (each run is in peer order)
        if (best < 0 || agreed > best_agreed || (agreed == best_agreed && first < best))
            best = first, best_agreed = agreed;
    }
    *best_votes = most;
    return best;
}

// Whether the step under way, after the one voted on (`step`: updates
// pipelined), used replica p's work: its outputs, or its gradient sum.
static int s_used_since(const swarm_engine_t *r, int p, long step)
{
    return step < r->step && (r->peers[p].got_grad || engine_outputs_used(r, p));
}

// Replica p of stage s diverged in the vote on `step`: a replica that
// loaded its state since (pipelined, a join is served before the vote on
// the update its state is of) and has applied no update yet holds the
// same checksum. Not its fault: it fetches its stage's state again, with
// no divergence counted. Whether the step under way used such a one's work.
static int s_copies_refetch(swarm_engine_t *r, int p, int s, long step)
{
    int tainted = 0;
    for (int q = 0; q < r->npeers; q++) {
        peer_t *pe = &r->peers[q];
        if (q == p || pe->state != P_READY || pe->stage != s || pe->updated || pe->agreed > 0
            || strcmp(pe->checksum, r->peers[p].checksum) != 0)
            continue;
        tainted |= s_used_since(r, q, step);
        char why[160];
        snprintf(why, sizeof why, "loaded the state of peer %d (%s), which diverged from its "
                 "replicas after step %ld: it fetches another", r->peers[p].id, r->peers[p].name,
                 step);
        engine_peer_dead(r, q, why);
        engine_peer_state(r, q, P_JOINING);
    }
    return tainted;
}

void engine_consensus(swarm_engine_t *r, long step)
{
    const peer_t **by = malloc((size_t) (r->npeers > 0 ? r->npeers : 1) * sizeof *by);
    int *votes = malloc((size_t) (r->npeers > 0 ? r->npeers : 1) * sizeof *votes);
    if (!by || !votes)
        abort(); // a bookkeeping allocation, as the engine's others
    int tainted = 0; // the step under way used a diverged replica's work
    for (int s = 0; s < r->stages; s++) {
        int best_votes = 0, best = s_majority(r, s, by, votes, &best_votes);
        for (int p = 0; p < r->npeers && best >= 0; p++) {
            peer_t *pe = &r->peers[p];
            if (s_voter(pe, s) && !strcmp(pe->checksum, r->peers[best].checksum))
                pe->agreed++;
            if (!s_voter(pe, s) || !strcmp(pe->checksum, r->peers[best].checksum))
                continue;
            r->checksum_mismatches++;
            pe->updated = 0;
            tainted |= s_used_since(r, p, step);
            tainted |= s_copies_refetch(r, p, s, step);
            if (++pe->divergences >= 2) {
                engine_peer_expel(r, p, "diverged from its replicas a second time");
                continue;
            }
            if (pe->state != P_READY || pe->stage != s) { // moved since
                engine_warn(r, "swarm router: peer %d (%s) reported checksum %.16s after step %ld "
                            "on stage %d, %d of its replicas there %.16s (it has moved to stage %d "
                            "and fetches that one's state)\n", pe->id, pe->name, pe->checksum,
                            step, s, best_votes, r->peers[best].checksum, pe->stage);
                continue;
            }
            char why[160];
            snprintf(why, sizeof why, "reports checksum %.16s after step %ld, %d of its replicas "
                     "%.16s: it fetches their state again", pe->checksum, step, best_votes,
                     r->peers[best].checksum);
            r->resyncs++;
            // the next step may have begun (pipelined updates): what it did
            // there is redone by the others, as for a peer that died
            engine_peer_dead(r, p, why);
            engine_peer_state(r, p, P_JOINING); // engine_joins asks a replica that agrees
        }
    }
    free(by);
    free(votes);
    if (tainted && (r->phase == PH_MB || r->phase == PH_GRAD))
        engine_step_restart(r, "a replica whose parameters diverged worked on it");
}

// All gradients are in: sum each stage's over its replicas in peer order,
// clip by the global norm, and send every replica its stage's sum.
void engine_step_update(swarm_engine_t *r)
{
    double sumsq = s_grad_reduce(r);
    if (!isfinite(sumsq) || sumsq > 1e60) {
        // each replica's sum was finite, but together they are not (two that
        // send +-FLT_MAX), or too large for any wire format of an UPDATE
        // (fp16 scaled by 2^100 at most): a step no update can carry
        engine_warn(r, "swarm router: step %ld: the replicas' gradient sums add up to a norm of "
                    "%g, which no UPDATE can carry\n", r->step, sqrt(sumsq));
        engine_step_restart(r, "its gradient sum cannot be sent");
        return;
    }
    double lr = r->io.lr_at(r->io.ctx, r->step);
    float scale = r->io.clip_scale(r->io.ctx, sqrt(sumsq));
    r->pending = 0;
    int pipelined = s_update_pipelined(r);
    for (int p = 0; p < r->npeers; p++)
        r->peers[p].updated = 0;
    s_update_all(r, 0, r->step, lr, scale, pipelined);
    r->phase = PH_UPDATE;
    if (pipelined) {
        r->update_step = r->step;
        engine_step_end(r); // the next step starts now, behind the UPDATEs
    }
}

// Stage 0 is the last to finish a step and has one replica, and every
// other stage's gradients are in: that replica is sent a norm-only STEP
// and, right behind it, its UPDATE with the others' sum of squares in
// place of the clip factor (it forms the factor from its own, as the
// router would), and the next step starts at once, behind them. The other
// stages get their UPDATE when its norm comes back (engine_on_applied),
// while it applies its own, and before any work of the next step reaches
// them: that work starts at this replica, and reaches stage 1 only in
// reply to a FWD queued behind the UPDATE. Any other stage finishing last
// (its work redone after a replica died) takes the ordinary STEP: the
// next step's first forwards would reach stage 0 before its UPDATE. Over
// links of 50 ms this saves the round trip from stage 0 to the router and
// back at the end of every step (docs/swarm.md).
// 1 when stage s (all its work sent, every forward through) should finish
// the step so, -1 when it should wait for the others' sums still coming,
// 0 when it takes the ordinary STEP.
static int s_apply_here(const swarm_engine_t *r, int s)
{
    if (s != 0 || engine_ready_count(r, s) != 1 || s_dead_grads(r, s) || !s_update_pipelined(r))
        return 0;
    for (int k = 0; k < r->stages; k++)
        if (k != s && !r->stepped[k])
            return 0;
    // nothing is due between this step and the next: a checkpoint or an
    // evaluation needs every stage updated, a rebalance or a joiner's state
    // every replica settled
    long next = r->step + 1;
    if ((r->o.save && r->o.save_every > 0 && next % r->o.save_every == 0)
        || (r->o.eval_every > 0 && (next % r->o.eval_every == 0 || next == r->hp.iters))
        || engine_rebalance_due(r))
        return 0;
    for (int p = 0; p < r->npeers; p++)
        if (r->peers[p].state == P_JOINING)
            return 0;
    return r->pending == 0 ? 1 : -1;
}

static void s_step_apply_ask(swarm_engine_t *r, int s)
{
    int p = 0;
    while (r->peers[p].state != P_READY || r->peers[p].stage != s)
        p++; // s_apply_here: there is one
    double others = s_grad_reduce(r); // stage s's is not in: the others'
    double lr = r->io.lr_at(r->io.ctx, r->step);
    net_msg_t *m = engine_step_msg(r, s, "norm_only=1\n");
    if (!m || engine_send(r, p, &m, R_STEP, MB_APPLY, s) != 0)
        return; // it is gone: the stage is empty, and the swarm rolls back
    // right behind it (its checksum, compared with nobody's, is in when it answers)
    if (s_update_to(r, p, r->step, lr, 0.0f, others, NULL, 0, 1) != 0)
        return; // gone too
    if (!r->self_told) {
        engine_say(r, "swarm router: step %ld: stage %d's only replica applies its own update at the end "
                   "of each step it finishes last (one round trip less)\n", r->step, s);
        r->self_told = 1;
    }
    for (int q = 0; q < r->npeers; q++) {
        r->peers[q].self_to = q != p && r->peers[q].in_step && r->peers[q].state == P_READY
                        ? (r->peers[q].norm_only ? 2 : 1) : 0;
        r->peers[q].updated = 0;
    }
    // its backwards still in flight belong to no micro-batch of the next
    // step: their replies are only counted (its stage has no other replica
    // to redo them on; if it dies, the swarm rolls back)
    for (int i = 0; i < r->req_slots; i++) {
        req_t *q = engine_req_at(r, i);
        if (q->id && (q->kind == R_FWD || q->kind == R_BWD))
            q->mb = -1;
    }
    r->stepped[s] = 1;
    r->peers[p].in_step = r->peers[p].norm_only = 1;
    r->self_peer = p;
    r->self_step = r->step;
    r->self_others = others;
    r->self_lr = lr;
    r->pending = 0;
    engine_step_end(r); // the next step's work queues behind this STEP
}

// Keep `window` micro-batches in flight; ask each stage for its gradients
// once its work is all sent; when all are through, sum them (PH_GRAD).
void engine_step_micro(swarm_engine_t *r)
{
    engine_retry(r);
    int S = r->stages, done = engine_mb_count(r, engine_mb_place(S, S, 0), engine_mb_place(S, S, 0) + 1);
    int flying = r->G - done - engine_mb_count(r, 0, engine_mb_place(S, 0, 0));
    while (flying < r->window && r->mb_next < r->G) {
        int i = r->mb_next;
        if (r->mbs[i].stage != -1 || r->mbs[i].tokens) {
            r->mb_next++; // started
            continue;
        }
        if (engine_mb_start(r, i) != 0)
            return; // no ready peer right now; try again on the next turn
        flying++;
    }
    // a stage with all its gradient work sent is asked for its gradients
    // now: the STEP queues behind that work at each replica (served in
    // order), so the later stages' sums travel while stage 0 finishes its
    // backwards, and over slow links the STEP is not a round trip late
    int stepped = 0;
    for (int s = 0; s < S; s++) {
        if (!r->stepped[s] && r->redo_pending == 0 && s_stage_sent(r, s)) {
            int here = s_losses_in(r) ? s_apply_here(r, s) : 0;
            if (here > 0 && (engine_spots_open(r) > 0 || engine_audits_open(r) > 0))
                continue; // that STEP applies the update: after the checks
            if (here > 0) {
                s_step_apply_ask(r, s);
                return;
            }
            if (here == 0)
                s_step_ask(r, s);
        }
        stepped += r->stepped[s];
    }
    engine_audits_turn(r); // a stage whose sums are all in is audited while the others work
    if (done < r->G || r->redo_pending > 0 || stepped < S)
        return;
    r->phase = PH_GRAD;
}

// The reply to the STEP of a stage that applies its own update: its
// UPDATE is on its way; the others get theirs with the clip factor formed
// from the same two numbers.
int engine_on_applied(swarm_engine_t *r, const req_t *q, const msg_in_t *e)
{
    (void) q;
    double sumsq = e->reply.sumsq; // checked
    float scale = r->io.clip_scale(r->io.ctx, sqrt(r->self_others + sumsq));
    r->self_peer = -1;
    r->update_step = r->self_step;
    s_update_all(r, 1, r->self_step, r->self_lr, scale, 1);
    for (int p = 0; p < r->npeers; p++)
        r->peers[p].self_to = 0;
    if (r->update_pending == 0)
        engine_consensus(r, r->update_step);
    return 0;
}

int engine_on_updated(swarm_engine_t *r, const req_t *q, const msg_in_t *e)
{
    peer_t *pe = &r->peers[q->peer];
    if (!e->reply.has_checksum)
        return -EPROTO; // (checked already)
    memcpy(pe->checksum, e->reply.checksum, sizeof pe->checksum);
    pe->updated = 1;
    pe->update_stage = q->stage;
    if (q->mb != 1) {
        r->pending--;
    } else if (--r->update_pending == 0) {
        engine_consensus(r, r->update_step);
    }
    return 0;
}
