/* fuzz_files.c - libFuzzer target for what swarm reads from disk: BGPT
 * weight files and checkpoints (node/files.c), from memory and through the
 * file reader.
 *
 * Input: byte 0 picks the decoder (mod 4): 0 a BGPT file; 1 a checkpoint;
 * 2 a checkpoint whose BLAKE2b the target appends (the fuzzer cannot forge
 * one, and the header checks lie behind it); 3 a BGPT file read through a
 * memfd path. The rest is the file. An accepted file must hold a valid
 * shape, exactly its parameters' bytes, and only finite values (second
 * moments >= 0); a refused one leaves no array behind: else abort.
 */
#include "fuzz.h"
#include "node.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define BGPT_HEADER 64
#define CKPT_HEADER 128
#define CKPT_SUM 32

// n floats from the decoder equal the file's bytes at p and are finite
static void s_same(const float *x, const uint8_t *p, size_t n, int nonneg)
{
    if (!x || memcmp(x, p, n * sizeof(float)) != 0)
        abort();
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]) || (nonneg && x[i] < 0.0f))
            abort();
}

static int s_bgpt(const uint8_t *data, size_t size, int via_file)
{
    char err[512], path[64];
    node_bgpt_header_t h;
    float *w = (float *) 1; // must come back NULL on error
    int rc;
    if (via_file) {
        int fd = memfd_create("fuzz-bgpt", MFD_CLOEXEC);
        if (fd < 0 || (size && write(fd, data, size) != (ssize_t) size))
            abort();
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        rc = node_bgpt_read(path, &h, &w, err, sizeof err);
        close(fd);
        if (rc != 0)
            return rc; // the reader's own errors leave *data alone
    } else {
        rc = node_bgpt_decode(data, size, "fuzz.bgpt", &h, &w, err, sizeof err);
        if (rc != 0) {
            if (w != NULL || !err[0])
                abort();
            return rc;
        }
    }
    char why[200];
    if (node_config_check(&h.cfg, why, sizeof why) != 0 || (h.kind != 0 && h.kind != 1)
        || h.step < 0 || !isfinite(h.loss))
        abort();
    size_t n = node_config_params(&h.cfg);
    if (size != BGPT_HEADER + 4 * n)
        abort();
    s_same(w, data + BGPT_HEADER, n, 0);
    free(w);
    return 0;
}

static int s_ckpt(const uint8_t *data, size_t size, int sign)
{
    char err[512];
    uint8_t *signed_copy = NULL;
    if (sign) { // the rest plus its checksum
        signed_copy = malloc(size + CKPT_SUM);
        if (!signed_copy || sodium_init() < 0)
            abort();
        if (size)
            memcpy(signed_copy, data, size);
        crypto_generichash(signed_copy + size, CKPT_SUM, data, size, NULL, 0);
        data = signed_copy;
        size += CKPT_SUM;
    }
    node_ckpt_meta_t meta;
    float *p = (float *) 1, *m = (float *) 1, *v = (float *) 1;
    int rc = node_ckpt_decode(data, size, "fuzz/checkpoint.bin", &meta, &p, &m, &v, err,
                              sizeof err);
    if (rc != 0) {
        if (p || m || v || !err[0])
            abort();
    } else {
        char why[200];
        if (node_config_check(&meta.cfg, why, sizeof why) != 0 || meta.step < 0
            || meta.batch < 1 || meta.iters < 0 || meta.warmup < 0 || !(meta.lr >= 0)
            || !(meta.min_lr >= 0) || !(meta.weight_decay >= 0) || !(meta.grad_clip >= 0))
            abort();
        size_t n = node_config_params(&meta.cfg);
        if (size != CKPT_HEADER + 12 * n + CKPT_SUM)
            abort();
        s_same(p, data + CKPT_HEADER, n, 0);
        s_same(m, data + CKPT_HEADER + 4 * n, n, 0);
        s_same(v, data + CKPT_HEADER + 8 * n, n, 1);
        free(p);
        free(m);
        free(v);
    }
    free(signed_copy);
    return rc;
}

