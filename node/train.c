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

// ---- options ---------------------------------------------------------------

typedef struct {
    node_config_t cfg;      // model shape
    int batch;              // windows per optimizer step (B)
    int micro;              // windows per micro-batch
    int stages;             // S
    long iters;             // optimizer steps in the schedule
    double lr, min_lr;      // schedule; min_lr < 0 means lr / 10
    long warmup;            // warmup steps
    double weight_decay;    // AdamW decay on matrices
    double grad_clip;       // global-norm clip, 0 = off
    uint64_t seed;          // data and init seed
    long eval_every;        // steps between evaluations, 0 = never
    int eval_iters;         // batches per evaluation
    const char *data;       // data file, NULL = built-in corpus
    const char *init;       // BGPT weights to start from
    const char *save;       // checkpoint folder
    long save_every;        // steps between checkpoints (and at the end)
    const char *resume;     // checkpoint folder to continue from
    int threads;            // CPU threads, 0 = all cores
    const char *loss_log;   // "step loss lr" per step
    const char *device;     // auto, cpu, cuda[:N]
    long log_every;         // steps between plain progress lines
    long steps;             // stop after this many steps in this run (0 = to the end)
    int quiet;              // no progress output
    unsigned given;         // bit per option set on the command line
} train_opts_t;

enum {
    O_LAYERS = 1, O_HEADS, O_EMBD, O_BLOCK, O_BATCH, O_MICRO, O_STAGES, O_ITERS, O_LR, O_MINLR,
    O_WARMUP, O_WD, O_CLIP, O_SEED, O_EVERY, O_EITERS, O_DATA, O_INIT, O_SAVE, O_SAVE_EVERY,
    O_RESUME, O_THREADS, O_LOSSLOG, O_DEVICE, O_LOG_EVERY, O_QUIET, O_HELP, O_STEPS,
};

static const struct option s_long[] = {
    {"layers", 1, 0, O_LAYERS}, {"heads", 1, 0, O_HEADS}, {"embd", 1, 0, O_EMBD},
    {"block", 1, 0, O_BLOCK}, {"batch", 1, 0, O_BATCH}, {"micro-batch", 1, 0, O_MICRO},
    {"stages", 1, 0, O_STAGES}, {"iters", 1, 0, O_ITERS}, {"lr", 1, 0, O_LR},
    {"min-lr", 1, 0, O_MINLR}, {"warmup", 1, 0, O_WARMUP}, {"weight-decay", 1, 0, O_WD},
    {"grad-clip", 1, 0, O_CLIP}, {"seed", 1, 0, O_SEED}, {"eval-every", 1, 0, O_EVERY},
    {"eval-iters", 1, 0, O_EITERS}, {"data", 1, 0, O_DATA}, {"init", 1, 0, O_INIT},
    {"save", 1, 0, O_SAVE}, {"save-every", 1, 0, O_SAVE_EVERY}, {"resume", 1, 0, O_RESUME},
    {"threads", 1, 0, O_THREADS}, {"loss-log", 1, 0, O_LOSSLOG}, {"device", 1, 0, O_DEVICE},
    {"log-every", 1, 0, O_LOG_EVERY}, {"steps", 1, 0, O_STEPS}, {"quiet", 0, 0, O_QUIET}, {"help", 0, 0, O_HELP},
    {0, 0, 0, 0},
};

static void s_help(FILE *out)
{
    fprintf(out,
        "usage: swarm train [flags]\n"
        "Train a byte-level GPT in one process, as S stages x G micro-batches.\n"
        "\n"
        "model:    --layers 4 --heads 4 --embd 128 --block 64\n"
        "batches:  --batch 12 (windows per step)  --micro-batch B (default: --batch)\n"
        "          --stages 1 (cut the layers into this many pipeline stages)\n"
        "schedule: --iters 2000 --lr 1e-3 --min-lr (lr/10) --warmup 100\n"
        "          --weight-decay 0.1 --grad-clip 1.0 --seed 1337\n"
        "eval:     --eval-every 250 (0 = never) --eval-iters 20\n"
        "data:     --data FILE (raw bytes; default: the corpus built into swarm)\n"
        "weights:  --init FILE.bgpt (start from these weights)\n"
        "          --save DIR (checkpoint + model.bgpt + loss.csv)  --save-every 500\n"
        "          --resume DIR (continue a run from its checkpoint)\n"
        "          --steps N (stop after N steps of the schedule; --resume later)\n"
        "output:   --loss-log FILE (\"step loss lr\" per step)  --log-every 10  --quiet\n"
        "compute:  --threads N (default: all cores)  --device auto|cpu|cuda[:N]\n");
}

