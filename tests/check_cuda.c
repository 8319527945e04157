/* check_cuda.c - the CUDA backend (the swarm-cuda.so plugin) against the CPU
 * backend: every op, forward and backward, on random inputs of the baby
 * model's sizes and of odd ones, by normalised error max|cuda - cpu| /
 * max|cpu| <= 1e-5 (the embedding ops to the bit); the accumulate/overwrite
 * contract of each op; the same bits from two runs of the same op; memory
 * round trips.
 *
 * Without a usable GPU every test says SKIP and passes (the reason is
 * printed once). SWARM_CUDA_PLUGIN picks the plugin (make test runs these
 * checks on the CPU emulation of the kernels, build/swarm-cuda-emu.so).
 * CUDA is touched only inside the tests (each runs in its own process).
 */
#include "blas.h"
#include "backend_ops.h"

#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define TOL 1e-5          // normalised error allowed between the backends
#define GARBAGE 777.0f    // what the CPU's overwritten outputs hold before

static int s_gpu;          // 1 when the probe opened a CUDA backend
static char s_why[1024];   // why not

// ---- helpers ---------------------------------------------------------------

static float s_rand(uint64_t *state)
{
    *state += 0x9E3779B97F4A7C15ull;
    uint64_t z = *state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float) ((double) (z >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static float *s_host(size_t n, uint64_t *state, float scale, float offset)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i < n; i++)
        p[i] = state ? offset + scale * s_rand(state) : offset;
    return p;
}

static float *s_copy_of(const float *src, size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    ck_assert_ptr_nonnull(p);
    memcpy(p, src, n * sizeof(float));
    return p;
}

// the CUDA backend, opened in this test's process
static blas_backend_t *s_cuda(void)
{
    char err[1024] = "";
    blas_backend_t *be = blas_backend_open("cuda", 1, err, sizeof err);
    ck_assert_msg(be != NULL, "the probe opened cuda, this test cannot: %s", err);
    ck_assert_str_eq(be->name, "cuda");
    return be;
}

// a device copy of n host bytes
static void *s_up(blas_backend_t *be, const void *host, size_t bytes)
{
    void *dev = NULL;
    ck_assert_int_eq(be->buf_alloc(be, bytes, &dev), 0);
    ck_assert_int_eq(be->upload(be, dev, host, bytes), 0);
    return dev;
}

// a device buffer of n floats, every one NaN: an output that must be overwritten
static float *s_up_nan(blas_backend_t *be, size_t n)
{
    float *host = s_host(n, NULL, 0.0f, NAN);
    float *dev = s_up(be, host, n * sizeof(float));
    free(host);
    return dev;
}

// n floats of a device buffer, in a new host array
static float *s_down(blas_backend_t *be, const float *dev, size_t n)
{
    float *host = s_host(n, NULL, 0.0f, 0.0f);
    ck_assert_int_eq(be->download(be, host, dev, n * sizeof(float)), 0);
    return host;
}

// max |got - want| / max |want| (floor 1e-6), failing above TOL
static void s_close(const char *what, blas_backend_t *be, const float *dev, const float *want,
                    size_t n)
{
    float *got = s_down(be, dev, n);
    double err = 0.0, mag = 1e-6;
    size_t worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double) got[i] - want[i]);
        if (!(d <= err)) { // NaN counts as the worst
            err = isnan(d) ? INFINITY : d;
            worst = i;
        }
        mag = fmax(mag, fabs((double) want[i]));
    }
    ck_assert_msg(err / mag <= TOL, "%s: normalised error %.3g > %g (element %zu of %zu: cuda %.9g, cpu %.9g)",
                  what, err / mag, TOL, worst, n, got[worst], want[worst]);
    free(got);
}

