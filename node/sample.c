/* sample.c - `swarm sample`: generate bytes from a checkpoint folder or a
 * BGPT weight file, one byte at a time from the softmax of the last
 * position's logits (temperature, seeded splitmix64).
 *
 * It runs the whole model as one stage; it does not train.
 */
#include "node.h"
#include "swarm.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    const char *ckpt;      // checkpoint folder or .bgpt file
    const char *prompt;    // text to continue
    long tokens;           // bytes to generate
    double temperature;    // 0 = greedy
    uint64_t seed;         // sampler seed
    int threads;           // CPU threads
    const char *device;    // backend
} sample_opts_t;

static void s_help(FILE *out)
{
    fprintf(out,
        "usage: swarm sample --ckpt DIR|FILE.bgpt [--prompt TEXT] [--tokens 500]\n"
        "                    [--temperature 0.8] [--seed 1337] [--threads N] [--device auto|cpu|cuda[:N]]\n"
        "Generate text from a checkpoint folder (swarm train --save DIR) or a BGPT weight file.\n");
}

static int s_parse(int argc, char **argv, sample_opts_t *o, char *err, size_t n)
{
    static const struct option opts[] = {
        {"ckpt", 1, 0, 'c'}, {"prompt", 1, 0, 'p'}, {"tokens", 1, 0, 'n'},
        {"temperature", 1, 0, 't'}, {"seed", 1, 0, 's'}, {"threads", 1, 0, 'j'},
        {"device", 1, 0, 'd'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0},
    };
    *o = (sample_opts_t) { .prompt = "\n", .tokens = 500, .temperature = 0.8, .seed = 1337,
                           .device = "auto" };
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        char *end = NULL;
        errno = 0;
        switch (c) {
        case 'c': o->ckpt = optarg; break;
        case 'p': o->prompt = optarg; break;
        case 'd': o->device = optarg; break;
        case 'h': return 1;
        case 'n':
            o->tokens = strtol(optarg, &end, 10);
            if (errno || *end || o->tokens < 0 || o->tokens > 100000000) {
                snprintf(err, n, "--tokens %s: expected a whole number 0..100000000", optarg);
                return -EINVAL;
            }
            break;
        case 'j':
            o->threads = (int) strtol(optarg, &end, 10);
            if (errno || *end || o->threads < 0 || o->threads > 4096) {
                snprintf(err, n, "--threads %s: expected 0..4096", optarg);
                return -EINVAL;
            }
            break;
        case 't':
            o->temperature = strtod(optarg, &end);
            if (errno || *end || !isfinite(o->temperature) || o->temperature < 0 || o->temperature > 100) {
                snprintf(err, n, "--temperature %s: expected a number 0..100", optarg);
                return -EINVAL;
            }
            break;
        case 's':
            o->seed = strtoull(optarg, &end, 10);
            if (errno || *end || *optarg == '-') {
                snprintf(err, n, "--seed %s: expected a whole number >= 0", optarg);
                return -EINVAL;
            }
            break;
        default:
            snprintf(err, n, "%s: unknown flag or missing value; see 'swarm sample --help'",
                     argv[optind - 1]);
            return -EINVAL;
        }
    }
    if (optind < argc) {
        snprintf(err, n, "%s: unexpected argument; see 'swarm sample --help'", argv[optind]);
        return -EINVAL;
    }
    if (!o->ckpt) {
        snprintf(err, n, "--ckpt is required: a folder from 'swarm train --save DIR' or a .bgpt file");
        return -EINVAL;
    }
    return 0;
}

static int s_load(const char *path, node_config_t *cfg, float **params, char *err, size_t n)
{
    struct stat sb;
    if (stat(path, &sb) != 0) {
        snprintf(err, n, "--ckpt %s: %s", path, strerror(errno));
        return -ENOENT;
    }
    if (S_ISDIR(sb.st_mode)) {
        node_ckpt_meta_t meta;
        int rc = node_ckpt_load(path, &meta, params, NULL, NULL, err, n);
        *cfg = meta.cfg;
        return rc;
    }
    node_bgpt_header_t h;
    int rc = node_bgpt_read(path, &h, params, err, n);
    if (rc == 0 && h.kind != 0) {
        snprintf(err, n, "--ckpt %s: holds gradients, not weights", path);
        free(*params);
        *params = NULL;
        return -EINVAL;
    }
    *cfg = h.cfg;
    return rc;
}

