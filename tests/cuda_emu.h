/* cuda_emu.h - just enough of CUDA and cuBLAS, on the CPU, to run
 * blas/cuda.cu's source where there is no GPU: build/swarm-cuda-emu.so, which
 * check_cuda holds to the CPU backend in `make test`.
 *
 * Each block runs alone; its threads are fibers (build with -U_FORTIFY_SOURCE:
 * they _longjmp between stacks) switched at every
 * __syncthreads and warp shuffle, in a shuffled order each time, so a
 * missing barrier tends to show. A barrier some threads of a block never
 * reach is reported and aborts. cuBLAS is OpenBLAS in column-major order,
 * which has cuBLAS's semantics exactly. What this cannot show: timing, the
 * GPU memory model, races between blocks, and what only a real device does.
 * Test code only: tests/mk-cuda-emu.sh rewrites kernel launches to
 * emu_launch() and includes this header in place of the CUDA headers.
 */
#ifndef SWARM_CUDA_EMU_H
#define SWARM_CUDA_EMU_H

#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <malloc.h>
#include <setjmp.h>
#include <ucontext.h>

#include <algorithm>
#include <functional>
#include <vector>

#define __global__
#define __device__
#define __shared__ static // blocks run one at a time: one copy per block

struct uint3 { unsigned x, y, z; };
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

static uint3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;

// ---- fibers ------------------------------------------------------------------

enum { EMU_RUN, EMU_BLOCK_WAIT, EMU_WARP_WAIT, EMU_DONE };

struct emu_fiber {
    jmp_buf jb;         // where it resumes: parked, or waiting at a barrier
    unsigned tid;       // threadIdx.x
    int state;          // EMU_*
};

static struct {
    std::vector<emu_fiber> fibers;  // one per thread of a block, each with its own stack
    jmp_buf sched;                  // the scheduler, while a fiber runs
    ucontext_t init;                // the creator of a fiber, while it first parks
    unsigned current;               // the fiber running
    const std::function<void()> *body; // the kernel with its arguments
    float warp_slots[32][32];       // a value per lane, per warp (up to 1024 threads)
    uint64_t rng;                   // the order fibers run in
} emu;

enum { EMU_STACK = 64 * 1024 };

static void emu_yield(int state)
{
    emu_fiber &f = emu.fibers[emu.current];
    f.state = state;
    if (!_setjmp(f.jb))
        _longjmp(emu.sched, 1);
}

// A fiber's life: park, then run the kernel as one thread each time it is
// resumed, forever. ucontext only to start it on its stack (its signal mask
// system calls would dominate), _setjmp/_longjmp to switch.
static void emu_trampoline(void)
{
    unsigned i = emu.current;
    volatile int first = 1; // read again after a _longjmp
    for (;;) {
        if (!_setjmp(emu.fibers[i].jb)) {
            if (first) {
                ucontext_t here;
                first = 0;
                swapcontext(&here, &emu.init);
            }
            _longjmp(emu.sched, 1);
        }
        (*emu.body)();
        emu.fibers[i].state = EMU_DONE;
    }
}

// Fibers for `threads` threads, each parked.
static void emu_fibers_make(unsigned threads)
{
    static std::vector<char *> stacks;
    if (emu.fibers.size() >= threads)
        return;
    size_t had = emu.fibers.size();
    emu.fibers.resize(threads); // parked fibers keep no pointer into this vector
    for (size_t i = had; i < threads; i++) {
        ucontext_t ctx;
        stacks.push_back((char *) malloc(EMU_STACK));
        getcontext(&ctx);
        ctx.uc_stack.ss_sp = stacks.back();
        ctx.uc_stack.ss_size = EMU_STACK;
        ctx.uc_link = NULL;
        makecontext(&ctx, emu_trampoline, 0);
        emu.current = (unsigned) i;
        swapcontext(&emu.init, &ctx);
    }
}

// run fiber i until it waits or ends
static void emu_resume(unsigned i)
{
    emu.current = i;
    threadIdx = uint3{ emu.fibers[i].tid, 0, 0 };
    if (!_setjmp(emu.sched))
        _longjmp(emu.fibers[i].jb, 1);
}

