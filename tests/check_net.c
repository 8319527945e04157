/* check_net.c - Check runner for net/: the wire decoder (round trips and a
 * table of malformed messages), the codecs' error bounds, key files, and
 * the transport (allow-list, open mode, no-CURVE clients, a SIGSTOPped
 * peer, the request helper). The fuzz target's seed corpus replays here.
 *
 * Run from the repository root (tests/corpus/wire); SWARM_WRITE_CORPUS=1
 * rewrites the seed corpus after a deliberate wire change.
 */
#include "fuzz.h"
#include "wire.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

// from tests/fuzz_wire.c
int fuzz_wire_one(const uint8_t *data, size_t size);
int fuzz_wire_decode(const uint8_t *data, size_t size, char *err, size_t errlen);
size_t fuzz_wire_pack(const net_span_t *frames, size_t n, int strict, uint8_t *out, size_t cap);

static const net_limits_t s_limits = {4, 4, 1u << 16, 64u << 20, 4096};
// the fuzz target's strict set (fuzz_wire.c)
static const net_limits_t s_strict = {2, 3, 64, 4096, 256};

static uint64_t s_rng = 0x9E3779B97F4A7C15ull;

static uint32_t s_rand32(void)
{
    s_rng ^= s_rng << 13;
    s_rng ^= s_rng >> 7;
    s_rng ^= s_rng << 17;
    return (uint32_t) (s_rng >> 16);
}

// uniform in [-1, 1)
static float s_uniform(void)
{
    return (float) ((double) s_rand32() / 2147483648.0 - 1.0);
}

static const char *s_corpus_dir(void)
{
    const char *dir = getenv("SWARM_CORPUS");
    return dir ? dir : "tests/corpus/wire";
}

// ---- the wire: a valid base message and its malformed variants ------------

typedef struct {
    uint8_t head[NET_WIRE_HEAD_MAX + 16]; // header frame bytes
    uint8_t pay[512];                     // tensor 0 payload
    char meta[300];                       // meta text (not NUL-terminated on the wire)
    net_span_t frames[8];                 // the message as frames
    size_t n;                             // frames in use
    int strict;                           // decode with s_strict (else the loose set)
} s_wire_t;

// FWD, one f16 tensor (2, 3, 4), meta "k=v": valid under both limit sets.
static void s_wire_base(s_wire_t *w)
{
    memset(w, 0, sizeof *w);
    net_head_t h = {.type = NET_MSG_FWD, .id = 7, .step = 3, .stage = 1, .mb = 2,
                    .meta_len = 3, .ntensors = 1};
    h.tensors[0] = (net_shape_t) {NET_DTYPE_F16, 3, {2, 3, 4, 0}, 48};
    float x[24];
    for (int i = 0; i < 24; i++)
        x[i] = 0.5f * (float) i - 3.0f;
    ck_assert_int_eq(net_codec_encode(NET_DTYPE_F16, x, 24, w->pay, sizeof w->pay), 0);
    memcpy(w->meta, "k=v", 3);
    size_t len = net_wire_head_encode(&h, w->head, sizeof w->head);
    ck_assert_uint_eq(len, 72);
    w->frames[0] = (net_span_t) {w->head, len};
    w->frames[1] = (net_span_t) {w->pay, 48};
    w->frames[2] = (net_span_t) {(uint8_t *) w->meta, 3};
    w->n = 3;
}

// descriptor t of the header
static uint8_t *s_desc(s_wire_t *w, int t)
{
    return w->head + NET_WIRE_FIXED + t * NET_WIRE_SHAPE;
}

static void m_head_0(s_wire_t *w) { w->frames[0].size = 0; }
static void m_head_39(s_wire_t *w) { w->frames[0].size = 39; }
static void m_head_71(s_wire_t *w) { w->frames[0].size = 71; }
static void m_head_73(s_wire_t *w) { w->frames[0].size = 73; }
static void m_magic(s_wire_t *w) { w->head[0] = 'X'; }
static void m_version(s_wire_t *w) { net_put16(w->head + 4, 2); }
static void m_type_0(s_wire_t *w) { net_put16(w->head + 6, 0); }
static void m_type_15(s_wire_t *w) { net_put16(w->head + 6, NET_MSG_TYPE_MAX + 1); }
static void m_flags(s_wire_t *w) { w->head[37] = 0x80; }
static void m_reserved(s_wire_t *w) { w->head[38] = 1; }
static void m_ndims_5(s_wire_t *w) { s_desc(w, 0)[1] = 5; }
static void m_ndims_0(s_wire_t *w) { s_desc(w, 0)[1] = 0; }
static void m_dim_zero(s_wire_t *w) { net_put32(s_desc(w, 0) + 8, 0); }
static void m_unused_dim(s_wire_t *w) { net_put32(s_desc(w, 0) + 16, 5); }
static void m_dtype(s_wire_t *w) { s_desc(w, 0)[0] = 9; }
static void m_desc_reserved(s_wire_t *w) { s_desc(w, 0)[22] = 1; }
static void m_length(s_wire_t *w) { net_put64(s_desc(w, 0) + 24, 47); }
static void m_missing_tensor(s_wire_t *w) { w->frames[1] = w->frames[2]; w->n = 2; }
static void m_missing_meta(s_wire_t *w) { w->n = 2; }
static void m_no_frames(s_wire_t *w) { w->n = 0; }
static void m_tensor_short(s_wire_t *w) { w->frames[1].size = 47; }
static void m_meta_short(s_wire_t *w) { w->frames[2].size = 2; }
static void m_meta_nul(s_wire_t *w) { w->meta[1] = '\0'; }

static void m_extra_frame(s_wire_t *w)
{
    w->frames[3] = w->frames[2];
    w->n = 4;
}

static void m_ndims_4_strict(s_wire_t *w)
{
    w->strict = 1;
    s_desc(w, 0)[1] = 4;
    net_put32(s_desc(w, 0) + 16, 1);
}

static void m_dim_over_strict(s_wire_t *w)
{
    w->strict = 1;
    net_put32(s_desc(w, 0) + 4, 65);
}

// three descriptors (copies of the first) against max_tensors 2
static void m_tensors_3_strict(s_wire_t *w)
{
    w->strict = 1;
    w->head[36] = 3;
    memcpy(s_desc(w, 1), s_desc(w, 0), NET_WIRE_SHAPE);
    memcpy(s_desc(w, 2), s_desc(w, 0), NET_WIRE_SHAPE);
    w->frames[0].size = NET_WIRE_FIXED + 3 * NET_WIRE_SHAPE;
}

static void m_overflow(s_wire_t *w)
{
    uint8_t *d = s_desc(w, 0);
    d[1] = 4;
    for (int i = 0; i < 4; i++)
        net_put32(d + 4 + 4 * i, UINT32_MAX);
}

// 2^31 x 2^31 f32: the count fits in 64 bits, the bytes do not
static void m_size_overflow(s_wire_t *w)
{
    uint8_t *d = s_desc(w, 0);
    d[0] = NET_DTYPE_F32;
    net_put32(d + 4, 1u << 31);
    net_put32(d + 8, 1u << 31);
    net_put32(d + 12, 1);
}

static void m_payload_strict(s_wire_t *w)
{
    uint8_t *d = s_desc(w, 0);
    w->strict = 1;
    net_put32(d + 4, 64);
    net_put32(d + 8, 64);
    net_put32(d + 12, 1);
    net_put64(d + 24, 64 * 64 * 2);
}

// two tensors of 2400 bytes each: each fits 4096, together they do not
static void m_payload_sum_strict(s_wire_t *w)
{
    w->strict = 1;
    w->head[36] = 2;
    uint8_t *d = s_desc(w, 0);
    d[1] = 2;
    net_put32(d + 4, 40);
    net_put32(d + 8, 30);
    net_put32(d + 12, 0);
    net_put64(d + 24, 2400);
    memcpy(s_desc(w, 1), d, NET_WIRE_SHAPE);
    w->frames[0].size = NET_WIRE_FIXED + 2 * NET_WIRE_SHAPE;
}

static void m_meta_strict(s_wire_t *w)
{
    w->strict = 1;
    net_put32(w->head + 32, 300);
    memset(w->meta, 'a', 300);
    w->frames[2].size = 300;
}

// content the codecs refuse: the wire is fine, the values are not
static void m_f16_inf(s_wire_t *w) { net_put16(w->pay + 10, 0x7c00); }
static void m_f16_nan(s_wire_t *w) { net_put16(w->pay + 2, 0xfe01); }

static void s_as_f32(s_wire_t *w, float bad)
{
    uint8_t *d = s_desc(w, 0);
    d[0] = NET_DTYPE_F32;
    net_put64(d + 24, 96);
    w->frames[1].size = 96;
    for (int i = 0; i < 24; i++)
        net_putf32(w->pay + 4 * i, (float) i);
    net_putf32(w->pay + 4 * 5, bad);
}

static void m_f32_nan(s_wire_t *w) { s_as_f32(w, NAN); }
static void m_f32_inf(s_wire_t *w) { s_as_f32(w, -INFINITY); }

// i8: 24 values are one block: 4-byte scale + 24 bytes
static void s_as_i8(s_wire_t *w, float scale, int8_t q5)
{
    uint8_t *d = s_desc(w, 0);
    d[0] = NET_DTYPE_I8;
    net_put64(d + 24, 28);
    w->frames[1].size = 28;
    net_putf32(w->pay, scale);
    for (int i = 0; i < 24; i++)
        w->pay[4 + i] = (uint8_t) (int8_t) (i - 12);
    w->pay[4 + 5] = (uint8_t) q5;
}

static void m_i8_scale_nan(s_wire_t *w) { s_as_i8(w, NAN, 1); }
static void m_i8_scale_neg(s_wire_t *w) { s_as_i8(w, -1.0f, 1); }
static void m_i8_scale_huge(s_wire_t *w) { s_as_i8(w, 1e38f, 1); }
static void m_i8_minus_128(s_wire_t *w) { s_as_i8(w, 0.5f, -128); }

typedef struct {
    const char *name;                // also the seed file: bad-NAME
    void (*mutate)(s_wire_t *w);     // applied to the base message
    const char *reason;              // a piece of the reason the decoder gives
} s_bad_case_t;

