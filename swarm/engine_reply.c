/* engine_reply.c - what peers send: every reply checked before it is used
 * (shapes, finiteness, bounds, checksums), replies to requests, floods,
 * a second connection with a key in use, and the dispatch of a message.
 */
#include "engine_int.h"

// A stage state from replica p (STATE, checked for shape), decoded into
// dst[0..2] (params, m, v; one buffer may serve all three): its parameters
// hash to the checksum p reported for them (after the update the state is
// of) and its second moments are >= 0. 0, or -EPROTO and why.
static int s_state_true(swarm_engine_t *r, int p, const msg_in_t *e, int s, float *const dst[3],
                        char *why, size_t wn)
{
    size_t n = r->stage_n[s];
    for (int i = 0; i < 3; i++) {
        if (net_msg_tensor(e->msg, i, dst[i], n) != 0) {
            snprintf(why, wn, "sent a stage state that does not decode");
            return -EPROTO;
        }
        char hex[65];
        if (i == 0 && r->io.checksum) {
            r->io.checksum(r->io.ctx, dst[0], n, hex);
            if (strcmp(hex, r->peers[p].checksum) != 0) {
                snprintf(why, wn, "sent a stage state whose checksum %.16s is not the %.16s it "
                         "reported", hex, r->peers[p].checksum);
                return -EPROTO;
            }
        }
        for (size_t j = 0; i == 2 && j < n; j++) {
            if (!(dst[2][j] >= 0.0f)) {
                snprintf(why, wn, "sent a stage state with a negative second moment (element %zu)", j);
                return -EPROTO;
            }
        }
    }
    return 0;
}

// A STATE reply: for a checkpoint (q->mb < 0: its part, into ck_state) or
// to forward to a joiner (checked in a scratch buffer), once it is shown
// true; a replica whose state is not is expelled.
static int s_on_state(swarm_engine_t *r, const req_t *q, const msg_in_t *e)
{
    const net_msg_t *m = e->msg;
    int s = q->stage;
    size_t np = r->nparams, off = r->stage_off[s];
    char why[160];
    if (q->mb >= 0) {
        peer_t *joiner = &r->peers[q->mb];
        joiner->inflight--;
        if (joiner->state != P_JOINING)
            return 0;
        if (e->head->step != (uint64_t) r->step)
            return 0; // not the state this step starts from: asked again between steps
        if (!r->audit_sum && !(r->audit_sum = malloc(r->max_stage_n * sizeof(float))))
            abort();
        float *const scratch[3] = { r->audit_sum, r->audit_sum, r->audit_sum };
        if (s_state_true(r, q->peer, e, s, scratch, why, sizeof why) != 0) {
            engine_peer_expel(r, q->peer, why); // the joiner asks another between steps
            return 0;
        }
        net_msg_t *fwd = net_msg_dup(m); // its header step: the updates it holds
        if (!fwd)
            return -ENOMEM;
        memcpy(joiner->sent_sum, r->peers[q->peer].checksum, sizeof joiner->sent_sum);
        net_msg_head(fwd)->flags = 0;
        return engine_send(r, q->mb, &fwd, R_STATE, -1, s);
    }
    float *const parts[3] = { r->ck_state + off, r->ck_state + np + off, r->ck_state + 2 * np + off };
    if (s_state_true(r, q->peer, e, s, parts, why, sizeof why) != 0) {
        engine_ckpt_part(r, 0); // this checkpoint is skipped
        engine_peer_expel(r, q->peer, why);
        return 0;
    }
    engine_ckpt_part(r, 1);
    return 0;
}

// Tensor i of m: n finite values into dst. 0, or -EPROTO and why. The
// decoders refuse a non-finite value (-EPROTO), and net_tensor_get one its
// power-of-two scale makes: what it returns needs no second look.
static int s_check_finite(const net_msg_t *m, int i, float *dst, size_t n, const char *what,
                          char *why, size_t wn)
{
    int rc = net_tensor_get(m, i, dst, n);
    if (rc != 0) { // -EINVAL: shape, type
        snprintf(why, wn, rc == -EPROTO ? "sent a non-finite value in %s"
                                        : "sent %s of the wrong shape or type", what);
        return -EPROTO;
    }
    return 0;
}

