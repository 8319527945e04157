/* engine.c - the router engine's way in and out (swarm.h): making one from
 * its config, handing it messages, lost connections and the passing of
 * time, and what a run did. The engine decides; its caller owns the
 * socket, the clock, the files and the terminal (node/router.c for `swarm
 * router`), so the same engine can run against a simulated swarm.
 */
#include "engine_int.h"

int swarm_engine_new(const swarm_engine_config_t *c, const swarm_engine_io_t *io, int64_t now_ms,
                     swarm_engine_t **out, char *err, size_t errlen)
{
    *out = NULL;
    if (c->stages < 1 || c->stages > SWARM_MAX_STAGES || c->micro < 1 || c->batch % c->micro != 0
        || !c->params || !io->send || !io->log || !io->lr_at || !io->clip_scale) {
        snprintf(err, errlen, "engine: %d stages (1..%d), micro-batch %d of batch %d, or a "
                 "missing callback", c->stages, SWARM_MAX_STAGES, c->micro, c->batch);
        return -EINVAL;
    }
    swarm_engine_t *r = calloc(1, sizeof *r);
    if (!r)
        return -ENOMEM;
    r->io = *io;
    r->now_ms = now_ms;
    r->o = (engine_run_t) { .save = c->save, .save_every = c->save_every,
                            .eval_every = c->eval_every, .steps = c->steps };
    r->hp = (engine_hparams_t) { .cfg = c->shape, .batch = c->batch, .micro = c->micro,
                                 .iters = c->iters, .seed = c->seed, .eval_iters = c->eval_iters,
                                 .weight_decay = c->weight_decay, .grad_clip = c->grad_clip };
    r->stages = c->stages;
    snprintf(r->cut, sizeof r->cut, "%s", c->cut);
    for (int s = 0; s < r->stages; s++) {
        r->stage_n[s] = c->stage_n[s];
        r->stage_off[s] = c->stage_off[s];
        r->stage_cost[s] = c->stage_cost[s];
        r->stage_need[s] = c->stage_need[s] > 0 ? c->stage_need[s] : 0.0;
        r->max_stage_n = r->stage_n[s] > r->max_stage_n ? r->stage_n[s] : r->max_stage_n;
    }
    r->nparams = c->nparams;
    r->data = c->data;
    r->params = c->params;
    r->m = c->m ? c->m : calloc(r->nparams, sizeof(float));
    r->v = c->v ? c->v : calloc(r->nparams, sizeof(float));
    r->step = r->first = r->ckpt_step = c->step;
    r->min_nodes = c->min_nodes;
    r->rebalance_every = c->rebalance_every;
    r->window = c->window;
    r->window_mode = c->window_mode;
    r->assign_even = c->assign_even;
    r->verify = c->verify;
    r->audit_rate = c->audit;
    r->audit_proven = c->audit_proven;
    r->secret = c->secret;
    engine_audits_reset(r);
    r->tensor_bound = c->tensor_bound;
    r->wire = c->wire;
    r->grad_wire = c->grad_wire;
    r->beat_ms = BEAT_MS;
    r->members = (swarm_loglimit_t) { .sender_burst = MEMBER_LINES_PEER_BURST,
                                      .sender_rate = MEMBER_LINES_PEER_RATE,
                                      .all_burst = MEMBER_LINES_BURST, .all_rate = MEMBER_LINES_RATE };
    r->open_swarm = c->open_swarm;
    snprintf(r->operator_key, sizeof r->operator_key, "%s", c->operator_key);
    r->link_rate = (c->router_mbit > 0.0 ? c->router_mbit : SWARM_ROUTER_MBIT) * 1e3 / 8.0;
    r->self_peer = -1;
    for (int s = 0; s < SWARM_MAX_STAGES; s++) {
        r->route[s].fastest_peer = r->route[s].held_left = -1;
        r->route[s].rows_fastest = -1.0;
    }
    r->want_eval = r->o.eval_every > 0 && r->step == 0;
    r->grad_sum = calloc(r->nparams, sizeof(float));
    r->G = r->hp.batch / r->hp.micro;
    r->mbs = calloc((size_t) r->G, sizeof(mb_t));
    r->scratch = malloc(engine_acts_count(r) * sizeof(float));
    r->hist = engine_history_new();
    if (!r->m || !r->v || !r->grad_sum || !r->mbs || !r->scratch || !r->hist) {
        snprintf(err, errlen, "out of memory for the model's state (%zu parameters)", r->nparams);
        swarm_engine_destroy(&r);
        return -ENOMEM;
    }
    engine_mbs_clear(r);
    if (r->window <= 0 || r->window > r->G)
        r->window = r->G; // and with --window auto, until the peers are measured
    r->tok_bytes = (size_t) r->hp.micro * r->hp.cfg.T * sizeof(int32_t);
    *out = r;
    return 0;
}

