/* worker_read.c - the worker's reading of a request (worker_int.h): each
 * meta field and tensor checked against the assignment (count, dtype,
 * shape, values) before it is used, with a reason naming what is wrong;
 * and the activations it sends back, as the assignment's wire format says
 * (or as a liar sends them).
 */
#include "worker_int.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- reading requests ------------------------------------------------------

int worker_meta_long(const net_msg_t *msg, const char *key, long lo, long hi, long *out,
                       char *err, size_t n)
{
    char text[64], *end;
    int rc = net_msg_meta_get(msg, key, text, sizeof text);
    if (rc != 0) {
        snprintf(err, n, "meta %s: %s", key, rc == -ENOENT ? "missing" : "value too long");
        return -EPROTO;
    }
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > hi) {
        snprintf(err, n, "meta %s=%s: expected a whole number in %ld..%ld", key, text, lo, hi);
        return -EPROTO;
    }
    *out = v;
    return 0;
}

// A number written with %a (or plainly), finite, in lo..hi.
int worker_meta_double(const net_msg_t *msg, const char *key, double lo, double hi,
                         double *out, char *err, size_t n)
{
    char text[64], *end;
    int rc = net_msg_meta_get(msg, key, text, sizeof text);
    if (rc != 0) {
        snprintf(err, n, "meta %s: %s", key, rc == -ENOENT ? "missing" : "value too long");
        return rc == -ENOENT ? -ENOENT : -EPROTO;
    }
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !isfinite(v) || v < lo || v > hi) {
        snprintf(err, n, "meta %s=%s: expected a number in %g..%g", key, text, lo, hi);
        return -EPROTO;
    }
    *out = v;
    return 0;
}

static void s_dims_text(const uint32_t *dims, int ndims, char *out, size_t cap)
{
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < ndims && used < cap; i++)
        used += (size_t) snprintf(out + used, cap - used, i ? "x%u" : "%u", dims[i]);
}

int worker_count_check(const net_msg_t *req, int want, char *err, size_t n)
{
    int have = net_msg_head_const(req)->ntensors;
    if (have == want)
        return 0;
    snprintf(err, n, "%d tensors, expected %d", have, want);
    return -EPROTO;
}

enum { KIND_I32, KIND_FLOAT, KIND_F32 }; // raw int32; any float codec; exact float32

// Tensor i of req has the dtype kind and exactly dims.
static int s_tensor_check(const net_msg_t *req, int i, int kind, const uint32_t *dims, int ndims,
                          const char *what, char *err, size_t n)
{
    const net_shape_t *t = &net_msg_head_const(req)->tensors[i];
    int ok = kind == KIND_I32 ? t->dtype == NET_DTYPE_I32
           : kind == KIND_F32 ? t->dtype == NET_DTYPE_F32
           : t->dtype == NET_DTYPE_F32 || t->dtype == NET_DTYPE_F16 || t->dtype == NET_DTYPE_I8;
    if (!ok) {
        snprintf(err, n, "tensor %d (%s): dtype %d, expected %s", i, what, t->dtype,
                 kind == KIND_I32 ? "i32" : kind == KIND_F32 ? "f32" : "f32, f16 or i8");
        return -EPROTO;
    }
    ok = t->ndims == ndims;
    for (int k = 0; k < ndims && ok; k++)
        ok = t->dims[k] == dims[k];
    if (!ok) {
        char have[64], want[64];
        s_dims_text(t->dims, t->ndims, have, sizeof have);
        s_dims_text(dims, ndims, want, sizeof want);
        snprintf(err, n, "tensor %d (%s): dims %s, expected %s", i, what, have, want);
        return -EPROTO;
    }
    return 0;
}

