/* cuda.cu - the CUDA compute backend, built as the plugin swarm-cuda.so
 * (blas.h, BLAS_CUDA_ENTRY): cuBLAS sgemm for every matrix product (attention
 * as strided batches over heads), simple fp32 kernels of our own for the
 * rest, each op with the contract of blas/cpu.c. fp32 throughout; TF32 only
 * when SWARM_CUDA_TF32=1.
 *
 * Deterministic: no atomics, every sum in a fixed order, so the same inputs
 * give the same bits on the same GPU. It does not reproduce the CPU's bits
 * (other summation orders, fused multiply-adds): replicas on different
 * devices agree through the router's summed gradient and the CPU's AdamW
 * (docs/cuda.md), not here. The optimizer is not here.
 */
#include "blas.h"
#include "rows.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 256         // threads per block of every kernel
#define GRID_MAX 65536      // blocks of a grid-stride loop
#define CHUNK_ROWS 32       // rows per partial column sum
#define SUMSQ_BLOCKS 256    // partial sums of sumsq

// ---- state -----------------------------------------------------------------
// The ops of blas.h take no backend argument, so the plugin holds the state
// of the one device this process uses.

static struct {
    int ordinal;              // device in use, -1 before blas_cuda_open
    cublasHandle_t blas;      // cuBLAS on the legacy default stream
    cudaError_t error;        // first failure seen; transfers report it as -EIO
    void *scratch;            // (scratch_bytes) device scratch: partial sums, token lists
    size_t scratch_bytes;
    int32_t *rows;            // host scratch: rows of each token (encoder backward)
    int32_t *offsets;         // host scratch: (V + 1) start of each token's rows
    size_t rows_n, offsets_n; // their capacities
} s = { -1, NULL, cudaSuccess, NULL, 0, NULL, NULL, 0, 0 };

// Record the first failure, with where it happened, once on stderr: the ops
// cannot return it, the next transfer does.
static void s_fail(const char *where, const char *what)
{
    if (s.error != cudaSuccess)
        return;
    s.error = cudaErrorUnknown;
    fprintf(stderr, "swarm-cuda: %s: %s\n", where, what);
}

static void s_check(const char *where)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess && s.error == cudaSuccess) {
        s_fail(where, cudaGetErrorString(e));
        s.error = e;
    }
}

static void s_blas_check(cublasStatus_t st, const char *where)
{
    if (st != CUBLAS_STATUS_SUCCESS)
        s_fail(where, cublasGetStatusString(st));
}

// Device scratch of at least `bytes`, or NULL (recorded) when it cannot grow.
// Kernels on the one stream use it in turn, so one buffer serves every op.
static void *s_scratch(size_t bytes, const char *where)
{
    if (bytes <= s.scratch_bytes)
        return s.scratch;
    if (s.scratch)
        cudaFree(s.scratch); // waits for the kernels still reading it
    s.scratch = NULL;
    s.scratch_bytes = 0;
    if (cudaMalloc(&s.scratch, bytes) != cudaSuccess) {
        cudaGetLastError();
        s_fail(where, "out of device memory for scratch");
        s.scratch = NULL;
        return NULL;
    }
    s.scratch_bytes = bytes;
    return s.scratch;
}

static unsigned s_blocks(size_t n)
{
    size_t b = (n + THREADS - 1) / THREADS;
    return (unsigned) (b < 1 ? 1 : b > GRID_MAX ? GRID_MAX : b);
}

#define GRID_STRIDE(i, n) \
    for (size_t i = (size_t) blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (size_t) gridDim.x * blockDim.x)

// ---- reductions ------------------------------------------------------------

__device__ float d_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ float d_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum (or max) over the block, in a fixed tree order; every thread gets it.
// blockDim.x is a multiple of 32.
__device__ float d_block_reduce(float v, int is_max)
{
    __shared__ float part[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = is_max ? d_warp_max(v) : d_warp_sum(v);
    __syncthreads(); // a previous call may still read part
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    v = lane < warps ? part[lane] : (is_max ? -INFINITY : 0.0f);
    return is_max ? d_warp_max(v) : d_warp_sum(v);
}

// ---- memory ----------------------------------------------------------------

static int s_buf_alloc(blas_backend_t *self, size_t bytes, void **out)
{
    (void) self;
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 256) != cudaSuccess) {
        cudaGetLastError(); // out of memory is not sticky: the caller decides
        return -ENOMEM;
    }
    *out = p;
    return 0;
}

