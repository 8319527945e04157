/* check_node.c - the model, its stages, AdamW, weight files and checkpoints,
 * held to the PyTorch reference files in ../shared/data/ref (ref_gpt.py).
 *
 * Tests that need the reference files skip with a message when ../shared is
 * absent (set SWARM_SHARED to point elsewhere). The model runs on the CPU
 * backend, or on SWARM_TEST_DEVICE when set (cuda, cuda:N, or split: the CPU
 * ops behind separate device memory); `make test-gpu` runs them on a GPU.
 */
#include "fuzz.h"
#include "net.h"
#include "node.h"
#include "swarm.h"
#include "worker.h"

#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char s_shared[512];

static int s_have_shared(void)
{
    const char *env = getenv("SWARM_SHARED");
    snprintf(s_shared, sizeof s_shared, "%s", env ? env : "../shared");
    char path[600];
    snprintf(path, sizeof path, "%s/data/ref/tiny_init.bgpt", s_shared);
    if (access(path, R_OK) == 0)
        return 1;
    printf("SKIP: %s not found; reference tests need ../shared (or SWARM_SHARED)\n", path);
    return 0;
}

static const char *s_ref(const char *name)
{
    static char path[700];
    snprintf(path, sizeof path, "%s/data/ref/%s", s_shared, name);
    return path;
}

static float *s_read_bgpt(const char *name, node_bgpt_header_t *h)
{
    char err[512];
    float *data = NULL;
    int rc = node_bgpt_read(s_ref(name), h, &data, err, sizeof err);
    ck_assert_msg(rc == 0, "%s: %s", name, err);
    return data;
}

static swarm_data_t *s_shakespeare(void)
{
    char path[700], err[512];
    swarm_data_t *data = NULL;
    snprintf(path, sizeof path, "%s/data/tinyshakespeare.txt", s_shared);
    ck_assert_msg(swarm_data_load(path, &data, err, sizeof err) == 0, "%s", err);
    return data;
}

// ---- a backend with separate device memory ---------------------------------
// The CPU's ops on buffers the node code may only reach through upload and
// download (host_ptr gives NULL), as on a GPU: a missed transfer gives a
// different result. New device buffers hold NaN, as fresh GPU memory holds
// garbage, and an op handed a host pointer fails the test.

#define SPLIT_BUFS 1024
static struct {
    char *p;            // start of a live device buffer
    size_t bytes;       // its size
} s_split_bufs[SPLIT_BUFS];
static blas_backend_t s_split;
static blas_backend_t *s_split_cpu; // the ops behind it

static int s_split_is_device(const void *p)
{
    for (int i = 0; i < SPLIT_BUFS; i++)
        if (s_split_bufs[i].p && (const char *) p >= s_split_bufs[i].p
            && (const char *) p < s_split_bufs[i].p + s_split_bufs[i].bytes)
            return 1;
    return 0;
}

#define SPLIT_DEVICE(p) ck_assert_msg(s_split_is_device(p), "%s: %s is not device memory", __func__, #p)

static int s_split_alloc(blas_backend_t *self, size_t bytes, void **out)
{
    int rc = s_split_cpu->buf_alloc(self, bytes, out);
    if (rc != 0)
        return rc;
    memset(*out, 0xff, bytes); // NaN in every float
    for (int i = 0; i < SPLIT_BUFS; i++)
        if (!s_split_bufs[i].p) {
            s_split_bufs[i].p = *out;
            s_split_bufs[i].bytes = bytes ? bytes : 1;
            return 0;
        }
    ck_abort_msg("split backend: more than %d buffers", SPLIT_BUFS);
    return -ENOMEM;
}

static void s_split_free(blas_backend_t *self, void *buf)
{
    for (int i = 0; i < SPLIT_BUFS; i++)
        if (s_split_bufs[i].p == buf)
            s_split_bufs[i].p = NULL;
    free(buf);
    (void) self;
}

static int s_split_upload(blas_backend_t *self, void *dst, const void *src, size_t bytes)
{
    (void) self;
    SPLIT_DEVICE(dst);
    ck_assert_msg(!s_split_is_device(src), "upload from device memory");
    memcpy(dst, src, bytes);
    return 0;
}

static int s_split_download(blas_backend_t *self, void *dst, const void *src, size_t bytes)
{
    (void) self;
    SPLIT_DEVICE(src);
    ck_assert_msg(!s_split_is_device(dst), "download into device memory");
    memcpy(dst, src, bytes);
    return 0;
}

static void s_split_zero(blas_backend_t *self, void *buf, size_t bytes)
{
    (void) self;
    SPLIT_DEVICE(buf);
    memset(buf, 0, bytes);
}

static void *s_split_host_ptr(blas_backend_t *self, void *buf)
{
    (void) self, (void) buf;
    return NULL;
}

static void s_split_encoder_forward(float *out, const int32_t *tokens, const float *wte,
                                    const float *wpe, int B, int T, int C)
{
    SPLIT_DEVICE(out), SPLIT_DEVICE(tokens), SPLIT_DEVICE(wte), SPLIT_DEVICE(wpe);
    s_split_cpu->encoder_forward(out, tokens, wte, wpe, B, T, C);
}

static void s_split_matmul_forward(float *out, const float *inp, const float *weight,
                                   const float *bias, int N, int C, int OC)
{
    SPLIT_DEVICE(out), SPLIT_DEVICE(inp), SPLIT_DEVICE(weight);
    ck_assert_msg(!bias || s_split_is_device(bias), "matmul bias is not device memory");
    s_split_cpu->matmul_forward(out, inp, weight, bias, N, C, OC);
}

static void s_split_crossentropy(float *logits, float *losses, const int32_t *targets,
                                 int N, int V, float scale)
{
    SPLIT_DEVICE(logits), SPLIT_DEVICE(losses), SPLIT_DEVICE(targets);
    s_split_cpu->crossentropy(logits, losses, targets, N, V, scale);
}

static double s_split_sumsq(const float *x, size_t n)
{
    SPLIT_DEVICE(x);
    return s_split_cpu->sumsq(x, n);
}

static blas_backend_t *s_split_backend(int threads)
{
    s_split_cpu = blas_cpu_backend(threads);
    s_split = *s_split_cpu;
    s_split.name = "split";
    snprintf(s_split.device, sizeof s_split.device, "split: cpu ops, separate device memory");
    s_split.buf_alloc = s_split_alloc;
    s_split.buf_free = s_split_free;
    s_split.upload = s_split_upload;
    s_split.download = s_split_download;
    s_split.zero = s_split_zero;
    s_split.host_ptr = s_split_host_ptr;
    s_split.encoder_forward = s_split_encoder_forward;
    s_split.matmul_forward = s_split_matmul_forward;
    s_split.crossentropy = s_split_crossentropy;
    s_split.sumsq = s_split_sumsq;
    return &s_split;
}

// The backend the model tests run on: SWARM_TEST_DEVICE, else the CPU.
static blas_backend_t *s_backend(int threads)
{
    const char *dev = getenv("SWARM_TEST_DEVICE");
    if (!dev || !*dev || !strcmp(dev, "cpu"))
        return blas_cpu_backend(threads);
    if (!strcmp(dev, "split"))
        return s_split_backend(threads);
    char err[512] = "";
    blas_backend_t *be = blas_backend_open(dev, threads, err, sizeof err);
    ck_assert_msg(be != NULL, "SWARM_TEST_DEVICE=%s: %s", dev, err);
    return be;
}

static node_hparams_t s_tiny_hparams(int stages, int micro)
{
    return (node_hparams_t) {
        .cfg = { NODE_VOCAB, 16, 32, 2, 4 }, .batch = 4, .micro = micro, .stages = stages,
        .iters = 10, .warmup = 2, .lr = 1e-2, .min_lr = 1e-3, .weight_decay = 0.1,
        .grad_clip = 1.0, .seed = 1337, .eval_iters = 2,
    };
}

// The key slice [C, 2C) of a qkv bias: its true gradient is zero (softmax
// ignores a constant added to every key of a query), so after AdamW, which
// normalises the gradient, both PyTorch's and our values there are rounding
// noise. They are held to being that small rather than to each other.
static int s_is_key_bias(const node_config_t *cfg, const node_tensor_t *t, size_t j)
{
    return strstr(t->name, "qkv.bias") && j >= (size_t) cfg->C && j < 2 * (size_t) cfg->C;
}