void swarm_engine_destroy(swarm_engine_t **self_p)
{
    swarm_engine_t *r = *self_p;
    if (!r)
        return;
    engine_mbs_clear(r); // (what the micro-batches owe is in the peers' rows)
    for (int p = 0; p < r->npeers; p++) {
        free(r->peers[p].grad);
        free(r->peers[p].audit_sums);
    }
    free(r->peers);
    free(r->key_index);
    for (int k = 0; k < (r->req_slots + REQ_BLOCK - 1) / REQ_BLOCK; k++)
        free(r->req_blocks[k]);
    free(r->req_blocks);
    free(r->req_free);
    free(r->views);
    free(r->by_peer);
    free(r->audit_cand);
    for (int s = 0; s < SWARM_MAX_STAGES; s++) {
        free(r->ready[s].peer);
        free(r->route[s].view);
        free(r->route[s].order);
        free(r->route[s].unmeasured.peer);
        free(r->audited[s].peer);
    }
    free(r->joining.peer);
    free(r->mbs);
    free(r->owed);
    free(r->params);
    free(r->ck_state);
    free(r->m);
    free(r->v);
    free(r->grad_sum);
    free(r->scratch);
    free(r->audit_sum);
    free(r->audit_dx);
    free(r->hist);
    free(r);
    *self_p = NULL;
}

void swarm_engine_message(swarm_engine_t *r, int64_t now_ms, const net_peer_t *who, net_msg_t *m)
{
    r->now_ms = now_ms;
    uint64_t bytes = engine_payload(m);
    r->bytes_in += bytes;
    engine_link_second(r);
    r->link_recv += bytes + LINK_HEAD;
    engine_wire_count(m, r->wire_in);
    engine_on_message(r, who, m);
}

void swarm_engine_bad_message(swarm_engine_t *r, int64_t now_ms, const char *key, const char *why)
{
    char note[64];
    r->now_ms = now_ms;
    if (engine_loud(r, key, note, sizeof note))
        engine_warn(r, "swarm router: bad message from %.8s...: %s%s\n", key, why, note);
}

void swarm_engine_gone(swarm_engine_t *r, int64_t now_ms, const net_peer_t *who)
{
    r->now_ms = now_ms;
    int p = engine_peer_find(r, who);
    if (p >= 0)
        engine_peer_dead(r, p, "is silent: dead");
}

void swarm_engine_drop_unless(swarm_engine_t *r, int64_t now_ms,
                              int (*allowed)(void *ctx, const char *key), void *ctx)
{
    r->now_ms = now_ms;
    for (int p = 0; p < r->npeers; p++) {
        peer_t *pe = &r->peers[p];
        // each is told once, a dead entry too (its key then leaves the
        // index): a node banned a moment before waits to be let back, and
        // would wait for good, its connections refused without a word
        if (allowed(ctx, pe->who.key) || engine_peer_find(r, &pe->who) != p)
            continue;
        net_msg_t *bye = net_msg_new(NET_MSG_ERROR);
        engine_meta(bye, "reason=this node's key was removed from the swarm's allow-list\nfatal=1");
        s_ignore(engine_emit(r, &pe->who, &bye));
        if (pe->state != P_DEAD)
            engine_peer_dead(r, p, "was removed from the allow-list: dropped");
        else
            engine_member_line(r, p, 1, "swarm router: peer %d (%s) was removed from the allow-list: "
                               "dropped (it was dead: %s)\n", pe->id, pe->name, pe->why);
        engine_key_del(r, p);
    }
}