static void s_buf_free(blas_backend_t *self, void *buf)
{
    (void) self;
    cudaFree(buf);
}

static int s_copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, const char *what)
{
    s_check(what); // a kernel that failed to launch
    if (s.error != cudaSuccess)
        return -EIO;
    if (bytes && cudaMemcpy(dst, src, bytes, kind) != cudaSuccess) {
        s_check(what);
        return -EIO;
    }
    return 0;
}

static int s_upload(blas_backend_t *self, void *dst, const void *src, size_t bytes)
{
    (void) self;
    return s_copy(dst, src, bytes, cudaMemcpyHostToDevice, "upload");
}

static int s_download(blas_backend_t *self, void *dst, const void *src, size_t bytes)
{
    (void) self;
    return s_copy(dst, src, bytes, cudaMemcpyDeviceToHost, "download");
}

static void s_zero(blas_backend_t *self, void *buf, size_t bytes)
{
    (void) self;
    cudaMemsetAsync(buf, 0, bytes, 0);
    s_check("zero");
}

// device memory is separate: the node code downloads and uploads
static void *s_host_ptr(blas_backend_t *self, void *buf)
{
    (void) self, (void) buf;
    return NULL;
}

static int s_sync(blas_backend_t *self)
{
    (void) self;
    if (cudaDeviceSynchronize() != cudaSuccess)
        s_check("sync");
    s_check("sync");
    return s.error == cudaSuccess ? 0 : -EIO;
}

// ---- encoder ---------------------------------------------------------------

__global__ void k_encoder_forward(float *out, const int32_t *tokens, const float *wte,
                                  const float *wpe, int T, int C, size_t n)
{
    GRID_STRIDE(i, n) {
        size_t bt = i / C;
        int c = (int) (i % C);
        out[i] = wte[(size_t) tokens[bt] * C + c] + wpe[(bt % T) * C + c];
    }
}

static void s_encoder_forward(float *out, const int32_t *tokens, const float *wte,
                              const float *wpe, int B, int T, int C)
{
    size_t n = (size_t) B * T * C;
    k_encoder_forward<<<s_blocks(n), THREADS>>>(out, tokens, wte, wpe, T, C, n);
    s_check("encoder_forward");
}

// dwpe[t, c] += the sum of dout[b, t, c] over b in order, added once: the
// CPU's order, the CPU's bits
__global__ void k_encoder_backward_wpe(float *dwpe, const float *dout, int B, int T, int C)
{
    size_t i = (size_t) blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t) T * C)
        return;
    float acc = 0.0f;
    for (int b = 0; b < B; b++)
        acc += dout[(size_t) b * T * C + i];
    dwpe[i] += acc;
}

// dwte[v, c] += the sum of dout[n, c] over the rows n holding token v, in row
// order (rows[offsets[v] .. offsets[v+1]]), added once: again the CPU's
// order, and no atomics
__global__ void k_encoder_backward_wte(float *dwte, const float *dout, const int32_t *rows,
                                       const int32_t *offsets, int C)
{
    int v = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    float acc = 0.0f;
    for (int k = offsets[v]; k < offsets[v + 1]; k++)
        acc += dout[(size_t) rows[k] * C + c];
    if (offsets[v + 1] > offsets[v])
        dwte[(size_t) v * C + c] += acc;
}

