/* worker.c - a node's work without its socket (worker.h): ASSIGN builds the
 * stage; FWD and BWD run its forward and backward through the activation
 * cache; STEP hands over the gradient sum (or only its sum of squares);
 * UPDATE and a STEP that applies its own update run AdamW; STATE and
 * STATE_GET load and read the parameters and moments. Each request is
 * checked against the assignment (stage, step, shapes, dtypes, values)
 * before any of it is used.
 */
#include "worker_int.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// ---- small things --------------------------------------------------------------

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + ts.tv_nsec * 1e-9;
}

__attribute__((format(printf, 2, 3)))
static void s_say(const node_worker_t *w, const char *fmt, ...)
{
    if (!w->c.log)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    w->c.log(w->c.ctx, line);
}

static net_msg_t *s_msg_reply(const net_msg_t *req, int type)
{
    net_msg_t *msg = net_msg_reply(req, type);
    if (!msg)
        abort(); // a bookkeeping allocation
    return msg;
}

void node_meta_set(net_msg_t *msg, const char *text)
{
    if (net_msg_set_meta(msg, text) != 0)
        abort(); // our own meta is short
}

void node_meta_add(net_msg_t *msg, const char *fmt, ...)
{
    char text[1024];
    size_t len = 0;
    const char *old = net_msg_meta(msg, &len);
    int used = old ? snprintf(text, sizeof text, "%.*s\n", (int) len, old) : 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text + used, sizeof text - (size_t) used, fmt, ap);
    va_end(ap);
    node_meta_set(msg, text);
}

net_msg_t *node_worker_error(const net_msg_t *req, const char *reason)
{
    char meta[600];
    snprintf(meta, sizeof meta, "reason=%s", reason);
    for (char *p = meta; *p; p++)
        if (*p == '\n')
            *p = ' ';
    net_msg_t *msg = s_msg_reply(req, NET_MSG_ERROR);
    node_meta_set(msg, meta);
    return msg;
}

// A RESULT carrying the parameters' checksum, hex (node_stage_checksum's:
// hashing a stage's parameters takes about a millisecond a megabyte, on the
// step's critical path, so each update hashes them once).
static net_msg_t *s_checksum_reply(const net_msg_t *req, const char hex[65])
{
    char meta[80];
    snprintf(meta, sizeof meta, "checksum=%s", hex);
    net_msg_t *msg = s_msg_reply(req, NET_MSG_RESULT);
    node_meta_set(msg, meta);
    return msg;
}

// ---- activation cache --------------------------------------------------------

static slot_t *s_slot_find(node_worker_t *w, uint64_t step, uint32_t mb)
{
    for (int i = 0; i < w->nslots; i++)
        if (w->slots[i].seq && w->slots[i].step == step && w->slots[i].mb == mb)
            return &w->slots[i];
    return NULL;
}

// Bytes the activation cache may take: --cache-mb, and within --memory
// what the stage's state and buffers leave.
static size_t s_cache_cap(const node_worker_t *w)
{
    size_t cap = (size_t) w->c.cache_mb << 20, base = w->mem.state + w->mem.buffers;
    size_t left = w->c.memory > base ? w->c.memory - base : 0;
    return w->c.memory > 0 && left < cap ? left : cap;
}

// Room for one more micro-batch of activations within the cache's cap (the
// first one is always allowed: nothing runs without it, and an assignment
// is refused when not even it fits in --memory).
static int s_slot_room(const node_worker_t *w)
{
    if (w->nslots == 0)
        return 1;
    if (w->nslots == WORKER_SLOTS_MAX)
        return 0;
    return (size_t) (w->nslots + 1) * w->mem.acts <= s_cache_cap(w);
}

static slot_t *s_slot_oldest(node_worker_t *w)
{
    slot_t *old = &w->slots[0];
    for (int i = 1; i < w->nslots; i++)
        if (w->slots[i].seq < old->seq)
            old = &w->slots[i];
    return old;
}

