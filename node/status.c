/* status.c - the router's STATUS document as `swarm status` reads it and
 * shows it (the tables), and as the dashboard reads it (node_status_load);
 * the command itself is cmd_status.c.
 *
 * The reply comes from the network: jansson parses it (at most NET_META_MAX
 * bytes, STATUS_DEPTH_MAX deep, nothing but JSON: no inf or nan), then the
 * fields of docs/swarm.md are read with their types checked; what a newer
 * router adds is ignored. It does not change anything in the swarm: STATUS
 * is read-only.
 */
#include "node.h"
#include "net.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define STATUS_STAGES_MAX 256   // stages kept for the table
#define STATUS_PEERS_MAX 1024   // peers kept for the table (the rest are counted)
#define STATUS_DEPTH_MAX 16     // arrays and objects nested, the document's own included
#define STATUS_TEXT_MAX 64      // bytes kept of a string field
#define STATUS_HISTORY_MAX 65536 // points or events of one "history" series

// ---- the status, as parsed -------------------------------------------------

typedef struct {
    double stage;                   // stage index (NAN when absent)
    double replicas;                // peers serving it
    double tok_s;                   // tokens per second, sum over replicas
    double node_tok_s;              // what its replicas say they sustain, summed
    double queue;                   // requests waiting
    double memory_need;             // bytes a node holds for it (NAN: not said)
} status_stage_t;

typedef struct {
    double id;                      // the router's small peer id
    char name[STATUS_TEXT_MAX];     // --name of the node, printable ASCII
    char key[STATUS_TEXT_MAX];      // Z85 public key
    char device[STATUS_TEXT_MAX];   // e.g. "cpu: 1 thread"
    double stage;                   // stage it serves
    double tok_s;                   // tokens per second, EMA
    double inflight;                // requests sent to it, not yet answered
    double heartbeat_age_s;         // seconds since its last heartbeat
    double failures;                // requests it failed
    double banned_s;                // seconds of its ban still to run (NAN: null)
    double memory;                  // bytes it may hold for its stage (NAN: not said)
    double memory_used;             // bytes its stage holds, as it counts them (NAN: not said)
    int expelled;                   // banned for the run: its ban never ends
    char state[STATUS_TEXT_MAX];    // joining, ready, moving, banned, dead
    char why[96];                   // why it is dead or banned
} status_peer_t;

typedef struct {
    double step;                    // optimizer steps done
    double iters;                   // steps in the schedule
    double loss;                    // loss of the last step
    double loss_avg;                // moving average of the loss
    double tok_s;                   // tokens per second of the swarm
    double bound_tok_s;             // the least over stages of what its replicas sustain
    double eta_s;                   // seconds to the end of this run (--steps, else iters)
    char state[STATUS_TEXT_MAX];    // waiting, training, done
    status_stage_t stages[STATUS_STAGES_MAX]; // nstages used
    size_t nstages;                 // stages kept
    size_t stages_dropped;          // stages beyond STATUS_STAGES_MAX
    status_peer_t peers[STATUS_PEERS_MAX];    // npeers used
    size_t npeers;                  // peers kept
    size_t peers_dropped;           // peers beyond STATUS_PEERS_MAX, and peers_omitted
    int names_hidden;               // an open swarm's router hid names and keys from us
} status_t;

// ---- reading the document (jansson) -------------------------------------------

// What a JSON value is, for an error.
static const char *s_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER:
    case JSON_REAL: return "a number";
    case JSON_TRUE: return "true";
    case JSON_FALSE: return "false";
    default: return "null";
    }
}

// 1 when v nests more than `levels` arrays and objects deep (v itself counts).
static int s_too_deep(json_t *v, int levels)
{
    if (!json_is_object(v) && !json_is_array(v))
        return 0;
    if (levels == 0)
        return 1;
    const char *key;
    json_t *item;
    size_t i;
    if (json_is_array(v)) {
        json_array_foreach(v, i, item)
            if (s_too_deep(item, levels - 1))
                return 1;
    } else {
        json_object_foreach(v, key, item)
            if (s_too_deep(item, levels - 1))
                return 1;
    }
    return 0;
}

// Field key of object `in` (where: "" at the top, or e.g. "\"peers\"[3]: ")
// as a number into *out: absent keeps *out, null is NAN. 0; -EPROTO with
// the field and what it holds in err.
static int s_num(const json_t *in, const char *where, const char *key, double *out, char *err,
                 size_t errlen)
{
    const json_t *v = json_object_get(in, key);
    if (v && !json_is_null(v) && !json_is_number(v)) {
        snprintf(err, errlen, "%s\"%s\" is %s, not a number", where, key, s_kind(v));
        return -EPROTO;
    }
    if (v)
        *out = json_is_number(v) ? json_number_value(v) : NAN;
    return 0;
}