// Host: the rows of each token in order (blas/rows.h).
// Returns V = largest token + 1, or 0 when the lists cannot be made.
static int s_token_rows(const int32_t *tokens_dev, int N)
{
    if ((size_t) N > s.rows_n) {
        free(s.rows);
        s.rows = (int32_t *) malloc((size_t) 2 * N * sizeof(int32_t));
        s.rows_n = s.rows ? (size_t) N : 0;
    }
    if (!s.rows)
        return 0;
    int32_t *tok = s.rows + N; // the second half holds the tokens
    if (s_copy(tok, tokens_dev, (size_t) N * sizeof(int32_t), cudaMemcpyDeviceToHost,
               "encoder_backward") != 0)
        return 0;
    int V = blas_token_span(tok, N);
    if ((size_t) V + 1 > s.offsets_n) {
        free(s.offsets);
        s.offsets = (int32_t *) malloc(((size_t) V + 1) * sizeof(int32_t));
        s.offsets_n = s.offsets ? (size_t) V + 1 : 0;
    }
    if (!s.offsets)
        return 0;
    blas_token_rows(tok, N, V, s.rows, s.offsets);
    return V;
}

static void s_encoder_backward(float *dwte, float *dwpe, const float *dout,
                               const int32_t *tokens, int B, int T, int C)
{
    int N = B * T;
    size_t tc = (size_t) T * C;
    k_encoder_backward_wpe<<<(unsigned) ((tc + THREADS - 1) / THREADS), THREADS>>>(dwpe, dout, B, T, C);
    s_check("encoder_backward");
    int V = s_token_rows(tokens, N);
    if (V == 0) {
        s_fail("encoder_backward", "cannot list the rows of each token");
        return;
    }
    size_t bytes = ((size_t) N + V + 1) * sizeof(int32_t);
    int32_t *lists = (int32_t *) s_scratch(bytes, "encoder_backward");
    if (!lists)
        return;
    if (s_copy(lists, s.rows, (size_t) N * sizeof(int32_t), cudaMemcpyHostToDevice, "encoder_backward")
        || s_copy(lists + N, s.offsets, ((size_t) V + 1) * sizeof(int32_t), cudaMemcpyHostToDevice,
                  "encoder_backward"))
        return;
    dim3 grid((unsigned) ((C + THREADS - 1) / THREADS), (unsigned) V);
    k_encoder_backward_wte<<<grid, THREADS>>>(dwte, dout, lists, lists + N, C);
    s_check("encoder_backward");
}

// ---- column sums (bias and LayerNorm parameter gradients) ------------------
// Deterministic without atomics: partial sums over chunks of CHUNK_ROWS rows,
// then each column adds its partials in chunk order.

// part[k, j] = sum over rows n of chunk k of x[n * stride + j], j < width
__global__ void k_colsum_partial(float *part, const float *x, int N, int stride, int width)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x, k = blockIdx.y;
    if (j >= width)
        return;
    int end = min(N, (k + 1) * CHUNK_ROWS);
    float acc = 0.0f;
    for (int n = k * CHUNK_ROWS; n < end; n++)
        acc += x[(size_t) n * stride + j];
    part[(size_t) k * width + j] = acc;
}

// acc[j] += sum over k of part[k, j], k in order
__global__ void k_colsum_finish(float *acc, const float *part, int chunks, int width)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= width)
        return;
    float sum = 0.0f;
    for (int k = 0; k < chunks; k++)
        sum += part[(size_t) k * width + j];
    acc[j] += sum;
}

static int s_chunks(int N)
{
    return (N + CHUNK_ROWS - 1) / CHUNK_ROWS;
}

// acc[j] += sum over the N rows of x (row stride `stride`) of column j
static void s_colsum(float *acc, const float *x, int N, int stride, int width, const char *where)
{
    int chunks = s_chunks(N);
    float *part = (float *) s_scratch((size_t) chunks * width * sizeof(float), where);
    if (!part || N == 0)
        return;
    unsigned cols = (unsigned) ((width + THREADS - 1) / THREADS);
    k_colsum_partial<<<dim3(cols, (unsigned) chunks), THREADS>>>(part, x, N, stride, width);
    k_colsum_finish<<<cols, THREADS>>>(acc, part, chunks, width);
    s_check(where);
}

// ---- layernorm -------------------------------------------------------------