static int s_parse_long(const char *flag, const char *s, long lo, long hi, long *out, char *err, size_t n)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *s == '\0' || *end != '\0' || v < lo || v > hi) {
        snprintf(err, n, "--%s %s: expected a whole number in %ld..%ld", flag, s, lo, hi);
        return -EINVAL;
    }
    *out = v;
    return 0;
}

static int s_parse_double(const char *flag, const char *s, double lo, double hi, double *out,
                          char *err, size_t n)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *s == '\0' || *end != '\0' || !isfinite(v) || v < lo || v > hi) {
        snprintf(err, n, "--%s %s: expected a number in %g..%g", flag, s, lo, hi);
        return -EINVAL;
    }
    *out = v;
    return 0;
}

static int s_parse_one(train_opts_t *o, int id, const char *name, const char *arg, char *err, size_t n)
{
    long v = 0;
    int rc = 0;
    switch (id) {
    case O_LAYERS: rc = s_parse_long(name, arg, 1, NODE_MAX_LAYERS, &v, err, n); o->cfg.L = (int) v; break;
    case O_HEADS: rc = s_parse_long(name, arg, 1, 1024, &v, err, n); o->cfg.H = (int) v; break;
    case O_EMBD: rc = s_parse_long(name, arg, 1, 65536, &v, err, n); o->cfg.C = (int) v; break;
    case O_BLOCK: rc = s_parse_long(name, arg, 1, 65536, &v, err, n); o->cfg.T = (int) v; break;
    case O_BATCH: rc = s_parse_long(name, arg, 1, 1 << 20, &v, err, n); o->batch = (int) v; break;
    case O_MICRO: rc = s_parse_long(name, arg, 1, 1 << 20, &v, err, n); o->micro = (int) v; break;
    case O_STAGES: rc = s_parse_long(name, arg, 1, NODE_MAX_LAYERS, &v, err, n); o->stages = (int) v; break;
    case O_ITERS: rc = s_parse_long(name, arg, 0, LONG_MAX / 2, &o->iters, err, n); break;
    case O_LR: rc = s_parse_double(name, arg, 0, 10, &o->lr, err, n); break;
    case O_MINLR: rc = s_parse_double(name, arg, 0, 10, &o->min_lr, err, n); break;
    case O_WARMUP: rc = s_parse_long(name, arg, 0, LONG_MAX / 2, &o->warmup, err, n); break;
    case O_WD: rc = s_parse_double(name, arg, 0, 10, &o->weight_decay, err, n); break;
    case O_CLIP: rc = s_parse_double(name, arg, 0, 1e30, &o->grad_clip, err, n); break;
    case O_SEED: {
        char *end;
        errno = 0;
        o->seed = strtoull(arg, &end, 10);
        if (errno || *arg == '\0' || *arg == '-' || *end != '\0') {
            snprintf(err, n, "--seed %s: expected a whole number >= 0", arg);
            rc = -EINVAL;
        }
        break;
    }
    case O_EVERY: rc = s_parse_long(name, arg, 0, LONG_MAX / 2, &o->eval_every, err, n); break;
    case O_EITERS: rc = s_parse_long(name, arg, 1, 1 << 20, &v, err, n); o->eval_iters = (int) v; break;
    case O_DATA: o->data = arg; break;
    case O_INIT: o->init = arg; break;
    case O_SAVE: o->save = arg; break;
    case O_SAVE_EVERY: rc = s_parse_long(name, arg, 0, LONG_MAX / 2, &o->save_every, err, n); break;
    case O_RESUME: o->resume = arg; break;
    case O_THREADS: rc = s_parse_long(name, arg, 0, 4096, &v, err, n); o->threads = (int) v; break;
    case O_LOSSLOG: o->loss_log = arg; break;
    case O_DEVICE: o->device = arg; break;
    case O_LOG_EVERY: rc = s_parse_long(name, arg, 1, LONG_MAX / 2, &o->log_every, err, n); break;
    case O_QUIET: o->quiet = 1; break;
    case O_STEPS: rc = s_parse_long(name, arg, 1, LONG_MAX / 2, &o->steps, err, n); break;
    default: rc = -EINVAL; snprintf(err, n, "unknown flag"); break;
    }
    if (rc == 0)
        o->given |= 1u << id;
    return rc;
}

