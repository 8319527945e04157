/* tensors.c - float tensors between the router and the nodes in the wire
 * format the router chose (--wire, --grad-wire): fp32, fp16 or blockwise
 * int8 (net's codecs), with a power-of-two scale for fp16 so that small
 * gradients stay in fp16's normal range.
 *
 * It chooses no format and knows no message but the one it is handed; the
 * codecs themselves (and their checks) are net's.
 */
#include "net.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define POW2_MAX 100 // |k| of a 2^k scale: 65504 x 2^100 is still a finite float

int net_dtype_parse(const char *flag, const char *name, int *dtype, char *err, size_t errlen)
{
    static const struct { const char *name; int dtype; } formats[] = {
        { "fp32", NET_DTYPE_F32 }, { "fp16", NET_DTYPE_F16 }, { "int8", NET_DTYPE_I8 },
    };
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++) {
        if (!strcmp(name, formats[i].name)) {
            *dtype = formats[i].dtype;
            return 0;
        }
    }
    snprintf(err, errlen, "--%s %s: expected fp32, fp16 or int8", flag, name);
    return -EINVAL;
}

const char *net_dtype_name(int dtype)
{
    return dtype == NET_DTYPE_F16 ? "fp16" : dtype == NET_DTYPE_I8 ? "int8"
         : dtype == NET_DTYPE_F32 ? "fp32" : "?";
}

// The k that puts max |src| in [2^14, 2^15): fp16's largest normal is
// 65504, its smallest 2^-14; activation gradients are ~1e-5.
static int s_pow2_for(const float *src, size_t n)
{
    float top = 0.0f;
    for (size_t i = 0; i < n; i++)
        top = fabsf(src[i]) > top ? fabsf(src[i]) : top;
    if (!(top > 0.0f) || !isfinite(top))
        return 0; // all zeros (nothing to scale) or non-finite (the encoder refuses it)
    int e;
    frexpf(top, &e); // top = f x 2^e, f in [0.5, 1)
    int k = 15 - e;
    return k > POW2_MAX ? POW2_MAX : k < -POW2_MAX ? -POW2_MAX : k;
}

int net_tensor_add(net_msg_t *msg, int dtype, const uint32_t *dims, int ndims, const float *src,
                  int *pow2)
{
    size_t n = 1;
    for (int i = 0; i < ndims; i++)
        n *= dims[i];
    *pow2 = dtype == NET_DTYPE_F16 ? s_pow2_for(src, n) : 0;
    if (*pow2 == 0)
        return net_msg_add_tensor(msg, dtype, dims, ndims, src);
    float *scaled = malloc(n * sizeof(float));
    if (!scaled)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++)
        scaled[i] = ldexpf(src[i], *pow2); // exact for k > 0; k < 0 loses only what fp16 would
    int rc = net_msg_add_tensor(msg, dtype, dims, ndims, scaled);
    free(scaled);
    return rc;
}

int net_tensor_pow2(const net_msg_t *msg, int i, int *pow2)
{
    _Static_assert(NET_TENSORS_MAX <= 10, "pow2_I: one digit");
    char key[] = "pow2_0", text[16], *end; // (per message: no snprintf)
    *pow2 = 0;
    if (i < 0 || i >= NET_TENSORS_MAX)
        return -EINVAL;
    key[5] = (char) ('0' + i);
    int rc = net_msg_meta_get(msg, key, text, sizeof text);
    if (rc == -ENOENT)
        return 0;
    long k = rc == 0 ? strtol(text, &end, 10) : 0;
    if (rc != 0 || end == text || *end || k < -POW2_MAX || k > POW2_MAX)
        return -EPROTO;
    *pow2 = (int) k;
    return 0;
}

int net_tensor_get(const net_msg_t *msg, int i, float *dst, size_t n)
{
    int pow2 = 0;
    int rc = net_tensor_pow2(msg, i, &pow2);
    if (rc == 0)
        rc = net_msg_tensor(msg, i, dst, n);
    if (rc != 0 || pow2 == 0)
        return rc;
    for (size_t j = 0; j < n; j++) {
        dst[j] = ldexpf(dst[j], -pow2);
        if (!isfinite(dst[j]))
            return -EPROTO; // f32 values near FLT_MAX with a negative k
    }
    return 0;
}