// one block per row
__global__ void k_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                    const float *weight, const float *bias, int C)
{
    size_t row = blockIdx.x;
    const float *x = inp + row * C;
    float sum = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        sum += x[c];
    float m = d_block_reduce(sum, 0) / C;
    float var = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float d = x[c] - m;
        var += d * d;
    }
    float v = d_block_reduce(var, 0) / C;
    float r = 1.0f / sqrtf(v + 1e-5f);
    float *o = out + row * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        o[c] = (x[c] - m) * r * weight[c] + bias[c];
    if (threadIdx.x == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

static void s_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                const float *weight, const float *bias, int N, int C)
{
    if (N == 0)
        return;
    k_layernorm_forward<<<N, THREADS>>>(out, mean, rstd, inp, weight, bias, C);
    s_check("layernorm_forward");
}

// dinp += ..., one block per row
__global__ void k_layernorm_backward_inp(float *dinp, const float *dout, const float *inp,
                                         const float *weight, const float *mean,
                                         const float *rstd, int C)
{
    size_t row = blockIdx.x;
    const float *d = dout + row * C, *x = inp + row * C;
    float m = mean[row], r = rstd[row];
    float a = 0.0f, b = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float dnorm = weight[c] * d[c];
        a += dnorm;
        b += dnorm * (x[c] - m) * r;
    }
    float dnorm_mean = d_block_reduce(a, 0) / C;
    float dnorm_norm_mean = d_block_reduce(b, 0) / C;
    float *di = dinp + row * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float norm = (x[c] - m) * r;
        float dnorm = weight[c] * d[c];
        di[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * r;
    }
}

// partials of dweight (pw) and dbias (pb) over chunks of rows
__global__ void k_layernorm_param_partial(float *pw, float *pb, const float *dout,
                                          const float *inp, const float *mean,
                                          const float *rstd, int N, int C)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x, k = blockIdx.y;
    if (j >= C)
        return;
    int end = min(N, (k + 1) * CHUNK_ROWS);
    float dw = 0.0f, db = 0.0f;
    for (int n = k * CHUNK_ROWS; n < end; n++) {
        float d = dout[(size_t) n * C + j];
        dw += (inp[(size_t) n * C + j] - mean[n]) * rstd[n] * d;
        db += d;
    }
    pw[(size_t) k * C + j] = dw;
    pb[(size_t) k * C + j] = db;
}

static void s_layernorm_backward(float *dinp, float *dweight, float *dbias,
                                 const float *dout, const float *inp, const float *weight,
                                 const float *mean, const float *rstd, int N, int C)
{
    if (N == 0)
        return;
    k_layernorm_backward_inp<<<N, THREADS>>>(dinp, dout, inp, weight, mean, rstd, C);
    int chunks = s_chunks(N);
    size_t part = (size_t) chunks * C;
    float *pw = (float *) s_scratch(2 * part * sizeof(float), "layernorm_backward");
    if (!pw)
        return;
    unsigned cols = (unsigned) ((C + THREADS - 1) / THREADS);
    k_layernorm_param_partial<<<dim3(cols, (unsigned) chunks), THREADS>>>(pw, pw + part, dout, inp,
                                                                         mean, rstd, N, C);
    k_colsum_finish<<<cols, THREADS>>>(dweight, pw, chunks, C);
    k_colsum_finish<<<cols, THREADS>>>(dbias, pw + part, chunks, C);
    s_check("layernorm_backward");
}

// ---- matmul ----------------------------------------------------------------
// Row-major (R, K) memory is column-major (K, R): cuBLAS computes the
// transposed products, out^T = W inp^T and so on.

__global__ void k_rows_fill(float *out, const float *row, int OC, size_t n)
{
    GRID_STRIDE(i, n)
        out[i] = row[i % OC];
}

static void s_matmul_forward(float *out, const float *inp, const float *weight,
                             const float *bias, int N, int C, int OC)
{
    const float one = 1.0f;
    float beta = 0.0f;
    if (bias) {
        size_t n = (size_t) N * OC;
        k_rows_fill<<<s_blocks(n), THREADS>>>(out, bias, OC, n);
        s_check("matmul_forward");
        beta = 1.0f;
    }
    // out^T (OC, N) = W (OC, C) inp^T (C, N)
    s_blas_check(cublasSgemm(s.blas, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &one, weight, C,
                             inp, C, &beta, out, OC), "matmul_forward");
}