// Field key as text into out (cap bytes, NUL-terminated, truncated to fit):
// absent or null is "". Printable ASCII only, one '?' for each other
// character, so that no peer can write control codes to a terminal.
static int s_str(const json_t *in, const char *where, const char *key, char *out, size_t cap,
                 char *err, size_t errlen)
{
    const json_t *v = json_object_get(in, key);
    if (v && !json_is_null(v) && !json_is_string(v)) {
        snprintf(err, errlen, "%s\"%s\" is %s, not a string", where, key, s_kind(v));
        return -EPROTO;
    }
    const unsigned char *s = (const unsigned char *) (v ? json_string_value(v) : NULL);
    size_t len = s ? json_string_length(v) : 0, n = 0;
    for (size_t i = 0; i < len && n + 1 < cap; i++)
        if (s[i] < 0x80 || s[i] >= 0xc0) // UTF-8: a continuation byte is no character
            out[n++] = s[i] >= 0x20 && s[i] < 0x7f ? (char) s[i] : '?';
    out[n] = '\0';
    return 0;
}

// Field key as true or false into *out: absent or null is 0.
static int s_bool(const json_t *in, const char *where, const char *key, int *out, char *err,
                  size_t errlen)
{
    const json_t *v = json_object_get(in, key);
    if (v && !json_is_null(v) && !json_is_boolean(v)) {
        snprintf(err, errlen, "%s\"%s\" is %s, not true or false", where, key, s_kind(v));
        return -EPROTO;
    }
    *out = json_is_true(v);
    return 0;
}

static int s_stage_read(const json_t *in, const char *where, status_stage_t *s, char *err,
                        size_t errlen)
{
    *s = (status_stage_t) {NAN, NAN, NAN, NAN, NAN, NAN};
    struct { const char *key; double *v; } nums[] = {
        {"stage", &s->stage}, {"replicas", &s->replicas}, {"tok_s", &s->tok_s},
        {"node_tok_s", &s->node_tok_s}, {"queue", &s->queue}, {"memory_need", &s->memory_need},
    };
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
        if (s_num(in, where, nums[i].key, nums[i].v, err, errlen) < 0)
            return -EPROTO;
    return 0;
}

static int s_peer_read(const json_t *in, const char *where, status_peer_t *p, char *err,
                       size_t errlen)
{
    *p = (status_peer_t) {.id = NAN, .stage = NAN, .tok_s = NAN, .inflight = NAN,
                          .heartbeat_age_s = NAN, .failures = NAN, .banned_s = NAN,
                          .memory = NAN, .memory_used = NAN};
    struct { const char *key; double *v; } nums[] = {
        {"id", &p->id}, {"stage", &p->stage}, {"tok_s", &p->tok_s},
        {"inflight", &p->inflight}, {"heartbeat_age_s", &p->heartbeat_age_s},
        {"failures", &p->failures}, {"banned_s", &p->banned_s}, {"memory", &p->memory},
        {"memory_used", &p->memory_used},
    };
    struct { const char *key; char *s; size_t cap; } strs[] = {
        {"name", p->name, sizeof p->name}, {"key", p->key, sizeof p->key},
        {"device", p->device, sizeof p->device}, {"state", p->state, sizeof p->state},
        {"why", p->why, sizeof p->why},
    };
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
        if (s_num(in, where, nums[i].key, nums[i].v, err, errlen) < 0)
            return -EPROTO;
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++)
        if (s_str(in, where, strs[i].key, strs[i].s, strs[i].cap, err, errlen) < 0)
            return -EPROTO;
    return s_bool(in, where, "expelled", &p->expelled, err, errlen);
}

// "stages" (is_peers 0) or "peers" of the document into st: absent or null
// is no table; each entry an object. 0 or -EPROTO with err.
static int s_table_read(const json_t *doc, int is_peers, status_t *st, char *err, size_t errlen)
{
    const char *name = is_peers ? "peers" : "stages";
    const json_t *table = json_object_get(doc, name), *entry;
    if (!table || json_is_null(table))
        return 0;
    if (!json_is_array(table)) {
        snprintf(err, errlen, "\"%s\" is %s, not an array", name, s_kind(table));
        return -EPROTO;
    }
    size_t i;
    json_array_foreach(table, i, entry) {
        char where[48];
        snprintf(where, sizeof where, "\"%s\"[%zu]: ", name, i);
        if (!json_is_object(entry)) {
            snprintf(err, errlen, "\"%s\"[%zu] is %s, not an object", name, i, s_kind(entry));
            return -EPROTO;
        }
        status_stage_t stage;
        status_peer_t peer;
        int rc = is_peers ? s_peer_read(entry, where, &peer, err, errlen)
                          : s_stage_read(entry, where, &stage, err, errlen);
        if (rc < 0)
            return rc;
        if (is_peers && st->npeers < STATUS_PEERS_MAX)
            st->peers[st->npeers++] = peer;
        else if (is_peers)
            st->peers_dropped++;
        else if (st->nstages < STATUS_STAGES_MAX)
            st->stages[st->nstages++] = stage;
        else
            st->stages_dropped++;
    }
    return 0;
}

