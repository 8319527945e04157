/* backend.c - choosing a compute backend by name: the CPU backend (linked
 * in) or the CUDA backend, a plugin (swarm-cuda.so) found, dlopen'ed and
 * version-checked at run time, so that the swarm binary never links libcudart
 * or libcublas and runs where they are missing.
 *
 * It says why it chose what it chose; it does not know how a backend
 * computes.
 */
#include "blas.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// Why the CUDA backend could not be had (the words of the log line).
enum { CUDA_NO_PLUGIN, CUDA_BAD_PLUGIN, CUDA_NO_GPU };

static const char *s_cuda_kind[] = { "no CUDA plugin", "CUDA plugin unusable", "no usable GPU" };
static const char *s_cuda_fix[] = {
    "build it with `make` where nvcc is found (PATH or CUDA_HOME), point SWARM_CUDA_PLUGIN "
    "at it, or use --device cpu",
    "install the CUDA libraries it needs (libcublas) or rebuild it, or use --device cpu",
    "check the driver with nvidia-smi, or use --device cpu",
};

// ---- finding the plugin ----------------------------------------------------

// The folder of the running executable, or "" when /proc cannot say.
static void s_exe_dir(char *dir, size_t n)
{
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    dir[0] = '\0';
    if (len <= 0)
        return;
    exe[len] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash)
        *slash = '\0';
    snprintf(dir, n, "%s", exe);
}

// The path of the plugin to load: $SWARM_CUDA_PLUGIN when set (and only it),
// else the first that exists of <exe dir>/swarm-cuda.so (the build folder)
// and <exe dir>/../lib/swarm/swarm-cuda.so (make install). -ENOENT with the
// places looked at in why.
static int s_plugin_find(char *path, size_t n, char *why, size_t whylen)
{
    const char *env = getenv("SWARM_CUDA_PLUGIN");
    if (env && *env) {
        snprintf(path, n, "%s", env);
        if (access(path, R_OK) == 0)
            return 0;
        snprintf(why, whylen, "SWARM_CUDA_PLUGIN=%s: %s", env, strerror(errno));
        return -ENOENT;
    }
    char dir[PATH_MAX], near[PATH_MAX + 32], lib[PATH_MAX + 48];
    s_exe_dir(dir, sizeof dir);
    snprintf(near, sizeof near, "%s/%s", dir, BLAS_CUDA_PLUGIN);
    snprintf(lib, sizeof lib, "%s/../lib/swarm/%s", dir, BLAS_CUDA_PLUGIN);
    const char *paths[] = { near, lib };
    for (int i = 0; i < 2; i++) {
        if (access(paths[i], R_OK) == 0) {
            snprintf(path, n, "%s", paths[i]);
            return 0;
        }
    }
    snprintf(why, whylen, "neither %s nor %s exists", near, lib);
    return -ENOENT;
}

// The plugin's entry point, loaded once per process. NULL with the kind of
// failure in *kind and the reason in why.
static blas_cuda_open_fn s_plugin_entry(int *kind, char *why, size_t whylen)
{
    static blas_cuda_open_fn entry;
    char path[PATH_MAX + 64];
    if (entry)
        return entry;
    if (s_plugin_find(path, sizeof path, why, whylen) != 0) {
        *kind = CUDA_NO_PLUGIN;
        return NULL;
    }
    // never closed: the backend it returns lives until the process ends
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(why, whylen, "%s", dlerror());
        *kind = CUDA_BAD_PLUGIN;
        return NULL;
    }
    void *sym = dlsym(lib, BLAS_CUDA_ENTRY);
    memcpy(&entry, &sym, sizeof entry); // POSIX: a data pointer to a function pointer
    if (!entry) {
        snprintf(why, whylen, "%s has no %s(): not a swarm CUDA plugin", path, BLAS_CUDA_ENTRY);
        *kind = CUDA_BAD_PLUGIN;
    }
    return entry;
}

// The CUDA backend for device `ordinal`, or NULL with *kind and why.
static blas_backend_t *s_cuda_open(int ordinal, int threads, int *kind, char *why, size_t whylen)
{
    blas_cuda_open_fn entry = s_plugin_entry(kind, why, whylen);
    if (!entry)
        return NULL;
    char err[384] = "";
    blas_backend_t *be = entry(BLAS_API_VERSION, ordinal, err, sizeof err);
    if (!be) {
        *kind = !strncmp(err, "API version", 11) ? CUDA_BAD_PLUGIN : CUDA_NO_GPU;
        snprintf(why, whylen, "%s", err[0] ? err : "the plugin gave no reason");
        return NULL;
    }
    if (be->api_version != BLAS_API_VERSION) {
        snprintf(why, whylen, "its table is of API version %d, this swarm speaks %d; rebuild both",
                 be->api_version, BLAS_API_VERSION);
        *kind = CUDA_BAD_PLUGIN;
        return NULL;
    }
    // AdamW and the host-side loops still run on the CPU: one thread knob
    be->threads = blas_cpu_backend(threads)->threads;
    return be;
}

// "cuda" is device 0, "cuda:N" device N. -EINVAL for anything else.
static int s_cuda_ordinal(const char *device, int *ordinal)
{
    if (strncmp(device, "cuda", 4) != 0)
        return -EINVAL;
    if (device[4] == '\0') {
        *ordinal = 0;
        return 0;
    }
    if (device[4] != ':' || device[5] < '0' || device[5] > '9')
        return -EINVAL;
    char *end;
    long n = strtol(device + 5, &end, 10);
    if (*end != '\0' || n > 255)
        return -EINVAL;
    *ordinal = (int) n;
    return 0;
}

// ---- opening ---------------------------------------------------------------

blas_backend_t *blas_backend_open(const char *device, int threads, char *err, size_t errlen)
{
    char why[768] = "";
    int kind = CUDA_NO_PLUGIN, ordinal = 0;
    if (errlen)
        err[0] = '\0';
    if (!device || !strcmp(device, "cpu"))
        return blas_cpu_backend(threads);
    if (!strcmp(device, "auto")) {
        blas_backend_t *be = s_cuda_open(0, threads, &kind, why, sizeof why);
        if (be) {
            snprintf(err, errlen, "device auto: cuda (%s)", be->device);
            return be;
        }
        snprintf(err, errlen, "device auto: cpu (%s: %s)", s_cuda_kind[kind], why);
        return blas_cpu_backend(threads);
    }
    if (s_cuda_ordinal(device, &ordinal) == 0) {
        blas_backend_t *be = s_cuda_open(ordinal, threads, &kind, why, sizeof why);
        if (!be)
            snprintf(err, errlen, "--device %s: %s: %s; %s", device, s_cuda_kind[kind], why,
                     s_cuda_fix[kind]);
        return be;
    }
    snprintf(err, errlen, "--device %s: unknown device; use auto, cpu or cuda[:N]", device);
    return NULL;
}
