/* engine_memory.c - the engine's memory: the bytes it holds now, counted by
 * walking its own structures (engine_memory), and the most it may hold, a
 * formula of the model, the step and the peers (engine_memory_bound), so
 * that a test can hold one to the other and a leak (a table that grows with
 * the requests ever sent or the peers ever seen) shows. Sizes are those
 * asked of malloc (capacities, not counts), without the allocator's own
 * overhead. What either function reads it does not change.
 */
#include "engine_int.h"

// ---- what the engine holds now ----

// Bytes micro-batch b holds besides its mb_t: its tokens and targets,
// each stage's input and output gradient as wire bytes (and the reply
// that carried them, which it keeps), its spot checks.
static size_t s_mb_bytes(const swarm_engine_t *r, const mb_t *b)
{
    size_t n = 0, acts = engine_acts_count(r);
    for (int s = 0; s <= r->stages; s++)
        if (b->in[s])
            n += (size_t) net_codec_bytes(net_msg_head_const(b->in[s])->tensors[0].dtype, acts)
                 + net_msg_overhead();
    n += (b->tokens ? r->tok_bytes : 0) + (b->targets ? r->tok_bytes : 0);
    for (int s = 0; s < r->stages; s++)
        if (b->dy[s])
            n += (size_t) net_codec_bytes(net_msg_head_const(b->dy[s])->tensors[0].dtype, acts)
                 + net_msg_overhead();
    if (b->spot) {
        n += (size_t) r->stages * sizeof *b->spot;
        for (int s = 0; s < r->stages; s++)
            for (int k = 0; k < 3; k++)
                n += b->spot[s].out[k] ? acts * sizeof(float) : 0;
    }
    return n;
}

size_t engine_memory(const swarm_engine_t *r)
{
    size_t n = sizeof *r, floats = 0;
    // the model's state, this step's sums, a checkpoint's parts, a reply decoded
    floats += r->params ? r->nparams : 0;
    floats += r->m ? r->nparams : 0;
    floats += r->v ? r->nparams : 0;
    floats += r->grad_sum ? r->nparams : 0;
    floats += r->ck_state ? 3 * r->nparams : 0;
    floats += r->scratch ? engine_acts_count(r) : 0;
    floats += r->audit_sum ? r->max_stage_n : 0;
    floats += r->audit_dx ? engine_acts_count(r) : 0;
    // each peer's gradient sum of this step, where one came (or a live peer keeps it)
    // and, as an audit's target in a dispute, its verifiers'
    for (int p = 0; p < r->npeers; p++) {
        floats += r->peers[p].grad ? r->max_stage_n : 0;
        floats += r->peers[p].audit_sums ? (AUDIT_VOTERS - 1) * r->max_stage_n : 0;
    }
    n += floats * sizeof(float);
    if (r->mbs) {
        n += (size_t) r->G * sizeof *r->mbs;
        for (int i = 0; i < r->G; i++)
            n += s_mb_bytes(r, &r->mbs[i]);
    }
    // the peer table and the scratch sized with it, the index by key, the ready lists
    n += (size_t) r->peers_cap * (sizeof *r->peers + sizeof *r->views + sizeof *r->by_peer
                                 + sizeof *r->owed);
    n += (size_t) r->key_cap * sizeof *r->key_index;
    n += (size_t) r->audit_cand_cap * sizeof *r->audit_cand;
    n += (size_t) r->joining.cap * sizeof *r->joining.peer;
    for (int s = 0; s < SWARM_MAX_STAGES; s++)
        n += (size_t) (r->ready[s].cap + r->audited[s].cap + r->route[s].unmeasured.cap)
                 * sizeof *r->ready[s].peer
             + (r->route[s].view ? (size_t) r->ready[s].cap * (sizeof *r->route[s].view + sizeof(int))
                                 : 0); // (and its rows' order)
    // the request table: its blocks, the pointers to them, the free list (as
    // long as the blocks); a request holds no payload (its message is sent)
    size_t blocks = ((size_t) r->req_slots + REQ_BLOCK - 1) / REQ_BLOCK;
    n += blocks * (sizeof *r->req_blocks + REQ_BLOCK * (sizeof(req_t) + sizeof *r->req_free));
    // the history STATUS carries: fixed in size (the STATUS document and
    // every message are freed before the call that made them returns; the
    // log limiter lives in the engine's struct)
    n += engine_history_size();
    return n;
}

// ---- the most it may hold ----

// The capacity a table that starts at `first` and doubles when full has
// once it holds n.
static size_t s_doubled(size_t first, size_t n)
{
    size_t cap = first;
    while (cap < n)
        cap *= 2;
    return cap;
}