// Tokens or targets: i32 (micro, T), each a byte value.
int worker_tokens_get(node_worker_t *w, const net_msg_t *req, int i, int32_t *dst, const char *what,
                        char *err, size_t n)
{
    uint32_t dims[2] = { (uint32_t) w->as.micro, (uint32_t) w->as.cfg.T };
    size_t count = (size_t) dims[0] * dims[1], bytes = 0;
    int rc = s_tensor_check(req, i, KIND_I32, dims, 2, what, err, n);
    const uint8_t *raw = rc == 0 ? net_msg_raw(req, i, &bytes) : NULL;
    if (rc == 0 && (!raw || bytes != count * 4)) {
        snprintf(err, n, "tensor %d (%s): %zu bytes, expected %zu", i, what, bytes, count * 4);
        rc = -EPROTO;
    }
    for (size_t k = 0; k < count && rc == 0; k++) {
        const uint8_t *b = raw + 4 * k; // little-endian on the wire, unaligned
        dst[k] = (int32_t) ((uint32_t) b[0] | (uint32_t) b[1] << 8 | (uint32_t) b[2] << 16
                            | (uint32_t) b[3] << 24);
        if (dst[k] < 0 || dst[k] >= w->as.cfg.V) {
            snprintf(err, n, "tensor %d (%s): value %d at %zu is outside 0..%d", i, what, dst[k],
                     k, w->as.cfg.V - 1);
            rc = -EPROTO;
        }
    }
    return rc;
}

// Activations: floats (micro, T, C).
int worker_acts_get(node_worker_t *w, const net_msg_t *req, int i, float *dst, const char *what,
                      char *err, size_t n)
{
    uint32_t dims[3] = { (uint32_t) w->as.micro, (uint32_t) w->as.cfg.T, (uint32_t) w->as.cfg.C };
    int rc = s_tensor_check(req, i, KIND_FLOAT, dims, 3, what, err, n);
    if (rc == 0 && (rc = net_tensor_get(req, i, dst, (size_t) dims[0] * dims[1] * dims[2])) != 0)
        snprintf(err, n, "tensor %d (%s): cannot decode (%s)", i, what, strerror(-rc));
    return rc;
}

// A stage-sized vector: f32 [n], exact.
int worker_vector_get(node_worker_t *w, const net_msg_t *req, int i, float *dst, const char *what,
                        char *err, size_t n)
{
    size_t count = node_stage_param_count(w->stage);
    uint32_t dims[1] = { count > UINT32_MAX ? 0 : (uint32_t) count };
    int rc = s_tensor_check(req, i, KIND_F32, dims, 1, what, err, n);
    if (rc == 0 && (rc = net_msg_tensor(req, i, dst, count)) != 0)
        snprintf(err, n, "tensor %d (%s): cannot decode (%s)", i, what, strerror(-rc));
    return rc;
}

// A stage-sized gradient sum: f32 [n], or the fp16/int8 of --grad-wire.
int worker_grad_get(node_worker_t *w, const net_msg_t *req, int i, float *dst, char *err, size_t n)
{
    size_t count = node_stage_param_count(w->stage);
    uint32_t dims[1] = { count > UINT32_MAX ? 0 : (uint32_t) count };
    int rc = s_tensor_check(req, i, KIND_FLOAT, dims, 1, "gradient", err, n);
    if (rc == 0 && (rc = net_tensor_get(req, i, dst, count)) != 0)
        snprintf(err, n, "tensor %d (gradient): cannot decode (%s)", i, strerror(-rc));
    return rc;
}

// The stage input: tokens on stage 0, else x; tensor 0.
int worker_input_get(node_worker_t *w, const net_msg_t *req, char *err, size_t n)
{
    if (node_stage_is_first(w->stage))
        return worker_tokens_get(w, req, 0, w->tokens, "tokens", err, n);
    return worker_acts_get(w, req, 0, w->x, "x", err, n);
}

// A request for the stage we hold.
int worker_check_stage(const node_worker_t *w, const net_msg_t *req, char *err, size_t n)
{
    const net_head_t *h = net_msg_head_const(req);
    if (!w->stage)
        snprintf(err, n, "no stage assigned yet");
    else if (h->stage != (uint32_t) node_stage_index(w->stage))
        snprintf(err, n, "stage %" PRIu32 ", this node holds stage %d", h->stage,
                 node_stage_index(w->stage));
    else
        return 0;
    return -EPROTO;
}