// Tensor i of m, the answer to q: n finite values whose RMS is within
// --tensor-bound times the median RMS of what q's stage sent that way (dir
// 0 forward, 1 backward), either way: neither 100x larger nor 100x smaller
// (zeros), by default. The median is of the last BOUND_WINDOW accepted
// tensors, each learned as at most RMS_LEARN from it (engine_bound_learn):
// it follows honest drift (a stage's outputs grow 100x in the first 20
// steps of tests/test_rollback.sh's run, its input gradients fall 100x),
// and a liar cannot walk it faster than that. The first 4 of a stage are
// judged by nothing but finiteness (and spot checks). Input gradients
// follow the loss, and honest ones spike, so a backward tensor outside the
// bound is judged as a gradient sum outside the norm bound is: at a stage
// whose other replicas can recompute it, it is audited and used
// (engine_audit_force); from a stage's only replica (or with --audit 0) it
// is refused only RMS_ALONE outside the median. 0, or -EPROTO and why.
#define RMS_LEARN 4.0
#define RMS_ALONE 1e6
static int s_check_values(swarm_engine_t *r, const req_t *q, const net_msg_t *m, size_t n, int dir,
                          char *why, size_t wn)
{
    int s = q->stage;
    if (s_check_finite(m, 0, r->scratch, n, "a tensor", why, wn) != 0)
        return -EPROTO;
    double rms = sqrt(swarm_sumsq(r->scratch, n) / (double) (n ? n : 1));
    engine_bound_t *b = &r->rms[dir][s];
    int audited = dir == 1 && engine_ready_count(r, s) >= 2 && r->audit_rate > 0.0;
    double k = r->tensor_bound, med = b->median;
    if (dir == 1 && !audited && k > 0)
        k = fmax(k, RMS_ALONE);
    if (engine_bound_known(b) && k > 0 && (rms > k * med || rms < med / k)) {
        snprintf(why, wn, "sent a tensor of RMS %.3g (%s), %.3gx the stage's median %.3g", rms,
                 dir ? "input gradients" : "a stage output", rms / med, med);
        if (!audited)
            return -EPROTO;
        engine_audit_force(r, q->peer, s, why); // its audit recomputes it
        return 0;
    }
    engine_bound_learn(b, rms, RMS_LEARN);
    return 0;
}

// The last stage's answer carries a finite, non-negative loss. 0 or -EPROTO.
static int s_check_loss(const msg_in_t *e, char *why, size_t wn)
{
    if (e->reply.has_loss)
        return 0;
    snprintf(why, wn, "sent no finite loss");
    return -EPROTO;
}

