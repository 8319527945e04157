/* train.c - `swarm train`: the whole model as its S stages in sequence, each
 * step G micro-batches with gradient accumulation, AdamW, evaluation,
 * checkpoints and logs. This is the single-process reference every swarm run
 * is held to, and it is held to the PyTorch reference (ref_gpt.py).
 *
 * It runs the same stage code path the swarm's nodes run; it does not touch
 * the network.
 */
#include "node.h"
#include "swarm.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>


// ---- the run ---------------------------------------------------------------

typedef struct {
    node_train_opts_t o;                       // settings
    blas_backend_t *be;                   // compute
    swarm_data_t *data;                   // training bytes
    node_trainer_t *trainer;              // the model as stages
    float *full;                          // model-sized scratch for saving
    long first;                           // step the run started at
    double train_time;                    // seconds in training steps
    double t_start;                       // wall clock at start
    node_curve_t curve;                   // --loss-log and DIR/loss.csv
    float *losses;                        // [iters]: each step's loss, for DIR/loss.svg
    node_evals_t evals;                   // each evaluation's results, for DIR/loss.svg
    int tty;                              // stderr is a terminal
    char device_note[512];                // what --device auto chose and why, or ""
} run_t;

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + 1e-9 * (double) ts.tv_nsec;
}

static double s_tokens_per_s(const run_t *r)
{
    long steps = node_trainer_step(r->trainer) - r->first;
    return r->train_time > 0 ? steps * (double) r->o.batch * r->o.cfg.T / r->train_time : 0.0;
}

static int s_eval(run_t *r)
{
    double tr = 0, va = 0;
    int rc = node_trainer_eval(r->trainer, 0, &tr);
    if (rc == 0)
        rc = node_trainer_eval(r->trainer, 1, &va);
    if (rc != 0)
        return rc;
    if (r->tty && !r->o.quiet)
        fprintf(stderr, "\r\033[K");
    printf("step %5ld | train %.4f | val %.4f | elapsed %.1f s | tok/s %.0f\n",
           node_trainer_step(r->trainer), tr, va, s_now() - r->t_start, s_tokens_per_s(r));
    fflush(stdout);
    node_evals_add(&r->evals, node_trainer_step(r->trainer), tr, va);
    return 0;
}

// This run's loss curve and evaluations in DIR/loss.svg (as swarm router's).
static void s_plot(run_t *r)
{
    long last = node_trainer_step(r->trainer);
    if (r->o.save && r->losses && last > r->first)
        node_plot_save(r->o.save, "swarm train", r->losses, r->first, last, &r->evals, r->o.quiet);
}

static int s_save(run_t *r)
{
    const node_train_opts_t *o = &r->o;
    size_t n = node_config_params(&o->cfg);
    float *m = malloc(n * sizeof(float)), *v = malloc(n * sizeof(float));
    char err[512];
    int rc = -ENOMEM;
    if (!m || !v) {
        fprintf(stderr, "swarm train: out of memory writing the checkpoint\n");
        goto out_free;
    }
    node_trainer_gather(r->trainer, 0, r->full);
    node_trainer_gather(r->trainer, 1, m);
    node_trainer_gather(r->trainer, 2, v);
    node_ckpt_meta_t meta = {
        .cfg = o->cfg, .step = node_trainer_step(r->trainer), .seed = o->seed, .iters = o->iters, .warmup = o->warmup,
        .batch = o->batch, .lr = o->lr, .min_lr = o->min_lr >= 0 ? o->min_lr : o->lr / 10.0,
        .weight_decay = o->weight_decay, .grad_clip = o->grad_clip,
    };
    rc = node_ckpt_save(o->save, &meta, r->full, m, v, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "swarm train: checkpoint not written: %s\n", err);
out_free:
    free(m);
    free(v);
    return rc;
}

