/* msg.c - a message as zmq frames: build (add tensors, meta), send without
 * blocking, receive and check with the wire decoder, read tensors back.
 *
 * Payloads live in zmq_msg_t frames from start to end, so sending encodes
 * straight into the frame and receiving keeps libzmq's buffer (no copies).
 * Nothing here waits: deadlines and polling belong to transport.c.
 */
#include "wire.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

struct net_msg_s {
    net_head_t head;                     // header; the caller may write it (net_msg_head)
    unsigned frames;                     // tensor frames initialised: the truth that
                                         // head.ntensors must match when sent
    zmq_msg_t tensor[NET_TENSORS_MAX];   // payload frames, `frames` of them initialised
    zmq_msg_t meta;                      // meta text frame (0 bytes = none), always initialised
};

// What we may send: the hard limits (a receiver applies its own).
static const net_limits_t s_hard = {
    .max_tensors = NET_TENSORS_MAX,
    .max_dims = NET_DIMS_MAX,
    .max_dim = UINT32_MAX,
    .max_payload = NET_PAYLOAD_MAX,
    .max_meta = NET_META_MAX,
};

net_msg_t *net_msg_new(int type)
{
    net_msg_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    self->head.type = (uint16_t) type;
    zmq_msg_init(&self->meta);
    return self;
}

void net_msg_destroy(net_msg_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    net_msg_t *self = *self_p;
    net_frames_close(self->tensor, self->frames);
    zmq_msg_close(&self->meta);
    free(self);
    *self_p = NULL;
}

net_msg_t *net_msg_reply(const net_msg_t *req, int type)
{
    net_msg_t *self = net_msg_new(type);
    if (!self)
        return NULL;
    self->head.flags = NET_FLAG_REPLY;
    self->head.id = req->head.id;
    self->head.step = req->head.step;
    self->head.stage = req->head.stage;
    self->head.mb = req->head.mb;
    return self;
}

net_msg_t *net_msg_dup(const net_msg_t *self)
{
    net_msg_t *copy = net_msg_new(self->head.type);
    if (!copy)
        return NULL;
    copy->head = self->head;
    for (unsigned t = 0; t < self->frames; t++) {
        zmq_msg_init(&copy->tensor[t]);
        copy->frames++;
        if (zmq_msg_copy(&copy->tensor[t], (zmq_msg_t *) &self->tensor[t]) != 0)
            goto out_destroy;
    }
    if (zmq_msg_copy(&copy->meta, (zmq_msg_t *) &self->meta) != 0)
        goto out_destroy;
    return copy;
out_destroy:
    net_msg_destroy(&copy);
    return NULL;
}

size_t net_msg_overhead(void)
{
    return sizeof(net_msg_t);
}

net_head_t *net_msg_head(net_msg_t *self)
{
    return &self->head;
}

const net_head_t *net_msg_head_const(const net_msg_t *self)
{
    return &self->head;
}

// ---- building --------------------------------------------------------------

// Check a shape the caller gives for the next tensor (its frame is not
// made yet).
static int s_tensor_shape(const net_msg_t *self, int dtype, const uint32_t *dims, int ndims,
                          net_shape_t *shape)
{
    if (self->frames >= NET_TENSORS_MAX || self->head.ntensors != self->frames || ndims < 1 ||
        ndims > NET_DIMS_MAX || dtype < 1 || dtype > NET_DTYPE_MAX)
        return -EINVAL;
    memset(shape, 0, sizeof *shape);
    shape->dtype = (uint8_t) dtype;
    shape->ndims = (uint8_t) ndims;
    uint64_t numel = 1;
    for (int d = 0; d < ndims; d++) {
        if (dims[d] < 1 || __builtin_mul_overflow(numel, (uint64_t) dims[d], &numel))
            return -EINVAL;
        shape->dims[d] = dims[d];
    }
    shape->bytes = net_codec_bytes(dtype, numel);
    if (shape->bytes == 0 || shape->bytes > NET_PAYLOAD_MAX)
        return -EINVAL;
    return 0;
}