// A GRAD (STEP's reply): the count of micro-batches the router had the
// replica accumulate (a stage's own update applied: its next step's work
// is under way, not counted), finite values, and a norm the stage's
// history allows (engine_grad_plausible); decoded into the peer's buffer,
// or, norm only, its sum of squares.
static int s_check_grad(swarm_engine_t *r, const req_t *q, const msg_in_t *e, char *why, size_t wn)
{
    const msg_reply_t *y = &e->reply;
    peer_t *pe = &r->peers[q->peer];
    int s = q->stage;
    if (!y->has_samples) {
        snprintf(why, wn, "sent a gradient sum without its count of micro-batches");
        return -EPROTO;
    }
    long want = q->mb == MB_APPLY ? y->samples : engine_share(r, q->peer, s);
    if (y->samples != want) {
        snprintf(why, wn, "sent a gradient sum of %ld micro-batches, the router had it do %ld",
                 y->samples, want);
        return -EPROTO;
    }
    if (pe->norm_only || q->mb == MB_APPLY) {
        if (!y->has_sumsq) {
            snprintf(why, wn, "sent no finite gradient norm");
            return -EPROTO;
        }
        return engine_grad_plausible(r, s, y->samples, y->sumsq, 1, why, wn) ? -EPROTO : 0;
    }
    if (net_msg_head_const(e->msg)->ntensors == 0) {
        if (y->samples == 0)
            return 0; // a sum of none: zero by its count (engine_on_grad marks it)
        snprintf(why, wn, "sent a gradient sum of %ld micro-batches without its values", y->samples);
        return -EPROTO;
    }
    // the largest stage's size: a peer may move between stages
    if (!pe->grad && !(pe->grad = malloc(r->max_stage_n * sizeof(float))))
        abort();
    if (s_check_finite(e->msg, 0, pe->grad, r->stage_n[s], "a gradient", why, wn) != 0)
        return -EPROTO;
    double sumsq = 0.0;
    for (size_t j = 0; j < r->stage_n[s]; j++)
        sumsq += (double) pe->grad[j] * pe->grad[j];
    int others = engine_ready_count(r, s) >= 2 && r->audit_rate > 0.0; // to recompute it
    int rc = engine_grad_plausible(r, s, y->samples, sumsq, !others, why, wn);
    if (rc == -ERANGE && others) {
        engine_audit_force(r, q->peer, s, why); // its inputs may be what lied
        return 0;
    }
    return rc ? -EPROTO : 0;
}

// Check a reply to request q before anything uses it: the right type, its
// fields (decoded: engine_decode.c), and every tensor of the shape the plan
// says, finite and of plausible size. 0, or -EPROTO and why.
static int s_check_reply(swarm_engine_t *r, const req_t *q, const msg_in_t *e, char *why, size_t wn)
{
    const net_msg_t *m = e->msg;
    const net_head_t *h = e->head;
    const msg_reply_t *y = &e->reply;
    int S = r->stages, s = q->stage;
    size_t x_n = engine_acts_count(r);
    static const int want[] = { [R_FWD] = NET_MSG_RESULT, [R_BWD] = NET_MSG_RESULT,
                                [R_STEP] = NET_MSG_GRAD, [R_UPDATE] = NET_MSG_RESULT,
                                [R_STATE_GET] = NET_MSG_STATE, [R_STATE] = NET_MSG_RESULT,
                                [R_ASSIGN] = NET_MSG_RESULT, [R_VERIFY] = NET_MSG_RESULT,
                                [R_DISCARD] = NET_MSG_RESULT, [R_AUDIT] = NET_MSG_RESULT,
                                [R_AUDIT_SUM] = NET_MSG_GRAD };
    if (h->type == NET_MSG_ERROR) {
        snprintf(why, wn, "refused a request (%s)", y->reason);
        return -EPROTO;
    }
    if (h->type != want[q->kind]) {
        snprintf(why, wn, "answered with %s", net_msg_type_name(h->type));
        return -EPROTO;
    }
    switch (q->kind) {
    case R_FWD:
        if (s == S - 1) {
            if (s_check_loss(e, why, wn) != 0)
                return -EPROTO;
            if (q->redo || S == 1 || r->evaluating)
                return 0;
            return s_check_values(r, q, m, x_n, 1, why, wn);
        }
        return q->redo ? 0 : s_check_values(r, q, m, x_n, 0, why, wn);
    case R_BWD:
        return q->redo || s == 0 ? 0 : s_check_values(r, q, m, x_n, 1, why, wn);
    case R_VERIFY:
        return s == S - 1 ? s_check_loss(e, why, wn) : s_check_values(r, q, m, x_n, 0, why, wn);
    case R_STEP:
        return s_check_grad(r, q, e, why, wn);
    case R_AUDIT:
        if (s == S - 1 && s_check_loss(e, why, wn) != 0)
            return -EPROTO;
        return s == 0 ? 0 : s_check_finite(m, 0, r->scratch, x_n, "an input gradient", why, wn);
    case R_AUDIT_SUM:
        if (!y->has_samples) {
            snprintf(why, wn, "sent a recomputed gradient sum without its count");
            return -EPROTO;
        }
        if (!r->audit_sum)
            abort(); // (made when the audit began)
        return s_check_finite(m, 0, r->audit_sum, r->stage_n[s], "a recomputed gradient", why, wn);
    case R_UPDATE:
    case R_STATE:
        if (!y->has_checksum) {
            snprintf(why, wn, "sent no parameter checksum");
            return -EPROTO;
        }
        return 0;
    case R_STATE_GET:
        for (int i = 0; i < 3; i++) {
            if (h->ntensors != 3 || h->tensors[i].ndims != 1 || h->tensors[i].dtype != NET_DTYPE_F32
                || h->tensors[i].dims[0] != r->stage_n[s]) {
                snprintf(why, wn, "sent a stage state of the wrong shape");
                return -EPROTO;
            }
        }
        return 0;
    }
    return 0;
}