static const s_bad_case_t s_bad[] = {
    {"truncated-header-0", m_head_0, "header 0 bytes"},
    {"truncated-header-39", m_head_39, "need at least 40"},
    {"truncated-descriptor", m_head_71, "1 tensors need 72"},
    {"header-trailing-bytes", m_head_73, "header 73 bytes"},
    {"wrong-magic", m_magic, "magic"},
    {"wrong-version", m_version, "protocol version 2"},
    {"unknown-type-0", m_type_0, "unknown message type 0"},
    {"unknown-type-15", m_type_15, "unknown message type 15"},
    {"unknown-flags", m_flags, "unknown flags"},
    {"reserved-header", m_reserved, "reserved header bytes"},
    {"too-many-tensors", m_tensors_3_strict, "3 tensors, limit 2"},
    {"too-many-dims", m_ndims_5, "5 dims, limit 1..4"},
    {"too-many-dims-for-caller", m_ndims_4_strict, "4 dims, limit 1..3"},
    {"zero-dims", m_ndims_0, "0 dims"},
    {"dim-zero", m_dim_zero, "dim 1 is 0"},
    {"dim-over-limit", m_dim_over_strict, "dim 0 is 65, limit 1..64"},
    {"unused-dim-set", m_unused_dim, "unused dim 3"},
    {"unknown-dtype", m_dtype, "unknown dtype 9"},
    {"reserved-descriptor", m_desc_reserved, "reserved bytes"},
    {"length-mismatch", m_length, "payload 47 bytes"},
    {"overflowing-product", m_overflow, "element count overflows"},
    {"overflowing-size", m_size_overflow, "overflow the size"},
    {"payload-over-limit", m_payload_strict, "payload over the limit"},
    {"payload-sum-over-limit", m_payload_sum_strict, "at tensor 1"},
    {"meta-over-limit", m_meta_strict, "meta 300 bytes, limit 256"},
    {"missing-tensor-frame", m_missing_tensor, "2 frames, the header declares 3"},
    {"missing-meta-frame", m_missing_meta, "2 frames, the header declares 3"},
    {"extra-frame", m_extra_frame, "4 frames, the header declares 3"},
    {"no-frames", m_no_frames, "no frames"},
    {"tensor-frame-short", m_tensor_short, "tensor 0 frame 47 bytes"},
    {"meta-frame-short", m_meta_short, "meta frame 2 bytes"},
    {"meta-nul", m_meta_nul, "NUL"},
    {"f16-inf", m_f16_inf, "content refused"},
    {"f16-nan", m_f16_nan, "content refused"},
    {"f32-nan", m_f32_nan, "content refused"},
    {"f32-inf", m_f32_inf, "content refused"},
    {"i8-scale-nan", m_i8_scale_nan, "content refused"},
    {"i8-scale-negative", m_i8_scale_neg, "content refused"},
    {"i8-scale-huge", m_i8_scale_huge, "content refused"},
    {"i8-minus-128", m_i8_minus_128, "content refused"},
};
#define N_BAD ((int) (sizeof s_bad / sizeof s_bad[0]))

static size_t s_bad_pack(int i, uint8_t *out, size_t cap)
{
    s_wire_t w;
    s_wire_base(&w);
    s_bad[i].mutate(&w);
    size_t len = fuzz_wire_pack(w.frames, w.n, w.strict, out, cap);
    ck_assert_uint_gt(len, 0);
    return len;
}