// The fields of the document (a JSON object) into *st.
static int s_status_read(const json_t *doc, status_t *st, char *err, size_t errlen)
{
    struct { const char *key; double *v; } nums[] = {
        {"step", &st->step}, {"iters", &st->iters}, {"loss", &st->loss},
        {"loss_avg", &st->loss_avg}, {"tok_s", &st->tok_s}, {"eta_s", &st->eta_s},
        {"bound_tok_s", &st->bound_tok_s},
    };
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
        if (s_num(doc, "", nums[i].key, nums[i].v, err, errlen) < 0)
            return -EPROTO;
    double omitted = 0;
    if (s_str(doc, "", "state", st->state, sizeof st->state, err, errlen) < 0 ||
        s_num(doc, "", "peers_omitted", &omitted, err, errlen) < 0 ||
        s_bool(doc, "", "names_hidden", &st->names_hidden, err, errlen) < 0 ||
        s_table_read(doc, 0, st, err, errlen) < 0 || s_table_read(doc, 1, st, err, errlen) < 0)
        return -EPROTO;
    if (omitted > 0 && omitted < 1e15) // the router left them off: counted as dropped
        st->peers_dropped += (size_t) omitted;
    return 0;
}

// An array of at most `max` entries named `name` (absent or null: none).
// 0 or -EPROTO with err.
static int s_array(const json_t *v, const char *name, size_t max, char *err, size_t errlen)
{
    if (v && !json_is_null(v) && !json_is_array(v)) {
        snprintf(err, errlen, "%s is %s, not an array", name, s_kind(v));
        return -EPROTO;
    }
    if (json_array_size(v) > max) {
        snprintf(err, errlen, "%s has %zu entries, more than %zu", name, json_array_size(v), max);
        return -EPROTO;
    }
    return 0;
}

// "history" (engine_history.c): its counts are numbers; each point of
// "loss", "evals" and "speed" an array of numbers (null: unknown), each
// event [time, "info" or "warn", text]. Absent or null: none.
static int s_history_read(const json_t *doc, char *err, size_t errlen)
{
    const json_t *h = json_object_get(doc, "history"), *series, *pt, *x;
    if (!h || json_is_null(h))
        return 0;
    if (!json_is_object(h)) {
        snprintf(err, errlen, "\"history\" is %s, not an object", s_kind(h));
        return -EPROTO;
    }
    static const char *const counts[] = {"cursor", "since", "loss_every", "events_kept"};
    double v;
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
        if (s_num(h, "\"history\": ", counts[i], &v, err, errlen) < 0)
            return -EPROTO;
    static const char *const names[] = {"loss", "evals", "speed", "events"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        char where[64];
        snprintf(where, sizeof where, "\"history\".\"%s\"", names[k]);
        if (s_array(series = json_object_get(h, names[k]), where, STATUS_HISTORY_MAX, err,
                    errlen) < 0)
            return -EPROTO;
        size_t i, j;
        json_array_foreach(series, i, pt) {
            snprintf(where, sizeof where, "\"history\".\"%s\"[%zu]", names[k], i);
            if (s_array(pt, where, 3, err, errlen) < 0)
                return -EPROTO;
            int event = k == 3, bad = event && json_array_size(pt) != 3;
            json_array_foreach(pt, j, x)
                bad |= event && j > 0 ? !json_is_string(x) : !json_is_number(x) && !json_is_null(x);
            if (bad || json_is_null(pt)) {
                snprintf(err, errlen, "%s is not %s", where,
                         event ? "[time, kind, text]" : "an array of numbers");
                return -EPROTO;
            }
        }
    }
    return 0;
}

