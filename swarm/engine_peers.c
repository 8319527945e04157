/* engine_peers.c - the peer table: HELLO, admission to a stage, the
 * entries of the dead and their reuse, and joiners getting their stage's
 * state. Each stage's ready peers and the views the policy sees:
 * engine_route.c; deaths and bans: engine_fail.c.
 */
#include "engine_int.h"

#include <assert.h>

int engine_joining_to(const swarm_engine_t *r, int stage)
{
    for (int k = 0; k < r->joining.n; k++)
        if (r->peers[r->joining.peer[k]].stage == stage)
            return 1;
    return 0;
}

// Send a stage's state (params, m, v of the stage) to peer p.
static int s_send_state(swarm_engine_t *r, int p, const float *params, const float *m, const float *v)
{
    int s = r->peers[p].stage;
    uint32_t dims[1] = { (uint32_t) r->stage_n[s] };
    size_t off = r->stage_off[s];
    net_msg_t *msg = net_msg_new(NET_MSG_STATE);
    net_head_t *h = net_msg_head(msg);
    h->stage = (uint32_t) s;
    h->step = (uint64_t) r->step;
    const float *parts[3] = { params + off, m + off, v + off };
    for (int i = 0; i < 3; i++) {
        int rc = net_msg_add_tensor(msg, NET_DTYPE_F32, dims, 1, parts[i]);
        if (rc != 0) {
            net_msg_destroy(&msg);
            return rc;
        }
    }
    return engine_send(r, p, &msg, R_STATE, -1, s);
}

// Assign peer p to `stage` (as the answer to req, or unasked when NULL);
// its state follows between steps (engine_joins). 0 or -errno.
int engine_send_assign(swarm_engine_t *r, int p, int stage, const net_msg_t *req)
{
    peer_t *pe = &r->peers[p];
    net_msg_t *a = req ? net_msg_reply(req, NET_MSG_ASSIGN) : net_msg_new(NET_MSG_ASSIGN);
    net_msg_head(a)->stage = (uint32_t) stage;
    net_msg_head(a)->step = (uint64_t) r->step;
    const swarm_shape_t *c = &r->hp.cfg;
    int rc = engine_meta(a, "V=%d\nT=%d\nC=%d\nL=%d\nH=%d\nS=%d\nstage=%d\nmicro=%d\npeer=%d\n"
                         "beat_ms=%d\nwire=%s\ngrad_wire=%s\n%s%s%s", c->V, c->T, c->C, c->L, c->H,
                         r->stages, stage, r->hp.micro, pe->id, r->beat_ms, net_dtype_name(r->wire),
                         net_dtype_name(r->grad_wire), r->cut[0] ? "cut=" : "", r->cut,
                         r->cut[0] ? "\n" : "");
    if (rc == 0 && (rc = engine_emit(r, &pe->who, &a)) != 0) {
        pe->failed = r->failed_any = 1; // not connected: engine_reap finds it dead
        engine_route_touch(r, p);
    }
    net_msg_destroy(&a);
    if (rc != 0)
        return rc;
    engine_peer_state(r, p, P_JOINING); // out of its old stage's ready peers, if it was one
    pe->stage = stage;
    pe->beat_ms = r->beat_ms;
    pe->no_fit = 0;
    engine_member_line(r, p, 0, "swarm router: peer %d (%s, %s) joins stage %d\n", pe->id, pe->name,
                       pe->device, stage);
    return 0;
}

int swarm_beat_ms(const net_msg_t *m, char *said, size_t cap)
{
    char text[16], *end = NULL;
    int rc = net_msg_meta_get(m, "beat_ms", text, sizeof text);
    if (rc == -ENOENT)
        return 0;
    if (said && cap) {
        snprintf(said, cap, "%s", rc == 0 ? text : "(too long to be one)");
        for (char *c = said; *c; c++)
            *c = (unsigned char) *c < 0x20 || *c == 0x7f ? '?' : *c;
    }
    long ms = rc == 0 ? strtol(text, &end, 10) : -1;
    return rc == 0 && end != text && !*end && ms >= BEAT_MS && ms <= 60000 ? (int) ms : -1;
}