// A slot for (step, mb): its own, a free one, a new one within --cache-mb,
// or the oldest one, evicted. -ENOMEM when not even one can be allocated.
static int s_slot_take(node_worker_t *w, uint64_t step, uint32_t mb, slot_t **out, char *err,
                       size_t n)
{
    slot_t *slot = s_slot_find(w, step, mb);
    for (int i = 0; i < w->nslots && !slot; i++)
        if (!w->slots[i].seq)
            slot = &w->slots[i];
    if (!slot && s_slot_room(w)) {
        node_acts_t *acts = node_acts_new(w->stage, w->as.micro, err, n);
        if (acts) {
            slot = &w->slots[w->nslots++];
            slot->acts = acts;
        } else if (w->nslots == 0) {
            return -ENOMEM;
        }
    }
    if (!slot)
        slot = s_slot_oldest(w);
    slot->step = step;
    slot->mb = mb;
    slot->seq = ++w->seq;
    *out = slot;
    return 0;
}

// Forget every cached forward (after an update the parameters changed).
static void s_slots_drop(node_worker_t *w)
{
    for (int i = 0; i < w->nslots; i++)
        w->slots[i].seq = 0;
}

static void s_slots_free(node_worker_t *w)
{
    for (int i = 0; i < w->nslots; i++)
        node_acts_destroy(&w->slots[i].acts);
    memset(w->slots, 0, sizeof w->slots);
    w->nslots = 0;
}

// ---- FWD, BWD -------------------------------------------------------------

// The sleeps of --slowdown (worker.h).
static double s_nap(double want)
{
    struct timespec ts = { (time_t) want, (long) ((want - (double) (time_t) want) * 1e9) };
    double t0 = s_now();
    nanosleep(&ts, NULL);
    return s_now() - t0;
}

double node_worker_slow_sleep(double extra, double *overran, double (*nap)(double want))
{
    double want = extra - *overran, slept = 0.0;
    *overran = want < 0.0 ? -want : 0.0;
    if (want > 0.0) {
        slept = nap(want);
        *overran = fmin(fmax(slept - want, 0.0), extra);
    }
    return slept;
}

// After FWD/BWD work of `seconds` that did `part` of its tokens' training
// work (a forward a third, a backward two thirds, the last stage's fused
// forward and backward all of it): sleep for --slowdown, then fold it into
// tok_s, the training tokens/s this node sustains on its stage (decaying
// sums of work and time, so recent requests count most).
// A BWD that recomputed its forward (an audit's, or one whose activations
// were evicted) did all of it. Counted at a backward's two thirds, what a
// verifier measured fell after each audit it ran (bench-hetero's six, the
// assignment fixed, every step audited: a stage-0 verifier's tok/s at 0.82
// of what it measures with no audits, 0.93 counted whole), and with
// --slowdown its sleep was capped by a backward's usual time.
// A device F times slower takes F times the usual compute of such work:
// the sleep is F - 1 times this request's compute, but never more than F - 1
// times the usual (a running mean), so that a moment of contention on the
// host (the scheduler, another process) is not magnified F times.
// A sleep overruns (a loaded host woke a half-core node 0.4-0.7 ms late on
// each request of a few ms: 5% of its time, which its tok/s did not count):
// node_worker_slow_sleep makes the next sleep up for it, and tok/s counts
// the time slept, not the time asked.
static void s_tok_s_note(node_worker_t *w, double seconds, double part)
{
    if (seconds <= 0.0)
        return;
    if (w->c.slowdown > 1.0) {
        double *usual = &w->usual_s[part < 0.5 ? 0 : part < 0.9 ? 1 : 2];
        double extra = (w->c.slowdown - 1.0) * (*usual > 0.0 ? fmin(seconds, *usual) : seconds);
        *usual = *usual > 0.0 ? 0.9 * *usual + 0.1 * seconds : seconds;
        seconds += node_worker_slow_sleep(extra, &w->overslept, s_nap);
    }
    w->work_tok = 0.95 * w->work_tok + part * w->as.micro * w->as.cfg.T;
    w->work_s = 0.95 * w->work_s + seconds;
    w->tok_s = w->work_tok / w->work_s;
    w->busy = seconds;
}

// Forward of the inputs in d's buffers into slot; the last stage runs its
// backward too (scale > 0). y or dx land in w->out.
static int s_forward(node_worker_t *w, slot_t *slot, float scale, float *loss, char *err,
                     size_t n)
{
    node_stage_in_t in = {
        .tokens = w->tokens, .x = w->x, .targets = w->targets, .loss_scale = scale,
        .want_backward = node_stage_is_last(w->stage) && scale != 0.0f,
    };
    int rc = node_stage_forward(w->stage, slot->acts, &in, w->out, loss, w->out);
    if (rc != 0)
        snprintf(err, n, "forward failed on %s: %s", w->c.be->device, strerror(-rc));
    return rc;
}