// A joiner's checksum after it loaded its stage's state: the one a ready
// replica of its stage holds (any, when the stage has none yet).
static int s_checksum_agrees(const swarm_engine_t *r, int p, const char *checksum)
{
    int s = r->peers[p].stage, ready = 0;
    for (int k = 0; s >= 0 && k < r->ready[s].n; k++) {
        const peer_t *pe = &r->peers[r->ready[s].peer[k]];
        ready++;
        if (!strcmp(pe->checksum, checksum))
            return 1;
    }
    return ready == 0;
}

// A reply: checked first; a peer that answers wrongly fails (banned, and
// the request's work goes to another replica with the rest of its work).
// One whose answer was a lie (not a refusal) may have lied before in the
// step: when the step used any of its outputs, the step starts over.
static void s_on_reply(swarm_engine_t *r, int p, const msg_in_t *e)
{
    const net_head_t *h = e->head;
    req_t *q = engine_req_find(r, h->id);
    if (!q || q->peer != p)
        return; // stale or not ours: dropped
    engine_link_heard(r, q);
    char why[160];
    if (s_check_reply(r, q, e, why, sizeof why) != 0) {
        int lied = h->type != NET_MSG_ERROR && !r->evaluating && engine_outputs_used(r, p);
        engine_peer_fail(r, p, "%s", why); // q is still its request: redone elsewhere
        if (lied && (r->phase == PH_MB || r->phase == PH_GRAD))
            engine_step_restart(r, "a peer whose outputs it used sent a value it refused");
        return;
    }
    req_t copy = *q;
    engine_req_done(r, q);
    int rc = 0;
    switch (copy.kind) {
    case R_FWD:
    case R_BWD:
        rc = engine_on_result(r, &copy, e);
        break;
    case R_STEP:
        rc = copy.mb == MB_APPLY ? engine_on_applied(r, &copy, e) : engine_on_grad(r, &copy, e);
        break;
    case R_UPDATE:
        rc = engine_on_updated(r, &copy, e);
        break;
    case R_STATE_GET:
        rc = s_on_state(r, &copy, e);
        break;
    case R_VERIFY:
        engine_spot_result(r, &copy, e);
        break;
    case R_AUDIT:
        engine_audit_result(r, &copy, e);
        break;
    case R_AUDIT_SUM:
        engine_audit_sum(r, &copy, e);
        break;
    case R_DISCARD:
        r->pending--;
        break;
    case R_STATE:
        if (h->step != (uint64_t) r->step || r->phase == PH_GRAD || r->phase == PH_UPDATE
            || (r->phase == PH_MB && r->peers[p].stage >= 0 && r->stepped[r->peers[p].stage])) {
            // loaded a state the swarm has moved past, or the step's update
            // has begun without it: it would be behind; fetch again between
            // steps
            break;
        }
        if (!s_checksum_agrees(r, p, e->reply.checksum)) {
            if (!strcmp(e->reply.checksum, r->peers[p].sent_sum))
                // what it was sent, from a replica the vote on the update
                // it held (pipelined) has found diverged since: not its fault
                engine_warn(r, "swarm router: peer %d (%s) loaded a state its stage's vote found "
                            "diverged since; it fetches another\n", r->peers[p].id,
                            r->peers[p].name);
            else
                engine_peer_fail(r, p, "loaded its stage's state but reports checksum %.16s, not "
                                 "its replicas'", e->reply.checksum);
            break;
        }
        engine_peer_state(r, p, P_READY);
        r->peers[p].moving = r->peers[p].agreed = 0;
        r->peers[p].sent_sum[0] = '\0';
        r->peers[p].updated = 0; // its checksum is of this state now, not of an update's
        memcpy(r->peers[p].checksum, e->reply.checksum, sizeof r->peers[p].checksum); // checked
        engine_say(r, "swarm router: peer %d (%s) ready on stage %d, checksum %.16s\n", r->peers[p].id,
                   r->peers[p].name, r->peers[p].stage, r->peers[p].checksum);
        break;
    }
    if (rc != 0)
        engine_warn(r, "swarm router: peer %d (%s): %s reply not used: %s\n", r->peers[p].id,
                    r->peers[p].name, net_msg_type_name(h->type), strerror(-rc));
}

