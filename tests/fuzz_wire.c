/* fuzz_wire.c - libFuzzer target for the wire decoder: any bytes, split into
 * frames, through net_wire_decode and every tensor codec's decoder.
 *
 * Input: byte 0 = frames (low 3 bits) and limit set (bit 3); then a u32
 * little-endian length per frame; then the frames' bytes (a length past the
 * end is cut short). An accepted message must re-encode to the same header
 * bytes and, for f32/f16, the same payload: else abort (our bug).
 * Built without libFuzzer (check_net), it replays tests/corpus/wire.
 * The other decoders' targets are in tests/fuzz_*.c (tests/fuzz.h).
 */
#include "wire.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define FUZZ_FRAMES_MAX 7

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int fuzz_wire_one(const uint8_t *data, size_t size);
int fuzz_wire_decode(const uint8_t *data, size_t size, char *err, size_t errlen);
size_t fuzz_wire_pack(const net_span_t *frames, size_t n, int strict, uint8_t *out, size_t cap);

// Two limit sets: loose enough to reach the overflow checks, strict enough
// to reach every "over the limit" branch.
static const net_limits_t s_loose = {NET_TENSORS_MAX, NET_DIMS_MAX, UINT32_MAX, 1u << 20,
                                     1u << 16};
static const net_limits_t s_strict = {2, 3, 64, 4096, 256};

// Split input into frames. Returns the number of frames.
static size_t s_split(const uint8_t *data, size_t size, net_span_t *frames, int *strict)
{
    if (size < 1)
        return 0;
    size_t n = data[0] & 7;
    *strict = (data[0] >> 3) & 1;
    if (n > FUZZ_FRAMES_MAX)
        n = FUZZ_FRAMES_MAX;
    size_t at = 1 + 4 * n;
    if (at > size)
        return 0;
    for (size_t i = 0; i < n; i++) {
        size_t len = net_le32(data + 1 + 4 * i);
        if (len > size - at)
            len = size - at;
        frames[i] = (net_span_t) {data + at, len};
        at += len;
    }
    return n;
}

size_t fuzz_wire_pack(const net_span_t *frames, size_t n, int strict, uint8_t *out, size_t cap)
{
    size_t need = 1 + 4 * n;
    for (size_t i = 0; i < n; i++)
        need += frames[i].size;
    if (n > FUZZ_FRAMES_MAX || need > cap)
        return 0;
    out[0] = (uint8_t) (n | (strict ? 8 : 0));
    size_t at = 1 + 4 * n;
    for (size_t i = 0; i < n; i++) {
        net_put32(out + 1 + 4 * i, (uint32_t) frames[i].size);
        if (frames[i].size)
            memcpy(out + at, frames[i].data, frames[i].size);
        at += frames[i].size;
    }
    return need;
}

// Decode tensor t of an accepted message and hold the codec to its promises.
static int s_tensor_check(const net_shape_t *shape, const net_span_t *frame)
{
    if (shape->dtype == NET_DTYPE_U8 || shape->dtype == NET_DTYPE_I32)
        return 0;
    size_t n = net_wire_numel(shape);
    float *x = malloc(n * sizeof *x);
    uint8_t *again = malloc(frame->size);
    if (!x || !again)
        abort();
    int rc = net_codec_decode(shape->dtype, frame->data, frame->size, x, n);
    if (rc == 0) {
        for (size_t i = 0; i < n; i++) {
            if (!isfinite(x[i]))
                abort(); // the decoder let a non-finite value through
        }
        // f32 and f16 have one encoding per value: it must come back
        if (shape->dtype != NET_DTYPE_I8 &&
            (net_codec_encode(shape->dtype, x, n, again, frame->size) != 0 ||
             memcmp(again, frame->data, frame->size) != 0))
            abort();
    } else if (rc != -EPROTO) {
        abort();
    }
    free(again);
    free(x);
    return rc;
}

int fuzz_wire_decode(const uint8_t *data, size_t size, char *err, size_t errlen)
{
    net_span_t frames[FUZZ_FRAMES_MAX];
    int strict = 0;
    size_t n = s_split(data, size, frames, &strict);
    net_head_t head;
    int rc = net_wire_decode(frames, n, strict ? &s_strict : &s_loose, &head, err, errlen);
    if (rc != 0) {
        if (rc != -EPROTO)
            abort();
        return rc;
    }
    // accepted: the header has exactly one encoding
    uint8_t buf[NET_WIRE_HEAD_MAX];
    size_t len = net_wire_head_encode(&head, buf, sizeof buf);
    if (len != frames[0].size || memcmp(buf, frames[0].data, len) != 0)
        abort();
    for (unsigned t = 0; t < head.ntensors; t++) {
        int trc = s_tensor_check(&head.tensors[t], &frames[1 + t]);
        if (trc != 0) {
            snprintf(err, errlen, "tensor %u: content refused by the codec", t);
            return trc;
        }
    }
    return 0;
}

int fuzz_wire_one(const uint8_t *data, size_t size)
{
    char err[256];
    return fuzz_wire_decode(data, size, err, sizeof err);
}

#ifdef SWARM_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    (void) fuzz_wire_one(data, size);
    return 0;
}
#endif
