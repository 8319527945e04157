/* engine_fail.c - peers that fail: bans with a growing back-off,
 * expulsion, deaths and the work they held redone, rollback when a stage
 * lost every replica, refills and rebalancing moves, and the deadlines
 * that find stalled and silent peers.
 */
#include "engine_int.h"

// Peer p failed: it is dead and refused for `seconds` (INFINITY: for the
// run); the log says `line`, swarm status `why`. Its work is redone.
static void s_peer_ban(swarm_engine_t *r, int p, double seconds, const char *why, const char *line)
{
    peer_t *pe = &r->peers[p];
    pe->failures++;
    r->bans++;
    pe->banned_until = engine_secs(r) + seconds;
    pe->ban_told = 0;
    engine_peer_dead(r, p, line);
    snprintf(pe->why, sizeof pe->why, "%s", why);
}

void engine_peer_expel(swarm_engine_t *r, int p, const char *why)
{
    if (r->peers[p].state == P_DEAD)
        return;
    char line[160], shown[128];
    snprintf(line, sizeof line, "%s: expelled for the run", why);
    snprintf(shown, sizeof shown, "%s: expelled", why);
    r->expelled++;
    s_peer_ban(r, p, INFINITY, shown, line);
}

// Exact steps: the gradients a dead peer accumulated this step are lost
// with it, so each micro-batch's work it did is run again on a survivor of
// its stage before the step closes. If it died while the gradients were
// being gathered, the gathering starts over once the re-runs are in (the
// survivors' sums then include them).
static void s_redo_lost(swarm_engine_t *r, int p)
{
    if (r->evaluating || (r->phase != PH_MB && r->phase != PH_GRAD) || r->peers[p].got_grad)
        return;
    int redone = 0;
    for (int i = 0; i < r->G; i++) {
        for (int s = 0; s < r->stages; s++) {
            if (r->mbs[i].grad_peer[s] != p)
                continue;
            engine_grad_peer_set(r, i, s, -1);
            engine_redo_want(r, i, s); // sent by engine_retry this turn
            r->redo_pending++;
            redone++;
        }
    }
    if (redone > 0 || r->peers[p].in_step) // the sums must include the re-runs
        engine_step_unask(r);
    engine_member_line(r, p, 1, "swarm router: step %ld: %d micro-batch parts it held are run "
                       "again on other replicas\n", r->step, redone);
}

// Move ready peer p to stage `to` (cost[]: the stages' work per token, to
// carry its measured speed over); the router log says why. 0 or -errno.
static int s_move(swarm_engine_t *r, int p, int to, const double *cost, const char *why)
{
    peer_t *pe = &r->peers[p];
    engine_say(r, "swarm router: step %ld: moving peer %d (%s, %.0f tok/s) from stage %d %s\n", r->step,
               pe->id, pe->name, pe->tok_s, pe->stage, why);
    double from_cost = cost[pe->stage];
    int left = pe->stage;
    int rc = engine_send_assign(r, p, to, NULL);
    if (rc != 0) {
        engine_warn(r, "swarm router: peer %d (%s): cannot be reached (%s): not moved\n", pe->id,
                    pe->name, strerror(-rc));
        return rc;
    }
    pe->left_stage = left, pe->left_tok_s = pe->tok_s; // (what a move back would bring)
    pe->tok_s *= from_cost / cost[to];
    engine_speed_restart(pe, r->now_ms); // its next speed sample is of the new stage
    pe->moving = 1;
    pe->moved_at = engine_secs(r);
    return 0;
}

// Stage s has no ready replica and none joining: the peer that another
// stage can best spare (swarm_policy_refill: the move that leaves the
// highest bottleneck, never emptying a stage) is assigned to it, or -1
// when no stage has two. A peer that cannot be reached is passed over (the
// next turn finds it dead). Every stage reloads the checkpoint anyway, so
// the move costs nothing a new node would not.
static int s_refill(swarm_engine_t *r, int s)
{
    if (engine_joining_to(r, s))
        return -1; // a newcomer is already on its way
    swarm_peer_view_t *views = r->views; // s_move picks nothing
    double cost[SWARM_MAX_STAGES];
    for (int k = 0; k < r->stages; k++)
        cost[k] = r->stage_cost[k];
    for (int tries = 0; tries < r->npeers; tries++) {
        engine_views_as(r, views, 0);
        int p = swarm_policy_refill(views, r->npeers, r->stages, cost, r->stage_need, s);
        if (p < 0)
            return -1;
        char why[128];
        snprintf(why, sizeof why, "(%d replicas) to stage %d, which lost every replica",
                 engine_ready_count(r, r->peers[p].stage), s);
        if (s_move(r, p, s, cost, why) == 0)
            return p;
    }
    return -1;
}

