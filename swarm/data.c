/* data.c - training data: a file of raw bytes, its train/val split, and the
 * splitmix64 window sampler of the PyTorch reference (ref_gpt.py).
 *
 * It does not tokenize (the vocabulary is the 256 byte values) and does not
 * hold batches: callers give the buffers.
 */
#include "swarm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define SPLITMIX_GAMMA 0x9E3779B97F4A7C15ull

struct swarm_data_s {
    uint8_t *owned;        // bytes we allocated, or NULL when wrapped
    const uint8_t *bytes;  // the whole file (n)
    size_t n;              // bytes
    size_t n_train;        // bytes in the train split: int(0.9 n)
    char name[256];        // file name for messages
};

static void s_split(swarm_data_t *self)
{
    // int(0.9 * n) in double, as Python computes it
    self->n_train = (size_t) (0.9 * (double) self->n);
}

int swarm_data_load(const char *path, swarm_data_t **out, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        snprintf(err, errlen, "--data %s: %s", path, strerror(e));
        return -e;
    }
    int rc = 0;
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "--data %s: not a regular file", path);
        rc = -EINVAL;
        goto out_close;
    }
    swarm_data_t *self = calloc(1, sizeof *self);
    uint8_t *buf = malloc(st.st_size ? (size_t) st.st_size : 1);
    if (!self || !buf) {
        free(self);
        free(buf);
        snprintf(err, errlen, "--data %s: out of memory for %lld bytes", path, (long long) st.st_size);
        rc = -ENOMEM;
        goto out_close;
    }
    size_t got = fread(buf, 1, (size_t) st.st_size, f);
    if (got != (size_t) st.st_size) {
        snprintf(err, errlen, "--data %s: read %zu of %lld bytes", path, got, (long long) st.st_size);
        free(self);
        free(buf);
        rc = -EIO;
        goto out_close;
    }
    self->owned = buf;
    self->bytes = buf;
    self->n = got;
    snprintf(self->name, sizeof self->name, "%s", path);
    s_split(self);
    *out = self;
out_close:
    fclose(f);
    return rc;
}

swarm_data_t *swarm_data_wrap(const uint8_t *bytes, size_t n, const char *name)
{
    swarm_data_t *self = calloc(1, sizeof *self);
    if (!self)
        abort();
    self->bytes = bytes;
    self->n = n;
    snprintf(self->name, sizeof self->name, "%s", name);
    s_split(self);
    return self;
}

void swarm_data_destroy(swarm_data_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    free((*self_p)->owned);
    free(*self_p);
    *self_p = NULL;
}

const char *swarm_data_name(const swarm_data_t *self) { return self->name; }
size_t swarm_data_size(const swarm_data_t *self) { return self->n; }

const uint8_t *swarm_data_split(const swarm_data_t *self, int val, size_t *n)
{
    *n = val ? self->n - self->n_train : self->n_train;
    return val ? self->bytes + self->n_train : self->bytes;
}

int swarm_data_check(const swarm_data_t *self, int T, char *err, size_t errlen)
{
    size_t need = (size_t) T + 1;
    size_t n_val = self->n - self->n_train;
    if (self->n == 0) {
        snprintf(err, errlen, "--data %s: the file is empty; give a text file of at least %zu bytes",
                 self->name, need * 10);
        return -EINVAL;
    }
    if (self->n_train < need || n_val < need) {
        snprintf(err, errlen,
                 "--data %s: %zu bytes is too small for --block %d (train split %zu and val split "
                 "%zu bytes must each exceed %d); give at least %zu bytes",
                 self->name, self->n, T, self->n_train, n_val, T, need * 10);
        return -EINVAL;
    }
    return 0;
}

uint64_t swarm_splitmix64(uint64_t *state)
{
    *state += SPLITMIX_GAMMA;
    uint64_t z = *state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void s_window(const uint8_t *split, size_t n, uint64_t draw, int T, int32_t *x, int32_t *y)
{
    size_t s = (size_t) (draw % (uint64_t) (n - (size_t) T));
    for (int t = 0; t < T; t++) {
        x[t] = split[s + t];
        y[t] = split[s + t + 1];
    }
}

void swarm_data_train_batch(const swarm_data_t *self, uint64_t seed, long step, int B,
                            int first, int count, int T, int32_t *x, int32_t *y)
{
    size_t n;
    const uint8_t *split = swarm_data_split(self, 0, &n);
    for (int i = 0; i < count; i++) {
        // draw number d of the stream starts from state seed + d * gamma
        uint64_t d = (uint64_t) step * (uint64_t) B + (uint64_t) (first + i);
        uint64_t state = seed + d * SPLITMIX_GAMMA;
        s_window(split, n, swarm_splitmix64(&state), T, x + (size_t) i * T, y + (size_t) i * T);
    }
}

void swarm_data_draw(const swarm_data_t *self, int val, uint64_t *state,
                     int count, int T, int32_t *x, int32_t *y)
{
    size_t n;
    const uint8_t *split = swarm_data_split(self, val, &n);
    for (int i = 0; i < count; i++)
        s_window(split, n, swarm_splitmix64(state), T, x + (size_t) i * T, y + (size_t) i * T);
}