static void s_matmul_backward(float *dinp, float *dweight, float *dbias,
                              const float *dout, const float *inp, const float *weight,
                              int N, int C, int OC)
{
    const float one = 1.0f, zero = 0.0f;
    // dinp^T (C, N) = W^T (C, OC) dout^T (OC, N)
    if (dinp)
        s_blas_check(cublasSgemm(s.blas, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &one, weight, C,
                                 dout, OC, &zero, dinp, C), "matmul_backward");
    // dweight^T (C, OC) += inp^T (C, N) dout (N, OC)
    s_blas_check(cublasSgemm(s.blas, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &one, inp, C,
                             dout, OC, &one, dweight, C), "matmul_backward");
    if (dbias)
        s_colsum(dbias, dout, N, OC, OC, "matmul_backward");
}

// ---- attention -------------------------------------------------------------
// Per batch row b, one strided batch of H products (head h's slices are hs
// floats apart in qkv and out, T*T apart in att).

// Row r = (b, h, t) of the (T, T) scores: softmax over columns 0..t, zeros
// after. One warp per row.
__global__ void k_causal_softmax(float *att, int T, size_t rows)
{
    size_t r = (size_t) blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (r >= rows)
        return;
    int t = (int) (r % T);
    float *row = att + r * T;
    float mx = -INFINITY;
    for (int u = lane; u <= t; u += 32)
        mx = fmaxf(mx, row[u]);
    mx = d_warp_max(mx);
    float sum = 0.0f;
    for (int u = lane; u <= t; u += 32) {
        float e = expf(row[u] - mx);
        row[u] = e;
        sum += e;
    }
    float inv = 1.0f / d_warp_sum(sum);
    for (int u = lane; u <= t; u += 32)
        row[u] *= inv;
    for (int u = t + 1 + lane; u < T; u += 32)
        row[u] = 0.0f;
}

// dS = P * (dP - sum(P * dP)) on columns 0..t, zeros after; one warp per row
__global__ void k_causal_softmax_backward(float *datt, const float *att, int T, size_t rows)
{
    size_t r = (size_t) blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (r >= rows)
        return;
    int t = (int) (r % T);
    const float *p = att + r * T;
    float *dp = datt + r * T;
    float dot = 0.0f;
    for (int u = lane; u <= t; u += 32)
        dot += p[u] * dp[u];
    dot = d_warp_sum(dot);
    for (int u = lane; u <= t; u += 32)
        dp[u] = p[u] * (dp[u] - dot);
    for (int u = t + 1 + lane; u < T; u += 32)
        dp[u] = 0.0f;
}

static unsigned s_warp_blocks(size_t rows)
{
    size_t per = THREADS / 32;
    return (unsigned) ((rows + per - 1) / per);
}

// C (m, n) = alpha op(A) op(B) for each of H heads, column-major
typedef struct {
    cublasOperation_t ta, tb;
    int m, n, k;
    float alpha;
    const float *a;
    int lda;
    long long sa;
    const float *b;
    int ldb;
    long long sb;
    float *c;
    int ldc;
    long long sc;
} s_batch_t;

static void s_gemm_heads(const s_batch_t *g, int H, const char *where)
{
    const float zero = 0.0f;
    s_blas_check(cublasSgemmStridedBatched(s.blas, g->ta, g->tb, g->m, g->n, g->k, &g->alpha,
                                           g->a, g->lda, g->sa, g->b, g->ldb, g->sb, &zero,
                                           g->c, g->ldc, g->sc, H), where);
}

