/* check_blas.c - the CPU compute backend (blas/cpu.c): every op with a
 * backward against central finite differences of a scalar objective, every
 * forward against plain double-precision loops, the accumulate/overwrite
 * contract of each backward, memory round trips, opening by name and the
 * thread count.
 *
 * Opening by name is tested with a stand-in plugin (tests/fake_cuda.c); the
 * CUDA ops are held to these CPU ops by check_cuda, and speed by bench_gemm.
 */
#include "blas.h"
#include "backend_ops.h"

#include <check.h>
#include <dlfcn.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// Sizes of the small problems: B batch, T time, C channels, H heads,
// V vocabulary, N = B*T rows, OC output channels.
enum { B = 2, T = 5, C = 8, H = 2, V = 11, N = B * T, OC = 12 };

#define FD_ALL 256     // tensors up to this size are checked element by element
#define FD_SAMPLES 40  // elements checked in a larger tensor
#define FD_TOL 1e-2    // normalised error allowed (float32 forward, double FD)
#define GARBAGE 777.0f // value to pre-fill a buffer that must be overwritten

// ---- helpers ---------------------------------------------------------------

// uniform in [-1, 1) from a splitmix64 stream
static float s_rand(uint64_t *state)
{
    *state += 0x9E3779B97F4A7C15ull;
    uint64_t z = *state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float) ((double) (z >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static float *s_alloc(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof(float));
    ck_assert_ptr_nonnull(p);
    return p;
}

static float *s_random(size_t n, uint64_t *state, float scale, float offset)
{
    float *p = s_alloc(n);
    for (size_t i = 0; i < n; i++)
        p[i] = offset + scale * s_rand(state);
    return p;
}

static void s_fill(float *p, size_t n, float value)
{
    for (size_t i = 0; i < n; i++)
        p[i] = value;
}

static double s_dot(const float *a, const float *b, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double) a[i] * b[i];
    return s;
}

// max |a - b| / max(max |b|, floor): the error of a against reference b
static double s_norm_err(const float *a, const double *b, size_t n, double floor)
{
    double err = 0.0, mag = floor;
    for (size_t i = 0; i < n; i++) {
        err = fmax(err, fabs((double) a[i] - b[i]));
        mag = fmax(mag, fabs(b[i]));
    }
    return err / mag;
}

static double s_norm_err_f(const float *a, const float *b, size_t n, double floor)
{
    double err = 0.0, mag = floor;
    for (size_t i = 0; i < n; i++) {
        err = fmax(err, fabs((double) a[i] - b[i]));
        mag = fmax(mag, fabs((double) b[i]));
    }
    return err / mag;
}

// got[i] == before[i] + fresh[i] in float, for every i: a backward adds its
// gradient to what a buffer holds with one rounding, so that two
// micro-batches accumulated in one replica's buffer round as their two
// gradients made apart and added (the router's sum of two replicas' shares)
static void s_assert_added(const char *what, const float *got, const float *before,
                           const float *fresh, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float want = before[i] + fresh[i];
        ck_assert_msg(memcmp(&got[i], &want, sizeof want) == 0,
                      "%s[%zu] = %.9g, want %.9g + %.9g = %.9g", what, i, got[i], before[i],
                      fresh[i], want);
    }
}

// A scalar objective of the op's inputs, computed in double from the float
// forward; ctx holds the inputs (perturbed in place) and scratch buffers.
typedef double (*s_objective_fn)(void *ctx);

typedef struct {
    double err;   // max |num - ana| / max(max |ana|, 1e-3)
    size_t worst; // index of the largest |num - ana|
    double num;   // finite difference there
    double ana;   // analytic gradient there
} s_fd_t;

// Central differences of f with respect to x (n elements: all when n <= FD_ALL,
// else FD_SAMPLES random ones), against the analytic gradient ana.
static s_fd_t s_fd_check(s_objective_fn f, void *ctx, float *x, size_t n,
                         const float *ana, float eps, uint64_t *state)
{
    s_fd_t r = { 0.0, 0, 0.0, 0.0 };
    double mag = 1e-3, worst = -1.0;
    for (size_t i = 0; i < n; i++)
        mag = fmax(mag, fabs((double) ana[i]));
    size_t count = n <= FD_ALL ? n : FD_SAMPLES;
    for (size_t j = 0; j < count; j++) {
        size_t i = n <= FD_ALL ? j : (size_t) ((s_rand(state) + 1.0f) * 0.5f * (float) n) % n;
        float x0 = x[i];
        float xp = x0 + eps, xm = x0 - eps;
        x[i] = xp;
        double fp = f(ctx);
        x[i] = xm;
        double fm = f(ctx);
        x[i] = x0;
        // divide by the step the floats really took
        double num = (fp - fm) / ((double) xp - (double) xm);
        double d = fabs(num - ana[i]);
        if (d > worst) {
            worst = d;
            r.worst = i;
            r.num = num;
            r.ana = ana[i];
        }
    }
    r.err = worst / mag;
    return r;
}

#define ck_assert_fd(r, what)                                                          \
    ck_assert_msg((r).err <= FD_TOL,                                                   \
                  "%s: normalised error %.3g > %g (element %zu: numeric %.6g, analytic %.6g)", \
                  (what), (r).err, FD_TOL, (r).worst, (r).num, (r).ana)

// ---- memory ----------------------------------------------------------------

START_TEST(test_cpu_backend_fills_every_op_and_field)
{
    blas_backend_t *be = blas_cpu_backend(1);
    ck_assert_ptr_nonnull(be);
    ck_assert_int_eq(be->api_version, BLAS_API_VERSION);
    ck_assert_str_eq(be->name, "cpu");
    ck_assert_msg(strlen(be->device) > 0, "device description is empty");
    ck_assert_msg(be->memory > 0, "memory is 0");
    ck_assert_int_eq(be->threads, 1);
    s_assert_every_op(be);
}
END_TEST

START_TEST(test_upload_download_zero_and_host_ptr_round_trip)
{
    blas_backend_t *be = blas_cpu_backend(1);
    enum { COUNT = 1000 };
    float src[COUNT], back[COUNT];
    uint64_t st = 1;
    for (int i = 0; i < COUNT; i++)
        src[i] = s_rand(&st) * 100.0f;
    void *buf = NULL;
    ck_assert_int_eq(be->buf_alloc(be, sizeof src, &buf), 0);
    ck_assert_ptr_nonnull(buf);
    ck_assert_int_eq(be->upload(be, buf, src, sizeof src), 0);
    memset(back, 0, sizeof back);
    ck_assert_int_eq(be->download(be, back, buf, sizeof back), 0);
    ck_assert_msg(memcmp(src, back, sizeof src) == 0, "download differs from upload");
    ck_assert_int_eq(be->sync(be), 0);
    // the host view shows the same bytes
    ck_assert_ptr_nonnull(be->host_ptr);
    const float *host = be->host_ptr(be, buf);
    ck_assert_ptr_nonnull(host);
    ck_assert_msg(memcmp(host, src, sizeof src) == 0, "host_ptr view differs from upload");
    // a partial upload changes only its bytes
    float seven[10];
    s_fill(seven, 10, 7.0f);
    ck_assert_int_eq(be->upload(be, (float *) buf + 100, seven, sizeof seven), 0);
    ck_assert_int_eq(be->download(be, back, buf, sizeof back), 0);
    for (int i = 0; i < COUNT; i++)
        ck_assert_msg(back[i] == (i >= 100 && i < 110 ? 7.0f : src[i]),
                      "element %d after partial upload: %g", i, back[i]);
    be->zero(be, buf, sizeof src);
    ck_assert_int_eq(be->download(be, back, buf, sizeof back), 0);
    for (int i = 0; i < COUNT; i++)
        ck_assert_msg(back[i] == 0.0f, "element %d after zero: %g", i, back[i]);
    be->buf_free(be, buf);
    // a zero-byte allocation is still a valid buffer
    void *empty = NULL;
    ck_assert_int_eq(be->buf_alloc(be, 0, &empty), 0);
    ck_assert_ptr_nonnull(empty);
    be->buf_free(be, empty);
}
END_TEST

