/* cpu.c - the CPU compute backend: OpenBLAS sgemm for every matrix product,
 * OpenMP loops for the rest.
 *
 * One thread count governs both: with the OpenMP build of OpenBLAS they share
 * one pool; with the pthread build we set both to the same number and never
 * call a threaded sgemm from inside a parallel loop of ours.
 * Device memory is host memory here, so transfers are memcpy.
 */
#include "blas.h"
#include "rows.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

// provided by every OpenBLAS build
extern void openblas_set_num_threads(int num_threads);
extern char *openblas_get_config(void);
extern char *openblas_get_corename(void);

// Hot elementwise loops are compiled twice, for AVX2 and for any x86-64,
// and picked at load time (GCC function multi-versioning).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define CPU_CLONES __attribute__((target_clones("avx2", "default"), noinline))
#else
#define CPU_CLONES __attribute__((noinline))
#endif

// exp(x) for the kernels: Cephes' polynomial on x - k ln2 (about 2 ulp),
// branch-free so that loops over it vectorise; exp(x) for x < -87 returns
// about 1e-38 rather than 0, which no softmax here can tell apart.
static inline float s_exp(float x)
{
    x = fmaxf(x, -87.0f);
    x = fminf(x, 88.0f);
    float kf = floorf(x * 1.44269504088896341f + 0.5f);
    int k = (int) kf;
    float r = x - kf * 0.693359375f + kf * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { int32_t i; float f; } scale = { .i = (k + 127) << 23 };
    return p * scale.f;
}

// ---- memory ----------------------------------------------------------------

static int s_buf_alloc(blas_backend_t *self, size_t bytes, void **out)
{
    (void) self;
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0)
        return -ENOMEM;
    *out = p;
    return 0;
}

static void s_buf_free(blas_backend_t *self, void *buf)
{
    (void) self;
    free(buf);
}

static int s_copy(blas_backend_t *self, void *dst, const void *src, size_t bytes)
{
    (void) self;
    if (dst != src && bytes)
        memcpy(dst, src, bytes);
    return 0;
}

static void s_zero(blas_backend_t *self, void *buf, size_t bytes)
{
    (void) self;
    memset(buf, 0, bytes);
}

static void *s_host_ptr(blas_backend_t *self, void *buf)
{
    (void) self;
    return buf;
}

static int s_sync(blas_backend_t *self)
{
    (void) self;
    return 0;
}

// ---- encoder ---------------------------------------------------------------

static void s_encoder_forward(float *out, const int32_t *tokens, const float *wte,
                              const float *wpe, int B, int T, int C)
{
    #pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        const float *te = wte + (size_t) tokens[bt] * C;
        const float *pe = wpe + (size_t) (bt % T) * C;
        float *o = out + (size_t) bt * C;
        for (int c = 0; c < C; c++)
            o[c] = te[c] + pe[c];
    }
}

// acc[j] += sum over rows n of x[n * stride + j], j < width, summed in
// order before the one addition to acc; list, when not NULL, names the rows
// (row k is list[k])
CPU_CLONES static void s_colsum_span(float *acc, const float *x, const int32_t *list, int N,
                                     int stride, int width)
{
    float sum[64] = {0};
    for (int k = 0; k < N; k++) {
        const float *row = x + (size_t) (list ? list[k] : k) * stride;
        for (int j = 0; j < width; j++)
            sum[j] += row[j];
    }
    for (int j = 0; j < width; j++)
        acc[j] += sum[j];
}

// The rows of each token in row order (blas/rows.h): rows[offsets[v] ..
// offsets[v + 1]) hold token v. Returns V = largest token + 1, or 0 where
// the lists could not be allocated (*lists is then NULL).
static int s_token_rows(const int32_t *tokens, int N, int32_t **lists)
{
    int V = blas_token_span(tokens, N);
    int32_t *rows = malloc(((size_t) N + V + 1) * sizeof(int32_t));
    *lists = rows;
    if (!rows)
        return 0;
    blas_token_rows(tokens, N, V, rows, rows + N);
    return V;
}

