/* codec.c - tensor codecs on the wire: fp32 (exact), fp16 (round to nearest
 * even) and blockwise int8 (NET_INT8_BLOCK values share one f32 scale).
 *
 * Encoders refuse non-finite input; decoders refuse content no encoder
 * writes, so a peer cannot hand us an Inf or a NaN through any codec.
 * Single-threaded and allocation-free: the caller owns both buffers.
 */
#include "wire.h"

#include <errno.h>
#include <float.h>
#include <math.h>

// Scale margin: s = absmax/127 * (1 - 2^-12) leaves room for float
// rounding, so |x - x'| <= absmax/254 holds after the decoder rounds too
// (docs/wire.md derives it). Values at absmax land on 127*s, 2^-12 away.
#define I8_MARGIN (1.0 - 0x1p-12)
// The largest scale an encoder writes; anything above could decode to Inf.
#define I8_SCALE_MAX (FLT_MAX / 127.0f)

static int s_nonfinite(uint32_t bits)
{
    return (bits & 0x7f800000u) == 0x7f800000u;
}

static uint32_t s_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float s_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint64_t net_codec_bytes(int dtype, uint64_t n)
{
    uint64_t bytes = 0;
    if (n == 0)
        return 0;
    switch (dtype) {
    case NET_DTYPE_F32:
    case NET_DTYPE_I32:
        if (__builtin_mul_overflow(n, 4, &bytes))
            return 0;
        return bytes;
    case NET_DTYPE_F16:
        if (__builtin_mul_overflow(n, 2, &bytes))
            return 0;
        return bytes;
    case NET_DTYPE_U8:
        return n;
    case NET_DTYPE_I8: {
        uint64_t blocks = n / NET_INT8_BLOCK + (n % NET_INT8_BLOCK != 0);
        if (__builtin_add_overflow(blocks * 4, n, &bytes))
            return 0;
        return bytes;
    }
    default:
        return 0;
    }
}

// ---- fp32 ------------------------------------------------------------------

// The wire is little-endian: on such a host a payload is the float array.
#define HOST_LE (__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__)

static int s_f32_encode(const float *src, size_t n, uint8_t *dst)
{
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) // branch-free so that it vectorises
        bad |= s_nonfinite(s_bits(src[i]));
    if (bad)
        return -EDOM;
    if (HOST_LE)
        memcpy(dst, src, 4 * n);
    else
        for (size_t i = 0; i < n; i++)
            net_put32(dst + 4 * i, s_bits(src[i]));
    return 0;
}

static int s_f32_decode(const uint8_t *src, size_t n, float *dst)
{
    uint32_t bad = 0;
    if (HOST_LE)
        memcpy(dst, src, 4 * n);
    else
        for (size_t i = 0; i < n; i++)
            dst[i] = s_float(net_le32(src + 4 * i));
    // (omp simd: vectorised whatever n is, where -O2's cost model would
    // not; every activation the router receives is looked at here)
#pragma omp simd reduction(| : bad)
    for (size_t i = 0; i < n; i++)
        bad |= s_nonfinite(s_bits(dst[i]));
    return bad ? -EPROTO : 0;
}

// ---- fp16 ------------------------------------------------------------------

// binary32 bits (finite) -> binary16 bits, round to nearest even. An
// overflow comes back as +-Inf (0x7c00). After F. Giesen's float_to_half.
static uint16_t s_f2h(uint32_t x)
{
    uint32_t sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    if (x >= 0x47800000u) // >= 65536: Inf
        return (uint16_t) (sign | 0x7c00u);
    if (x < 0x38800000u) { // below 2^-14: subnormal or zero
        // adding 0.5f puts the 2^-24 unit in the last mantissa bit; the
        // FPU's round to nearest even does the rounding
        float f = s_float(x) + 0.5f;
        return (uint16_t) (sign | (s_bits(f) - 0x3f000000u));
    }
    uint32_t odd = (x >> 13) & 1u;
    x += 0xc8000fffu + odd; // rebias 127 -> 15, add half an ulp minus 1 (+1 if odd)
    return (uint16_t) (sign | (x >> 13));
}

// binary16 bits -> binary32 (exact). *bad is set for Inf/NaN.
static float s_h2f(uint16_t h, uint32_t *bad)
{
    uint32_t o = (uint32_t) (h & 0x7fffu) << 13;
    uint32_t exp = o & 0x0f800000u;
    o += 0x38000000u; // rebias 15 -> 127
    *bad |= exp == 0x0f800000u;
    if (exp == 0) { // subnormal: renormalise with one float subtraction (exact)
        o += 1u << 23;
        o = s_bits(s_float(o) - 0x1p-14f);
    }
    return s_float(o | ((uint32_t) (h & 0x8000u) << 16));
}