// Read FWD's tensors (and the last stage's scale) into d's buffers.
static int s_fwd_inputs(node_worker_t *w, const net_msg_t *req, float *scale, char *err, size_t n)
{
    int last = node_stage_is_last(w->stage), want = 1 + last;
    double v = 0.0;
    int rc = worker_count_check(req, want, err, n);
    if (rc == 0)
        rc = worker_input_get(w, req, err, n);
    if (rc == 0 && last)
        rc = worker_tokens_get(w, req, want - 1, w->targets, "targets", err, n);
    // an evaluation batch (eval=1) runs forward only: scale stays 0
    char eval[8];
    int evaluating = last && net_msg_meta_get(req, "eval", eval, sizeof eval) == 0 && !strcmp(eval, "1");
    if (rc == 0 && last && !evaluating)
        rc = worker_meta_double(req, "scale", 1e-30, 1.0, &v, err, n);
    *scale = (float) v;
    return rc;
}

// audit=1 on a FWD (the last stage) or BWD: recompute another replica's
// share of this step, whose gradient sum the router holds, so that it can
// compare the two (docs/swarm.md, "A step"). This node has sent its own sum
// already, so the gradient buffer is free: the first audit request of the
// step clears it, and STEP audit=1 sends what they accumulated. 0, or
// -EPROTO and why.
static int s_audit_open(node_worker_t *w, const net_msg_t *req, int *audit, char *err, size_t n)
{
    char v[8];
    *audit = net_msg_meta_get(req, "audit", v, sizeof v) == 0 && !strcmp(v, "1");
    if (!*audit)
        return 0;
    if (w->grad_sent != w->step || w->norm_only) {
        snprintf(err, n, "an audit of step %ld before this node sent its own gradient sum", w->step);
        return -EPROTO;
    }
    if (w->audit_step != w->step || !w->audit_open) { // a new audit
        node_stage_grads_zero(w->stage);
        w->audit_step = w->step;
        w->audit_samples = 0;
        w->audit_open = 1;
    }
    return 0;
}

// The gradient buffer holds an audit's, not this node's own sum.
static int s_audited(const node_worker_t *w)
{
    return w->audit_step == w->step;
}

static int s_on_fwd(node_worker_t *w, const net_msg_t *req, net_msg_t **reply, char *err, size_t n)
{
    const net_head_t *h = net_msg_head_const(req);
    slot_t *slot = NULL;
    float scale = 0.0f, loss = 0.0f;
    double t0 = s_now();
    int audit = 0;
    int rc = worker_check_request(w, req, 1, err, n);
    if (rc == 0)
        rc = s_fwd_inputs(w, req, &scale, err, n);
    if (rc == 0)
        rc = s_audit_open(w, req, &audit, err, n);
    if (rc == 0 && audit && (!node_stage_is_last(w->stage) || scale == 0.0f)) {
        snprintf(err, n, "an audit FWD is a training FWD of the last stage (BWD audits the others)");
        rc = -EPROTO;
    }
    if (rc == 0 && !audit && s_audited(w) && node_stage_is_last(w->stage) && scale != 0.0f) {
        // (a forward alone, a spot check's, accumulates nothing: served)
        snprintf(err, n, "a training FWD of step %ld after an audit of it", w->step);
        rc = -EPROTO;
    }
    if (rc == 0)
        rc = s_slot_take(w, h->step, h->mb, &slot, err, n);
    if (rc == 0)
        rc = s_forward(w, slot, scale, &loss, err, n);
    if (rc != 0)
        goto out;
    int last = node_stage_is_last(w->stage), first = node_stage_is_first(w->stage);
    *reply = s_msg_reply(req, NET_MSG_RESULT);
    if (last) {
        char meta[64];
        snprintf(meta, sizeof meta, "loss=%.9g", loss);
        node_meta_set(*reply, meta);
        *(audit ? &w->audit_samples : &w->samples) += scale != 0.0f;
        slot->seq = 0; // nothing to keep: its backward already ran (or none will)
    }
    if (!(last && first) && !(last && scale == 0.0f))
        rc = worker_acts_add(w, *reply, w->out, last ? "dx" : "y", err, n);
    s_tok_s_note(w, s_now() - t0, last && scale != 0.0f ? 1.0 : 1.0 / 3.0);
out:
    if (rc != 0 && slot)
        slot->seq = 0;
    return rc;
}