// the same bits in two device buffers of n floats
static void s_same_bits(const char *what, blas_backend_t *be, const float *a, const float *b,
                        size_t n)
{
    float *x = s_down(be, a, n), *y = s_down(be, b, n);
    ck_assert_msg(memcmp(x, y, n * sizeof(float)) == 0, "%s: two runs differ", what);
    free(x);
    free(y);
}

// a device buffer of n floats holds exactly the CPU's bits
static void s_cpu_bits(const char *what, blas_backend_t *be, const float *dev, const float *want,
                       size_t n)
{
    float *got = s_down(be, dev, n);
    ck_assert_msg(memcmp(got, want, n * sizeof(float)) == 0, "%s: not the CPU's bits", what);
    free(got);
}

#define SKIP_WITHOUT_GPU()                                              \
    do {                                                                \
        if (!s_gpu)                                                     \
            return;                                                     \
    } while (0)

// ---- memory ----------------------------------------------------------------

START_TEST(test_cuda_backend_fills_every_op_and_field)
{
    SKIP_WITHOUT_GPU();
    blas_backend_t *be = s_cuda();
    ck_assert_int_eq(be->api_version, BLAS_API_VERSION);
    ck_assert_msg(!strncmp(be->device, "cuda:0 ", 7), "device: %s", be->device);
    ck_assert_msg(be->memory > 0, "memory is 0");
    ck_assert_int_eq(be->threads, 1);
    s_assert_every_op(be);
    // opening again gives the same table; another device is refused
    char err[512];
    ck_assert_ptr_eq(blas_backend_open("cuda:0", 1, err, sizeof err), be);
    ck_assert_ptr_null(blas_backend_open("cuda:1", 1, err, sizeof err));
    ck_assert_msg(strstr(err, "--device cuda:1: ") == err, "cuda:1 after cuda:0: %s", err);
}
END_TEST

START_TEST(test_cuda_memory_round_trips_and_has_no_host_view)
{
    SKIP_WITHOUT_GPU();
    blas_backend_t *be = s_cuda();
    enum { COUNT = 100003 };
    uint64_t st = 1;
    float *src = s_host(COUNT, &st, 100.0f, 0.0f);
    float *dev = s_up(be, src, COUNT * sizeof(float));
    float *back = s_down(be, dev, COUNT);
    ck_assert_msg(memcmp(src, back, COUNT * sizeof(float)) == 0, "download differs from upload");
    ck_assert_msg(!be->host_ptr || be->host_ptr(be, dev) == NULL, "host_ptr gives a view");
    float seven[10] = { 7, 7, 7, 7, 7, 7, 7, 7, 7, 7 };
    ck_assert_int_eq(be->upload(be, dev + 100, seven, sizeof seven), 0);
    free(back);
    back = s_down(be, dev, COUNT);
    for (int i = 0; i < COUNT; i++)
        ck_assert_msg(back[i] == (i >= 100 && i < 110 ? 7.0f : src[i]), "element %d: %g", i, back[i]);
    be->zero(be, dev, COUNT * sizeof(float));
    free(back);
    back = s_down(be, dev, COUNT);
    for (int i = 0; i < COUNT; i++)
        ck_assert_msg(back[i] == 0.0f, "element %d after zero: %g", i, back[i]);
    ck_assert_int_eq(be->sync(be), 0);
    void *empty = NULL;
    ck_assert_int_eq(be->buf_alloc(be, 0, &empty), 0);
    ck_assert_ptr_nonnull(empty);
    be->buf_free(be, empty);
    be->buf_free(be, dev);
    free(src);
    free(back);
}
END_TEST

START_TEST(test_cuda_allocation_beyond_memory_fails_and_the_backend_goes_on)
{
    SKIP_WITHOUT_GPU();
    blas_backend_t *be = s_cuda();
    void *huge = NULL;
    ck_assert_int_eq(be->buf_alloc(be, (size_t) 1 << 52, &huge), -ENOMEM);
    float x[4] = { 1, 2, 3, 4 };
    float *dev = s_up(be, x, sizeof x);
    float *back = s_down(be, dev, 4);
    ck_assert_msg(memcmp(x, back, sizeof x) == 0, "transfers fail after an -ENOMEM");
    ck_assert_int_eq(be->sync(be), 0);
    be->buf_free(be, dev);
    free(back);
}
END_TEST

