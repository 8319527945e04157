/* bench_gemm.c - OpenBLAS sgemm GFLOP/s: the machine's peak (large square
 * products) and the shapes one step of the baby GPT runs, so `make bench`
 * can say how close swarm train comes to what OpenBLAS can do here.
 *
 * usage: bench_gemm [THREADS]   (prints "key value" lines)
 */
#include "blas.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + 1e-9 * (double) ts.tv_nsec;
}

// GFLOP/s of C (M,N) = A (M,K) B (K,N) repeated for at least `seconds`
static double s_gflops(int M, int N, int K, double seconds)
{
    float *a = malloc(sizeof(float) * M * K), *b = malloc(sizeof(float) * K * N);
    float *c = malloc(sizeof(float) * M * N);
    if (!a || !b || !c)
        abort();
    for (long i = 0; i < (long) M * K; i++)
        a[i] = (float) (i % 7) * 0.1f;
    for (long i = 0; i < (long) K * N; i++)
        b[i] = (float) (i % 5) * 0.1f;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1, a, K, b, N, 0, c, N);
    long reps = 0;
    double t0 = s_now(), t;
    do {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1, a, K, b, N, 0, c, N);
        reps++;
        t = s_now() - t0;
    } while (t < seconds);
    free(a);
    free(b);
    free(c);
    return 2.0 * M * N * K * reps / t / 1e9;
}

int main(int argc, char **argv)
{
    blas_cpu_restart(argv); // the kernels swarm runs
    int threads = argc > 1 ? atoi(argv[1]) : 0;
    blas_backend_t *be = blas_cpu_backend(threads);
    printf("device %s\n", be->device);
    printf("peak_gflops %.1f\n", s_gflops(1536, 1536, 1536, 2.0));
    // the forward products of the baby model (N = B*T = 768 rows, C = 128)
    printf("qkv_768x384x128_gflops %.1f\n", s_gflops(768, 384, 128, 0.5));
    printf("fc1_768x512x128_gflops %.1f\n", s_gflops(768, 512, 128, 0.5));
    printf("fc2_768x128x512_gflops %.1f\n", s_gflops(768, 128, 512, 0.5));
    printf("attn_64x64x32_gflops %.1f\n", s_gflops(64, 64, 32, 0.5));
    return 0;
}
