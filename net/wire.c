/* wire.c - the header frame: encode field by field, and the decoder that
 * checks every field against hard and caller limits before anything uses it.
 *
 * Pure functions over byte spans: no sockets, no allocation, never a read
 * past a span's size. Tensor contents (finite values, scales) are checked
 * later, by the codec, when the caller decodes a tensor.
 */
#include "wire.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

static const char *s_type_names[NET_MSG_TYPE_MAX + 1] = {
    [NET_MSG_HELLO] = "HELLO",         [NET_MSG_ASSIGN] = "ASSIGN",
    [NET_MSG_HEARTBEAT] = "HEARTBEAT", [NET_MSG_FWD] = "FWD",
    [NET_MSG_BWD] = "BWD",             [NET_MSG_RESULT] = "RESULT",
    [NET_MSG_STEP] = "STEP",           [NET_MSG_GRAD] = "GRAD",
    [NET_MSG_UPDATE] = "UPDATE",       [NET_MSG_STATE_GET] = "STATE_GET",
    [NET_MSG_STATE] = "STATE",         [NET_MSG_STATUS] = "STATUS",
    [NET_MSG_ERROR] = "ERROR",         [NET_MSG_BYE] = "BYE",
};

const char *net_msg_type_name(int type)
{
    if (type < 1 || type > NET_MSG_TYPE_MAX || !s_type_names[type])
        return "?";
    return s_type_names[type];
}

// Write a reason and return -EPROTO (the one error the decoder returns).
__attribute__((format(printf, 3, 4)))
static int s_reject(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -EPROTO;
}

int net_limits_check(const net_limits_t *limits, char *err, size_t errlen)
{
    const char *bad = NULL;
    if (!limits)
        bad = "no limits given";
    else if (limits->max_tensors > NET_TENSORS_MAX)
        bad = "max_tensors over NET_TENSORS_MAX";
    else if (limits->max_dims < 1 || limits->max_dims > NET_DIMS_MAX)
        bad = "max_dims must be 1..NET_DIMS_MAX";
    else if (limits->max_dim < 1)
        bad = "max_dim must be >= 1";
    else if (limits->max_payload < 1 || limits->max_payload > NET_PAYLOAD_MAX)
        bad = "max_payload must be 1..NET_PAYLOAD_MAX";
    else if (limits->max_meta > NET_META_MAX)
        bad = "max_meta over NET_META_MAX";
    if (!bad)
        return 0;
    if (err && errlen)
        snprintf(err, errlen, "net limits: %s", bad);
    return -EINVAL;
}

uint64_t net_wire_numel(const net_shape_t *shape)
{
    uint64_t n = 1;
    for (unsigned d = 0; d < shape->ndims && d < NET_DIMS_MAX; d++)
        n *= shape->dims[d];
    return n;
}

size_t net_wire_head_encode(const net_head_t *head, uint8_t *buf, size_t cap)
{
    size_t size = net_wire_head_size(head->ntensors);
    if (head->ntensors > NET_TENSORS_MAX || cap < size)
        return 0;
    net_put32(buf + 0, NET_WIRE_MAGIC);
    net_put16(buf + 4, NET_WIRE_VERSION);
    net_put16(buf + 6, head->type);
    net_put64(buf + 8, head->id);
    net_put64(buf + 16, head->step);
    net_put32(buf + 24, head->stage);
    net_put32(buf + 28, head->mb);
    net_put32(buf + 32, head->meta_len);
    buf[36] = head->ntensors;
    buf[37] = head->flags;
    net_put16(buf + 38, 0);
    for (unsigned t = 0; t < head->ntensors; t++) {
        const net_shape_t *s = &head->tensors[t];
        uint8_t *p = buf + NET_WIRE_FIXED + t * NET_WIRE_SHAPE;
        p[0] = s->dtype;
        p[1] = s->ndims;
        net_put16(p + 2, 0);
        for (int d = 0; d < NET_DIMS_MAX; d++)
            net_put32(p + 4 + 4 * d, s->dims[d]);
        net_put32(p + 20, 0);
        net_put64(p + 24, s->bytes);
    }
    return size;
}

// One tensor descriptor at p (NET_WIRE_SHAPE bytes inside the frame).
static int s_shape_decode(const uint8_t *p, unsigned t, const net_limits_t *limits,
                          net_shape_t *s, char *err, size_t errlen)
{
    s->dtype = p[0];
    s->ndims = p[1];
    if (s->dtype < 1 || s->dtype > NET_DTYPE_MAX)
        return s_reject(err, errlen, "tensor %u: unknown dtype %u", t, s->dtype);
    if (s->ndims < 1 || s->ndims > limits->max_dims)
        return s_reject(err, errlen, "tensor %u: %u dims, limit 1..%" PRIu32, t, s->ndims,
                        limits->max_dims);
    if (net_le16(p + 2) != 0 || net_le32(p + 20) != 0)
        return s_reject(err, errlen, "tensor %u: reserved bytes not zero", t);
    uint64_t numel = 1;
    for (unsigned d = 0; d < NET_DIMS_MAX; d++) {
        s->dims[d] = net_le32(p + 4 + 4 * d);
        if (d >= s->ndims) {
            if (s->dims[d] != 0)
                return s_reject(err, errlen, "tensor %u: unused dim %u is %" PRIu32 ", not 0",
                                t, d, s->dims[d]);
            continue;
        }
        if (s->dims[d] < 1 || s->dims[d] > limits->max_dim)
            return s_reject(err, errlen, "tensor %u: dim %u is %" PRIu32 ", limit 1..%" PRIu32,
                            t, d, s->dims[d], limits->max_dim);
        if (__builtin_mul_overflow(numel, (uint64_t) s->dims[d], &numel))
            return s_reject(err, errlen, "tensor %u: element count overflows at dim %u", t, d);
    }
    s->bytes = net_le64(p + 24);
    uint64_t need = net_codec_bytes(s->dtype, numel);
    if (need == 0)
        return s_reject(err, errlen, "tensor %u: %" PRIu64 " elements overflow the size", t,
                        numel);
    if (s->bytes != need)
        return s_reject(err, errlen,
                        "tensor %u: payload %" PRIu64 " bytes, dtype %u x %" PRIu64
                        " elements needs %" PRIu64, t, s->bytes, s->dtype, numel, need);
    return 0;
}