static int s_bwd_inputs(node_worker_t *w, const net_msg_t *req, char *err, size_t n)
{
    int rc = worker_check_request(w, req, 1, err, n);
    if (rc == 0 && node_stage_is_last(w->stage)) {
        snprintf(err, n, "BWD to the last stage (it runs its backward in FWD)");
        rc = -EPROTO;
    }
    if (rc == 0)
        rc = worker_count_check(req, 2, err, n);
    if (rc == 0)
        rc = worker_input_get(w, req, err, n);
    if (rc == 0)
        rc = worker_acts_get(w, req, 1, w->dy, "dy", err, n);
    return rc;
}

static int s_on_bwd(node_worker_t *w, const net_msg_t *req, net_msg_t **reply, char *err, size_t n)
{
    const net_head_t *h = net_msg_head_const(req);
    double t0 = s_now();
    float loss;
    int audit = 0;
    int rc = s_bwd_inputs(w, req, err, n);
    if (rc == 0)
        rc = s_audit_open(w, req, &audit, err, n);
    if (rc == 0 && !audit && s_audited(w)) {
        snprintf(err, n, "a BWD of step %ld after an audit of it", w->step);
        rc = -EPROTO;
    }
    if (rc != 0)
        return rc;
    // an audit recomputes the forward: another replica ran this one's
    slot_t *slot = audit ? NULL : s_slot_find(w, h->step, h->mb);
    double part = 2.0 / 3.0; // of the micro-batch's training work: a backward
    if (!slot) { // evicted or never seen: recompute the forward from the input
        part = 1.0; // and the forward (timed in this request)
        rc = s_slot_take(w, h->step, h->mb, &slot, err, n);
        if (rc == 0)
            rc = s_forward(w, slot, 0.0f, &loss, err, n);
    }
    if (rc == 0 && (rc = node_stage_backward(w->stage, slot->acts, w->dy, w->out)) != 0)
        snprintf(err, n, "backward failed on %s: %s", w->c.be->device, strerror(-rc));
    if (slot)
        slot->seq = 0; // its backward ran (or failed): the activations are spent
    if (rc != 0)
        return rc;
    (*(audit ? &w->audit_samples : &w->samples))++;
    *reply = s_msg_reply(req, NET_MSG_RESULT);
    if (!node_stage_is_first(w->stage))
        rc = worker_acts_add(w, *reply, w->out, "dx", err, n);
    s_tok_s_note(w, s_now() - t0, part);
    return rc;
}

// ---- STEP, UPDATE, STATE, STATE_GET ----------------------------------------

// UPDATE's meta: lr, scale (clip factor; not in a STEP that applies the
// update itself: want_scale 0), t = step + 1, wd (0.1 if absent).
static int s_update_opts(node_worker_t *w, const net_msg_t *req, int want_scale, node_adamw_t *opt,
                         char *err, size_t n)
{
    double lr = 0.0, scale = 1.0, wd = 0.1;
    long t = 0;
    int rc = worker_meta_double(req, "lr", 0.0, 1e3, &lr, err, n);
    if (rc == 0 && want_scale)
        rc = worker_meta_double(req, "scale", 0.0, 1e30, &scale, err, n);
    if (rc == 0)
        rc = worker_meta_long(req, "t", 1, LONG_MAX, &t, err, n);
    if (rc == 0 && t != w->step + 1) {
        snprintf(err, n, "meta t=%ld, expected %ld (this node is at step %ld)", t, w->step + 1,
                 w->step);
        rc = -EPROTO;
    }
    if (rc == 0 && (rc = worker_meta_double(req, "wd", 0.0, 1e3, &wd, err, n)) == -ENOENT)
        rc = 0;
    *opt = (node_adamw_t) {
        .lr = lr, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = (float) wd,
        .grad_scale = (float) scale, .t = t,
    };
    return rc;
}