// max |a - b| / max |b| over each tensor of the file order; fails above tol.
// With noise_keys, key biases are held to |x| <= 1e-3 max |b| instead.
static void s_assert_tensors_close(const node_config_t *cfg, const float *got, const float *want,
                                   double tol, const char *what, int noise_keys)
{
    for (int i = 0; i < node_tensor_count(cfg); i++) {
        node_tensor_t t = node_tensor_at(cfg, i);
        double diff = 0, scale = 0, noise = 0;
        for (size_t j = 0; j < t.size; j++) {
            double w = fabs((double) want[t.offset + j]);
            scale = w > scale ? w : scale;
            if (noise_keys && s_is_key_bias(cfg, &t, j)) {
                double g = fabs((double) got[t.offset + j]);
                noise = g > noise ? g : noise;
                noise = w > noise ? w : noise;
                continue;
            }
            double d = fabs((double) got[t.offset + j] - want[t.offset + j]);
            diff = d > diff ? d : diff;
        }
        ck_assert_msg(noise <= 1e-3 * scale, "%s: tensor %s: key bias %.3g is more than noise",
                      what, t.name, noise);
        double rel = scale > 0 ? diff / scale : diff;
        ck_assert_msg(rel <= tol, "%s: tensor %s: max|diff|/max|ref| = %.3g > %.1g",
                      what, t.name, rel, tol);
    }
}

// (stages, micro-batch) for the loop tests: 1 and 2 stages x 1, 2, 4 micro-batches
static const int s_cuts[][2] = { {1, 4}, {1, 2}, {1, 1}, {2, 4}, {2, 2}, {2, 1} };

static node_trainer_t *s_tiny_trainer(int i, swarm_data_t *data, float *init)
{
    char err[512];
    node_hparams_t hp = s_tiny_hparams(s_cuts[i][0], s_cuts[i][1]);
    node_trainer_t *t = node_trainer_new(&hp, s_backend(1), data, err, sizeof err);
    ck_assert_msg(t != NULL, "%s", err);
    ck_assert_int_eq(node_trainer_load(t, init, NULL, NULL, 0), 0);
    return t;
}

// ---- numerics against PyTorch ----------------------------------------------

START_TEST(test_stage_loss_and_gradients_match_pytorch)
{
    if (!s_have_shared())
        return;
    node_bgpt_header_t hi, hg;
    float *init = s_read_bgpt("tiny_init.bgpt", &hi);
    float *ref = s_read_bgpt("tiny_grad0.bgpt", &hg);
    ck_assert_int_eq(hg.kind, 1);
    swarm_data_t *data = s_shakespeare();
    node_trainer_t *t = s_tiny_trainer(_i, data, init);
    float loss = 0;
    ck_assert_int_eq(node_trainer_forward_backward(t, &loss), 0);
    ck_assert_msg(fabs(loss - 5.539130) <= 1e-5, "loss %.7f, PyTorch 5.539130 (S=%d, micro %d)",
                  loss, s_cuts[_i][0], s_cuts[_i][1]);
    ck_assert_msg(fabs(loss - hg.loss) <= 1e-5, "loss %.7f, file header %.7f", loss, hg.loss);
    float *grads = calloc(node_config_params(&hi.cfg), sizeof(float));
    node_trainer_gather(t, 3, grads);
    char what[64];
    snprintf(what, sizeof what, "gradients, S=%d micro %d", s_cuts[_i][0], s_cuts[_i][1]);
    s_assert_tensors_close(&hi.cfg, grads, ref, 1e-4, what, 0);
    node_trainer_destroy(&t);
    swarm_data_destroy(&data);
    free(grads);
    free(init);
    free(ref);
}
END_TEST

START_TEST(test_ten_steps_match_pytorch_losses_and_weights)
{
    if (!s_have_shared())
        return;
    node_bgpt_header_t hi, h10;
    float *init = s_read_bgpt("tiny_init.bgpt", &hi);
    float *ref = s_read_bgpt("tiny_step10.bgpt", &h10);
    FILE *f = fopen(s_ref("tiny_losses.txt"), "r");
    ck_assert_ptr_nonnull(f);
    swarm_data_t *data = s_shakespeare();
    node_trainer_t *t = s_tiny_trainer(_i, data, init);
    for (int step = 0; step < 10; step++) {
        int ref_step;
        double ref_loss, ref_lr, lr;
        ck_assert_int_eq(fscanf(f, "%d %lf %lf", &ref_step, &ref_loss, &ref_lr), 3);
        float loss;
        ck_assert_int_eq(node_trainer_forward_backward(t, &loss), 0);
        ck_assert_int_eq(node_trainer_update(t, &lr), 0);
        ck_assert_int_eq(ref_step, step);
        ck_assert_msg(fabs(loss - ref_loss) <= 1e-4 * ref_loss, "step %d: loss %.6f, PyTorch %.6f",
                      step, loss, ref_loss);
        ck_assert_msg(fabs(lr - ref_lr) <= 1e-7 * ref_lr, "step %d: lr %.9g, PyTorch %.9g", step, lr, ref_lr);
    }
    float *params = calloc(node_config_params(&hi.cfg), sizeof(float));
    node_trainer_gather(t, 0, params);
    s_assert_tensors_close(&hi.cfg, params, ref, 1e-4, "weights after 10 steps", 1);
    fclose(f);
    node_trainer_destroy(&t);
    swarm_data_destroy(&data);
    free(params);
    free(init);
    free(ref);
}
END_TEST

// The baby model (L=4) cut into 3 and 4 stages with 3 micro-batches of 4
// follows PyTorch's first steps.
START_TEST(test_baby_model_in_three_and_four_stages_matches_pytorch)
{
    if (!s_have_shared())
        return;
    node_bgpt_header_t h;
    float *init = s_read_bgpt("baby_init.bgpt", &h);
    swarm_data_t *data = s_shakespeare();
    FILE *f = fopen(s_ref("baby_losses.txt"), "r");
    ck_assert_ptr_nonnull(f);
    double ref[3], lr_ref;
    int step;
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(fscanf(f, "%d %lf %lf", &step, &ref[i], &lr_ref), 3);
    fclose(f);
    for (int stages = 3; stages <= 4; stages++) {
        node_hparams_t hp = {
            .cfg = h.cfg, .batch = 12, .micro = 4, .stages = stages, .iters = 2000, .warmup = 100,
            .lr = 1e-3, .min_lr = 1e-4, .weight_decay = 0.1, .grad_clip = 1.0, .seed = 1337,
            .eval_iters = 1,
        };
        char err[256];
        node_trainer_t *t = node_trainer_new(&hp, s_backend(2), data, err, sizeof err);
        ck_assert_msg(t != NULL, "%s", err);
        ck_assert_int_eq(node_trainer_load(t, init, NULL, NULL, 0), 0);
        for (int i = 0; i < 3; i++) {
            float loss;
            double lr;
            ck_assert_int_eq(node_trainer_forward_backward(t, &loss), 0);
            ck_assert_int_eq(node_trainer_update(t, &lr), 0);
            ck_assert_msg(fabs(loss - ref[i]) <= 1e-4 * ref[i], "S=%d step %d: loss %.6f, PyTorch %.6f",
                          stages, i, loss, ref[i]);
        }
        node_trainer_destroy(&t);
    }
    swarm_data_destroy(&data);
    free(init);
}
END_TEST

// ---- separate device memory --------------------------------------------------

// 10 steps of the tiny model on the CPU backend and on the same ops behind
// separate device memory (host_ptr NULL, as on a GPU): every loss, gradient
// and parameter bit-identical, so the node code uploads parameters and
// downloads gradients wherever it must.
START_TEST(test_separate_device_memory_trains_bit_identically)
{
    size_t len;
    const uint8_t *bytes = node_corpus(&len);
    swarm_data_t *data = swarm_data_wrap(bytes, len, "(built-in corpus)");
    node_hparams_t hp = s_tiny_hparams(1 + _i, 2 - _i);
    size_t n = node_config_params(&hp.cfg);
    float *init = malloc(n * sizeof(float)), *a = malloc(n * sizeof(float));
    float *b = malloc(n * sizeof(float));
    ck_assert(init && a && b);
    for (size_t i = 0; i < n; i++)
        init[i] = 0.02f * sinf(0.7f * (float) i) + (i % 97 == 0 ? 1.0f : 0.0f);
    char err[512];
    node_trainer_t *cpu = node_trainer_new(&hp, blas_cpu_backend(1), data, err, sizeof err);
    ck_assert_msg(cpu != NULL, "%s", err);
    ck_assert_int_eq(node_trainer_load(cpu, init, NULL, NULL, 0), 0);
    float la[10], lb[10];
    double lr;
    for (int i = 0; i < 10; i++) {
        ck_assert_int_eq(node_trainer_forward_backward(cpu, &la[i]), 0);
        ck_assert_int_eq(node_trainer_update(cpu, &lr), 0);
    }
    node_trainer_gather(cpu, 0, a);
    node_trainer_destroy(&cpu);
    node_trainer_t *split = node_trainer_new(&hp, s_split_backend(1), data, err, sizeof err);
    ck_assert_msg(split != NULL, "%s", err);
    ck_assert_int_eq(node_trainer_load(split, init, NULL, NULL, 0), 0);
    for (int i = 0; i < 10; i++) {
        ck_assert_int_eq(node_trainer_forward_backward(split, &lb[i]), 0);
        ck_assert_int_eq(node_trainer_update(split, &lr), 0);
        ck_assert_msg(lb[i] == la[i], "step %d: loss %.9g with separate memory, %.9g on the cpu",
                      i, lb[i], la[i]);
    }
    node_trainer_gather(split, 0, b);
    ck_assert_msg(memcmp(a, b, n * sizeof(float)) == 0, "parameters differ after 10 steps");
    node_trainer_destroy(&split);
    swarm_data_destroy(&data);
    free(init), free(a), free(b);
}
END_TEST