// ---- open ------------------------------------------------------------------

// The folder of this test runner, where the build puts the plugins.
static const char *s_build_dir(void)
{
    static char dir[4096];
    ssize_t n = readlink("/proc/self/exe", dir, sizeof dir - 1);
    ck_assert_msg(n > 0, "readlink /proc/self/exe");
    dir[n] = '\0';
    *strrchr(dir, '/') = '\0';
    return dir;
}

// SWARM_CUDA_PLUGIN = fake-cuda.so (tests/fake_cuda.c) doing `mode`
static void s_fake_plugin(const char *mode)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/fake-cuda.so", s_build_dir());
    ck_assert_msg(access(path, R_OK) == 0, "%s missing: make builds it with the tests", path);
    setenv("SWARM_CUDA_PLUGIN", path, 1);
    setenv("FAKE_CUDA_MODE", mode, 1);
}

// open `device`, expecting failure with every pattern in the message
static void s_open_fails(const char *device, const char *const *patterns, int count)
{
    char err[1024] = "";
    blas_backend_t *be = blas_backend_open(device, 1, err, sizeof err);
    ck_assert_msg(be == NULL, "open %s gave a backend", device);
    for (int i = 0; i < count; i++)
        ck_assert_msg(strstr(err, patterns[i]) != NULL, "open %s: wanted '%s' in: %s", device,
                      patterns[i], err);
}

START_TEST(test_open_cpu_and_auto_give_the_cpu_backend)
{
    setenv("SWARM_CUDA_PLUGIN", "/nonexistent/swarm-cuda.so", 1);
    const char *names[] = { "cpu", "auto" };
    for (int i = 0; i < 2; i++) {
        char err[1024] = "";
        blas_backend_t *be = blas_backend_open(names[i], 1, err, sizeof err);
        ck_assert_msg(be != NULL, "open %s: %s", names[i], err);
        ck_assert_str_eq(be->name, "cpu");
        ck_assert_int_eq(be->threads, 1);
        if (i == 0)
            ck_assert_msg(err[0] == '\0', "open cpu says: %s", err);
        else
            ck_assert_msg(strstr(err, "device auto: cpu (no CUDA plugin: SWARM_CUDA_PLUGIN="
                                      "/nonexistent/swarm-cuda.so") == err, "auto says: %s", err);
    }
}
END_TEST

START_TEST(test_open_unknown_devices_fail_naming_the_flag_value)
{
    const char *names[] = { "bogus", "cuda:", "cuda:x", "cuda:1x", "cuda0", "cuda:-1", "CPU" };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char want[64];
        snprintf(want, sizeof want, "--device %s: unknown device", names[i]);
        const char *p[] = { want, "auto, cpu or cuda[:N]" };
        s_open_fails(names[i], p, 2);
    }
}
END_TEST

START_TEST(test_open_cuda_without_a_plugin_says_so_and_what_to_do)
{
    setenv("SWARM_CUDA_PLUGIN", "/nonexistent/swarm-cuda.so", 1);
    const char *p[] = { "--device cuda:1: no CUDA plugin: SWARM_CUDA_PLUGIN=/nonexistent",
                        "--device cpu" };
    s_open_fails("cuda:1", p, 2);
}
END_TEST

START_TEST(test_open_cuda_gives_a_cuda_backend_or_the_reason)
{
    // the plugin this build made (or none): works on a GPU machine, says why not elsewhere
    unsetenv("SWARM_CUDA_PLUGIN");
    char err[1024] = "";
    blas_backend_t *be = blas_backend_open("cuda", 1, err, sizeof err);
    if (be) {
        ck_assert_str_eq(be->name, "cuda");
        ck_assert_int_eq(be->api_version, BLAS_API_VERSION);
        ck_assert_msg(be->memory > 0 && strlen(be->device) > 0, "device %s", be->device);
        return;
    }
    ck_assert_msg(strstr(err, "--device cuda: ") == err && (strstr(err, "no CUDA plugin")
                  || strstr(err, "no usable GPU") || strstr(err, "CUDA plugin unusable")),
                  "open cuda: %s", err);
}
END_TEST

START_TEST(test_open_loads_a_plugin_and_sets_its_threads)
{
    s_fake_plugin("ok");
    char err[1024] = "x";
    blas_backend_t *be = blas_backend_open("cuda:3", 1, err, sizeof err);
    ck_assert_msg(be != NULL, "open cuda:3 with the fake plugin: %s", err);
    ck_assert_str_eq(be->device, "fake GPU 3");
    ck_assert_int_eq(be->threads, 1);
    ck_assert_msg(err[0] == '\0', "an explicit device says: %s", err);
    be = blas_backend_open("auto", 1, err, sizeof err);
    ck_assert_msg(be != NULL && !strcmp(be->device, "fake GPU 0"), "auto: %s", err);
    ck_assert_str_eq(err, "device auto: cuda (fake GPU 0)");
}
END_TEST

START_TEST(test_open_refuses_plugins_that_cannot_serve)
{
    // _i: 0 no device, 1 the plugin refuses our version, 2 its table has another
    // version, 3 not a shared object, 4 a shared object without the entry point
    static const char *modes[] = { "nodevice", "version", "table" };
    static const char *want[] = { "no usable GPU: cuda:0: fake has no device",
                                  "CUDA plugin unusable: API version", "CUDA plugin unusable: its table",
                                  "CUDA plugin unusable: ", "CUDA plugin unusable: " };
    char path[4200];
    if (_i < 3) {
        s_fake_plugin(modes[_i]);
    } else if (_i == 3) {
        snprintf(path, sizeof path, "%s/check_blas.txt", s_build_dir());
        FILE *f = fopen(path, "w");
        ck_assert_ptr_nonnull(f);
        fputs("not a shared object\n", f);
        fclose(f);
        setenv("SWARM_CUDA_PLUGIN", path, 1);
    } else {
        Dl_info lib; // the C math library: a shared object without our entry point
        ck_assert_msg(dladdr((void *) &cos, &lib) && lib.dli_fname, "dladdr(cos)");
        setenv("SWARM_CUDA_PLUGIN", lib.dli_fname, 1);
    }
    const char *p[] = { "--device cuda: ", want[_i], "--device cpu" };
    s_open_fails("cuda", p, 3);
    char err[1024] = "";
    blas_backend_t *be = blas_backend_open("auto", 1, err, sizeof err);
    ck_assert_msg(be && !strcmp(be->name, "cpu"), "auto did not fall back to the cpu: %s", err);
    ck_assert_msg(strstr(err, "device auto: cpu (") == err && strstr(err, want[_i]),
                  "auto says: %s", err);
    if (_i == 4)
        ck_assert_msg(strstr(err, "no blas_cuda_open()"), "auto says: %s", err);
    if (_i == 3)
        unlink(path);
}
END_TEST