// The step this run ends at: the schedule's end, or sooner with --steps.
static long s_stop(const run_t *r)
{
    const node_train_opts_t *o = &r->o;
    return o->steps > 0 && r->first + o->steps < o->iters ? r->first + o->steps : o->iters;
}

static void s_progress(run_t *r, float loss, double lr)
{
    const node_train_opts_t *o = &r->o;
    long step = node_trainer_step(r->trainer), stop = s_stop(r);
    double tps = s_tokens_per_s(r);
    double eta = tps > 0 ? (stop - step) * (double) o->batch * o->cfg.T / tps : 0;
    char to[40] = "";
    if (stop < o->iters)
        snprintf(to, sizeof to, " to step %ld", stop);
    if (r->tty) {
        int width = 30, done = o->iters ? (int) (width * step / o->iters) : width;
        char bar[64];
        for (int i = 0; i < width; i++)
            bar[i] = i < done ? '#' : '.';
        bar[width] = '\0';
        fprintf(stderr, "\r\033[K[%s] step %ld/%ld | loss %.4f | lr %.2e | %.0f tok/s | ETA %.0f s%s",
                bar, step, o->iters, loss, lr, tps, eta, to);
    } else if (step % o->log_every == 0 || step == stop) {
        fprintf(stderr, "step %ld/%ld | loss %.4f | lr %.2e | %.0f tok/s | ETA %.0f s%s\n",
                step, o->iters, loss, lr, tps, eta, to);
    }
}

// One optimizer step with its logs; -EDOM when the loss is not finite.
static int s_one_step(run_t *r)
{
    const node_train_opts_t *o = &r->o;
    long step = node_trainer_step(r->trainer);
    double t0 = s_now(), lr = 0;
    float loss = 0.0f;
    int rc = node_trainer_forward_backward(r->trainer, &loss);
    if (rc == 0 && !isfinite(loss)) {
        fprintf(stderr, "\nswarm train: loss is %f at step %ld; lower --lr or check --init\n", loss, step);
        return -EDOM;
    }
    if (rc == 0)
        rc = node_trainer_update(r->trainer, &lr);
    r->train_time += s_now() - t0;
    if (rc != 0)
        return rc;
    node_curve_add(&r->curve, step, loss, lr);
    if (r->losses && step < o->iters)
        r->losses[step] = loss;
    if (!o->quiet)
        s_progress(r, loss, lr);
    return 0;
}

static int s_train_loop(run_t *r)
{
    const node_train_opts_t *o = &r->o;
    int rc = 0;
    if (o->eval_every > 0 && r->first == 0)
        rc = s_eval(r);
    long stop = s_stop(r);
    while (rc == 0 && node_trainer_step(r->trainer) < stop) {
        rc = s_one_step(r);
        long step = node_trainer_step(r->trainer);
        if (rc == 0 && o->eval_every > 0 && (step % o->eval_every == 0 || step == o->iters))
            rc = s_eval(r);
        if (rc == 0 && o->save && o->save_every > 0 && step % o->save_every == 0 && step < o->iters)
            rc = s_save(r);
    }
    if (rc == 0 && o->save)
        rc = s_save(r);
    if (r->tty && !o->quiet)
        fprintf(stderr, "\n");
    if (rc == 0)
        s_plot(r);
    long steps = node_trainer_step(r->trainer) - r->first;
    double tps = s_tokens_per_s(r);
    printf("summary | iters %ld | wall %.2f s (train %.2f s) | s/iter %.5f | tok/s %.0f | GFLOP/s %.2f\n",
           steps, s_now() - r->t_start, r->train_time, steps > 0 ? r->train_time / steps : 0.0,
           tps, tps * node_config_flops_per_token(&o->cfg) / 1e9);
    return rc;
}

// ---- set-up ----------------------------------------------------------------