// The step's update with the gradient in the stage's buffers: AdamW, the
// step count, and the parameters' checksum in hex. 0 or -errno.
static int s_apply(node_worker_t *w, const node_adamw_t *opt, char hex[65], char *err, size_t n)
{
    float *params = node_stage_params(w->stage);
    memcpy(params, w->lie_kept, w->lie_kept_n * sizeof(float)); // a checksum liar's true ones
    w->lie_kept_n = 0;
    node_stage_adamw(w->stage, opt);
    if (worker_lying(w, NODE_LIE_DRIFT))
        params[0] += 1e-3f; // parameters that drift from its replicas'
    int hidden = worker_lying(w, NODE_LIE_CHECKSUM);
    if (hidden) {
        // the checksum of the parameters its replicas hold, reported while
        // it computes with the first of them 1% larger
        node_stage_checksum(w->stage, hex);
        w->lie_kept_n = node_stage_param_count(w->stage) < WORKER_LIE_KEPT
                        ? node_stage_param_count(w->stage) : WORKER_LIE_KEPT;
        memcpy(w->lie_kept, params, w->lie_kept_n * sizeof(float));
        for (size_t j = 0; j < w->lie_kept_n; j++)
            params[j] *= 1.01f;
    }
    int rc = node_stage_params_changed(w->stage);
    node_stage_grads_zero(w->stage);
    s_slots_drop(w);
    w->samples_total += w->samples;
    w->samples = 0;
    w->grad_sent = w->audit_step = -1;
    w->step = opt->t;
    if (rc != 0) {
        w->ready = 0; // the device copy is stale: wait for STATE
        snprintf(err, n, "cannot upload the parameters to %s: %s", w->c.be->device, strerror(-rc));
        return rc;
    }
    if (!hidden)
        node_stage_checksum(w->stage, hex);
    if (w->step % 10 == 0)
        s_say(w, "step %ld: updated, checksum %.16s", w->step, hex);
    return 0;
}

static int s_on_step(node_worker_t *w, const net_msg_t *req, net_msg_t **reply, char *err, size_t n)
{
    int rc = worker_check_request(w, req, 1, err, n);
    char discard[8];
    if (rc == 0 && net_msg_meta_get(req, "discard", discard, sizeof discard) == 0
        && !strcmp(discard, "1")) {
        // the router starts the step over: what was accumulated is void
        // (every request of the old attempt came before this one)
        node_stage_grads_zero(w->stage);
        s_slots_drop(w);
        w->samples = 0;
        w->grad_sent = w->audit_step = -1;
        *reply = s_msg_reply(req, NET_MSG_RESULT);
        return 0;
    }
    char audit[8];
    int auditing = rc == 0 && net_msg_meta_get(req, "audit", audit, sizeof audit) == 0
                   && !strcmp(audit, "1");
    if (rc == 0 && (auditing ? !s_audited(w) || !w->audit_open : s_audited(w))) {
        snprintf(err, n, auditing ? "STEP audit=1 of step %ld, but no audit of it is open here"
                                  : "a STEP of step %ld after an audit replaced its sum", w->step);
        rc = -EPROTO;
    }
    if (auditing)
        w->audit_open = 0; // the next audit request starts another
    if (rc == 0 && (rc = node_stage_grads_fetch(w->stage)) != 0)
        snprintf(err, n, "cannot read the gradients from %s: %s", w->c.be->device, strerror(-rc));
    if (rc != 0)
        return rc;
    uint32_t dims[1] = { (uint32_t) node_stage_param_count(w->stage) };
    char meta[96], only[8];
    // the only replica of its stage keeps its gradient: the router needs
    // just its sum of squares (for the global norm), and UPDATE brings none
    w->norm_only = !auditing && net_msg_meta_get(req, "norm_only", only, sizeof only) == 0
                   && !strcmp(only, "1");
    double sumsq = w->norm_only ? node_sumsq(node_stage_grads(w->stage),
                                             node_stage_param_count(w->stage)) : 0.0;
    if (worker_lying(w, NODE_LIE_SUMSQ))
        sumsq = 1e300; // a norm that clips every stage's update to nothing
    w->sumsq = sumsq;
    if (w->norm_only)
        snprintf(meta, sizeof meta, "samples=%ld\nsumsq=%a", w->samples, sumsq);
    else
        snprintf(meta, sizeof meta, "samples=%ld", auditing ? w->audit_samples : w->samples);
    if (!auditing && !w->norm_only)
        w->grad_sent = w->step;
    *reply = s_msg_reply(req, NET_MSG_GRAD);
    node_meta_set(*reply, meta);
    if (w->norm_only)
        return 0;
    const float *g = node_stage_grads(w->stage);
    int inf = worker_lying(w, NODE_LIE_GRADINF);
    // a sum of no micro-batches is zero: its count says so, with no tensor
    // (a replica that got no work in a step sends no stage-sized zeros)
    if (!auditing && w->samples == 0 && !inf && !worker_lying(w, NODE_LIE_GRAD))
        return 0;
    int reverse = worker_lying(w, NODE_LIE_GRAD) || (auditing && worker_lying(w, NODE_LIE_RECOUNT));
    float *lie = reverse || inf ? malloc(dims[0] * sizeof(float)) : NULL;
    for (size_t j = 0; lie && j < dims[0]; j++)
        lie[j] = inf ? g[j] : -g[j]; // of the right size, pointing the other way
    if (lie && inf)
        lie[0] = FLT_MAX; // finite, but no sum of squares of it is
    int pow2 = 0;
    rc = net_tensor_add(*reply, w->as.grad_wire, dims, 1, lie ? lie : g, &pow2);
    free(lie);
    if (rc != 0)
        snprintf(err, n, "cannot send the gradient: %s",
                 rc == -EDOM ? "it holds a NaN or infinite value" : strerror(-rc));
    else if (pow2 != 0)
        node_meta_add(*reply, "pow2_0=%d", pow2);
    return rc;
}

