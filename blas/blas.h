/* blas.h - the compute backend interface: device buffers and every op the
 * byte-level GPT needs, forward and backward.
 *
 * A backend is a versioned table of function pointers (DESIGN.md section 7).
 * Pointers passed to ops are device pointers from buf_alloc; for the CPU
 * backend they are plain host memory. Ops do not fail (a GPU error surfaces
 * at the next download); allocation and transfers return 0 or -errno.
 * blas knows nothing of sockets, stages or files.
 *
 * Letters: B batch, T time, C channels, V vocabulary, H heads,
 * N = B*T rows, OC output channels.
 */
#ifndef SWARM_BLAS_H
#define SWARM_BLAS_H

#include <stddef.h>
#include <stdint.h>

#define BLAS_API_VERSION 2

typedef struct blas_backend_s blas_backend_t;

struct blas_backend_s {
    int api_version;                 // BLAS_API_VERSION the table was built for
    const char *name;                // "cpu" or "cuda"
    char device[128];                // human-readable device description
    size_t memory;                   // bytes of device memory free at open (cpu: host RAM)
    int threads;                     // CPU threads in use (OpenBLAS + our loops)
    void *ctx;                       // backend private state

    // ---- memory ----
    int (*buf_alloc)(blas_backend_t *self, size_t bytes, void **out);
    void (*buf_free)(blas_backend_t *self, void *buf);
    int (*upload)(blas_backend_t *self, void *dst, const void *src, size_t bytes);
    int (*download)(blas_backend_t *self, void *dst, const void *src, size_t bytes);
    void (*zero)(blas_backend_t *self, void *buf, size_t bytes);
    // host view of a device buffer, or NULL when device memory is separate
    // (optional)
    void *(*host_ptr)(blas_backend_t *self, void *buf);
    int (*sync)(blas_backend_t *self);

    // ---- ops ----
    // out (B,T,C) = wte[tokens] + wpe[t]
    void (*encoder_forward)(float *out, const int32_t *tokens, const float *wte,
                            const float *wpe, int B, int T, int C);
    // dwte[tokens] += dout, dwpe[t] += dout
    void (*encoder_backward)(float *dwte, float *dwpe, const float *dout,
                             const int32_t *tokens, int B, int T, int C);
    // out (N,C), mean (N), rstd (N); eps 1e-5
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp,
                              const float *weight, const float *bias, int N, int C);
    // dinp += ..., dweight += ..., dbias += ...
    void (*layernorm_backward)(float *dinp, float *dweight, float *dbias,
                               const float *dout, const float *inp, const float *weight,
                               const float *mean, const float *rstd, int N, int C);
    // out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC, may be NULL)
    void (*matmul_forward)(float *out, const float *inp, const float *weight,
                           const float *bias, int N, int C, int OC);
    // dinp (N,C) = dout @ weight (overwritten; skipped when dinp is NULL);
    // dweight (OC,C) += dout^T @ inp; dbias (OC) += column sums (may be NULL)
    void (*matmul_backward)(float *dinp, float *dweight, float *dbias,
                            const float *dout, const float *inp, const float *weight,
                            int N, int C, int OC);
    // qkv (B,T,3C) -> out (B,T,C); att (B,H,T,T) keeps the softmax for backward
    void (*attention_forward)(float *out, float *att, const float *qkv,
                              int B, int T, int C, int H);
    // dqkv (B,T,3C) overwritten; datt (B,H,T,T) is scratch
    void (*attention_backward)(float *dqkv, float *datt, const float *dout,
                               const float *qkv, const float *att,
                               int B, int T, int C, int H);
    // tanh-approximated GELU, elementwise over n
    void (*gelu_forward)(float *out, const float *inp, size_t n);
    // dinp = gelu'(inp) * dout (overwritten)
    void (*gelu_backward)(float *dinp, const float *inp, const float *dout, size_t n);
    // out = a + b over n (out may alias a or b)
    void (*add)(float *out, const float *a, const float *b, size_t n);
    // For each of N rows of logits (N,V): losses[n] = -log softmax[target];
    // when scale != 0 the logits are replaced by scale * (softmax - onehot),
    // the gradient of scale * sum(losses). Targets must be in [0,V).
    void (*crossentropy)(float *logits, float *losses, const int32_t *targets,
                         int N, int V, float scale);
    // sum of squares of n floats, accumulated in double (for gradient norms)
    double (*sumsq)(const float *x, size_t n);

    // ---- measured ----
    // bytes of device memory taken since the backend opened (what the
    // device had free then less what it has free now: this process's
    // buffers, cuBLAS's workspace, and whatever else took some meanwhile);
    // NULL where device memory is the host's (cpu: the heap says it)
    size_t (*memory_used)(blas_backend_t *self);
};

// The CPU backend (OpenBLAS sgemm + C loops). threads <= 0 means all cores.
// It sets the thread count of OpenBLAS and of swarm's own loops together.
blas_backend_t *blas_cpu_backend(int threads);

// Open a backend by name: "cpu", "cuda", "cuda:N" or "auto" (a working GPU,
// else the CPU). On failure NULL, with one line in err naming --device, the
// reason and the fix. On success err holds what auto chose and why (e.g.
// "device auto: cpu (no usable GPU: ...)"), empty for an explicit device:
// the caller logs it. threads sets the CPU threads for either backend
// (AdamW runs on the CPU).
blas_backend_t *blas_backend_open(const char *device, int threads, char *err, size_t errlen);

// ---- the CUDA plugin -------------------------------------------------------
// BLAS_CUDA_PLUGIN is looked for at $SWARM_CUDA_PLUGIN (only there, when
// set), else next to the executable, else in <exe dir>/../lib/swarm/. It
// exports one function, BLAS_CUDA_ENTRY: the backend of device `ordinal`
// when api_version is the plugin's own and that GPU works; else NULL with a
// line in err, which starts with "API version" when the versions differ.
// A process uses one device; the table lives until the process ends.
#define BLAS_CUDA_PLUGIN "swarm-cuda.so"
#define BLAS_CUDA_ENTRY "blas_cuda_open"
typedef blas_backend_t *(*blas_cuda_open_fn)(int api_version, int ordinal, char *err,
                                             size_t errlen);

// Number of CPU cores available to this process.
int blas_cpu_count(void);

// The OpenBLAS build in use, for logs (e.g. "OpenBLAS 0.3.21 Haswell MAX_THREADS=64").
const char *blas_cpu_info(void);

// The OpenBLAS core to ask for (OPENBLAS_CORETYPE, read when the library
// loads) where OpenBLAS fell back to its SSE3 core on a CPU it does not
// know and the CPU runs a newer one, named by the features the CPU and the
// OS give it; NULL where OpenBLAS's own pick stands or the user chose one.
const char *blas_cpu_core_pick(void);

// First thing in main: restart the program once (argv, through
// /proc/self/exe) with a short OpenMP spin (GOMP_SPINCOUNT) and
// blas_cpu_core_pick's core, unless the user chose how threads wait
// (OMP_WAIT_POLICY or GOMP_SPINCOUNT) and no core needs picking.
void blas_cpu_restart(char **argv);

#endif