// "counters": numbers, or objects of numbers (bytes by kind). Absent or
// null: none.
static int s_counters_read(const json_t *doc, char *err, size_t errlen)
{
    const json_t *c = json_object_get(doc, "counters"), *v, *x;
    const char *key, *sub;
    if (!c || json_is_null(c))
        return 0;
    if (!json_is_object(c)) {
        snprintf(err, errlen, "\"counters\" is %s, not an object", s_kind(c));
        return -EPROTO;
    }
    json_object_foreach((json_t *) c, key, v) {
        int bad = !json_is_number(v) && !json_is_object(v);
        json_object_foreach((json_t *) v, sub, x)
            bad |= !json_is_number(x);
        if (bad) {
            snprintf(err, errlen, "\"counters\" holds %s, not a number or numbers by kind",
                     s_kind(v));
            return -EPROTO;
        }
    }
    return 0;
}

// Parse the reply's meta (len bytes, not NUL-terminated) into *st, and,
// when doc is not NULL, the document itself (checked: the caller owns it).
// 0; -EPROTO with the reason in err (printable ASCII: it may quote the text).
static int s_status_parse(const char *text, size_t len, status_t *st, json_t **keep, char *err,
                          size_t errlen)
{
    memset(st, 0, sizeof *st);
    st->step = st->iters = st->loss = st->loss_avg = st->tok_s = st->eta_s = NAN;
    st->bound_tok_s = NAN;
    json_error_t e;
    json_t *doc = NULL;
    int rc = -EPROTO;
    // a document kept (the dashboard's) keeps its integers as integers, so
    // that it is written back as it came
    size_t flags = JSON_DECODE_ANY | JSON_ALLOW_NUL | (keep ? 0 : JSON_DECODE_INT_AS_REAL);
    if (!text || !len)
        snprintf(err, errlen, "empty (no JSON object)");
    else if (len > NET_META_MAX)
        snprintf(err, errlen, "%zu bytes, more than a message's %u", len, NET_META_MAX);
    else if (!(doc = json_loadb(text, len, flags, &e)))
        snprintf(err, errlen, "at byte %d: %s", e.position, e.text);
    else if (!json_is_object(doc))
        snprintf(err, errlen, "not a JSON object but %s", s_kind(doc));
    else if (s_too_deep(doc, STATUS_DEPTH_MAX))
        snprintf(err, errlen, "nested more than %d arrays and objects deep", STATUS_DEPTH_MAX);
    else if ((rc = s_status_read(doc, st, err, errlen)) == 0 &&
             (rc = s_history_read(doc, err, errlen)) == 0)
        rc = s_counters_read(doc, err, errlen);
    if (rc == 0 && keep) {
        *keep = doc;
        doc = NULL;
    }
    json_decref(doc);
    for (char *c = err; rc < 0 && *c; c++)
        *c = *c < 0x20 || *c > 0x7e ? '?' : *c;
    return rc;
}

// ---- output ------------------------------------------------------------------

// A number for a table cell, "-" when absent.
static const char *s_fmt(char *buf, size_t cap, const char *fmt, double v)
{
    if (isnan(v))
        snprintf(buf, cap, "-");
    else
        snprintf(buf, cap, fmt, v);
    return buf;
}

static const char *s_eta(char *buf, size_t cap, double s)
{
    if (isnan(s) || s < 0 || s > 1e9)
        snprintf(buf, cap, "-");
    else if (s >= 3600)
        snprintf(buf, cap, "%dh%02dm", (int) (s / 3600), (int) fmod(s / 60, 60));
    else if (s >= 60)
        snprintf(buf, cap, "%dm%02ds", (int) (s / 60), (int) fmod(s, 60));
    else
        snprintf(buf, cap, "%.0fs", s);
    return buf;
}

// Before the first step the loss is not known, and outside training there
// is no ETA, whatever the router sent for them.
static void s_print_head(FILE *out, const char *addr, const status_t *st)
{
    char a[32], b[32], c[32], d[32], e[32], f[32], g[32];
    int stepped = st->step > 0, training = !strcmp(st->state, "training");
    fprintf(out, "swarm %s: %s | step %s/%s | loss %s (avg %s) | %s tok/s (bound %s) | ETA %s\n",
            addr, st->state[0] ? st->state : "?", s_fmt(a, sizeof a, "%.0f", st->step),
            s_fmt(b, sizeof b, "%.0f", st->iters), s_fmt(c, sizeof c, "%.4f", stepped ? st->loss : NAN),
            s_fmt(d, sizeof d, "%.4f", stepped ? st->loss_avg : NAN),
            s_fmt(e, sizeof e, "%.0f", st->tok_s),
            s_fmt(g, sizeof g, "%.0f", st->bound_tok_s > 0 ? st->bound_tok_s : NAN),
            s_eta(f, sizeof f, training ? st->eta_s : NAN));
}