// ---- plan ------------------------------------------------------------------

START_TEST(test_plan_cuts_contiguous_nonempty_stages)
{
    node_config_t cfg = { NODE_VOCAB, 64, 128, 12, 4 };
    char err[256];
    for (int S = 1; S <= 12; S++) {
        node_plan_t plan;
        ck_assert_int_eq(node_plan_make(&cfg, S, &plan, err, sizeof err), 0);
        ck_assert_int_eq(plan.first[0], 0);
        ck_assert_int_eq(plan.first[S], 12);
        int most = 0, least = 99;
        for (int s = 0; s < S; s++) {
            int n = plan.first[s + 1] - plan.first[s];
            ck_assert_int_ge(n, 1);
            most = n > most ? n : most;
            least = n < least ? n : least;
        }
        ck_assert_msg(most - least <= 1, "S=%d: stages of %d and %d blocks", S, least, most);
    }
}
END_TEST

START_TEST(test_plan_refuses_more_stages_than_layers)
{
    node_config_t cfg = { NODE_VOCAB, 16, 32, 2, 4 };
    node_plan_t plan;
    char err[256] = "";
    ck_assert_int_eq(node_plan_make(&cfg, 3, &plan, err, sizeof err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "--stages 3"));
    ck_assert_int_eq(node_plan_make(&cfg, 0, &plan, err, sizeof err), -EINVAL);
}
END_TEST

START_TEST(test_plan_reads_the_cut_a_router_says_and_nothing_else)
{
    // every plan node_plan_make makes reads back from its text as itself
    node_config_t cfg = { NODE_VOCAB, 64, 128, 12, 4 };
    char err[256] = "", text[NODE_PLAN_TEXT_MAX];
    for (int S = 1; S <= 12; S++) {
        node_plan_t plan, back;
        ck_assert_int_eq(node_plan_make(&cfg, S, &plan, err, sizeof err), 0);
        ck_assert_int_lt(node_plan_text(&plan, text, sizeof text), (int) sizeof text);
        ck_assert_int_eq(node_plan_parse(&cfg, text, &back, err, sizeof err), 0);
        ck_assert_int_eq(back.stages, S);
        ck_assert_mem_eq(back.first, plan.first, (size_t) (S + 1) * sizeof plan.first[0]);
    }
    // an uneven cut
    node_plan_t p;
    ck_assert_int_eq(node_plan_parse(&cfg, "0,9,11,12", &p, err, sizeof err), 0);
    ck_assert_int_eq(p.stages, 3);
    ck_assert_int_eq(p.first[1], 9);
    // what no cut of 12 blocks is: each refused with the value in the line
    const char *bad[] = { "", "0", "12", "1,12", "0,5,5,12", "0,7,3,12", "0,13", "0,6,11",
                          "0,6,12,", ",0,12", "0;12", "0,-1,12", "0,6x,12", "0, 6,12",
                          "0,99999999999999999999,12" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        ck_assert_msg(node_plan_parse(&cfg, bad[i], &p, err, sizeof err) == -EINVAL,
                      "cut=%s was taken", bad[i]);
        ck_assert_msg(strstr(err, "cut=") != NULL, "cut=%s: '%s'", bad[i], err);
    }
    // the longest text fits its bound
    node_config_t deep = { NODE_VOCAB, 16, 32, NODE_MAX_LAYERS, 4 };
    node_plan_t most;
    ck_assert_int_eq(node_plan_make(&deep, NODE_MAX_LAYERS, &most, err, sizeof err), 0);
    ck_assert_int_lt(node_plan_text(&most, text, sizeof text), (int) sizeof text);
    ck_assert_int_eq(node_plan_parse(&deep, text, &p, err, sizeof err), 0);
    ck_assert_int_eq(p.stages, NODE_MAX_LAYERS);
}
END_TEST

START_TEST(test_config_refuses_embd_not_divisible_by_heads)
{
    node_config_t cfg = { NODE_VOCAB, 16, 30, 2, 4 };
    char err[256] = "";
    ck_assert_int_eq(node_config_check(&cfg, err, sizeof err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "--embd 30"));
    cfg = (node_config_t) { NODE_VOCAB, 0, 32, 2, 4 };
    ck_assert_int_eq(node_config_check(&cfg, err, sizeof err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "--block"));
}
END_TEST

START_TEST(test_parameter_count_matches_reference_files)
{
    node_config_t tiny = { NODE_VOCAB, 16, 32, 2, 4 }, baby = { NODE_VOCAB, 64, 128, 4, 4 };
    ck_assert_uint_eq(node_config_params(&tiny), 42368);
    ck_assert_uint_eq(node_config_params(&baby), 867072);
    ck_assert_double_eq(node_config_flops_per_token(&baby), 5595648.0);
    node_tensor_t last = node_tensor_at(&baby, node_tensor_count(&baby) - 1);
    ck_assert_uint_eq(last.offset + last.size, 867072);
}
END_TEST

// ---- files -----------------------------------------------------------------

static char *s_tmpdir(void)
{
    static char dir[64];
    snprintf(dir, sizeof dir, "/tmp/check_node.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    return dir;
}

static void s_write_bytes(const char *path, const void *bytes, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(bytes, 1, n, f), n);
    fclose(f);
}

// Write a valid tiny BGPT file, damage it with `edit`, expect -EINVAL and
// `needle` in the message.
static void s_bgpt_damaged(int edit, const char *needle)
{
    node_config_t cfg = { NODE_VOCAB, 16, 32, 2, 4 };
    size_t n = node_config_params(&cfg), size = 64 + 4 * n;
    float *w = calloc(n, sizeof(float));
    char *dir = s_tmpdir(), path[128], err[512] = "";
    snprintf(path, sizeof path, "%s/w.bgpt", dir);
    node_bgpt_header_t h = { .cfg = cfg };
    ck_assert_int_eq(node_bgpt_write(path, &h, w, err, sizeof err), 0);
    unsigned char *raw = malloc(size);
    FILE *f = fopen(path, "rb");
    ck_assert_uint_eq(fread(raw, 1, size, f), size);
    fclose(f);
    int32_t v;
    switch (edit) {
    case 0: raw[0] = 'X'; break;                              // magic
    case 1: v = 2; memcpy(raw + 4, &v, 4); break;             // version
    case 2: size -= 100; break;                               // truncated
    case 3: v = 3; memcpy(raw + 20, &v, 4); break;            // L=3: shape vs size
    case 4: v = 5; memcpy(raw + 24, &v, 4); break;            // C % H != 0
    case 5: v = 7; memcpy(raw + 28, &v, 4); break;            // kind
    case 6: size = 10; break;                                 // shorter than header
    }
    s_write_bytes(path, raw, size);
    float *data = NULL;
    node_bgpt_header_t got;
    int rc = node_bgpt_read(path, &got, &data, err, sizeof err);
    ck_assert_msg(rc == -EINVAL, "edit %d: rc %d (%s)", edit, rc, err);
    ck_assert_msg(strstr(err, needle) && strstr(err, path), "edit %d: message '%s' lacks '%s'",
                  edit, err, needle);
    ck_assert_ptr_null(data);
    free(raw);
    free(w);
}

START_TEST(test_bgpt_refuses_damaged_files)
{
    static const char *needles[] = {
        "magic", "version 2", "truncated", "truncated", "not divisible", "kind 7", "shorter",
    };
    s_bgpt_damaged(_i, needles[_i]);
}
END_TEST