static int s_setup(run_t *r, char *err, size_t n)
{
    node_train_opts_t *o = &r->o;
    float *params = NULL, *m = NULL, *v = NULL;
    int rc = node_train_weights(&r->o, &params, &m, &v, &r->first, err, n);
    if (rc != 0)
        goto out;
    if (o->micro == 0)
        o->micro = o->batch;
    node_hparams_t hp = node_train_hparams(o);
    rc = node_config_check(&o->cfg, err, n);
    if (rc == 0)
        rc = swarm_data_check(r->data, o->cfg.T, err, n);
    if (rc != 0)
        goto out;
    r->be = blas_backend_open(o->device, o->threads, err, n);
    if (!r->be) {
        rc = -ENODEV;
        goto out;
    }
    snprintf(r->device_note, sizeof r->device_note, "%s", err);
    err[0] = '\0';
    r->trainer = node_trainer_new(&hp, r->be, r->data, err, n);
    if (!r->trainer) {
        rc = -EINVAL;
        goto out;
    }
    rc = node_trainer_load(r->trainer, params, m, v, r->first);
    if (rc != 0) {
        snprintf(err, n, "cannot upload the parameters to %s", r->be->device);
        goto out;
    }
    r->full = malloc(node_config_params(&o->cfg) * sizeof(float));
    if (!r->full) {
        snprintf(err, n, "out of memory for %zu parameters", node_config_params(&o->cfg));
        rc = -ENOMEM;
    }
    r->losses = o->save ? calloc((size_t) o->iters + 1, sizeof(float)) : NULL;
    if (rc == 0 && o->save && !r->losses) {
        snprintf(err, n, "out of memory for the losses of %ld steps", o->iters);
        rc = -ENOMEM;
    }
out:
    free(params);
    free(m);
    free(v);
    return rc;
}

static void s_teardown(run_t *r)
{
    node_trainer_destroy(&r->trainer);
    free(r->full);
    free(r->losses);
    node_evals_free(&r->evals);
    node_curve_close(&r->curve);
    swarm_data_destroy(&r->data);
}

int cmd_train(int argc, char **argv)
{
    run_t *r = calloc(1, sizeof *r);
    char err[1024] = "";
    if (!r)
        abort();
    int rc = node_train_parse(argc, argv, &r->o, err, sizeof err);
    if (rc == 1) {
        node_train_help(stdout);
        free(r);
        return 0;
    }
    if (rc == 0) {
        if (r->o.data) {
            rc = swarm_data_load(r->o.data, &r->data, err, sizeof err);
        } else {
            size_t len;
            const uint8_t *bytes = node_corpus(&len);
            r->data = swarm_data_wrap(bytes, len, "(built-in corpus)");
        }
    }
    if (rc == 0)
        rc = s_setup(r, err, sizeof err);
    if (rc == 0)
        rc = node_curve_open(&r->o, &r->curve, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "swarm train: %s\n", err);
        s_teardown(r);
        free(r);
        return 1;
    }
    const node_train_opts_t *o = &r->o;
    r->tty = isatty(STDERR_FILENO) && !getenv("SWARM_PLAIN");
    if (r->device_note[0])
        printf("swarm train: %s\n", r->device_note);
    printf("swarm train | %s | params %zu | flops/token %.0f | L %d H %d C %d T %d B %d "
           "micro %d stages %d iters %ld lr %g seed %llu | data %s (%zu bytes)\n",
           r->be->device, node_config_params(&o->cfg), node_config_flops_per_token(&o->cfg),
           o->cfg.L, o->cfg.H, o->cfg.C, o->cfg.T, o->batch, o->micro, o->stages, o->iters, o->lr,
           (unsigned long long) o->seed, swarm_data_name(r->data), swarm_data_size(r->data));
    if (o->resume)
        printf("resumed from %s at step %ld\n", o->resume, r->first);
    fflush(stdout);
    r->t_start = s_now();
    rc = s_train_loop(r);
    s_teardown(r);
    free(r);
    return rc == 0 ? 0 : 1;
}
