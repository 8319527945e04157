/* engine_end.c - between steps: the step's end told to the caller,
 * checkpoints fetched from the replicas (the caller writes them),
 * evaluation, and the turn that moves the engine through its phases.
 */
#include "engine_int.h"

double engine_tok_s(const swarm_engine_t *r)
{
    long steps = r->step - r->first;
    return r->train_time > 0 ? steps * (double) r->hp.batch * r->hp.cfg.T / r->train_time : 0;
}

long engine_stop(const swarm_engine_t *r)
{
    return r->o.steps > 0 && r->first + r->o.steps < r->hp.iters ? r->first + r->o.steps : r->hp.iters;
}

double engine_eta_s(const swarm_engine_t *r)
{
    double tps = engine_tok_s(r);
    return tps > 0 ? (engine_stop(r) - r->step) * (double) r->hp.batch * r->hp.cfg.T / tps : 0;
}

// The caller logs the step that ended (the loss log, the progress line).
static void s_progress(swarm_engine_t *r, double lr)
{
    swarm_engine_step_t st = {
        .step = r->step - 1, .iters = r->hp.iters, .stop = engine_stop(r), .loss = r->last_loss,
        .lr = lr, .tok_s = engine_tok_s(r), .eta_s = engine_eta_s(r),
        .ready = engine_ready_count(r, -1),
    };
    if (r->io.stepped)
        r->io.stepped(r->io.ctx, &st);
}

// Between steps: STATE_GET to a ready replica of each stage, drawn at
// random with the run's secret key (a liar cannot make itself the source;
// the state it sends is checked against the checksum it reported). It queues behind the step's UPDATE at each node, so
// every answer holds the state after it, and the next step starts at once
// (the node serves the work queued behind it first and reads its state in
// a gap): a checkpoint stalls no step (the run's last waits for its own).
// The parts gather in ck_state; params/m/v, which a rollback restores, take
// them only once all are in (engine_ckpt_part).
static void s_ckpt_begin(swarm_engine_t *r)
{
    size_t np = r->nparams;
    if (!r->ck_state && !(r->ck_state = malloc(3 * np * sizeof(float))))
        abort();
    r->ckpt_pending = 0;
    r->ck_step = r->step;
    r->ck_lost = 0;
    for (int s = 0; s < r->stages; s++) {
        int from = engine_state_source(r, s, engine_draw(r, DRAW_SOURCE, s, 0)), sent = 0;
        if (from >= 0) {
            net_msg_t *g = net_msg_new(NET_MSG_STATE_GET);
            net_msg_head(g)->stage = (uint32_t) s;
            sent = engine_send(r, from, &g, R_STATE_GET, -1, s) == 0;
            r->ckpt_pending += sent;
        }
        r->ck_lost |= !sent;
    }
    if (r->done)
        r->phase = PH_CKPT; // the run ends with it
}

// The caller's write of the last checkpoint is done (params/m/v may change).
void engine_ckpt_wait(swarm_engine_t *r)
{
    if (r->io.checkpoint_wait)
        r->io.checkpoint_wait(r->io.ctx);
}

// One stage's part of the checkpoint came in (ok) or was lost with the
// replica holding it: the last one completes it, or skips it if a part
// was lost (params/m/v keep the previous checkpoint: never a mix of steps).
void engine_ckpt_part(swarm_engine_t *r, int ok)
{
    r->ck_lost |= !ok;
    if (--r->ckpt_pending > 0)
        return;
    if (r->ck_lost) {
        engine_warn(r, "swarm router: checkpoint of step %ld skipped: a replica it was read from "
                    "is gone; the last one is of step %ld\n", r->ck_step, r->ckpt_step);
    } else {
        size_t np = r->nparams;
        engine_ckpt_wait(r); // the one before is on disk
        memcpy(r->params, r->ck_state, np * sizeof(float));
        memcpy(r->m, r->ck_state + np, np * sizeof(float));
        memcpy(r->v, r->ck_state + 2 * np, np * sizeof(float));
        r->ckpt_step = r->ck_step; // params/m/v now hold this step, written or not
        r->checkpoints++;
        char line[64];
        snprintf(line, sizeof line, "checkpoint of step %ld", r->ckpt_step);
        engine_history_event(r, 0, line); // (the caller logs where it writes it)
        if (r->io.checkpoint)
            r->io.checkpoint(r->io.ctx, r->ckpt_step, r->params, r->m, r->v);
    }
    if (r->phase == PH_CKPT)
        r->phase = PH_WAIT;
}

void engine_step_end(swarm_engine_t *r)
{
    double loss = 0.0;
    for (int i = 0; i < r->G; i++)
        loss += r->mbs[i].loss;
    r->last_loss = (float) (loss / r->G);
    r->loss_avg = r->step == r->first ? r->last_loss : 0.9 * r->loss_avg + 0.1 * r->last_loss;
    double lr = r->io.lr_at(r->io.ctx, r->step);
    engine_consensus(r, r->step);
    double step_s = engine_secs(r) - r->step_t0;
    r->train_time += step_s;
    r->timed_steps++;
    if (r->audit_waits) { // some sum's audit was wanted: the update waited for it
        r->audited_steps++;
        r->audited_time += step_s;
    }
    if (!r->audit_hit) // the draw picked no sum: what a plan weighs steps by (engine_rebalance)
        r->plain_step_s = r->plain_step_s > 0.0 ? 0.8 * r->plain_step_s + 0.2 * step_s : step_s;
    engine_trace(r, "step", 0, 0, 0, -1);
    r->step++;
    engine_history_step(r, step_s);
    s_progress(r, lr);
    r->done = r->step >= engine_stop(r);
    r->want_ckpt = r->o.save && (r->done || (r->o.save_every > 0 && r->step % r->o.save_every == 0));
    r->want_eval = r->o.eval_every > 0 && (r->step % r->o.eval_every == 0 || r->step == r->hp.iters);
    r->phase = PH_WAIT;
}