static void s_print_stages(FILE *out, const status_t *st)
{
    char a[32], b[32], c[32], d[32], e[32], f[32];
    fprintf(out, "\n%5s %8s %10s %10s %6s %9s\n", "stage", "replicas", "tok/s", "node tok/s", "queue",
            "needs");
    if (!st->nstages)
        fprintf(out, "(no stages)\n");
    for (size_t i = 0; i < st->nstages; i++) {
        const status_stage_t *s = &st->stages[i];
        fprintf(out, "%5s %8s %10s %10s %6s %9s\n", s_fmt(a, sizeof a, "%.0f", s->stage),
                s_fmt(b, sizeof b, "%.0f", s->replicas), s_fmt(c, sizeof c, "%.0f", s->tok_s),
                s_fmt(e, sizeof e, "%.0f", s->node_tok_s), s_fmt(d, sizeof d, "%.0f", s->queue),
                s_fmt(f, sizeof f, "%.1fM", s->memory_need / 1048576.0));
    }
    if (st->stages_dropped)
        fprintf(out, "... and %zu more stages\n", st->stages_dropped);
}

// The widest of a text column, within [lo, hi].
static int s_width(const status_t *st, size_t offset, int lo, int hi)
{
    int w = lo;
    for (size_t i = 0; i < st->npeers; i++) {
        int n = (int) strlen((const char *) &st->peers[i] + offset);
        w = n > w ? n : w;
    }
    return w < hi ? w : hi;
}

static void s_print_peers(FILE *out, const status_t *st)
{
    char a[32], b[32], c[32], d[32], e[32], f[32], g[32], mem[72], state[96];
    int nw = s_width(st, offsetof(status_peer_t, name), 4, 24);
    int dw = s_width(st, offsetof(status_peer_t, device), 6, 40);
    fprintf(out, "\n%5s  %-*s %-*s %5s %10s %8s %9s %15s  %s\n", "id", nw, "name", dw, "device",
            "stage", "tok/s", "inflight", "heartbeat", "memory used/of", "state");
    if (!st->npeers)
        fprintf(out, "(no peers)\n");
    for (size_t i = 0; i < st->npeers; i++) {
        const status_peer_t *p = &st->peers[i];
        if (p->expelled)
            snprintf(state, sizeof state, "%s for the run", p->state[0] ? p->state : "banned");
        else if (p->banned_s > 0)
            snprintf(state, sizeof state, "%s %.0fs", p->state, p->banned_s);
        else
            snprintf(state, sizeof state, "%s", p->state[0] ? p->state : "-");
        if (p->why[0])
            snprintf(state + strlen(state), sizeof state - strlen(state), " (%s)", p->why);
        snprintf(mem, sizeof mem, "%s/%s", s_fmt(f, sizeof f, "%.0fM", p->memory_used / 1048576.0),
                 s_fmt(g, sizeof g, "%.0fM", p->memory / 1048576.0));
        fprintf(out, "%5s  %-*.*s %-*.*s %5s %10s %8s %9s %15s  %s\n",
                s_fmt(a, sizeof a, "%.0f", p->id), nw, nw, p->name[0] ? p->name : "-", dw, dw,
                p->device[0] ? p->device : "-", s_fmt(b, sizeof b, "%.0f", p->stage),
                s_fmt(c, sizeof c, "%.0f", p->tok_s), s_fmt(d, sizeof d, "%.0f", p->inflight),
                s_fmt(e, sizeof e, "%.1fs", p->heartbeat_age_s), mem, state);
    }
    if (st->peers_dropped)
        fprintf(out, "... and %zu more peers\n", st->peers_dropped);
    if (st->names_hidden)
        fprintf(out, "(an open swarm shows peers' names and keys only to its members and to the "
                     "router's own key pair: ask with --key NAME of a node's pair, or where the "
                     "router's key is)\n");
}

int node_status_show(const char *text, size_t len, const char *addr, FILE *out, char *err,
                     size_t errlen)
{
    status_t *st = malloc(sizeof *st);
    if (!st) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    int rc = s_status_parse(text, len, st, NULL, err, errlen);
    if (rc == 0 && out) {
        s_print_head(out, addr, st);
        s_print_stages(out, st);
        s_print_peers(out, st);
    }
    free(st);
    return rc;
}

int node_status_load(const char *text, size_t len, json_t **doc, char *err, size_t errlen)
{
    status_t *st = malloc(sizeof *st);
    if (!st) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    int rc = s_status_parse(text, len, st, doc, err, errlen);
    free(st);
    return rc;
}