// Stage s's replicas disagree on a gradient and none left can decide (two
// that disagree: one of them lies, or both; three of which no two agree:
// at most one is honest): one more replica from a stage that keeps two or
// more without it (the move that leaves the highest bottleneck) joins s,
// and the step, started over, waits for its state (engine_turn: the
// discard goes by PH_WAIT), so that the next dispute has a referee. The
// peer moved, or -1 when one is on its way already or no stage can spare one.
int engine_referee(swarm_engine_t *r, int s)
{
    if (engine_joining_to(r, s)) {
        r->rejoin = 1; // one is on its way: the restart waits for its state too
        return -1;
    }
    swarm_peer_view_t *views = r->views;
    double cost[SWARM_MAX_STAGES];
    for (int k = 0; k < r->stages; k++)
        cost[k] = r->stage_cost[k];
    engine_views_as(r, views, 0);
    for (int p = 0; p < r->npeers; p++) // only from stages of three or more
        if (views[p].ready && views[p].stage >= 0 && views[p].stage < r->stages
            && (views[p].stage == s || engine_ready_count(r, views[p].stage) < 3))
            views[p].ready = 0;
    int p = swarm_policy_refill(views, r->npeers, r->stages, cost, r->stage_need, s);
    if (p < 0)
        return -1;
    char why[128];
    snprintf(why, sizeof why, "(%d replicas) to stage %d, to decide its replicas' dispute",
             engine_ready_count(r, r->peers[p].stage), s);
    if (s_move(r, p, s, cost, why) != 0)
        return -1;
    r->rejoin = 1;
    return p;
}

// After a rollback, every stage with no replica takes a spare one (also a
// stage emptied while the swarm reloads); say: log those left waiting.
void engine_refill_all(swarm_engine_t *r, int say)
{
    for (int k = 0; k < r->stages; k++) {
        if (engine_ready_count(r, k) > 0 || s_refill(r, k) >= 0 || !say)
            continue;
        char need[64] = "";
        if (r->stage_need[k] > 0)
            snprintf(need, sizeof need, " (one with --memory of %.1f MiB or more)",
                     r->stage_need[k] / 1048576.0);
        engine_warn(r, "swarm router: stage %d: no other stage has a replica to spare that can "
                    "hold it; waiting for a node to serve it%s\n", k, need);
    }
}

// Every replica of stage s is gone, and its state with them: the whole swarm
// goes back to the last checkpoint (held in params/m/v), every live node
// reloads its stage from it, stage s takes a spare replica of another stage
// or waits for a node, and the run replays. The curve after it equals an
// uninterrupted run's.
static void s_rollback(swarm_engine_t *r, int s)
{
    engine_warn(r, "swarm router: stage %d lost every replica at step %ld: rolling back to "
                "step %ld%s\n", s, r->step, r->ckpt_step,
                r->o.save ? "" : " (the start: run with --save DIR to keep checkpoints)");
    engine_refill_all(r, 1); // every empty stage takes a spare replica of another, else waits
    // the gradient norms of the steps ahead of the checkpoint say nothing of
    // the steps the swarm runs again (early ones are larger)
    memset(r->norms, 0, sizeof r->norms);
    engine_work_forgotten(r);
    for (int i = 0; i < r->req_slots; i++)
        if (engine_req_at(r, i)->id)
            engine_req_done(r, engine_req_at(r, i)); // (engine_req_done frees the slot: the loop goes on)
    engine_mbs_clear(r);
    // from the last peer down: each leaves the end of its stage's ready
    // peers, and none of them is shifted
    for (int p = r->npeers - 1; p >= 0; p--) {
        r->peers[p].inflight = r->peers[p].working = 0;
        if (r->peers[p].state == P_READY)
            engine_peer_state(r, p, P_JOINING); // reloads the checkpoint (engine_joins)
    }
    r->pending = r->redo_pending = r->ckpt_pending = r->update_pending = 0;
    r->self_peer = -1;
    for (int p = 0; p < r->npeers; p++)
        r->peers[p].self_to = 0;
    r->evaluating = r->want_eval = r->want_ckpt = 0;
    r->step = r->ckpt_step;
    engine_history_rollback(r, r->step);
    r->done = 0; // the steps after the checkpoint are to run again, the last one too
    r->started = 0; // joins get the router's copy again
    r->rollbacks++;
    r->phase = PH_WAIT;
}