// 0 ok, 1 help printed, -EINVAL with err
static int s_parse(int argc, char **argv, train_opts_t *o, char *err, size_t n)
{
    *o = (train_opts_t) {
        .cfg = { NODE_VOCAB, 64, 128, 4, 4 }, .batch = 12, .micro = 0, .stages = 1,
        .iters = 2000, .lr = 1e-3, .min_lr = -1, .warmup = 100, .weight_decay = 0.1,
        .grad_clip = 1.0, .seed = 1337, .eval_every = 250, .eval_iters = 20,
        .save_every = 500, .device = "auto", .log_every = 10,
    };
    optind = 1;
    opterr = 0;
    int id, idx;
    while ((id = getopt_long(argc, argv, "h", s_long, &idx)) != -1) {
        if (id == 'h' || id == O_HELP)
            return 1;
        if (id == '?' || id == ':') {
            const char *bad = optind > 0 && optind <= argc ? argv[optind - 1] : "?";
            snprintf(err, n, "%s: unknown flag or missing value; see 'swarm train --help'", bad);
            return -EINVAL;
        }
        if (s_parse_one(o, id, s_long[idx].name, optarg, err, n) != 0)
            return -EINVAL;
    }
    if (optind < argc) {
        snprintf(err, n, "%s: unexpected argument; see 'swarm train --help'", argv[optind]);
        return -EINVAL;
    }
    if (o->init && o->resume) {
        snprintf(err, n, "--init and --resume both given: a resumed run takes its weights from "
                 "the checkpoint; drop --init");
        return -EINVAL;
    }
    return 0;
}

// Settings that are not model shape: flags win, else the checkpoint's.
static int s_apply_checkpoint(train_opts_t *o, const node_ckpt_meta_t *m, char *err, size_t n)
{
    const int shape[4][3] = {
        {O_LAYERS, o->cfg.L, m->cfg.L}, {O_HEADS, o->cfg.H, m->cfg.H},
        {O_EMBD, o->cfg.C, m->cfg.C}, {O_BLOCK, o->cfg.T, m->cfg.T},
    };
    static const char *names[] = {"layers", "heads", "embd", "block"};
    for (int i = 0; i < 4; i++) {
        if ((o->given & (1u << shape[i][0])) && shape[i][1] != shape[i][2]) {
            snprintf(err, n, "--%s %d does not match the checkpoint in %s (%d); drop the flag",
                     names[i], shape[i][1], o->resume, shape[i][2]);
            return -EINVAL;
        }
    }
    o->cfg = m->cfg;
#define TAKE(bit, field, value) if (!(o->given & (1u << (bit)))) o->field = (value)
    TAKE(O_BATCH, batch, m->batch);
    TAKE(O_ITERS, iters, m->iters);
    TAKE(O_WARMUP, warmup, m->warmup);
    TAKE(O_LR, lr, m->lr);
    TAKE(O_MINLR, min_lr, m->min_lr);
    TAKE(O_WD, weight_decay, m->weight_decay);
    TAKE(O_CLIP, grad_clip, m->grad_clip);
    TAKE(O_SEED, seed, m->seed);
#undef TAKE
    return 0;
}

// ---- the run ---------------------------------------------------------------