static unsigned emu_rand(unsigned n)
{
    emu.rng = emu.rng * 6364136223846793005ull + 1442695040888963407ull;
    return (unsigned) ((emu.rng >> 33) % n);
}

// Run every thread of the block until all are done, releasing barriers.
static void emu_block_run(unsigned threads)
{
    std::vector<unsigned> order(threads);
    for (unsigned i = 0; i < threads; i++) {
        order[i] = i;
        emu.fibers[i].tid = i;
        emu.fibers[i].state = EMU_RUN;
    }
    for (;;) {
        for (unsigned i = threads; i > 1; i--) // a new order every phase
            std::swap(order[i - 1], order[emu_rand(i)]);
        for (unsigned k = 0; k < threads; k++)
            if (emu.fibers[order[k]].state == EMU_RUN)
                emu_resume(order[k]);
        // nothing runs: release a warp whose live lanes all wait, else the block
        int released = 0;
        for (unsigned w = 0; w * 32 < threads; w++) {
            int live = 0, waiting = 0;
            for (unsigned i = w * 32; i < std::min(threads, w * 32 + 32); i++) {
                live += emu.fibers[i].state != EMU_DONE;
                waiting += emu.fibers[i].state == EMU_WARP_WAIT;
            }
            if (live && waiting == live) {
                for (unsigned i = w * 32; i < std::min(threads, w * 32 + 32); i++)
                    if (emu.fibers[i].state == EMU_WARP_WAIT)
                        emu.fibers[i].state = EMU_RUN;
                released = 1;
            }
        }
        if (released)
            continue;
        int live = 0, waiting = 0;
        for (unsigned i = 0; i < threads; i++) {
            live += emu.fibers[i].state != EMU_DONE;
            waiting += emu.fibers[i].state == EMU_BLOCK_WAIT;
        }
        if (!live)
            return;
        if (waiting != live) {
            fprintf(stderr, "cuda_emu: block (%u,%u): threads wait at different barriers\n",
                    blockIdx.x, blockIdx.y);
            abort();
        }
        for (unsigned i = 0; i < threads; i++)
            if (emu.fibers[i].state == EMU_BLOCK_WAIT)
                emu.fibers[i].state = EMU_RUN;
    }
}

struct emu_cfg_t { dim3 grid, block; };
static inline emu_cfg_t emu_cfg(dim3 grid, dim3 block) { return emu_cfg_t{ grid, block }; }

template <class K, class... A>
static void emu_launch(emu_cfg_t cfg, K kernel, A... args)
{
    unsigned threads = cfg.block.x;
    if (threads == 0 || threads > 1024 || cfg.block.y != 1 || cfg.block.z != 1) {
        fprintf(stderr, "cuda_emu: unsupported block %u x %u x %u\n", cfg.block.x, cfg.block.y,
                cfg.block.z);
        abort();
    }
    std::function<void()> body = [&]() { kernel(args...); };
    emu.body = &body;
    emu_fibers_make(threads);
    gridDim = cfg.grid;
    blockDim = cfg.block;
    for (unsigned by = 0; by < cfg.grid.y; by++)
        for (unsigned bx = 0; bx < cfg.grid.x; bx++) {
            blockIdx = uint3{ bx, by, 0 };
            emu_block_run(threads);
        }
}

static inline void __syncthreads(void)
{
    emu_yield(EMU_BLOCK_WAIT);
}

// every live lane of the warp must call it, as on the GPU with a full mask
template <class T>
static T __shfl_xor_sync(unsigned mask, T v, int lane_mask)
{
    (void) mask;
    unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    emu.warp_slots[warp][lane] = (float) v;
    emu_yield(EMU_WARP_WAIT);
    T got = (T) emu.warp_slots[warp][lane ^ (unsigned) lane_mask];
    emu_yield(EMU_WARP_WAIT); // nobody overwrites a slot before all have read
    return got;
}

using std::min;

// ---- runtime -----------------------------------------------------------------

typedef enum {
    cudaSuccess = 0,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNoDevice = 100,
    cudaErrorUnknown = 999,
} cudaError_t;

typedef enum {
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
} cudaMemcpyKind;