// ---- threads ---------------------------------------------------------------

START_TEST(test_thread_count_is_honoured_and_results_agree)
{
    enum { MN = 64, MC = 96, MOC = 80 };
    uint64_t st = 11;
    float *inp = s_random((size_t) MN * MC, &st, 1.0f, 0.0f);
    float *w = s_random((size_t) MOC * MC, &st, 1.0f, 0.0f);
    float *bias = s_random(MOC, &st, 1.0f, 0.0f);
    float *out1 = s_alloc((size_t) MN * MOC), *out2 = s_alloc((size_t) MN * MOC);

    blas_backend_t *be = blas_cpu_backend(1);
    ck_assert_int_eq(be->threads, 1);
    ck_assert_int_eq(omp_get_max_threads(), 1);
    be->matmul_forward(out1, inp, w, bias, MN, MC, MOC);

    be = blas_cpu_backend(2);
    ck_assert_int_eq(be->threads, 2);
    ck_assert_int_eq(omp_get_max_threads(), 2);
    ck_assert_msg(strstr(be->device, "2 threads") != NULL, "device says: %s", be->device);
    be->matmul_forward(out2, inp, w, bias, MN, MC, MOC);

    double err = s_norm_err_f(out2, out1, (size_t) MN * MOC, 1e-3);
    ck_assert_msg(err <= 1e-6, "1 and 2 threads differ: normalised error %.3g", err);
    free(inp), free(w), free(bias), free(out1), free(out2);
}
END_TEST

// ---- encoder ---------------------------------------------------------------

typedef struct {
    blas_backend_t *be;
    int32_t tokens[N];
    float *wte, *wpe, *out, *r;
} s_encoder_t;

static double s_encoder_objective(void *p)
{
    s_encoder_t *e = p;
    e->be->encoder_forward(e->out, e->tokens, e->wte, e->wpe, B, T, C);
    return s_dot(e->out, e->r, (size_t) N * C);
}

static void s_encoder_init(s_encoder_t *e, uint64_t *st)
{
    e->be = blas_cpu_backend(1);
    // tokens 0..V-1 with repeats (rows that share a token must add up)
    static const int32_t tok[N] = { 3, 7, 3, 0, 10, 7, 7, 1, 3, 10 };
    memcpy(e->tokens, tok, sizeof tok);
    e->wte = s_random((size_t) V * C, st, 1.0f, 0.0f);
    e->wpe = s_random((size_t) T * C, st, 1.0f, 0.0f);
    e->out = s_alloc((size_t) N * C);
    e->r = s_random((size_t) N * C, st, 1.0f, 0.0f);
}

static void s_encoder_free(s_encoder_t *e)
{
    free(e->wte), free(e->wpe), free(e->out), free(e->r);
}

START_TEST(test_encoder_forward_adds_token_and_position_rows)
{
    uint64_t st = 21;
    s_encoder_t e;
    s_encoder_init(&e, &st);
    s_fill(e.out, (size_t) N * C, GARBAGE);
    e.be->encoder_forward(e.out, e.tokens, e.wte, e.wpe, B, T, C);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++) {
                float want = e.wte[e.tokens[b * T + t] * C + c] + e.wpe[t * C + c];
                float got = e.out[(b * T + t) * C + c];
                ck_assert_msg(got == want, "out[%d,%d,%d] = %g, want %g", b, t, c, got, want);
            }
    s_encoder_free(&e);
}
END_TEST

START_TEST(test_encoder_backward_matches_finite_differences)
{
    uint64_t st = 22;
    s_encoder_t e;
    s_encoder_init(&e, &st);
    float *dwte = s_alloc((size_t) V * C), *dwpe = s_alloc((size_t) T * C);
    e.be->encoder_backward(dwte, dwpe, e.r, e.tokens, B, T, C);
    s_fd_t r = s_fd_check(s_encoder_objective, &e, e.wte, (size_t) V * C, dwte, 1e-2f, &st);
    ck_assert_fd(r, "encoder dwte");
    r = s_fd_check(s_encoder_objective, &e, e.wpe, (size_t) T * C, dwpe, 1e-2f, &st);
    ck_assert_fd(r, "encoder dwpe");
    free(dwte), free(dwpe);
    s_encoder_free(&e);
}
END_TEST

START_TEST(test_encoder_backward_adds_its_gradient_with_one_rounding)
{
    uint64_t st = 23;
    s_encoder_t e;
    s_encoder_init(&e, &st);
    float *fresh_te = s_alloc((size_t) V * C), *fresh_pe = s_alloc((size_t) T * C);
    e.be->encoder_backward(fresh_te, fresh_pe, e.r, e.tokens, B, T, C);
    float *dwte = s_random((size_t) V * C, &st, 1.0f, 0.0f);
    float *dwpe = s_random((size_t) T * C, &st, 1.0f, 0.0f);
    float *was_te = malloc(sizeof(float) * V * C), *was_pe = malloc(sizeof(float) * T * C);
    memcpy(was_te, dwte, sizeof(float) * V * C);
    memcpy(was_pe, dwpe, sizeof(float) * T * C);
    e.be->encoder_backward(dwte, dwpe, e.r, e.tokens, B, T, C);
    s_assert_added("dwte", dwte, was_te, fresh_te, (size_t) V * C);
    s_assert_added("dwpe", dwpe, was_pe, fresh_pe, (size_t) T * C);
    // the rows as two micro-batches (tokens 3, 7 and 10 in both, 3 and 7
    // twice in one): accumulated, the bits of the two made apart and added
    float *one_te[2], *one_pe[2];
    float *acc_te = s_alloc((size_t) V * C), *acc_pe = s_alloc((size_t) T * C);
    for (int k = 0; k < 2; k++) {
        one_te[k] = s_alloc((size_t) V * C), one_pe[k] = s_alloc((size_t) T * C);
        e.be->encoder_backward(one_te[k], one_pe[k], e.r + (size_t) k * T * C, e.tokens + k * T,
                               1, T, C);
        e.be->encoder_backward(acc_te, acc_pe, e.r + (size_t) k * T * C, e.tokens + k * T, 1, T,
                               C);
    }
    s_assert_added("two micro-batches' dwte", acc_te, one_te[0], one_te[1], (size_t) V * C);
    s_assert_added("two micro-batches' dwpe", acc_pe, one_pe[0], one_pe[1], (size_t) T * C);
    for (int k = 0; k < 2; k++)
        free(one_te[k]), free(one_pe[k]);
    free(acc_te), free(acc_pe), free(was_te), free(was_pe);
    free(fresh_te), free(fresh_pe), free(dwte), free(dwpe);
    s_encoder_free(&e);
}
END_TEST

// ---- layernorm -------------------------------------------------------------

typedef struct {
    blas_backend_t *be;
    float *inp, *weight, *bias, *out, *mean, *rstd, *r;
} s_layernorm_t;

static double s_layernorm_objective(void *p)
{
    s_layernorm_t *l = p;
    l->be->layernorm_forward(l->out, l->mean, l->rstd, l->inp, l->weight, l->bias, N, C);
    return s_dot(l->out, l->r, (size_t) N * C);
}