START_TEST(test_bgpt_missing_file_names_path)
{
    char err[512] = "";
    float *data = NULL;
    node_bgpt_header_t h;
    ck_assert_int_eq(node_bgpt_read("/nonexistent/w.bgpt", &h, &data, err, sizeof err), -ENOENT);
    ck_assert_ptr_nonnull(strstr(err, "/nonexistent/w.bgpt"));
}
END_TEST

START_TEST(test_bgpt_round_trip_is_exact)
{
    node_config_t cfg = { NODE_VOCAB, 8, 16, 1, 2 };
    size_t n = node_config_params(&cfg);
    float *w = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        w[i] = (float) i * 0.001f - 3.0f;
    char *dir = s_tmpdir(), path[128], err[256];
    snprintf(path, sizeof path, "%s/w.bgpt", dir);
    node_bgpt_header_t h = { .cfg = cfg, .kind = 1, .step = 7, .loss = 2.5f }, got;
    ck_assert_int_eq(node_bgpt_write(path, &h, w, err, sizeof err), 0);
    float *back = NULL;
    ck_assert_int_eq(node_bgpt_read(path, &got, &back, err, sizeof err), 0);
    ck_assert_int_eq(memcmp(w, back, n * sizeof(float)), 0);
    ck_assert_int_eq(got.step, 7);
    ck_assert_int_eq(got.kind, 1);
    ck_assert_float_eq(got.loss, 2.5f);
    free(w);
    free(back);
}
END_TEST

static void s_ckpt_write(const char *dir, node_ckpt_meta_t *meta, float **p)
{
    size_t n = node_config_params(&meta->cfg);
    *p = malloc(3 * n * sizeof(float));
    for (size_t i = 0; i < 3 * n; i++)
        (*p)[i] = (float) (i % 977) * 0.01f;
    char err[256];
    ck_assert_int_eq(node_ckpt_save(dir, meta, *p, *p + n, *p + 2 * n, err, sizeof err), 0);
}

START_TEST(test_checkpoint_round_trip_and_corruption_refused)
{
    node_ckpt_meta_t meta = {
        .cfg = { NODE_VOCAB, 8, 16, 2, 2 }, .step = 42, .seed = 9, .iters = 100, .warmup = 5,
        .batch = 3, .lr = 0.01f, .min_lr = 0.001f, .weight_decay = 0.1f, .grad_clip = 1.0f,
    }, got;
    char *dir = s_tmpdir(), path[128], err[512] = "";
    float *p, *pp = NULL, *m = NULL, *v = NULL;
    s_ckpt_write(dir, &meta, &p);
    size_t n = node_config_params(&meta.cfg);
    ck_assert_int_eq(node_ckpt_load(dir, &got, &pp, &m, &v, err, sizeof err), 0);
    ck_assert_int_eq(got.step, 42);
    ck_assert_int_eq(got.batch, 3);
    ck_assert(got.seed == 9);
    ck_assert_int_eq(memcmp(pp, p, n * sizeof(float)), 0);
    ck_assert_int_eq(memcmp(v, p + 2 * n, n * sizeof(float)), 0);
    free(pp);
    free(m);
    free(v);
    // one altered byte in the middle of the moments
    snprintf(path, sizeof path, "%s/checkpoint.bin", dir);
    FILE *f = fopen(path, "r+b");
    fseek(f, 128 + 4 * (long) n + 17, SEEK_SET);
    fputc(0x5a, f);
    fclose(f);
    pp = NULL;
    ck_assert_int_eq(node_ckpt_load(dir, &got, &pp, NULL, NULL, err, sizeof err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "checksum"));
    ck_assert_ptr_null(pp);
    // truncated
    free(p);
    s_ckpt_write(dir, &meta, &p);
    ck_assert_int_eq(truncate(path, 128 + 4 * (long) n), 0);
    ck_assert_int_eq(node_ckpt_load(dir, &got, &pp, NULL, NULL, err, sizeof err), -EINVAL);
    ck_assert_ptr_null(pp);
    free(p);
}
END_TEST

// ---- resume ----------------------------------------------------------------

START_TEST(test_resumed_run_continues_the_same_curve)
{
    if (!s_have_shared())
        return;
    node_bgpt_header_t h;
    float *init = s_read_bgpt("tiny_init.bgpt", &h);
    swarm_data_t *data = s_shakespeare();
    size_t n = node_config_params(&h.cfg);
    float straight[8], resumed[8], loss;
    double lr;
    node_trainer_t *t = s_tiny_trainer(0, data, init);
    for (int i = 0; i < 8; i++) {
        ck_assert_int_eq(node_trainer_forward_backward(t, &straight[i]), 0);
        ck_assert_int_eq(node_trainer_update(t, &lr), 0);
    }
    node_trainer_destroy(&t);
    // 4 steps, checkpoint, a new trainer from the checkpoint, 4 more
    t = s_tiny_trainer(0, data, init);
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(node_trainer_forward_backward(t, &loss), 0);
        ck_assert_int_eq(node_trainer_update(t, &lr), 0);
    }
    float *p = malloc(3 * n * sizeof(float));
    for (int k = 0; k < 3; k++)
        node_trainer_gather(t, k, p + k * n);
    node_ckpt_meta_t meta = { .cfg = h.cfg, .step = node_trainer_step(t), .batch = 4 }, got;
    char *dir = s_tmpdir(), err[256];
    ck_assert_int_eq(node_ckpt_save(dir, &meta, p, p + n, p + 2 * n, err, sizeof err), 0);
    node_trainer_destroy(&t);
    float *pp, *m, *v;
    ck_assert_int_eq(node_ckpt_load(dir, &got, &pp, &m, &v, err, sizeof err), 0);
    t = s_tiny_trainer(3, data, init);  // and in 2 stages this time
    ck_assert_int_eq(node_trainer_load(t, pp, m, v, got.step), 0);
    for (int i = 4; i < 8; i++) {
        ck_assert_int_eq(node_trainer_forward_backward(t, &resumed[i]), 0);
        ck_assert_int_eq(node_trainer_update(t, &lr), 0);
        ck_assert_msg(fabsf(resumed[i] - straight[i]) <= 1e-5f * straight[i],
                      "step %d: resumed %.7f, straight %.7f", i, resumed[i], straight[i]);
    }
    node_trainer_destroy(&t);
    swarm_data_destroy(&data);
    free(p);
    free(pp);
    free(m);
    free(v);
    free(init);
}
END_TEST

START_TEST(test_stage_refuses_tokens_outside_vocabulary)
{
    node_config_t cfg = { NODE_VOCAB, 4, 8, 1, 2 };
    node_plan_t plan;
    char err[256];
    ck_assert_int_eq(node_plan_make(&cfg, 1, &plan, err, sizeof err), 0);
    node_stage_t *st = node_stage_new(&cfg, &plan, 0, s_backend(1), err, sizeof err);
    node_acts_t *a = node_acts_new(st, 1, err, sizeof err);
    int32_t tok[4] = {1, 2, 300, 4}, tgt[4] = {1, 2, 3, 4};
    node_stage_in_t in = { .tokens = tok, .targets = tgt };
    float loss;
    ck_assert_int_eq(node_stage_forward(st, a, &in, NULL, &loss, NULL), -EINVAL);
    tok[2] = 3;
    tgt[1] = -1;
    ck_assert_int_eq(node_stage_forward(st, a, &in, NULL, &loss, NULL), -EINVAL);
    tgt[1] = 2;
    ck_assert_int_eq(node_stage_forward(st, a, &in, NULL, &loss, NULL), 0);
    ck_assert_msg(fabsf(loss - logf(256.0f)) < 1e-4f, "zero weights give uniform loss, got %f", loss);
    node_acts_destroy(&a);
    node_stage_destroy(&st);
}
END_TEST

// ---- the loss plot (node/plot.c) -------------------------------------------

#define PLOT_MAX 4096 // points or labels a test reads back, at most

static char *s_slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "%s not written", path);
    ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    rewind(f);
    char *s = malloc((size_t) n + 1);
    ck_assert_uint_eq(fread(s, 1, (size_t) n, f), (size_t) n);
    s[n] = '\0';
    fclose(f);
    return s;
}

