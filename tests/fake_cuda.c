/* fake_cuda.c - a stand-in for the CUDA plugin (built as fake-cuda.so), so
 * that check_blas can test how swarm finds, loads and checks a plugin on a
 * machine without a GPU. FAKE_CUDA_MODE picks what blas_cuda_open does:
 * "ok" gives a table with no ops, "nodevice" and "version" refuse as the real
 * plugin would, "table" gives a table of another API version.
 */
#include "blas.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static blas_backend_t s_fake = { .api_version = BLAS_API_VERSION, .name = "cuda",
                                 .device = "fake GPU", .memory = 1 };

__attribute__((visibility("default")))
blas_backend_t *blas_cuda_open(int api_version, int ordinal, char *err, size_t errlen);

blas_backend_t *blas_cuda_open(int api_version, int ordinal, char *err, size_t errlen)
{
    const char *mode = getenv("FAKE_CUDA_MODE");
    mode = mode ? mode : "ok";
    if (!strcmp(mode, "version") || api_version != BLAS_API_VERSION) {
        snprintf(err, errlen, "API version %d asked, this plugin is %d", api_version,
                 BLAS_API_VERSION + 1);
        return NULL;
    }
    if (!strcmp(mode, "nodevice")) {
        snprintf(err, errlen, "cuda:%d: fake has no device", ordinal);
        return NULL;
    }
    s_fake.api_version = !strcmp(mode, "table") ? BLAS_API_VERSION + 1 : BLAS_API_VERSION;
    snprintf(s_fake.device, sizeof s_fake.device, "fake GPU %d", ordinal);
    return &s_fake;
}