static void s_layernorm_init(s_layernorm_t *l, uint64_t *st)
{
    l->be = blas_cpu_backend(1);
    l->inp = s_random((size_t) N * C, st, 2.0f, 0.5f);
    l->weight = s_random(C, st, 0.5f, 1.0f);
    l->bias = s_random(C, st, 0.5f, 0.0f);
    l->out = s_alloc((size_t) N * C);
    l->mean = s_alloc(N);
    l->rstd = s_alloc(N);
    l->r = s_random((size_t) N * C, st, 1.0f, 0.0f);
}

static void s_layernorm_free(s_layernorm_t *l)
{
    free(l->inp), free(l->weight), free(l->bias), free(l->out);
    free(l->mean), free(l->rstd), free(l->r);
}

START_TEST(test_layernorm_forward_matches_double_reference)
{
    uint64_t st = 31;
    s_layernorm_t l;
    s_layernorm_init(&l, &st);
    l.be->layernorm_forward(l.out, l.mean, l.rstd, l.inp, l.weight, l.bias, N, C);
    double want[N * C], want_mean[N], want_rstd[N];
    for (int n = 0; n < N; n++) {
        const float *x = l.inp + n * C;
        double m = 0.0, v = 0.0;
        for (int c = 0; c < C; c++)
            m += x[c];
        m /= C;
        for (int c = 0; c < C; c++)
            v += (x[c] - m) * (x[c] - m);
        v /= C;
        double s = 1.0 / sqrt(v + 1e-5);
        for (int c = 0; c < C; c++)
            want[n * C + c] = (x[c] - m) * s * l.weight[c] + l.bias[c];
        want_mean[n] = m;
        want_rstd[n] = s;
    }
    double err = s_norm_err(l.out, want, (size_t) N * C, 1e-3);
    ck_assert_msg(err <= 1e-5, "out: normalised error %.3g", err);
    err = s_norm_err(l.mean, want_mean, N, 1e-3);
    ck_assert_msg(err <= 1e-5, "mean: normalised error %.3g", err);
    err = s_norm_err(l.rstd, want_rstd, N, 1e-3);
    ck_assert_msg(err <= 1e-5, "rstd: normalised error %.3g", err);
    s_layernorm_free(&l);
}
END_TEST

START_TEST(test_layernorm_backward_matches_finite_differences)
{
    uint64_t st = 32;
    s_layernorm_t l;
    s_layernorm_init(&l, &st);
    l.be->layernorm_forward(l.out, l.mean, l.rstd, l.inp, l.weight, l.bias, N, C);
    float *dinp = s_alloc((size_t) N * C), *dw = s_alloc(C), *db = s_alloc(C);
    l.be->layernorm_backward(dinp, dw, db, l.r, l.inp, l.weight, l.mean, l.rstd, N, C);
    s_fd_t r = s_fd_check(s_layernorm_objective, &l, l.inp, (size_t) N * C, dinp, 1e-2f, &st);
    ck_assert_fd(r, "layernorm dinp");
    r = s_fd_check(s_layernorm_objective, &l, l.weight, C, dw, 1e-2f, &st);
    ck_assert_fd(r, "layernorm dweight");
    r = s_fd_check(s_layernorm_objective, &l, l.bias, C, db, 1e-2f, &st);
    ck_assert_fd(r, "layernorm dbias");
    free(dinp), free(dw), free(db);
    s_layernorm_free(&l);
}
END_TEST

START_TEST(test_layernorm_backward_adds_to_every_gradient_with_one_rounding)
{
    uint64_t st = 33;
    s_layernorm_t l;
    s_layernorm_init(&l, &st);
    l.be->layernorm_forward(l.out, l.mean, l.rstd, l.inp, l.weight, l.bias, N, C);
    float *f_inp = s_alloc((size_t) N * C), *f_w = s_alloc(C), *f_b = s_alloc(C);
    l.be->layernorm_backward(f_inp, f_w, f_b, l.r, l.inp, l.weight, l.mean, l.rstd, N, C);
    float *dinp = s_random((size_t) N * C, &st, 1.0f, 0.0f);
    float *dw = s_random(C, &st, 1.0f, 0.0f), *db = s_random(C, &st, 1.0f, 0.0f);
    float was_inp[N * C], was_w[C], was_b[C];
    memcpy(was_inp, dinp, sizeof was_inp);
    memcpy(was_w, dw, sizeof was_w);
    memcpy(was_b, db, sizeof was_b);
    l.be->layernorm_backward(dinp, dw, db, l.r, l.inp, l.weight, l.mean, l.rstd, N, C);
    s_assert_added("dinp", dinp, was_inp, f_inp, (size_t) N * C);
    s_assert_added("dweight", dw, was_w, f_w, C);
    s_assert_added("dbias", db, was_b, f_b, C);
    free(f_inp), free(f_w), free(f_b), free(dinp), free(dw), free(db);
    s_layernorm_free(&l);
}
END_TEST

// ---- matmul ----------------------------------------------------------------

typedef struct {
    blas_backend_t *be;
    int n, c, oc;
    float *inp, *weight, *bias, *out, *r; // bias may be NULL
} s_matmul_t;

static double s_matmul_objective(void *p)
{
    s_matmul_t *m = p;
    m->be->matmul_forward(m->out, m->inp, m->weight, m->bias, m->n, m->c, m->oc);
    return s_dot(m->out, m->r, (size_t) m->n * m->oc);
}

static void s_matmul_init(s_matmul_t *m, int n, int c, int oc, int with_bias, uint64_t *st)
{
    m->be = blas_cpu_backend(1);
    m->n = n, m->c = c, m->oc = oc;
    m->inp = s_random((size_t) n * c, st, 1.0f, 0.0f);
    m->weight = s_random((size_t) oc * c, st, 1.0f, 0.0f);
    m->bias = with_bias ? s_random(oc, st, 1.0f, 0.0f) : NULL;
    m->out = s_alloc((size_t) n * oc);
    m->r = s_random((size_t) n * oc, st, 1.0f, 0.0f);
}

static void s_matmul_free(s_matmul_t *m)
{
    free(m->inp), free(m->weight), free(m->bias), free(m->out), free(m->r);
}

// out = inp @ weight^T + bias in double
static void s_matmul_reference(const s_matmul_t *m, double *want)
{
    for (int n = 0; n < m->n; n++)
        for (int o = 0; o < m->oc; o++) {
            double s = m->bias ? m->bias[o] : 0.0;
            for (int c = 0; c < m->c; c++)
                s += (double) m->inp[n * m->c + c] * m->weight[o * m->c + c];
            want[n * m->oc + o] = s;
        }
}

START_TEST(test_matmul_forward_matches_double_reference_with_and_without_bias)
{
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        uint64_t st = 41;
        s_matmul_t m;
        s_matmul_init(&m, 33, 24, 70, with_bias, &st);
        s_fill(m.out, (size_t) m.n * m.oc, GARBAGE); // out is overwritten
        m.be->matmul_forward(m.out, m.inp, m.weight, m.bias, m.n, m.c, m.oc);
        double *want = calloc((size_t) m.n * m.oc, sizeof(double));
        s_matmul_reference(&m, want);
        double err = s_norm_err(m.out, want, (size_t) m.n * m.oc, 1e-3);
        ck_assert_msg(err <= 1e-5, "bias %d: normalised error %.3g", with_bias, err);
        free(want);
        s_matmul_free(&m);
    }
}
END_TEST