// A request for our stage (and, need_step, our step) with a state loaded.
int worker_check_request(node_worker_t *w, const net_msg_t *req, int need_step, char *err, size_t n)
{
    const net_head_t *h = net_msg_head_const(req);
    int rc = worker_check_stage(w, req, err, n);
    if (rc != 0)
        return rc;
    rc = -EPROTO;
    if (!w->ready)
        snprintf(err, n, "stage %d has no state loaded yet (STATE first)",
                 node_stage_index(w->stage));
    else if (need_step && h->step != (uint64_t) w->step)
        snprintf(err, n, "step %" PRIu64 ", this node is at step %ld", h->step, w->step);
    else
        rc = 0;
    return rc;
}

// A lie about an activation: a NaN in it (sent raw, past the encoder's
// check), every value 1000 times too large, the right values in the wrong
// places (reversed: finite, of the right size, and wrong), an input
// gradient pointing the other way (of the same size: only an audit tells),
// or each tensor 1.5 times the size of the last lie (rmswalk).
static int s_lie_acts(node_worker_t *w, net_msg_t *msg, const float *src, const uint32_t *dims)
{
    float sign = worker_lying(w, NODE_LIE_DX) ? -1.0f : 1.0f;
    if (worker_lying(w, NODE_LIE_RMSWALK)) {
        w->lie_walk = w->lie_walk < 1.0 ? 1.5 : fmin(1.5 * w->lie_walk, 1e30); // finite
        sign = (float) w->lie_walk;
    }
    size_t count = (size_t) dims[0] * dims[1] * dims[2];
    float *lie = malloc(count * sizeof(float));
    if (!lie)
        return -ENOMEM;
    for (size_t i = 0; i < count; i++)
        lie[i] = worker_lying(w, NODE_LIE_SCALE) ? 1000.0f * src[i]
               : worker_lying(w, NODE_LIE_SHUFFLE) ? src[count - 1 - i] : sign * src[i];
    if (worker_lying(w, NODE_LIE_NAN))
        lie[count / 2] = NAN;
    int rc = net_msg_add_raw(msg, NET_DTYPE_F32, dims, 3, lie, count * sizeof(float));
    free(lie);
    return rc;
}

// Append an activation-shaped f32 tensor (micro, T, C) to msg.
int worker_acts_add(node_worker_t *w, net_msg_t *msg, const float *src, const char *what, char *err,
                      size_t n)
{
    uint32_t dims[3] = { (uint32_t) w->as.micro, (uint32_t) w->as.cfg.T, (uint32_t) w->as.cfg.C };
    if (worker_lying(w, NODE_LIE_NAN) || worker_lying(w, NODE_LIE_SCALE) || worker_lying(w, NODE_LIE_SHUFFLE)
        || worker_lying(w, NODE_LIE_RMSWALK) || (worker_lying(w, NODE_LIE_DX) && !strcmp(what, "dx")))
        return s_lie_acts(w, msg, src, dims); // as f32, which the router decodes too
    int pow2 = 0, rc = net_tensor_add(msg, w->as.wire, dims, 3, src, &pow2);
    if (rc != 0)
        snprintf(err, n, "cannot send %s: %s", what,
                 rc == -EDOM ? "it holds a NaN or infinite value" : strerror(-rc));
    else if (pow2 != 0)
        node_meta_add(msg, "pow2_%d=%d", net_msg_head(msg)->ntensors - 1, pow2);
    return rc;
}


// ---- ASSIGN ----------------------------------------------------------------


static int s_assign_wire(const net_msg_t *msg, const char *key, int *dtype, char *err, size_t n)
{
    char text[16], why[128];
    *dtype = NET_DTYPE_F32;
    int rc = net_msg_meta_get(msg, key, text, sizeof text);
    if (rc == -ENOENT)
        return 0;
    if (rc != 0 || net_dtype_parse(key, text, dtype, why, sizeof why) != 0) {
        snprintf(err, n, "meta %s: expected fp32, fp16 or int8", key);
        return -EPROTO;
    }
    return 0;
}

