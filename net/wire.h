/* wire.h - net's private header: the byte layout of the header frame, the
 * little-endian load/store helpers, and the pure (socket-free) decoder that
 * net_recv and the fuzz target share. Used by net/ and its tests only.
 *
 * Layout (docs/wire.md): a 40-byte fixed part, then NET_WIRE_SHAPE bytes
 * per tensor descriptor. Every multi-byte field is little-endian.
 */
#ifndef SWARM_NET_WIRE_H
#define SWARM_NET_WIRE_H

#include "net.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <zmq.h>

#define NET_WIRE_MAGIC 0x4D525753u       // "SWRM" read as a little-endian u32
#define NET_WIRE_FIXED 40                // bytes before the tensor descriptors
#define NET_WIRE_SHAPE 32                // bytes per tensor descriptor
#define NET_WIRE_HEAD_MAX (NET_WIRE_FIXED + NET_TENSORS_MAX * NET_WIRE_SHAPE)
#define NET_WIRE_FRAMES_MAX (1 + NET_TENSORS_MAX + 1) // header, tensors, meta
// libzmq checks MAXMSGSIZE on the encrypted frame: Curve adds 33 bytes.
#define NET_WIRE_CURVE_SLACK 64

// A frame as bytes: what the decoder reads, and never beyond size.
typedef struct {
    const uint8_t *data;             // frame bytes (size of them)
    size_t size;                     // bytes
} net_span_t;

static inline uint16_t net_le16(const uint8_t *p)
{
    return (uint16_t) (p[0] | (p[1] << 8));
}

static inline uint32_t net_le32(const uint8_t *p)
{
    return (uint32_t) p[0] | ((uint32_t) p[1] << 8) | ((uint32_t) p[2] << 16) |
           ((uint32_t) p[3] << 24);
}

static inline uint64_t net_le64(const uint8_t *p)
{
    return (uint64_t) net_le32(p) | ((uint64_t) net_le32(p + 4) << 32);
}

static inline void net_put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t) v;
    p[1] = (uint8_t) (v >> 8);
}

static inline void net_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t) (v >> (8 * i));
}

static inline void net_put64(uint8_t *p, uint64_t v)
{
    net_put32(p, (uint32_t) v);
    net_put32(p + 4, (uint32_t) (v >> 32));
}

static inline float net_lef32(const uint8_t *p)
{
    uint32_t u = net_le32(p);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline void net_putf32(uint8_t *p, float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    net_put32(p, u);
}

// 1 for the dtypes that carry floats through a codec (f32, f16, i8).
static inline int net_dtype_is_float(int dtype)
{
    return dtype == NET_DTYPE_F32 || dtype == NET_DTYPE_F16 || dtype == NET_DTYPE_I8;
}

// Bytes of the header frame for ntensors descriptors.
static inline size_t net_wire_head_size(unsigned ntensors)
{
    return NET_WIRE_FIXED + (size_t) ntensors * NET_WIRE_SHAPE;
}

// Write head into buf (cap >= net_wire_head_size(head->ntensors)); returns
// the bytes written. The caller has checked head (net_wire_head_check).
size_t net_wire_head_encode(const net_head_t *head, uint8_t *buf, size_t cap);

// Check a header frame and decode it into *head: size, magic, version, type,
// flags, reserved bytes, every tensor descriptor against limits (dtype,
// ndims, dims, element count without overflow, payload bytes = codec
// bytes), total payload and meta length. 0 or -EPROTO with a reason.
__attribute__((warn_unused_result))
int net_wire_head_decode(const uint8_t *buf, size_t size, const net_limits_t *limits,
                         net_head_t *head, char *err, size_t errlen);

// The whole message: frames[0] is the header; then one frame per tensor of
// exactly its payload bytes; then the meta frame when meta_len > 0 (no NUL
// inside); nothing more. 0 or -EPROTO with a reason. *head is valid on 0.
__attribute__((warn_unused_result))
int net_wire_decode(const net_span_t *frames, size_t nframes, const net_limits_t *limits,
                    net_head_t *head, char *err, size_t errlen);

// Element count of a checked shape (fits: the decoder checked the product).
uint64_t net_wire_numel(const net_shape_t *shape);

// ---- between msg.c and transport.c ----------------------------------------

// Receive every part of one multipart message without blocking: *total
// parts arrived; the first min(*total, cap) are in parts[] (initialised),
// the rest were closed. 0; -EAGAIN nothing waiting; other -zmq_errno().
__attribute__((warn_unused_result))
int net_frames_recv(void *socket, zmq_msg_t *parts, size_t cap, size_t *total);
void net_frames_close(zmq_msg_t *parts, size_t n);

// Check a message of `total` frames of which the first `kept` are in
// frames[], and move them into a new message. Closes the kept frames in
// all cases. 0; -EPROTO (reason in err); -ENOMEM.
__attribute__((warn_unused_result))
int net_msg_from_frames(zmq_msg_t *frames, size_t kept, size_t total,
                        const net_limits_t *limits, net_msg_t **out, char *err,
                        size_t errlen);

// Check the message, then send the envelope frame (a ROUTER's routing id;
// NULL for none) and the message's frames without blocking. Does not take
// the message. 0, -EAGAIN, -EHOSTUNREACH, -EINVAL (malformed: nothing
// sent), other -zmq_errno().
__attribute__((warn_unused_result))
int net_msg_send_frames(void *socket, net_msg_t *msg, const void *envelope, size_t envelope_len);


// ---- between key.c and transport.c -----------------------------------------

// The raw 32-byte keys; the secret is NULL for a public key alone.
const uint8_t *net_key_public_raw(const net_key_t *self);
const uint8_t *net_key_secret_raw(const net_key_t *self);
// 1 when the raw public key is on the list (the ZAP handler asks).
int net_allow_contains_raw(const net_allow_t *self, const uint8_t *key);

// ---- key.c's text parsers (the fuzz target calls them) ----------------------

// Add every key of an allow-list's text (len bytes, any bytes) to self;
// path names it in errors. Stops at the first bad line: 0; -EINVAL with
// the line number; -ENOMEM.
__attribute__((warn_unused_result))
int net_allow_parse(net_allow_t *self, const char *text, size_t len, const char *path,
                    char *err, size_t errlen);
// The one key line of a key file's text (NUL-terminated, edited in place)
// into z85 (NET_KEY_Z85_LEN + 1 bytes). 0 or -EINVAL with a reason naming path.
__attribute__((warn_unused_result))
int net_key_parse(char *text, const char *path, char *z85, char *err, size_t errlen);

#endif