int engine_cmp_double(const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

double engine_median(double *v, int n)
{
    int k = n / 2, lo = 0, hi = n - 1;
    // Hoare's selection, the middle of three as the pivot; values ordered
    // to defeat the pivot (speeds peers claim are among them) are sorted
    // once 64 rounds have not found it
    for (int round = 0; lo < hi; round++) {
        if (round == 64) {
            qsort(v + lo, (size_t) (hi - lo + 1), sizeof *v, engine_cmp_double);
            break;
        }
        int mid = lo + (hi - lo) / 2;
        double a = v[lo], b = v[mid], c = v[hi];
        double pivot = a < b ? (b < c ? b : a < c ? c : a) : (a < c ? a : b < c ? c : b);
        int i = lo, j = hi;
        while (i <= j) {
            while (v[i] < pivot)
                i++;
            while (v[j] > pivot)
                j--;
            if (i <= j) {
                double t = v[i];
                v[i++] = v[j];
                v[j--] = t;
            }
        }
        if (k <= j)
            hi = j;
        else if (k >= i)
            lo = i;
        else
            break; // v[j+1 .. i-1] all equal the pivot
    }
    return v[k];
}

// What the measured ready replicas of stage s measure over what they
// claimed at start, into ratio[] from ratio[n]: the new n.
static int s_claims_worth(const swarm_engine_t *r, int s, double *ratio, int n)
{
    const engine_ready_t *l = &r->ready[s];
    for (int k = 0; k < l->n; k++) {
        const peer_t *pe = &r->peers[l->peer[k]];
        if (pe->samples > 0 && pe->hello_tok_s > 0.0)
            ratio[n++] = pe->tok_s / pe->hello_tok_s;
    }
    return n;
}

void engine_route_ratios(swarm_engine_t *r)
{
    double *ratio = r->by_peer; // scratch
    for (int s = 0; s < r->stages; s++) {
        engine_route_t *rt = &r->route[s];
        int n = s_claims_worth(r, s, ratio, 0);
        double was = rt->ratio;
        rt->ratio = n ? engine_median(ratio, n) : 0.0;
        if (rt->ratio != was && rt->unmeasured.n > 0) {
            rt->gen++; // its unmeasured rows read differently now
            rt->rows_fastest = -1.0;
        }
    }
}

// A joiner's speed in the router's units (training tokens/s on a stage,
// see engine_work_done): what it measured at start, scaled by how the measured
// peers' speeds compare with what they measured at start (the median, so
// that one peer's false claim does not skew it).
static double s_hello_speed(const swarm_engine_t *r, double hello)
{
    double *ratio = r->by_peer; // scratch
    int n = 0;
    for (int s = 0; s < r->stages; s++)
        n = s_claims_worth(r, s, ratio, n);
    if (!n)
        return hello;
    return hello * engine_median(ratio, n);
}

// Peer p can hold no stage of the plan in the memory it has: it is told
// (a notice: it waits, and asks again with its next HELLO), the log says so
// once, and its entry waits as dead, with no ban, so its next HELLO is
// judged again.
static void s_no_stage_fits(swarm_engine_t *r, int p, const net_msg_t *req)
{
    peer_t *pe = &r->peers[p];
    int small = 0;
    for (int s = 1; s < r->stages; s++)
        small = r->stage_need[s] < r->stage_need[small] ? s : small;
    char why[96];
    snprintf(why, sizeof why, "holds no stage: its memory %.1f MiB < the %.1f MiB of stage %d",
             pe->memory / 1048576.0, r->stage_need[small] / 1048576.0, small);
    net_msg_t *m = req ? net_msg_reply(req, NET_MSG_ERROR) : net_msg_new(NET_MSG_ERROR);
    if (engine_meta(m, "reason=no stage of this swarm fits your --memory %.1f MiB: the smallest, "
                    "stage %d of %d, needs %.1f MiB (its state, a micro-batch's activations, "
                    "buffers); this node waits: start it with --memory %.0fM or more if the "
                    "machine has it\nnotice=1", pe->memory / 1048576.0, small, r->stages,
                    r->stage_need[small] / 1048576.0, ceil(r->stage_need[small] / 1048576.0)) == 0)
        s_ignore(engine_emit(r, &pe->who, &m));
    net_msg_destroy(&m);
    if (pe->state != P_DEAD)
        engine_peer_dead(r, p, why); // (its first time: the line)
    pe->banned_until = engine_secs(r);
    pe->no_fit = 1;
    snprintf(pe->why, sizeof pe->why, "%s", why);
}

void engine_admit(swarm_engine_t *r, int p, int stage, const net_msg_t *req)
{
    peer_t *pe = &r->peers[p];
    pe->failed = 0;
    pe->tok_s = s_hello_speed(r, pe->hello_tok_s);
    engine_speed_restart(pe, r->now_ms);
    if (stage >= 0) {
        s_ignore(engine_send_assign(r, p, stage, req));
        return;
    }
    swarm_peer_view_t *views = r->views;
    engine_views_as(r, views, 0);
    // the stages weighed as the bound and rebalancing weigh them: a ready
    // peer at what it sustains on its stage, a newcomer still joining at
    // its first guess (s_hello_speed: of a stage of the stages' mean cost)
    // on its stage (unscaled when the costs are unknown)
    double mean = 0.0;
    for (int k = 0; k < r->stages; k++)
        mean += r->stage_cost[k] / r->stages;
    for (int q = 0; q < r->npeers; q++) {
        const peer_t *pq = &r->peers[q];
        double cost = pq->stage >= 0 ? r->stage_cost[pq->stage] : 0.0;
        if (q != p && pq->state == P_READY)
            views[q].tok_s = engine_bound_speed(pq);
        else if (q != p && pq->state == P_JOINING && pq->samples == 0 && !pq->moving
                 && mean > 0.0 && cost > 0.0)
            views[q].tok_s = pq->tok_s * mean / cost;
    }
    swarm_peer_view_t me = views[p];
    stage = r->assign_even ? swarm_policy_assign_even(views, r->npeers, r->stages, r->stage_need, &me)
                           : swarm_policy_assign(views, r->npeers, r->stages, r->stage_need, &me);
    if (stage < 0) {
        s_no_stage_fits(r, p, req);
        return;
    }
    s_ignore(engine_send_assign(r, p, stage, req));
}

// The step's gradient sums are being gathered: a dead peer's sum that came
// in counts in its stage's update (engine_on_dead_peer, engine_backs).
static int s_sums_open(const swarm_engine_t *r)
{
    return r->phase == PH_MB || r->phase == PH_GRAD;
}

// A peer the router declared dead talks again (HELLO or HEARTBEAT; e NULL:
// it did so while its sum counted): once its ban is over it joins again,
// with fresh state; until then it is told once why it waits. One whose
// gradient sum came in before it died waits while the step's sums are
// gathered too: its sum counts in its stage's update (its micro-batches
// are not redone), and joining would give its entry, sum and all, another
// stage. It is heard once they are in (engine_backs).
void engine_on_dead_peer(swarm_engine_t *r, int p, const msg_in_t *e)
{
    peer_t *pe = &r->peers[p];
    double now = engine_secs(r);
    if (pe->got_grad && s_sums_open(r)) {
        pe->back_waits = 1;
        r->backs_waiting = 1;
        return;
    }
    pe->back_waits = 0;
    if (now >= pe->banned_until) {
        if (!pe->no_fit) // (one that fits no stage asks again quietly)
            engine_member_line(r, p, 0, "swarm router: peer %d (%s) is back after it %s; it joins "
                               "again\n", pe->id, pe->name, pe->why);
        engine_admit(r, p, -1, e && e->head->type == NET_MSG_HELLO ? e->msg : NULL);
    } else if (!pe->ban_told) {
        net_msg_t *err = net_msg_new(NET_MSG_ERROR);
        int rc = isinf(pe->banned_until)
                 ? engine_meta(err, "reason=expelled for the run: it %s", pe->why)
                 : engine_meta(err, "reason=banned for %.0f s more: it %s", pe->banned_until - now, pe->why);
        if (rc == 0)
            s_ignore(engine_emit(r, &pe->who, &err));
        net_msg_destroy(&err);
        pe->ban_told = 1;
    }
}

// The dead peers that spoke while their sums counted, heard once the
// step's sums are in, or void, or a new step began (engine_turn,
// engine_step_begin, before its phase is the gathering's).
void engine_backs(swarm_engine_t *r)
{
    if (!r->backs_waiting || s_sums_open(r))
        return;
    r->backs_waiting = 0;
    for (int p = 0; p < r->npeers; p++) {
        if (!r->peers[p].back_waits)
            continue;
        if (r->peers[p].state == P_DEAD)
            engine_on_dead_peer(r, p, NULL);
        else
            r->peers[p].back_waits = 0;
    }
}

// Peer p's entry is named by the current step: gradient work it holds or
// sent, its part in STEP or UPDATE, a request in flight. (A forward it ran
// may name it too: the backward then goes to whoever takes the entry,
// which recomputes, as any replica can.)
static int s_peer_in_step(const swarm_engine_t *r, int p)
{
    const peer_t *pe = &r->peers[p];
    if (pe->got_grad || pe->in_step || pe->self_to || pe->inflight > 0 || r->self_peer == p)
        return 1;
    for (int i = 0; r->mbs && i < r->G; i++)
        for (int s = 0; s < r->stages; s++)
            if (r->mbs[i].grad_peer[s] == p)
                return 1;
    return 0;
}

// An entry for a new peer: that of the peer dead longest whose ban is over
// and that has no part in this step, once PEERS_KEEP_DEAD entries are
// dead (a dead peer's entry keeps its ban and its back-off, should it
// return), else a new one. -ENOMEM.
static int s_peer_slot(swarm_engine_t *r)
{
    int best = -1, dead = 0;
    double now = engine_secs(r);
    for (int p = 0; p < r->npeers; p++) {
        const peer_t *pe = &r->peers[p];
        if (pe->state != P_DEAD)
            continue;
        dead++;
        if (pe->banned_until <= now && (best < 0 || pe->last_seen < r->peers[best].last_seen)
            && !s_peer_in_step(r, p)) // (a scan of the step's micro-batches: last)
            best = p;
    }
    if (best >= 0 && dead >= PEERS_KEEP_DEAD) {
        free(r->peers[best].grad);
        free(r->peers[best].audit_sums);
        engine_key_del(r, best);
        return best;
    }
    if (r->npeers == r->peers_cap) {
        int cap = r->peers_cap ? 2 * r->peers_cap : 16;
        peer_t *peers = realloc(r->peers, (size_t) cap * sizeof *peers);
        if (peers)
            r->peers = peers;
        swarm_peer_view_t *views = peers ? realloc(r->views, (size_t) cap * sizeof *views) : NULL;
        if (views)
            r->views = views;
        double *by_peer = views ? realloc(r->by_peer, (size_t) cap * sizeof *by_peer) : NULL;
        if (by_peer)
            r->by_peer = by_peer;
        int *owed = by_peer ? realloc(r->owed, (size_t) cap * sizeof *owed) : NULL;
        if (!owed)
            return -ENOMEM;
        memset(owed + r->peers_cap, 0, (size_t) (cap - r->peers_cap) * sizeof *owed);
        r->owed = owed;
        r->peers_cap = cap;
    }
    return r->npeers++;
}

// A HELLO: check the protocol, assign a stage, answer ASSIGN. The state
// follows when the swarm is between steps (engine_joins).
void engine_on_hello(swarm_engine_t *r, const net_peer_t *who, const msg_in_t *e)
{
    const msg_hello_t *hello = &e->hello;
    char note[64];
    if (!hello->proto_ok) {
        const char *proto = hello->proto;
        net_msg_t *err = net_msg_reply(e->msg, NET_MSG_ERROR);
        engine_meta(err, "reason=protocol version %s, router speaks 1; upgrade swarm", proto[0] ? proto : "?");
        if (engine_loud(r, who->key, note, sizeof note))
            engine_warn(r, "swarm router: refused %.8s...: protocol version %s, not 1%s\n",
                        who->key, proto[0] ? proto : "missing", note);
        s_ignore(engine_emit(r, who, &err));
        return;
    }
    int p = engine_peer_find(r, who);
    if (p < 0) {
        if ((p = s_peer_slot(r)) < 0) {
            engine_warn(r, "swarm router: out of memory for the peer table (%d peers); "
                        "ignoring %s\n", r->npeers, hello->name);
            return;
        }
        r->peers[p] = (peer_t) { .who = *who, .id = ++r->next_peer_id, .stage = -1, .moved_at = -1e30,
                                 .audit_of = -1 };
        if (engine_key_put(r, p) != 0) {
            engine_warn(r, "swarm router: out of memory for the peer index (%d peers); "
                        "ignoring %s\n", r->npeers, hello->name);
            engine_peer_state(r, p, P_DEAD); // an entry no message can reach, reused later
            return;
        }
    }
    peer_t *pe = &r->peers[p];
    snprintf(pe->name, sizeof pe->name, "%s", hello->name);
    snprintf(pe->device, sizeof pe->device, "%s", hello->device);
    pe->hello_tok_s = hello->has_tok_s ? hello->tok_s : 1000.0;
    pe->memory = hello->memory;
    pe->last_seen = r->now_ms;
    engine_route_touch(r, p);
    if (pe->state == P_READY || pe->state == P_JOINING)
        return; // a repeated HELLO: the ASSIGN is on its way
    if (pe->state == P_DEAD)
        engine_on_dead_peer(r, p, e);
    else
        engine_admit(r, p, -1, e->msg);
}

int engine_state_source(const swarm_engine_t *r, int s, double draw)
{
    const engine_ready_t *l = &r->ready[s];
    int n = l->n, from = -1;
    for (int k = 0; k < n; k++) { // from the drawn one on
        int p = l->peer[((int) (draw * n) + k) % n];
        const peer_t *pe = &r->peers[p];
        if (pe->failed || (from >= 0 && pe->state_missed >= r->peers[from].state_missed))
            continue;
        from = p;
        if (pe->state_missed == 0)
            break;
    }
    return from;
}

// Between steps: hand joining peers their stage's state, from the router's
// own copy before training starts, else from a ready replica (STATE_GET).
void engine_joins(swarm_engine_t *r)
{
    for (int k = 0; k < r->joining.n; k++) { // (what it sends changes no peer's state)
        int p = r->joining.peer[k];
        peer_t *pe = &r->peers[p];
        if (pe->inflight > 0)
            continue;
        if (!r->started) {
            s_ignore(s_send_state(r, p, r->params, r->m, r->v));
            continue;
        }
        // a ready replica drawn with the run's secret key: a liar cannot make
        // itself the source (and the state is checked against its checksum)
        int from = engine_state_source(r, pe->stage, engine_draw(r, DRAW_SOURCE, pe->stage, pe->id));
        if (from >= 0) {
            net_msg_t *g = net_msg_new(NET_MSG_STATE_GET);
            net_msg_head(g)->stage = (uint32_t) pe->stage;
            // the reply is forwarded to the joiner: remember it in mb. Held
            // until its state arrives; a send that failed holds nothing (the
            // replica is found dead, and the joiner asks again)
            if (engine_send(r, from, &g, R_STATE_GET, p, pe->stage) == 0)
                pe->inflight++;
        }
    }
}

// What stage s's ready replicas say they sustain together (their HEARTBEATs).
double engine_stage_capacity(const swarm_engine_t *r, int s)
{
    double tok = 0.0;
    for (int k = 0; k < r->ready[s].n; k++) {
        const peer_t *pe = &r->peers[r->ready[s].peer[k]];
        tok += engine_bound_speed(pe);
    }
    return tok;
}

// The swarm's bound: the least, over stages, of what the stage's replicas
// sustain together; no schedule can beat it.
double engine_bound(const swarm_engine_t *r)
{
    double low = -1.0;
    for (int s = 0; s < r->stages; s++) {
        double t = engine_stage_capacity(r, s);
        low = low < 0 || t < low ? t : low;
    }
    return low > 0 ? low : 0.0;
}