static int s_on_update(node_worker_t *w, const net_msg_t *req, net_msg_t **reply, char *err, size_t n)
{
    node_adamw_t opt;
    char hex[65];
    int rc = worker_check_request(w, req, 1, err, n);
    int keep = w->norm_only; // apply our own gradient, kept since STEP
    w->norm_only = 0;
    // others= (only with our own gradient): the router sent this UPDATE
    // right behind the STEP, before it knew our sum of squares, and the
    // clip factor is formed here from the same two numbers as there
    char others_text[8];
    int own_clip = keep && net_msg_meta_get(req, "others", others_text, sizeof others_text) != -ENOENT;
    double others = 0.0, clip = 0.0;
    if (rc == 0)
        rc = worker_count_check(req, keep ? 0 : 1, err, n);
    if (rc == 0 && own_clip && (rc = worker_meta_double(req, "others", 0.0, 1e300, &others, err, n)) == 0)
        rc = worker_meta_double(req, "clip", 0.0, 1e30, &clip, err, n);
    if (rc == 0)
        rc = s_update_opts(w, req, !own_clip, &opt, err, n); // else scale=
    if (rc == 0 && own_clip)
        opt.grad_scale = node_clip_scale(sqrt(others + w->sumsq), (float) clip);
    if (rc == 0 && !keep
        && (rc = worker_grad_get(w, req, 0, node_stage_grads(w->stage), err, n)))
        node_stage_grads_zero(w->stage); // a half-copied sum must not mix with new work
    if (rc != 0)
        return rc;
    rc = s_apply(w, &opt, hex, err, n);
    if (rc == 0)
        *reply = s_checksum_reply(req, hex);
    return rc;
}

static int s_state_load(node_worker_t *w, const net_msg_t *req, char *err, size_t n)
{
    w->lie_kept_n = 0; // what a checksum liar changed is replaced
    int rc = worker_count_check(req, 3, err, n);
    if (rc == 0)
        rc = worker_vector_get(w, req, 0, node_stage_params(w->stage), "parameters", err, n);
    if (rc == 0)
        rc = worker_vector_get(w, req, 1, node_stage_moment1(w->stage), "first moments", err, n);
    if (rc == 0)
        rc = worker_vector_get(w, req, 2, node_stage_moment2(w->stage), "second moments", err, n);
    const float *v = node_stage_moment2(w->stage);
    for (size_t j = 0; rc == 0 && j < node_stage_param_count(w->stage); j++) {
        if (!(v[j] >= 0.0f)) { // AdamW would take its square root
            snprintf(err, n, "second moment %zu is %g: a STATE's second moments are >= 0", j, v[j]);
            rc = -EPROTO;
        }
    }
    if (rc == 0 && (rc = node_stage_params_changed(w->stage)) != 0)
        snprintf(err, n, "cannot upload the parameters to %s: %s", w->c.be->device, strerror(-rc));
    return rc;
}

