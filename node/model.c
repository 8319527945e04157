/* model.c - the shape of the byte-level GPT: validity of a configuration,
 * the parameter layout (the BGPT file order, layer-major), FLOP counts and
 * the plan that cuts the blocks into stages.
 *
 * No memory for parameters lives here; stage.c owns that.
 */
#include "node.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LIMIT_T 65536
#define LIMIT_C 65536

int node_config_check(const node_config_t *cfg, char *err, size_t errlen)
{
    if (cfg->V != NODE_VOCAB) {
        snprintf(err, errlen, "vocabulary %d: swarm models are byte-level (256)", cfg->V);
        return -EINVAL;
    }
    if (cfg->L < 1 || cfg->L > NODE_MAX_LAYERS) {
        snprintf(err, errlen, "--layers %d: must be 1..%d", cfg->L, NODE_MAX_LAYERS);
        return -EINVAL;
    }
    if (cfg->H < 1 || cfg->H > 1024) {
        snprintf(err, errlen, "--heads %d: must be 1..1024", cfg->H);
        return -EINVAL;
    }
    if (cfg->C < 1 || cfg->C > LIMIT_C) {
        snprintf(err, errlen, "--embd %d: must be 1..%d", cfg->C, LIMIT_C);
        return -EINVAL;
    }
    if (cfg->C % cfg->H != 0) {
        snprintf(err, errlen, "--embd %d is not divisible by --heads %d; pick C a multiple of H",
                 cfg->C, cfg->H);
        return -EINVAL;
    }
    if (cfg->T < 1 || cfg->T > LIMIT_T) {
        snprintf(err, errlen, "--block %d: must be 1..%d", cfg->T, LIMIT_T);
        return -EINVAL;
    }
    return 0;
}

static size_t s_layer_params(const node_config_t *cfg)
{
    size_t C = (size_t) cfg->C;
    return 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C;
}

size_t node_config_params(const node_config_t *cfg)
{
    size_t C = (size_t) cfg->C, V = (size_t) cfg->V, T = (size_t) cfg->T;
    return V * C + T * C + (size_t) cfg->L * s_layer_params(cfg) + 2 * C + V * C;
}

double node_config_flops_per_token(const node_config_t *cfg)
{
    return 6.0 * (double) node_config_params(cfg)
         + 12.0 * cfg->L * (double) cfg->T * cfg->C;
}

int node_tensor_count(const node_config_t *cfg)
{
    return 2 + NODE_LAYER_TENSORS * cfg->L + 3;
}

node_tensor_t node_tensor_at(const node_config_t *cfg, int i)
{
    static const char *layer_names[NODE_LAYER_TENSORS] = {
        "ln1.weight", "ln1.bias", "qkv.weight", "qkv.bias", "proj.weight", "proj.bias",
        "ln2.weight", "ln2.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
    };
    int C = cfg->C;
    // (rows, cols) of each layer tensor
    const int shape[NODE_LAYER_TENSORS][2] = {
        {1, C}, {1, C}, {3 * C, C}, {1, 3 * C}, {C, C}, {1, C},
        {1, C}, {1, C}, {4 * C, C}, {1, 4 * C}, {C, 4 * C}, {1, C},
    };
    node_tensor_t t = {0};
    size_t off = 0;
    if (i == 0) {
        snprintf(t.name, sizeof t.name, "wte");
        t.rows = cfg->V, t.cols = C;
    } else if (i == 1) {
        snprintf(t.name, sizeof t.name, "wpe");
        t.rows = cfg->T, t.cols = C, off = (size_t) cfg->V * C;
    } else if (i < 2 + NODE_LAYER_TENSORS * cfg->L) {
        int l = (i - 2) / NODE_LAYER_TENSORS, k = (i - 2) % NODE_LAYER_TENSORS;
        snprintf(t.name, sizeof t.name, "blocks.%d.%s", l, layer_names[k]);
        t.rows = shape[k][0], t.cols = shape[k][1];
        off = (size_t) (cfg->V + cfg->T) * C + (size_t) l * s_layer_params(cfg);
        for (int j = 0; j < k; j++)
            off += (size_t) shape[j][0] * shape[j][1];
    } else {
        int k = i - 2 - NODE_LAYER_TENSORS * cfg->L;
        off = (size_t) (cfg->V + cfg->T) * C + (size_t) cfg->L * s_layer_params(cfg);
        if (k == 0) {
            snprintf(t.name, sizeof t.name, "lnf.weight");
            t.rows = 1, t.cols = C;
        } else if (k == 1) {
            snprintf(t.name, sizeof t.name, "lnf.bias");
            t.rows = 1, t.cols = C, off += C;
        } else {
            snprintf(t.name, sizeof t.name, "lm_head.weight");
            t.rows = cfg->V, t.cols = C, off += 2 * (size_t) C;
        }
    }
    t.offset = off;
    t.size = (size_t) t.rows * t.cols;
    // matrices (weight decay) vs vectors, by position rather than by shape,
    // so that a tiny model with C = 1 still decays the same tensors
    int k = i >= 2 && i < 2 + NODE_LAYER_TENSORS * cfg->L ? (i - 2) % NODE_LAYER_TENSORS : -1;
    int matrix = i < 2 || i == node_tensor_count(cfg) - 1
              || k == 2 || k == 4 || k == 8 || k == 10;
    t.dims = matrix ? 2 : 1;
    return t;
}

