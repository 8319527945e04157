/* stage.c - one pipeline stage of the GPT: its parameters, gradients and
 * AdamW moments (each one contiguous buffer, layer-major), and its forward
 * and backward over one micro-batch at a time.
 *
 * The math is the backend's; this file only lays out memory and calls ops in
 * order. It does not decide what to run when (train.c and the node do).
 */
#include "node.h"

#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct node_stage_s {
    node_config_t cfg;       // model shape
    blas_backend_t *be;      // compute backend (borrowed)
    int index, count;        // stage s of S
    int layer_begin;         // first block held
    int layers;              // blocks held
    size_t offset;           // floats: where our slice starts in the model
    size_t n;                // floats: parameters held
    float *params_dev;       // (n) device parameters
    float *grads_dev;        // (n) device gradients, accumulated
    float *params;           // (n) host master parameters (may alias params_dev)
    float *grads;            // (n) host gradients (may alias grads_dev)
    float *m, *v;            // (n) AdamW moments, host
    int alias;               // 1 when host and device memory are the same
};

typedef struct {
    float *ln1, *ln1_mean, *ln1_rstd;  // (N,C) (N) (N)
    float *qkv;                        // (N,3C)
    float *atty;                       // (N,C)
    float *att;                        // (B,H,T,T) softmax
    float *res2;                       // (N,C) residual after attention
    float *ln2, *ln2_mean, *ln2_rstd;  // (N,C) (N) (N)
    float *fch, *fchg;                 // (N,4C) before and after GELU
    float *res3;                       // (N,C) block output
} layer_acts_t;

struct node_acts_s {
    node_stage_t *stage;     // owner (borrowed)
    int B;                   // windows in the micro-batch
    size_t bytes;            // device memory held
    void *mem;               // the one device block
    int32_t *tokens;         // (N) first stage input, device
    int32_t *targets;        // (N) last stage targets, device
    float *input;            // (N,C) stage input (embedded tokens on stage 0)
    layer_acts_t *layer;     // [layers]
    float *lnf, *lnf_mean, *lnf_rstd;  // (N,C) (N) (N) last stage
    float *logits;           // (N,V) last stage; holds dlogits after backward
    float *losses;           // (N) last stage
    float *dres;             // (N,C) gradient of the residual stream
    float *dbuf1;            // (N,4C) scratch
    float *dbuf2;            // (N,C) scratch
    float *datt;             // (B,H,T,T) scratch
    float *host_losses;      // (N) host copy of losses
};

// ---- layout ----------------------------------------------------------------

// Pointer to tensor i (file order) inside a stage buffer that starts at
// the stage's offset.
static float *s_tensor(const node_stage_t *self, float *base, int i)
{
    return base + (node_tensor_at(&self->cfg, i).offset - self->offset);
}

static int s_layer_tensor(int local_layer_global, int k)
{
    return 2 + NODE_LAYER_TENSORS * local_layer_global + k;
}

node_stage_t *node_stage_new(const node_config_t *cfg, const node_plan_t *plan, int s,
                             blas_backend_t *be, char *err, size_t errlen)
{
    node_stage_t *self = calloc(1, sizeof *self);
    if (!self)
        abort();
    self->cfg = *cfg;
    self->be = be;
    self->index = s;
    self->count = plan->stages;
    self->layer_begin = plan->first[s];
    self->layers = plan->first[s + 1] - plan->first[s];
    node_plan_stage_range(cfg, plan, s, &self->offset, &self->n);
    size_t bytes = self->n * sizeof(float);
    if (be->buf_alloc(be, bytes, (void **) &self->params_dev) != 0
        || be->buf_alloc(be, bytes, (void **) &self->grads_dev) != 0) {
        snprintf(err, errlen, "stage %d: cannot allocate %zu MiB of %s memory for parameters",
                 s, 2 * bytes >> 20, be->name);
        goto out_fail;
    }
    be->zero(be, self->params_dev, bytes);
    be->zero(be, self->grads_dev, bytes);
    self->alias = be->host_ptr && be->host_ptr(be, self->params_dev) == self->params_dev;
    if (self->alias) {
        self->params = self->params_dev;
        self->grads = self->grads_dev;
    } else {
        self->params = calloc(self->n, sizeof(float));
        self->grads = calloc(self->n, sizeof(float));
    }
    self->m = calloc(self->n, sizeof(float));
    self->v = calloc(self->n, sizeof(float));
    if (!self->params || !self->grads || !self->m || !self->v) {
        snprintf(err, errlen, "stage %d: cannot allocate %zu MiB of host memory for the optimizer",
                 s, 4 * bytes >> 20);
        goto out_fail;
    }
    return self;
out_fail:
    node_stage_destroy(&self);
    return NULL;
}