typedef struct {
    train_opts_t o;                       // settings
    blas_backend_t *be;                   // compute
    swarm_data_t *data;                   // training bytes
    node_trainer_t *trainer;              // the model as stages
    float *full;                          // model-sized scratch for saving
    long first;                           // step the run started at
    double train_time;                    // seconds in training steps
    double t_start;                       // wall clock at start
    FILE *loss_log;                       // --loss-log
    FILE *csv;                            // DIR/loss.csv
    int tty;                              // stderr is a terminal
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
    return 0;
}

static int s_save(run_t *r)
{
    const train_opts_t *o = &r->o;
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

static void s_progress(run_t *r, float loss, double lr)
{
    const train_opts_t *o = &r->o;
    long step = node_trainer_step(r->trainer);
    double tps = s_tokens_per_s(r);
    double eta = tps > 0 ? (o->iters - step) * (double) o->batch * o->cfg.T / tps : 0;
    if (r->tty) {
        int width = 30, done = o->iters ? (int) (width * step / o->iters) : width;
        char bar[64];
        for (int i = 0; i < width; i++)
            bar[i] = i < done ? '#' : '.';
        bar[width] = '\0';
        fprintf(stderr, "\r\033[K[%s] step %ld/%ld | loss %.4f | lr %.2e | %.0f tok/s | ETA %.0f s",
                bar, step, o->iters, loss, lr, tps, eta);
    } else if (step % o->log_every == 0 || step == o->iters) {
        fprintf(stderr, "step %ld/%ld | loss %.4f | lr %.2e | %.0f tok/s | ETA %.0f s\n",
                step, o->iters, loss, lr, tps, eta);
    }
}

// One optimizer step with its logs; -EDOM when the loss is not finite.
static int s_one_step(run_t *r)
{
    const train_opts_t *o = &r->o;
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
    if (r->loss_log)
        fprintf(r->loss_log, "%ld %.6f %.8g\n", step, loss, lr);
    if (r->csv) {
        fprintf(r->csv, "%ld,%.6f,%.8g\n", step, loss, lr);
        fflush(r->csv);
    }
    if (!o->quiet)
        s_progress(r, loss, lr);
    return 0;
}

static int s_train_loop(run_t *r)
{
    const train_opts_t *o = &r->o;
    int rc = 0;
    if (o->eval_every > 0 && r->first == 0)
        rc = s_eval(r);
    long stop = o->steps > 0 && r->first + o->steps < o->iters ? r->first + o->steps : o->iters;
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
    long steps = node_trainer_step(r->trainer) - r->first;
    double tps = s_tokens_per_s(r);
    printf("summary | iters %ld | wall %.2f s (train %.2f s) | s/iter %.5f | tok/s %.0f | GFLOP/s %.2f\n",
           steps, s_now() - r->t_start, r->train_time, steps > 0 ? r->train_time / steps : 0.0,
           tps, tps * node_config_flops_per_token(&o->cfg) / 1e9);
    return rc;
}

// ---- set-up ----------------------------------------------------------------

static int s_load_weights(run_t *r, float **params, float **m, float **v, char *err, size_t n)
{
    train_opts_t *o = &r->o;
    if (o->resume) {
        node_ckpt_meta_t meta;
        int rc = node_ckpt_load(o->resume, &meta, params, m, v, err, n);
        if (rc != 0)
            return rc;
        r->first = meta.step;
        return s_apply_checkpoint(o, &meta, err, n);
    }
    if (o->init) {
        node_bgpt_header_t h;
        int rc = node_bgpt_read(o->init, &h, params, err, n);
        if (rc != 0)
            return rc;
        if (h.kind != 0) {
            snprintf(err, n, "--init %s: holds gradients (kind 1), not weights", o->init);
            return -EINVAL;
        }
        if (h.cfg.T != o->cfg.T || h.cfg.C != o->cfg.C || h.cfg.L != o->cfg.L || h.cfg.H != o->cfg.H) {
            snprintf(err, n, "--init %s: the file is L=%d H=%d C=%d T=%d but the flags say "
                     "L=%d H=%d C=%d T=%d; pass matching --layers --heads --embd --block",
                     o->init, h.cfg.L, h.cfg.H, h.cfg.C, h.cfg.T, o->cfg.L, o->cfg.H, o->cfg.C, o->cfg.T);
            return -EINVAL;
        }
        return 0;
    }
    // fresh weights: N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)),
    // biases 0, LayerNorm weights 1 (Box-Muller over splitmix64)
    size_t count = node_config_params(&o->cfg);
    *params = calloc(count, sizeof(float));
    if (!*params) {
        snprintf(err, n, "out of memory for %zu parameters", count);
        return -ENOMEM;
    }
    uint64_t state = o->seed ^ 0x5EED5EEDull;
    for (int i = 0; i < node_tensor_count(&o->cfg); i++) {
        node_tensor_t t = node_tensor_at(&o->cfg, i);
        int k = i >= 2 ? (i - 2) % NODE_LAYER_TENSORS : -1;
        int is_ln_weight = t.dims == 1 && strstr(t.name, "ln") && strstr(t.name, ".weight");
        double std = (k == 4 || k == 10) && i < node_tensor_count(&o->cfg) - 3
                   ? 0.02 / sqrt(2.0 * o->cfg.L) : 0.02;
        for (size_t j = 0; j < t.size; j++) {
            float *p = *params + t.offset + j;
            if (is_ln_weight) {
                *p = 1.0f;
            } else if (t.dims >= 2) {
                double u1 = ((swarm_splitmix64(&state) >> 11) + 1.0) / 9007199254740993.0;
                double u2 = (swarm_splitmix64(&state) >> 11) / 9007199254740992.0;
                *p = (float) (std * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
            }
        }
    }
    return 0;
}

static int s_setup(run_t *r, char *err, size_t n)
{
    train_opts_t *o = &r->o;
    float *params = NULL, *m = NULL, *v = NULL;
    int rc = s_load_weights(r, &params, &m, &v, err, n);
    if (rc != 0)
        goto out;
    if (o->micro == 0)
        o->micro = o->batch;
    node_hparams_t hp = {
        .cfg = o->cfg, .batch = o->batch, .micro = o->micro, .stages = o->stages,
        .iters = o->iters, .warmup = o->warmup, .lr = o->lr,
        .min_lr = o->min_lr >= 0 ? o->min_lr : o->lr / 10.0, .weight_decay = o->weight_decay,
        .grad_clip = o->grad_clip, .seed = o->seed, .eval_iters = o->eval_iters,
    };
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
out:
    free(params);
    free(m);
    free(v);
    return rc;
}

static int s_open_logs(run_t *r, char *err, size_t n)
{
    const train_opts_t *o = &r->o;
    const char *mode = o->resume ? "a" : "w";
    if (o->loss_log && !(r->loss_log = fopen(o->loss_log, mode))) {
        snprintf(err, n, "--loss-log %s: %s", o->loss_log, strerror(errno));
        return -errno;
    }
    if (o->save) {
        char path[PATH_MAX];
        mkdir(o->save, 0755);
        snprintf(path, sizeof path, "%s/loss.csv", o->save);
        int fresh = !o->resume || access(path, F_OK) != 0;
        if (!(r->csv = fopen(path, fresh ? "w" : "a"))) {
            snprintf(err, n, "--save %s: cannot write %s: %s", o->save, path, strerror(errno));
            return -errno;
        }
        if (fresh)
            fprintf(r->csv, "step,loss,lr\n");
    }
    return 0;
}

static void s_teardown(run_t *r)
{
    node_trainer_destroy(&r->trainer);
    free(r->full);
    if (r->loss_log)
        fclose(r->loss_log);
    if (r->csv)
        fclose(r->csv);
    swarm_data_destroy(&r->data);
}

int cmd_train(int argc, char **argv)
{
    run_t *r = calloc(1, sizeof *r);
    char err[1024] = "";
    if (!r)
        abort();
    int rc = s_parse(argc, argv, &r->o, err, sizeof err);
    if (rc == 1) {
        s_help(stdout);
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
        rc = s_open_logs(r, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "swarm train: %s\n", err);
        s_teardown(r);
        free(r);
        return 1;
    }
    const train_opts_t *o = &r->o;
    r->tty = isatty(STDERR_FILENO) && !getenv("SWARM_PLAIN");
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