START_TEST(test_wire_accepts_the_base_message)
{
    s_wire_t w;
    s_wire_base(&w);
    net_head_t h;
    char err[256] = "";
    ck_assert_msg(net_wire_decode(w.frames, w.n, &s_limits, &h, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(net_wire_decode(w.frames, w.n, &s_strict, &h, err, sizeof err), 0);
    ck_assert_uint_eq(h.type, NET_MSG_FWD);
    ck_assert_uint_eq(h.id, 7);
    ck_assert_uint_eq(h.tensors[0].dims[2], 4);
}
END_TEST

START_TEST(test_wire_rejects_malformed)
{
    // _i: the loop index, one malformed case per run
    uint8_t buf[2048];
    size_t len = s_bad_pack(_i, buf, sizeof buf);
    char err[256] = "";
    int rc = fuzz_wire_decode(buf, len, err, sizeof err);
    ck_assert_msg(rc == -EPROTO, "%s: accepted (rc %d)", s_bad[_i].name, rc);
    ck_assert_msg(strstr(err, s_bad[_i].reason), "%s: reason \"%s\" lacks \"%s\"", s_bad[_i].name,
                  err, s_bad[_i].reason);
}
END_TEST

START_TEST(test_wire_rejects_every_truncation)
{
    // every header length short of the base's 72, with or without the rest
    s_wire_t w;
    s_wire_base(&w);
    for (size_t cut = 0; cut < 72; cut++) {
        net_head_t h;
        w.frames[0].size = cut;
        ck_assert_int_eq(net_wire_decode(w.frames, w.n, &s_limits, &h, NULL, 0), -EPROTO);
        ck_assert_int_eq(net_wire_decode(w.frames, 1, &s_limits, &h, NULL, 0), -EPROTO);
    }
}
END_TEST

// ---- messages through a socket pair ------------------------------------------

typedef struct {
    void *ctx;                       // created inside the test
    void *a, *b;                     // inproc PAIR ends
} s_pair_t;

static void s_pair_open(s_pair_t *p)
{
    p->ctx = zmq_ctx_new();
    ck_assert_ptr_nonnull(p->ctx);
    p->a = zmq_socket(p->ctx, ZMQ_PAIR);
    p->b = zmq_socket(p->ctx, ZMQ_PAIR);
    ck_assert_int_eq(zmq_bind(p->a, "inproc://check-net-pair"), 0);
    ck_assert_int_eq(zmq_connect(p->b, "inproc://check-net-pair"), 0);
}

static void s_pair_close(s_pair_t *p)
{
    zmq_close(p->a);
    zmq_close(p->b);
    zmq_ctx_term(p->ctx);
}

// The base message's frames, sent by hand on a raw zmq socket.
static void s_raw_send_base(void *socket)
{
    s_wire_t w;
    s_wire_base(&w);
    for (size_t i = 0; i < w.n; i++)
        zmq_send(socket, w.frames[i].data, w.frames[i].size, i + 1 < w.n ? ZMQ_SNDMORE : 0);
}

// A DEALER outside net (a foreign client) in a context of its own.
static void *s_raw_dealer(void **ctx)
{
    *ctx = zmq_ctx_new();
    void *socket = zmq_socket(*ctx, ZMQ_DEALER);
    int zero = 0;
    ck_assert_ptr_nonnull(socket);
    zmq_setsockopt(socket, ZMQ_LINGER, &zero, sizeof zero);
    return socket;
}

// A message of every type with a different mix of parts.
static net_msg_t *s_sample_msg(int type)
{
    net_msg_t *m = net_msg_new(type);
    ck_assert_ptr_nonnull(m);
    net_head_t *h = net_msg_head(m);
    h->id = 1000 + (uint64_t) type;
    h->step = ((uint64_t) type << 40) | 5;
    h->stage = (uint32_t) type % 3;
    h->mb = 0xfffffff0u + (uint32_t) type % 16;
    h->flags = type % 2 ? NET_FLAG_REPLY : 0;
    float x[300];
    for (int i = 0; i < 300; i++)
        x[i] = s_uniform() * (float) type;
    uint32_t d3[3] = {2, 5, 30}, d1[1] = {300}, d2[2] = {4, 75};
    int dtype = 1 + type % 3; // f32, f16, i8 in turn
    if (type == NET_MSG_FWD || type == NET_MSG_BWD || type == NET_MSG_RESULT ||
        type == NET_MSG_GRAD || type == NET_MSG_UPDATE || type == NET_MSG_STATE)
        ck_assert_int_eq(net_msg_add_tensor(m, dtype, d3, 3, x), 0);
    if (type == NET_MSG_FWD) {
        uint8_t tokens[300];
        for (int i = 0; i < 300; i++)
            tokens[i] = (uint8_t) i;
        ck_assert_int_eq(net_msg_add_raw(m, NET_DTYPE_U8, d2, 2, tokens, 300), 0);
    }
    if (type == NET_MSG_BWD || type == NET_MSG_STATE) {
        ck_assert_int_eq(net_msg_add_tensor(m, NET_DTYPE_F32, d1, 1, x), 0);
        ck_assert_int_eq(net_msg_add_tensor(m, NET_DTYPE_I8, d2, 2, x), 0);
    }
    if (type == NET_MSG_HELLO)
        ck_assert_int_eq(net_msg_set_meta(m, "name=laptop\ndevice=cpu\nmemory=8589934592\n"
                                             "tok_s=1234.5"), 0);
    if (type == NET_MSG_STATUS || type == NET_MSG_ERROR || type == NET_MSG_HEARTBEAT ||
        type == NET_MSG_RESULT)
        ck_assert_int_eq(net_msg_set_meta(m, "reason=a longer text, with = and spaces"), 0);
    return m;
}

static void s_assert_same(const net_msg_t *a, const net_msg_t *b)
{
    const net_head_t *x = net_msg_head_const(a), *y = net_msg_head_const(b);
    ck_assert_uint_eq(x->type, y->type);
    ck_assert_uint_eq(x->flags, y->flags);
    ck_assert_uint_eq(x->id, y->id);
    ck_assert_uint_eq(x->step, y->step);
    ck_assert_uint_eq(x->stage, y->stage);
    ck_assert_uint_eq(x->mb, y->mb);
    ck_assert_uint_eq(x->ntensors, y->ntensors);
    ck_assert_uint_eq(x->meta_len, y->meta_len);
    for (int t = 0; t < x->ntensors; t++) {
        ck_assert_mem_eq(&x->tensors[t], &y->tensors[t], sizeof x->tensors[t]);
        size_t na = 0, nb = 0;
        const void *pa = net_msg_raw(a, t, &na), *pb = net_msg_raw(b, t, &nb);
        ck_assert_uint_eq(na, nb);
        ck_assert_int_eq(memcmp(pa, pb, na), 0);
    }
    size_t la = 0, lb = 0;
    const char *ma = net_msg_meta(a, &la), *mb = net_msg_meta(b, &lb);
    ck_assert_uint_eq(la, lb);
    if (la)
        ck_assert_int_eq(memcmp(ma, mb, la), 0);
}

START_TEST(test_msg_round_trips_every_type)
{
    s_pair_t p;
    s_pair_open(&p);
    for (int type = 1; type <= NET_MSG_TYPE_MAX; type++) {
        net_msg_t *sent = s_sample_msg(type);
        net_msg_t *copy = net_msg_dup(sent);
        ck_assert_ptr_nonnull(copy);
        ck_assert_int_eq(net_send(p.a, &sent), 0);
        ck_assert_ptr_null(sent);
        net_msg_t *got = NULL;
        char err[256] = "";
        zmq_pollitem_t item = {p.b, 0, ZMQ_POLLIN, 0};
        ck_assert_int_eq(zmq_poll(&item, 1, 1000), 1);
        int rc = net_recv(p.b, &s_limits, &got, err, sizeof err);
        ck_assert_msg(rc == 0, "%s: %s", net_msg_type_name(type), err);
        s_assert_same(copy, got);
        net_msg_destroy(&copy);
        net_msg_destroy(&got);
        ck_assert_ptr_null(got);
    }
    s_pair_close(&p);
}
END_TEST

START_TEST(test_msg_tensors_decode_to_what_was_sent)
{
    float x[1000], y[1000];
    for (int i = 0; i < 1000; i++)
        x[i] = s_uniform() * 10.0f;
    net_msg_t *m = net_msg_new(NET_MSG_RESULT);
    uint32_t dims[2] = {10, 100};
    ck_assert_int_eq(net_msg_add_tensor(m, NET_DTYPE_F32, dims, 2, x), 0);
    ck_assert_int_eq(net_msg_add_tensor(m, NET_DTYPE_F16, dims, 2, x), 0);
    ck_assert_int_eq(net_msg_tensor(m, 0, y, 1000), 0);
    ck_assert_int_eq(memcmp(x, y, sizeof x), 0);
    ck_assert_int_eq(net_msg_tensor(m, 1, y, 1000), 0);
    for (int i = 0; i < 1000; i++)
        ck_assert_float_le(fabsf(x[i] - y[i]), fabsf(x[i]) * 0x1p-11f);
    ck_assert_int_eq(net_msg_tensor(m, 0, y, 999), -EINVAL);
    ck_assert_int_eq(net_msg_tensor(m, 2, y, 1000), -EINVAL);
    ck_assert_ptr_null(net_msg_raw(m, 2, NULL));
    net_msg_destroy(&m);
    net_msg_destroy(&m); // NULL is fine
}
END_TEST

// A tensor appended from another message shares its frame (no copy), keeps
// its dtype under new dims, outlives the message it came from, and travels
// as any other; what cannot be appended is refused.
START_TEST(test_msg_shared_tensor_outlives_its_source)
{
    float x[256], y[256];
    for (int i = 0; i < 256; i++)
        x[i] = s_uniform() * 10.0f;
    uint32_t d2[2] = {16, 16}, d1[1] = {256}, d3[3] = {2, 8, 16}, short1[1] = {255};
    net_msg_t *src = net_msg_new(NET_MSG_RESULT), *m = net_msg_new(NET_MSG_FWD);
    ck_assert_int_eq(net_msg_add_tensor(src, NET_DTYPE_F16, d2, 2, x), 0);
    ck_assert_int_eq(net_msg_add_shared(m, src, 0, d3, 3), 0);
    ck_assert_int_eq(net_msg_add_shared(m, src, 0, d1, 1), 0);
    size_t a = 0, b = 0;
    ck_assert_ptr_eq(net_msg_raw(m, 0, &a), net_msg_raw(src, 0, &b)); // the same bytes
    ck_assert_uint_eq(a, b);
    ck_assert_uint_eq(net_msg_head(m)->tensors[0].dtype, NET_DTYPE_F16);
    ck_assert_uint_eq(net_msg_head(m)->tensors[0].ndims, 3);
    ck_assert_uint_eq(net_msg_head(m)->tensors[0].dims[2], 16);
    ck_assert_int_eq(net_msg_add_shared(m, src, 0, short1, 1), -EINVAL); // other bytes
    ck_assert_int_eq(net_msg_add_shared(m, src, 1, d1, 1), -EINVAL);     // no tensor 1
    ck_assert_int_eq(net_msg_add_shared(m, src, -1, d1, 1), -EINVAL);
    ck_assert_uint_eq(net_msg_head(m)->ntensors, 2);
    net_msg_t *want = net_msg_dup(src);
    net_msg_destroy(&src); // m's tensors still hold the bytes
    ck_assert_int_eq(net_msg_tensor(m, 1, y, 256), 0);
    float z[256];
    ck_assert_int_eq(net_msg_tensor(want, 0, z, 256), 0);
    ck_assert_int_eq(memcmp(y, z, sizeof y), 0);
    s_pair_t p;
    s_pair_open(&p);
    ck_assert_int_eq(net_send(p.a, &m), 0);
    net_msg_t *got = NULL;
    char err[256] = "";
    zmq_pollitem_t item = {p.b, 0, ZMQ_POLLIN, 0};
    ck_assert_int_eq(zmq_poll(&item, 1, 1000), 1);
    ck_assert_msg(net_recv(p.b, &s_limits, &got, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(net_msg_head(got)->ntensors, 2);
    ck_assert_int_eq(net_msg_tensor(got, 0, y, 256), 0);
    ck_assert_int_eq(memcmp(y, z, sizeof y), 0);
    for (int t = 0; t < NET_TENSORS_MAX - 2; t++)
        ck_assert_int_eq(net_msg_add_shared(got, want, 0, d1, 1), 0);
    ck_assert_int_eq(net_msg_add_shared(got, want, 0, d1, 1), -EINVAL); // full
    net_msg_destroy(&got);
    net_msg_destroy(&want);
    s_pair_close(&p);
}
END_TEST

START_TEST(test_msg_builders_refuse_bad_input)
{
    net_msg_t *m = net_msg_new(NET_MSG_FWD);
    float x[4] = {1, 2, NAN, 4};
    uint32_t dims[1] = {4}, zero[1] = {0}, d5[5] = {1, 1, 1, 1, 4};
    ck_assert_int_eq(net_msg_add_tensor(m, NET_DTYPE_F32, dims, 1, x), -EDOM);
    ck_assert_int_eq(net_msg_add_tensor(m, NET_DTYPE_U8, dims, 1, x), -EINVAL);
    ck_assert_int_eq(net_msg_add_tensor(m, NET_DTYPE_F32, zero, 1, x), -EINVAL);
    ck_assert_int_eq(net_msg_add_tensor(m, NET_DTYPE_F32, d5, 5, x), -EINVAL);
    ck_assert_int_eq(net_msg_add_raw(m, NET_DTYPE_I32, dims, 1, x, 15), -EINVAL);
    x[2] = 3;
    for (int t = 0; t < NET_TENSORS_MAX; t++)
        ck_assert_int_eq(net_msg_add_tensor(m, NET_DTYPE_F32, dims, 1, x), 0);
    ck_assert_int_eq(net_msg_add_tensor(m, NET_DTYPE_F32, dims, 1, x), -EINVAL);
    ck_assert_uint_eq(net_msg_head(m)->ntensors, NET_TENSORS_MAX);
    // a header that a receiver would refuse, or that no longer describes
    // the frames, is never sent
    s_pair_t p;
    s_pair_open(&p);
    net_msg_t *copy = net_msg_dup(m);
    net_msg_head(m)->type = 0;
    ck_assert_int_eq(net_send(p.a, &m), -EINVAL);
    ck_assert_ptr_null(m);
    net_msg_head(copy)->ntensors = 2;
    ck_assert_int_eq(net_send(p.a, &copy), -EINVAL);
    m = net_msg_new(NET_MSG_FWD);
    ck_assert_int_eq(net_msg_add_tensor(m, NET_DTYPE_F32, dims, 1, x), 0);
    net_msg_head(m)->tensors[0].dims[0] = 5;
    net_msg_head(m)->tensors[0].bytes = 20;
    ck_assert_int_eq(net_send(p.a, &m), -EINVAL);
    m = net_msg_new(NET_MSG_HELLO);
    net_msg_head(m)->meta_len = 3;
    ck_assert_int_eq(net_send(p.a, &m), -EINVAL);
    s_pair_close(&p);
}
END_TEST

START_TEST(test_msg_meta_lookup)
{
    net_msg_t *m = net_msg_new(NET_MSG_HELLO);
    char v[16];
    ck_assert_int_eq(net_msg_meta_get(m, "name", v, sizeof v), -ENOENT);
    ck_assert_int_eq(net_msg_set_meta(m, "name=laptop\nnamespace=x\nempty=\ntok_s=12.5"), 0);
    ck_assert_int_eq(net_msg_meta_get(m, "name", v, sizeof v), 0);
    ck_assert_str_eq(v, "laptop");
    ck_assert_int_eq(net_msg_meta_get(m, "tok_s", v, sizeof v), 0);
    ck_assert_str_eq(v, "12.5");
    ck_assert_int_eq(net_msg_meta_get(m, "empty", v, sizeof v), 0);
    ck_assert_str_eq(v, "");
    ck_assert_int_eq(net_msg_meta_get(m, "nam", v, sizeof v), -ENOENT);
    ck_assert_int_eq(net_msg_meta_get(m, "name", v, 4), -ENOBUFS);
    net_msg_destroy(&m);
}
END_TEST

START_TEST(test_msg_reply_keeps_ids)
{
    net_msg_t *req = s_sample_msg(NET_MSG_FWD);
    net_msg_t *rep = net_msg_reply(req, NET_MSG_RESULT);
    const net_head_t *a = net_msg_head_const(req), *b = net_msg_head_const(rep);
    ck_assert_uint_eq(b->type, NET_MSG_RESULT);
    ck_assert_uint_eq(b->flags, NET_FLAG_REPLY);
    ck_assert_uint_eq(b->id, a->id);
    ck_assert_uint_eq(b->step, a->step);
    ck_assert_uint_eq(b->stage, a->stage);
    ck_assert_uint_eq(b->mb, a->mb);
    ck_assert_uint_eq(b->ntensors, 0);
    net_msg_destroy(&req);
    net_msg_destroy(&rep);
}
END_TEST

// Frames sent one by one: too many, or garbage, and the socket stays usable.
START_TEST(test_msg_recv_rejects_raw_frames)
{
    s_pair_t p;
    s_pair_open(&p);
    s_wire_t w;
    s_wire_base(&w);
    char err[256] = "";
    net_msg_t *got = NULL;
    for (int i = 0; i < 9; i++) // 9 frames, the header says 3
        zmq_send(p.a, w.frames[i < 3 ? i : 2].data, w.frames[i < 3 ? i : 2].size,
                 i < 8 ? ZMQ_SNDMORE : 0);
    zmq_send(p.a, "garbage", 7, 0);
    for (int i = 0; i < 3; i++)
        zmq_send(p.a, w.frames[i].data, w.frames[i].size, i < 2 ? ZMQ_SNDMORE : 0);
    zmq_pollitem_t item = {p.b, 0, ZMQ_POLLIN, 0};
    ck_assert_int_eq(zmq_poll(&item, 1, 1000), 1);
    ck_assert_int_eq(net_recv(p.b, &s_limits, &got, err, sizeof err), -EPROTO);
    ck_assert_msg(strstr(err, "9 frames, the header declares 3"), "%s", err);
    ck_assert_int_eq(net_recv(p.b, &s_limits, &got, err, sizeof err), -EPROTO);
    ck_assert_msg(strstr(err, "header 7 bytes"), "%s", err);
    ck_assert_int_eq(net_recv(p.b, &s_limits, &got, err, sizeof err), 0);
    ck_assert_uint_eq(net_msg_head(got)->type, NET_MSG_FWD);
    net_msg_destroy(&got);
    ck_assert_int_eq(net_recv(p.b, &s_limits, &got, err, sizeof err), -EAGAIN);
    s_pair_close(&p);
}
END_TEST

// ---- codecs --------------------------------------------------------------------

static float s_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

START_TEST(test_codec_sizes)
{
    ck_assert_uint_eq(net_codec_bytes(NET_DTYPE_F32, 10), 40);
    ck_assert_uint_eq(net_codec_bytes(NET_DTYPE_F16, 10), 20);
    ck_assert_uint_eq(net_codec_bytes(NET_DTYPE_U8, 10), 10);
    ck_assert_uint_eq(net_codec_bytes(NET_DTYPE_I32, 10), 40);
    ck_assert_uint_eq(net_codec_bytes(NET_DTYPE_I8, 1), 5);
    ck_assert_uint_eq(net_codec_bytes(NET_DTYPE_I8, NET_INT8_BLOCK), 4 + NET_INT8_BLOCK);
    ck_assert_uint_eq(net_codec_bytes(NET_DTYPE_I8, NET_INT8_BLOCK + 1), 9 + NET_INT8_BLOCK);
    ck_assert_uint_eq(net_codec_bytes(NET_DTYPE_F32, 0), 0);
    ck_assert_uint_eq(net_codec_bytes(0, 10), 0);
    ck_assert_uint_eq(net_codec_bytes(NET_DTYPE_MAX + 1, 10), 0);
    ck_assert_uint_eq(net_codec_bytes(NET_DTYPE_F32, UINT64_MAX / 2), 0);
    ck_assert_uint_eq(net_codec_bytes(NET_DTYPE_I8, UINT64_MAX - 3), 0);
}
END_TEST

START_TEST(test_codec_fp32_is_exact)
{
    enum { N = 4096 };
    float x[N], y[N];
    uint8_t buf[4 * N];
    for (int i = 0; i < N; i++) // any finite bit pattern: subnormals, -0, extremes
        do
            x[i] = s_float(s_rand32() ^ (s_rand32() << 16));
        while (!isfinite(x[i]));
    x[0] = -0.0f;
    x[1] = 0x1p-149f;
    x[2] = -FLT_MAX;
    ck_assert_int_eq(net_codec_encode(NET_DTYPE_F32, x, N, buf, sizeof buf), 0);
    ck_assert_int_eq(net_codec_decode(NET_DTYPE_F32, buf, sizeof buf, y, N), 0);
    ck_assert_int_eq(memcmp(x, y, sizeof x), 0);
    ck_assert_int_eq(net_codec_encode(NET_DTYPE_F32, x, N, buf, sizeof buf - 1), -ENOBUFS);
    ck_assert_int_eq(net_codec_decode(NET_DTYPE_F32, buf, sizeof buf - 1, y, N), -EPROTO);
}
END_TEST

static uint16_t s_to_half(float x)
{
    uint8_t b[2];
    ck_assert_int_eq(net_codec_encode(NET_DTYPE_F16, &x, 1, b, 2), 0);
    return net_le16(b);
}

static float s_from_half(uint16_t h, int *rc)
{
    uint8_t b[2];
    float y = 0;
    net_put16(b, h);
    *rc = net_codec_decode(NET_DTYPE_F16, b, 2, &y, 1);
    return y;
}

START_TEST(test_codec_fp16_every_half_round_trips)
{
    for (uint32_t h = 0; h < 65536; h++) {
        int rc;
        float y = s_from_half((uint16_t) h, &rc);
        if ((h & 0x7c00u) == 0x7c00u) { // Inf and NaN: no peer may send them
            ck_assert_int_eq(rc, -EPROTO);
            continue;
        }
        ck_assert_int_eq(rc, 0);
        ck_assert_uint_eq(s_to_half(y), h);
    }
    int rc;
    ck_assert_float_eq(s_from_half(0x3c00, &rc), 1.0f);
    ck_assert_float_eq(s_from_half(0x7bff, &rc), 65504.0f);
    ck_assert_float_eq(s_from_half(0x0001, &rc), 0x1p-24f);
    ck_assert_float_eq(s_from_half(0xc000, &rc), -2.0f);
}
END_TEST

START_TEST(test_codec_fp16_rounds_to_nearest_even)
{
    // every midpoint between neighbouring finite halves is a float: it must
    // round to the neighbour with the even mantissa
    for (uint32_t h = 0; h < 0x7bff; h++) {
        int rc;
        float lo = s_from_half((uint16_t) h, &rc), hi = s_from_half((uint16_t) (h + 1), &rc);
        float mid = (float) (((double) lo + (double) hi) / 2);
        ck_assert((double) mid == ((double) lo + (double) hi) / 2);
        uint16_t even = (h & 1) ? (uint16_t) (h + 1) : (uint16_t) h;
        ck_assert_uint_eq(s_to_half(mid), even);
        ck_assert_uint_eq(s_to_half(-mid), even | 0x8000u);
        // just off the midpoint: the nearer neighbour
        ck_assert_uint_eq(s_to_half(nextafterf(mid, 0.0f)), h);
        ck_assert_uint_eq(s_to_half(nextafterf(mid, INFINITY)), h + 1);
    }
    ck_assert_uint_eq(s_to_half(65519.99f), 0x7bff); // below the overflow midpoint
}
END_TEST

START_TEST(test_codec_fp16_error_bound)
{
    // relative error <= 2^-11 over the normal range [2^-14, 65504]
    enum { N = 1 << 16 };
    static float x[N], y[N];
    static uint8_t buf[2 * N];
    for (int i = 0; i < N; i++) {
        double e = -14.0 + 30.0 * (double) s_rand32() / 4294967296.0; // 2^-14 .. 2^16
        x[i] = (float) ((1.0 + (double) s_rand32() / 4294967296.0) * exp2(e));
        if (x[i] > 65504.0f)
            x[i] = 65504.0f;
        if (s_rand32() & 1)
            x[i] = -x[i];
    }
    ck_assert_int_eq(net_codec_encode(NET_DTYPE_F16, x, N, buf, sizeof buf), 0);
    ck_assert_int_eq(net_codec_decode(NET_DTYPE_F16, buf, sizeof buf, y, N), 0);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        double rel = fabs((double) x[i] - y[i]) / fabs((double) x[i]);
        ck_assert_msg(rel <= 0x1p-11, "x %a -> %a: relative error %g", x[i], y[i], rel);
        worst = rel > worst ? rel : worst;
    }
    ck_assert_double_gt(worst, 0x1p-12); // the bound is tight, not vacuous
}
END_TEST

START_TEST(test_codec_int8_error_bound)
{
    // |x - x'| <= absmax/254 in every block, at every scale of the normal range
    enum { N = 64 * 100 + 37 }; // a short last block
    static float x[N], y[N];
    static uint8_t buf[N + 4 * (N / 64 + 1)];
    size_t bytes = net_codec_bytes(NET_DTYPE_I8, N);
    ck_assert_uint_le(bytes, sizeof buf);
    for (int round = 0; round < 40; round++) {
        double scale = exp2(-120.0 + 6.0 * round); // 2^-120 .. 2^114
        for (int i = 0; i < N; i++)
            x[i] = (float) (s_uniform() * scale);
        if (round == 3)
            memset(x + 64, 0, 64 * sizeof *x); // an all-zero block decodes to zeros
        x[5] = (float) scale; // a block whose max is positive and exact
        ck_assert_int_eq(net_codec_encode(NET_DTYPE_I8, x, N, buf, bytes), 0);
        ck_assert_int_eq(net_codec_decode(NET_DTYPE_I8, buf, bytes, y, N), 0);
        for (int b = 0; b < N; b += NET_INT8_BLOCK) {
            int k = N - b < NET_INT8_BLOCK ? N - b : NET_INT8_BLOCK;
            float amax = 0;
            for (int i = 0; i < k; i++)
                amax = fmaxf(amax, fabsf(x[b + i]));
            for (int i = 0; i < k; i++)
                ck_assert_msg(fabs((double) x[b + i] - y[b + i]) <= (double) amax / 254.0,
                              "block %d: %a -> %a, absmax %a", b / 64, x[b + i], y[b + i], amax);
        }
    }
    for (int i = 64; i < 128; i++)
        ck_assert(y[i] == 0.0f || x[i] != 0.0f);
}
END_TEST

START_TEST(test_codec_int8_bound_holds_at_midpoints)
{
    // the worst case: values halfway between two steps of absmax/127, where
    // float rounding of the scale and the product could push past absmax/254
    float x[NET_INT8_BLOCK], y[NET_INT8_BLOCK];
    uint8_t buf[4 + NET_INT8_BLOCK];
    for (int round = 0; round < 5000; round++) {
        float amax = (float) ldexp(1.0 + (double) s_rand32() / 4294967296.0,
                                   (int) (s_rand32() % 200) - 100);
        x[0] = amax;
        for (int i = 1; i < NET_INT8_BLOCK; i++) {
            x[i] = (float) (((double) (s_rand32() % 127) + 0.5) * amax / 127.0);
            if (s_rand32() & 1)
                x[i] = -x[i];
        }
        ck_assert_int_eq(net_codec_encode(NET_DTYPE_I8, x, NET_INT8_BLOCK, buf, sizeof buf), 0);
        ck_assert_int_eq(net_codec_decode(NET_DTYPE_I8, buf, sizeof buf, y, NET_INT8_BLOCK), 0);
        for (int i = 0; i < NET_INT8_BLOCK; i++)
            ck_assert_msg(fabs((double) x[i] - y[i]) <= (double) amax / 254.0,
                          "%a -> %a, absmax %a", x[i], y[i], amax);
    }
}
END_TEST

// The fp32 decoder's check is vectorised: a non-finite value at any place
// of a tensor of any length, the vectors' tail included, is refused, and
// the largest finite values and subnormals are not.
START_TEST(test_codec_f32_decode_refuses_non_finite_anywhere)
{
    static const uint32_t bad[4] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0xff800001u};
    static const uint32_t fine[3] = {0x7f7fffffu, 0x80000001u, 0x00000000u};
    uint8_t buf[4 * 40];
    float y[40];
    for (size_t n = 1; n <= 40; n++) {
        for (size_t i = 0; i < n; i++)
            net_put32(buf + 4 * i, fine[i % 3]);
        ck_assert_int_eq(net_codec_decode(NET_DTYPE_F32, buf, 4 * n, y, n), 0);
        for (size_t at = 0; at < n; at++) {
            for (int b = 0; b < 4; b++) {
                net_put32(buf + 4 * at, bad[b]);
                ck_assert_msg(net_codec_decode(NET_DTYPE_F32, buf, 4 * n, y, n) == -EPROTO,
                              "%08x at %zu of %zu taken", bad[b], at, n);
            }
            net_put32(buf + 4 * at, fine[at % 3]);
        }
    }
}
END_TEST

START_TEST(test_codec_encoders_refuse_non_finite)
{
    static const int dtypes[3] = {NET_DTYPE_F32, NET_DTYPE_F16, NET_DTYPE_I8};
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    float x[200];
    uint8_t buf[1024];
    for (int d = 0; d < 3; d++) {
        for (int b = 0; b < 3; b++) {
            for (int at = 0; at < 200; at += 67) {
                for (int i = 0; i < 200; i++)
                    x[i] = (float) i;
                x[at] = bad[b];
                ck_assert_int_eq(net_codec_encode(dtypes[d], x, 200, buf, sizeof buf), -EDOM);
            }
        }
    }
    float big = 65520.0f, ok = 65519.0f;
    ck_assert_int_eq(net_codec_encode(NET_DTYPE_F16, &big, 1, buf, 2), -ERANGE);
    big = -1e30f;
    ck_assert_int_eq(net_codec_encode(NET_DTYPE_F16, &big, 1, buf, 2), -ERANGE);
    ck_assert_int_eq(net_codec_encode(NET_DTYPE_F16, &ok, 1, buf, 2), 0);
    ck_assert_int_eq(net_codec_encode(NET_DTYPE_U8, x, 1, buf, 4), -EINVAL);
    ck_assert_int_eq(net_codec_decode(NET_DTYPE_I32, buf, 4, x, 1), -EINVAL);
}
END_TEST

// ---- keys ------------------------------------------------------------------------

typedef struct {
    char dir[64];                    // a fresh temporary folder
    char name[128];                  // dir/NAME for key files
} s_tmp_t;

static void s_tmp_open(s_tmp_t *t)
{
    snprintf(t->dir, sizeof t->dir, "/tmp/check_net.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(t->dir));
    snprintf(t->name, sizeof t->name, "%s/node", t->dir);
}

static void s_tmp_close(s_tmp_t *t)
{
    DIR *d = opendir(t->dir);
    struct dirent *e;
    char path[512];
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s", t->dir, e->d_name);
        unlink(path);
    }
    if (d)
        closedir(d);
    rmdir(t->dir);
}

static void s_write(const char *path, const char *text, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t) strlen(text));
    close(fd);
    chmod(path, mode);
}