void node_stage_destroy(node_stage_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    node_stage_t *self = *self_p;
    if (!self->alias) {
        free(self->params);
        free(self->grads);
    }
    free(self->m);
    free(self->v);
    if (self->params_dev)
        self->be->buf_free(self->be, self->params_dev);
    if (self->grads_dev)
        self->be->buf_free(self->be, self->grads_dev);
    free(self);
    *self_p = NULL;
}

int node_stage_index(const node_stage_t *self) { return self->index; }
void node_stage_config(const node_stage_t *self, node_config_t *cfg) { *cfg = self->cfg; }
int node_stage_is_first(const node_stage_t *self) { return self->index == 0; }
int node_stage_is_last(const node_stage_t *self) { return self->index == self->count - 1; }
size_t node_stage_param_offset(const node_stage_t *self) { return self->offset; }
size_t node_stage_param_count(const node_stage_t *self) { return self->n; }
float *node_stage_params(node_stage_t *self) { return self->params; }
float *node_stage_grads(node_stage_t *self) { return self->grads; }
float *node_stage_moment1(node_stage_t *self) { return self->m; }
float *node_stage_moment2(node_stage_t *self) { return self->v; }

int node_stage_params_changed(node_stage_t *self)
{
    return self->be->upload(self->be, self->params_dev, self->params, self->n * sizeof(float));
}

int node_stage_grads_fetch(node_stage_t *self)
{
    return self->be->download(self->be, self->grads, self->grads_dev, self->n * sizeof(float));
}

void node_stage_grads_zero(node_stage_t *self)
{
    self->be->zero(self->be, self->grads_dev, self->n * sizeof(float));
}

// ---- activations -----------------------------------------------------------

// Carve `count` floats from *cursor, keeping 64-byte alignment.
static float *s_carve(char **cursor, size_t count)
{
    float *p = (float *) *cursor;
    *cursor += (count * sizeof(float) + 63) & ~(size_t) 63;
    return p;
}

// Lay out the activations at `base` (NULL: only count). Returns the bytes used.
static size_t s_acts_layout(node_acts_t *a, const node_stage_t *st, char *base)
{
    const node_config_t *c = &st->cfg;
    size_t N = (size_t) a->B * c->T, C = c->C, att = (size_t) a->B * c->H * c->T * c->T;
    char *cur = base;
    a->tokens = (int32_t *) s_carve(&cur, N);
    a->targets = (int32_t *) s_carve(&cur, N);
    a->input = s_carve(&cur, N * C);
    for (int l = 0; l < st->layers; l++) {
        layer_acts_t *la = &a->layer[l];
        la->ln1 = s_carve(&cur, N * C);
        la->ln1_mean = s_carve(&cur, N);
        la->ln1_rstd = s_carve(&cur, N);
        la->qkv = s_carve(&cur, 3 * N * C);
        la->atty = s_carve(&cur, N * C);
        la->att = s_carve(&cur, att);
        la->res2 = s_carve(&cur, N * C);
        la->ln2 = s_carve(&cur, N * C);
        la->ln2_mean = s_carve(&cur, N);
        la->ln2_rstd = s_carve(&cur, N);
        la->fch = s_carve(&cur, 4 * N * C);
        la->fchg = s_carve(&cur, 4 * N * C);
        la->res3 = s_carve(&cur, N * C);
    }
    if (st->index == st->count - 1) {
        a->lnf = s_carve(&cur, N * C);
        a->lnf_mean = s_carve(&cur, N);
        a->lnf_rstd = s_carve(&cur, N);
        a->logits = s_carve(&cur, N * c->V);
        a->losses = s_carve(&cur, N);
    }
    a->dres = s_carve(&cur, N * C);
    a->dbuf1 = s_carve(&cur, 4 * N * C);
    a->dbuf2 = s_carve(&cur, N * C);
    a->datt = s_carve(&cur, att);
    return (size_t) (cur - base);
}