typedef struct {
    char name[256];
    size_t totalGlobalMem;
    int major, minor;
} cudaDeviceProp;

static inline const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    default: return "unknown error";
    }
}

static inline cudaError_t cudaGetLastError(void) { return cudaSuccess; }
static inline cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
static inline cudaError_t cudaSetDevice(int d) { (void) d; return cudaSuccess; }

static inline cudaError_t cudaGetDeviceCount(int *n)
{
    // SWARM_CUDA_EMU_DEVICES=0 plays a machine without a GPU
    const char *env = getenv("SWARM_CUDA_EMU_DEVICES");
    *n = env ? atoi(env) : 1;
    return *n > 0 ? cudaSuccess : cudaErrorNoDevice;
}

static inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d)
{
    (void) d;
    snprintf(p->name, sizeof p->name, "CPU emulation");
    p->totalGlobalMem = (size_t) 1 << 30;
    p->major = 9;
    p->minor = 0;
    return cudaSuccess;
}

// the bytes cudaMalloc has handed out and not had back
static size_t emu_device_taken;

// the emulated device's 1 GiB, a quarter of it held by another process (so
// a node's default budget shows it took what is free), less what this one
// took with cudaMalloc
static inline cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b)
{
    *total_b = (size_t) 1 << 30;
    size_t free_now = *total_b / 4 * 3;
    *free_b = emu_device_taken < free_now ? free_now - emu_device_taken : 0;
    return cudaSuccess;
}

template <class T>
static cudaError_t cudaMalloc(T **p, size_t bytes)
{
    *p = (T *) malloc(bytes);
    if (*p) {
        memset(*p, 0xff, bytes); // NaN: fresh device memory is garbage
        emu_device_taken += malloc_usable_size(*p);
    }
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

static inline cudaError_t cudaFree(void *p)
{
    if (p)
        emu_device_taken -= malloc_usable_size(p);
    free(p);
    return cudaSuccess;
}

static inline cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind k)
{
    (void) k;
    memmove(dst, src, n);
    return cudaSuccess;
}

static inline cudaError_t cudaMemsetAsync(void *p, int v, size_t n, int stream)
{
    (void) stream;
    memset(p, v, n);
    return cudaSuccess;
}

// ---- cuBLAS --------------------------------------------------------------------

typedef struct emu_blas *cublasHandle_t;
typedef enum { CUBLAS_STATUS_SUCCESS = 0 } cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUBLAS_DEFAULT_MATH = 0, CUBLAS_TF32_TENSOR_OP_MATH = 3 } cublasMath_t;

static inline cublasStatus_t cublasCreate(cublasHandle_t *h)
{
    *h = NULL;
    return CUBLAS_STATUS_SUCCESS;
}

static inline cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m)
{
    (void) h, (void) m;
    return CUBLAS_STATUS_SUCCESS;
}

static inline const char *cublasGetStatusString(cublasStatus_t s)
{
    return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_ERROR";
}

static inline CBLAS_TRANSPOSE emu_op(cublasOperation_t op)
{
    return op == CUBLAS_OP_T ? CblasTrans : CblasNoTrans;
}

static inline cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta,
                                         cublasOperation_t tb, int m, int n, int k,
                                         const float *alpha, const float *a, int lda,
                                         const float *b, int ldb, const float *beta, float *c,
                                         int ldc)
{
    (void) h;
    cblas_sgemm(CblasColMajor, emu_op(ta), emu_op(tb), m, n, k, *alpha, a, lda, b, ldb, *beta,
                c, ldc);
    return CUBLAS_STATUS_SUCCESS;
}

static inline cublasStatus_t cublasSgemmStridedBatched(
    cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
    const float *alpha, const float *a, int lda, long long sa, const float *b, int ldb,
    long long sb, const float *beta, float *c, int ldc, long long sc, int count)
{
    for (int i = 0; i < count; i++)
        cublasSgemm(h, ta, tb, m, n, k, alpha, a + i * sa, lda, b + i * sb, ldb, beta, c + i * sc,
                    ldc);
    return CUBLAS_STATUS_SUCCESS;
}

#endif