// Each row of dwte and dwpe gets this call's sum, made apart (rows in order)
// and added with one rounding, so that a gradient accumulated over two
// micro-batches rounds as the two micro-batches' own gradients added do,
// whichever replicas made them (docs/numerics.md).
static void s_encoder_backward(float *dwte, float *dwpe, const float *dout,
                               const int32_t *tokens, int B, int T, int C)
{
    #pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++)
        for (int c0 = 0; c0 < C; c0 += 64)
            s_colsum_span(dwpe + (size_t) t * C + c0, dout + (size_t) t * C + c0, NULL, B, T * C,
                          C - c0 < 64 ? C - c0 : 64);
    int32_t *lists;
    int V = s_token_rows(tokens, B * T, &lists);
    if (!lists) {
        // no memory for the lists: the same sums, added row by row
        for (int bt = 0; bt < B * T; bt++)
            for (int c0 = 0; c0 < C; c0 += 64)
                s_colsum_span(dwte + (size_t) tokens[bt] * C + c0, dout + (size_t) bt * C + c0,
                              NULL, 1, C, C - c0 < 64 ? C - c0 : 64);
        return;
    }
    const int32_t *offsets = lists + B * T;
    #pragma omp parallel for schedule(dynamic, 8)
    for (int v = 0; v < V; v++)
        for (int c0 = 0; c0 < C && offsets[v + 1] > offsets[v]; c0 += 64)
            s_colsum_span(dwte + (size_t) v * C + c0, dout + c0, lists + offsets[v],
                          offsets[v + 1] - offsets[v], C, C - c0 < 64 ? C - c0 : 64);
    free(lists);
}

// ---- layernorm -------------------------------------------------------------

static void s_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                const float *weight, const float *bias, int N, int C)
{
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t) n * C;
        float m = 0.0f;
        for (int c = 0; c < C; c++)
            m += x[c];
        m /= C;
        float v = 0.0f;
        for (int c = 0; c < C; c++) {
            float d = x[c] - m;
            v += d * d;
        }
        v /= C;
        float s = 1.0f / sqrtf(v + 1e-5f);
        float *o = out + (size_t) n * C;
        for (int c = 0; c < C; c++)
            o[c] = (x[c] - m) * s * weight[c] + bias[c];
        mean[n] = m;
        rstd[n] = s;
    }
}

// dweight[j] += sum_n norm[n, j] * dout[n, j], dbias[j] += sum_n dout[n, j]
// for the `width` channels starting at the given pointers (row stride C)
CPU_CLONES static void s_layernorm_param_grads(float *dweight, float *dbias, const float *dout,
                                               const float *inp, const float *mean,
                                               const float *rstd, int N, int C, int width)
{
    float dw[64] = {0}, db[64] = {0};
    for (int n = 0; n < N; n++) {
        const float *d = dout + (size_t) n * C, *x = inp + (size_t) n * C;
        float m = mean[n], s = rstd[n];
        for (int j = 0; j < width; j++) {
            dw[j] += (x[j] - m) * s * d[j];
            db[j] += d[j];
        }
    }
    for (int j = 0; j < width; j++) {
        dweight[j] += dw[j];
        dbias[j] += db[j];
    }
}

