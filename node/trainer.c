/* trainer.c - the whole model as its S stages in one process: a step is G
 * micro-batches through every stage (forward, then backward in reverse),
 * gradients accumulated, one global-norm clip and the same AdamW on every
 * stage. The reference computation every swarm run is held to.
 *
 * No flags, files or printing here (train.c does those).
 */
#include "node.h"
#include "swarm.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct node_trainer_s {
    node_hparams_t hp;                    // settings
    node_plan_t plan;                     // stages
    blas_backend_t *be;                   // compute (borrowed)
    const swarm_data_t *data;             // training bytes (borrowed)
    node_stage_t *stage[NODE_MAX_LAYERS]; // [S]
    node_acts_t *acts[NODE_MAX_LAYERS];   // [S] one micro-batch each
    int32_t *x, *y;                       // (micro, T) tokens and targets
    float *act[2];                        // (micro, T, C) ping-pong between stages
    long step;                            // optimizer updates done
};

node_trainer_t *node_trainer_new(const node_hparams_t *hp, blas_backend_t *be,
                                 const swarm_data_t *data, char *err, size_t n)
{
    node_trainer_t *self = calloc(1, sizeof *self);
    if (!self)
        abort();
    self->hp = *hp;
    self->be = be;
    self->data = data;
    if (node_config_check(&hp->cfg, err, n) != 0
        || node_plan_make(&hp->cfg, hp->stages, &self->plan, err, n) != 0)
        goto out_fail;
    if (hp->micro < 1 || hp->micro > hp->batch || hp->batch % hp->micro != 0) {
        snprintf(err, n, "--micro-batch %d must divide --batch %d", hp->micro, hp->batch);
        goto out_fail;
    }
    for (int s = 0; s < self->plan.stages; s++) {
        self->stage[s] = node_stage_new(&hp->cfg, &self->plan, s, be, err, n);
        self->acts[s] = self->stage[s] ? node_acts_new(self->stage[s], hp->micro, err, n) : NULL;
        if (!self->acts[s])
            goto out_fail;
    }
    size_t tokens = (size_t) hp->micro * hp->cfg.T;
    self->x = malloc(tokens * sizeof(int32_t));
    self->y = malloc(tokens * sizeof(int32_t));
    self->act[0] = malloc(tokens * hp->cfg.C * sizeof(float));
    self->act[1] = malloc(tokens * hp->cfg.C * sizeof(float));
    if (!self->x || !self->y || !self->act[0] || !self->act[1]) {
        snprintf(err, n, "out of memory for micro-batches of %d windows", hp->micro);
        goto out_fail;
    }
    return self;
out_fail:
    node_trainer_destroy(&self);
    return NULL;
}

void node_trainer_destroy(node_trainer_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    node_trainer_t *self = *self_p;
    for (int s = 0; s < self->plan.stages; s++) {
        node_acts_destroy(&self->acts[s]);
        node_stage_destroy(&self->stage[s]);
    }
    free(self->x);
    free(self->y);
    free(self->act[0]);
    free(self->act[1]);
    free(self);
    *self_p = NULL;
}

long node_trainer_step(const node_trainer_t *self) { return self->step; }

int node_trainer_load(node_trainer_t *self, const float *params, const float *m, const float *v,
                      long step)
{
    for (int s = 0; s < self->plan.stages; s++) {
        node_stage_t *st = self->stage[s];
        size_t off = node_stage_param_offset(st), cnt = node_stage_param_count(st) * sizeof(float);
        memcpy(node_stage_params(st), params + off, cnt);
        if (m)
            memcpy(node_stage_moment1(st), m + off, cnt);
        else
            memset(node_stage_moment1(st), 0, cnt);
        if (v)
            memcpy(node_stage_moment2(st), v + off, cnt);
        else
            memset(node_stage_moment2(st), 0, cnt);
        int rc = node_stage_params_changed(st);
        if (rc != 0)
            return rc;
    }
    self->step = step;
    return 0;
}