// ---- encoder ---------------------------------------------------------------

// _i: 0 the baby model's sizes, 1 odd ones
static const int s_enc[2][4] = { { 12, 64, 128, 256 }, { 3, 7, 300, 11 } }; // B T C V

START_TEST(test_cuda_encoder_matches_the_cpu)
{
    SKIP_WITHOUT_GPU();
    blas_backend_t *be = s_cuda(), *cpu = blas_cpu_backend(1);
    int B = s_enc[_i][0], T = s_enc[_i][1], C = s_enc[_i][2], V = s_enc[_i][3], N = B * T;
    uint64_t st = 31 + _i;
    int32_t *tok = malloc(N * sizeof(int32_t));
    for (int n = 0; n < N; n++) // repeats on purpose, and a token never used
        tok[n] = (int32_t) ((s_rand(&st) + 1.0f) * 0.5f * (V - 1)) % (V - 1);
    float *wte = s_host((size_t) V * C, &st, 1, 0), *wpe = s_host((size_t) T * C, &st, 1, 0);
    float *dout = s_host((size_t) N * C, &st, 1, 0);
    float *dwte = s_host((size_t) V * C, &st, 1, 0), *dwpe = s_host((size_t) T * C, &st, 1, 0);
    float *out = s_host((size_t) N * C, NULL, 0, GARBAGE);
    int32_t *tok_d = s_up(be, tok, N * sizeof(int32_t));
    float *wte_d = s_up(be, wte, (size_t) V * C * 4), *wpe_d = s_up(be, wpe, (size_t) T * C * 4);
    float *dout_d = s_up(be, dout, (size_t) N * C * 4), *out_d = s_up_nan(be, (size_t) N * C);
    float *dwte_d = s_up(be, dwte, (size_t) V * C * 4), *dwpe_d = s_up(be, dwpe, (size_t) T * C * 4);
    float *dwte2_d = s_up(be, dwte, (size_t) V * C * 4), *dwpe2_d = s_up(be, dwpe, (size_t) T * C * 4);

    cpu->encoder_forward(out, tok, wte, wpe, B, T, C);
    be->encoder_forward(out_d, tok_d, wte_d, wpe_d, B, T, C);
    s_close("encoder_forward", be, out_d, out, (size_t) N * C);
    // backward accumulates into what the gradients held
    cpu->encoder_backward(dwte, dwpe, dout, tok, B, T, C);
    be->encoder_backward(dwte_d, dwpe_d, dout_d, tok_d, B, T, C);
    be->encoder_backward(dwte2_d, dwpe2_d, dout_d, tok_d, B, T, C);
    s_close("encoder_backward dwte", be, dwte_d, dwte, (size_t) V * C);
    s_close("encoder_backward dwpe", be, dwpe_d, dwpe, (size_t) T * C);
    s_same_bits("encoder_backward dwte", be, dwte_d, dwte2_d, (size_t) V * C);
    s_same_bits("encoder_backward dwpe", be, dwpe_d, dwpe2_d, (size_t) T * C);
    // additions only, in the CPU's order: the CPU's bits (docs/cuda.md)
    s_cpu_bits("encoder_forward", be, out_d, out, (size_t) N * C);
    s_cpu_bits("encoder_backward dwte", be, dwte_d, dwte, (size_t) V * C);
    s_cpu_bits("encoder_backward dwpe", be, dwpe_d, dwpe, (size_t) T * C);
    free(tok), free(wte), free(wpe), free(dout), free(dwte), free(dwpe), free(out);
}
END_TEST

// ---- layernorm -------------------------------------------------------------