static void s_layernorm_backward(float *dinp, float *dweight, float *dbias,
                                 const float *dout, const float *inp, const float *weight,
                                 const float *mean, const float *rstd, int N, int C)
{
    // input gradient: rows are independent
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *d = dout + (size_t) n * C;
        const float *x = inp + (size_t) n * C;
        float m = mean[n], s = rstd[n];
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
        for (int c = 0; c < C; c++) {
            float norm = (x[c] - m) * s;
            float dnorm = weight[c] * d[c];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * norm;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
        float *di = dinp + (size_t) n * C;
        for (int c = 0; c < C; c++) {
            float norm = (x[c] - m) * s;
            float dnorm = weight[c] * d[c];
            di[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
        }
    }
    // parameter gradients: blocks of 64 channels, rows summed in order
    #pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += 64)
        s_layernorm_param_grads(dweight + c0, dbias + c0, dout + c0, inp + c0, mean, rstd,
                                N, C, C - c0 < 64 ? C - c0 : 64);
}

// ---- matmul ----------------------------------------------------------------

static void s_matmul_forward(float *out, const float *inp, const float *weight,
                             const float *bias, int N, int C, int OC)
{
    float beta = 0.0f;
    if (bias) {
        #pragma omp parallel for schedule(static)
        for (int n = 0; n < N; n++)
            memcpy(out + (size_t) n * OC, bias, sizeof(float) * OC);
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C,
                1.0f, inp, C, weight, C, beta, out, OC);
}

static void s_matmul_backward(float *dinp, float *dweight, float *dbias,
                              const float *dout, const float *inp, const float *weight,
                              int N, int C, int OC)
{
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC,
                    1.0f, dout, OC, weight, C, 0.0f, dinp, C);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N,
                1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias) {
        // blocks of 64 columns, each summed over the rows in order
        #pragma omp parallel for schedule(static)
        for (int o0 = 0; o0 < OC; o0 += 64)
            s_colsum_span(dbias + o0, dout + o0, NULL, N, OC, OC - o0 < 64 ? OC - o0 : 64);
    }
}

// ---- attention -------------------------------------------------------------

// Row t of the (T,T) scores keeps columns 0..t: softmax there, zeros after.
CPU_CLONES static void s_causal_softmax(float *p, int T)
{
    for (int t = 0; t < T; t++) {
        float *row = p + (size_t) t * T;
        float mx = row[0];
        for (int u = 1; u <= t; u++)
            mx = row[u] > mx ? row[u] : mx;
        float sum = 0.0f;
        for (int u = 0; u <= t; u++) {
            row[u] = s_exp(row[u] - mx);
            sum += row[u];
        }
        float inv = 1.0f / sum;
        for (int u = 0; u <= t; u++)
            row[u] *= inv;
        for (int u = t + 1; u < T; u++)
            row[u] = 0.0f;
    }
}

// Per (b, h): S = q k^T / sqrt(hs), causal softmax P, out = P v. The small
// products run single-threaded inside our parallel loop over (b, h).

static void s_attention_forward(float *out, float *att, const float *qkv,
                                int B, int T, int C, int H)
{
    int hs = C / H;
    float scale = 1.0f / sqrtf((float) hs);
    #pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * H; bh++) {
        int b = bh / H, h = bh % H;
        const float *q = qkv + (size_t) b * T * 3 * C + h * hs;
        const float *k = q + C;
        const float *v = q + 2 * C;
        float *p = att + (size_t) bh * T * T;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs,
                    scale, q, 3 * C, k, 3 * C, 0.0f, p, T);
        s_causal_softmax(p, T);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T,
                    1.0f, p, T, v, 3 * C, 0.0f, out + (size_t) b * T * C + h * hs, C);
    }
}

static void s_attention_backward(float *dqkv, float *datt, const float *dout,
                                 const float *qkv, const float *att,
                                 int B, int T, int C, int H)
{
    int hs = C / H;
    float scale = 1.0f / sqrtf((float) hs);
    #pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * H; bh++) {
        int b = bh / H, h = bh % H;
        size_t base = (size_t) b * T * 3 * C + h * hs;
        const float *q = qkv + base, *k = q + C, *v = q + 2 * C;
        float *dq = dqkv + base, *dk = dq + C, *dv = dq + 2 * C;
        const float *d = dout + (size_t) b * T * C + h * hs;
        const float *p = att + (size_t) bh * T * T;
        float *dp = datt + (size_t) bh * T * T;
        // dP = dout v^T, dV = P^T dout
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs,
                    1.0f, d, C, v, 3 * C, 0.0f, dp, T);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T,
                    1.0f, p, T, d, C, 0.0f, dv, 3 * C);
        // softmax backward: dS = P * (dP - sum(P * dP)); masked entries have P = 0
        for (int t = 0; t < T; t++) {
            const float *pr = p + (size_t) t * T;
            float *dr = dp + (size_t) t * T;
            float dot = 0.0f;
            for (int u = 0; u <= t; u++)
                dot += pr[u] * dr[u];
            for (int u = 0; u <= t; u++)
                dr[u] = pr[u] * (dr[u] - dot);
            for (int u = t + 1; u < T; u++)
                dr[u] = 0.0f;
        }
        // dQ = dS k * scale, dK = dS^T q * scale
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T,
                    scale, dp, T, k, 3 * C, 0.0f, dq, 3 * C);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T,
                    scale, dp, T, q, 3 * C, 0.0f, dk, 3 * C);
    }
}