// Requests in flight at once, at most, with `peers` as for
// engine_memory_bound. Every request is to a peer not dead (a death frees
// its requests), and nodes serve in order (node/daemon.c; one that sits on
// a request is failed at its deadline, which frees it):
//   FWD/BWD of the step's chain   G: one a micro-batch (window <= G)
//   the last step's, left over    G: a stage applying its own update hands
//                                 the next step its backwards still in flight
//   work a dead peer held, redone G * S: one a micro-batch and stage
//   spot checks (VERIFY)          G * S: one open check a micro-batch and stage
//   audits (audit FWD/BWD, STEP)  G * S + peers: a verifier at a time for each sum,
//                                 holding at most its share and a STEP
//   STEP, or a waited-for UPDATE, or DISCARD   one a peer
//   UPDATE the next step does not wait for     one a peer
//   a joiner's state (STATE_GET, then STATE)   one a peer (a joiner's counts)
//   a stage's own update's STEP   1, a checkpoint's STATE_GET S (one a stage)
// (probes are HEARTBEATs, not requests.)
static size_t s_requests_max(const swarm_engine_t *r, size_t peers)
{
    size_t G = (size_t) r->G, S = (size_t) r->stages;
    return G * (2 + 3 * S) + 4 * peers + 1 + S;
}

// A bound of the bytes engine_memory counts. live_peers: the most peers
// the engine has had to keep at once so far, which its caller counts
// without looking inside: those connected (until the engine finds them
// gone), those banned (the log says so, and STATUS), and those that died
// during the step in progress with a part in it (their entry is kept to
// its end). The tables keep the room of their busiest moment (entries are
// named by index everywhere, so the peer table cannot move them down), so
// for a swarm that shrinks this is its size at the largest.
size_t engine_memory_bound(const swarm_engine_t *r, int live_peers)
{
    size_t P = live_peers > 0 ? (size_t) live_peers : 0, S = (size_t) r->stages;
    size_t G = (size_t) r->G, N = r->nparams, A = engine_acts_count(r) * sizeof(float);
    size_t n = sizeof *r;
    // params, m, v, grad_sum; a checkpoint's params, m, v once one is taken;
    // the scratch a reply is decoded in; an audit's sum and input gradient
    n += (4 + (r->o.save ? 3 : 0)) * N * sizeof(float) + 2 * A + r->max_stage_n * sizeof(float);
    // each micro-batch: its struct, tokens and targets, an input to each
    // stage after the first and an output gradient to each before the last
    // (wire bytes: at most f32, with the reply that carried them), a spot
    // check at each stage, with three outputs at each stage but the last
    // (which checks losses)
    n += G * (sizeof(mb_t) + 2 * r->tok_bytes + 2 * (S - 1) * (A + net_msg_overhead())
              + S * sizeof(spot_t) + 3 * (S - 1) * A);
    // the peer table (with views, scratch, owed and the audits' hand-out
    // scratch, as large as the table when made) and its index by key: a new
    // entry is made only when fewer than PEERS_KEEP_DEAD are dead or none of
    // the dead can be reused (banned, or with a part in the step), so it
    // holds at most P + PEERS_KEEP_DEAD; the index, at most half full, is
    // rebuilt at 4 slots an entry
    size_t entries = P + PEERS_KEEP_DEAD;
    n += s_doubled(16, entries)
         * (sizeof(peer_t) + sizeof(swarm_peer_view_t) + sizeof(double) + sizeof(int)
            + sizeof(audit_cand_t));
    n += s_doubled(64, 4 * (entries + 1)) * sizeof(int);
    // each stage's ready peers (none of them dead) with their routing rows
    // and those not measured yet, and those whose audit was wanted (ready
    // when it was)
    n += S * s_doubled(8, P) * (3 * sizeof(int) + sizeof(swarm_peer_view_t));
    n += s_doubled(8, entries) * sizeof(int); // the joining peers
    // gradient sums: a peer's buffer (the largest stage's size) lives while
    // it does, and a dead one's only to the end of the step its sum is in;
    // as an audit's target in a dispute, a live one's copies of its
    // verifiers' sums (kept for its life)
    n += AUDIT_VOTERS * P * r->max_stage_n * sizeof(float);
    // the request table: a slot is made only when none is free, so it holds
    // the most in flight at once, in whole blocks
    size_t blocks = (s_requests_max(r, P) + REQ_BLOCK - 1) / REQ_BLOCK;
    n += blocks * (sizeof(req_t *) + REQ_BLOCK * (sizeof(req_t) + sizeof(int)));
    return n + engine_history_size();
}
