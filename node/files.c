/* files.c - what swarm keeps on disk: BGPT weight files (the PyTorch
 * reference's format) and checkpoints (parameters, AdamW moments, step and
 * schedule, BLAKE2b-checksummed).
 *
 * Every write is atomic (temporary file, fsync, rename, fsync of the folder);
 * every read checks each header field and the size before trusting a byte.
 */
#include "node.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "swarm's files and wire are little-endian; this build assumes a little-endian host"
#endif

#define BGPT_HEADER 64
#define CKPT_HEADER 128
#define CKPT_VERSION 1
#define CKPT_SUM 32

// ---- little-endian fields --------------------------------------------------

static void s_put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void s_put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t s_get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t s_get64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static void s_putf(uint8_t *p, float f) { memcpy(p, &f, 4); }
static float s_getf(const uint8_t *p) { float f; memcpy(&f, p, 4); return f; }
static void s_putd(uint8_t *p, double d) { memcpy(p, &d, 8); }
static double s_getd(const uint8_t *p) { double d; memcpy(&d, p, 8); return d; }

// The model shape, V T C L H as five int32 at p (both file headers hold it
// at offset 8).
static void s_put_config(uint8_t *p, const node_config_t *c)
{
    const int32_t f[5] = { c->V, c->T, c->C, c->L, c->H };
    for (int i = 0; i < 5; i++)
        s_put32(p + 4 * i, (uint32_t) f[i]);
}

static node_config_t s_get_config(const uint8_t *p)
{
    return (node_config_t) {
        (int32_t) s_get32(p), (int32_t) s_get32(p + 4), (int32_t) s_get32(p + 8),
        (int32_t) s_get32(p + 12), (int32_t) s_get32(p + 16),
    };
}

// ---- atomic writes ---------------------------------------------------------

typedef struct {
    const void *data;   // bytes to write
    size_t size;        // bytes
} chunk_t;

// Write chunks to path through path.tmp, fsync, rename, fsync the folder.
// With sum != NULL, a BLAKE2b-256 of all chunks is appended.
static int s_write_atomic(const char *path, const chunk_t *chunks, int count, int sum,
                          char *err, size_t errlen)
{
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int) sizeof tmp) {
        snprintf(err, errlen, "%s: path too long", path);
        return -ENAMETOOLONG;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "%s: cannot create: %s", tmp, strerror(e));
        return -e;
    }
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, CKPT_SUM);
    int rc = 0;
    for (int i = 0; i <= count && rc == 0; i++) {
        uint8_t digest[CKPT_SUM];
        const uint8_t *p = i < count ? chunks[i].data : digest;
        size_t left = i < count ? chunks[i].size : (sum ? CKPT_SUM : 0);
        if (i < count) {
            crypto_generichash_update(&st, p, left);
        } else if (sum) {
            crypto_generichash_final(&st, digest, CKPT_SUM);
        }
        while (left > 0) {
            ssize_t w = write(fd, p, left);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0) {
                rc = w < 0 ? -errno : -EIO;
                snprintf(err, errlen, "%s: write failed: %s", tmp, strerror(-rc));
                break;
            }
            p += w;
            left -= (size_t) w;
        }
    }
    if (rc == 0 && fsync(fd) != 0) {
        rc = -errno;
        snprintf(err, errlen, "%s: fsync failed: %s", tmp, strerror(-rc));
    }
    if (close(fd) != 0 && rc == 0) {
        rc = -errno;
        snprintf(err, errlen, "%s: close failed: %s", tmp, strerror(-rc));
    }
    if (rc == 0 && rename(tmp, path) != 0) {
        rc = -errno;
        snprintf(err, errlen, "%s: rename failed: %s", path, strerror(-rc));
    }
    if (rc != 0) {
        unlink(tmp);
        return rc;
    }
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return 0;
}

int node_file_write(const char *path, const void *data, size_t size, char *err, size_t errlen)
{
    const chunk_t chunk = { data, size };
    return s_write_atomic(path, &chunk, 1, 0, err, errlen);
}

// Read a whole file into malloc'ed memory, refusing more than max bytes.
static int s_read_all(const char *path, size_t max, uint8_t **out, size_t *size,
                      char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "%s: %s", path, strerror(e));
        return -e;
    }
    int rc = 0;
    struct stat sb;
    uint8_t *buf = NULL;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file", path);
        rc = -EINVAL;
        goto out_close;
    }
    if ((uint64_t) sb.st_size > max) {
        snprintf(err, errlen, "%s: %lld bytes is larger than any model this build accepts",
                 path, (long long) sb.st_size);
        rc = -EFBIG;
        goto out_close;
    }
    buf = malloc(sb.st_size ? (size_t) sb.st_size : 1);
    if (!buf) {
        snprintf(err, errlen, "%s: out of memory for %lld bytes", path, (long long) sb.st_size);
        rc = -ENOMEM;
        goto out_close;
    }
    size_t got = 0;
    while (got < (size_t) sb.st_size) {
        ssize_t r = read(fd, buf + got, (size_t) sb.st_size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            snprintf(err, errlen, "%s: read failed after %zu bytes", path, got);
            rc = -EIO;
            free(buf);
            goto out_close;
        }
        got += (size_t) r;
    }
    *out = buf;
    *size = got;