// ---- elementwise -----------------------------------------------------------

#define GELU_SCALE 0.7978845608028654f // sqrt(2/pi)
#define SPAN 4096                         // elements per parallel chunk

// 0.5 x (1 + tanh(u)) = x * sigmoid(2u): the same function without the
// cancellation of 1 + tanh(u) for negative x
CPU_CLONES static void s_gelu_span(float *out, const float *inp, size_t n)
{
    #pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        out[i] = x / (1.0f + s_exp(-2.0f * u));
    }
}

// d/dx x sigmoid(2u) = sigmoid(2u) + 2 x sigmoid(2u) (1 - sigmoid(2u)) u'(x)
CPU_CLONES static void s_gelu_backward_span(float *dinp, const float *inp, const float *dout, size_t n)
{
    #pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        float sg = 1.0f / (1.0f + s_exp(-2.0f * u));
        float du = GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = (sg + 2.0f * x * sg * (1.0f - sg) * du) * dout[i];
    }
}

static void s_gelu_forward(float *out, const float *inp, size_t n)
{
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i += SPAN)
        s_gelu_span(out + i, inp + i, n - i < SPAN ? n - i : SPAN);
}

static void s_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i += SPAN)
        s_gelu_backward_span(dinp + i, inp + i, dout + i, n - i < SPAN ? n - i : SPAN);
}

static void s_add(float *out, const float *a, const float *b, size_t n)
{
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

// One row of V logits: the loss, and with scale != 0 the row replaced by
// scale * (softmax - onehot). exp is taken once per logit.
CPU_CLONES static float s_crossentropy_row(float *l, int V, int y, float scale)
{
    float mx = l[0];
    for (int v = 1; v < V; v++)
        mx = fmaxf(mx, l[v]);
    float target = l[y];
    if (scale == 0.0f) {
        float sum = 0.0f;
        for (int v = 0; v < V; v++)
            sum += s_exp(l[v] - mx);
        return mx + logf(sum) - target;
    }
    float sum = 0.0f;
    for (int v = 0; v < V; v++) {
        l[v] = s_exp(l[v] - mx);
        sum += l[v];
    }
    float inv = scale / sum;
    for (int v = 0; v < V; v++)
        l[v] *= inv;
    l[y] -= scale;
    return mx + logf(sum) - target;
}

static void s_crossentropy(float *logits, float *losses, const int32_t *targets,
                           int N, int V, float scale)
{
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        losses[n] = s_crossentropy_row(logits + (size_t) n * V, V, targets[n], scale);
}

static double s_sumsq(const float *x, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double) x[i] * x[i];
    return s;
}

// ---- the backend -----------------------------------------------------------

int blas_cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int) n : 1;
}

const char *blas_cpu_info(void)
{
    static char info[256];
    snprintf(info, sizeof info, "%s (core %s)", openblas_get_config(), openblas_get_corename());
    return info;
}

