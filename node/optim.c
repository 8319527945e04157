/* optim.c - AdamW with decoupled weight decay, the learning-rate schedule and
 * global-norm clipping, exactly as the PyTorch reference applies them.
 *
 * Compiled with -ffp-contract=off and without fast-math (see the Makefile):
 * every replica of a stage, on any x86-64 build, computes the same bits from
 * the same averaged gradient. Gradients are not computed here.
 */
#include "node.h"

#include <math.h>

double node_lr_at(long it, long iters, long warmup, double lr_max, double lr_min)
{
    if (it < warmup)
        return lr_max * (double) (it + 1) / (double) warmup;
    long span = iters - warmup > 1 ? iters - warmup : 1;
    double r = (double) (it - warmup) / (double) span;
    if (r > 1.0)
        r = 1.0;
    return lr_min + 0.5 * (1.0 + cos(M_PI * r)) * (lr_max - lr_min);
}

float node_clip_scale(double norm, float max_norm)
{
    if (max_norm <= 0.0f)
        return 1.0f;
    float coef = max_norm / ((float) norm + 1e-6f);
    return coef < 1.0f ? coef : 1.0f;
}

double node_sumsq(const float *x, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double) x[i] * x[i];
    return s;
}

// One tensor: torch.optim.AdamW's single-tensor update, in float, with the
// scalars formed in double as Python forms them.
static void s_adamw_tensor(float *p, const float *g_raw, float *m, float *v, size_t n,
                           const node_adamw_t *o, float decay)
{
    float keep = (float) (1.0 - o->lr * (double) decay);
    float b1 = o->beta1, b2 = o->beta2;
    float one_b1 = (float) (1.0 - (double) o->beta1);
    float one_b2 = (float) (1.0 - (double) o->beta2);
    double bc1 = 1.0 - pow((double) o->beta1, (double) o->t);
    double bc2 = 1.0 - pow((double) o->beta2, (double) o->t);
    float step_size = (float) (o->lr / bc1);
    float bc2_sqrt = (float) sqrt(bc2);
    float eps = o->eps, gs = o->grad_scale;
    // elementwise, so the threads' split cannot change a bit
    #pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        float g = g_raw[i] * gs;
        p[i] = p[i] * keep;
        m[i] = m[i] * b1 + g * one_b1;
        v[i] = v[i] * b2 + one_b2 * g * g;
        float denom = sqrtf(v[i]) / bc2_sqrt + eps;
        p[i] = p[i] + (-step_size) * (m[i] / denom);
    }
}

void node_stage_adamw(node_stage_t *self, const node_adamw_t *opt)
{
    node_config_t cfg;
    // the stage's tensors, in file order, decayed by dimension
    const node_config_t *c = &cfg;
    float *p = node_stage_params(self), *g = node_stage_grads(self);
    float *m = node_stage_moment1(self), *v = node_stage_moment2(self);
    size_t off = node_stage_param_offset(self), end = off + node_stage_param_count(self);
    node_stage_config(self, &cfg);
    for (int i = 0; i < node_tensor_count(c); i++) {
        node_tensor_t t = node_tensor_at(c, i);
        if (t.offset < off || t.offset >= end)
            continue;
        size_t k = t.offset - off;
        s_adamw_tensor(p + k, g + k, m + k, v + k, t.size, opt,
                       t.dims >= 2 ? opt->weight_decay : 0.0f);
    }
}