static int s_on_state(node_worker_t *w, const net_msg_t *req, net_msg_t **reply, char *err, size_t n)
{
    const net_head_t *h = net_msg_head_const(req);
    char hex[65];
    int rc = worker_check_stage(w, req, err, n);
    if (rc == 0 && h->step > LONG_MAX) {
        snprintf(err, n, "step %" PRIu64 " is out of range", h->step);
        rc = -EPROTO;
    }
    if (rc == 0 && (rc = s_state_load(w, req, err, n)) != 0)
        w->ready = 0; // a half-loaded stage is not ready
    if (rc != 0)
        return rc;
    node_stage_grads_zero(w->stage);
    s_slots_drop(w);
    w->samples = 0;
    w->grad_sent = w->audit_step = -1;
    w->step = (long) h->step;
    w->ready = 1;
    node_stage_checksum(w->stage, hex);
    *reply = s_checksum_reply(req, hex);
    s_say(w, "stage %d: state loaded at step %ld, checksum %.16s", node_stage_index(w->stage),
          w->step, hex);
    return 0;
}

static int s_on_state_get(node_worker_t *w, const net_msg_t *req, net_msg_t **reply, char *err,
                          size_t n)
{
    int rc = worker_check_request(w, req, 0, err, n);
    if (rc != 0)
        return rc;
    uint32_t dims[1] = { (uint32_t) node_stage_param_count(w->stage) };
    const float *parts[3] = { node_stage_params(w->stage), node_stage_moment1(w->stage),
                              node_stage_moment2(w->stage) };
    float *lie = worker_lying(w, NODE_LIE_STATE) ? malloc(dims[0] * sizeof(float)) : NULL;
    if (lie) { // parameters other than those its checksum is of
        memcpy(lie, parts[0], dims[0] * sizeof(float));
        lie[0] += 1.0f;
        parts[0] = lie;
    }
    *reply = s_msg_reply(req, NET_MSG_STATE);
    net_msg_head(*reply)->step = (uint64_t) w->step;
    for (int i = 0; i < 3 && rc == 0; i++)
        rc = net_msg_add_tensor(*reply, NET_DTYPE_F32, dims, 1, parts[i]);
    free(lie);
    if (rc != 0)
        snprintf(err, n, "cannot send the state: %s",
                 rc == -EDOM ? "it holds a NaN or infinite value" : strerror(-rc));
    return rc;
}

// ---- ASSIGN ----------------------------------------------------------------

static void s_unassign(node_worker_t *w)
{
    s_slots_free(w);
    node_stage_destroy(&w->stage);
    free(w->tokens);
    free(w->targets);
    free(w->x);
    free(w->dy);
    free(w->out);
    w->tokens = w->targets = NULL;
    w->x = w->dy = w->out = NULL;
    w->ready = 0;
    w->samples = 0;
}

static int s_assign_build(node_worker_t *w, const assign_t *a, char *err, size_t n)
{
    s_unassign(w);
    int rc = 0;
    if (a->cut)
        w->plan = a->plan; // (node_plan_parse checked it against the shape)
    else
        rc = node_plan_make(&a->cfg, a->stages, &w->plan, err, n);
    if (rc != 0)
        return rc;
    node_memory_t mem = node_plan_stage_memory(&a->cfg, &w->plan, a->stage, a->micro);
    size_t need = node_memory_need(mem);
    if (w->c.memory > 0 && need > w->c.memory) {
        snprintf(err, n, "stage %d of %d needs %.1f MiB (its state %.1f, a micro-batch's "
                 "activations %.1f, buffers %.1f), more than --memory %.1f MiB", a->stage,
                 a->stages, need / 1048576.0, mem.state / 1048576.0, mem.acts / 1048576.0,
                 mem.buffers / 1048576.0, w->c.memory / 1048576.0);
        return -ENOSPC;
    }
    w->mem = mem;
    w->stage = node_stage_new(&a->cfg, &w->plan, a->stage, w->c.be, err, n);
    if (!w->stage)
        return -ENOMEM;
    size_t tokens = (size_t) a->micro * a->cfg.T, floats = tokens * a->cfg.C;
    w->tokens = malloc(tokens * sizeof(int32_t));
    w->targets = malloc(tokens * sizeof(int32_t));
    w->x = malloc(floats * sizeof(float));
    w->dy = malloc(floats * sizeof(float));
    w->out = malloc(floats * sizeof(float));
    if (!w->tokens || !w->targets || !w->x || !w->dy || !w->out) {
        snprintf(err, n, "out of memory for micro-batches of %d windows", a->micro);
        s_unassign(w);
        return -ENOMEM;
    }
    w->as = *a;
    w->step = a->step;
    w->grad_sent = w->audit_step = -1;
    w->tok_s = w->work_tok = w->work_s = 0.0;
    return 0;
}
// ---- the worker ----------------------------------------------------------------