START_TEST(test_matmul_backward_matches_finite_differences)
{
    // _i = 0: with bias, 1: without bias, 2: with bias and dinp NULL
    uint64_t st = 42 + (uint64_t) _i;
    s_matmul_t m;
    s_matmul_init(&m, N, C, OC, _i != 1, &st);
    float *dinp = s_alloc((size_t) N * C), *dw = s_alloc((size_t) OC * C);
    float *db = _i != 1 ? s_alloc(OC) : NULL;
    m.be->matmul_backward(_i == 2 ? NULL : dinp, dw, db, m.r, m.inp, m.weight, N, C, OC);
    s_fd_t r;
    if (_i != 2) {
        r = s_fd_check(s_matmul_objective, &m, m.inp, (size_t) N * C, dinp, 1e-2f, &st);
        ck_assert_fd(r, "matmul dinp");
    } else {
        for (int i = 0; i < N * C; i++)
            ck_assert_msg(dinp[i] == 0.0f, "dinp NULL but dinp[%d] written", i);
    }
    r = s_fd_check(s_matmul_objective, &m, m.weight, (size_t) OC * C, dw, 1e-2f, &st);
    ck_assert_fd(r, "matmul dweight");
    if (db) {
        r = s_fd_check(s_matmul_objective, &m, m.bias, OC, db, 1e-2f, &st);
        ck_assert_fd(r, "matmul dbias");
    }
    free(dinp), free(dw), free(db);
    s_matmul_free(&m);
}
END_TEST

START_TEST(test_matmul_backward_wide_bias_sums_every_column)
{
    // OC = 150 crosses the 64-column blocks of the bias sum
    enum { WN = 33, WC = 24, WOC = 150 };
    uint64_t st = 45;
    s_matmul_t m;
    s_matmul_init(&m, WN, WC, WOC, 1, &st);
    float *dinp = s_alloc((size_t) WN * WC), *dw = s_alloc((size_t) WOC * WC), *db = s_alloc(WOC);
    m.be->matmul_backward(dinp, dw, db, m.r, m.inp, m.weight, WN, WC, WOC);
    double *want_db = calloc(WOC, sizeof(double));
    double *want_dw = calloc((size_t) WOC * WC, sizeof(double));
    double *want_dinp = calloc((size_t) WN * WC, sizeof(double));
    for (int n = 0; n < WN; n++)
        for (int o = 0; o < WOC; o++) {
            double d = m.r[n * WOC + o];
            want_db[o] += d;
            for (int c = 0; c < WC; c++) {
                want_dw[o * WC + c] += d * m.inp[n * WC + c];
                want_dinp[n * WC + c] += d * m.weight[o * WC + c];
            }
        }
    double err = s_norm_err(db, want_db, WOC, 1e-3);
    ck_assert_msg(err <= 1e-5, "dbias: normalised error %.3g", err);
    err = s_norm_err(dw, want_dw, (size_t) WOC * WC, 1e-3);
    ck_assert_msg(err <= 1e-5, "dweight: normalised error %.3g", err);
    err = s_norm_err(dinp, want_dinp, (size_t) WN * WC, 1e-3);
    ck_assert_msg(err <= 1e-5, "dinp: normalised error %.3g", err);
    free(dinp), free(dw), free(db), free(want_db), free(want_dw), free(want_dinp);
    s_matmul_free(&m);
}
END_TEST

START_TEST(test_matmul_backward_adds_weight_and_bias_gradients_and_overwrites_dinp)
{
    uint64_t st = 46;
    s_matmul_t m;
    s_matmul_init(&m, N, C, 70, 1, &st);
    int oc = m.oc;
    float *f_inp = s_alloc((size_t) N * C), *f_w = s_alloc((size_t) oc * C), *f_b = s_alloc(oc);
    m.be->matmul_backward(f_inp, f_w, f_b, m.r, m.inp, m.weight, N, C, oc);
    float *dinp = s_alloc((size_t) N * C);
    s_fill(dinp, (size_t) N * C, GARBAGE);
    float *dw = s_random((size_t) oc * C, &st, 1.0f, 0.0f), *db = s_random(oc, &st, 1.0f, 0.0f);
    float *was_w = malloc(sizeof(float) * oc * C), *was_b = malloc(sizeof(float) * oc);
    memcpy(was_w, dw, sizeof(float) * oc * C);
    memcpy(was_b, db, sizeof(float) * oc);
    m.be->matmul_backward(dinp, dw, db, m.r, m.inp, m.weight, N, C, oc);
    double err = s_norm_err_f(dinp, f_inp, (size_t) N * C, 1e-3);
    ck_assert_msg(err <= 1e-6, "dinp was not overwritten: error %.3g", err);
    // with one rounding while the product's rows fit one of OpenBLAS's
    // blocks (docs/numerics.md)
    s_assert_added("dweight", dw, was_w, f_w, (size_t) oc * C);
    s_assert_added("dbias", db, was_b, f_b, oc);
    free(f_inp), free(f_w), free(f_b), free(dinp), free(dw), free(db), free(was_w), free(was_b);
    s_matmul_free(&m);
}
END_TEST

// ---- attention -------------------------------------------------------------

// heads per loop index of the attention tests; C = 4 * heads keeps hs = 4,
// except the last (C = 8, one head of 8)
static const int s_att_heads[] = { 2, 4, 1 };
static const int s_att_channels[] = { 8, 16, 8 };

typedef struct {
    blas_backend_t *be;
    int c, h;
    float *qkv, *out, *att, *r; // (B,T,3C), (B,T,C), (B,H,T,T), (B,T,C)
} s_attention_t;

static double s_attention_objective(void *p)
{
    s_attention_t *a = p;
    a->be->attention_forward(a->out, a->att, a->qkv, B, T, a->c, a->h);
    return s_dot(a->out, a->r, (size_t) N * a->c);
}

static void s_attention_init(s_attention_t *a, int i, uint64_t *st)
{
    a->be = blas_cpu_backend(1);
    a->h = s_att_heads[i];
    a->c = s_att_channels[i];
    a->qkv = s_random((size_t) N * 3 * a->c, st, 1.5f, 0.0f);
    a->out = s_alloc((size_t) N * a->c);
    a->att = s_alloc((size_t) B * a->h * T * T);
    a->r = s_random((size_t) N * a->c, st, 1.0f, 0.0f);
}

static void s_attention_free(s_attention_t *a)
{
    free(a->qkv), free(a->out), free(a->att), free(a->r);
}