// A dead peer: its FWD/BWD requests go to another replica, the gradients it
// held are rebuilt elsewhere, and it no longer counts for STEP/UPDATE.
void engine_peer_dead(swarm_engine_t *r, int p, const char *why)
{
    if (r->peers[p].state == P_DEAD)
        return;
    engine_member_line(r, p, 1, "swarm router: peer %d (%s) %s\n", r->peers[p].id, r->peers[p].name,
                       why);
    snprintf(r->peers[p].why, sizeof r->peers[p].why, "%s", why);
    r->peers[p].moving = 0;
    r->peers[p].audits_passed = 0; // a record is of one membership: it may come back changed
    int was_ready = r->peers[p].state == P_READY;
    engine_peer_state(r, p, P_DEAD);
    free(r->peers[p].audit_sums); // a dispute of its sum ends with it
    r->peers[p].audit_sums = NULL;
    if (!r->peers[p].got_grad) {
        // no sum of its counts in this step: its buffer goes (one whose sum
        // is in goes when the next step begins, engine_step_begin)
        free(r->peers[p].grad);
        r->peers[p].grad = NULL;
    }
    for (int i = 0; i < r->req_slots; i++) {
        req_t q = *engine_req_at(r, i);
        if (q.id == 0 || q.peer != p)
            continue;
        engine_req_done(r, engine_req_at(r, i));
        if (q.redo) {
            engine_redo_want(r, q.mb, q.stage); // still counted in redo_pending
        } else if ((q.kind == R_FWD || q.kind == R_BWD) && q.mb >= 0)
            s_ignore(engine_next(r, q.mb, q.kind, q.stage));
        else if (q.kind == R_UPDATE && q.mb == 1) {
            if (--r->update_pending == 0)
                engine_consensus(r, r->update_step);
        } else if (q.kind == R_STEP && q.mb == MB_APPLY)
            r->self_peer = -1; // its stage had no other replica: the swarm rolls back
        else if (q.kind == R_STEP || q.kind == R_UPDATE || q.kind == R_DISCARD)
            r->pending--;
        else if (q.kind == R_VERIFY)
            engine_spot_lost(r, &q);
        else if (q.kind == R_AUDIT || q.kind == R_AUDIT_SUM)
            engine_audit_lost(r, p);
        else if (q.kind == R_STATE_GET && q.mb < 0)
            engine_ckpt_part(r, 0); // the checkpoint of this step is skipped
        else if (q.kind == R_STATE_GET)
            r->peers[q.mb].inflight--; // the joiner asks again between steps
    }
    engine_audit_lost(r, p); // (an audit it held with no request out)
    engine_audit_target_gone(r, p);
    if (was_ready)
        s_redo_lost(r, p);
    for (int s = 0; s < r->stages; s++) {
        if (r->started && engine_ready_count(r, s) == 0) {
            s_rollback(r, s);
            break;
        }
    }
}