// Well-formed as far as this test reads XML: one root, every element closed
// in order, every '&' an entity. NULL, or what is wrong.
static const char *s_xml_wrong(const char *s)
{
    static const char *entities[] = { "&amp;", "&lt;", "&gt;", "&quot;", "&apos;" };
    for (const char *a = strchr(s, '&'); a; a = strchr(a + 1, '&')) {
        int ok = 0;
        for (int i = 0; i < 5; i++)
            ok |= strncmp(a, entities[i], strlen(entities[i])) == 0;
        if (!ok)
            return "a bare '&'";
    }
    char open[64][32];
    int depth = 0, roots = 0;
    for (const char *p = strchr(s, '<'); p; p = strchr(p + 1, '<')) {
        const char *end = strchr(p, '>');
        if (!end)
            return "an unterminated tag";
        if (p[1] == '?' || p[1] == '!')
            continue;
        int closing = p[1] == '/';
        const char *name = p + 1 + closing;
        size_t len = strcspn(name, " \t\n/>");
        if (len == 0 || len >= sizeof open[0])
            return "a tag without a name";
        if (closing && (depth == 0 || strlen(open[depth - 1]) != len
                        || strncmp(open[depth - 1], name, len) != 0))
            return "a closing tag that does not match the open element";
        roots += depth == 0 && !closing;
        if (closing) {
            depth--;
        } else if (end[-1] != '/') {
            if (depth == 64)
                return "elements nested too deep";
            memcpy(open[depth], name, len);
            open[depth++][len] = '\0';
        }
    }
    return depth ? "an element left open" : roots != 1 ? "not one root element" : NULL;
}

// xmllint where the machine has it; the test's own reading always.
static void s_assert_xml(const char *path, const char *svg)
{
    const char *wrong = s_xml_wrong(svg);
    ck_assert_msg(wrong == NULL, "%s: %s", path, wrong);
    ck_assert_ptr_nonnull(strstr(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
    if (system("command -v xmllint >/dev/null 2>&1") == 0) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "xmllint --noout '%s'", path);
        ck_assert_msg(system(cmd) == 0, "xmllint refuses %s", path);
    }
}

static int s_count(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

// The numbers <text class="cls"> elements hold, in file order, and their
// attribute attr (" x=\"" or " y=\"") in at; the count.
static int s_texts(const char *svg, const char *cls, const char *attr, double *v, double *at)
{
    char needle[64];
    snprintf(needle, sizeof needle, "<text class=\"%s\"", cls);
    int n = 0;
    for (const char *p = strstr(svg, needle); p && n < PLOT_MAX; p = strstr(p + 1, needle)) {
        const char *gt = strchr(p, '>'), *a = strstr(p, attr);
        ck_assert_msg(a && a < gt, "a %s label without%s", cls, attr);
        at[n] = strtod(a + strlen(attr), NULL);
        v[n++] = strtod(gt + 1, NULL);
    }
    return n;
}

// The points of the first <polyline class="cls">; the count.
static int s_polyline(const char *svg, const char *cls, double *xs, double *ys)
{
    char needle[64];
    snprintf(needle, sizeof needle, "<polyline class=\"%s\"", cls);
    const char *p = strstr(svg, needle);
    ck_assert_msg(p != NULL, "no %s curve", cls);
    p = strstr(p, "points=\"") + 8;
    int n = 0;
    for (char *end; *p != '"'; p = end + strspn(end, " ")) {
        double x = strtod(p, &end);
        ck_assert_msg(end != p && *end == ',', "%s: a point that is not x,y: %.20s", cls, p);
        double y = strtod(end + 1, &end);
        ck_assert_int_lt(n, PLOT_MAX);
        xs[n] = x;
        ys[n++] = y;
    }
    return n;
}

// Tick values at least 3, evenly spaced upwards, covering [lo, hi] to
// within a tick and outside it by margin at most; pixels (at) the same way
// round as the values (up for x, down for y).
static void s_assert_ticks(const double *v, const double *at, int n, double lo, double hi,
                           double margin, int down, const char *axis)
{
    ck_assert_msg(n >= 3, "%s axis: %d tick labels", axis, n);
    double gap = v[1] - v[0];
    for (int i = 1; i < n; i++) {
        ck_assert_msg(fabs(v[i] - v[i - 1] - gap) < 1e-6 * fmax(1, fabs(gap)) && gap > 0,
                      "%s axis: ticks %g, %g, ... not evenly upwards at %d", axis, v[0], v[1], i);
        ck_assert_msg(down ? at[i] < at[i - 1] : at[i] > at[i - 1], "%s axis: tick %d misplaced",
                      axis, i);
    }
    ck_assert_msg(v[0] >= lo - margin && v[0] <= lo + gap && v[n - 1] <= hi + margin
                      && v[n - 1] >= hi - gap,
                  "%s axis: ticks %g..%g for data %g..%g", axis, v[0], v[n - 1], lo, hi);
}

// Pixel to value along an axis, from its first and last tick label.
static double s_unmap(const double *v, const double *at, int n, double px)
{
    return v[0] + (px - at[0]) * (v[n - 1] - v[0]) / (at[n - 1] - at[0]);
}

typedef struct {
    char *svg;                 // the file
    double frame[4];           // the plot area: x, y, width, height (px)
    double xt[PLOT_MAX], xpx[PLOT_MAX]; // x tick values and their x pixels
    double yt[PLOT_MAX], ypx[PLOT_MAX]; // y tick values and their y pixels
    int nx, ny;                // tick labels
} plot_read_t;

// Write plot, check it is XML with both axis titles, read its ticks.
static plot_read_t *s_plot_read(const node_plot_t *plot)
{
    char *dir = s_tmpdir(), path[128], err[256] = "";
    snprintf(path, sizeof path, "%s/loss.svg", dir);
    int rc = node_plot_write(path, plot, err, sizeof err);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, err);
    plot_read_t *r = calloc(1, sizeof *r);
    r->svg = s_slurp(path);
    s_assert_xml(path, r->svg);
    ck_assert_ptr_nonnull(strstr(r->svg, "<text class=\"xtitle\""));
    ck_assert_ptr_nonnull(strstr(r->svg, ">step</text>"));
    ck_assert_ptr_nonnull(strstr(r->svg, "<text class=\"ytitle\""));
    ck_assert_ptr_nonnull(strstr(r->svg, ">loss</text>"));
    const char *frame = strstr(r->svg, "<rect class=\"frame\"");
    ck_assert_ptr_nonnull(frame);
    ck_assert_int_eq(sscanf(frame, "<rect class=\"frame\" x=\"%lf\" y=\"%lf\" width=\"%lf\" "
                                   "height=\"%lf\"", &r->frame[0], &r->frame[1], &r->frame[2],
                            &r->frame[3]), 4);
    r->nx = s_texts(r->svg, "xtick", " x=\"", r->xt, r->xpx);
    r->ny = s_texts(r->svg, "ytick", " y=\"", r->yt, r->ypx);
    ck_assert_int_ge(r->ny, 3);
    return r;
}

static void s_plot_read_free(plot_read_t *r)
{
    free(r->svg);
    free(r);
}

// The curve of class cls has n points at (steps[i], values[i]), read back
// through the tick labels to within tol, all inside the frame.
static void s_assert_curve(const plot_read_t *r, const char *cls, const double *steps,
                           const double *values, int n, double tol)
{
    static double xs[PLOT_MAX], ys[PLOT_MAX];
    ck_assert_int_eq(s_polyline(r->svg, cls, xs, ys), n);
    for (int i = 0; i < n; i++) {
        double step = s_unmap(r->xt, r->xpx, r->nx, xs[i]);
        double v = s_unmap(r->yt, r->ypx, r->ny, ys[i]);
        const double *f = r->frame;
        ck_assert_msg(xs[i] >= f[0] && xs[i] <= f[0] + f[2] && ys[i] >= f[1]
                          && ys[i] <= f[1] + f[3],
                      "%s point %d at (%g, %g) is outside the frame", cls, i, xs[i], ys[i]);
        ck_assert_msg(fabs(step - steps[i]) < 0.5 && fabs(v - values[i]) < tol,
                      "%s point %d: drawn at step %.2f loss %.4f, is step %g loss %.4f", cls, i,
                      step, v, steps[i], values[i]);
    }
}