int worker_assign_parse(const net_msg_t *msg, assign_t *a, char *err, size_t n)
{
    static const char *const keys[8] = { "V", "T", "C", "L", "H", "S", "stage", "micro" };
    static const long lo[8] = { 1, 1, 1, 1, 1, 1, 0, 1 };
    static const long hi[8] = { NODE_VOCAB, 1 << 20, 1 << 20, NODE_MAX_LAYERS, 1024,
                                NODE_MAX_LAYERS, NODE_MAX_LAYERS - 1, 1 << 20 };
    const net_head_t *h = net_msg_head_const(msg);
    long v[8];
    int rc = 0;
    for (int i = 0; i < 8 && rc == 0; i++)
        rc = worker_meta_long(msg, keys[i], lo[i], hi[i], &v[i], err, n);
    if (rc != 0)
        return rc;
    *a = (assign_t) { .cfg = { (int) v[0], (int) v[1], (int) v[2], (int) v[3], (int) v[4] },
                             .stages = (int) v[5], .stage = (int) v[6], .micro = (int) v[7],
                             .peer = -1, .step = h->step > LONG_MAX ? -1 : (long) h->step };
    if (worker_meta_long(msg, "peer", 0, LONG_MAX, &a->peer, err, n) != 0)
        a->peer = -1; // for logs only
    rc = s_assign_wire(msg, "wire", &a->wire, err, n);
    if (rc == 0)
        rc = s_assign_wire(msg, "grad_wire", &a->grad_wire, err, n);
    if (rc != 0)
        return rc;
    char cut[NODE_PLAN_TEXT_MAX];
    rc = net_msg_meta_get(msg, "cut", cut, sizeof cut);
    a->cut = rc == 0;
    if (rc == -ENOBUFS) {
        snprintf(err, n, "meta cut: value too long");
        return -EPROTO;
    }
    rc = -EPROTO;
    if (a->stage >= a->stages)
        snprintf(err, n, "meta stage=%d, but S=%d", a->stage, a->stages);
    else if (h->stage != (uint32_t) a->stage)
        snprintf(err, n, "header stage %" PRIu32 ", meta stage=%d", h->stage, a->stage);
    else if (a->step < 0)
        snprintf(err, n, "step %" PRIu64 " is out of range", h->step);
    else if ((uint64_t) a->micro * a->cfg.T * a->cfg.C * 4 > NET_PAYLOAD_MAX / 2)
        snprintf(err, n, "micro=%d: a micro-batch of %dx%dx%d floats is too big to send",
                 a->micro, a->micro, a->cfg.T, a->cfg.C);
    else
        rc = node_config_check(&a->cfg, err, n);
    if (rc == 0 && a->cut && node_plan_parse(&a->cfg, cut, &a->plan, err, n) != 0)
        rc = -EPROTO;
    else if (rc == 0 && a->cut && a->plan.stages != a->stages) {
        snprintf(err, n, "meta cut=%.40s has %d stages, but S=%d", cut, a->plan.stages, a->stages);
        rc = -EPROTO;
    }
    return rc;
}

int worker_assign_same(const node_worker_t *w, const assign_t *a)
{
    const node_config_t *x = &w->as.cfg, *y = &a->cfg;
    return w->stage && x->V == y->V && x->T == y->T && x->C == y->C && x->L == y->L
        && x->H == y->H && w->as.stages == a->stages && w->as.stage == a->stage
        && w->as.cut == a->cut
        && (!a->cut || !memcmp(w->as.plan.first, a->plan.first,
                               (size_t) (a->stages + 1) * sizeof a->plan.first[0]))
        && w->as.micro == a->micro && w->as.wire == a->wire && w->as.grad_wire == a->grad_wire;
}