out_close:
    close(fd);
    return rc;
}

#define MAX_FILE ((size_t) 64 << 30)

// ---- BGPT ------------------------------------------------------------------

// 0 when every one of n floats at p (little-endian) is finite (and, with
// nonneg, not below zero), else -EINVAL naming the first that is not.
static int s_values_check(const uint8_t *p, size_t n, int nonneg, const char *name,
                          const char *what, char *err, size_t errlen)
{
    for (size_t i = 0; i < n; i++) {
        float x = s_getf(p + 4 * i);
        if (!isfinite(x) || (nonneg && x < 0.0f)) {
            snprintf(err, errlen, "%s: %s %zu is %g; the file is corrupt or the run diverged "
                     "(use an earlier checkpoint)", name, what, i, (double) x);
            return -EINVAL;
        }
    }
    return 0;
}

int node_bgpt_decode(const uint8_t *buf, size_t size, const char *name, node_bgpt_header_t *hdr,
                     float **data, char *err, size_t errlen)
{
    char why[200];
    *data = NULL;
    memset(hdr, 0, sizeof *hdr);
    if (size < BGPT_HEADER) {
        snprintf(err, errlen, "%s: %zu bytes is shorter than the 64-byte BGPT header", name, size);
        return -EINVAL;
    }
    if (memcmp(buf, "BGPT", 4) != 0) {
        snprintf(err, errlen, "%s: not a BGPT weight file (magic is not \"BGPT\")", name);
        return -EINVAL;
    }
    if (s_get32(buf + 4) != 1) {
        snprintf(err, errlen, "%s: BGPT version %u; this build reads version 1", name, s_get32(buf + 4));
        return -EINVAL;
    }
    hdr->cfg = s_get_config(buf + 8);
    hdr->kind = (int32_t) s_get32(buf + 28);
    hdr->step = (int32_t) s_get32(buf + 32);
    hdr->loss = s_getf(buf + 36);
    if (node_config_check(&hdr->cfg, why, sizeof why) != 0) {
        snprintf(err, errlen, "%s: bad model shape in header: %s", name, why);
        return -EINVAL;
    }
    if (hdr->kind != 0 && hdr->kind != 1) {
        snprintf(err, errlen, "%s: kind %d; expected 0 (weights) or 1 (gradients)", name, hdr->kind);
        return -EINVAL;
    }
    if (hdr->step < 0 || !isfinite(hdr->loss)) {
        snprintf(err, errlen, "%s: step %d, loss %g in header: expected step >= 0 and a finite "
                 "loss", name, hdr->step, (double) hdr->loss);
        return -EINVAL;
    }
    for (int i = 40; i < BGPT_HEADER; i++) {
        if (buf[i] != 0) {
            snprintf(err, errlen, "%s: header byte %d is not zero; the file is corrupt", name, i);
            return -EINVAL;
        }
    }
    size_t n = node_config_params(&hdr->cfg);
    if (size != BGPT_HEADER + 4 * n) {
        snprintf(err, errlen, "%s: %zu bytes, but L=%d H=%d C=%d T=%d needs %zu (%zu parameters); "
                 "the file is truncated or does not match its header",
                 name, size, hdr->cfg.L, hdr->cfg.H, hdr->cfg.C, hdr->cfg.T, BGPT_HEADER + 4 * n, n);
        return -EINVAL;
    }
    int rc = s_values_check(buf + BGPT_HEADER, n, 0, name, hdr->kind ? "gradient" : "parameter",
                            err, errlen);
    if (rc != 0)
        return rc;
    *data = malloc(n * sizeof(float));
    if (!*data) {
        snprintf(err, errlen, "%s: out of memory for %zu parameters", name, n);
        return -ENOMEM;
    }
    memcpy(*data, buf + BGPT_HEADER, n * sizeof(float));
    return 0;
}

int node_bgpt_read(const char *path, node_bgpt_header_t *hdr, float **data, char *err, size_t errlen)
{
    uint8_t *buf = NULL;
    size_t size = 0;
    int rc = s_read_all(path, MAX_FILE, &buf, &size, err, errlen);
    if (rc == 0)
        rc = node_bgpt_decode(buf, size, path, hdr, data, err, errlen);
    free(buf);
    return rc;
}