// ---- plan ------------------------------------------------------------------

// Forward FLOPs per token of `blocks` blocks, plus the embeddings on the
// first stage and the head with its loss on the last.
static double s_cost(const node_config_t *cfg, int blocks, int first, int last)
{
    double C = cfg->C, T = cfg->T, V = cfg->V;
    return blocks * (24.0 * C * C + 4.0 * T * C) + (first ? 2.0 * C : 0.0)
         + (last ? 2.0 * C * V + 5.0 * V : 0.0);
}

double node_plan_stage_cost(const node_config_t *cfg, const node_plan_t *plan, int s)
{
    return s_cost(cfg, plan->first[s + 1] - plan->first[s], s == 0, s == plan->stages - 1);
}

void node_plan_stage_range(const node_config_t *cfg, const node_plan_t *plan, int s,
                           size_t *offset, size_t *count)
{
    size_t embed = (size_t) (cfg->V + cfg->T) * cfg->C, layer = s_layer_params(cfg);
    size_t begin = s == 0 ? 0 : embed + (size_t) plan->first[s] * layer;
    size_t end = s == plan->stages - 1 ? node_config_params(cfg)
               : embed + (size_t) plan->first[s + 1] * layer;
    *offset = begin;
    *count = end - begin;
}

int node_plan_parse(const node_config_t *cfg, const char *text, node_plan_t *plan, char *err,
                    size_t errlen)
{
    node_plan_t p = { 0 };
    int k = 0;
    for (const char *at = text;; at++) {
        char *end;
        errno = 0;
        long v = *at >= '0' && *at <= '9' ? strtol(at, &end, 10) : -1;
        if (v < 0 || errno || v > cfg->L || k > NODE_MAX_LAYERS
            || (k > 0 && v <= p.first[k - 1]) || (k == 0 && v != 0))
            break; // (k < 2 or the last not L below: the line says what a cut is)
        p.first[k++] = (int) v;
        at = end;
        if (*at == '\0') {
            p.stages = k - 1;
            if (k < 2 || p.first[k - 1] != cfg->L)
                break;
            *plan = p;
            return 0;
        }
        if (*at != ',') {
            snprintf(err, errlen, "cut=%.40s: expected numbers separated by commas", text);
            return -EINVAL;
        }
    }
    snprintf(err, errlen, "cut=%.40s: expected the first block of each of 1..%d stages from 0, "
             "each above the last, then %d", text, cfg->L, cfg->L);
    return -EINVAL;
}

int node_plan_text(const node_plan_t *plan, char *buf, size_t n)
{
    size_t at = 0;
    for (int s = 0; s <= plan->stages; s++)
        at += (size_t) snprintf(buf + (at < n ? at : n), at < n ? n - at : 0, "%s%d", s ? "," : "",
                                plan->first[s]);
    return (int) at;
}

int node_plan_make(const node_config_t *cfg, int S, node_plan_t *plan, char *err, size_t errlen)
{
    int L = cfg->L;
    if (S < 1 || S > L) {
        snprintf(err, errlen, "--stages %d: must be 1..%d (at most one stage per layer, --layers %d)",
                 S, L, L);
        return -EINVAL;
    }
    // best[s][l]: minimal bottleneck with blocks [0, l) in stages [0, s)
    // (static: plans are made once at start-up, never concurrently)
    static double best[NODE_MAX_LAYERS + 1][NODE_MAX_LAYERS + 1];
    static int cut[NODE_MAX_LAYERS + 1][NODE_MAX_LAYERS + 1];
    for (int s = 0; s <= S; s++)
        for (int l = 0; l <= L; l++)
            best[s][l] = 1e300;
    best[0][0] = 0.0;
    for (int s = 1; s <= S; s++) {
        for (int l = s; l <= L - (S - s); l++) {
            for (int a = s - 1; a < l; a++) {
                double cost = s_cost(cfg, l - a, s == 1, s == S);
                double worst = best[s - 1][a] > cost ? best[s - 1][a] : cost;
                // ties go to the earlier cut so that the plan is deterministic
                if (worst < best[s][l]) {
                    best[s][l] = worst;
                    cut[s][l] = a;
                }
            }
        }
    }
    memset(plan, 0, sizeof *plan);
    plan->stages = S;
    plan->first[S] = L;
    for (int s = S, l = L; s > 0; s--) {
        l = cut[s][l];
        plan->first[s - 1] = l;
    }
    return 0;
}