static int s_flooding(swarm_engine_t *r, int p, const net_head_t *h)
{
    peer_t *pe = &r->peers[p];
    int64_t now = r->now_ms;
    if (h->flags & NET_FLAG_REPLY)
        return 0;
    if (now - pe->burst_from >= 1000) {
        pe->burst_from = now;
        pe->burst = 0;
    }
    if (++pe->burst <= ROUTER_BURST)
        return 0;
    if (pe->state != P_DEAD)
        engine_peer_fail(r, p, "flooded the router (more than %d messages in a second)", ROUTER_BURST);
    return 1; // over the limit: dropped unread
}

// The speed a node reports is used only for the bound in swarm status; one
// that claims ten times what the router measures is not believed there.
// One not measured yet that claims less than the deadlines' floor (1/20 of
// the median measured) is named once: what it is given and holds fails at
// the floor's deadline (a claim of 1e-6 tok/s once held a step 640 s).
// Both lines are limited as other lines about what peers send: every CPU
// joining a big swarm of GPUs is under that floor (4,759 in one step of
// 10,000 peers), and a crowd of them fills no screen.
static void s_doubt_claim(swarm_engine_t *r, int p)
{
    peer_t *pe = &r->peers[p];
    char note[64];
    int doubt = pe->samples > 0 && pe->node_tok_s > 10.0 * pe->tok_s;
    if (doubt && !pe->claim_doubted && engine_loud(r, pe->who.key, note, sizeof note))
        engine_warn(r, "swarm router: peer %d (%s) says it sustains %.0f tok/s; the router "
                    "measures %.0f and uses that%s\n", pe->id, pe->name, pe->node_tok_s,
                    pe->tok_s, note);
    pe->claim_doubted = doubt;
    int low = pe->samples == 0 && pe->node_tok_s > 0.0 && pe->node_tok_s < r->speed_floor;
    if (low && !pe->claim_low && engine_loud(r, pe->who.key, note, sizeof note)) {
        char held[96];
        if (engine_claim_unbelieved(r, pe)) // (engine_route.c: routed, and timed, as the fastest)
            snprintf(held, sizeof held, "it is taken for its stage's fastest (%.0f tok/s), and so "
                     "are its deadlines", r->route[pe->stage].fastest);
        else
            snprintf(held, sizeof held, "work it holds fails at the deadline of that floor");
        engine_warn(r, "swarm router: peer %d (%s) says it sustains %.3g tok/s, under 1/20 of the "
                    "median the router measures (%.0f): %s%s\n", pe->id, pe->name, pe->node_tok_s,
                    20.0 * r->speed_floor, held, note);
    }
    pe->claim_low = low;
}