// The 40-byte fixed part: everything but the tensor descriptors.
static int s_fixed_decode(const uint8_t *buf, size_t size, const net_limits_t *limits,
                          net_head_t *head, char *err, size_t errlen)
{
    if (size < NET_WIRE_FIXED)
        return s_reject(err, errlen, "header %zu bytes, need at least %d", size,
                        NET_WIRE_FIXED);
    uint32_t magic = net_le32(buf);
    if (magic != NET_WIRE_MAGIC)
        return s_reject(err, errlen, "magic 0x%08" PRIx32 ", want 0x%08x (\"SWRM\")", magic,
                        NET_WIRE_MAGIC);
    uint16_t version = net_le16(buf + 4);
    if (version != NET_WIRE_VERSION)
        return s_reject(err, errlen, "protocol version %u, this build speaks %d", version,
                        NET_WIRE_VERSION);
    head->type = net_le16(buf + 6);
    if (head->type < 1 || head->type > NET_MSG_TYPE_MAX)
        return s_reject(err, errlen, "unknown message type %u", head->type);
    head->id = net_le64(buf + 8);
    head->step = net_le64(buf + 16);
    head->stage = net_le32(buf + 24);
    head->mb = net_le32(buf + 28);
    head->meta_len = net_le32(buf + 32);
    head->ntensors = buf[36];
    head->flags = buf[37];
    if (head->flags & ~NET_FLAGS_KNOWN)
        return s_reject(err, errlen, "unknown flags 0x%02x", head->flags);
    if (net_le16(buf + 38) != 0)
        return s_reject(err, errlen, "reserved header bytes not zero");
    if (head->ntensors > limits->max_tensors)
        return s_reject(err, errlen, "%u tensors, limit %" PRIu32, head->ntensors,
                        limits->max_tensors);
    if (size != net_wire_head_size(head->ntensors))
        return s_reject(err, errlen, "header %zu bytes, %u tensors need %zu", size,
                        head->ntensors, net_wire_head_size(head->ntensors));
    if (head->meta_len > limits->max_meta)
        return s_reject(err, errlen, "meta %" PRIu32 " bytes, limit %" PRIu32, head->meta_len,
                        limits->max_meta);
    return 0;
}

int net_wire_head_decode(const uint8_t *buf, size_t size, const net_limits_t *limits,
                         net_head_t *head, char *err, size_t errlen)
{
    memset(head, 0, sizeof *head);
    int rc = s_fixed_decode(buf, size, limits, head, err, errlen);
    if (rc < 0)
        return rc;
    uint64_t total = 0;
    for (unsigned t = 0; t < head->ntensors; t++) {
        net_shape_t *s = &head->tensors[t];
        rc = s_shape_decode(buf + NET_WIRE_FIXED + t * NET_WIRE_SHAPE, t, limits, s, err, errlen);
        if (rc < 0)
            return rc;
        // each term <= max_payload <= 2^31 after this check: no overflow
        if (s->bytes > limits->max_payload || total + s->bytes > limits->max_payload)
            return s_reject(err, errlen, "payload over the limit of %" PRIu64
                            " bytes at tensor %u", limits->max_payload, t);
        total += s->bytes;
    }
    return 0;
}

int net_wire_decode(const net_span_t *frames, size_t nframes, const net_limits_t *limits,
                    net_head_t *head, char *err, size_t errlen)
{
    if (nframes < 1)
        return s_reject(err, errlen, "no frames");
    int rc = net_wire_head_decode(frames[0].data, frames[0].size, limits, head, err, errlen);
    if (rc < 0)
        return rc;
    size_t want = 1 + head->ntensors + (head->meta_len > 0);
    if (nframes != want)
        return s_reject(err, errlen, "%zu frames, the header declares %zu (%s, %u tensors%s)",
                        nframes, want, net_msg_type_name(head->type), head->ntensors,
                        head->meta_len ? ", meta" : "");
    for (unsigned t = 0; t < head->ntensors; t++) {
        if (frames[1 + t].size != head->tensors[t].bytes)
            return s_reject(err, errlen, "tensor %u frame %zu bytes, header says %" PRIu64, t,
                            frames[1 + t].size, head->tensors[t].bytes);
    }
    if (head->meta_len > 0) {
        const net_span_t *meta = &frames[want - 1];
        if (meta->size != head->meta_len)
            return s_reject(err, errlen, "meta frame %zu bytes, header says %" PRIu32,
                            meta->size, head->meta_len);
        if (memchr(meta->data, '\0', meta->size))
            return s_reject(err, errlen, "meta text contains a NUL byte");
    }
    return 0;
}