static const int s_ln[2][2] = { { 768, 128 }, { 37, 300 } }; // N C

START_TEST(test_cuda_layernorm_matches_the_cpu)
{
    SKIP_WITHOUT_GPU();
    blas_backend_t *be = s_cuda(), *cpu = blas_cpu_backend(1);
    int N = s_ln[_i][0], C = s_ln[_i][1];
    size_t nc = (size_t) N * C;
    uint64_t st = 41 + _i;
    float *inp = s_host(nc, &st, 2.0f, 0.5f), *w = s_host(C, &st, 1, 1), *b = s_host(C, &st, 1, 0);
    float *dout = s_host(nc, &st, 1, 0), *dinp = s_host(nc, &st, 1, 0);
    float *dw = s_host(C, &st, 1, 0), *db = s_host(C, &st, 1, 0);
    float *out = s_host(nc, NULL, 0, GARBAGE), *mean = s_host(N, NULL, 0, GARBAGE);
    float *rstd = s_host(N, NULL, 0, GARBAGE);
    float *inp_d = s_up(be, inp, nc * 4), *w_d = s_up(be, w, C * 4), *b_d = s_up(be, b, C * 4);
    float *dout_d = s_up(be, dout, nc * 4);
    float *out_d = s_up_nan(be, nc), *mean_d = s_up_nan(be, N), *rstd_d = s_up_nan(be, N);
    float *dinp_d[2], *dw_d[2], *db_d[2];
    for (int k = 0; k < 2; k++) {
        dinp_d[k] = s_up(be, dinp, nc * 4);
        dw_d[k] = s_up(be, dw, C * 4);
        db_d[k] = s_up(be, db, C * 4);
    }

    cpu->layernorm_forward(out, mean, rstd, inp, w, b, N, C);
    be->layernorm_forward(out_d, mean_d, rstd_d, inp_d, w_d, b_d, N, C);
    s_close("layernorm_forward out", be, out_d, out, nc);
    s_close("layernorm_forward mean", be, mean_d, mean, N);
    s_close("layernorm_forward rstd", be, rstd_d, rstd, N);
    // backward from the CPU's mean and rstd on both, accumulating
    float *mean_c = s_up(be, mean, N * 4), *rstd_c = s_up(be, rstd, N * 4);
    cpu->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    for (int k = 0; k < 2; k++)
        be->layernorm_backward(dinp_d[k], dw_d[k], db_d[k], dout_d, inp_d, w_d, mean_c, rstd_c, N, C);
    s_close("layernorm_backward dinp", be, dinp_d[0], dinp, nc);
    s_close("layernorm_backward dweight", be, dw_d[0], dw, C);
    s_close("layernorm_backward dbias", be, db_d[0], db, C);
    s_same_bits("layernorm_backward dinp", be, dinp_d[0], dinp_d[1], nc);
    s_same_bits("layernorm_backward dweight", be, dw_d[0], dw_d[1], C);
    s_same_bits("layernorm_backward dbias", be, db_d[0], db_d[1], C);
    free(inp), free(w), free(b), free(dout), free(dinp), free(dw), free(db);
    free(out), free(mean), free(rstd);
}
END_TEST

// ---- matmul ----------------------------------------------------------------

// N C OC bias: the baby model's qkv, fc2 and head (no bias, no dinp), and odd sizes
static const int s_mm[4][4] = { { 768, 128, 384, 1 }, { 768, 512, 128, 1 }, { 768, 128, 256, 0 },
                                { 37, 19, 67, 1 } };