int fuzz_files_one(const uint8_t *data, size_t size)
{
    if (size < 1)
        return -EINVAL;
    switch (data[0] % 4) {
    case 0: return s_bgpt(data + 1, size - 1, 0);
    case 1: return s_ckpt(data + 1, size - 1, 0);
    case 2: return s_ckpt(data + 1, size - 1, 1);
    default: return s_bgpt(data + 1, size - 1, 1);
    }
}

#ifdef SWARM_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    (void) fuzz_files_one(data, size);
    return 0;
}
#endif

// ---- seeds: real files as node/files.c writes them, and damaged ones ---------

// The smallest model: L=1 H=1 C=1 T=1 (about 540 parameters).
static const node_config_t s_cfg = {NODE_VOCAB, 1, 1, 1, 1};

// Read a file into buf; its length, 0 on error.
static size_t s_slurp(const char *path, uint8_t *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

// A BGPT file (kind 0 or 1) or checkpoint.bin as files.c writes them, after
// the mode byte. Deterministic values.
static size_t s_real(int ckpt, int kind, uint8_t *buf, size_t cap)
{
    char dir[] = "/tmp/swarm-fuzz-seed.XXXXXX", path[128], err[512];
    if (!mkdtemp(dir))
        return 0;
    size_t n = node_config_params(&s_cfg), len = 0;
    float *x = malloc(3 * n * sizeof *x);
    for (size_t i = 0; x && i < 3 * n; i++) // second moments (the last n) are >= 0
        x[i] = (float) ((int) (i % 37) - (i < 2 * n ? 18 : 0)) / 64.0f;
    int rc = -1;
    if (x && ckpt) {
        node_ckpt_meta_t meta = {.cfg = s_cfg, .step = 7, .seed = 1337, .iters = 20, .warmup = 2,
                                 .batch = 4, .lr = 1e-2, .min_lr = 1e-3, .weight_decay = 0.1,
                                 .grad_clip = 1.0};
        rc = node_ckpt_save(dir, &meta, x, x + n, x + 2 * n, err, sizeof err);
        snprintf(path, sizeof path, "%s/checkpoint.bin", dir);
    } else if (x) {
        node_bgpt_header_t h = {.cfg = s_cfg, .kind = kind, .step = 3, .loss = kind ? 5.5f : 0};
        snprintf(path, sizeof path, "%s/w.bgpt", dir);
        rc = node_bgpt_write(path, &h, x, err, sizeof err);
    }
    if (rc == 0 && cap > 1)
        len = s_slurp(path, buf + 1, cap - 1);
    if (rc == 0) {
        unlink(path);
        snprintf(path, sizeof path, "%s/model.bgpt", dir);
        unlink(path);
    }
    rmdir(dir);
    free(x);
    return len ? len + 1 : 0;
}

// A little-endian u32 or f32 or f64 into a file image (after the mode byte).
static void s_put32(uint8_t *buf, size_t at, uint32_t v) { memcpy(buf + 1 + at, &v, 4); }
static void s_putf(uint8_t *buf, size_t at, float v) { memcpy(buf + 1 + at, &v, 4); }
static void s_putd(uint8_t *buf, size_t at, double v) { memcpy(buf + 1 + at, &v, 8); }

int fuzz_files_seed(int i, char *name, size_t namecap, uint8_t *buf, size_t cap, size_t *out)
{
    static const struct {
        const char *name;
        int kind;                   // 0 bgpt, 1 ckpt (mode 1, real checksum), 2 ckpt signed by the target, 3 bgpt via a file
        int edit;                   // what to damage
    } seeds[] = {
        {"ok-bgpt-weights", 0, 0}, {"ok-bgpt-gradients", 0, 1}, {"ok-bgpt-via-file", 3, 0},
        {"ok-ckpt", 1, 0}, {"ok-ckpt-signed", 2, 0},
        {"bad-bgpt-magic", 0, 10}, {"bad-bgpt-version", 0, 11}, {"bad-bgpt-shape-c-not-multiple-of-h", 0, 12},
        {"bad-bgpt-vocabulary", 0, 13}, {"bad-bgpt-kind", 0, 14}, {"bad-bgpt-negative-step", 0, 15},
        {"bad-bgpt-loss-nan", 0, 16}, {"bad-bgpt-reserved-byte", 0, 17}, {"bad-bgpt-truncated", 0, 18},
        {"bad-bgpt-nan-weight", 0, 19}, {"bad-bgpt-inf-weight", 0, 20}, {"bad-bgpt-empty", 0, 21},
        {"bad-ckpt-checksum", 1, 30}, {"bad-ckpt-truncated", 1, 31},
        {"bad-ckpt-signed-version", 2, 32}, {"bad-ckpt-signed-lr-nan", 2, 33},
        {"bad-ckpt-signed-negative-iters", 2, 34}, {"bad-ckpt-signed-batch-zero", 2, 35},
        {"bad-ckpt-signed-param-count", 2, 36}, {"bad-ckpt-signed-negative-v", 2, 37},
        {"bad-ckpt-signed-inf-m", 2, 38}, {"bad-ckpt-signed-layers-zero", 2, 39},
        {"bad-ckpt-signed-reserved-byte", 2, 40}, {"bad-ckpt-signed-huge-step", 2, 41},
    };
    if (i < 0 || (size_t) i >= sizeof seeds / sizeof seeds[0])
        return 0;
    int kind = seeds[i].kind, edit = seeds[i].edit;
    size_t len = s_real(kind == 1 || kind == 2, edit == 1, buf, cap);
    if (len < 1 + CKPT_HEADER + CKPT_SUM)
        abort(); // could not write a file in /tmp
    buf[0] = (uint8_t) kind;
    size_t n = node_config_params(&s_cfg);
    if (kind == 2)
        len -= CKPT_SUM; // the target appends it
    switch (edit) {
    case 10: buf[1] = 'X'; break;
    case 11: s_put32(buf, 4, 2); break;
    case 12: s_put32(buf, 16, 3); s_put32(buf, 24, 2); break; // C=3, H=2
    case 13: s_put32(buf, 8, 255); break;
    case 14: s_put32(buf, 28, 2); break;
    case 15: s_put32(buf, 32, 0x80000000u); break;
    case 16: s_putf(buf, 36, NAN); break;
    case 17: buf[1 + 63] = 1; break;
    case 18: len -= 4; break;
    case 19: s_putf(buf, BGPT_HEADER + 4 * (n / 2), NAN); break;
    case 20: s_putf(buf, BGPT_HEADER + 4 * (n - 1), -INFINITY); break;
    case 21: len = 1; break;
    case 30: buf[1 + CKPT_HEADER + 5] ^= 1; break;
    case 31: len -= 100; break;
    case 32: s_put32(buf, 4, 9); break;
    case 33: s_putd(buf, 64, NAN); break;
    case 34: memset(buf + 1 + 48, 0xff, 8); break; // iters -1
    case 35: s_put32(buf, 28, 0); break;
    case 36: s_put32(buf, 96, (uint32_t) n + 1); break;
    case 37: s_putf(buf, CKPT_HEADER + 8 * n + 4, -1.0f); break;
    case 38: s_putf(buf, CKPT_HEADER + 4 * n, INFINITY); break;
    case 39: s_put32(buf, 20, 0); break;
    case 40: buf[1 + 120] = 7; break;
    case 41: memset(buf + 1 + 32, 0xff, 8); break;
    }
    snprintf(name, namecap, "%s", seeds[i].name);
    *out = len;
    return 1;
}