// causal multi-head attention in double: out (B,T,C), att (B,H,T,T)
static void s_attention_reference(const s_attention_t *a, double *out, double *att)
{
    int c3 = 3 * a->c, hs = a->c / a->h;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < a->h; h++)
            for (int t = 0; t < T; t++) {
                const float *q = a->qkv + (b * T + t) * c3 + h * hs;
                double *p = att + ((size_t) (b * a->h + h) * T + t) * T;
                double mx = -INFINITY, sum = 0.0;
                for (int u = 0; u < T; u++) {
                    const float *k = a->qkv + (b * T + u) * c3 + a->c + h * hs;
                    double s = 0.0;
                    for (int i = 0; i < hs; i++)
                        s += (double) q[i] * k[i];
                    p[u] = s / sqrt((double) hs);
                    if (u <= t)
                        mx = fmax(mx, p[u]);
                }
                for (int u = 0; u < T; u++) {
                    p[u] = u <= t ? exp(p[u] - mx) : 0.0;
                    sum += p[u];
                }
                for (int u = 0; u < T; u++)
                    p[u] /= sum;
                for (int i = 0; i < hs; i++) {
                    double o = 0.0;
                    for (int u = 0; u <= t; u++)
                        o += p[u] * a->qkv[(b * T + u) * c3 + 2 * a->c + h * hs + i];
                    out[(b * T + t) * a->c + h * hs + i] = o;
                }
            }
}

START_TEST(test_attention_forward_matches_causal_double_reference)
{
    uint64_t st = 51 + (uint64_t) _i;
    s_attention_t a;
    s_attention_init(&a, _i, &st);
    size_t natt = (size_t) B * a.h * T * T;
    s_fill(a.att, natt, GARBAGE);
    s_fill(a.out, (size_t) N * a.c, GARBAGE);
    a.be->attention_forward(a.out, a.att, a.qkv, B, T, a.c, a.h);
    double *want = calloc((size_t) N * a.c, sizeof(double)), *want_att = calloc(natt, sizeof(double));
    s_attention_reference(&a, want, want_att);
    double err = s_norm_err(a.out, want, (size_t) N * a.c, 1e-3);
    ck_assert_msg(err <= 1e-5, "H %d: out normalised error %.3g", a.h, err);
    err = s_norm_err(a.att, want_att, natt, 1e-3);
    ck_assert_msg(err <= 1e-5, "H %d: att normalised error %.3g", a.h, err);
    // every softmax row sums to 1 and is exactly 0 above the diagonal
    for (size_t row = 0; row < (size_t) B * a.h * T; row++) {
        int t = (int) (row % T);
        double sum = 0.0;
        for (int u = 0; u < T; u++) {
            float p = a.att[row * T + u];
            if (u > t)
                ck_assert_msg(p == 0.0f, "H %d: att row %zu column %d above the diagonal = %g",
                              a.h, row, u, p);
            ck_assert_msg(p >= 0.0f, "H %d: att row %zu has a negative entry %g", a.h, row, p);
            sum += p;
        }
        ck_assert_msg(fabs(sum - 1.0) <= 1e-5, "H %d: att row %zu sums to %.8f", a.h, row, sum);
    }
    free(want), free(want_att);
    s_attention_free(&a);
}
END_TEST

START_TEST(test_attention_future_key_and_value_leave_earlier_outputs_unchanged)
{
    uint64_t st = 55 + (uint64_t) _i;
    s_attention_t a;
    s_attention_init(&a, _i, &st);
    int c = a.c, c3 = 3 * c;
    float *before = s_alloc((size_t) N * c);
    a.be->attention_forward(before, a.att, a.qkv, B, T, c, a.h);
    for (int t0 = 1; t0 < T; t0++) {
        // new k and v (and q) at time t0 of batch element 0
        for (int i = 0; i < c3; i++)
            a.qkv[t0 * c3 + i] = 5.0f * s_rand(&st);
        a.be->attention_forward(a.out, a.att, a.qkv, B, T, c, a.h);
        for (int t = 0; t < t0; t++)
            for (int i = 0; i < c; i++)
                ck_assert_msg(a.out[t * c + i] == before[t * c + i],
                              "H %d: changing time %d changed out[0,%d,%d]: %g -> %g",
                              a.h, t0, t, i, before[t * c + i], a.out[t * c + i]);
        // the other batch element never sees batch element 0
        for (int i = T * c; i < N * c; i++)
            ck_assert_msg(a.out[i] == before[i], "H %d: batch 1 changed at %d", a.h, i);
        int changed = 0;
        for (int i = 0; i < c; i++)
            changed |= a.out[t0 * c + i] != before[t0 * c + i];
        ck_assert_msg(changed, "H %d: changing time %d left its own output unchanged", a.h, t0);
        memcpy(before, a.out, sizeof(float) * (size_t) N * c);
    }
    free(before);
    s_attention_free(&a);
}
END_TEST

START_TEST(test_attention_backward_matches_finite_differences)
{
    uint64_t st = 58 + (uint64_t) _i;
    s_attention_t a;
    s_attention_init(&a, _i, &st);
    size_t nqkv = (size_t) N * 3 * a.c, natt = (size_t) B * a.h * T * T;
    a.be->attention_forward(a.out, a.att, a.qkv, B, T, a.c, a.h);
    float *dqkv = s_alloc(nqkv), *datt = s_alloc(natt);
    a.be->attention_backward(dqkv, datt, a.r, a.qkv, a.att, B, T, a.c, a.h);
    s_fd_t r = s_fd_check(s_attention_objective, &a, a.qkv, nqkv, dqkv, 1e-2f, &st);
    ck_assert_msg(r.err <= FD_TOL,
                  "H %d: attention dqkv normalised error %.3g (element %zu: numeric %.6g, analytic %.6g)",
                  a.h, r.err, r.worst, r.num, r.ana);
    free(dqkv), free(datt);
    s_attention_free(&a);
}
END_TEST

START_TEST(test_attention_backward_overwrites_dqkv_whatever_the_scratch_holds)
{
    uint64_t st = 61 + (uint64_t) _i;
    s_attention_t a;
    s_attention_init(&a, _i, &st);
    size_t nqkv = (size_t) N * 3 * a.c, natt = (size_t) B * a.h * T * T;
    a.be->attention_forward(a.out, a.att, a.qkv, B, T, a.c, a.h);
    float *fresh = s_alloc(nqkv), *dqkv = s_alloc(nqkv), *datt = s_alloc(natt);
    a.be->attention_backward(fresh, datt, a.r, a.qkv, a.att, B, T, a.c, a.h);
    s_fill(dqkv, nqkv, GARBAGE);
    s_fill(datt, natt, -GARBAGE);
    a.be->attention_backward(dqkv, datt, a.r, a.qkv, a.att, B, T, a.c, a.h);
    double err = s_norm_err_f(dqkv, fresh, nqkv, 1e-3);
    ck_assert_msg(err <= 1e-6, "H %d: dqkv not overwritten: error %.3g", a.h, err);
    free(fresh), free(dqkv), free(datt);
    s_attention_free(&a);
}
END_TEST

// ---- gelu ------------------------------------------------------------------