static void s_attention_forward(float *out, float *att, const float *qkv,
                                int B, int T, int C, int H)
{
    int hs = C / H;
    float scale = 1.0f / sqrtf((float) hs);
    long long tt = (long long) T * T;
    for (int b = 0; b < B; b++) {
        const float *q = qkv + (size_t) b * T * 3 * C, *k = q + C;
        // S^T (T, T) = K (T, hs) Q^T (hs, T) * scale
        s_batch_t g = { CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, scale, k, 3 * C, hs, q, 3 * C, hs,
                        att + (size_t) b * H * tt, T, tt };
        s_gemm_heads(&g, H, "attention_forward");
    }
    size_t rows = (size_t) B * H * T;
    k_causal_softmax<<<s_warp_blocks(rows), THREADS>>>(att, T, rows);
    s_check("attention_forward");
    for (int b = 0; b < B; b++) {
        const float *v = qkv + (size_t) b * T * 3 * C + 2 * C;
        // out^T (hs, T) = V^T (hs, T) P^T (T, T)
        s_batch_t g = { CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, v, 3 * C, hs,
                        att + (size_t) b * H * tt, T, tt, out + (size_t) b * T * C, C, hs };
        s_gemm_heads(&g, H, "attention_forward");
    }
}

static void s_attention_backward(float *dqkv, float *datt, const float *dout,
                                 const float *qkv, const float *att,
                                 int B, int T, int C, int H)
{
    int hs = C / H;
    float scale = 1.0f / sqrtf((float) hs);
    long long tt = (long long) T * T;
    for (int b = 0; b < B; b++) {
        size_t base = (size_t) b * T * 3 * C;
        const float *v = qkv + base + 2 * C, *d = dout + (size_t) b * T * C;
        const float *p = att + (size_t) b * H * tt;
        float *dp = datt + (size_t) b * H * tt, *dv = dqkv + base + 2 * C;
        // dP^T (T, T) = V (T, hs) dout^T (hs, T)
        s_batch_t g1 = { CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, 1.0f, v, 3 * C, hs, d, C, hs,
                         dp, T, tt };
        s_gemm_heads(&g1, H, "attention_backward");
        // dV^T (hs, T) = dout^T (hs, T) P (T, T)
        s_batch_t g2 = { CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, 1.0f, d, C, hs, p, T, tt,
                         dv, 3 * C, hs };
        s_gemm_heads(&g2, H, "attention_backward");
    }
    size_t rows = (size_t) B * H * T;
    k_causal_softmax_backward<<<s_warp_blocks(rows), THREADS>>>(datt, att, T, rows);
    s_check("attention_backward");
    for (int b = 0; b < B; b++) {
        size_t base = (size_t) b * T * 3 * C;
        const float *q = qkv + base, *k = q + C, *ds = datt + (size_t) b * H * tt;
        float *dq = dqkv + base, *dk = dq + C;
        // dQ^T (hs, T) = K^T (hs, T) dS^T (T, T) * scale
        s_batch_t g1 = { CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, scale, k, 3 * C, hs, ds, T, tt,
                         dq, 3 * C, hs };
        s_gemm_heads(&g1, H, "attention_backward");
        // dK^T (hs, T) = Q^T (hs, T) dS (T, T) * scale
        s_batch_t g2 = { CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, scale, q, 3 * C, hs, ds, T, tt,
                         dk, 3 * C, hs };
        s_gemm_heads(&g2, H, "attention_backward");
    }
}

// ---- elementwise -----------------------------------------------------------

#define GELU_SCALE 0.7978845608028654f // sqrt(2/pi)

// 0.5 x (1 + tanh(u)) = x sigmoid(2u), as cpu.c computes it
__global__ void k_gelu_forward(float *out, const float *inp, size_t n)
{
    GRID_STRIDE(i, n) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        out[i] = x / (1.0f + expf(-2.0f * u));
    }
}

__global__ void k_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
    GRID_STRIDE(i, n) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        float sg = 1.0f / (1.0f + expf(-2.0f * u));
        float du = GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = (sg + 2.0f * x * sg * (1.0f - sg) * du) * dout[i];
    }
}

__global__ void k_add(float *out, const float *a, const float *b, size_t n)
{
    GRID_STRIDE(i, n)
        out[i] = a[i] + b[i];
}

static void s_gelu_forward(float *out, const float *inp, size_t n)
{
    k_gelu_forward<<<s_blocks(n), THREADS>>>(out, inp, n);
    s_check("gelu_forward");
}