// A peer that failed a request (missed its deadline, refused it, answered
// it wrongly) is dead and banned: 5 s the first time, twice as long each
// time after, up to 10 minutes. Its work is redone elsewhere.
void engine_peer_fail(swarm_engine_t *r, int p, const char *fmt, ...)
{
    peer_t *pe = &r->peers[p];
    if (pe->state == P_DEAD)
        return;
    char why[96], line[192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    pe->ban_s = pe->ban_s > 0 ? fmin(2.0 * pe->ban_s, 600.0) : 5.0;
    snprintf(line, sizeof line, "%s: banned for %.0f s (failure %d)", why, pe->ban_s,
             pe->failures + 1);
    s_peer_ban(r, p, pe->ban_s, why, line);
}

// A request's deadline: 20 times what the peer's speed says it and the
// work queued at it should take, and never under 5 s (a loaded machine is
// not a dead one). The speed is taken as at least 1/DEADLINE_SLOWEST of
// the median the router measured of the ready peers (r->speed_floor): a
// peer that claims a speed near zero at HELLO would otherwise hold a step
// for hours before its first request is measured. One not measured yet is
// timed at its word where the floor allows it, else as routing sends it
// work (engine_routed_tok_s: a claim it does not believe, as the fastest).
#define DEADLINE_SLOWEST 20.0

// 20 times what `thirds` of a micro-batch's work take peer pe, in ms.
static int64_t s_work_ms(const swarm_engine_t *r, const peer_t *pe, int thirds)
{
    double tokens = (double) r->hp.micro * r->hp.cfg.T * thirds / 3.0;
    double speed;
    if (pe->samples == 0 && pe->stage >= 0 && pe->stage < r->stages) {
        // not measured yet: a claim of next to nothing timed at the floor
        // held each step it took part in for minutes (the stage's median a
        // CPU's); one the floor allows is slow, not nothing: a CPU moved to
        // a GPU's stage, timed as routed (its fastest), missed the deadline
        // of the 13 audits it was handed, honest (swarm sim, seed 2058)
        speed = engine_routed_tok_s(r, pe, r->route[pe->stage].fastest);
        if (r->speed_floor > 0.0 && pe->node_tok_s >= r->speed_floor && pe->node_tok_s < speed)
            speed = pe->node_tok_s;
    } else // the slower of the router's measure and the node's word (early measures run high)
        speed = pe->node_tok_s > 0.0 && pe->node_tok_s < pe->tok_s ? pe->node_tok_s : pe->tok_s;
    speed = fmax(fmax(speed, r->speed_floor), 1.0);
    return (int64_t) (20.0 * 1000.0 * tokens / speed);
}

static int64_t s_deadline_ms(const swarm_engine_t *r, const req_t *q)
{
    // a micro-batch's work, and what the router had queued at the peer
    // before it or has since (a node serves a BWD first, so one sent later
    // may run before it): a slow replica of a big swarm may hold many. A
    // stopped process is found sooner by its silence (swarm_engine_gone).
    const peer_t *pe = &r->peers[q->peer];
    int others = pe->held_thirds - q->thirds > q->ahead_thirds ? pe->held_thirds - q->thirds
                                                               : q->ahead_thirds;
    int64_t ms = s_work_ms(r, pe, 3 + others);
    return ms > 5000 ? ms : 5000;
}

void engine_work_forgotten(swarm_engine_t *r)
{
    for (int p = 0; p < r->npeers; p++) {
        peer_t *pe = &r->peers[p];
        if (pe->held_thirds > 0 && pe->state != P_DEAD) {
            int64_t until = r->now_ms + s_work_ms(r, pe, pe->held_thirds);
            pe->drained_at = until > pe->drained_at ? until : pe->drained_at;
        }
    }
}

// The floor of the speeds deadlines take: 1/DEADLINE_SLOWEST of the median
// of the ready peers' measured speeds (0 while none is measured).
static double s_speed_floor(swarm_engine_t *r)
{
    double *speed = r->by_peer; // scratch
    int n = 0;
    for (int p = 0; p < r->npeers; p++)
        if (r->peers[p].state == P_READY && r->peers[p].samples > 0)
            speed[n++] = r->peers[p].tok_s;
    if (!n)
        return 0.0;
    return engine_median(speed, n) / DEADLINE_SLOWEST;
}

// A joiner's state on its way (the STATE_GET to a replica, the STATE to
// the joiner) holds the next step (engine_join_held): 30 s, and a second more
// for each MB of the stage's state (parameters and both moments), so that
// a joiner that does not answer or a link that cannot carry the state
// stalls the swarm that long at most. It is then failed (banned). A
// checkpoint's read has the same deadline.
static int64_t s_state_deadline_ms(const swarm_engine_t *r, int stage)
{
    double mb = stage >= 0 && stage < r->stages ? 3.0 * 4.0 * r->stage_n[stage] / 1e6 : 0.0;
    return 30000 + (int64_t) (1000.0 * mb);
}

// A joiner's state is on its way: the next step waits for it, because the
// state is of the step about to start, and a joiner whose state arrived a
// step later would be an update behind (over slow links a stage's state takes
// longer than a step). Joins cost the swarm that transfer once. A joiner that
// leaves while it holds the swarm so is banned for it (engine_peer_gone), and
// all joins together hold at most JOIN_HOLD_SHARE of the run's time (and
// JOIN_HOLD_FREE_MS more): past that a joiner's state travels while the swarm
// trains, and one a step late is fetched again between steps, so that joiners
// with keys of their own each time cannot stall the swarm either.
#define JOIN_HOLD_SHARE 0.1
#define JOIN_HOLD_FREE_MS 30000
static int s_joiner_holds(const swarm_engine_t *r, int p)
{
    return r->started && r->peers[p].state == P_JOINING && r->peers[p].inflight > 0;
}

int engine_join_held(swarm_engine_t *r)
{
    int64_t now = r->now_ms;
    int held = 0;
    for (int k = 0; k < r->joining.n && !held; k++)
        held = s_joiner_holds(r, r->joining.peer[k]);
    if (held && !r->join_hold_from)
        r->join_hold_from = now;
    int64_t total = r->join_held_ms + (r->join_hold_from ? now - r->join_hold_from : 0);
    int64_t run = now - r->join_hold_t0;
    if (held && total > JOIN_HOLD_FREE_MS + (int64_t) (JOIN_HOLD_SHARE * (double) run)) {
        if (!r->join_hold_spent)
            engine_warn(r, "swarm router: joins have held the swarm %.0f s of %.0f; from now on a "
                        "joiner's state travels while the swarm trains\n", total / 1000.0,
                        run / 1000.0);
        r->join_hold_spent = 1;
        held = 0;
    }
    if (!held && r->join_hold_from) {
        r->join_held_ms += now - r->join_hold_from;
        r->join_hold_from = 0;
    }
    return held;
}

// Peer p left (BYE) or lost its connection (why): dead (the log says `line`).
// A joiner whose state was on its way held the swarm for nothing
// (engine_join_held): it is banned as a peer that missed a deadline is, so
// that joining and leaving again and again costs it a back-off that doubles
// each time.
void engine_peer_gone(swarm_engine_t *r, int p, const char *why, const char *line)
{
    if (s_joiner_holds(r, p))
        engine_peer_fail(r, p, "%s while its stage's state was on its way", why);
    else
        engine_peer_dead(r, p, line);
}

// A peer whose process died (killed, crashed) dropped its connection: a
// send to it fails at once. Peers that hold work and have said nothing for
// PROBE_MS get an empty HEARTBEAT, so that such a death costs PROBE_MS, not
// the deadline of the work it held. Only a connection lost within
// PROBE_FRESH_MS of the peer's last word counts: later, it may be the
// transport's own heartbeat giving up on a stalled process (3 s), which the
// deadline judges as before; a machine that loses power or a link that goes
// quiet keeps the connection open: deadlines and silence find those.
#define PROBE_MS 200
#define PROBE_FRESH_MS 2000
#define REAP_MS 50
#define REAP_ENTRIES 5000
#define REAP_MAX_MS 400

static void s_probe(swarm_engine_t *r, int64_t now)
{
    for (int p = 0; p < r->npeers; p++) {
        peer_t *pe = &r->peers[p];
        if (pe->state == P_DEAD || pe->failed || pe->inflight == 0 || now - pe->last_seen < PROBE_MS
            || now - pe->last_seen > PROBE_FRESH_MS || now - pe->probed < PROBE_MS)
            continue;
        pe->probed = now;
        net_msg_t *m = net_msg_new(NET_MSG_HEARTBEAT);
        if (m && engine_emit(r, &pe->who, &m) == -EHOSTUNREACH) {
            engine_member_line(r, p, 1, "swarm router: peer %d (%s): its connection is gone\n", pe->id,
                               pe->name);
            pe->failed = r->failed_any = 1;
            engine_route_touch(r, p);
        }
    }
}

// The HEARTBEAT interval for the live peers (BEAT_RATE, engine_int.h),
// looked at once a second (it is whole seconds): it rises when they
// outgrow it, and falls to what they need only once they are a tenth below
// what an interval a second shorter serves, so that a swarm about a bound
// does not retell every peer with each join and death. A peer told another
// interval (by its ASSIGN, or before a change) is told this one in an
// empty HEARTBEAT carrying beat_ms: at most one a peer a change.
static void s_beat(swarm_engine_t *r)
{
    int live = 0;
    for (int p = 0; p < r->npeers; p++)
        live += r->peers[p].state != P_DEAD;
    int want = (live + BEAT_RATE - 1) / BEAT_RATE * BEAT_MS;
    want = want < BEAT_MS ? BEAT_MS : want > BEAT_MAX_MS ? BEAT_MAX_MS : want;
    if (want > r->beat_ms || (want < r->beat_ms
                              && live * 10 <= (r->beat_ms - BEAT_MS) / BEAT_MS * BEAT_RATE * 9))
        r->beat_ms = want;
    for (int p = 0; p < r->npeers; p++) {
        peer_t *pe = &r->peers[p];
        if (pe->state == P_DEAD || pe->failed || !pe->beat_ms || pe->beat_ms == r->beat_ms)
            continue;
        net_msg_t *m = net_msg_new(NET_MSG_HEARTBEAT);
        if (!m || engine_meta(m, "beat_ms=%d", r->beat_ms) != 0) {
            net_msg_destroy(&m);
            return; // out of memory: the next pass tells them
        }
        if (engine_emit(r, &pe->who, &m) == -EHOSTUNREACH) {
            pe->failed = r->failed_any = 1;
            engine_route_touch(r, p);
        }
        net_msg_destroy(&m);
        pe->beat_ms = r->beat_ms;
    }
}

// The peers found unreachable since the last look are dead now, before
// anything else of the step is decided (their work is redone).
static void s_reap_failed(swarm_engine_t *r)
{
    if (!r->failed_any)
        return;
    r->failed_any = 0;
    for (int p = 0; p < r->npeers; p++)
        if (r->peers[p].failed && r->peers[p].state != P_DEAD)
            engine_peer_gone(r, p, "lost its connection", "is not connected: dead");
}

void engine_reap(swarm_engine_t *r)
{
    int64_t now = r->now_ms;
    s_reap_failed(r);
    // a pass over every peer and request every REAP_MS (deadlines are seconds),
    // past REAP_ENTRIES of them REAP_MS a REAP_ENTRIES, to REAP_MAX_MS (docs/scale.md)
    int64_t every = REAP_MS * (int64_t) (r->npeers + r->req_slots) / REAP_ENTRIES;
    every = every < REAP_MS ? REAP_MS : every > REAP_MAX_MS ? REAP_MAX_MS : every;
    if (now - r->speed_floor_at >= 1000 || now < r->speed_floor_at) { // once a second
        s_beat(r);
        r->speed_floor = s_speed_floor(r);
        r->speed_floor_at = now;
        engine_route_ratios(r);
    }
    if (now - r->reaped_at < every && now >= r->reaped_at)
        return;
    r->reaped_at = now;
    s_probe(r, now);
    double most = engine_link_most(r);
    for (int i = 0; i < r->req_slots; i++) {
        const req_t *q = engine_req_at(r, i);
        // a checkpoint's read holds no step up, but the next checkpoint waits
        // for it: it has a state's deadline too (then it is skipped)
        int state = q->kind == R_STATE || q->kind == R_STATE_GET;
        if (!q->id)
            continue;
        // compute's clock (training work, a spot check's forward, an
        // audit's) runs from when it was sent or its peer last finished
        // some, whichever is later: a busy replica serves the BWDs it is
        // sent before a FWD (the node's order), and one fast enough to be
        // sent a stream of them would miss a FWD's deadline while working
        // the whole time (a spot check's did, at 300 peers under churn)
        int64_t from = q->out; // (out of the router's link: never before it was sent)
        if (engine_req_computes(q->kind) && r->peers[q->peer].worked_at > from)
            from = r->peers[q->peer].worked_at;
        // what is no compute (a state, a STEP, an UPDATE, a DISCARD) queues
        // behind the compute the router forgot (a rollback, a restart), and
        // a state behind what its peer held when it was sent too (a
        // verifier's audit of a target that died, a spot check's forward):
        // its clock runs from when that should be through (a restart's
        // DISCARD, queued behind the step's forgotten work at a slow
        // replica, once missed its deadline: swarm sim, churn 20 times the
        // traces' speed, an honest replica banned)
        if (!engine_req_computes(q->kind) && r->peers[q->peer].drained_at > from)
            from = r->peers[q->peer].drained_at;
        int64_t due = q->wire_ms + (state ? s_state_deadline_ms(r, q->stage) // (its own link)
                       + s_work_ms(r, &r->peers[q->peer], q->ahead_thirds) : s_deadline_ms(r, q));
        if (now - from > due + engine_link_wait_ms(r, q, most, from + due)) { // (the router's)
            r->peers[q->peer].state_missed += q->kind == R_STATE_GET;
            engine_peer_fail(r, q->peer, "missed the deadline of a %s request",
                             q->kind == R_FWD || q->kind == R_VERIFY ? "FWD" : q->kind == R_BWD ? "BWD"
                        : q->kind == R_AUDIT ? "audit" : q->kind == R_AUDIT_SUM ? "audit STEP"
                        : q->kind == R_UPDATE ? "UPDATE" : q->kind == R_STEP ? "STEP"
                        : q->kind == R_DISCARD ? "DISCARD" : q->kind == R_ASSIGN ? "ASSIGN"
                        : q->kind == R_STATE ? "STATE" : "STATE_GET");
        }
    }
    s_reap_failed(r); // (the probes' finds)
}

// Rebalancing judges each peer by its speed over the whole span since the
// last check (work done over time busy, once it was busy a second), not by
// the routing average, which follows the last second or so: on a shared host
// that swings by a third from one second to the next, and a move chosen on
// such a swing can leave the stage it takes from the new, worse bottleneck.
static void s_views_checked(swarm_engine_t *r, swarm_peer_view_t *views)
{
    int64_t now = r->now_ms;
    for (int q = 0; q < r->npeers; q++) {
        peer_t *pe = &r->peers[q];
        double busy = engine_busy_s(pe, now) - pe->check_busy;
        if (views[q].ready && busy >= 1.0)
            views[q].tok_s = (pe->work - pe->check_work) / busy;
        pe->check_busy += busy;
        pe->check_work = pe->work;
    }
}

// Seconds a moved peer's new state takes: fetched from a replica and sent
// on (12 bytes a parameter: the weights and both Adam moments), twice
// over the router's link (--router-bandwidth), and a tenth of a second of
// round trips. The next step waits for it (engine_join_held).
static double s_move_s(const swarm_engine_t *r, int s)
{
    return 0.1 + 2.0 * 12.0 * (double) r->stage_n[s] / (r->link_rate * 1e3);
}

// What each peer did over the checks so far, as a weight (speed times its
// stage's cost: the same on any stage), for the next check's
// s_plan_held: a mean that gives each check a fifth (about the last 25 s).
#define PLAN_SMOOTH 0.2
static void s_plan_speeds(swarm_engine_t *r, const swarm_peer_view_t *views)
{
    for (int q = 0; q < r->npeers; q++) {
        int s = views[q].stage;
        double w = s >= 0 && s < r->stages ? views[q].tok_s * r->stage_cost[s] : 0.0;
        double *was = &r->peers[q].plan_weight;
        *was = w > 0.0 && *was > 0.0 ? *was + PLAN_SMOOTH * (w - *was) : w;
    }
}

// Whether plan `to` lifts the bound (`low` now) by the margin by the
// speeds of the checks before too (s_plan_speeds), and by what each peer
// it sends back to the stage it last left did there. Measured speeds swing
// (a tenth from one check to the next on a busy host; by a third for tens
// of seconds beside a busy neighbour): by the last check's speeds alone,
// `swarm sim --speed-noise 0.2` moved peers twice as often, each move back
// to where it had been three times as often, for the same tokens. And a
// stage's cost (its FLOPs) foretells a peer's speed on another stage only
// roughly, so plans swapped two nodes of one speed back and forth.
static int s_plan_held(const swarm_engine_t *r, const swarm_peer_view_t *views,
                       const swarm_plan_t *plan, const int *to, double low)
{
    size_t n = (size_t) r->npeers;
    swarm_peer_view_t *was = malloc(2 * n * sizeof *was), *known = was + n;
    if (!was)
        return 1; // (the speeds of this check alone)
    memcpy(was, views, n * sizeof *was);
    memcpy(known, views, n * sizeof *known);
    for (int q = 0; q < r->npeers; q++) {
        const peer_t *pe = &r->peers[q];
        int s = views[q].stage;
        if (s < 0 || s >= r->stages)
            continue;
        if (pe->plan_weight > 0.0)
            was[q].tok_s = pe->plan_weight / r->stage_cost[s];
        if (pe->left_tok_s > 0.0 && to[q] == pe->left_stage && to[q] != s)
            known[q].tok_s = pe->left_tok_s * r->stage_cost[to[q]] / r->stage_cost[s];
    }
    double m = 1.0 + plan->margin;
    int held = swarm_policy_bound(was, r->npeers, plan, to)
                   > swarm_policy_bound(was, r->npeers, plan, NULL) * m
            && swarm_policy_bound(known, r->npeers, plan, to) > low * m;
    free(was);
    return held;
}

// Whether the plan's numbers count audits (swarm_policy_plan weighs them
// in an open swarm): its value now, `low`, is not the bound now, raw_low
// (engine_audit_plan's); *raw_high gets the bound after plan `to`.
static int s_plan_audited(const swarm_engine_t *r, const swarm_peer_view_t *views,
                          const swarm_plan_t *plan, const int *to, double low, double raw_low,
                          double *raw_high)
{
    if (!(plan->audit > 0.0) || raw_low == low)
        return 0;
    swarm_plan_t bare = *plan;
    bare.audit = 0.0;
    *raw_high = swarm_policy_bound(views, r->npeers, &bare, to);
    return 1;
}

// The plan a check before began, its later waves still to send (peer_t
// plan_to): into to[], and how many moves it has left; 0 (and the plan
// dropped) when none is, or when by the speeds measured since it no
// longer lifts the bound by the margin.
static int s_plan_rest(swarm_engine_t *r, const swarm_peer_view_t *views, const swarm_plan_t *plan,
                       int *to, double *low, double *high)
{
    int moves = 0;
    for (int q = 0; q < r->npeers; q++) {
        const peer_t *pe = &r->peers[q];
        int go = r->rebalance_rest && pe->plan_to > 0 && pe->state == P_READY
              && pe->plan_to - 1 != pe->stage;
        to[q] = go ? pe->plan_to - 1 : views[q].stage;
        moves += go;
    }
    *low = swarm_policy_bound(views, r->npeers, plan, NULL);
    *high = swarm_policy_bound(views, r->npeers, plan, to);
    if (moves > 0 && *high > *low * (1.0 + plan->margin))
        return moves;
    for (int q = 0; q < r->npeers; q++)
        r->peers[q].plan_to = 0;
    r->rebalance_rest = 0;
    return 0;
}

// A plan's wave was sent, and every peer it moved is ready on its new
// stage and measured there: the moves that waited for them need not wait
// for the next check, and s_plan_rest judges them at that speed (the
// stages' costs foretell it only roughly).
static int s_wave_landed(const swarm_engine_t *r)
{
    if (!r->rebalance_rest || !r->rebalance_landing)
        return 0;
    for (int q = 0; q < r->npeers; q++) {
        const peer_t *pe = &r->peers[q];
        if (pe->moved_at >= r->last_rebalance
            && (pe->state == P_JOINING || (pe->state == P_READY && pe->samples < 1)))
            return 0;
    }
    return 1;
}

// Whether engine_rebalance has a check to make between this step and the
// next: every --rebalance-every seconds, and as soon as a wave has landed.
int engine_rebalance_due(const swarm_engine_t *r)
{
    return r->rebalance_every > 0
           && (engine_secs(r) - r->last_rebalance >= r->rebalance_every || s_wave_landed(r));
}

// Between steps, every --rebalance-every seconds: the moves that take the
// swarm to the best split it can reach (swarm_policy_plan: worth it when
// the bound gains more than 5% and, over five minutes, more than the
// state fetches cost), made when the check before found a plan worth
// making too (measured speeds swing by a tenth from one check to the
// next); each moved peer gets its new stage's state from a live replica
// (engine_joins) before the next step. A plan goes in waves
// (swarm_policy_wave): the moves that would leave a stage short wait
// (peer_t plan_to), and are sent once the newcomers they wait for are
// ready (at that step's end, not the next check's), while the rest still
// lifts the bound (s_plan_rest).
void engine_rebalance(swarm_engine_t *r)
{
    double now = engine_secs(r);
    if (!engine_rebalance_due(r))
        return;
    r->last_rebalance = now;
    r->rebalance_landing = 0;
    swarm_peer_view_t *views = r->views; // s_move picks nothing
    double cost[SWARM_MAX_STAGES], move_s[SWARM_MAX_STAGES];
    engine_views_as(r, views, 0);
    s_views_checked(r, views);
    for (int q = 0; q < r->npeers; q++) {
        const peer_t *pe = &r->peers[q];
        // the speed the bound counts; one not measured yet is counted at
        // that, and not moved, unless routing holds it back as far slower
        // than its stage: a CPU beside a GPU that never fits a forward
        // there is never measured, and would idle there for good
        if (!pe->claim_doubted && pe->node_tok_s > 0.0)
            views[q].tok_s = engine_bound_speed(pe); // (else the checked measure)
        if (pe->state == P_READY && pe->samples < 1 && !engine_route_held_back(r, q))
            views[q].moved_at = now;
        // nor one still computing (an audit that runs on past its step, its
        // target dead): its node serves that at the stage it is leaving,
        // and the audit would feed it there after the move (the sim found
        // an honest verifier refusing it, banned)
        if (pe->audit_of >= 0 || pe->held_thirds > 0)
            views[q].moved_at = now;
    }
    for (int s = 0; s < r->stages; s++)
        cost[s] = r->stage_cost[s], move_s[s] = s_move_s(r, s);
    swarm_plan_t plan = { .stages = r->stages, .cost = cost, .need = r->stage_need,
                          .move_s = move_s, .now = now, .hold = 6.0 * r->rebalance_every,
                          .margin = 0.05, .horizon = 300.0, .wave_s = r->rebalance_every };
    double raw_low = engine_audit_plan(r, views, &plan), raw_high = 0.0; // (audits left out)
    int *to = malloc((size_t) (r->npeers > 0 ? r->npeers : 1) * sizeof *to);
    if (!to)
        return; // the next check tries again
    double low = 0.0, high = 0.0;
    int moves = s_plan_rest(r, views, &plan, to, &low, &high), rest = moves > 0, seen = rest;
    if (!rest) {
        moves = swarm_policy_plan(views, r->npeers, &plan, to, &low, &high);
        seen = moves > 0 && r->rebalance_seen && s_plan_held(r, views, &plan, to, low);
        r->rebalance_seen = moves > 0;
    }
    s_plan_speeds(r, views);
    if (!seen) {
        free(to);
        return;
    }
    if (!rest) {
        r->rebalance_seen = 0; // the next plan is judged on speeds measured after these moves
        for (int q = 0; q < r->npeers; q++)
            r->peers[q].plan_to = to[q] != r->peers[q].stage ? 1 + to[q] : 0;
    }
    // (before the wave leaves out what waits)
    int audited = !rest && s_plan_audited(r, views, &plan, to, low, raw_low, &raw_high);
    // its wave: a move that would leave its stage short waits (plan_to) for
    // the newcomers there; a later check sends it
    int waiting = swarm_policy_wave(views, r->npeers, &plan, to);
    int starts = waiting >= 0 ? moves - waiting : 0;
    r->rebalance_rest = waiting > 0;
    r->rebalance_landing = waiting > 0 && starts > 0;
    for (int q = 0; q < r->npeers; q++)
        if (waiting <= 0 || to[q] != r->peers[q].stage) // (sent now)
            r->peers[q].plan_to = 0;
    if (starts <= 0) {
        free(to);
        return;
    }
    double before[SWARM_MAX_STAGES] = {0};
    for (int q = 0; q < r->npeers; q++)
        if (views[q].ready)
            before[views[q].stage] += views[q].tok_s;
    char later[96] = "";
    if (waiting > 0)
        snprintf(later, sizeof later, " (%d now; %d once the stages they leave have their "
                 "newcomers ready)", starts, waiting);
    if (rest)
        engine_say(r, "swarm router: step %ld: rebalancing goes on: %d more move%s%s\n", r->step,
                   moves, moves == 1 ? "" : "s", later);
    else if (audited)
        engine_say(r, "swarm router: step %ld: rebalancing: %d move%s lift the tok/s a step "
                   "makes, its audits counted, from %.0f to %.0f (the bound: %.0f to %.0f)%s\n",
                   r->step, moves, moves == 1 ? "" : "s", low, high, raw_low, raw_high, later);
    else
        engine_say(r, "swarm router: step %ld: rebalancing: %d move%s lift the bound from %.0f "
                   "to %.0f tok/s%s\n", r->step, moves, moves == 1 ? "" : "s", low, high, later);
    for (int q = 0; q < r->npeers; q++) {
        peer_t *pe = &r->peers[q];
        if (to[q] == pe->stage || pe->state != P_READY)
            continue;
        char why[128];
        snprintf(why, sizeof why, "(%.0f tok/s in all) to stage %d (%.0f tok/s)",
                 before[pe->stage], to[q], before[to[q]]);
        pe->tok_s = views[q].tok_s; // its new stage's first guess scales this one
        s_move(r, q, to[q], cost, why);
    }
    free(to);
}
