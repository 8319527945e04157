/* router_end.c - between steps: the step's line in the log, checkpoints
 * fetched from the replicas and written by a thread of their own,
 * evaluation, and the turn that moves the router through its phases.
 */
#include "router_int.h"

static void s_progress(router_t *r, double lr)
{
    long steps = r->step - r->first;
    double tps = r->train_time > 0 ? steps * (double) r->hp.batch * r->hp.cfg.T / r->train_time : 0;
    double eta = tps > 0 ? (r->hp.iters - r->step) * (double) r->hp.batch * r->hp.cfg.T / tps : 0;
    int ready = router_ready_count(r, -1);
    if (isatty(STDERR_FILENO) && !getenv("SWARM_PLAIN")) {
        fprintf(stderr, "\r\033[Kstep %ld/%ld | loss %.4f | lr %.2e | %.0f tok/s | peers %d | ETA %.0f s",
                r->step, r->hp.iters, r->last_loss, lr, tps, ready, eta);
    } else if (r->step % r->o.log_every == 0 || r->step == r->hp.iters) {
        fprintf(stderr, "step %ld/%ld | loss %.4f | lr %.2e | %.0f tok/s | peers %d | ETA %.0f s\n",
                r->step, r->hp.iters, r->last_loss, lr, tps, ready, eta);
    }
}

// Between steps: STATE_GET to the slowest ready replica of each stage (the
// read takes about as long on any, and the slowest one's time is worth
// least to the stage). It queues behind the step's UPDATE at each node, so
// every answer holds the state after it, and the next step starts at once
// (the node serves the work queued behind it first and reads its state in
// a gap): a checkpoint stalls no step (the run's last waits for its own).
// The parts gather in ck_state; params/m/v, which a rollback restores, take
// them only once all are in (router_ckpt_part).
static void s_ckpt_begin(router_t *r)
{
    size_t np = node_config_params(&r->hp.cfg);
    if (!r->ck_state && !(r->ck_state = malloc(3 * np * sizeof(float))))
        abort();
    r->ckpt_pending = 0;
    r->ck_step = r->step;
    r->ck_lost = 0;
    for (int s = 0; s < r->plan.stages; s++) {
        int from = -1, sent = 0;
        for (int p = 0; p < r->npeers; p++)
            if (r->peers[p].state == P_READY && !r->peers[p].failed && r->peers[p].stage == s
                && (from < 0 || r->peers[p].tok_s < r->peers[from].tok_s))
                from = p;
        if (from >= 0) {
            net_msg_t *g = net_msg_new(NET_MSG_STATE_GET);
            net_msg_head(g)->stage = (uint32_t) s;
            sent = router_send(r, from, &g, R_STATE_GET, -1, s) == 0;
            r->ckpt_pending += sent;
        }
        r->ck_lost |= !sent;
    }
    if (r->done)
        r->phase = PH_CKPT; // the run ends with it
}

static void s_ckpt_write(router_t *r)
{
    char err[512];
    node_ckpt_meta_t meta = {
        .cfg = r->hp.cfg, .step = r->ckpt_step, .seed = r->hp.seed, .iters = r->hp.iters,
        .warmup = r->hp.warmup, .batch = r->hp.batch, .lr = r->hp.lr, .min_lr = r->hp.min_lr,
        .weight_decay = r->hp.weight_decay, .grad_clip = r->hp.grad_clip,
    };
    if (node_ckpt_save(r->o.save, &meta, r->params, r->m, r->v, err, sizeof err) != 0)
        fprintf(stderr, "swarm router: checkpoint not written: %s\n", err);
    else
        printf("swarm router: checkpoint of step %ld in %s\n", r->ckpt_step, r->o.save);
    fflush(stdout);
}

static void *s_ckpt_thread(void *arg)
{
    s_ckpt_write(arg);
    return NULL;
}

// The file of the last checkpoint is written (params/m/v may change).
void router_ckpt_wait(router_t *r)
{
    if (r->ck_writing)
        pthread_join(r->ck_writer, NULL);
    r->ck_writing = 0;
}

// Write params/m/v to --save DIR on a thread of its own: an atomic write
// with its fsyncs takes 30-50 ms, a stall of every stage if the router
// waited. Signals stay with the main thread. Synchronously if no thread.
static void s_ckpt_save(router_t *r)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    r->ck_writing = pthread_create(&r->ck_writer, NULL, s_ckpt_thread, r) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!r->ck_writing)
        s_ckpt_write(r);
}

// One stage's part of the checkpoint came in (ok) or was lost with the
// replica holding it: the last one completes it, or skips it if a part
// was lost (params/m/v keep the previous checkpoint: never a mix of steps).
void router_ckpt_part(router_t *r, int ok)
{
    r->ck_lost |= !ok;
    if (--r->ckpt_pending > 0)
        return;
    if (r->ck_lost) {
        fprintf(stderr, "swarm router: checkpoint of step %ld skipped: a replica it was read from "
                "is gone; the last one is of step %ld\n", r->ck_step, r->ckpt_step);
    } else {
        size_t np = node_config_params(&r->hp.cfg);
        router_ckpt_wait(r); // the one before is on disk
        memcpy(r->params, r->ck_state, np * sizeof(float));
        memcpy(r->m, r->ck_state + np, np * sizeof(float));
        memcpy(r->v, r->ck_state + 2 * np, np * sizeof(float));
        r->ckpt_step = r->ck_step; // params/m/v now hold this step, written or not
        s_ckpt_save(r);
    }
    if (r->phase == PH_CKPT)
        r->phase = PH_WAIT;
}

