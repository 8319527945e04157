/* engine_status.c - the STATUS reply: the run, its stages and its peers as
 * JSON (jansson), always valid, and within the meta a message may carry.
 * The document is docs/swarm.md "Status".
 */
#include "engine_int.h"

json_t *engine_json_num(double v, int decimals)
{
    if (!isfinite(v))
        return json_null();
    double scale = pow(10.0, decimals), rounded = round(v * scale) / scale;
    if (!isfinite(rounded))
        rounded = v; // v * scale overflowed
    if (decimals == 0 && fabs(rounded) < 9e15)
        return json_integer((json_int_t) rounded);
    return json_real(rounded);
}

// Text as a JSON string: kept as it is when it is valid UTF-8 (jansson
// escapes quotes and control codes), else as printable ASCII.
static json_t *s_json_text(const char *text)
{
    json_t *s = json_string(text);
    if (s)
        return s;
    char safe[256];
    snprintf(safe, sizeof safe, "%s", text);
    engine_sanitize(safe);
    return json_string(safe);
}

// Stage s's entry of "stages"; NULL out of memory.
static json_t *s_status_stage(const swarm_engine_t *r, int s)
{
    double tok = 0;
    int queue = 0;
    for (int p = 0; p < r->npeers; p++) {
        if (r->peers[p].state == P_READY && r->peers[p].stage == s) {
            tok += r->peers[p].tok_s;
            queue += r->peers[p].queue;
        }
    }
    double flops = r->stage_cost[s];
    return json_pack("{s:i, s:i, s:o, s:o, s:i, s:o, s:o}", "stage", s,
                     "replicas", engine_ready_count(r, s), "tok_s", engine_json_num(tok, 1),
                     "node_tok_s", engine_json_num(engine_stage_capacity(r, s), 1), "queue", queue,
                     "flops_per_token", engine_json_num(flops, 0),
                     "memory_need", r->stage_need[s] > 0 ? engine_json_num(r->stage_need[s], 0)
                                                         : json_null());
}

// A peer's entry of "peers"; NULL out of memory. An expelled peer's ban
// never ends: "banned_s" null and "expelled" true. Not `full`: its name
// (a hostname unless the node was told another) and key are null.
static json_t *s_status_peer(const peer_t *pe, int64_t now, int full)
{
    int dead = pe->state == P_DEAD, expelled = dead && isinf(pe->banned_until);
    double ban = dead ? pe->banned_until - (double) now / 1000.0 : 0.0;
    const char *state = pe->state == P_READY ? "ready"
                      : pe->state == P_JOINING ? (pe->moving ? "moving" : "joining")
                      : ban > 0 ? "banned" : "dead";
    json_t *known[6];
    const double bytes[6] = {pe->memory, pe->memory_used, pe->memory_heap, pe->rss, pe->rss_grown,
                             pe->device_used};
    for (int k = 0; k < 6; k++) // a node that never said: null
        known[k] = bytes[k] > 0 ? engine_json_num(bytes[k], 0) : json_null();
    return json_pack("{s:i, s:o, s:o, s:o, s:i, s:o, s:o, s:i, s:o, s:s, s:i, s:o, s:b, s:o, s:o, s:o, s:o, s:o, s:o, s:o}",
                     "id", pe->id, "name", full ? s_json_text(pe->name) : json_null(),
                     "key", full ? json_string(pe->who.key) : json_null(),
                     "device", s_json_text(pe->device), "stage", pe->stage,
                     "tok_s", engine_json_num(pe->tok_s, 1), "node_tok_s", engine_json_num(pe->node_tok_s, 1),
                     "inflight", pe->inflight,
                     "heartbeat_age_s", engine_json_num((double) (now - pe->last_seen) / 1000.0, 1),
                     "state", state, "failures", pe->failures,
                     "banned_s", expelled ? json_null() : engine_json_num(ban > 0 ? ban : 0.0, 0),
                     "expelled", expelled, "why", s_json_text(dead ? pe->why : ""),
                     "memory", known[0], "memory_used", known[1], "memory_heap", known[2],
                     "rss", known[3], "rss_grown", known[4], "device_used", known[5]);
}