// Another connection speaks with peer p's key: a second node with a copy
// of the key, or the peer's node restarted while the router still holds
// the old connection. Its HELLOs get an answer once it is clear which:
// when the old connection has been heard from since the rival's first
// HELLO, it is live and the rival is refused (both told, in a line each);
// when it has been silent three of its heartbeats since (a live node says
// HEARTBEAT every beat_ms it was told, a second until told), it is gone,
// and the rival takes the peer's place as a node that comes back. Nothing
// else the rival sends is the peer's: it is dropped.
static int64_t s_rival_ms(const peer_t *pe)
{
    return (int64_t) BEAT_SILENT * (pe->beat_ms > 0 ? pe->beat_ms : BEAT_MS);
}

static void s_on_rival(swarm_engine_t *r, int p, const net_peer_t *who, const msg_in_t *e)
{
    peer_t *pe = &r->peers[p];
    int64_t now = r->now_ms;
    if (e->head->type != NET_MSG_HELLO)
        return;
    if (strcmp(pe->rival.conn, who->conn) != 0) {
        pe->rival = *who;
        pe->rival_since = now;
        pe->rival_told = 0;
        return;
    }
    if (pe->last_seen > pe->rival_since) {
        net_msg_t *err = net_msg_reply(e->msg, NET_MSG_ERROR);
        engine_meta(err, "reason=this node's key %.8s... is in use by peer %d (%s), which is connected; "
                    "each node needs a key of its own: start this one without --key (swarm picks a "
               "free one) or with --key NAME of another pair (swarm keygen NAME)\nfatal=1",
               who->key, pe->id, pe->name);
        s_ignore(engine_emit(r, who, &err));
        if (pe->rival_told)
            return;
        pe->rival_told = 1;
        engine_warn(r, "swarm router: refused a second node with the key %.8s... of peer %d (%s), "
                    "which is connected (a copy of its key?)\n", who->key, pe->id, pe->name);
        net_msg_t *t = net_msg_new(NET_MSG_ERROR);
        engine_meta(t, "reason=another node with this node's key tried to join and was refused; this "
                    "node goes on (a copy of this key elsewhere needs a key of its own)\nnotice=1");
        s_ignore(engine_emit(r, &pe->who, &t));
        return;
    }
    if (now - pe->rival_since < s_rival_ms(pe))
        return;
    engine_say(r, "swarm router: peer %d (%s): a new process with its key says HELLO and the old one "
               "has been silent %.1f s: it takes the peer's place\n", pe->id, pe->name,
               (now - pe->last_seen) / 1000.0);
    if (pe->state != P_DEAD)
        engine_peer_dead(r, p, "was replaced by a new process with its key");
    pe->who = *who;
    memset(&pe->rival, 0, sizeof pe->rival);
    engine_on_hello(r, who, e);
}

// A HEARTBEAT: what the node says of its queue, speed and cache (a field
// it leaves out keeps what it said before), and a dead peer talking again.
static void s_on_heartbeat(swarm_engine_t *r, int p, const msg_in_t *e)
{
    const msg_heartbeat_t *hb = &e->heartbeat;
    if (hb->has_queue) {
        r->peers[p].queue = hb->queue;
        engine_route_touch(r, p);
    }
    if (hb->has_tok_s) {
        r->peers[p].node_tok_s = hb->tok_s;
        s_doubt_claim(r, p);
    }
    if (r->peers[p].state == P_DEAD)
        engine_on_dead_peer(r, p, e);
    if (hb->memory_used > 0)
        r->peers[p].memory_used = hb->memory_used;
    if (hb->rss > 0)
        r->peers[p].rss = hb->rss;
    if (hb->memory_heap > 0)
        r->peers[p].memory_heap = hb->memory_heap;
    if (hb->rss_grown > 0)
        r->peers[p].rss_grown = hb->rss_grown;
    if (hb->device_used > 0)
        r->peers[p].device_used = hb->device_used;
    if (hb->has_slots)
        r->peers[p].slots = hb->slots >= 0 && hb->slots <= r->G ? hb->slots : r->G;
}