int node_bgpt_write(const char *path, const node_bgpt_header_t *hdr, const float *data,
                    char *err, size_t errlen)
{
    uint8_t h[BGPT_HEADER] = {0};
    memcpy(h, "BGPT", 4);
    s_put32(h + 4, 1);
    s_put_config(h + 8, &hdr->cfg);
    s_put32(h + 28, (uint32_t) hdr->kind);
    s_put32(h + 32, (uint32_t) hdr->step);
    s_putf(h + 36, hdr->loss);
    chunk_t chunks[2] = {
        {h, sizeof h},
        {data, node_config_params(&hdr->cfg) * sizeof(float)},
    };
    return s_write_atomic(path, chunks, 2, 0, err, errlen);
}

// ---- checkpoints -----------------------------------------------------------

int node_mkdirs(const char *dir, unsigned mode, char *err, size_t errlen)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s", dir) >= (int) sizeof path) {
        snprintf(err, errlen, "%s: path too long", dir);
        return -ENAMETOOLONG;
    }
    for (char *p = path + 1; ; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        char c = *p;
        *p = '\0';
        if (mkdir(path, (mode_t) mode) != 0 && errno != EEXIST) {
            int e = errno;
            snprintf(err, errlen, "cannot create %s: %s", path, strerror(e));
            return -e;
        }
        *p = c;
        if (c == '\0')
            break;
    }
    return 0;
}

static void s_ckpt_header(uint8_t *h, const node_ckpt_meta_t *m)
{
    memset(h, 0, CKPT_HEADER);
    memcpy(h, "SWCK", 4);
    s_put32(h + 4, CKPT_VERSION);
    s_put_config(h + 8, &m->cfg);
    s_put32(h + 28, (uint32_t) m->batch);
    s_put64(h + 32, (uint64_t) m->step);
    s_put64(h + 40, m->seed);
    s_put64(h + 48, (uint64_t) m->iters);
    s_put64(h + 56, (uint64_t) m->warmup);
    s_putd(h + 64, m->lr);
    s_putd(h + 72, m->min_lr);
    s_putd(h + 80, m->weight_decay);
    s_putd(h + 88, m->grad_clip);
    s_put64(h + 96, (uint64_t) node_config_params(&m->cfg));
}

int node_ckpt_save(const char *dir, const node_ckpt_meta_t *meta, const float *params,
                   const float *m, const float *v, char *err, size_t errlen)
{
    char why[512] = "";
    int rc = node_mkdirs(dir, 0755, why, sizeof why);
    if (rc != 0) {
        snprintf(err, errlen, "--save %s: %s", dir, why);
        return rc;
    }
    if (sodium_init() < 0) {
        snprintf(err, errlen, "libsodium failed to initialise");
        return -EIO;
    }
    char path[PATH_MAX];
    size_t bytes = node_config_params(&meta->cfg) * sizeof(float);
    uint8_t h[CKPT_HEADER];
    s_ckpt_header(h, meta);
    chunk_t chunks[4] = { {h, sizeof h}, {params, bytes}, {m, bytes}, {v, bytes} };
    snprintf(path, sizeof path, "%s/checkpoint.bin", dir);
    rc = s_write_atomic(path, chunks, 4, 1, err, errlen);
    if (rc != 0)
        return rc;
    node_bgpt_header_t bh = { .cfg = meta->cfg, .kind = 0, .step = (int) meta->step };
    snprintf(path, sizeof path, "%s/model.bgpt", dir);
    return node_bgpt_write(path, &bh, params, err, errlen);
}

// The settings of a checkpoint header, each within what its flag accepts.
static int s_ckpt_meta_check(const node_ckpt_meta_t *m, const char *name, char *err, size_t errlen)
{
    const long lmax = LONG_MAX / 2;
    const struct { const char *what; double v, lo, hi; } f[] = {
        {"step", (double) m->step, 0, (double) lmax},
        {"iters", (double) m->iters, 0, (double) lmax},
        {"warmup", (double) m->warmup, 0, (double) lmax},
        {"batch", (double) m->batch, 1, 1 << 20},
        {"lr", m->lr, 0, 10},
        {"min-lr", m->min_lr, 0, 10},
        {"weight-decay", m->weight_decay, 0, 10},
        {"grad-clip", m->grad_clip, 0, 1e30},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (!(f[i].v >= f[i].lo && f[i].v <= f[i].hi)) { // NaN fails too
            const char *fmt = i < 4 ? "%s: %s %.0f in the header is outside %.0f..%.0f; the "
                                      "checkpoint is corrupt"
                                    : "%s: %s %g in the header is outside %g..%g; the "
                                      "checkpoint is corrupt";
            snprintf(err, errlen, fmt, name, f[i].what, f[i].v, f[i].lo, f[i].hi);
            return -EINVAL;
        }
    }
    return 0;
}