// Check a shape the caller gives and open its frame: on 0, the next tensor
// slot holds an initialised frame of the right size (not yet counted).
static int s_tensor_open(net_msg_t *self, int dtype, const uint32_t *dims, int ndims,
                         net_shape_t *shape)
{
    int rc = s_tensor_shape(self, dtype, dims, ndims, shape);
    if (rc < 0)
        return rc;
    if (zmq_msg_init_size(&self->tensor[self->frames], shape->bytes) != 0)
        return -ENOMEM;
    return 0;
}

static void s_tensor_commit(net_msg_t *self, const net_shape_t *shape)
{
    self->head.tensors[self->frames++] = *shape;
    self->head.ntensors = (uint8_t) self->frames;
}

int net_msg_add_tensor(net_msg_t *self, int dtype, const uint32_t *dims, int ndims,
                       const float *src)
{
    if (!net_dtype_is_float(dtype))
        return -EINVAL;
    net_shape_t shape;
    int rc = s_tensor_open(self, dtype, dims, ndims, &shape);
    if (rc < 0)
        return rc;
    zmq_msg_t *frame = &self->tensor[self->frames];
    rc = net_codec_encode(dtype, src, net_wire_numel(&shape), zmq_msg_data(frame),
                          zmq_msg_size(frame));
    if (rc < 0) {
        zmq_msg_close(frame);
        return rc;
    }
    s_tensor_commit(self, &shape);
    return 0;
}

int net_msg_add_raw(net_msg_t *self, int dtype, const uint32_t *dims, int ndims,
                    const void *data, size_t bytes)
{
    net_shape_t shape;
    int rc = s_tensor_open(self, dtype, dims, ndims, &shape);
    if (rc < 0)
        return rc;
    zmq_msg_t *frame = &self->tensor[self->frames];
    if (shape.bytes != bytes) {
        zmq_msg_close(frame);
        return -EINVAL;
    }
    memcpy(zmq_msg_data(frame), data, bytes);
    s_tensor_commit(self, &shape);
    return 0;
}

int net_msg_add_shared(net_msg_t *self, const net_msg_t *src, int i, const uint32_t *dims,
                       int ndims)
{
    if (i < 0 || (unsigned) i >= src->frames)
        return -EINVAL;
    net_shape_t shape;
    int rc = s_tensor_shape(self, src->head.tensors[i].dtype, dims, ndims, &shape);
    if (rc < 0)
        return rc;
    zmq_msg_t *frame = &self->tensor[self->frames], *from = (zmq_msg_t *) &src->tensor[i];
    if (shape.bytes != zmq_msg_size(from))
        return -EINVAL;
    if (zmq_msg_init(frame) != 0 || zmq_msg_copy(frame, from) != 0) {
        zmq_msg_close(frame);
        return -ENOMEM;
    }
    s_tensor_commit(self, &shape);
    return 0;
}

int net_msg_set_meta(net_msg_t *self, const char *text)
{
    size_t len = strlen(text);
    if (len > NET_META_MAX)
        return -EINVAL;
    zmq_msg_t frame;
    if (zmq_msg_init_size(&frame, len) != 0)
        return -ENOMEM;
    memcpy(zmq_msg_data(&frame), text, len);
    zmq_msg_close(&self->meta);
    zmq_msg_init(&self->meta);
    zmq_msg_move(&self->meta, &frame);
    self->head.meta_len = (uint32_t) len;
    return 0;
}

// ---- reading ---------------------------------------------------------------

int net_msg_tensor(const net_msg_t *self, int i, float *dst, size_t n)
{
    if (i < 0 || (unsigned) i >= self->frames)
        return -EINVAL;
    const net_shape_t *shape = &self->head.tensors[i];
    if (net_wire_numel(shape) != n)
        return -EINVAL;
    // a raw dtype is -EINVAL from the codec
    zmq_msg_t *frame = (zmq_msg_t *) &self->tensor[i];
    return net_codec_decode(shape->dtype, zmq_msg_data(frame), zmq_msg_size(frame), dst, n);
}