START_TEST(test_cuda_matmul_matches_the_cpu)
{
    SKIP_WITHOUT_GPU();
    blas_backend_t *be = s_cuda(), *cpu = blas_cpu_backend(1);
    int N = s_mm[_i][0], C = s_mm[_i][1], OC = s_mm[_i][2], has_bias = s_mm[_i][3];
    size_t nc = (size_t) N * C, no = (size_t) N * OC, oc = (size_t) OC * C;
    uint64_t st = 51 + _i;
    float *inp = s_host(nc, &st, 1, 0), *w = s_host(oc, &st, 0.2f, 0), *bias = s_host(OC, &st, 1, 0);
    float *dout = s_host(no, &st, 1, 0), *dw = s_host(oc, &st, 1, 0), *db = s_host(OC, &st, 1, 0);
    float *out = s_host(no, NULL, 0, GARBAGE), *dinp = s_host(nc, NULL, 0, GARBAGE);
    float *inp_d = s_up(be, inp, nc * 4), *w_d = s_up(be, w, oc * 4);
    float *bias_d = has_bias ? s_up(be, bias, OC * 4) : NULL, *dout_d = s_up(be, dout, no * 4);
    float *out_d = s_up_nan(be, no), *dinp_d[2], *dw_d[2], *db_d[2];
    for (int k = 0; k < 2; k++) {
        dinp_d[k] = has_bias ? s_up_nan(be, nc) : NULL;
        dw_d[k] = s_up(be, dw, oc * 4);
        db_d[k] = has_bias ? s_up(be, db, OC * 4) : NULL;
    }

    cpu->matmul_forward(out, inp, w, has_bias ? bias : NULL, N, C, OC);
    be->matmul_forward(out_d, inp_d, w_d, bias_d, N, C, OC);
    s_close("matmul_forward", be, out_d, out, no);
    cpu->matmul_backward(has_bias ? dinp : NULL, dw, has_bias ? db : NULL, dout, inp, w, N, C, OC);
    for (int k = 0; k < 2; k++)
        be->matmul_backward(dinp_d[k], dw_d[k], db_d[k], dout_d, inp_d, w_d, N, C, OC);
    if (has_bias) {
        s_close("matmul_backward dinp (overwritten)", be, dinp_d[0], dinp, nc);
        s_close("matmul_backward dbias (accumulated)", be, db_d[0], db, OC);
        s_same_bits("matmul_backward dbias", be, db_d[0], db_d[1], OC);
    }
    s_close("matmul_backward dweight (accumulated)", be, dw_d[0], dw, oc);
    s_same_bits("matmul_backward dweight", be, dw_d[0], dw_d[1], oc);
    free(inp), free(w), free(bias), free(dout), free(dw), free(db), free(out), free(dinp);
}
END_TEST

// ---- attention -------------------------------------------------------------

static const int s_att[3][4] = { { 12, 64, 128, 4 }, { 2, 37, 48, 3 }, { 1, 130, 64, 1 } }; // B T C H

START_TEST(test_cuda_attention_matches_the_cpu)
{
    SKIP_WITHOUT_GPU();
    blas_backend_t *be = s_cuda(), *cpu = blas_cpu_backend(1);
    int B = s_att[_i][0], T = s_att[_i][1], C = s_att[_i][2], H = s_att[_i][3];
    size_t n3 = (size_t) B * T * 3 * C, n1 = (size_t) B * T * C, na = (size_t) B * H * T * T;
    uint64_t st = 61 + _i;
    float *qkv = s_host(n3, &st, 1.5f, 0), *dout = s_host(n1, &st, 1, 0);
    float *out = s_host(n1, NULL, 0, GARBAGE), *att = s_host(na, NULL, 0, GARBAGE);
    float *dqkv = s_host(n3, NULL, 0, GARBAGE), *datt = s_host(na, NULL, 0, GARBAGE);
    float *qkv_d = s_up(be, qkv, n3 * 4), *dout_d = s_up(be, dout, n1 * 4);
    float *out_d = s_up_nan(be, n1), *att_d = s_up_nan(be, na);
    float *dqkv_d = s_up_nan(be, n3), *datt_d = s_up_nan(be, na);

    cpu->attention_forward(out, att, qkv, B, T, C, H);
    be->attention_forward(out_d, att_d, qkv_d, B, T, C, H);
    s_close("attention_forward out", be, out_d, out, n1);
    s_close("attention_forward att (softmax, zeros above the diagonal)", be, att_d, att, na);
    // backward from the CPU's softmax on both
    float *att_c = s_up(be, att, na * 4);
    cpu->attention_backward(dqkv, datt, dout, qkv, att, B, T, C, H);
    be->attention_backward(dqkv_d, datt_d, dout_d, qkv_d, att_c, B, T, C, H);
    s_close("attention_backward dqkv (overwritten)", be, dqkv_d, dqkv, n3);
    free(qkv), free(dout), free(out), free(att), free(dqkv), free(datt);
}
END_TEST