size_t node_plan_acts_bytes(const node_config_t *cfg, const node_plan_t *plan, int s, int B)
{
    node_stage_t st = {.cfg = *cfg, .index = s, .count = plan->stages,
                       .layers = plan->first[s + 1] - plan->first[s]};
    layer_acts_t layer[NODE_MAX_LAYERS];
    node_acts_t a = {.stage = &st, .B = B, .layer = layer};
    return s_acts_layout(&a, &st, NULL);
}

node_memory_t node_plan_stage_memory(const node_config_t *cfg, const node_plan_t *plan, int s,
                                     int micro)
{
    size_t off, n;
    node_plan_stage_range(cfg, plan, s, &off, &n);
    size_t tokens = (size_t) micro * cfg->T;
    return (node_memory_t) {
        .state = 4 * n * sizeof(float), // parameters, gradients, both moments
        .acts = node_plan_acts_bytes(cfg, plan, s, micro) + tokens * sizeof(float),
        .buffers = 2 * tokens * sizeof(int32_t) + 3 * tokens * cfg->C * sizeof(float),
    };
}

node_acts_t *node_acts_new(node_stage_t *stage, int B, char *err, size_t errlen)
{
    node_acts_t *self = calloc(1, sizeof *self);
    if (!self)
        abort();
    self->stage = stage;
    self->B = B;
    self->layer = calloc(stage->layers ? stage->layers : 1, sizeof(layer_acts_t));
    self->host_losses = malloc((size_t) B * stage->cfg.T * sizeof(float));
    if (!self->layer || !self->host_losses)
        abort();
    self->bytes = s_acts_layout(self, stage, NULL);
    blas_backend_t *be = stage->be;
    if (be->buf_alloc(be, self->bytes, &self->mem) != 0) {
        snprintf(err, errlen, "stage %d: cannot allocate %zu MiB of %s memory for activations "
                 "of %d windows; try a smaller --micro-batch", stage->index, self->bytes >> 20,
                 be->name, B);
        self->mem = NULL;
        node_acts_destroy(&self);
        return NULL;
    }
    s_acts_layout(self, stage, self->mem);
    return self;
}

void node_acts_destroy(node_acts_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    node_acts_t *self = *self_p;
    if (self->mem)
        self->stage->be->buf_free(self->stage->be, self->mem);
    free(self->layer);
    free(self->host_losses);
    free(self);
    *self_p = NULL;
}

int node_acts_batch(const node_acts_t *self) { return self->B; }
size_t node_acts_bytes(const node_acts_t *self) { return self->bytes; }

// ---- forward ---------------------------------------------------------------

static void s_block_forward(node_stage_t *st, node_acts_t *a, int l, const float *x)
{
    blas_backend_t *be = st->be;
    const node_config_t *c = &st->cfg;
    int B = a->B, T = c->T, C = c->C, N = B * T, g = st->layer_begin + l;
    layer_acts_t *la = &a->layer[l];
    float *p = st->params_dev;
#define W(k) s_tensor(st, p, s_layer_tensor(g, (k)))
    be->layernorm_forward(la->ln1, la->ln1_mean, la->ln1_rstd, x, W(0), W(1), N, C);
    be->matmul_forward(la->qkv, la->ln1, W(2), W(3), N, C, 3 * C);
    be->attention_forward(la->atty, la->att, la->qkv, B, T, C, c->H);
    be->matmul_forward(la->res2, la->atty, W(4), W(5), N, C, C);
    be->add(la->res2, la->res2, x, (size_t) N * C);
    be->layernorm_forward(la->ln2, la->ln2_mean, la->ln2_rstd, la->res2, W(6), W(7), N, C);
    be->matmul_forward(la->fch, la->ln2, W(8), W(9), N, C, 4 * C);
    be->gelu_forward(la->fchg, la->fch, (size_t) N * 4 * C);
    be->matmul_forward(la->res3, la->fchg, W(10), W(11), N, 4 * C, C);
    be->add(la->res3, la->res3, la->res2, (size_t) N * C);
#undef W
}