START_TEST(test_plot_draws_ticked_axes_every_step_each_evaluation_and_a_legend)
{
    enum { N = 120, E = 4 };
    float loss[N];
    double steps[N], values[N], ev_steps[E], ev_train[E], ev_val[E];
    node_eval_point_t ev[E] = {
        { 0, 4.5, 4.6 }, { 40, 2.7, 2.8 }, { 80, 2.2, 2.35 }, { 120, 2.1, 2.3 },
    };
    double lo = 1e9, hi = -1e9;
    for (int k = 0; k < N; k++) {
        loss[k] = 2.0f + 2.5f * expf(-k / 30.0f) + 0.05f * sinf(k * 1.7f);
        steps[k] = k;
        values[k] = loss[k];
        lo = fmin(lo, loss[k]);
        hi = fmax(hi, loss[k]);
    }
    for (int i = 0; i < E; i++) {
        ev_steps[i] = (double) ev[i].step;
        ev_train[i] = ev[i].train;
        ev_val[i] = ev[i].val;
        lo = fmin(lo, fmin(ev[i].train, ev[i].val));
        hi = fmax(hi, fmax(ev[i].train, ev[i].val));
    }
    node_plot_t plot = { "run <1> & \"its\" loss", loss, 0, N, ev, E };
    plot_read_t *r = s_plot_read(&plot);
    ck_assert_ptr_nonnull(strstr(r->svg, ">run &lt;1&gt; &amp; &quot;its&quot; loss</text>"));
    s_assert_ticks(r->xt, r->xpx, r->nx, 0, N, 0, 0, "x");
    for (int i = 0; i < r->nx; i++)
        ck_assert_msg(r->xt[i] == floor(r->xt[i]), "x tick %g is not a whole step", r->xt[i]);
    s_assert_ticks(r->yt, r->ypx, r->ny, lo, hi, 0.1 * (hi - lo), 1, "y");
    ck_assert_int_eq(s_count(r->svg, "<polyline class=\"train\""), 1);
    s_assert_curve(r, "train", steps, values, N, 0.01);
    ck_assert_int_eq(s_count(r->svg, "<circle class=\"eval-train\""), E);
    ck_assert_int_eq(s_count(r->svg, "<circle class=\"eval-val\""), E);
    s_assert_curve(r, "eval-train", ev_steps, ev_train, E, 0.01);
    s_assert_curve(r, "eval-val", ev_steps, ev_val, E, 0.01);
    ck_assert_int_eq(s_count(r->svg, "<text class=\"legend\""), 3);
    ck_assert_ptr_nonnull(strstr(r->svg, ">train loss, every step</text>"));
    ck_assert_ptr_nonnull(strstr(r->svg, ">train loss, evaluated</text>"));
    ck_assert_ptr_nonnull(strstr(r->svg, ">val loss, evaluated</text>"));
    s_plot_read_free(r);
}
END_TEST

START_TEST(test_plot_without_evaluations_names_only_the_step_curve)
{
    enum { N = 300 };
    float loss[N];
    for (int k = 0; k < N; k++)
        loss[k] = 5.5f - 3.0f * (float) k / N;
    node_plot_t plot = { NULL, loss, 1000, N, NULL, 0 };
    plot_read_t *r = s_plot_read(&plot);
    s_assert_ticks(r->xt, r->xpx, r->nx, 1000, 1000 + N - 1, 0, 0, "x");
    ck_assert_int_eq(s_count(r->svg, "<text class=\"legend\""), 1);
    ck_assert_ptr_nonnull(strstr(r->svg, ">train loss, every step</text>"));
    ck_assert_ptr_null(strstr(r->svg, "val"));
    ck_assert_ptr_null(strstr(r->svg, "eval-"));
    s_plot_read_free(r);
}
END_TEST

START_TEST(test_plot_draws_one_step_and_a_flat_curve_within_ticks)
{
    float one = 3.0f, flat[50];
    for (int k = 0; k < 50; k++)
        flat[k] = 2.5f;
    double steps[50], values[50];
    for (int k = 0; k < 50; k++) {
        steps[k] = k;
        values[k] = 2.5;
    }
    node_plot_t plot = { "one", &one, 7, 1, NULL, 0 };
    plot_read_t *r = s_plot_read(&plot);
    ck_assert_msg(r->yt[0] < 3.0 && r->yt[r->ny - 1] > 3.0, "y ticks %g..%g", r->yt[0],
                  r->yt[r->ny - 1]);
    ck_assert_msg(r->nx >= 2 && r->xt[0] <= 7 && r->xt[r->nx - 1] >= 7, "x ticks around step 7");
    ck_assert_int_eq(s_count(r->svg, "<circle class=\"train\""), 1); // a lone point shows
    double seven = 7, three = 3;
    s_assert_curve(r, "train", &seven, &three, 1, 0.01);
    s_plot_read_free(r);
    plot = (node_plot_t) { "flat", flat, 0, 50, NULL, 0 };
    r = s_plot_read(&plot);
    s_assert_ticks(r->yt, r->ypx, r->ny, 2.5, 2.5, 0.5, 1, "y");
    ck_assert_msg(r->yt[0] < 2.5 && r->yt[r->ny - 1] > 2.5, "y ticks %g..%g", r->yt[0],
                  r->yt[r->ny - 1]);
    s_assert_curve(r, "train", steps, values, 50, 0.01);
    s_plot_read_free(r);
}
END_TEST

START_TEST(test_plot_keeps_a_long_curves_extremes_and_skips_non_finite_values)
{
    enum { N = 10000 };
    float *loss = malloc(N * sizeof(float));
    for (int k = 0; k < N; k++)
        loss[k] = 3.0f - 1e-4f * (float) k;
    loss[5003] = 9.0f; // one step each: a stride would miss them
    loss[7777] = 0.5f;
    loss[17] = INFINITY;
    loss[18] = NAN;
    node_plot_t plot = { NULL, loss, 0, N, NULL, 0 };
    plot_read_t *r = s_plot_read(&plot);
    static double xs[PLOT_MAX], ys[PLOT_MAX];
    int n = s_polyline(r->svg, "train", xs, ys);
    ck_assert_msg(n >= 1000 && n <= 2000, "%d points for %d steps", n, N);
    double top = 1e9, bottom = -1e9;
    for (int i = 0; i < n; i++) {
        top = fmin(top, ys[i]);
        bottom = fmax(bottom, ys[i]);
        ck_assert(i == 0 || xs[i] >= xs[i - 1]); // in step order (0.07 px a step)
    }
    ck_assert_double_eq_tol(s_unmap(r->yt, r->ypx, r->ny, top), 9.0, 0.02);
    ck_assert_double_eq_tol(s_unmap(r->yt, r->ypx, r->ny, bottom), 0.5, 0.02);
    s_plot_read_free(r);
    // every step drawn below the limit, less the two that are not finite
    plot.count = 100;
    r = s_plot_read(&plot);
    ck_assert_int_eq(s_polyline(r->svg, "train", xs, ys), 98);
    s_plot_read_free(r);
    for (int k = 0; k < 3; k++)
        loss[k] = NAN;
    plot.count = 3;
    char path[128], err[256] = "";
    snprintf(path, sizeof path, "%s/none.svg", s_tmpdir());
    ck_assert_int_eq(node_plot_write(path, &plot, err, sizeof err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, path));
    ck_assert_int_ne(access(path, F_OK), 0);
    free(loss);
}
END_TEST

START_TEST(test_evals_replace_what_a_replay_measures_again)
{
    node_evals_t e = { NULL, 0, 0 };
    for (long s = 0; s <= 400; s += 100)
        node_evals_add(&e, s, 3.0 - s * 1e-3, 3.1 - s * 1e-3);
    node_evals_add(&e, 300, 1.0, 1.5); // rolled back to 250, evaluated at 300 again
    ck_assert_int_eq(e.n, 4);
    ck_assert_int_eq(e.at[3].step, 300);
    ck_assert_double_eq(e.at[3].val, 1.5);
    ck_assert_int_eq(e.at[2].step, 200);
    node_evals_free(&e);
    ck_assert_ptr_null(e.at);
    ck_assert_int_eq(e.n, 0);
}
END_TEST

// ---- status: the router's JSON as swarm status reads it ----

START_TEST(test_status_reads_the_documented_reply_and_refuses_broken_ones)
{
    const char *reply = "{\"step\": 12, \"iters\": 2000, \"loss\": 2.41, \"state\": \"training\", "
        "\"stages\": [{\"stage\": 0, \"replicas\": 2, \"tok_s\": 2600.0, \"queue\": 1}], "
        "\"peers\": [{\"id\": 3, \"name\": \"desk\\u001b[2J\", \"stage\": 0, \"state\": \"ready\"}]}";
    char *text = NULL, err[256] = "";
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    ck_assert_int_eq(node_status_show(reply, strlen(reply), "tcp://h:1", out, err, sizeof err), 0);
    fclose(out);
    ck_assert_msg(strstr(text, "step 12/2000") && strstr(text, "desk?[2J"), "%s", text);
    ck_assert_ptr_null(strchr(text, '\033')); // a peer's name cannot drive the terminal
    free(text);
    ck_assert_int_eq(node_status_show("{\"step\": 1e999}", 15, "a", NULL, err, sizeof err), -EPROTO);
    ck_assert_msg(strstr(err, "real number overflow"), "%s", err);
    ck_assert_int_eq(node_status_show("{\"step\": \"12\"}", 14, "a", NULL, err, sizeof err), -EPROTO);
    ck_assert_msg(strstr(err, "\"step\" is a string, not a number"), "%s", err);
}
END_TEST