static int s_f16_encode(const float *src, size_t n, uint8_t *dst)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u = s_bits(src[i]);
        if (s_nonfinite(u))
            return -EDOM;
        uint16_t h = s_f2h(u);
        if ((h & 0x7c00u) == 0x7c00u)
            return -ERANGE;
        net_put16(dst + 2 * i, h);
    }
    return 0;
}

static int s_f16_decode(const uint8_t *src, size_t n, float *dst)
{
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++)
        dst[i] = s_h2f(net_le16(src + 2 * i), &bad);
    return bad ? -EPROTO : 0;
}

// ---- blockwise int8 ----------------------------------------------------------

static int s_i8_block_encode(const float *x, size_t k, uint8_t *out)
{
    float amax = 0.0f;
    uint32_t bad = 0;
    for (size_t i = 0; i < k; i++) { // branch-free so that it vectorises
        bad |= s_nonfinite(s_bits(x[i]));
        float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    if (bad)
        return -EDOM;
    float s = (float) ((double) amax / 127.0 * I8_MARGIN);
    net_putf32(out, s);
    int8_t *q = (int8_t *) (out + 4);
    // a tiny block's scale is subnormal or 0: 1/s needs double's range
    double inv = s > 0.0f ? 1.0 / (double) s : 0.0;
    for (size_t i = 0; i < k; i++) {
        // round to nearest even by the 1.5 x 2^52 trick (|t| < 2^51), clamp
        double t = ((double) x[i] * inv + 0x1.8p52) - 0x1.8p52;
        t = t > 127.0 ? 127.0 : t < -127.0 ? -127.0 : t;
        q[i] = (int8_t) t;
    }
    return 0;
}

static int s_i8_encode(const float *src, size_t n, uint8_t *dst)
{
    for (size_t at = 0; at < n; at += NET_INT8_BLOCK) {
        size_t k = n - at < NET_INT8_BLOCK ? n - at : NET_INT8_BLOCK;
        int rc = s_i8_block_encode(src + at, k, dst);
        if (rc < 0)
            return rc;
        dst += 4 + k;
    }
    return 0;
}

static int s_i8_decode(const uint8_t *src, size_t n, float *dst)
{
    for (size_t at = 0; at < n; at += NET_INT8_BLOCK) {
        size_t k = n - at < NET_INT8_BLOCK ? n - at : NET_INT8_BLOCK;
        uint32_t sb = net_le32(src);
        float s = s_float(sb);
        // sign bit, NaN, Inf, or a scale no encoder writes
        if ((sb >> 31) || s_nonfinite(sb) || s > I8_SCALE_MAX)
            return -EPROTO;
        const int8_t *q = (const int8_t *) (src + 4);
        int bad = 0;
        for (size_t i = 0; i < k; i++) {
            bad |= q[i] == -128;
            dst[at + i] = (float) q[i] * s;
        }
        if (bad)
            return -EPROTO;
        src += 4 + k;
    }
    return 0;
}

// ---- entry points -------------------------------------------------------------

int net_codec_encode(int dtype, const float *src, size_t n, void *dst, size_t cap)
{
    if (!net_dtype_is_float(dtype))
        return -EINVAL;
    uint64_t need = net_codec_bytes(dtype, n);
    if (need == 0 || need > cap)
        return need == 0 && n == 0 ? 0 : -ENOBUFS;
    switch (dtype) {
    case NET_DTYPE_F32:
        return s_f32_encode(src, n, dst);
    case NET_DTYPE_F16:
        return s_f16_encode(src, n, dst);
    default:
        return s_i8_encode(src, n, dst);
    }
}

int net_codec_decode(int dtype, const void *src, size_t bytes, float *dst, size_t n)
{
    if (!net_dtype_is_float(dtype))
        return -EINVAL;
    if (n == 0)
        return bytes == 0 ? 0 : -EPROTO;
    if (net_codec_bytes(dtype, n) != bytes)
        return -EPROTO;
    switch (dtype) {
    case NET_DTYPE_F32:
        return s_f32_decode(src, n, dst);
    case NET_DTYPE_F16:
        return s_f16_decode(src, n, dst);
    default:
        return s_i8_decode(src, n, dst);
    }
}