static const float *s_layer_input(node_acts_t *a, int l)
{
    return l == 0 ? a->input : a->layer[l - 1].res3;
}

static int s_check_tokens(const node_stage_t *st, const int32_t *tok, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        if (tok[i] < 0 || tok[i] >= st->cfg.V) {
            fprintf(stderr, "stage %d: %s[%zu] = %d is outside the vocabulary 0..%d\n",
                    st->index, what, i, tok[i], st->cfg.V - 1);
            return -EINVAL;
        }
    }
    return 0;
}

static void s_layers_backward(node_stage_t *st, node_acts_t *a);
static int s_backward_out(node_stage_t *st, node_acts_t *a, float *dx);

static int s_head_forward(node_stage_t *st, node_acts_t *a, const node_stage_in_t *in,
                          const float *x, float *loss, float *dx)
{
    blas_backend_t *be = st->be;
    const node_config_t *c = &st->cfg;
    int N = a->B * c->T, C = c->C, V = c->V, nt = node_tensor_count(c);
    float *p = st->params_dev, *g = st->grads_dev;
    size_t bytes = (size_t) N * sizeof(int32_t);
    int rc = s_check_tokens(st, in->targets, (size_t) N, "target");
    if (rc == 0)
        rc = be->upload(be, a->targets, in->targets, bytes);
    if (rc != 0)
        return rc;
    float *lnfw = s_tensor(st, p, nt - 3), *lnfb = s_tensor(st, p, nt - 2);
    float *head = s_tensor(st, p, nt - 1);
    be->layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, x, lnfw, lnfb, N, C);
    be->matmul_forward(a->logits, a->lnf, head, NULL, N, C, V);
    be->crossentropy(a->logits, a->losses, a->targets, N, V,
                     in->want_backward ? in->loss_scale : 0.0f);
    rc = be->download(be, a->host_losses, a->losses, (size_t) N * sizeof(float));
    if (rc != 0)
        return rc;
    double sum = 0.0;
    for (int i = 0; i < N; i++)
        sum += a->host_losses[i];
    *loss = (float) (sum / N);
    if (!in->want_backward)
        return 0;
    // head and final LayerNorm backward, then the blocks
    be->matmul_backward(a->dbuf2, s_tensor(st, g, nt - 1), NULL, a->logits, a->lnf, head, N, C, V);
    be->zero(be, a->dres, (size_t) N * C * sizeof(float));
    be->layernorm_backward(a->dres, s_tensor(st, g, nt - 3), s_tensor(st, g, nt - 2), a->dbuf2,
                           x, lnfw, a->lnf_mean, a->lnf_rstd, N, C);
    s_layers_backward(st, a);
    return s_backward_out(st, a, dx);
}

int node_stage_forward(node_stage_t *self, node_acts_t *a, const node_stage_in_t *in,
                       float *y, float *loss, float *dx)
{
    blas_backend_t *be = self->be;
    const node_config_t *c = &self->cfg;
    size_t N = (size_t) a->B * c->T, C = c->C;
    int rc;
    if (self->index == 0) {
        rc = s_check_tokens(self, in->tokens, N, "token");
        if (rc == 0)
            rc = be->upload(be, a->tokens, in->tokens, N * sizeof(int32_t));
        if (rc != 0)
            return rc;
        be->encoder_forward(a->input, a->tokens, s_tensor(self, self->params_dev, NODE_T_WTE),
                            s_tensor(self, self->params_dev, NODE_T_WPE), a->B, c->T, c->C);
    } else {
        rc = be->upload(be, a->input, in->x, N * C * sizeof(float));
        if (rc != 0)
            return rc;
    }
    for (int l = 0; l < self->layers; l++)
        s_block_forward(self, a, l, s_layer_input(a, l));
    const float *out = s_layer_input(a, self->layers);
    if (self->index == self->count - 1)
        return s_head_forward(self, a, in, out, loss, dx);
    return be->download(be, y, out, N * C * sizeof(float));
}