// The tables swarm status prints for reply (len bytes); *rc is what
// node_status_show returned. The text is the caller's to free.
static char *s_status_tables(const char *reply, size_t len, int *rc, char *err, size_t errlen)
{
    char *text = NULL;
    size_t n = 0;
    FILE *out = open_memstream(&text, &n);
    ck_assert_ptr_nonnull(out);
    *rc = node_status_show(reply, len, "tcp://h:1", out, err, errlen);
    fclose(out);
    return text;
}

START_TEST(test_status_refuses_inf_and_nan_and_reads_an_expelled_peer)
{
    char err[256] = "";
    // what the router wrote for a peer expelled for the run, before jansson
    const char *old = "{\"step\": 40, \"state\": \"training\", \"stages\": [], \"peers\": [{\"id\": 5, "
        "\"name\": \"drift\", \"state\": \"banned\", \"failures\": 1, \"banned_s\": inf, \"why\": \"\"}]}";
    ck_assert_int_eq(node_status_show(old, strlen(old), "a", NULL, err, sizeof err), -EPROTO);
    ck_assert_msg(strstr(err, "at byte ") && strstr(err, "inf"), "%s", err);
    ck_assert_int_eq(node_status_show("{\"loss\": nan}", 13, "a", NULL, err, sizeof err), -EPROTO);
    // what it writes now: a ban that ends, one that never does (expelled)
    const char *reply = "{\"step\": 40, \"iters\": 400, \"loss\": 2.5, \"loss_avg\": 2.6, "
        "\"tok_s\": 100.0, \"bound_tok_s\": 120.0, \"eta_s\": null, \"state\": \"training\", "
        "\"stages\": [{\"stage\": 0, \"replicas\": 1, \"tok_s\": 100.0, \"node_tok_s\": 120.0, "
        "\"queue\": 0, \"flops_per_token\": 1000}], \"peers\": ["
        "{\"id\": 1, \"name\": \"honest\", \"key\": \"k1\", \"device\": \"cpu\", \"stage\": 0, "
        "\"tok_s\": 100.0, \"node_tok_s\": 120.0, \"inflight\": 1, \"heartbeat_age_s\": 0.2, "
        "\"state\": \"ready\", \"failures\": 0, \"banned_s\": 0, \"expelled\": false, \"why\": \"\"}, "
        "{\"id\": 2, \"name\": \"slow\", \"key\": \"k2\", \"device\": \"cpu\", \"stage\": 0, "
        "\"tok_s\": 0.0, \"node_tok_s\": 0.0, \"inflight\": 0, \"heartbeat_age_s\": 3.1, "
        "\"state\": \"banned\", \"failures\": 1, \"banned_s\": 12, \"expelled\": false, "
        "\"why\": \"missed the deadline\"}, "
        "{\"id\": 3, \"name\": \"drift\", \"key\": \"k3\", \"device\": \"cpu\", \"stage\": 0, "
        "\"tok_s\": 0.0, \"node_tok_s\": 0.0, \"inflight\": 0, \"heartbeat_age_s\": 9.0, "
        "\"state\": \"banned\", \"failures\": 2, \"banned_s\": null, \"expelled\": true, "
        "\"why\": \"diverged from its replicas a second time: expelled\"}], \"peers_omitted\": 2}";
    int rc = 0;
    char *text = s_status_tables(reply, strlen(reply), &rc, err, sizeof err);
    ck_assert_msg(rc == 0, "%s", err);
    ck_assert_msg(strstr(text, "step 40/400") && strstr(text, "banned 12s (missed the deadline)")
                  && strstr(text, "banned for the run (diverged from its replicas a second time")
                  && strstr(text, "... and 2 more peers"), "%s", text);
    free(text);
    // each field's type is checked; the error names the entry and the field
    const char *typed = "{\"peers\": [{\"id\": 1}, {\"expelled\": \"yes\"}]}";
    ck_assert_int_eq(node_status_show(typed, strlen(typed), "a", NULL, err, sizeof err), -EPROTO);
    ck_assert_msg(strstr(err, "\"peers\"[1]: \"expelled\" is a string"), "%s", err);
}
END_TEST

START_TEST(test_status_reads_a_table_of_2000_peers)
{
    char *doc = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&doc, &len);
    ck_assert_ptr_nonnull(f);
    fprintf(f, "{\"step\": 1, \"iters\": 10, \"state\": \"training\", \"stages\": [], \"peers\": [");
    for (int i = 0; i < 2000; i++)
        fprintf(f, "%s{\"id\": %d, \"name\": \"node-%04d\", \"key\": \"%040d\", \"device\": \"cpu\", "
                "\"stage\": %d, \"tok_s\": 1300.5, \"node_tok_s\": 1400.0, \"inflight\": 1, "
                "\"heartbeat_age_s\": 0.4, \"state\": \"ready\", \"failures\": 0, \"banned_s\": 0, "
                "\"expelled\": false, \"why\": \"\"}", i ? ", " : "", i + 1, i, i, i % 4);
    fprintf(f, "], \"peers_omitted\": 0}");
    fclose(f);
    ck_assert_uint_gt(len, 65536); // more than the router's old fixed buffer
    char err[256] = "";
    int rc = 0;
    char *text = s_status_tables(doc, len, &rc, err, sizeof err);
    ck_assert_msg(rc == 0, "%s", err);
    // the table keeps the first 1024 and counts the rest
    ck_assert(strstr(text, "node-0000") && strstr(text, "node-1023") && !strstr(text, "node-1024"));
    ck_assert_msg(strstr(text, "... and 976 more peers"), "%.300s", text);
    free(text);
    free(doc);
}
END_TEST

// ---- the fuzz targets' seed corpora (tests/fuzz_files.c, fuzz_status.c) ----

static const fuzz_target_t s_fuzz_targets[] = {
    {"files", fuzz_files_one, fuzz_files_seed},
    {"status", fuzz_status_one, fuzz_status_seed},
};
FUZZ_CORPUS_TESTS

// ---- tensors on the wire (net/tensors.c) -----------------------------------

// n values spread over [lo, 2 lo) x sign, from a fixed sequence
static void s_spread(float *x, size_t n, float lo)
{
    uint32_t st = 7;
    for (size_t i = 0; i < n; i++) {
        st = st * 1664525u + 1013904223u;
        x[i] = lo * (1.0f + (float) (st >> 8) / 16777216.0f) * (st & 1 ? -1.0f : 1.0f);
    }
}

// Append src as dtype with its pow2 in meta, as router and node do.
static net_msg_t *s_wire_msg(int dtype, const float *src, uint32_t n, int *pow2)
{
    net_msg_t *m = net_msg_new(NET_MSG_RESULT);
    uint32_t dims[1] = { n };
    ck_assert_int_eq(net_tensor_add(m, dtype, dims, 1, src, pow2), 0);
    char meta[32];
    snprintf(meta, sizeof meta, "pow2_0=%d", *pow2);
    ck_assert_int_eq(net_msg_set_meta(m, meta), 0);
    return m;
}

START_TEST(test_wire_fp16_keeps_gradient_sized_values_to_its_rounding)
{
    // activation gradients are ~1e-5: below fp16's normal range, where plain
    // fp16 would keep a few bits; scaled by 2^k they keep 11
    enum { N = 4096 };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    ck_assert_ptr_nonnull(x);
    ck_assert_ptr_nonnull(y);
    for (float lo = 1e-9f; lo < 1e4f; lo *= 97.0f) {
        s_spread(x, N, lo);
        int pow2 = 0;
        net_msg_t *m = s_wire_msg(NET_DTYPE_F16, x, N, &pow2);
        ck_assert_int_eq(net_tensor_get(m, 0, y, N), 0);
        double worst = 0.0;
        for (int i = 0; i < N; i++)
            worst = fmax(worst, fabs((double) y[i] - x[i]) / fabs((double) x[i]));
        ck_assert_msg(worst <= ldexp(1.0, -11), "values ~%g: relative error %g > 2^-11 (k %d)",
                      lo, worst, pow2);
        net_msg_destroy(&m);
    }
    free(x);
    free(y);
}
END_TEST

