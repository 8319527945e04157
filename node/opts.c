/* opts.c - the model and training flags that `swarm train` and
 * `swarm router` share, and the starting state they describe (--resume,
 * --init, or fresh weights from --seed).
 *
 * It parses and loads; it does not train.
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
#include <unistd.h>

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

void node_train_help(FILE *out)
{
    fprintf(out,
        "usage: swarm train [flags]\n"
        "Train a byte-level GPT in one process, as S stages x G micro-batches.\n"
        "\n"
        "model:\n"
        "  --layers N        transformer blocks, L (default 4)\n"
        "  --heads N         attention heads, H (default 4)\n"
        "  --embd N          channels, C, a multiple of --heads (default 128)\n"
        "  --block N         bytes of context, T (default 64)\n"
        "batches:\n"
        "  --batch N         windows of --block bytes per optimizer step (default 12)\n"
        "  --micro-batch N   windows per micro-batch; gradients accumulate over\n"
        "                    batch/micro-batch of them (default: --batch)\n"
        "  --stages S        cut the layers into this many pipeline stages (default 1)\n"
        "schedule:\n"
        "  --iters N         optimizer steps in the schedule (default 2000)\n"
        "  --lr X            learning rate after the warmup (default 1e-3)\n"
        "  --min-lr X        where the cosine decay ends (default lr/10)\n"
        "  --warmup N        steps of linear warmup (default 100)\n"
        "  --weight-decay X  AdamW decay on matrices (default 0.1)\n"
        "  --grad-clip X     global-norm clipping (default 1.0; 0 = off)\n"
        "  --seed N          initial weights and data order (default 1337)\n"
        "eval:\n"
        "  --eval-every N    train/val loss every N steps (default 250; 0 = never)\n"
        "  --eval-iters N    batches per evaluation, the same each time (default 20)\n"
        "data:\n"
        "  --data FILE       raw bytes to train on (default: the built-in corpus)\n"
        "weights:\n"
        "  --init FILE.bgpt  start from these weights\n"
        "  --save DIR        checkpoint, model.bgpt and loss.csv in DIR\n"
        "  --save-every N    checkpoint every N steps and at the end (default 500)\n"
        "  --resume DIR      continue a run from its checkpoint\n"
        "  --steps N         stop after N steps of the schedule (--resume later)\n"
        "output:\n"
        "  --loss-log FILE   \"step loss lr\" per step\n"
        "  --log-every N     a progress line every N steps when not on a terminal\n"
        "                    (default 10)\n"
        "  --quiet           no progress at all\n"
        "compute:\n"
        "  --threads N       OpenBLAS's and swarm's threads (default: all cores)\n"
        "  --device DEV      auto, cpu, cuda or cuda:N (default auto: a GPU if one works)\n");
}

int node_parse_long(const char *flag, const char *s, long lo, long hi, long *out, char *err, size_t n)
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

int node_parse_size(const char *flag, const char *s, size_t *out, char *err, size_t n)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    double unit = 1.0;
    switch (*end == '\0' ? 0 : end[0] | 0x20) { // K, M, G, T: powers of 1024
    case 'k': unit = 1024.0, end++; break;
    case 'm': unit = 1048576.0, end++; break;
    case 'g': unit = 1073741824.0, end++; break;
    case 't': unit = 1099511627776.0, end++; break;
    default: break;
    }
    if (unit > 1.0 && *end == 'i')
        end++;
    if (*end == 'B' || *end == 'b')
        end++;
    double bytes = v * unit;
    if (errno || end == s || *s == '\0' || *end != '\0' || !(bytes >= 1048576.0) || bytes > 1e18) {
        snprintf(err, n, "--%s %s: expected a size of at least 1M, e.g. 512M, 8G or 1.5GiB", flag, s);
        return -EINVAL;
    }
    *out = (size_t) bytes;
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

static int s_parse_one(node_train_opts_t *o, int id, const char *name, const char *arg, char *err, size_t n)
{
    long v = 0;
    int rc = 0;
    switch (id) {
    case O_LAYERS: rc = node_parse_long(name, arg, 1, NODE_MAX_LAYERS, &v, err, n); o->cfg.L = (int) v; break;
    case O_HEADS: rc = node_parse_long(name, arg, 1, 1024, &v, err, n); o->cfg.H = (int) v; break;
    case O_EMBD: rc = node_parse_long(name, arg, 1, 65536, &v, err, n); o->cfg.C = (int) v; break;
    case O_BLOCK: rc = node_parse_long(name, arg, 1, 65536, &v, err, n); o->cfg.T = (int) v; break;
    case O_BATCH: rc = node_parse_long(name, arg, 1, 1 << 20, &v, err, n); o->batch = (int) v; break;
    case O_MICRO: rc = node_parse_long(name, arg, 1, 1 << 20, &v, err, n); o->micro = (int) v; break;
    case O_STAGES: rc = node_parse_long(name, arg, 1, NODE_MAX_LAYERS, &v, err, n); o->stages = (int) v; break;
    case O_ITERS: rc = node_parse_long(name, arg, 0, LONG_MAX / 2, &o->iters, err, n); break;
    case O_LR: rc = s_parse_double(name, arg, 0, 10, &o->lr, err, n); break;
    case O_MINLR: rc = s_parse_double(name, arg, 0, 10, &o->min_lr, err, n); break;
    case O_WARMUP: rc = node_parse_long(name, arg, 0, LONG_MAX / 2, &o->warmup, err, n); break;
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
    case O_EVERY: rc = node_parse_long(name, arg, 0, LONG_MAX / 2, &o->eval_every, err, n); break;
    case O_EITERS: rc = node_parse_long(name, arg, 1, 1 << 20, &v, err, n); o->eval_iters = (int) v; break;
    case O_DATA: o->data = arg; break;
    case O_INIT: o->init = arg; break;
    case O_SAVE: o->save = arg; break;
    case O_SAVE_EVERY: rc = node_parse_long(name, arg, 0, LONG_MAX / 2, &o->save_every, err, n); break;
    case O_RESUME: o->resume = arg; break;
    case O_THREADS: rc = node_parse_long(name, arg, 0, 4096, &v, err, n); o->threads = (int) v; break;
    case O_LOSSLOG: o->loss_log = arg; break;
    case O_DEVICE: o->device = arg; break;
    case O_LOG_EVERY: rc = node_parse_long(name, arg, 1, LONG_MAX / 2, &o->log_every, err, n); break;
    case O_QUIET: o->quiet = 1; break;
    case O_STEPS: rc = node_parse_long(name, arg, 1, LONG_MAX / 2, &o->steps, err, n); break;
    default: rc = -EINVAL; snprintf(err, n, "unknown flag"); break;
    }
    if (rc == 0)
        o->given |= 1u << id;
    return rc;
}

// 0 ok, 1 help printed, -EINVAL with err
int node_train_parse(int argc, char **argv, node_train_opts_t *o, char *err, size_t n)
{
    *o = (node_train_opts_t) {
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
static int s_apply_checkpoint(node_train_opts_t *o, const node_ckpt_meta_t *m, char *err, size_t n)
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

int node_train_weights(node_train_opts_t *o, float **params, float **m, float **v, long *step,
                       char *err, size_t n)
{
    *step = 0;
    if (o->resume) {
        node_ckpt_meta_t meta;
        int rc = node_ckpt_load(o->resume, &meta, params, m, v, err, n);
        if (rc != 0)
            return rc;
        *step = meta.step;
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

node_hparams_t node_train_hparams(const node_train_opts_t *o)
{
    return (node_hparams_t) {
        .cfg = o->cfg, .batch = o->batch, .micro = o->micro ? o->micro : o->batch,
        .stages = o->stages, .iters = o->iters, .warmup = o->warmup, .lr = o->lr,
        .min_lr = o->min_lr >= 0 ? o->min_lr : o->lr / 10.0, .weight_decay = o->weight_decay,
        .grad_clip = o->grad_clip, .seed = o->seed, .eval_iters = o->eval_iters,
    };
}

int node_curve_open(const node_train_opts_t *o, node_curve_t *curve, char *err, size_t n)
{
    *curve = (node_curve_t) { NULL, NULL };
    if (o->loss_log && !(curve->log = fopen(o->loss_log, o->resume ? "a" : "w"))) {
        int e = errno;
        snprintf(err, n, "--loss-log %s: %s", o->loss_log, strerror(e));
        return -e;
    }
    if (o->save) {
        char path[PATH_MAX], why[512] = "";
        int rc = node_mkdirs(o->save, 0755, why, sizeof why); // runs/first: both made
        if (rc != 0) {
            snprintf(err, n, "--save %s: %s", o->save, why);
            node_curve_close(curve);
            return rc;
        }
        snprintf(path, sizeof path, "%s/loss.csv", o->save);
        int fresh = !o->resume || access(path, F_OK) != 0;
        if (!(curve->csv = fopen(path, fresh ? "w" : "a"))) {
            int e = errno;
            snprintf(err, n, "--save %s: cannot write %s: %s", o->save, path, strerror(e));
            node_curve_close(curve);
            return -e;
        }
        if (fresh)
            fprintf(curve->csv, "step,loss,lr\n");
    }
    return 0;
}

void node_curve_add(node_curve_t *curve, long step, float loss, double lr)
{
    if (curve->log) {
        fprintf(curve->log, "%ld %.6f %.8g\n", step, loss, lr);
        fflush(curve->log);
    }
    if (curve->csv) {
        fprintf(curve->csv, "%ld,%.6f,%.8g\n", step, loss, lr);
        fflush(curve->csv);
    }
}

void node_curve_close(node_curve_t *curve)
{
    if (curve->log)
        fclose(curve->log);
    if (curve->csv)
        fclose(curve->csv);
    *curve = (node_curve_t) { NULL, NULL };
}