const void *net_msg_raw(const net_msg_t *self, int i, size_t *bytes)
{
    if (i < 0 || (unsigned) i >= self->frames)
        return NULL;
    zmq_msg_t *frame = (zmq_msg_t *) &self->tensor[i];
    if (bytes)
        *bytes = zmq_msg_size(frame);
    return zmq_msg_data(frame);
}

const char *net_msg_meta(const net_msg_t *self, size_t *len)
{
    zmq_msg_t *frame = (zmq_msg_t *) &self->meta;
    if (len)
        *len = zmq_msg_size(frame);
    return zmq_msg_size(frame) ? zmq_msg_data(frame) : NULL;
}

int net_msg_meta_get(const net_msg_t *self, const char *key, char *out, size_t cap)
{
    size_t len = 0, klen = strlen(key);
    const char *text = net_msg_meta(self, &len);
    if (!text)
        return -ENOENT;
    const char *end = text + len;
    for (const char *line = text; line < end;) {
        const char *eol = memchr(line, '\n', (size_t) (end - line));
        if (!eol)
            eol = end;
        if ((size_t) (eol - line) > klen && memcmp(line, key, klen) == 0 && line[klen] == '=') {
            size_t vlen = (size_t) (eol - line) - klen - 1;
            if (vlen + 1 > cap)
                return -ENOBUFS;
            memcpy(out, line + klen + 1, vlen);
            out[vlen] = '\0';
            return 0;
        }
        line = eol + 1;
    }
    return -ENOENT;
}

// ---- frames in and out -------------------------------------------------------

void net_frames_close(zmq_msg_t *parts, size_t n)
{
    for (size_t i = 0; i < n; i++)
        zmq_msg_close(&parts[i]);
}

int net_frames_recv(void *socket, zmq_msg_t *parts, size_t cap, size_t *total)
{
    *total = 0;
    zmq_msg_t spill;
    int more = 1;
    while (more) {
        zmq_msg_t *part = *total < cap ? &parts[*total] : &spill;
        zmq_msg_init(part);
        if (zmq_msg_recv(part, socket, ZMQ_DONTWAIT) < 0) {
            // the parts of a message arrive together, so only the first can fail
            int rc = -zmq_errno();
            zmq_msg_close(part);
            net_frames_close(parts, *total < cap ? *total : cap);
            *total = 0;
            return rc;
        }
        more = zmq_msg_more(part);
        if (part == &spill)
            zmq_msg_close(&spill);
        ++*total;
    }
    return 0;
}

int net_msg_from_frames(zmq_msg_t *frames, size_t kept, size_t total,
                        const net_limits_t *limits, net_msg_t **out, char *err, size_t errlen)
{
    *out = NULL;
    net_span_t spans[NET_WIRE_FRAMES_MAX];
    net_head_t head;
    int rc;
    if (total < 1 || kept < 1) {
        if (err && errlen)
            snprintf(err, errlen, "no frames");
        rc = -EPROTO;
        goto out_close;
    }
    if (total > NET_WIRE_FRAMES_MAX || kept < total) {
        // too many frames for any header: name what the header says anyway
        rc = net_wire_head_decode(zmq_msg_data(&frames[0]), zmq_msg_size(&frames[0]), limits,
                                  &head, err, errlen);
        if (rc == 0 && err && errlen)
            snprintf(err, errlen, "%zu frames, the header declares %d", total,
                     1 + head.ntensors + (head.meta_len > 0));
        rc = -EPROTO;
        goto out_close;
    }
    for (size_t i = 0; i < total; i++)
        spans[i] = (net_span_t) {zmq_msg_data(&frames[i]), zmq_msg_size(&frames[i])};
    rc = net_wire_decode(spans, total, limits, &head, err, errlen);
    if (rc < 0)
        goto out_close;
    net_msg_t *msg = net_msg_new(head.type);
    if (!msg) {
        rc = -ENOMEM;
        goto out_close;
    }
    msg->head = head;
    for (unsigned t = 0; t < head.ntensors; t++) {
        zmq_msg_init(&msg->tensor[t]);
        zmq_msg_move(&msg->tensor[t], &frames[1 + t]);
        msg->frames++;
    }
    if (head.meta_len > 0)
        zmq_msg_move(&msg->meta, &frames[total - 1]);
    *out = msg;
out_close:
    net_frames_close(frames, kept);
    return rc;
}