START_TEST(test_key_files_round_trip)
{
    s_tmp_t t;
    s_tmp_open(&t);
    net_key_t *key = NULL, *back = NULL, *pub = NULL;
    char err[512] = "", path[256];
    ck_assert_int_eq(net_key_generate(&key), 0);
    ck_assert(net_key_has_secret(key));
    ck_assert_uint_eq(strlen(net_key_public(key)), NET_KEY_Z85_LEN);
    ck_assert_msg(net_key_save(key, t.name, 0, err, sizeof err) == 0, "%s", err);
    struct stat st;
    snprintf(path, sizeof path, "%s.key", t.name);
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_uint_eq(st.st_mode & 0777, 0600);
    snprintf(path, sizeof path, "%s.pub", t.name);
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_uint_eq(st.st_mode & 0077, st.st_mode & 0044);
    ck_assert_msg(net_key_load(t.name, &back, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(net_key_public(back), net_key_public(key));
    ck_assert_int_eq(memcmp(net_key_secret_raw(back), net_key_secret_raw(key), 32), 0);
    ck_assert_int_eq(net_key_load_public(path, &pub, err, sizeof err), 0);
    ck_assert(!net_key_has_secret(pub));
    ck_assert_ptr_null(net_key_secret_raw(pub));
    ck_assert_str_eq(net_key_public(pub), net_key_public(key));
    // no overwrite without force
    ck_assert_int_eq(net_key_save(key, t.name, 0, err, sizeof err), -EEXIST);
    ck_assert_msg(strstr(err, "--force"), "%s", err);
    ck_assert_int_eq(net_key_save(back, t.name, 1, err, sizeof err), 0);
    net_key_destroy(&key);
    net_key_destroy(&back);
    net_key_destroy(&pub);
    net_key_destroy(&pub);
    s_tmp_close(&t);
}
END_TEST

START_TEST(test_key_load_refuses_bad_files)
{
    s_tmp_t t;
    s_tmp_open(&t);
    net_key_t *key = NULL, *other = NULL, *out = NULL;
    char err[512] = "", path[256], pub_path[256];
    ck_assert_int_eq(net_key_generate(&key), 0);
    ck_assert_int_eq(net_key_generate(&other), 0);
    ck_assert_int_eq(net_key_load(t.name, &out, err, sizeof err), -ENOENT);
    ck_assert_msg(strstr(err, "node.key"), "%s", err);
    ck_assert_int_eq(net_key_save(key, t.name, 0, err, sizeof err), 0);
    snprintf(path, sizeof path, "%s.key", t.name);
    snprintf(pub_path, sizeof pub_path, "%s.pub", t.name);
    // a secret others can read
    chmod(path, 0644);
    ck_assert_int_eq(net_key_load(t.name, &out, err, sizeof err), -EACCES);
    ck_assert_msg(strstr(err, "chmod 600") && strstr(err, "node.key"), "%s", err);
    // garbage, two keys, a short key
    const char *bad[] = {"not a key\n", "", "# only a comment\n", "0123456789\n",
                         "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7\n"
                         "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7\n",
                         "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]y\"7\n",
                         // Z85 characters, but "#/w+9" is over 2^32: no key (found by fuzz_keys)
                         "2CVWV6D&QXW]Ii55A)@qco0MAyn+73#/w+9Xnrjk\n"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        s_write(path, bad[i], 0600);
        ck_assert_int_eq(net_key_load(t.name, &out, err, sizeof err), -EINVAL);
        ck_assert_msg(strstr(err, "node.key"), "%s", err);
        ck_assert_ptr_null(out);
    }
    // a secret that does not match its public file
    ck_assert_int_eq(net_key_save(other, t.name, 1, err, sizeof err), 0);
    s_write(pub_path, net_key_public(key), 0644);
    ck_assert_int_eq(net_key_load(t.name, &out, err, sizeof err), -EINVAL);
    ck_assert_msg(strstr(err, "does not match"), "%s", err);
    ck_assert_int_eq(net_key_from_z85("short", &out), -EINVAL);
    net_key_destroy(&key);
    net_key_destroy(&other);
    s_tmp_close(&t);
}
END_TEST

START_TEST(test_key_allow_list)
{
    s_tmp_t t;
    s_tmp_open(&t);
    net_key_t *a = NULL, *b = NULL;
    char err[512] = "", path[256], text[512];
    ck_assert_int_eq(net_key_generate(&a), 0);
    ck_assert_int_eq(net_key_generate(&b), 0);
    net_allow_t *allow = net_allow_new();
    snprintf(path, sizeof path, "%s/allow", t.dir);
    snprintf(text, sizeof text, "# nodes\n\n  %s  \n%s\n%s\n", net_key_public(a),
             net_key_public(b), net_key_public(a));
    s_write(path, text, 0644);
    ck_assert_msg(net_allow_load(allow, path, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(net_allow_size(allow), 2);
    ck_assert(net_allow_contains(allow, net_key_public(a)));
    ck_assert(net_allow_contains(allow, net_key_public(b)));
    ck_assert(!net_allow_contains(allow, "short"));
    snprintf(text, sizeof text, "%s\nnot-a-key\n", net_key_public(a));
    s_write(path, text, 0644);
    ck_assert_int_eq(net_allow_load(allow, path, err, sizeof err), -EINVAL);
    ck_assert_msg(strstr(err, "allow:2:"), "%s", err);
    ck_assert_int_eq(net_allow_add(allow, "x"), -EINVAL);
    net_allow_destroy(&allow);
    net_allow_destroy(&allow);
    net_key_destroy(&a);
    net_key_destroy(&b);
    s_tmp_close(&t);
}
END_TEST

// Keys are kept sorted (every message is looked up): many keys, added in
// any order, by file or one by one, with duplicates, are all found.
START_TEST(test_key_allow_list_holds_many_keys)
{
    enum { N = 2000 };
    static char z85[N][NET_KEY_Z85_LEN + 1];
    static char text[N * (NET_KEY_Z85_LEN + 1) * 2];
    char err[256] = "";
    size_t len = 0;
    for (int i = 0; i < N; i++) {
        uint8_t raw[32];
        for (int b = 0; b < 32; b++)
            raw[b] = (uint8_t) s_rand32();
        zmq_z85_encode(z85[i], raw, 32);
    }
    for (int i = N - 1; i >= 0; i -= 2) // half of them twice, out of order
        len += (size_t) sprintf(text + len, "%s\n%s\n", z85[i], z85[N - 1 - i]);
    net_allow_t *parsed = net_allow_new(), *added = net_allow_new();
    ck_assert_msg(net_allow_parse(parsed, text, len, "mem", err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < N; i += 2)
        ck_assert_int_eq(net_allow_add(added, z85[(i * 7919) % N]), 0);
    ck_assert_uint_eq(net_allow_size(parsed), N);
    for (int i = 0; i < N; i++) {
        ck_assert(net_allow_contains(parsed, z85[i]));
        ck_assert(net_allow_contains(added, z85[(i * 7919) % N]) == (i % 2 == 0));
    }
    ck_assert(!net_allow_contains(parsed, "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"));
    net_allow_destroy(&parsed);
    net_allow_destroy(&added);
}
END_TEST

START_TEST(test_key_allow_reload_swaps_or_keeps)
{
    s_tmp_t t;
    s_tmp_open(&t);
    net_key_t *a = NULL, *b = NULL;
    char err[512] = "", path[256], text[512];
    ck_assert_int_eq(net_key_generate(&a), 0);
    ck_assert_int_eq(net_key_generate(&b), 0);
    net_allow_t *allow = net_allow_new();
    ck_assert_int_eq(net_allow_add(allow, net_key_public(a)), 0);
    snprintf(path, sizeof path, "%s/allow", t.dir);
    // a bad line, a missing file, a folder: the old list stays, whole
    snprintf(text, sizeof text, "%s\n%.39s\n", net_key_public(b), net_key_public(a));
    s_write(path, text, 0644);
    ck_assert_int_eq(net_allow_reload(allow, path, err, sizeof err), -EINVAL);
    ck_assert_msg(strstr(err, "allow:2:"), "%s", err);
    ck_assert_int_eq(net_allow_load(allow, path, err, sizeof err), -EINVAL); // all or nothing
    ck_assert_int_eq(net_allow_reload(allow, "/nonexistent/allow", err, sizeof err), -ENOENT);
    ck_assert_msg(strstr(err, "/nonexistent/allow"), "%s", err);
    ck_assert_int_eq(net_allow_reload(allow, t.dir, err, sizeof err), -EINVAL);
    ck_assert_uint_eq(net_allow_size(allow), 1);
    ck_assert(net_allow_contains(allow, net_key_public(a)));
    ck_assert(!net_allow_contains(allow, net_key_public(b)));
    // a good file replaces the list: b in, a out; then an empty list
    snprintf(text, sizeof text, "# after the edit\r\n%s\r\n", net_key_public(b));
    s_write(path, text, 0644);
    ck_assert_msg(net_allow_reload(allow, path, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(net_allow_size(allow), 1);
    ck_assert(net_allow_contains(allow, net_key_public(b)));
    ck_assert(!net_allow_contains(allow, net_key_public(a)));
    s_write(path, "# nobody\n", 0644);
    ck_assert_msg(net_allow_reload(allow, path, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(net_allow_size(allow), 0);
    // NUL bytes and over-long lines are bad lines, with their numbers
    ck_assert_int_eq(net_allow_parse(allow, "\n\nab\0c\n", 7, "mem", err, sizeof err), -EINVAL);
    ck_assert_msg(strstr(err, "mem:3:"), "%s", err);
    memset(text, ' ', 300);
    memcpy(text + 300, net_key_public(a), NET_KEY_Z85_LEN);
    ck_assert_int_eq(net_allow_parse(allow, text, 340, "mem", err, sizeof err), -EINVAL);
    ck_assert_msg(strstr(err, "mem:1:"), "%s", err);
    net_allow_destroy(&allow);
    net_key_destroy(&a);
    net_key_destroy(&b);
    s_tmp_close(&t);
}
END_TEST

// ---- transport -------------------------------------------------------------------

typedef struct {
    net_key_t *server;               // the router's key pair
    net_key_t *node;                 // a node on the allow-list
    net_key_t *intruder;             // a valid key nobody allowed
    net_allow_t *allow;              // holds node
} s_keys_t;

static void s_keys_open(s_keys_t *k)
{
    ck_assert_int_eq(net_key_generate(&k->server), 0);
    ck_assert_int_eq(net_key_generate(&k->node), 0);
    ck_assert_int_eq(net_key_generate(&k->intruder), 0);
    k->allow = net_allow_new();
    ck_assert_int_eq(net_allow_add(k->allow, net_key_public(k->node)), 0);
}

static void s_keys_close(s_keys_t *k)
{
    net_key_destroy(&k->server);
    net_key_destroy(&k->node);
    net_key_destroy(&k->intruder);
    net_allow_destroy(&k->allow);
}

static const net_timing_t s_fast = {.heartbeat_ms = 100, .heartbeat_timeout_ms = 300,
                                    .dead_ms = 400};

static net_server_t *s_server(const s_keys_t *k, const net_allow_t *allow,
                              const net_limits_t *limits)
{
    net_server_config_t c = {.endpoint = "tcp://127.0.0.1:*", .key = k->server, .allow = allow,
                             .limits = *limits, .timing = s_fast};
    net_server_t *server = NULL;
    char err[256] = "";
    int rc = net_server_new(&c, &server, err, sizeof err);
    ck_assert_msg(rc == 0, "net_server_new: %s", err);
    ck_assert(strncmp(net_server_endpoint(server), "tcp://127.0.0.1:", 16) == 0);
    return server;
}

static net_client_t *s_client(const net_server_t *server, const net_key_t *server_key,
                              const net_key_t *key)
{
    net_client_config_t c = {.endpoint = net_server_endpoint(server), .server = server_key,
                             .key = key, .limits = s_limits, .timing = s_fast};
    net_client_t *client = NULL;
    char err[256] = "";
    int rc = net_client_new(&c, &client, err, sizeof err);
    ck_assert_msg(rc == 0, "net_client_new: %s", err);
    return client;
}

static void s_client_say(net_client_t *client, int type)
{
    net_msg_t *m = net_msg_new(type);
    ck_assert_int_eq(net_msg_set_meta(m, "name=test"), 0);
    ck_assert_int_eq(net_client_send(client, &m), 0);
}

// The next message at the server within ms, or the error.
static int s_server_wait(net_server_t *server, int ms, net_peer_t *peer, net_msg_t **out,
                         char *err, size_t errlen)
{
    return net_server_recv(server, net_clock_ms() + ms, peer, out, err, errlen);
}

START_TEST(test_transport_allowed_key_talks)
{
    s_keys_t k;
    s_keys_open(&k);
    net_server_t *server = s_server(&k, k.allow, &s_limits);
    net_client_t *client = s_client(server, k.server, k.node);
    s_client_say(client, NET_MSG_HELLO);
    net_peer_t peer;
    net_msg_t *in = NULL;
    char err[256] = "";
    int rc = s_server_wait(server, 3000, &peer, &in, err, sizeof err);
    ck_assert_msg(rc == 0, "%d %s", rc, err);
    ck_assert_str_eq(peer.key, net_key_public(k.node)); // the ZAP User-Id
    ck_assert_uint_eq(net_msg_head(in)->type, NET_MSG_HELLO);
    // a malformed message is refused before any part of it leaves
    net_msg_t *reply = net_msg_new(NET_MSG_TYPE_MAX + 1);
    ck_assert_int_eq(net_server_send(server, &peer, &reply), -EINVAL);
    reply = net_msg_reply(in, NET_MSG_ASSIGN);
    ck_assert_int_eq(net_server_send(server, &peer, &reply), 0);
    ck_assert_ptr_null(reply);
    net_msg_t *got = NULL;
    ck_assert_int_eq(net_client_recv(client, net_clock_ms() + 3000, &got, err, sizeof err), 0);
    ck_assert_uint_eq(net_msg_head(got)->type, NET_MSG_ASSIGN);
    ck_assert_uint_eq(net_msg_head(got)->flags, NET_FLAG_REPLY);
    ck_assert_int_le(net_client_silence_ms(client, net_clock_ms()), 1000);
    net_stats_t st;
    net_server_stats(server, &st);
    ck_assert_uint_eq(st.msgs_in, 1);
    ck_assert_uint_eq(st.msgs_out, 1);
    ck_assert_uint_eq(st.auth_denied, 0);
    net_msg_destroy(&in);
    net_msg_destroy(&got);
    net_client_destroy(&client);
    net_server_destroy(&server);
    ck_assert_ptr_null(server);
    s_keys_close(&k);
}
END_TEST

START_TEST(test_transport_wrong_key_gets_nothing)
{
    s_keys_t k;
    s_keys_open(&k);
    net_server_t *server = s_server(&k, k.allow, &s_limits);
    net_client_t *intruder = s_client(server, k.server, k.intruder);
    net_client_t *misled = s_client(server, k.intruder, k.node); // wrong router key
    s_client_say(intruder, NET_MSG_HELLO);
    s_client_say(misled, NET_MSG_HELLO);
    net_peer_t peer;
    net_msg_t *in = NULL;
    char err[256] = "";
    ck_assert_int_eq(s_server_wait(server, 800, &peer, &in, err, sizeof err), -ETIMEDOUT);
    ck_assert_ptr_null(in);
    net_stats_t st;
    net_server_stats(server, &st);
    ck_assert_uint_ge(st.auth_denied, 1); // the ZAP handler saw and refused it
    ck_assert_uint_eq(st.msgs_in, 0);
    net_msg_t *got = NULL;
    ck_assert_int_eq(net_client_recv(intruder, net_clock_ms() + 100, &got, err, sizeof err),
                     -ETIMEDOUT);
    net_client_destroy(&intruder);
    net_client_destroy(&misled);
    net_server_destroy(&server);
    s_keys_close(&k);
}
END_TEST

// The allow-list changes while the server runs: a refused key that is added
// gets in when its client reconnects on its own; an admitted key that is
// removed has every later message dropped (and counted).
START_TEST(test_transport_allow_reload_admits_and_revokes)
{
    s_keys_t k;
    s_keys_open(&k);
    s_tmp_t t;
    s_tmp_open(&t);
    char path[256], text[256], err[256] = "";
    snprintf(path, sizeof path, "%s/allow", t.dir);
    net_server_t *server = s_server(&k, k.allow, &s_limits);
    net_client_t *intruder = s_client(server, k.server, k.intruder);
    s_client_say(intruder, NET_MSG_HELLO);
    net_peer_t peer;
    net_msg_t *in = NULL;
    ck_assert_int_eq(s_server_wait(server, 500, &peer, &in, err, sizeof err), -ETIMEDOUT);
    // the intruder joins the list, the node leaves it
    snprintf(text, sizeof text, "%s\n", net_key_public(k.intruder));
    s_write(path, text, 0644);
    ck_assert_msg(net_allow_reload(k.allow, path, err, sizeof err) == 0, "%s", err);
    // libzmq does not retry after a refused handshake: the client asks for a new link
    ck_assert_int_eq(net_client_reconnect(intruder), 0);
    int rc = -ETIMEDOUT;
    for (int i = 0; i < 30 && rc == -ETIMEDOUT; i++) {
        net_msg_t *m = net_msg_new(NET_MSG_HEARTBEAT);
        int sent = net_client_send(intruder, &m); // -EAGAIN while it has no link
        ck_assert(sent == 0 || sent == -EAGAIN);
        rc = s_server_wait(server, 200, &peer, &in, err, sizeof err);
    }
    ck_assert_msg(rc == 0, "the newly allowed key got nothing through: %d %s", rc, err);
    ck_assert_str_eq(peer.key, net_key_public(k.intruder));
    net_msg_destroy(&in);
    // a node admitted, then dropped by a reload: refused from then on
    snprintf(text, sizeof text, "%s\n", net_key_public(k.node));
    s_write(path, text, 0644);
    ck_assert_msg(net_allow_reload(k.allow, path, err, sizeof err) == 0, "%s", err);
    net_client_t *node = s_client(server, k.server, k.node);
    s_client_say(node, NET_MSG_HELLO);
    ck_assert_int_eq(s_server_wait(server, 2000, &peer, &in, err, sizeof err), 0);
    net_msg_destroy(&in);
    s_write(path, "# nobody\n", 0644);
    ck_assert_msg(net_allow_reload(k.allow, path, err, sizeof err) == 0, "%s", err);
    s_client_say(node, NET_MSG_HEARTBEAT);
    rc = s_server_wait(server, 1000, &peer, &in, err, sizeof err);
    ck_assert_int_eq(rc, -EPROTO);
    ck_assert_msg(strstr(err, "no longer on the allow-list"), "%s", err);
    ck_assert_str_eq(peer.key, net_key_public(k.node));
    net_stats_t st;
    net_server_stats(server, &st);
    ck_assert_uint_ge(st.revoked, 1);
    ck_assert_uint_ge(st.auth_denied, 1);
    net_client_destroy(&intruder);
    net_client_destroy(&node);
    net_server_destroy(&server);
    s_tmp_close(&t);
    s_keys_close(&k);
}
END_TEST

START_TEST(test_transport_client_without_curve_gets_nothing)
{
    s_keys_t k;
    s_keys_open(&k);
    net_server_t *server = s_server(&k, NULL, &s_limits); // open mode: any Curve key
    void *ctx;
    void *plain = s_raw_dealer(&ctx);
    ck_assert_int_eq(zmq_connect(plain, net_server_endpoint(server)), 0);
    s_raw_send_base(plain);
    net_peer_t peer;
    net_msg_t *in = NULL;
    char err[256] = "";
    ck_assert_int_eq(s_server_wait(server, 800, &peer, &in, err, sizeof err), -ETIMEDOUT);
    net_stats_t st;
    net_server_stats(server, &st);
    ck_assert_uint_eq(st.msgs_in + st.bad, 0);
    zmq_close(plain);
    zmq_ctx_term(ctx);
    net_server_destroy(&server);
    s_keys_close(&k);
}
END_TEST

START_TEST(test_transport_open_mode_admits_any_key)
{
    s_keys_t k;
    s_keys_open(&k);
    net_server_t *server = s_server(&k, NULL, &s_limits);
    net_client_t *client = s_client(server, k.server, k.intruder);
    s_client_say(client, NET_MSG_STATUS);
    net_peer_t peer;
    net_msg_t *in = NULL;
    char err[256] = "";
    ck_assert_int_eq(s_server_wait(server, 3000, &peer, &in, err, sizeof err), 0);
    ck_assert_str_eq(peer.key, net_key_public(k.intruder));
    net_msg_destroy(&in);
    // nobody by that key: an error now, not a block
    net_peer_t nobody = { .conn = "" };
    memcpy(nobody.key, net_key_public(k.node), sizeof nobody.key);
    net_msg_t *m = net_msg_new(NET_MSG_BYE);
    int64_t t0 = net_clock_ms();
    ck_assert_int_eq(net_server_send(server, &nobody, &m), -EHOSTUNREACH);
    ck_assert_int_le(net_clock_ms() - t0, 100);
    net_client_destroy(&client);
    net_server_destroy(&server);
    s_keys_close(&k);
}
END_TEST

// The liveness table grows with the peers (16 slots to start with) and
// holds every one it was given room for: 40 clients, each heard once, are
// each found silent once, by a dead_ms set after the server was made.
START_TEST(test_transport_tracks_peers_past_its_first_table)
{
    enum { N = 40 };
    s_keys_t k;
    s_keys_open(&k);
    net_server_t *server = s_server(&k, NULL, &s_limits);
    net_key_t *keys[N];
    net_client_t *clients[N];
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(net_key_generate(&keys[i]), 0);
        clients[i] = s_client(server, k.server, keys[i]);
        s_client_say(clients[i], NET_MSG_HEARTBEAT);
    }
    int heard[N] = { 0 }, got = 0;
    int64_t until = net_clock_ms() + 10000;
    while (got < N && net_clock_ms() < until) {
        net_peer_t peer;
        net_msg_t *in = NULL;
        char err[256] = "";
        if (s_server_wait(server, 100, &peer, &in, err, sizeof err) != 0)
            continue;
        net_msg_destroy(&in);
        for (int i = 0; i < N; i++)
            if (!heard[i] && !strcmp(peer.key, net_key_public(keys[i])))
                heard[i] = 1, got++;
    }
    ck_assert_int_eq(got, N);
    int64_t last = net_clock_ms();
    net_peer_t dead[N + 1];
    size_t n = 0;
    net_server_set_dead_ms(server, 60000);
    net_server_reap(server, last + 30000, dead, N + 1, &n);
    ck_assert_uint_eq(n, 0); // within the new dead_ms, not the first one's 400
    net_server_reap(server, last + 70000, dead, N + 1, &n);
    ck_assert_uint_eq(n, N);
    for (int i = 0; i < N; i++) {
        int found = 0;
        for (size_t j = 0; j < n; j++)
            found += !strcmp(dead[j].key, net_key_public(keys[i]));
        ck_assert_msg(found == 1, "client %d found silent %d times", i, found);
    }
    net_server_reap(server, last + 70000, dead, N + 1, &n);
    ck_assert_uint_eq(n, 0); // forgotten
    for (int i = 0; i < N; i++) {
        net_client_destroy(&clients[i]);
        net_key_destroy(&keys[i]);
    }
    net_server_destroy(&server);
    s_keys_close(&k);
}
END_TEST

// A Curve client that claims another key as its routing id is dropped: the
// identity is the ZAP User-Id, never the routing id.
START_TEST(test_transport_identity_is_the_curve_key)
{
    s_keys_t k;
    s_keys_open(&k);
    net_server_t *server = s_server(&k, NULL, &s_limits);
    void *ctx;
    void *liar = s_raw_dealer(&ctx);
    zmq_setsockopt(liar, ZMQ_CURVE_SERVERKEY, net_key_public_raw(k.server), 32);
    zmq_setsockopt(liar, ZMQ_CURVE_PUBLICKEY, net_key_public_raw(k.intruder), 32);
    zmq_setsockopt(liar, ZMQ_CURVE_SECRETKEY, net_key_secret_raw(k.intruder), 32);
    zmq_setsockopt(liar, ZMQ_ROUTING_ID, net_key_public(k.node), NET_KEY_Z85_LEN);
    ck_assert_int_eq(zmq_connect(liar, net_server_endpoint(server)), 0);
    s_raw_send_base(liar);
    net_peer_t peer;
    net_msg_t *in = NULL;
    char err[256] = "";
    ck_assert_int_eq(s_server_wait(server, 3000, &peer, &in, err, sizeof err), -EPROTO);
    ck_assert_msg(strstr(err, "routing id is not its key"), "%s", err);
    ck_assert_str_eq(peer.key, net_key_public(k.intruder));
    ck_assert_ptr_null(in);
    net_stats_t st;
    net_server_stats(server, &st);
    ck_assert_uint_eq(st.bad, 1);
    zmq_close(liar);
    zmq_ctx_term(ctx);
    net_server_destroy(&server);
    s_keys_close(&k);
}
END_TEST

// A frame over MAXMSGSIZE drops the link (libzmq), one within it but over
// the limits is refused by the decoder; then the client reconnects.
START_TEST(test_transport_limits_bound_what_arrives)
{
    s_keys_t k;
    s_keys_open(&k);
    net_limits_t small = s_limits;
    small.max_payload = 4096;
    net_server_t *server = s_server(&k, k.allow, &small);
    net_client_t *client = s_client(server, k.server, k.node);
    static float x[4096];
    uint32_t fit[1] = {1024}, over[1] = {1025}, huge[1] = {4096};
    net_peer_t peer;
    net_msg_t *in = NULL, *m;
    char err[256] = "";
    const uint32_t *dims[3] = {fit, over, huge};
    int want[3] = {0, -EPROTO, -ETIMEDOUT};
    for (int i = 0; i < 3; i++) {
        m = net_msg_new(NET_MSG_GRAD);
        ck_assert_int_eq(net_msg_add_tensor(m, NET_DTYPE_F32, dims[i], 1, x), 0);
        ck_assert_int_eq(net_client_send(client, &m), 0);
        int rc = s_server_wait(server, 1500, &peer, &in, err, sizeof err);
        ck_assert_msg(rc == want[i], "case %d: rc %d (%s)", i, rc, err);
        net_msg_destroy(&in);
    }
    ck_assert_msg(strstr(err, "payload over the limit"), "%s", err);
    s_client_say(client, NET_MSG_HEARTBEAT); // after the reconnect
    ck_assert_int_eq(s_server_wait(server, 3000, &peer, &in, err, sizeof err), 0);
    ck_assert_uint_eq(net_msg_head(in)->type, NET_MSG_HEARTBEAT);
    net_msg_destroy(&in);
    net_client_destroy(&client);
    net_server_destroy(&server);
    s_keys_close(&k);
}
END_TEST

// A node that restarts with the same key takes its routing slot back.
START_TEST(test_transport_reconnect_takes_over)
{
    s_keys_t k;
    s_keys_open(&k);
    net_server_t *server = s_server(&k, k.allow, &s_limits);
    net_peer_t peer;
    net_msg_t *in = NULL, *got = NULL;
    char err[256] = "";
    for (int life = 0; life < 2; life++) {
        net_client_t *client = s_client(server, k.server, k.node);
        s_client_say(client, NET_MSG_HELLO);
        ck_assert_int_eq(s_server_wait(server, 3000, &peer, &in, err, sizeof err), 0);
        net_msg_t *reply = net_msg_reply(in, NET_MSG_ASSIGN);
        ck_assert_int_eq(net_server_send(server, &peer, &reply), 0);
        ck_assert_int_eq(net_client_recv(client, net_clock_ms() + 3000, &got, err, sizeof err), 0);
        net_msg_destroy(&in);
        net_msg_destroy(&got);
        net_client_destroy(&client);
    }
    net_server_destroy(&server);
    s_keys_close(&k);
}
END_TEST

// Two processes with one key are two connections, each with a routing id
// of its own (KEY/INSTANCE): the server tells them apart and answers each
// one alone, and neither takes the other's link over.
START_TEST(test_transport_one_key_two_connections)
{
    s_keys_t k;
    s_keys_open(&k);
    net_server_t *server = s_server(&k, k.allow, &s_limits);
    net_client_t *client[2] = { s_client(server, k.server, k.node),
                                s_client(server, k.server, k.node) };
    net_peer_t peer[2];
    net_msg_t *in = NULL, *got = NULL;
    char err[256] = "";
    for (int i = 0; i < 2; i++) {
        s_client_say(client[i], NET_MSG_HELLO);
        ck_assert_int_eq(s_server_wait(server, 3000, &peer[i], &in, err, sizeof err), 0);
        ck_assert_str_eq(peer[i].key, net_key_public(k.node));
        ck_assert_uint_eq(strlen(peer[i].conn), NET_KEY_Z85_LEN + 17);
        ck_assert_int_eq(strncmp(peer[i].conn, peer[i].key, NET_KEY_Z85_LEN), 0);
        net_msg_destroy(&in);
    }
    ck_assert_str_ne(peer[0].conn, peer[1].conn);
    for (int i = 1; i >= 0; i--) { // each answer reaches its own connection only
        net_msg_t *m = net_msg_new(NET_MSG_ASSIGN);
        ck_assert_int_eq(net_msg_set_meta(m, i ? "to=1" : "to=0"), 0);
        ck_assert_int_eq(net_server_send(server, &peer[i], &m), 0);
        ck_assert_int_eq(net_client_recv(client[i], net_clock_ms() + 3000, &got, err, sizeof err), 0);
        char to[8] = "";
        ck_assert_int_eq(net_msg_meta_get(got, "to", to, sizeof to), 0);
        ck_assert_int_eq(atoi(to), i);
        net_msg_destroy(&got);
        ck_assert_int_eq(net_client_recv(client[!i], net_clock_ms() + 200, &got, err, sizeof err),
                         -ETIMEDOUT);
    }
    for (int i = 0; i < 2; i++)
        net_client_destroy(&client[i]);
    net_server_destroy(&server);
    s_keys_close(&k);
}
END_TEST

// The child: a node that sends a heartbeat every 50 ms, forever.
static void s_heartbeat_child(int fd, const s_keys_t *k)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL); // never outlive the test
    char endpoint[256] = "";
    ssize_t got = read(fd, endpoint, sizeof endpoint - 1);
    if (got <= 0)
        _exit(1);
    endpoint[got] = '\0';
    net_client_config_t c = {.endpoint = endpoint, .server = k->server, .key = k->node,
                             .limits = s_limits, .timing = s_fast};
    net_client_t *client = NULL;
    char err[256];
    if (net_client_new(&c, &client, err, sizeof err) != 0)
        _exit(1);
    for (;;) {
        net_msg_t *m = net_msg_new(NET_MSG_HEARTBEAT), *in = NULL;
        if (net_client_send(client, &m) == -EINVAL)
            _exit(1); // a full queue is fine: the router reads when it can
        if (net_client_recv(client, net_clock_ms() + 50, &in, err, sizeof err) == 0)
            net_msg_destroy(&in);
    }
}

START_TEST(test_transport_sigstopped_peer_declared_dead)
{
    s_keys_t k;
    s_keys_open(&k);
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork(); // before any zmq context exists in this process
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        s_heartbeat_child(fds[0], &k);
    net_server_t *server = s_server(&k, k.allow, &s_limits);
    const char *endpoint = net_server_endpoint(server);
    ck_assert_int_eq(write(fds[1], endpoint, strlen(endpoint)), (ssize_t) strlen(endpoint));
    net_peer_t peer, dead[4];
    net_msg_t *in = NULL;
    char err[256] = "";
    ck_assert_int_eq(s_server_wait(server, 5000, &peer, &in, err, sizeof err), 0);
    net_msg_destroy(&in);
    size_t n = 0;
    net_server_reap(server, net_clock_ms(), dead, 4, &n);
    ck_assert_uint_eq(n, 0); // alive and talking
    ck_assert_int_eq(kill(pid, SIGSTOP), 0);
    int64_t stopped = net_clock_ms(), declared = 0;
    while (!declared && net_clock_ms() - stopped < 5000) {
        if (s_server_wait(server, 10, &peer, &in, err, sizeof err) == 0)
            net_msg_destroy(&in);
        net_server_reap(server, net_clock_ms(), dead, 4, &n);
        if (n == 1)
            declared = net_clock_ms();
    }
    kill(pid, SIGKILL);
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(declared, "the stopped peer was never declared dead");
    ck_assert_str_eq(dead[0].key, net_key_public(k.node));
    // dead_ms after its last heartbeat (<= 50 ms before the stop), plus the
    // 10 ms polling here and some scheduling slack
    int64_t took = declared - stopped;
    ck_assert_msg(took <= s_fast.dead_ms + 150, "declared dead after %lld ms, dead_ms %d",
                  (long long) took, s_fast.dead_ms);
    ck_assert_msg(took >= s_fast.dead_ms - 100, "declared dead too early: %lld ms",
                  (long long) took);
    close(fds[0]);
    close(fds[1]);
    net_server_destroy(&server);
    s_keys_close(&k);
}
END_TEST

typedef struct {
    net_server_t *server;            // borrowed: only this thread uses it meanwhile
    int ok;                          // 1 when every step went as planned
    char why[256];                   // else what went wrong
} s_flaky_t;

// Ignore the first try of a request, then answer the resend after a stale
// reply and an unsolicited message.
static void *s_flaky_run(void *arg)
{
    s_flaky_t *f = arg;
    net_peer_t peer;
    net_msg_t *first = NULL, *again = NULL;
    int rc = s_server_wait(f->server, 3000, &peer, &first, f->why, sizeof f->why);
    if (rc == 0)
        rc = s_server_wait(f->server, 3000, &peer, &again, f->why, sizeof f->why);
    if (rc != 0 || net_msg_head(first)->id != net_msg_head(again)->id) {
        snprintf(f->why + strlen(f->why), 64, " (rc %d: no resend with the same id)", rc);
        goto out;
    }
    net_msg_t *stale = net_msg_reply(again, NET_MSG_RESULT);
    net_msg_head(stale)->id -= 1;
    net_msg_t *push = net_msg_new(NET_MSG_STEP);
    net_msg_t *reply = net_msg_reply(again, NET_MSG_RESULT);
    f->ok = net_server_send(f->server, &peer, &stale) == 0 &&
            net_server_send(f->server, &peer, &push) == 0 &&
            net_server_send(f->server, &peer, &reply) == 0;
out:
    net_msg_destroy(&first);
    net_msg_destroy(&again);
    return NULL;
}

START_TEST(test_transport_request_resends_and_drops_stale)
{
    s_keys_t k;
    s_keys_open(&k);
    s_flaky_t f = {.server = s_server(&k, k.allow, &s_limits)};
    net_client_t *client = s_client(f.server, k.server, k.node);
    pthread_t thread;
    ck_assert_int_eq(pthread_create(&thread, NULL, s_flaky_run, &f), 0);
    net_msg_t *req = net_msg_new(NET_MSG_STATE_GET), *reply = NULL, *pushed = NULL;
    net_retry_t retry = {.timeout_ms = 400, .tries = 3};
    char err[256] = "";
    int rc = net_client_request(client, &req, &retry, &reply, err, sizeof err);
    pthread_join(thread, NULL);
    ck_assert_msg(f.ok, "server side: %s", f.why);
    ck_assert_msg(rc == 0, "%d: %s", rc, err);
    ck_assert_ptr_null(req);
    ck_assert_uint_eq(net_msg_head(reply)->type, NET_MSG_RESULT);
    net_stats_t st;
    net_client_stats(client, &st);
    ck_assert_uint_eq(st.stale, 1);
    ck_assert_uint_eq(st.msgs_out, 2);
    // the unsolicited STEP waited for us
    ck_assert_int_eq(net_client_recv(client, net_clock_ms(), &pushed, err, sizeof err), 0);
    ck_assert_uint_eq(net_msg_head(pushed)->type, NET_MSG_STEP);
    net_msg_destroy(&reply);
    net_msg_destroy(&pushed);
    // nobody answers now: the helper gives up after tries x timeout
    req = net_msg_new(NET_MSG_STATE_GET);
    retry = (net_retry_t) {.timeout_ms = 100, .tries = 2};
    int64_t t0 = net_clock_ms();
    ck_assert_int_eq(net_client_request(client, &req, &retry, &reply, err, sizeof err),
                     -ETIMEDOUT);
    int64_t took = net_clock_ms() - t0;
    ck_assert_msg(took >= 200 && took < 1000, "gave up after %lld ms", (long long) took);
    ck_assert_msg(strstr(err, "no reply after 2 tries"), "%s", err);
    net_client_destroy(&client);
    net_server_destroy(&f.server);
    s_keys_close(&k);
}
END_TEST

// Nobody listens: the queue fills and a send says so at once.
START_TEST(test_transport_full_queue_is_eagain)
{
    s_keys_t k;
    s_keys_open(&k);
    net_client_config_t c = {.endpoint = "tcp://127.0.0.1:1", .server = k.server, .key = k.node,
                             .limits = s_limits, .timing = {.hwm = 4}};
    net_client_t *client = NULL;
    char err[256] = "";
    ck_assert_msg(net_client_new(&c, &client, err, sizeof err) == 0, "%s", err);
    int64_t t0 = net_clock_ms();
    int rc = 0, sent = 0;
    while (rc == 0 && sent < 1000) {
        net_msg_t *m = net_msg_new(NET_MSG_HEARTBEAT);
        rc = net_client_send(client, &m);
        sent += rc == 0;
    }
    ck_assert_int_eq(rc, -EAGAIN);
    ck_assert_int_le(sent, 16);
    ck_assert_int_le(net_clock_ms() - t0, 200);
    net_client_destroy(&client);
    s_keys_close(&k);
}
END_TEST

START_TEST(test_transport_refuses_bad_config)
{
    s_keys_t k;
    s_keys_open(&k);
    net_key_t *pub = NULL;
    ck_assert_int_eq(net_key_from_z85(net_key_public(k.server), &pub), 0);
    net_server_config_t c = {.endpoint = "tcp://127.0.0.1:*", .key = pub, .limits = s_limits};
    net_server_t *server = NULL;
    char err[256] = "";
    ck_assert_int_eq(net_server_new(&c, &server, err, sizeof err), -EINVAL); // no secret
    c.key = k.server;
    c.limits.max_dims = NET_DIMS_MAX + 1;
    ck_assert_int_eq(net_server_new(&c, &server, err, sizeof err), -EINVAL);
    ck_assert_msg(strstr(err, "max_dims"), "%s", err);
    c.limits = s_limits;
    c.endpoint = "tcp://256.0.0.1:1";
    ck_assert_int_lt(net_server_new(&c, &server, err, sizeof err), 0);
    ck_assert_msg(strstr(err, "tcp://256.0.0.1:1"), "%s", err);
    ck_assert_ptr_null(server);
    ck_assert(zmq_has("curve")); // this build can run at all
    net_key_destroy(&pub);
    s_keys_close(&k);
}
END_TEST

// ---- the fuzz target's seed corpus ---------------------------------------------

typedef struct {
    char name[64];                   // file name: ok-... or bad-...
    uint8_t bytes[8192];             // fuzz input
    size_t len;                      // bytes used
} s_seed_t;

// Seeds: one valid message of every type, then every malformed case.
static int s_seed(int i, s_seed_t *seed)
{
    if (i < NET_MSG_TYPE_MAX) {
        net_msg_t *m = s_sample_msg(i + 1);
        const net_head_t *h = net_msg_head_const(m);
        uint8_t head[NET_WIRE_HEAD_MAX];
        net_span_t frames[NET_WIRE_FRAMES_MAX];
        size_t n = 0;
        frames[n++] = (net_span_t) {head, net_wire_head_encode(h, head, sizeof head)};
        for (int t = 0; t < h->ntensors; t++) {
            size_t bytes = 0;
            const void *data = net_msg_raw(m, t, &bytes);
            frames[n++] = (net_span_t) {data, bytes};
        }
        size_t meta_len = 0;
        const char *meta = net_msg_meta(m, &meta_len);
        if (meta)
            frames[n++] = (net_span_t) {(const uint8_t *) meta, meta_len};
        snprintf(seed->name, sizeof seed->name, "ok-%s", net_msg_type_name(i + 1));
        // the strict limits admit no sample tensor: control messages only
        int strict = h->ntensors == 0 && i % 2;
        seed->len = fuzz_wire_pack(frames, n, strict, seed->bytes, sizeof seed->bytes);
        net_msg_destroy(&m);
        return 1;
    }
    i -= NET_MSG_TYPE_MAX;
    if (i >= N_BAD)
        return 0;
    snprintf(seed->name, sizeof seed->name, "bad-%s", s_bad[i].name);
    seed->len = s_bad_pack(i, seed->bytes, sizeof seed->bytes);
    return 1;
}

START_TEST(test_fuzz_seed_corpus_is_current)
{
    const char *dir = s_corpus_dir();
    int write_it = getenv("SWARM_WRITE_CORPUS") != NULL;
    static s_seed_t seed;
    static uint8_t file[8192];
    char path[512];
    s_rng = 1; // the samples must come out the same every run
    for (int i = 0; s_seed(i, &seed); i++) {
        ck_assert_uint_gt(seed.len, 0);
        snprintf(path, sizeof path, "%s/%s", dir, seed.name);
        if (write_it) {
            s_write(path, "", 0644);
            FILE *f = fopen(path, "wb");
            ck_assert_ptr_nonnull(f);
            ck_assert_uint_eq(fwrite(seed.bytes, 1, seed.len, f), seed.len);
            fclose(f);
            continue;
        }
        FILE *f = fopen(path, "rb");
        ck_assert_msg(f, "%s missing: run from the repository root, or rewrite the corpus "
                         "with SWARM_WRITE_CORPUS=1 build/check_net", path);
        size_t got = fread(file, 1, sizeof file, f);
        fclose(f);
        ck_assert_msg(got == seed.len && memcmp(file, seed.bytes, got) == 0,
                      "%s differs from what the encoder writes today: after a deliberate wire "
                      "change, rewrite with SWARM_WRITE_CORPUS=1 build/check_net", path);
    }
}
END_TEST

START_TEST(test_fuzz_seed_corpus_replays)
{
    const char *dir = s_corpus_dir();
    DIR *d = opendir(dir);
    ck_assert_msg(d, "%s: %s (run from the repository root)", dir, strerror(errno));
    static uint8_t buf[1 << 20];
    char path[512], err[256];
    int files = 0, ok = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "rb");
        ck_assert_ptr_nonnull(f);
        size_t len = fread(buf, 1, sizeof buf, f);
        fclose(f);
        int rc = fuzz_wire_decode(buf, len, err, sizeof err); // aborts on a broken promise
        if (strncmp(e->d_name, "ok-", 3) == 0)
            ck_assert_msg(rc == 0, "%s refused: %s", e->d_name, err);
        if (strncmp(e->d_name, "bad-", 4) == 0)
            ck_assert_msg(rc == -EPROTO, "%s accepted", e->d_name);
        ok += rc == 0;
        files++;
    }
    closedir(d);
    ck_assert_int_ge(files, NET_MSG_TYPE_MAX + N_BAD);
    ck_assert_int_ge(ok, NET_MSG_TYPE_MAX);
}
END_TEST

// ---- the other net fuzz targets' seed corpora (tests/fuzz_keys.c, fuzz_meta.c) ----

static const fuzz_target_t s_fuzz_targets[] = {
    {"keys", fuzz_keys_one, fuzz_keys_seed},
    {"meta", fuzz_meta_one, fuzz_meta_seed},
};
FUZZ_CORPUS_TESTS

// ---- runner ----------------------------------------------------------------------

static Suite *s_suite(void)
{
    Suite *s = suite_create("net");
    TCase *tc = tcase_create("wire");
    tcase_add_test(tc, test_wire_accepts_the_base_message);
    tcase_add_loop_test(tc, test_wire_rejects_malformed, 0, N_BAD);
    tcase_add_test(tc, test_wire_rejects_every_truncation);
    suite_add_tcase(s, tc);
    tc = tcase_create("msg");
    tcase_add_test(tc, test_msg_round_trips_every_type);
    tcase_add_test(tc, test_msg_tensors_decode_to_what_was_sent);
    tcase_add_test(tc, test_msg_builders_refuse_bad_input);
    tcase_add_test(tc, test_msg_shared_tensor_outlives_its_source);
    tcase_add_test(tc, test_msg_meta_lookup);
    tcase_add_test(tc, test_msg_reply_keeps_ids);
    tcase_add_test(tc, test_msg_recv_rejects_raw_frames);
    suite_add_tcase(s, tc);
    tc = tcase_create("codec");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_codec_sizes);
    tcase_add_test(tc, test_codec_fp32_is_exact);
    tcase_add_test(tc, test_codec_fp16_every_half_round_trips);
    tcase_add_test(tc, test_codec_fp16_rounds_to_nearest_even);
    tcase_add_test(tc, test_codec_fp16_error_bound);
    tcase_add_test(tc, test_codec_int8_error_bound);
    tcase_add_test(tc, test_codec_int8_bound_holds_at_midpoints);
    tcase_add_test(tc, test_codec_encoders_refuse_non_finite);
    tcase_add_test(tc, test_codec_f32_decode_refuses_non_finite_anywhere);
    suite_add_tcase(s, tc);
    tc = tcase_create("key");
    tcase_add_test(tc, test_key_files_round_trip);
    tcase_add_test(tc, test_key_load_refuses_bad_files);
    tcase_add_test(tc, test_key_allow_list);
    tcase_add_test(tc, test_key_allow_reload_swaps_or_keeps);
    tcase_add_test(tc, test_key_allow_list_holds_many_keys);
    suite_add_tcase(s, tc);
    tc = tcase_create("transport");
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, test_transport_allowed_key_talks);
    tcase_add_test(tc, test_transport_wrong_key_gets_nothing);
    tcase_add_test(tc, test_transport_allow_reload_admits_and_revokes);
    tcase_add_test(tc, test_transport_client_without_curve_gets_nothing);
    tcase_add_test(tc, test_transport_open_mode_admits_any_key);
    tcase_add_test(tc, test_transport_tracks_peers_past_its_first_table);
    tcase_add_test(tc, test_transport_identity_is_the_curve_key);
    tcase_add_test(tc, test_transport_limits_bound_what_arrives);
    tcase_add_test(tc, test_transport_reconnect_takes_over);
    tcase_add_test(tc, test_transport_one_key_two_connections);
    tcase_add_test(tc, test_transport_sigstopped_peer_declared_dead);
    tcase_add_test(tc, test_transport_request_resends_and_drops_stale);
    tcase_add_test(tc, test_transport_full_queue_is_eagain);
    tcase_add_test(tc, test_transport_refuses_bad_config);
    suite_add_tcase(s, tc);
    tc = tcase_create("fuzz");
    tcase_add_test(tc, test_fuzz_seed_corpus_is_current);
    tcase_add_test(tc, test_fuzz_seed_corpus_replays);
    tcase_add_loop_test(tc, test_fuzz_target_seeds_are_current, 0, N_FUZZ_TARGETS);
    tcase_add_loop_test(tc, test_fuzz_target_corpus_replays, 0, N_FUZZ_TARGETS);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *runner = srunner_create(s_suite());
    srunner_run_all(runner, CK_ENV); // CK_VERBOSITY=verbose lists every test
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