static void s_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
    k_gelu_backward<<<s_blocks(n), THREADS>>>(dinp, inp, dout, n);
    s_check("gelu_backward");
}

static void s_add(float *out, const float *a, const float *b, size_t n)
{
    k_add<<<s_blocks(n), THREADS>>>(out, a, b, n);
    s_check("add");
}

// ---- cross-entropy ---------------------------------------------------------

// one block per row of V logits
__global__ void k_crossentropy(float *logits, float *losses, const int32_t *targets, int V,
                               float scale)
{
    float *l = logits + (size_t) blockIdx.x * V;
    int y = targets[blockIdx.x];
    if (y < 0 || y >= V) { // checked on the host; never read outside the row
        if (threadIdx.x == 0)
            losses[blockIdx.x] = NAN;
        return;
    }
    float mx = -INFINITY;
    for (int v = threadIdx.x; v < V; v += blockDim.x)
        mx = fmaxf(mx, l[v]);
    mx = d_block_reduce(mx, 1);
    float target = l[y];
    __syncthreads(); // every thread has read l[y] before any overwrites it
    float sum = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float e = expf(l[v] - mx);
        if (scale != 0.0f)
            l[v] = e;
        sum += e;
    }
    sum = d_block_reduce(sum, 0);
    if (scale != 0.0f) {
        float inv = scale / sum;
        for (int v = threadIdx.x; v < V; v += blockDim.x) {
            float g = l[v] * inv;
            l[v] = v == y ? g - scale : g;
        }
    }
    if (threadIdx.x == 0)
        losses[blockIdx.x] = mx + logf(sum) - target;
}

static void s_crossentropy(float *logits, float *losses, const int32_t *targets,
                           int N, int V, float scale)
{
    if (N == 0)
        return;
    k_crossentropy<<<N, THREADS>>>(logits, losses, targets, V, scale);
    s_check("crossentropy");
}

// ---- sum of squares --------------------------------------------------------

// part[block] = sum of x[i]^2 over the block's grid-stride share, in double
__global__ void k_sumsq_partial(double *part, const float *x, size_t n)
{
    __shared__ double tree[THREADS];
    double acc = 0.0;
    GRID_STRIDE(i, n)
        acc += (double) x[i] * x[i];
    tree[threadIdx.x] = acc;
    __syncthreads();
    for (unsigned half = THREADS / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half)
            tree[threadIdx.x] += tree[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        part[blockIdx.x] = tree[0];
}

// part[SUMSQ_BLOCKS] = sum of part[0 .. SUMSQ_BLOCKS), in a fixed order
__global__ void k_sumsq_finish(double *part)
{
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        double s = 0.0;
        for (int b = 0; b < SUMSQ_BLOCKS; b++)
            s += part[b];
        part[SUMSQ_BLOCKS] = s;
    }
}

static double s_sumsq(const float *x, size_t n)
{
    double *part = (double *) s_scratch((SUMSQ_BLOCKS + 1) * sizeof(double), "sumsq");
    double sum = 0.0;
    if (!part)
        return NAN;
    k_sumsq_partial<<<SUMSQ_BLOCKS, THREADS>>>(part, x, n);
    k_sumsq_finish<<<1, 32>>>(part);
    if (s_copy(&sum, part + SUMSQ_BLOCKS, sizeof sum, cudaMemcpyDeviceToHost, "sumsq") != 0)
        return NAN;
    return sum;
}

// ---- the plugin's entry point ----------------------------------------------

// what the device had free at open less what it has free now
static size_t s_memory_used(blas_backend_t *self)
{
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return self->memory > free_b ? self->memory - free_b : 0;
}

static blas_backend_t s_cuda = {
    BLAS_API_VERSION,           // api_version
    "cuda",                     // name
    "",                         // device, filled at open
    0,                          // memory
    1,                          // threads, set by blas_backend_open
    NULL,                       // ctx: the state is `s`
    s_buf_alloc, s_buf_free, s_upload, s_download, s_zero, s_host_ptr, s_sync,
    s_encoder_forward, s_encoder_backward, s_layernorm_forward, s_layernorm_backward,
    s_matmul_forward, s_matmul_backward, s_attention_forward, s_attention_backward,
    s_gelu_forward, s_gelu_backward, s_add, s_crossentropy, s_sumsq,
    s_memory_used,
};