static double s_gelu_reference(double x)
{
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

START_TEST(test_gelu_forward_matches_tanh_formula_over_minus_12_to_12)
{
    blas_backend_t *be = blas_cpu_backend(1);
    enum { COUNT = 10001 }; // more than one parallel chunk
    float *x = s_alloc(COUNT), *out = s_alloc(COUNT);
    for (int i = 0; i < COUNT; i++)
        x[i] = -12.0f + 24.0f * (float) i / (COUNT - 1);
    be->gelu_forward(out, x, COUNT);
    // 1e-6 relative, plus six float ulps (2^-24) of tanh(u) near -1 times
    // 0.5 |x|: for x < 0, 1 + tanh(u) cancels and its rounding dominates (the
    // same in float32 PyTorch; this backend's tanh measures three ulps there)
    double worst = 0.0;
    int at = 0;
    for (int i = 0; i < COUNT; i++) {
        double want = s_gelu_reference(x[i]);
        double tol = 1e-6 * fabs(want) + 1.8e-7 * fabs((double) x[i]) + 1e-30;
        double e = fabs(out[i] - want) / tol;
        if (e > worst)
            worst = e, at = i;
    }
    ck_assert_msg(worst <= 1.0, "gelu(%.6g) = %.9g, want %.9g (error %.3g of tolerance)",
                  x[at], out[at], s_gelu_reference(x[at]), worst);
    free(x), free(out);
}
END_TEST

START_TEST(test_gelu_stays_finite_where_exp_would_overflow)
{
    blas_backend_t *be = blas_cpu_backend(1);
    const float x[] = { -100.0f, -50.0f, -20.0f, -12.0f, 12.0f, 20.0f, 50.0f, 100.0f };
    enum { COUNT = sizeof x / sizeof x[0] };
    float out[COUNT], grad[COUNT], ones[COUNT];
    s_fill(ones, COUNT, 1.0f);
    be->gelu_forward(out, x, COUNT);
    be->gelu_backward(grad, x, ones, COUNT);
    for (int i = 0; i < COUNT; i++) {
        ck_assert_msg(isfinite(out[i]) && isfinite(grad[i]), "gelu(%g) = %g, gelu' = %g",
                      x[i], out[i], grad[i]);
        float want = x[i] > 0 ? x[i] : 0.0f, want_grad = x[i] > 0 ? 1.0f : 0.0f;
        ck_assert_msg(fabsf(out[i] - want) <= 1e-6f * fabsf(x[i]), "gelu(%g) = %g", x[i], out[i]);
        ck_assert_msg(fabsf(grad[i] - want_grad) <= 1e-6f, "gelu'(%g) = %g", x[i], grad[i]);
    }
}
END_TEST

typedef struct {
    blas_backend_t *be;
    size_t n;
    float *x, *out, *r;
} s_gelu_t;

static double s_gelu_objective(void *p)
{
    s_gelu_t *g = p;
    g->be->gelu_forward(g->out, g->x, g->n);
    return s_dot(g->out, g->r, g->n);
}

START_TEST(test_gelu_backward_matches_finite_differences)
{
    uint64_t st = 71;
    s_gelu_t g = { blas_cpu_backend(1), 60, NULL, NULL, NULL };
    g.x = s_random(g.n, &st, 5.0f, 0.0f);
    g.out = s_alloc(g.n);
    g.r = s_random(g.n, &st, 1.0f, 0.0f);
    float *dinp = s_alloc(g.n);
    g.be->gelu_backward(dinp, g.x, g.r, g.n);
    s_fd_t r = s_fd_check(s_gelu_objective, &g, g.x, g.n, dinp, 1e-3f, &st);
    ck_assert_fd(r, "gelu dinp");
    free(g.x), free(g.out), free(g.r), free(dinp);
}
END_TEST

START_TEST(test_gelu_backward_overwrites_dinp)
{
    uint64_t st = 72;
    blas_backend_t *be = blas_cpu_backend(1);
    enum { COUNT = 5000 };
    float *x = s_random(COUNT, &st, 6.0f, 0.0f), *dout = s_random(COUNT, &st, 1.0f, 0.0f);
    float *fresh = s_alloc(COUNT), *dinp = s_alloc(COUNT);
    be->gelu_backward(fresh, x, dout, COUNT);
    s_fill(dinp, COUNT, GARBAGE);
    be->gelu_backward(dinp, x, dout, COUNT);
    double err = s_norm_err_f(dinp, fresh, COUNT, 1e-3);
    ck_assert_msg(err <= 1e-6, "dinp not overwritten: error %.3g", err);
    free(x), free(dout), free(fresh), free(dinp);
}
END_TEST

// ---- crossentropy ----------------------------------------------------------

typedef struct {
    blas_backend_t *be;
    float scale;
    int32_t targets[N];
    float *logits, *work, *losses; // (N,V), (N,V), (N)
} s_xent_t;

// scale * sum(losses), the objective whose gradient crossentropy writes
static double s_xent_objective(void *p)
{
    s_xent_t *x = p;
    memcpy(x->work, x->logits, sizeof(float) * N * V);
    x->be->crossentropy(x->work, x->losses, x->targets, N, V, 0.0f);
    double s = 0.0;
    for (int n = 0; n < N; n++)
        s += x->losses[n];
    return x->scale * s;
}

static void s_xent_init(s_xent_t *x, float scale, float spread, uint64_t *st)
{
    x->be = blas_cpu_backend(1);
    x->scale = scale;
    for (int n = 0; n < N; n++)
        x->targets[n] = (int32_t) ((n * 7 + 3) % V);
    x->logits = s_random((size_t) N * V, st, spread, 0.0f);
    x->work = s_alloc((size_t) N * V);
    x->losses = s_alloc(N);
}

static void s_xent_free(s_xent_t *x)
{
    free(x->logits), free(x->work), free(x->losses);
}

static double s_xent_reference(const float *l, int y)
{
    double mx = l[0], s = 0.0;
    for (int v = 1; v < V; v++)
        mx = fmax(mx, l[v]);
    for (int v = 0; v < V; v++)
        s += exp(l[v] - mx);
    return mx + log(s) - l[y];
}

START_TEST(test_crossentropy_loss_is_logsumexp_minus_target_logit)
{
    uint64_t st = 81;
    s_xent_t x;
    s_xent_init(&x, 0.0f, 3.0f, &st);
    // rows 0..2 carry logits of +-80: the loss must stay finite and exact
    for (int v = 0; v < V; v++) {
        x.logits[0 * V + v] = v == 2 ? 80.0f : -80.0f;
        x.logits[1 * V + v] = v % 2 ? 80.0f : -80.0f;
        x.logits[2 * V + v] = 80.0f;
    }
    x.targets[0] = 2;
    x.targets[1] = 0;
    memcpy(x.work, x.logits, sizeof(float) * N * V);
    x.be->crossentropy(x.work, x.losses, x.targets, N, V, 0.0f);
    ck_assert_msg(memcmp(x.work, x.logits, sizeof(float) * N * V) == 0,
                  "scale 0 changed the logits");
    for (int n = 0; n < N; n++) {
        double want = s_xent_reference(x.logits + n * V, x.targets[n]);
        ck_assert_msg(isfinite(x.losses[n]), "row %d: loss %g", n, x.losses[n]);
        ck_assert_msg(fabs(x.losses[n] - want) <= 1e-5 * fmax(1.0, fabs(want)),
                      "row %d: loss %.9g, want %.9g", n, x.losses[n], want);
    }
    // row 1: target logit -80 against five logits of 80: 160 + log(5)
    ck_assert_msg(fabs(x.losses[1] - (160.0 + log(5.0))) <= 1e-4, "row 1: loss %.9g", x.losses[1]);
    s_xent_free(&x);
}
END_TEST

START_TEST(test_crossentropy_gradient_matches_finite_differences)
{
    // _i = 0: scale 1/N (mean loss), 1: scale 2.5, 2: scale 1/N with logits up to +-80
    static const float scales[] = { 1.0f / N, 2.5f, 1.0f / N };
    static const float spreads[] = { 3.0f, 3.0f, 80.0f };
    uint64_t st = 82 + (uint64_t) _i;
    s_xent_t x;
    s_xent_init(&x, scales[_i], spreads[_i], &st);
    memcpy(x.work, x.logits, sizeof(float) * N * V);
    x.be->crossentropy(x.work, x.losses, x.targets, N, V, x.scale);
    float *grad = s_alloc((size_t) N * V);
    memcpy(grad, x.work, sizeof(float) * N * V);
    for (int n = 0; n < N; n++) {
        double want = s_xent_reference(x.logits + n * V, x.targets[n]);
        ck_assert_msg(fabs(x.losses[n] - want) <= 1e-5 * fmax(1.0, fabs(want)),
                      "scale %g row %d: loss %.9g, want %.9g", x.scale, n, x.losses[n], want);
        double rowsum = 0.0;
        for (int v = 0; v < V; v++)
            rowsum += grad[n * V + v];
        ck_assert_msg(fabs(rowsum) <= 1e-5 * fabs(x.scale), "scale %g row %d: gradient sums to %g",
                      x.scale, n, rowsum);
    }
    s_fd_t r = s_fd_check(s_xent_objective, &x, x.logits, (size_t) N * V, grad, 1e-2f, &st);
    ck_assert_msg(r.err <= FD_TOL,
                  "scale %g: normalised error %.3g (element %zu: numeric %.6g, analytic %.6g)",
                  x.scale, r.err, r.worst, r.num, r.ana);
    free(grad);
    s_xent_free(&x);
}
END_TEST

// ---- add and sumsq ---------------------------------------------------------

START_TEST(test_add_is_elementwise_even_when_out_aliases_an_input)
{
    blas_backend_t *be = blas_cpu_backend(2);
    enum { COUNT = 9999 };
    uint64_t st = 91;
    float *a = s_random(COUNT, &st, 1.0f, 0.0f), *b = s_random(COUNT, &st, 1.0f, 0.0f);
    float *out = s_alloc(COUNT), *want = s_alloc(COUNT);
    for (int i = 0; i < COUNT; i++)
        want[i] = a[i] + b[i];
    be->add(out, a, b, COUNT);
    ck_assert_msg(memcmp(out, want, sizeof(float) * COUNT) == 0, "out = a + b differs");
    be->add(a, a, b, COUNT);
    ck_assert_msg(memcmp(a, want, sizeof(float) * COUNT) == 0, "a = a + b differs");
    free(a), free(b), free(out), free(want);
}
END_TEST

START_TEST(test_sumsq_matches_double_loop)
{
    blas_backend_t *be = blas_cpu_backend(1);
    enum { COUNT = 100003 };
    uint64_t st = 92;
    float *x = s_random(COUNT, &st, 3.0f, 0.0f);
    double want = 0.0;
    for (int i = 0; i < COUNT; i++)
        want += (double) x[i] * (double) x[i];
    double got = be->sumsq(x, COUNT);
    ck_assert_msg(fabs(got - want) <= 1e-12 * want, "sumsq %.17g, want %.17g", got, want);
    ck_assert_msg(be->sumsq(x, 0) == 0.0, "sumsq of nothing = %g", be->sumsq(x, 0));
    float big[2] = { 3e20f, 4e20f }; // squares overflow float, not double
    double b = be->sumsq(big, 2);
    ck_assert_msg(fabs(b - 25e40) <= 1e-6 * 25e40, "sumsq(3e20, 4e20) = %g", b);
    free(x);
}
END_TEST

// ---- runner ----------------------------------------------------------------

int main(void)
{
    Suite *s = suite_create("blas");
    TCase *tc = tcase_create("memory");
    tcase_add_test(tc, test_cpu_backend_fills_every_op_and_field);
    tcase_add_test(tc, test_upload_download_zero_and_host_ptr_round_trip);
    suite_add_tcase(s, tc);
    tc = tcase_create("open");
    // opening the CUDA plugin loads cuBLAS (libcublasLt alone is 540 MB): 2-4 s
    // from disk on a machine without a GPU, past Check's default 4 s
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_open_cpu_and_auto_give_the_cpu_backend);
    tcase_add_test(tc, test_open_unknown_devices_fail_naming_the_flag_value);
    tcase_add_test(tc, test_open_cuda_without_a_plugin_says_so_and_what_to_do);
    tcase_add_test(tc, test_open_cuda_gives_a_cuda_backend_or_the_reason);
    tcase_add_test(tc, test_open_loads_a_plugin_and_sets_its_threads);
    tcase_add_loop_test(tc, test_open_refuses_plugins_that_cannot_serve, 0, 5);
    tcase_add_test(tc, test_thread_count_is_honoured_and_results_agree);
    suite_add_tcase(s, tc);
    tc = tcase_create("encoder");
    tcase_add_test(tc, test_encoder_forward_adds_token_and_position_rows);
    tcase_add_test(tc, test_encoder_backward_matches_finite_differences);
    tcase_add_test(tc, test_encoder_backward_adds_its_gradient_with_one_rounding);
    suite_add_tcase(s, tc);
    tc = tcase_create("layernorm");
    tcase_add_test(tc, test_layernorm_forward_matches_double_reference);
    tcase_add_test(tc, test_layernorm_backward_matches_finite_differences);
    tcase_add_test(tc, test_layernorm_backward_adds_to_every_gradient_with_one_rounding);
    suite_add_tcase(s, tc);
    tc = tcase_create("matmul");
    tcase_add_test(tc, test_matmul_forward_matches_double_reference_with_and_without_bias);
    tcase_add_loop_test(tc, test_matmul_backward_matches_finite_differences, 0, 3);
    tcase_add_test(tc, test_matmul_backward_wide_bias_sums_every_column);
    tcase_add_test(tc, test_matmul_backward_adds_weight_and_bias_gradients_and_overwrites_dinp);
    suite_add_tcase(s, tc);
    tc = tcase_create("attention");
    int heads = (int) (sizeof s_att_heads / sizeof s_att_heads[0]);
    tcase_add_loop_test(tc, test_attention_forward_matches_causal_double_reference, 0, heads);
    tcase_add_loop_test(tc, test_attention_future_key_and_value_leave_earlier_outputs_unchanged, 0, heads);
    tcase_add_loop_test(tc, test_attention_backward_matches_finite_differences, 0, heads);
    tcase_add_loop_test(tc, test_attention_backward_overwrites_dqkv_whatever_the_scratch_holds, 0, heads);
    suite_add_tcase(s, tc);
    tc = tcase_create("gelu");
    tcase_add_test(tc, test_gelu_forward_matches_tanh_formula_over_minus_12_to_12);
    tcase_add_test(tc, test_gelu_stays_finite_where_exp_would_overflow);
    tcase_add_test(tc, test_gelu_backward_matches_finite_differences);
    tcase_add_test(tc, test_gelu_backward_overwrites_dinp);
    suite_add_tcase(s, tc);
    tc = tcase_create("crossentropy");
    tcase_add_test(tc, test_crossentropy_loss_is_logsumexp_minus_target_logit);
    tcase_add_loop_test(tc, test_crossentropy_gradient_matches_finite_differences, 0, 3);
    suite_add_tcase(s, tc);
    tc = tcase_create("elementwise");
    tcase_add_test(tc, test_add_is_elementwise_even_when_out_aliases_an_input);
    tcase_add_test(tc, test_sumsq_matches_double_loop);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