// What a node may send the router, by type, checked before anything is
// read (the transport has bounded the whole message already): unasked, only
// HELLO, HEARTBEAT, BYE and STATUS, with no tensors; everything else is a
// reply to a request the router made, its tensors checked against what
// that request asked for (s_on_reply). A key that never said HELLO is read
// only for its HELLO or STATUS. NULL when m may be read, else why not.
static const char *s_unreadable(const net_msg_t *m, int member, char *why, size_t n)
{
    const net_head_t *h = net_msg_head_const(m);
    const char *type = net_msg_type_name(h->type);
    if (h->flags & NET_FLAG_REPLY) {
        if (member)
            return NULL;
        snprintf(why, n, "a reply (%s) from a key that never said HELLO", type);
        return why;
    }
    int control = h->type == NET_MSG_HELLO || h->type == NET_MSG_HEARTBEAT
                  || h->type == NET_MSG_BYE || h->type == NET_MSG_STATUS;
    if (!control)
        snprintf(why, n, "a %s request, which only the router sends", type);
    else if (h->ntensors > 0)
        snprintf(why, n, "a %s carrying %u tensor%s (%.0f bytes), which carries none", type,
                 h->ntensors, h->ntensors == 1 ? "" : "s", (double) engine_payload(m));
    else if (!member && h->type != NET_MSG_HELLO && h->type != NET_MSG_STATUS)
        snprintf(why, n, "a %s from a key that never said HELLO", type);
    else
        return NULL;
    return why;
}

void engine_on_message(swarm_engine_t *r, const net_peer_t *who, net_msg_t *m)
{
    const net_head_t *h = net_msg_head_const(m);
    int p = engine_peer_find(r, who);
    char note[64], why[160];
    if (s_unreadable(m, p >= 0, why, sizeof why)) {
        r->unreadable++; // counters.dropped_unread in swarm status
        if (engine_loud(r, who->key, note, sizeof note))
            engine_warn(r, "swarm router: %s from %.8s...: dropped unread%s\n", why, who->key, note);
        if (p >= 0 && strcmp(r->peers[p].who.conn, who->conn) == 0)
            s_flooding(r, p, h); // counts toward its flood limit (a reply would not)
        return;
    }
    msg_in_t e;
    engine_msg_decode(m, &e); // once, here: from now on fields, never text
    if (p >= 0 && h->type != NET_MSG_STATUS && strcmp(r->peers[p].who.conn, who->conn) != 0) {
        // a dead peer's key on a new connection speaks for it, unless the
        // old connection (a banned node, alive) is still heard from
        if (r->peers[p].state != P_DEAD || r->now_ms - r->peers[p].last_seen < s_rival_ms(&r->peers[p])) {
            s_on_rival(r, p, who, &e);
            return;
        }
        r->peers[p].who = *who;
    }
    if (p >= 0)
        r->peers[p].last_seen = r->now_ms;
    if (p >= 0 && s_flooding(r, p, h))
        return;
    if (h->type == NET_MSG_HELLO) {
        engine_on_hello(r, who, &e);
    } else if (h->type == NET_MSG_STATUS) {
        engine_status_reply(r, who, m);
    } else if (h->type == NET_MSG_HEARTBEAT) {
        s_on_heartbeat(r, p, &e);
    } else if (h->type == NET_MSG_BYE) {
        engine_peer_gone(r, p, "left (BYE)", "left (BYE)");
    } else if (h->flags & NET_FLAG_REPLY) {
        s_on_reply(r, p, &e);
    }
}