void router_step_end(router_t *r)
{
    double loss = 0.0;
    for (int i = 0; i < r->G; i++)
        loss += r->mbs[i].loss;
    r->last_loss = (float) (loss / r->G);
    r->loss_avg = r->step == r->first ? r->last_loss : 0.9 * r->loss_avg + 0.1 * r->last_loss;
    double lr = node_lr_at(r->step, r->hp.iters, r->hp.warmup, r->hp.lr, r->hp.min_lr);
    router_consensus(r, r->step);
    node_curve_add(&r->logs, r->step, r->last_loss, lr);
    if (r->curve && r->step < r->hp.iters)
        r->curve[r->step] = r->last_loss;
    r->train_time += router_secs(r) - r->step_t0;
    router_trace(r, "step", 0, 0, 0, -1);
    r->step++;
    s_progress(r, lr);
    long stop = r->o.steps > 0 && r->first + r->o.steps < r->hp.iters ? r->first + r->o.steps
                                                                      : r->hp.iters;
    r->done = r->step >= stop;
    r->want_ckpt = r->o.save && (r->done || (r->o.save_every > 0 && r->step % r->o.save_every == 0));
    r->want_eval = r->o.eval_every > 0 && (r->step % r->o.eval_every == 0 || r->step == r->hp.iters);
    r->phase = PH_WAIT;
}

static void s_eval_batch(router_t *r)
{
    for (int i = 0; i < r->G; i++) {
        mb_t *b = &r->mbs[i];
        router_mb_clear(r, b);
        b->in[0] = malloc(r->tok_bytes);
        b->targets = malloc(r->tok_bytes);
        if (!b->in[0] || !b->targets)
            abort();
        swarm_data_draw(r->data, r->eval_split, &r->eval_state, r->hp.micro, r->hp.cfg.T,
                        b->in[0], b->targets);
        b->stage = 0;
        if (router_fwd(r, i, 0) != 0)
            b->stage = -2; // no peer now: s_eval_turn retries it
    }
}

static void s_eval_begin(router_t *r)
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

static void s_eval_turn(router_t *r)
{
    int S = r->plan.stages;
    router_retry(r);
    for (int i = 0; i < r->G; i++) {
        if (r->mbs[i].stage == -2 && router_fwd(r, i, 0) != 0)
            r->mbs[i].stage = -2;
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
    long steps = r->step - r->first;
    double tps = r->train_time > 0 ? steps * (double) r->hp.batch * r->hp.cfg.T / r->train_time : 0;
    if (isatty(STDERR_FILENO) && !getenv("SWARM_PLAIN"))
        fprintf(stderr, "\r\033[K");
    printf("step %5ld | train %.4f | val %.4f | elapsed %.1f s | tok/s %.0f\n", r->step,
           r->eval_loss[0], r->eval_loss[1], router_secs(r) - r->t_start, tps);
    fflush(stdout);
    node_evals_add(&r->evals, r->step, r->eval_loss[0], r->eval_loss[1]);
    r->evaluating = 0;
    for (int i = 0; i < r->G; i++)
        router_mb_clear(r, &r->mbs[i]);
    r->phase = PH_WAIT;
}

void router_turn(router_t *r)
{
    switch (r->phase) {
    case PH_WAIT:
        if (r->self_peer >= 0) {
            // a stage applies the last update itself (s_step_apply_ask):
            // the next step queues behind it; nothing else is due
            if (!r->done && router_all_stages_ready(r))
                router_step_begin(r);
            break;
        }
        if (r->want_eval && router_all_stages_ready(r)) {
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
            router_rebalance(r);
        else if (r->rollbacks > 0)
            router_refill_all(r, 0);
        router_joins(r);
        if (!r->done && router_all_stages_ready(r) && !router_join_held(r)) {
            if (!r->started) {
                printf("swarm router: every stage has a peer; training from step %ld\n", r->step);
                fflush(stdout);
            }
            r->started = 1;
            router_step_begin(r);
        }
        break;
    case PH_MB:
        router_step_micro(r);
        break;
    case PH_GRAD:
        if (r->pending <= 0 && router_spots_open(r) == 0) // a lie caught starts the step over
            router_step_update(r);
        break;
    case PH_UPDATE:
        if (r->pending <= 0)
            router_step_end(r);
        break;
    case PH_CKPT:
        if (r->ckpt_pending <= 0)
            r->phase = PH_WAIT;
        break;
    case PH_EVAL:
        s_eval_turn(r);
        break;
    case PH_DISCARD:
        if (r->pending <= 0)
            router_step_begin(r);
        break;
    }
}