void swarm_engine_tick(swarm_engine_t *r, int64_t now_ms)
{
    r->now_ms = now_ms;
    engine_reap(r);
    // advance through every phase that is ready now, not on the next message
    int before;
    do {
        before = r->phase;
        engine_turn(r);
    } while (r->phase != before && !swarm_engine_finished(r));
}

int swarm_engine_silence_ms(const swarm_engine_t *r)
{
    return r->beat_ms * BEAT_SILENT > SILENT_MS ? r->beat_ms * BEAT_SILENT : SILENT_MS;
}

int swarm_engine_finished(const swarm_engine_t *r)
{
    return r->done && r->phase == PH_WAIT && !r->want_eval && !r->want_ckpt;
}

void swarm_engine_bye(swarm_engine_t *r)
{
    for (int p = 0; p < r->npeers; p++) {
        if (r->peers[p].state == P_DEAD)
            continue;
        net_msg_t *bye = net_msg_new(NET_MSG_BYE);
        engine_meta(bye, "done=%d\nstep=%ld\nsteps=%ld", r->done, r->step, (long) r->hp.iters);
        s_ignore(engine_emit(r, &r->peers[p].who, &bye));
    }
}

void swarm_engine_summary(const swarm_engine_t *r, swarm_engine_summary_t *out)
{
    long steps = r->step - r->first;
    *out = (swarm_engine_summary_t) {
        .first = r->first, .step = r->step, .iters = r->hp.iters, .done = r->done,
        .train_time = r->train_time, .timed_steps = r->timed_steps,
        .audited_steps = r->audited_steps, .audited_time = r->audited_time,
        .tok_s = r->train_time > 0 ? steps * (double) r->hp.batch * r->hp.cfg.T / r->train_time : 0,
        .ready = engine_ready_count(r, -1), .checksum_mismatches = r->checksum_mismatches,
        .resyncs = r->resyncs, .expelled = r->expelled, .rollbacks = r->rollbacks,
        .spot_checks = r->spot_checks, .spot_undecided = r->spot_undecided,
        .restarts = r->restarts, .audits = r->audits, .audit_caught = r->audit_caught,
        .audit_undecided = r->audit_undecided, .audit_lost = r->audit_lost,
        .audit_steps = r->audit_steps, .audit_splits = r->audit_splits,
        .bytes_in = r->bytes_in, .bytes_out = r->bytes_out,
        .window_mean = r->window_n > 0 ? r->window_sum / r->window_n : (double) r->window,
        .micro_batches = r->G,
    };
    memcpy(out->wire_in, r->wire_in, sizeof out->wire_in);
    memcpy(out->wire_out, r->wire_out, sizeof out->wire_out);
}

void swarm_audit_cost_text(long steps, double steps_s, long audited, double audited_s, char *out,
                           size_t n)
{
    if (audited <= 0) {
        snprintf(out, n, "none of %ld steps waited for an audit", steps);
    } else if (audited >= steps) {
        snprintf(out, n, "all %ld steps waited for audits, %.2f s each (none without to compare)",
                 steps, audited_s / (double) audited);
    } else {
        double plain = (steps_s - audited_s) / (double) (steps - audited);
        double extra = audited_s - plain * (double) audited;
        snprintf(out, n, "%ld of %ld steps waited for audits, %.2f s each against %.2f s for the "
                 "others: about %.0f%% of the time in steps", audited, steps,
                 audited_s / (double) audited, plain,
                 steps_s > 0.0 && extra > 0.0 ? 100.0 * extra / steps_s : 0.0);
    }
}