// ---- elementwise -----------------------------------------------------------

START_TEST(test_cuda_gelu_and_add_match_the_cpu)
{
    SKIP_WITHOUT_GPU();
    blas_backend_t *be = s_cuda(), *cpu = blas_cpu_backend(1);
    size_t n = _i == 0 ? (size_t) 768 * 512 : 1001;
    uint64_t st = 71 + _i;
    float *x = s_host(n, &st, 6.0f, 0), *d = s_host(n, &st, 1, 0), *y = s_host(n, &st, 1, 0);
    x[0] = -30.0f, x[1] = 30.0f, x[2] = 0.0f, x[3] = -11.0f; // tails and the middle
    float *out = s_host(n, NULL, 0, GARBAGE), *dinp = s_host(n, NULL, 0, GARBAGE);
    float *x_d = s_up(be, x, n * 4), *d_d = s_up(be, d, n * 4), *y_d = s_up(be, y, n * 4);
    float *out_d = s_up_nan(be, n), *dinp_d = s_up_nan(be, n);
    cpu->gelu_forward(out, x, n);
    be->gelu_forward(out_d, x_d, n);
    s_close("gelu_forward", be, out_d, out, n);
    cpu->gelu_backward(dinp, x, d, n);
    be->gelu_backward(dinp_d, x_d, d_d, n);
    s_close("gelu_backward", be, dinp_d, dinp, n);
    // add, also in place
    cpu->add(out, x, y, n);
    be->add(out_d, x_d, y_d, n);
    s_close("add", be, out_d, out, n);
    cpu->add(x, x, y, n);
    be->add(x_d, x_d, y_d, n);
    s_close("add in place", be, x_d, x, n);
    free(x), free(d), free(y), free(out), free(dinp);
}
END_TEST

// ---- cross-entropy ---------------------------------------------------------

static const int s_ce[2][2] = { { 768, 256 }, { 5, 1000 } }; // N V

START_TEST(test_cuda_crossentropy_matches_the_cpu)
{
    SKIP_WITHOUT_GPU();
    blas_backend_t *be = s_cuda(), *cpu = blas_cpu_backend(1);
    int N = s_ce[_i][0], V = s_ce[_i][1];
    size_t nv = (size_t) N * V;
    uint64_t st = 81 + _i;
    float *logits = s_host(nv, &st, 4.0f, 0), *keep = s_copy_of(logits, nv);
    int32_t *y = malloc(N * sizeof(int32_t));
    for (int n = 0; n < N; n++)
        y[n] = (int32_t) ((s_rand(&st) + 1.0f) * 0.5f * V) % V;
    y[0] = 0, y[N - 1] = V - 1;
    float *loss = s_host(N, NULL, 0, GARBAGE);
    float *logits_d = s_up(be, logits, nv * 4), *loss_d = s_up_nan(be, N);
    int32_t *y_d = s_up(be, y, N * sizeof(int32_t));
    // scale 0: losses only, logits untouched
    cpu->crossentropy(logits, loss, y, N, V, 0.0f);
    be->crossentropy(logits_d, loss_d, y_d, N, V, 0.0f);
    s_close("crossentropy losses", be, loss_d, loss, N);
    float *back = s_down(be, logits_d, nv);
    ck_assert_msg(memcmp(back, keep, nv * 4) == 0, "scale 0 changed the logits");
    free(back);
    // with a scale: losses, and the logits become the gradient
    float scale = 1.0f / (float) N;
    cpu->crossentropy(logits, loss, y, N, V, scale);
    be->crossentropy(logits_d, loss_d, y_d, N, V, scale);
    s_close("crossentropy losses (with gradient)", be, loss_d, loss, N);
    s_close("crossentropy gradient", be, logits_d, logits, nv);
    free(logits), free(keep), free(y), free(loss);
}
END_TEST