static void s_eval_batch(swarm_engine_t *r)
{
    engine_mbs_clear(r);
    for (int i = 0; i < r->G; i++) {
        mb_t *b = &r->mbs[i];
        b->tokens = malloc(r->tok_bytes);
        b->targets = malloc(r->tok_bytes);
        if (!b->tokens || !b->targets)
            abort();
        swarm_data_draw(r->data, r->eval_split, &r->eval_state, r->hp.micro, r->hp.cfg.T,
                        b->tokens, b->targets);
        if (engine_fwd(r, i, 0) != 0)
            engine_mb_at(r, i, -2, 0, -1); // no peer now: s_eval_turn retries it
    }
}

static void s_eval_begin(swarm_engine_t *r)
{
    r->want_eval = 0;
    r->evaluating = 1;
    r->eval_split = 0;
    r->eval_iter = 0;
    r->eval_sum = 0.0;
    r->eval_state = r->hp.seed + 1000;
    r->phase = PH_EVAL;
    s_eval_batch(r);
}

static void s_eval_turn(swarm_engine_t *r)
{
    int S = r->stages;
    engine_retry(r);
    for (int i = 0; i < r->G; i++) {
        if (r->mbs[i].stage == -2 && engine_fwd(r, i, 0) != 0)
            engine_mb_at(r, i, -2, 0, -1);
        if (r->mbs[i].stage != S)
            return;
    }
    double batch = 0.0;
    for (int i = 0; i < r->G; i++)
        batch += r->mbs[i].loss;
    r->eval_sum += (float) (batch / r->G);
    if (++r->eval_iter < r->hp.eval_iters) {
        s_eval_batch(r);
        return;
    }
    r->eval_loss[r->eval_split] = r->eval_sum / r->hp.eval_iters;
    if (r->eval_split == 0) {
        r->eval_split = 1;
        r->eval_iter = 0;
        r->eval_sum = 0.0;
        r->eval_state = r->hp.seed + 2000;
        s_eval_batch(r);
        return;
    }
    engine_history_eval(r, r->eval_loss[0], r->eval_loss[1]);
    if (r->io.evaluated)
        r->io.evaluated(r->io.ctx, r->step, r->eval_loss[0], r->eval_loss[1]);
    r->evaluating = 0;
    engine_mbs_clear(r);
    r->phase = PH_WAIT;
}

// Every stage has a ready replica, and (before the first step) --min-nodes
// have joined: a step may start.
int engine_all_stages_ready(const swarm_engine_t *r)
{
    for (int s = 0; s < r->stages; s++)
        if (engine_ready_count(r, s) == 0)
            return 0;
    // --min-nodes gates the start only: later the swarm trains on what it has
    return r->started || r->rollbacks > 0 || engine_ready_count(r, -1) >= r->min_nodes;
}

void engine_turn(swarm_engine_t *r)
{
    engine_backs(r);
    switch (r->phase) {
    case PH_WAIT:
        if (r->self_peer >= 0) {
            // a stage applies the last update itself (s_step_apply_ask):
            // the next step queues behind it; nothing else is due
            if (!r->done && engine_all_stages_ready(r))
                engine_step_begin(r);
            break;
        }
        if (r->want_eval && engine_all_stages_ready(r)) {
            s_eval_begin(r);
            break;
        }
        if (r->want_ckpt) {
            if (r->ckpt_pending > 0)
                break; // the previous one is still coming in
            r->want_ckpt = 0;
            s_ckpt_begin(r);
            if (r->phase == PH_CKPT)
                break;
        }
        if (r->started)
            engine_rebalance(r);
        else if (r->rollbacks > 0)
            engine_refill_all(r, 0);
        engine_replan(r);
        engine_joins(r);
        if (!r->done && engine_all_stages_ready(r) && !engine_join_held(r)) {
            if (!r->started) {
                engine_say(r, "swarm router: every stage has a peer; training from step %ld\n", r->step);
            }
            r->started = 1;
            if (!r->join_hold_t0)
                r->join_hold_t0 = r->now_ms ? r->now_ms : 1; // joins' share of the run is of this
            engine_step_begin(r);
        }
        break;
    case PH_MB:
        engine_step_micro(r);
        break;
    case PH_GRAD:
        // the step's checks first: a lie caught starts the step over; and
        // the last step's checksums compared (a pipelined update's), so that
        // no work of a replica that diverged reaches this step's update
        if (r->pending <= 0 && engine_spots_open(r) == 0 && engine_audits_open(r) == 0
            && r->update_pending == 0 && r->phase == PH_GRAD)
            engine_step_update(r);
        break;
    case PH_UPDATE:
        if (r->pending <= 0)
            engine_step_end(r);
        break;
    case PH_CKPT:
        if (r->ckpt_pending <= 0)
            r->phase = PH_WAIT;
        break;
    case PH_EVAL:
        s_eval_turn(r);
        break;
    case PH_DISCARD:
        if (r->pending <= 0 && r->rejoin) {
            r->rejoin = 0;
            r->phase = PH_WAIT; // a peer moved to decide a dispute: its state first
        } else if (r->pending <= 0) {
            engine_step_begin(r);
        }
        break;
    }
}