START_TEST(test_wire_fp32_and_int8_take_no_scale_and_fp32_is_exact)
{
    float x[300], y[300];
    s_spread(x, 300, 3e-6f);
    int pow2 = 1;
    net_msg_t *m = s_wire_msg(NET_DTYPE_F32, x, 300, &pow2);
    ck_assert_int_eq(pow2, 0);
    ck_assert_int_eq(net_tensor_get(m, 0, y, 300), 0);
    ck_assert_int_eq(memcmp(x, y, sizeof x), 0);
    net_msg_destroy(&m);
    m = s_wire_msg(NET_DTYPE_I8, x, 300, &pow2);
    ck_assert_int_eq(pow2, 0);
    net_msg_destroy(&m);
    // an all-zero fp16 tensor needs no scale either
    memset(x, 0, sizeof x);
    m = s_wire_msg(NET_DTYPE_F16, x, 300, &pow2);
    ck_assert_int_eq(pow2, 0);
    ck_assert_int_eq(net_tensor_get(m, 0, y, 300), 0);
    ck_assert_float_eq(y[17], 0.0f);
    net_msg_destroy(&m);
}
END_TEST

START_TEST(test_wire_refuses_bad_scales_and_what_they_would_make_infinite)
{
    float x[4] = { 1.0f, -2.0f, 3e38f, 0.5f }, y[4];
    uint32_t dims[1] = { 4 };
    const char *metas[] = { "pow2_0=101", "pow2_0=-101", "pow2_0=x", "pow2_0=", "pow2_0=3.5",
                            "pow2_0=-1" /* 3e38 x 2 overflows */ };
    for (size_t i = 0; i < sizeof metas / sizeof metas[0]; i++) {
        net_msg_t *m = net_msg_new(NET_MSG_RESULT);
        ck_assert_int_eq(net_msg_add_tensor(m, NET_DTYPE_F32, dims, 1, x), 0);
        ck_assert_int_eq(net_msg_set_meta(m, metas[i]), 0);
        ck_assert_msg(net_tensor_get(m, 0, y, 4) == -EPROTO, "%s accepted", metas[i]);
        net_msg_destroy(&m);
    }
}
END_TEST

START_TEST(test_wire_parse_knows_three_formats_and_names_the_flag)
{
    int dtype = 0;
    char err[128] = "";
    ck_assert_int_eq(net_dtype_parse("wire", "fp16", &dtype, err, sizeof err), 0);
    ck_assert_int_eq(dtype, NET_DTYPE_F16);
    ck_assert_int_eq(net_dtype_parse("wire", "int8", &dtype, err, sizeof err), 0);
    ck_assert_int_eq(dtype, NET_DTYPE_I8);
    ck_assert_str_eq(net_dtype_name(dtype), "int8");
    ck_assert_int_eq(net_dtype_parse("grad-wire", "bf16", &dtype, err, sizeof err), -EINVAL);
    ck_assert_str_eq(err, "--grad-wire bf16: expected fp32, fp16 or int8");
}
END_TEST

// --slowdown's sleeps, through a clock that overruns each nap by half a ms
// (what a loaded host did to nodes at half a core) and once by 10 s (a node
// stopped in its sleep): the naps make up each overrun, so the time slept
// is what was owed, and a stop is not paid back beyond one sleep.
static double s_overrun_s, s_napped_s;
static double s_fake_nap(double want)
{
    ck_assert(want > 0.0);
    double slept = want + s_overrun_s;
    s_napped_s += slept;
    return slept;
}

START_TEST(test_slowdown_sleeps_make_up_what_they_overran)
{
    double overran = 0.0, counted = 0.0;
    s_overrun_s = 0.0005, s_napped_s = 0.0;
    for (int i = 0; i < 100; i++)
        counted += node_worker_slow_sleep(0.002, &overran, s_fake_nap);
    // owed 0.2 s; slept that and the last nap's overrun (100 overruns, 0.25 s,
    // before the naps made them up)
    ck_assert_double_eq_tol(s_napped_s, 0.2 + 0.0005, 1e-12);
    ck_assert_double_eq_tol(counted, s_napped_s, 1e-12); // tok/s counts what was slept
    ck_assert_double_eq_tol(overran, 0.0005, 1e-12);
    // a stop of 10 s in one nap: owed back one sleep (0.002), not 10 s
    s_overrun_s = 10.0;
    (void) node_worker_slow_sleep(0.002, &overran, s_fake_nap);
    ck_assert_double_eq_tol(overran, 0.002, 1e-12);
    s_overrun_s = 0.0, s_napped_s = 0.0;
    ck_assert_double_eq_tol(node_worker_slow_sleep(0.002, &overran, s_fake_nap), 0.0, 1e-12);
    ck_assert_double_eq_tol(overran, 0.0, 1e-12); // paid: no nap at all
    for (int i = 0; i < 10; i++)
        (void) node_worker_slow_sleep(0.002, &overran, s_fake_nap);
    ck_assert_double_eq_tol(s_napped_s, 0.02, 1e-12);
    // more owed back than one request sleeps: it sleeps none and owes the rest
    overran = 0.003;
    ck_assert_double_eq_tol(node_worker_slow_sleep(0.002, &overran, s_fake_nap), 0.0, 1e-12);
    ck_assert_double_eq_tol(overran, 0.001, 1e-12);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("node");
    TCase *tc = tcase_create("model");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_stage_loss_and_gradients_match_pytorch, 0, 6);
    tcase_add_loop_test(tc, test_ten_steps_match_pytorch_losses_and_weights, 0, 6);
    tcase_add_test(tc, test_baby_model_in_three_and_four_stages_matches_pytorch);
    tcase_add_test(tc, test_resumed_run_continues_the_same_curve);
    tcase_add_test(tc, test_stage_refuses_tokens_outside_vocabulary);
    tcase_add_test(tc, test_slowdown_sleeps_make_up_what_they_overran);
    suite_add_tcase(s, tc);
    tc = tcase_create("device");
    tcase_add_loop_test(tc, test_separate_device_memory_trains_bit_identically, 0, 2);
    suite_add_tcase(s, tc);
    tc = tcase_create("plan");
    tcase_add_test(tc, test_plan_cuts_contiguous_nonempty_stages);
    tcase_add_test(tc, test_plan_refuses_more_stages_than_layers);
    tcase_add_test(tc, test_plan_reads_the_cut_a_router_says_and_nothing_else);
    tcase_add_test(tc, test_config_refuses_embd_not_divisible_by_heads);
    tcase_add_test(tc, test_parameter_count_matches_reference_files);
    suite_add_tcase(s, tc);
    tc = tcase_create("files");
    tcase_add_loop_test(tc, test_bgpt_refuses_damaged_files, 0, 7);
    tcase_add_test(tc, test_bgpt_missing_file_names_path);
    tcase_add_test(tc, test_bgpt_round_trip_is_exact);
    tcase_add_test(tc, test_checkpoint_round_trip_and_corruption_refused);
    suite_add_tcase(s, tc);
    tc = tcase_create("plot");
    tcase_add_test(tc, test_plot_draws_ticked_axes_every_step_each_evaluation_and_a_legend);
    tcase_add_test(tc, test_plot_without_evaluations_names_only_the_step_curve);
    tcase_add_test(tc, test_plot_draws_one_step_and_a_flat_curve_within_ticks);
    tcase_add_test(tc, test_plot_keeps_a_long_curves_extremes_and_skips_non_finite_values);
    tcase_add_test(tc, test_evals_replace_what_a_replay_measures_again);
    suite_add_tcase(s, tc);
    tc = tcase_create("status");
    tcase_add_test(tc, test_status_reads_the_documented_reply_and_refuses_broken_ones);
    tcase_add_test(tc, test_status_refuses_inf_and_nan_and_reads_an_expelled_peer);
    tcase_add_test(tc, test_status_reads_a_table_of_2000_peers);
    suite_add_tcase(s, tc);
    tc = tcase_create("fuzz");
    tcase_add_loop_test(tc, test_fuzz_target_seeds_are_current, 0, N_FUZZ_TARGETS);
    tcase_add_loop_test(tc, test_fuzz_target_corpus_replays, 0, N_FUZZ_TARGETS);
    suite_add_tcase(s, tc);
    tc = tcase_create("wire");
    tcase_add_test(tc, test_wire_fp16_keeps_gradient_sized_values_to_its_rounding);
    tcase_add_test(tc, test_wire_fp32_and_int8_take_no_scale_and_fp32_is_exact);
    tcase_add_test(tc, test_wire_refuses_bad_scales_and_what_they_would_make_infinite);
    tcase_add_test(tc, test_wire_parse_knows_three_formats_and_names_the_flag);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
