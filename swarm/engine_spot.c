/* engine_spot.c - spot verification: a fraction of training FWDs run
 * again on a second replica, a third to decide, and the liar expelled and
 * the step started over. What every reply is checked against: engine_reply.c.
 */
#include "engine_int.h"

// A fraction (--verify) of training FWDs is run again on a second replica of
// the stage while the micro-batch goes on with the first result; the step's
// update waits until every check of the step is settled (engine_spots_open).
// Two results agree when the outputs are within 1e-3 relative L2 (at the
// last stage, run forward-only, the losses within 1e-4). When they
// disagree, a third replica decides; the one it contradicts is expelled,
// and since its outputs have fed the step, the step starts over without
// it. With no third replica the disagreement is logged and counted, and
// the run goes on.

// Whether FWD of micro-batch i at stage s of this step is verified: a draw
// from the run's secret key (no peer can tell which are), fixed for the
// attempt at the step, so that a replay checks the same ones.
static int s_spot_sampled(const swarm_engine_t *r, int i, int s)
{
    return r->verify > 0.0 && !r->evaluating && engine_draw(r, DRAW_SPOT, i, s) < r->verify;
}

// The FWD of micro-batch i at stage s again, to peer p: at the last stage
// forward-only (eval=1: nothing accumulates).
static int s_spot_send(swarm_engine_t *r, int i, int s, int p)
{
    net_msg_t *m = engine_fwd_msg(r, i, s);
    if (m && s == r->stages - 1 && engine_meta_add(m, "eval=1") != 0)
        net_msg_destroy(&m);
    if (!m)
        return -ENOMEM;
    return engine_send(r, p, &m, R_VERIFY, i, s);
}

// The open check of micro-batch q->mb at stage q->stage, or NULL.
static spot_t *s_spot_of(const swarm_engine_t *r, const req_t *q)
{
    if (q->mb < 0 || q->mb >= r->G || q->stage < 0 || q->stage >= r->stages)
        return NULL;
    spot_t *c = r->mbs[q->mb].spot ? &r->mbs[q->mb].spot[q->stage] : NULL;
    return c && c->n > 0 ? c : NULL;
}

// The check is settled (or given up).
static void s_spot_release(swarm_engine_t *r, spot_t *c)
{
    for (int k = 0; k < 3; k++) {
        free(c->out[k]);
        c->out[k] = NULL;
    }
    r->spots_open -= c->n > 0;
    c->n = 0;
}

// Checks of this step not settled yet: the update waits for them. Counted
// as they open and settle (engine_mbs_clear forgets a micro-batch's).
int engine_spots_open(const swarm_engine_t *r)
{
    return r->spots_open;
}

// When sampled (never while evaluating), keep micro-batch q->mb's FWD
// result from peer q->peer (decoded in scratch, or its loss) and ask
// another replica for it; the micro-batch goes on meanwhile. A result that
// comes again (the FWD re-sent after its peer died) while the check is
// open is not checked twice.
void engine_spot_begin(swarm_engine_t *r, const req_t *q, float loss)
{
    mb_t *b = &r->mbs[q->mb];
    if (!s_spot_sampled(r, q->mb, q->stage) || s_spot_of(r, q))
        return;
    int other = engine_pick_but(r, q->stage, -1, 1.0 / 3.0, &q->peer, 1);
    if (other < 0 || (!b->spot && !(b->spot = calloc((size_t) r->stages, sizeof *b->spot))))
        return;
    spot_t *c = &b->spot[q->stage];
    r->spots_open += c->n == 0;
    c->n = 1;
    c->peer[0] = q->peer;
    c->loss[0] = loss;
    if (q->stage < r->stages - 1)
        c->out[0] = engine_dup_bytes(r->scratch, engine_acts_count(r) * sizeof(float));
    if (s_spot_send(r, q->mb, q->stage, other) != 0)
        s_spot_release(r, c);
}

static int s_spot_same(const swarm_engine_t *r, const spot_t *c, int x, int y)
{
    if (!c->out[x] || !c->out[y])
        return engine_loss_close(c->loss[x], c->loss[y]);
    return engine_close(c->out[x], c->out[y], engine_acts_count(r), 1e-3);
}