// The run's counters (swarm status --serve's /metrics counts them up).
static json_t *s_status_counters(const swarm_engine_t *r)
{
    json_t *in = json_pack("{s:I, s:I, s:I}", "activations", (json_int_t) r->wire_in[W_ACTS],
                           "gradients", (json_int_t) r->wire_in[W_GRADS],
                           "state", (json_int_t) r->wire_in[W_STATE]);
    json_t *out = json_pack("{s:I, s:I, s:I}", "activations", (json_int_t) r->wire_out[W_ACTS],
                            "gradients", (json_int_t) r->wire_out[W_GRADS],
                            "state", (json_int_t) r->wire_out[W_STATE]);
    return json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:o, s:I, s:o, s:I, s:I, "
                     "s:o, s:o, s:I, s:I}",
                     "rollbacks", r->rollbacks, "restarts", r->restarts, "expelled",
                     r->expelled, "bans", r->bans, "checkpoints", r->checkpoints,
                     "checksum_mismatches", r->checksum_mismatches, "resyncs", r->resyncs,
                     "spot_checks", r->spot_checks, "audits", r->audits, "audit_caught",
                     r->audit_caught, "step_seconds", engine_json_num(r->train_time, 3),
                     "audited_steps", (json_int_t) r->audited_steps, "audited_step_seconds",
                     engine_json_num(r->audited_time, 3), "bytes_in", (json_int_t) r->bytes_in, "bytes_out",
                     (json_int_t) r->bytes_out, "wire_in", in, "wire_out", out, "status_refused",
                     (json_int_t) r->status_budget.refused, "dropped_unread",
                     (json_int_t) r->unreadable);
}

// The whole document, its history from cursor `since`; NULL out of memory.
// Not `full` (an open swarm's stranger): no peer's name or key, and no
// events of the log (they name peers); "names_hidden" says so.
static json_t *s_status_doc(const swarm_engine_t *r, uint64_t since, int full)
{
    double tps = engine_tok_s(r);
    int known = r->step > r->first; // a loss before the first step is not known
    json_t *doc = json_pack("{s:I, s:I, s:o, s:o, s:o, s:o, s:o, s:s, s:[], s:[], s:i}",
                            "step", (json_int_t) r->step, "iters", (json_int_t) r->hp.iters,
                            "loss", engine_json_num(known ? r->last_loss : NAN, 4),
                            "loss_avg", engine_json_num(known ? r->loss_avg : NAN, 4),
                            "tok_s", engine_json_num(tps, 1), "bound_tok_s", engine_json_num(engine_bound(r), 1),
                            "eta_s", engine_json_num(r->started && !r->done && tps > 0 ? engine_eta_s(r) : NAN, 1),
                            "state", r->done ? "done" : r->started ? "training" : "waiting",
                            "stages", "peers", "peers_omitted", 0);
    json_t *history = doc ? engine_history_json(r, since) : NULL;
    if (history && !full)
        json_array_clear(json_object_get(history, "events"));
    if (doc && (json_object_set_new(doc, "now_s", engine_json_num(engine_secs(r), 1)) < 0 ||
                json_object_set_new(doc, "counters", s_status_counters(r)) < 0 ||
                json_object_set_new(doc, "history", history) < 0 ||
                json_object_set_new(doc, "names_hidden", json_boolean(!full)) < 0)) {
        json_decref(doc);
        return NULL;
    }
    json_t *stages = json_object_get(doc, "stages"), *peers = json_object_get(doc, "peers");
    int rc = doc ? 0 : -1;
    for (int s = 0; rc == 0 && s < r->stages; s++)
        rc = json_array_append_new(stages, s_status_stage(r, s));
    int64_t now = r->now_ms;
    for (int p = 0; rc == 0 && p < r->npeers; p++)
        rc = json_array_append_new(peers, s_status_peer(&r->peers[p], now, full));
    if (rc != 0)
        json_decref(doc);
    return rc == 0 ? doc : NULL;
}