// OpenBLAS (DYNAMIC_ARCH) picks its kernels by the CPU's model number, and
// one newer than its release falls back to Prescott (SSE3): Debian's 0.3.21
// on an Emerald Rapids Xeon (family 6, model 207) ran swarm train 3.5x
// slower on one thread (2.2x on two) than on the Cooperlake kernels the
// CPU runs (docs/performance.md). The pick goes by features instead, which
// __builtin_cpu_supports reads from cpuid and, for AVX and AVX-512, from
// what the OS saves (xgetbv): a CPU without them keeps Prescott.
const char *blas_cpu_core_pick(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    const char *core = openblas_get_corename();
    if (getenv("OPENBLAS_CORETYPE") || !core || strcasecmp(core, "prescott") != 0)
        return NULL;
    __builtin_cpu_init();
    int skx = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd")
              && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq")
              && __builtin_cpu_supports("avx512vl");
    if (skx && __builtin_cpu_supports("avx512bf16"))
        return "Cooperlake";
    if (skx)
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return "Haswell";
    if (__builtin_cpu_supports("avx"))
        return "Sandybridge";
#endif
    return NULL;
}

// OpenMP and OpenBLAS read their settings from the environment when they
// load, before main. By default an idle libgomp worker spins 300,000 times
// (about a millisecond) before it sleeps; on a desktop that also runs
// anything else, a spinning thread waits for a partner that the kernel has
// preempted: two 2-thread runs at once on two cores made 6,500 tok/s in
// all, against 30,600 waiting passively. Never spinning
// (OMP_WAIT_POLICY=PASSIVE) costs a quiet machine a quarter: a worker put
// to sleep at every barrier wakes late. A short spin (GOMP_SPINCOUNT=1000)
// keeps most of both (docs/performance.md, "Threads"). And OpenBLAS runs
// its SSE3 kernels on a CPU newer than itself (blas_cpu_core_pick). Unless
// the user chose how to wait and a core, restart once with the short spin
// and the CPU's kernels.
void blas_cpu_restart(char **argv)
{
    const char *core = blas_cpu_core_pick();
    int wait = !getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT");
    if (!wait && !core)
        return;
    if (wait) {
        setenv("GOMP_SPINCOUNT", "1000", 1);
        if (!getenv("OPENBLAS_THREAD_TIMEOUT")) // (its pthread build's threads)
            setenv("OPENBLAS_THREAD_TIMEOUT", "4", 1);
    }
    if (core)
        setenv("OPENBLAS_CORETYPE", core, 1);
    // exec the file itself, not /proc/self/exe, so ps and top still say "swarm"
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = '\0';
        execv(self, argv);
    }
    // no /proc: carry on with libgomp's spin and OpenBLAS's core
}

static blas_backend_t s_cpu = {
    .api_version = BLAS_API_VERSION,
    .name = "cpu",
    .buf_alloc = s_buf_alloc,
    .buf_free = s_buf_free,
    .upload = s_copy,
    .download = s_copy,
    .zero = s_zero,
    .host_ptr = s_host_ptr,
    .sync = s_sync,
    .encoder_forward = s_encoder_forward,
    .encoder_backward = s_encoder_backward,
    .layernorm_forward = s_layernorm_forward,
    .layernorm_backward = s_layernorm_backward,
    .matmul_forward = s_matmul_forward,
    .matmul_backward = s_matmul_backward,
    .attention_forward = s_attention_forward,
    .attention_backward = s_attention_backward,
    .gelu_forward = s_gelu_forward,
    .gelu_backward = s_gelu_backward,
    .add = s_add,
    .crossentropy = s_crossentropy,
    .sumsq = s_sumsq,
};

blas_backend_t *blas_cpu_backend(int threads)
{
    if (threads <= 0)
        threads = blas_cpu_count();
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
    s_cpu.threads = threads;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    s_cpu.memory = pages > 0 && page > 0 ? (size_t) pages * (size_t) page : 0;
    snprintf(s_cpu.device, sizeof s_cpu.device, "cpu: %d thread%s, OpenBLAS core %s",
             threads, threads == 1 ? "" : "s", openblas_get_corename());
    return &s_cpu;
}