node_worker_t *node_worker_new(const node_worker_config_t *c)
{
    node_worker_t *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->c = *c;
    w->grad_sent = w->audit_step = -1;
    if (!(w->c.slowdown >= 1.0))
        w->c.slowdown = 1.0;
    return w;
}

void node_worker_destroy(node_worker_t **self_p)
{
    if (!*self_p)
        return;
    s_unassign(*self_p);
    free(*self_p);
    *self_p = NULL;
}

void node_worker_lie(node_worker_t *self, int mode, long from)
{
    self->lie = mode;
    self->lie_from = from;
}

int node_worker_assign(node_worker_t *w, const net_msg_t *msg, char *err, size_t n)
{
    assign_t a;
    int rc = worker_assign_parse(msg, &a, err, n);
    if (rc == 0 && worker_assign_same(w, &a)) {
        s_say(w, "assigned stage %d of %d again (peer %ld): keeping it", a.stage, a.stages, a.peer);
        return 1;
    }
    if (rc == 0)
        rc = s_assign_build(w, &a, err, n);
    if (rc != 0)
        return rc;
    s_say(w, "assigned stage %d of %d (peer %ld): blocks %d..%d of L %d, C %d T %d H %d, "
          "micro %d, %zu parameters, step %ld; sends activations as %s, gradients as %s",
          a.stage, a.stages, a.peer, w->plan.first[a.stage], w->plan.first[a.stage + 1] - 1,
          a.cfg.L, a.cfg.C, a.cfg.T, a.cfg.H, a.micro, node_stage_param_count(w->stage), a.step,
          net_dtype_name(a.wire), net_dtype_name(a.grad_wire));
    return 0;
}

int node_worker_serve(node_worker_t *w, const net_msg_t *msg, net_msg_t **reply, char *err,
                      size_t n)
{
    *reply = NULL;
    int rc;
    switch (net_msg_head_const(msg)->type) {
    case NET_MSG_FWD: rc = s_on_fwd(w, msg, reply, err, n); break;
    case NET_MSG_BWD: rc = s_on_bwd(w, msg, reply, err, n); break;
    case NET_MSG_STEP: rc = s_on_step(w, msg, reply, err, n); break;
    case NET_MSG_UPDATE: rc = s_on_update(w, msg, reply, err, n); break;
    case NET_MSG_STATE: rc = s_on_state(w, msg, reply, err, n); break;
    case NET_MSG_STATE_GET: rc = s_on_state_get(w, msg, reply, err, n); break;
    default:
        snprintf(err, n, "a node does not serve %s", net_msg_type_name(net_msg_head_const(msg)->type));
        rc = -EPROTO;
    }
    if (rc != 0)
        net_msg_destroy(reply);
    return rc;
}

void node_worker_status(const node_worker_t *w, node_worker_status_t *out)
{
    // micro-batches our activation cache holds (once one has been made)
    size_t each = w->nslots ? w->mem.acts : 0;
    size_t slots = each ? s_cache_cap(w) / each : 0;
    slots = slots > WORKER_SLOTS_MAX ? WORKER_SLOTS_MAX : slots < 1 && each ? 1 : slots;
    *out = (node_worker_status_t) {
        .stage = w->stage ? node_stage_index(w->stage) : -1, .stages = w->as.stages,
        .ready = w->ready, .step = w->step, .tok_s = w->tok_s, .busy = w->busy, .slots = slots,
        .samples_total = w->samples_total + w->samples,
        .memory_used = w->stage ? w->mem.state + w->mem.buffers + (size_t) w->nslots * w->mem.acts
                                : 0,
    };
}