START_TEST(test_cuda_sumsq_matches_the_cpu_in_double)
{
    SKIP_WITHOUT_GPU();
    blas_backend_t *be = s_cuda(), *cpu = blas_cpu_backend(1);
    size_t n = _i == 0 ? 1000003 : 5;
    uint64_t st = 91;
    float *x = s_host(n, &st, 3.0f, 0);
    float *x_d = s_up(be, x, n * 4);
    double want = cpu->sumsq(x, n), got = be->sumsq(x_d, n);
    ck_assert_msg(fabs(got - want) <= 1e-10 * want, "sumsq %.17g, cpu %.17g", got, want);
    ck_assert_msg(be->sumsq(x_d, n) == got, "two runs of sumsq differ");
    ck_assert_msg(be->sumsq(x_d, 0) == 0.0, "sumsq of nothing");
    free(x);
}
END_TEST

// ---- the probe -------------------------------------------------------------

// Open cuda in a child process (CUDA must not be set up before Check forks
// the tests): 1 when it works, else 0 with the reason in s_why.
static int s_probe(void)
{
    int fd[2];
    if (pipe(fd) != 0)
        return 0;
    pid_t pid = fork();
    if (pid == 0) {
        char err[1024] = "";
        blas_backend_t *be = blas_backend_open("cuda", 1, err, sizeof err);
        if (!be && write(fd[1], err, strlen(err)) < 0)
            _exit(2);
        _exit(be ? 0 : 1);
    }
    close(fd[1]);
    ssize_t got = pid > 0 ? read(fd[0], s_why, sizeof s_why - 1) : -1;
    s_why[got > 0 ? got : 0] = '\0';
    close(fd[0]);
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid)
        snprintf(s_why, sizeof s_why, "cannot run the probe");
    else if (!WIFEXITED(status) && !s_why[0])
        snprintf(s_why, sizeof s_why, "the probe died of signal %d", WTERMSIG(status));
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

int main(void)
{
    s_gpu = s_probe();
    if (!s_gpu)
        printf("SKIP: check_cuda: %s\n", s_why);
    Suite *s = suite_create("cuda");
    TCase *tc = tcase_create("memory");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_cuda_backend_fills_every_op_and_field);
    tcase_add_test(tc, test_cuda_memory_round_trips_and_has_no_host_view);
    tcase_add_test(tc, test_cuda_allocation_beyond_memory_fails_and_the_backend_goes_on);
    suite_add_tcase(s, tc);
    tc = tcase_create("ops");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_cuda_encoder_matches_the_cpu, 0, 2);
    tcase_add_loop_test(tc, test_cuda_layernorm_matches_the_cpu, 0, 2);
    tcase_add_loop_test(tc, test_cuda_matmul_matches_the_cpu, 0, 4);
    tcase_add_loop_test(tc, test_cuda_attention_matches_the_cpu, 0, 3);
    tcase_add_loop_test(tc, test_cuda_gelu_and_add_match_the_cpu, 0, 2);
    tcase_add_loop_test(tc, test_cuda_crossentropy_matches_the_cpu, 0, 2);
    tcase_add_loop_test(tc, test_cuda_sumsq_matches_the_cpu_in_double, 0, 2);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