// Start the current step over: every replica drops what it accumulated
// (STEP discard=1) and every micro-batch runs again from the start.
void engine_step_restart(swarm_engine_t *r, const char *why)
{
    engine_warn(r, "swarm router: step %ld: starting the step over (%s)\n", r->step, why);
    engine_work_forgotten(r);
    for (int i = 0; i < r->req_slots; i++) {
        req_t *q = engine_req_at(r, i);
        // but the last step's: a stage applying its own update, and the
        // UPDATEs the step did not wait for (their checksums still count);
        // and the states on their way, a checkpoint's read and a joiner's,
        // which are of parameters a restart does not change (dropping one
        // once left its count behind: the next checkpoint, or the joiner's
        // hold on the next step, waited for good)
        if (q->id && !(q->kind == R_STEP && q->mb == MB_APPLY) && !(q->kind == R_UPDATE && q->mb == 1)
            && q->kind != R_STATE_GET && q->kind != R_STATE)
            engine_req_done(r, q); // their answers are stale now (not the last step's)
    }
    engine_mbs_clear(r);
    r->pending = r->redo_pending = 0;
    for (int p = 0; p < r->npeers; p++) {
        if (r->peers[p].state != P_READY)
            continue;
        net_msg_t *m = engine_step_msg(r, r->peers[p].stage, "discard=1\n");
        if (m && engine_send(r, p, &m, R_DISCARD, -1, r->peers[p].stage) == 0)
            r->pending++;
    }
    r->restarts++;
    engine_audits_reset(r);
    r->phase = PH_DISCARD;
}

// A verifying replica's answer (checked; outputs decoded in scratch).
void engine_spot_result(swarm_engine_t *r, const req_t *q, const msg_in_t *e)
{
    spot_t *c = s_spot_of(r, q);
    if (!c || c->n > 2)
        return; // stale
    int k = c->n++, s = q->stage;
    c->peer[k] = q->peer;
    c->loss[k] = e->reply.loss; // NAN when it sent none (compared at the last stage only)
    c->out[k] = c->out[0] ? engine_dup_bytes(r->scratch, engine_acts_count(r) * sizeof(float)) : NULL;
    const peer_t *a = &r->peers[c->peer[0]], *v = &r->peers[q->peer];
    if (k == 1 && s_spot_same(r, c, 0, 1)) {
        r->spot_checks++;
        s_spot_release(r, c);
        return;
    }
    if (k == 1) {
        int not[2] = { c->peer[0], q->peer };
        int third = engine_pick_but(r, s, -1, 1.0 / 3.0, not, 2);
        engine_warn(r, "swarm router: step %ld: stage %d: peers %d (%s) and %d (%s) disagree on "
                    "micro-batch %d%s\n", r->step, s, a->id, a->name, v->id, v->name, q->mb,
                    third >= 0 ? "; asking a third replica" : "; no third replica to decide");
        if (third < 0 || s_spot_send(r, q->mb, s, third) != 0) {
            r->spot_undecided++;
            s_spot_release(r, c);
        }
        return;
    }
    r->spot_checks++;
    int liar = s_spot_same(r, c, 0, 2) && !s_spot_same(r, c, 1, 2) ? c->peer[1]
             : s_spot_same(r, c, 1, 2) && !s_spot_same(r, c, 0, 2) ? c->peer[0] : -1;
    if (liar < 0) {
        r->spot_undecided++;
        s_spot_release(r, c);
        return;
    }
    char why[96];
    snprintf(why, sizeof why, "returned a stage %d forward that two replicas contradict", s);
    engine_peer_expel(r, liar, why);
    if (r->phase == PH_MB || r->phase == PH_GRAD) // not rolled back by the expulsion
        engine_step_restart(r, "a peer whose outputs it used was caught lying");
}

// A verifying replica is gone before it answered: another is asked in its
// place, one that has given no answer to this check, since the output
// checked has fed the step already: given up, it let a lie of a replica
// whose checker was banned first reach the update (check_engine; a likely
// cause of test_hostile's losses off swarm train's, once in some twenty
// runs). With nobody left, a second opinion is given up, as where
// the stage has no other replica (engine_spot_begin), and a third counts
// as undecided.
void engine_spot_lost(swarm_engine_t *r, const req_t *q)
{
    spot_t *c = s_spot_of(r, q);
    if (!c)
        return;
    int not[4] = { c->peer[0], c->peer[1] }, nnot = c->n; // (and any a send failed to)
    while (nnot < 4) {
        int other = engine_pick_but(r, q->stage, -1, 1.0 / 3.0, not, nnot);
        if (other < 0)
            break;
        if (s_spot_send(r, q->mb, q->stage, other) == 0)
            return;
        not[nnot++] = other;
    }
    if (c->n == 2)
        r->spot_undecided++;
    s_spot_release(r, c);
}