// Draw a byte from logits / temperature.
static int s_pick(const float *logits, int V, double temperature, uint64_t *state)
{
    int best = 0;
    for (int v = 1; v < V; v++)
        best = logits[v] > logits[best] ? v : best;
    if (temperature <= 0.0)
        return best;
    double p[NODE_VOCAB], sum = 0.0;
    for (int v = 0; v < V; v++) {
        p[v] = exp((logits[v] - logits[best]) / temperature);
        sum += p[v];
    }
    double u = (double) (swarm_splitmix64(state) >> 11) / 9007199254740992.0 * sum;
    for (int v = 0; v < V; v++) {
        u -= p[v];
        if (u <= 0.0)
            return v;
    }
    return best;
}

int cmd_sample(int argc, char **argv)
{
    sample_opts_t o;
    char err[1024];
    int rc = s_parse(argc, argv, &o, err, sizeof err);
    if (rc == 1) {
        s_help(stdout);
        return 0;
    }
    node_config_t cfg;
    float *params = NULL;
    node_plan_t plan;
    node_stage_t *st = NULL;
    node_acts_t *acts = NULL;
    blas_backend_t *be = NULL;
    if (rc == 0)
        rc = s_load(o.ckpt, &cfg, &params, err, sizeof err);
    if (rc == 0)
        rc = node_plan_make(&cfg, 1, &plan, err, sizeof err);
    if (rc == 0 && !(be = blas_backend_open(o.device, o.threads, err, sizeof err)))
        rc = -ENODEV;
    if (rc == 0 && err[0])
        fprintf(stderr, "swarm sample: %s\n", err); // what --device auto chose
    if (rc == 0 && !(st = node_stage_new(&cfg, &plan, 0, be, err, sizeof err)))
        rc = -ENOMEM;
    if (rc == 0 && !(acts = node_acts_new(st, 1, err, sizeof err)))
        rc = -ENOMEM;
    if (rc != 0) {
        fprintf(stderr, "swarm sample: %s\n", err);
        goto out;
    }
    memcpy(node_stage_params(st), params, node_config_params(&cfg) * sizeof(float));
    rc = node_stage_params_changed(st);
    int T = cfg.T;
    size_t plen = strlen(o.prompt);
    size_t cap = plen + (size_t) o.tokens + 1;
    int32_t *ctx = calloc(cap, sizeof(int32_t)), *window = calloc(2 * (size_t) T, sizeof(int32_t));
    float logits[NODE_VOCAB];
    if (!ctx || !window)
        abort();
    size_t len = 0;
    for (size_t i = 0; i < plen; i++)
        ctx[len++] = (uint8_t) o.prompt[i];
    if (len == 0)
        ctx[len++] = '\n';
    fwrite(o.prompt, 1, plen, stdout);
    uint64_t state = o.seed;
    for (long k = 0; k < o.tokens && rc == 0; k++) {
        // the last T bytes at positions 0..n-1; later positions cannot
        // influence them (causal attention), so they are left as zeros
        size_t n = len < (size_t) T ? len : (size_t) T;
        memset(window, 0, 2 * (size_t) T * sizeof(int32_t));
        for (size_t i = 0; i < n; i++)
            window[i] = ctx[len - n + i];
        node_stage_in_t in = { .tokens = window, .targets = window + T };
        float loss;
        rc = node_stage_forward(st, acts, &in, NULL, &loss, NULL);
        if (rc == 0)
            rc = node_stage_logits_at(st, acts, (int) n - 1, logits);
        if (rc != 0)
            break;
        int b = s_pick(logits, cfg.V, o.temperature, &state);
        ctx[len++] = b;
        putchar(b);
        fflush(stdout);
    }
    putchar('\n');
    free(ctx);
    free(window);
    if (rc != 0)
        fprintf(stderr, "swarm sample: generation failed (%s)\n", strerror(-rc));
out:
    node_acts_destroy(&acts);
    node_stage_destroy(&st);
    free(params);
    return rc == 0 ? 0 : 1;
}