__global__ void k_probe(int *out)
{
    *out = 42;
}

// Can this device run our kernels? 0, or -ENODEV with the reason.
static int s_probe(char *err, size_t errlen)
{
    int *dev = NULL, got = 0;
    cudaError_t e = cudaMalloc(&dev, sizeof(int));
    if (e == cudaSuccess) {
        k_probe<<<1, 1>>>(dev);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess)
        e = cudaMemcpy(&got, dev, sizeof got, cudaMemcpyDeviceToHost);
    if (dev)
        cudaFree(dev);
    if (e != cudaSuccess || got != 42) {
        snprintf(err, errlen, "a test kernel does not run: %s", cudaGetErrorString(e));
        return -ENODEV;
    }
    return 0;
}

// Device `ordinal`, current, with cuBLAS ready. 0 or -ENODEV with the reason.
static int s_device_open(int ordinal, char *err, size_t errlen)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "cudaGetDeviceCount: %s%s", cudaGetErrorString(e),
                 e == cudaErrorInsufficientDriver ? " (no NVIDIA driver, or one older than "
                 "this CUDA toolkit needs)" : "");
        return -ENODEV;
    }
    if (ordinal >= count) {
        snprintf(err, errlen, "cuda:%d: %d CUDA device%s here", ordinal, count, count == 1 ? "" : "s");
        return -ENODEV;
    }
    cudaDeviceProp prop;
    if ((e = cudaSetDevice(ordinal)) != cudaSuccess
        || (e = cudaGetDeviceProperties(&prop, ordinal)) != cudaSuccess) {
        snprintf(err, errlen, "cuda:%d: %s", ordinal, cudaGetErrorString(e));
        return -ENODEV;
    }
    if (prop.major * 10 + prop.minor < 75) {
        snprintf(err, errlen, "cuda:%d: %s is sm_%d%d; this plugin runs on sm_75 and newer",
                 ordinal, prop.name, prop.major, prop.minor);
        return -ENODEV;
    }
    if (s_probe(err, errlen) != 0)
        return -ENODEV;
    cublasStatus_t st = cublasCreate(&s.blas);
    const char *tf32 = getenv("SWARM_CUDA_TF32");
    int use_tf32 = tf32 && !strcmp(tf32, "1");
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasSetMathMode(s.blas, use_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
    if (st != CUBLAS_STATUS_SUCCESS) {
        snprintf(err, errlen, "cuda:%d: cuBLAS: %s", ordinal, cublasGetStatusString(st));
        return -ENODEV;
    }
    snprintf(s_cuda.device, sizeof s_cuda.device, "cuda:%d %s, %.1f GiB, sm_%d%d%s", ordinal,
             prop.name, (double) prop.totalGlobalMem / (1 << 30), prop.major, prop.minor,
             use_tf32 ? ", TF32" : "");
    // what a node may take is what is free now (another process, a desktop's
    // display, may hold some); the total when the driver does not say
    size_t free_b = 0, total_b = 0;
    s_cuda.memory = cudaMemGetInfo(&free_b, &total_b) == cudaSuccess && free_b > 0
                  ? free_b : prop.totalGlobalMem;
    return 0;
}

extern "C" __attribute__((visibility("default")))
blas_backend_t *blas_cuda_open(int api_version, int ordinal, char *err, size_t errlen)
{
    if (api_version != BLAS_API_VERSION) {
        snprintf(err, errlen, "API version %d asked, this plugin was built for %d; rebuild both",
                 api_version, BLAS_API_VERSION);
        return NULL;
    }
    if (s.ordinal >= 0) {
        if (ordinal == s.ordinal)
            return &s_cuda;
        snprintf(err, errlen, "cuda:%d: this process already uses cuda:%d", ordinal, s.ordinal);
        return NULL;
    }
    if (s_device_open(ordinal, err, errlen) != 0)
        return NULL;
    s.ordinal = ordinal;
    return &s_cuda;
}