void node_trainer_gather(node_trainer_t *self, int which, float *dst)
{
    for (int s = 0; s < self->plan.stages; s++) {
        node_stage_t *st = self->stage[s];
        const float *src = which == 0 ? node_stage_params(st)
                         : which == 1 ? node_stage_moment1(st)
                         : which == 2 ? node_stage_moment2(st) : node_stage_grads(st);
        memcpy(dst + node_stage_param_offset(st), src, node_stage_param_count(st) * sizeof(float));
    }
}

// One micro-batch through every stage: forward, and backward when scale != 0.
static int s_micro(node_trainer_t *self, float scale, float *loss)
{
    int S = self->plan.stages, rc = 0;
    float *in = NULL;
    for (int s = 0; s < S && rc == 0; s++) {
        node_stage_in_t si = {
            .tokens = self->x, .x = in, .targets = self->y, .loss_scale = scale,
            .want_backward = scale != 0.0f,
        };
        float *out = self->act[s % 2];
        rc = node_stage_forward(self->stage[s], self->acts[s], &si, out, loss, out);
        in = out;
    }
    // `in` holds d(input of the last stage) after a backward
    for (int s = S - 2; s >= 0 && rc == 0 && scale != 0.0f; s--) {
        float *dx = self->act[s % 2];
        rc = node_stage_backward(self->stage[s], self->acts[s], in, dx);
        in = dx;
    }
    return rc;
}

int node_trainer_forward_backward(node_trainer_t *self, float *loss_out)
{
    const node_hparams_t *hp = &self->hp;
    int S = self->plan.stages, G = hp->batch / hp->micro, T = hp->cfg.T;
    float scale = 1.0f / (float) ((double) hp->batch * T);
    double loss_sum = 0.0;
    for (int s = 0; s < S; s++)
        node_stage_grads_zero(self->stage[s]);
    for (int i = 0; i < G; i++) {
        swarm_data_train_batch(self->data, hp->seed, self->step, hp->batch, i * hp->micro,
                               hp->micro, T, self->x, self->y);
        float loss = 0.0f;
        int rc = s_micro(self, scale, &loss);
        if (rc != 0)
            return rc;
        loss_sum += loss;
    }
    for (int s = 0; s < S; s++) {
        int rc = node_stage_grads_fetch(self->stage[s]);
        if (rc != 0)
            return rc;
    }
    *loss_out = (float) (loss_sum / G);
    return 0;
}

int node_trainer_update(node_trainer_t *self, double *lr)
{
    const node_hparams_t *hp = &self->hp;
    int S = self->plan.stages;
    double sumsq = 0.0;
    for (int s = 0; s < S; s++)
        sumsq += node_sumsq(node_stage_grads(self->stage[s]),
                            node_stage_param_count(self->stage[s]));
    node_adamw_t opt = {
        .lr = node_lr_at(self->step, hp->iters, hp->warmup, hp->lr, hp->min_lr),
        .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = (float) hp->weight_decay,
        .grad_scale = node_clip_scale(sqrt(sumsq), (float) hp->grad_clip), .t = self->step + 1,
    };
    for (int s = 0; s < S; s++) {
        node_stage_adamw(self->stage[s], &opt);
        int rc = node_stage_params_changed(self->stage[s]);
        if (rc != 0)
            return rc;
    }
    *lr = opt.lr;
    self->step++;
    return 0;
}

int node_trainer_eval(node_trainer_t *self, int val, double *out)
{
    const node_hparams_t *hp = &self->hp;
    uint64_t state = hp->seed + (val ? 2000 : 1000);
    int G = hp->batch / hp->micro;
    double total = 0.0;
    for (int it = 0; it < hp->eval_iters; it++) {
        double batch = 0.0;
        for (int i = 0; i < G; i++) {
            swarm_data_draw(self->data, val, &state, hp->micro, hp->cfg.T, self->x, self->y);
            float loss = 0.0f;
            int rc = s_micro(self, 0.0f, &loss);
            if (rc != 0)
                return rc;
            batch += loss;
        }
        // the reference sums each batch's float32 mean in double
        total += (float) (batch / G);
    }
    *out = total / hp->eval_iters;
    return 0;
}