int node_ckpt_decode(const uint8_t *buf, size_t size, const char *name, node_ckpt_meta_t *meta,
                     float **params, float **m, float **v, char *err, size_t errlen)
{
    char why[200];
    float **outs[3] = { params, m, v };
    for (int i = 0; i < 3; i++)
        if (outs[i])
            *outs[i] = NULL;
    if (sodium_init() < 0) {
        snprintf(err, errlen, "libsodium failed to initialise");
        return -EIO;
    }
    if (size < CKPT_HEADER + CKPT_SUM || memcmp(buf, "SWCK", 4) != 0) {
        snprintf(err, errlen, "%s: not a swarm checkpoint (%zu bytes, bad magic or too short)", name, size);
        return -EINVAL;
    }
    uint8_t digest[CKPT_SUM];
    crypto_generichash(digest, CKPT_SUM, buf, size - CKPT_SUM, NULL, 0);
    if (sodium_memcmp(digest, buf + size - CKPT_SUM, CKPT_SUM) != 0) {
        snprintf(err, errlen, "%s: checksum mismatch: the checkpoint is truncated or altered; "
                 "restore it or start without --resume", name);
        return -EINVAL;
    }
    if (s_get32(buf + 4) != CKPT_VERSION) {
        snprintf(err, errlen, "%s: checkpoint version %u; this build reads version %d",
                 name, s_get32(buf + 4), CKPT_VERSION);
        return -EINVAL;
    }
    memset(meta, 0, sizeof *meta);
    meta->cfg = s_get_config(buf + 8);
    meta->batch = (int32_t) s_get32(buf + 28);
    meta->step = (long) s_get64(buf + 32);
    meta->seed = s_get64(buf + 40);
    meta->iters = (long) s_get64(buf + 48);
    meta->warmup = (long) s_get64(buf + 56);
    meta->lr = s_getd(buf + 64);
    meta->min_lr = s_getd(buf + 72);
    meta->weight_decay = s_getd(buf + 80);
    meta->grad_clip = s_getd(buf + 88);
    if (node_config_check(&meta->cfg, why, sizeof why) != 0) {
        snprintf(err, errlen, "%s: bad model shape: %s", name, why);
        return -EINVAL;
    }
    int rc = s_ckpt_meta_check(meta, name, err, errlen);
    if (rc != 0)
        return rc;
    size_t n = node_config_params(&meta->cfg);
    if (s_get64(buf + 96) != n || size != CKPT_HEADER + 3 * n * sizeof(float) + CKPT_SUM) {
        snprintf(err, errlen, "%s: header and size disagree (%zu bytes for %zu parameters)",
                 name, size, n);
        return -EINVAL;
    }
    for (int i = 96 + 8; i < CKPT_HEADER; i++) {
        if (buf[i] != 0) {
            snprintf(err, errlen, "%s: header byte %d is not zero; the checkpoint is corrupt", name, i);
            return -EINVAL;
        }
    }
    static const char *what[3] = { "parameter", "first moment", "second moment" };
    for (int i = 0; i < 3 && rc == 0; i++)
        rc = s_values_check(buf + CKPT_HEADER + (size_t) i * n * sizeof(float), n, i == 2, name,
                            what[i], err, errlen);
    for (int i = 0; i < 3 && rc == 0; i++) {
        if (!outs[i])
            continue;
        *outs[i] = malloc(n * sizeof(float));
        if (!*outs[i]) {
            snprintf(err, errlen, "%s: out of memory", name);
            rc = -ENOMEM;
            break;
        }
        memcpy(*outs[i], buf + CKPT_HEADER + (size_t) i * n * sizeof(float), n * sizeof(float));
    }
    for (int i = 0; rc != 0 && i < 3; i++) {
        if (outs[i]) {
            free(*outs[i]);
            *outs[i] = NULL;
        }
    }
    return rc;
}

int node_ckpt_load(const char *dir, node_ckpt_meta_t *meta, float **params, float **m,
                   float **v, char *err, size_t errlen)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/checkpoint.bin", dir);
    uint8_t *buf = NULL;
    size_t size = 0;
    int rc = s_read_all(path, MAX_FILE, &buf, &size, err, errlen);
    if (rc == 0)
        rc = node_ckpt_decode(buf, size, path, meta, params, m, v, err, errlen);
    free(buf);
    return rc;
}