// doc as text of at most NET_META_MAX bytes (free it): when the peer table
// does not fit, peers are left off the end of "peers" and "peers_omitted"
// says how many. NULL when not even the table without peers fits, or out
// of memory.
static char *s_status_text(json_t *doc, size_t *len)
{
    json_t *peers = json_object_get(doc, "peers");
    size_t all = json_array_size(peers);
    for (;;) {
        char *text = json_dumps(doc, JSON_ENSURE_ASCII | JSON_REAL_PRECISION(15));
        size_t n = json_array_size(peers);
        *len = text ? strlen(text) : 0;
        if (!text || *len <= NET_META_MAX)
            return text;
        free(text);
        if (n == 0)
            return NULL;
        // leave off about the excess, at the average size of an entry (an
        // overestimate: the rest of the document counts in it), at least one
        size_t drop = (*len - NET_META_MAX) / (*len / n + 1) + 1;
        for (size_t k = 0; k < drop && k < n; k++)
            json_array_remove(peers, n - 1 - k);
        json_t *omitted = json_object_get(doc, "peers_omitted");
        json_integer_set(omitted, (json_int_t) (all - json_array_size(peers)));
    }
}

// A STATUS request's since=CURSOR (docs/swarm.md): only the history after
// it. 0 (all of it) when absent or not a cursor.
static uint64_t s_since(const net_msg_t *req)
{
    char text[24] = "", *end = NULL;
    if (net_msg_meta_get(req, "since", text, sizeof text) < 0 || text[0] < '0' || text[0] > '9')
        return 0;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    return errno || *end ? 0 : (uint64_t) v;
}

// A budget that refills at `rate` a second up to `burst`, as of now.
static double s_tokens_at(double tokens, int64_t at, int64_t now, double rate, double burst)
{
    double t = tokens + (double) (now - at) / 1000.0 * rate;
    return t < burst ? t : burst;
}

// 1 when a STATUS from key may be answered now (and spends from both the
// key's budget and everyone's), else 0.
static int s_budget_take(swarm_engine_t *r, const char *key)
{
    status_budget_t *b = &r->status_budget;
    int64_t now = r->now_ms;
    b->tokens = b->primed ? s_tokens_at(b->tokens, b->at, now, STATUS_RATE, STATUS_BURST) : STATUS_BURST;
    b->at = now;
    b->primed = 1;
    status_asker_t *a = NULL;
    for (int k = 0; k < STATUS_KEYS && !a; k++)
        a = !strcmp(b->askers[k].key, key) ? &b->askers[k] : NULL;
    if (!a) { // a new asker takes the entry of the one heard from longest ago
        a = &b->askers[b->next];
        b->next = (b->next + 1) % STATUS_KEYS;
        snprintf(a->key, sizeof a->key, "%s", key);
        a->tokens = STATUS_KEY_BURST;
        a->at = now;
    }
    a->tokens = s_tokens_at(a->tokens, a->at, now, STATUS_KEY_RATE, STATUS_KEY_BURST);
    a->at = now;
    if (a->tokens < 1.0 || b->tokens < 1.0) {
        b->refused++;
        return 0;
    }
    a->tokens -= 1.0;
    b->tokens -= 1.0;
    return 1;
}

void engine_status_reply(swarm_engine_t *r, const net_peer_t *who, const net_msg_t *req)
{
    if (!s_budget_take(r, who->key)) {
        net_msg_t *m = net_msg_reply(req, NET_MSG_ERROR);
        if (engine_meta(m, "reason=too many STATUS requests: the router answers %.0f a second "
                        "from one key, %.0f in all; ask again in a second", STATUS_KEY_RATE,
                        STATUS_RATE) == 0)
            s_ignore(engine_emit(r, who, &m));
        net_msg_destroy(&m);
        return;
    }
    // an open swarm's peer table is no stranger's business: names are
    // hostnames by default, and keys and events say who is in it
    int p = engine_peer_find(r, who);
    int full = !r->open_swarm || (p >= 0 && r->peers[p].state != P_DEAD)
            || (r->operator_key[0] && !strcmp(who->key, r->operator_key));
    json_t *doc = s_status_doc(r, s_since(req), full);
    size_t len = 0;
    char *text = doc ? s_status_text(doc, &len) : NULL;
    net_msg_t *m = net_msg_reply(req, text ? NET_MSG_STATUS : NET_MSG_ERROR);
    int rc = text ? net_msg_set_meta(m, text)
           : len > NET_META_MAX ? engine_meta(m, "reason=the status (%zu bytes without its peers) "
                                              "exceeds a message's %u bytes", len, NET_META_MAX)
           : engine_meta(m, "reason=out of memory building the status");
    if (rc != 0)
        net_msg_destroy(&m);
    else
        s_ignore(engine_emit(r, who, &m));
    free(text);
    json_decref(doc);
}