// Send one more part (a reference to frame, which stays the message's).
static int s_part_send(void *socket, zmq_msg_t *frame, int more)
{
    zmq_msg_t copy;
    zmq_msg_init(&copy);
    zmq_msg_copy(&copy, frame);
    if (zmq_msg_send(&copy, socket, ZMQ_DONTWAIT | (more ? ZMQ_SNDMORE : 0)) >= 0)
        return 0;
    zmq_msg_close(&copy);
    return -zmq_errno();
}

// 0 when the header (which the caller may have written) still describes
// the frames, and a receiver with the hard limits would accept it.
static int s_msg_check(net_msg_t *msg, uint8_t *buf, size_t cap, size_t *len)
{
    net_head_t check;
    if (msg->head.ntensors != msg->frames || msg->head.meta_len != zmq_msg_size(&msg->meta))
        return -EINVAL;
    for (unsigned t = 0; t < msg->frames; t++) {
        if (msg->head.tensors[t].bytes != zmq_msg_size(&msg->tensor[t]))
            return -EINVAL;
    }
    *len = net_wire_head_encode(&msg->head, buf, cap);
    if (*len == 0 || net_wire_head_decode(buf, *len, &s_hard, &check, NULL, 0) != 0)
        return -EINVAL;
    return 0;
}

int net_msg_send_frames(void *socket, net_msg_t *msg, const void *envelope, size_t envelope_len)
{
    uint8_t buf[NET_WIRE_HEAD_MAX];
    size_t len = 0;
    if (s_msg_check(msg, buf, sizeof buf, &len) != 0)
        return -EINVAL;
    int parts = msg->head.ntensors + (msg->head.meta_len > 0);
    if (envelope && zmq_send(socket, envelope, envelope_len, ZMQ_DONTWAIT | ZMQ_SNDMORE) < 0)
        return -zmq_errno();
    // only the first part of a message can meet a full queue (the high-water
    // mark counts whole messages); should a later one fail anyway, the rest
    // still go out, so that libzmq ends (and drops) the message, never our next
    if (zmq_send(socket, buf, len, ZMQ_DONTWAIT | (parts ? ZMQ_SNDMORE : 0)) < 0)
        return -zmq_errno();
    int rc = 0;
    for (int t = 0; t < msg->head.ntensors; t++) {
        int more = t + 1 < parts;
        int prc = s_part_send(socket, &msg->tensor[t], more);
        rc = rc ? rc : prc;
    }
    if (msg->head.meta_len > 0) {
        int prc = s_part_send(socket, &msg->meta, 0);
        rc = rc ? rc : prc;
    }
    return rc;
}

int net_send(void *socket, net_msg_t **msg)
{
    int rc = net_msg_send_frames(socket, *msg, NULL, 0);
    net_msg_destroy(msg);
    return rc;
}

int net_recv(void *socket, const net_limits_t *limits, net_msg_t **out, char *err,
             size_t errlen)
{
    zmq_msg_t parts[NET_WIRE_FRAMES_MAX];
    size_t total = 0;
    *out = NULL;
    int rc = net_frames_recv(socket, parts, NET_WIRE_FRAMES_MAX, &total);
    if (rc < 0)
        return rc;
    size_t kept = total < NET_WIRE_FRAMES_MAX ? total : NET_WIRE_FRAMES_MAX;
    return net_msg_from_frames(parts, kept, total, limits, out, err, errlen);
}