int node_stage_logits_at(node_stage_t *self, node_acts_t *a, int t, float *out)
{
    if (self->index != self->count - 1 || t < 0 || t >= self->cfg.T)
        return -EINVAL;
    return self->be->download(self->be, out, a->logits + (size_t) t * self->cfg.V,
                              (size_t) self->cfg.V * sizeof(float));
}

// ---- backward --------------------------------------------------------------

static void s_block_backward(node_stage_t *st, node_acts_t *a, int l)
{
    blas_backend_t *be = st->be;
    const node_config_t *c = &st->cfg;
    int B = a->B, T = c->T, C = c->C, N = B * T, g = st->layer_begin + l;
    layer_acts_t *la = &a->layer[l];
    const float *x = s_layer_input(a, l);
    float *p = st->params_dev, *gr = st->grads_dev;
#define W(k) s_tensor(st, p, s_layer_tensor(g, (k)))
#define G(k) s_tensor(st, gr, s_layer_tensor(g, (k)))
    // MLP: dres holds d(block output), which is also d(res2) through the residual
    be->matmul_backward(a->dbuf1, G(10), G(11), a->dres, la->fchg, W(10), N, 4 * C, C);
    be->gelu_backward(a->dbuf1, la->fch, a->dbuf1, (size_t) N * 4 * C);
    be->matmul_backward(a->dbuf2, G(8), G(9), a->dbuf1, la->ln2, W(8), N, C, 4 * C);
    be->layernorm_backward(a->dres, G(6), G(7), a->dbuf2, la->res2, W(6),
                           la->ln2_mean, la->ln2_rstd, N, C);
    // attention: dres now holds d(res2), also d(x) through the residual
    be->matmul_backward(a->dbuf2, G(4), G(5), a->dres, la->atty, W(4), N, C, C);
    be->attention_backward(a->dbuf1, a->datt, a->dbuf2, la->qkv, la->att, B, T, C, c->H);
    be->matmul_backward(a->dbuf2, G(2), G(3), a->dbuf1, la->ln1, W(2), N, C, 3 * C);
    be->layernorm_backward(a->dres, G(0), G(1), a->dbuf2, x, W(0),
                           la->ln1_mean, la->ln1_rstd, N, C);
#undef W
#undef G
}

static void s_layers_backward(node_stage_t *st, node_acts_t *a)
{
    for (int l = st->layers - 1; l >= 0; l--)
        s_block_backward(st, a, l);
}

// dres holds d(stage input): embed it back on stage 0, else hand it out.
static int s_backward_out(node_stage_t *st, node_acts_t *a, float *dx)
{
    blas_backend_t *be = st->be;
    const node_config_t *c = &st->cfg;
    if (st->index == 0) {
        be->encoder_backward(s_tensor(st, st->grads_dev, NODE_T_WTE),
                             s_tensor(st, st->grads_dev, NODE_T_WPE), a->dres, a->tokens,
                             a->B, c->T, c->C);
        return 0;
    }
    return be->download(be, dx, a->dres, (size_t) a->B * c->T * c->C * sizeof(float));
}

int node_stage_backward(node_stage_t *self, node_acts_t *a, const float *dy, float *dx)
{
    if (self->index == self->count - 1)
        return -EINVAL; // the last stage runs backward inside its forward
    blas_backend_t *be = self->be;
    int rc = be->upload(be, a->dres, dy, (size_t) a->B * self->cfg.T * self->cfg.C * sizeof(float));
    if (rc != 0)
        return rc;
    s_layers_backward(self, a);
    return s_backward_out(self, a, dx);
}

void node_params_checksum(const float *params, size_t n, char hex[65])
{
    unsigned char digest[32];
    crypto_generichash(digest, sizeof digest, (const unsigned char *) params, n * sizeof(float),
                       NULL, 0);
    sodium_bin2hex(hex, 65, digest, sizeof digest);
}

void node_stage_checksum(node_stage_t *self, char hex[65])
{
    node_params_checksum(self->params, self->n, hex);
}
