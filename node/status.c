/* status.c - `swarm status tcp://HOST:PORT --router-key KEY`: ask a router
 * for its STATUS and show it, as tables for people or as the raw JSON object
 * for scripts, once or every few seconds (--watch).
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
#include <signal.h>
#include <sodium.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STATUS_TIMEOUT_MS 2000  // per try
#define STATUS_TRIES 2          // tries in all
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
    double eta_s;                   // seconds to the end of the schedule
    char state[STATUS_TEXT_MAX];    // waiting, training, done
    status_stage_t stages[STATUS_STAGES_MAX]; // nstages used
    size_t nstages;                 // stages kept
    size_t stages_dropped;          // stages beyond STATUS_STAGES_MAX
    status_peer_t peers[STATUS_PEERS_MAX];    // npeers used
    size_t npeers;                  // peers kept
    size_t peers_dropped;           // peers beyond STATUS_PEERS_MAX, and peers_omitted
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
    *s = (status_stage_t) {NAN, NAN, NAN, NAN, NAN};
    struct { const char *key; double *v; } nums[] = {
        {"stage", &s->stage}, {"replicas", &s->replicas}, {"tok_s", &s->tok_s},
        {"node_tok_s", &s->node_tok_s}, {"queue", &s->queue},
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
                          .heartbeat_age_s = NAN, .failures = NAN, .banned_s = NAN};
    struct { const char *key; double *v; } nums[] = {
        {"id", &p->id}, {"stage", &p->stage}, {"tok_s", &p->tok_s},
        {"inflight", &p->inflight}, {"heartbeat_age_s", &p->heartbeat_age_s},
        {"failures", &p->failures}, {"banned_s", &p->banned_s},
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
    if (!text || !len)
        snprintf(err, errlen, "empty (no JSON object)");
    else if (len > NET_META_MAX)
        snprintf(err, errlen, "%zu bytes, more than a message's %u", len, NET_META_MAX);
    else if (!(doc = json_loadb(text, len, JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL |
                                JSON_ALLOW_NUL, &e)))
        snprintf(err, errlen, "at byte %d: %s", e.position, e.text);
    else if (!json_is_object(doc))
        snprintf(err, errlen, "not a JSON object but %s", s_kind(doc));
    else if (s_too_deep(doc, STATUS_DEPTH_MAX))
        snprintf(err, errlen, "nested more than %d arrays and objects deep", STATUS_DEPTH_MAX);
    else if ((rc = s_status_read(doc, st, err, errlen)) == 0 &&
             (rc = s_history_read(doc, err, errlen)) == 0)
        rc = s_counters_read(doc, err, errlen);
    json_decref(doc);
    if (rc == 0 && keep && !(*keep = json_loadb(text, len, JSON_ALLOW_NUL, &e))) {
        // the same text, its integers kept as integers (so that it is written back as it came)
        snprintf(err, errlen, "at byte %d: %s", e.position, e.text);
        rc = -EPROTO;
    }
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
    char a[32], b[32], c[32], d[32], e[32];
    fprintf(out, "\n%5s %8s %10s %10s %6s\n", "stage", "replicas", "tok/s", "node tok/s", "queue");
    if (!st->nstages)
        fprintf(out, "(no stages)\n");
    for (size_t i = 0; i < st->nstages; i++) {
        const status_stage_t *s = &st->stages[i];
        fprintf(out, "%5s %8s %10s %10s %6s\n", s_fmt(a, sizeof a, "%.0f", s->stage),
                s_fmt(b, sizeof b, "%.0f", s->replicas), s_fmt(c, sizeof c, "%.0f", s->tok_s),
                s_fmt(e, sizeof e, "%.0f", s->node_tok_s), s_fmt(d, sizeof d, "%.0f", s->queue));
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
    char a[32], b[32], c[32], d[32], e[32], state[96];
    int nw = s_width(st, offsetof(status_peer_t, name), 4, 24);
    int dw = s_width(st, offsetof(status_peer_t, device), 6, 40);
    fprintf(out, "\n%5s  %-*s %-*s %5s %10s %8s %9s  %s\n", "id", nw, "name", dw, "device",
            "stage", "tok/s", "inflight", "heartbeat", "state");
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
        fprintf(out, "%5s  %-*.*s %-*.*s %5s %10s %8s %9s  %s\n",
                s_fmt(a, sizeof a, "%.0f", p->id), nw, nw, p->name[0] ? p->name : "-", dw, dw,
                p->device[0] ? p->device : "-", s_fmt(b, sizeof b, "%.0f", p->stage),
                s_fmt(c, sizeof c, "%.0f", p->tok_s), s_fmt(d, sizeof d, "%.0f", p->inflight),
                s_fmt(e, sizeof e, "%.1fs", p->heartbeat_age_s), state);
    }
    if (st->peers_dropped)
        fprintf(out, "... and %zu more peers\n", st->peers_dropped);
}

// The JSON text on one line: outside strings a newline is whitespace, and
// inside a valid string there is none, so turning CR/LF into spaces is safe.
static void s_print_json(FILE *out, const char *text, size_t len)
{
    while (len && strchr(" \t\r\n", text[len - 1]))
        len--;
    for (size_t i = 0; i < len; i++)
        fputc(text[i] == '\n' || text[i] == '\r' ? ' ' : text[i], out);
    fputc('\n', out);
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

// ---- the command ---------------------------------------------------------------

typedef struct {
    const char *addr;               // router endpoint, tcp://HOST:PORT
    node_join_t target;             // the address as given (a token carries the key)
    const char *router_key;         // .pub path or Z85 text
    const char *key;                // NAME of our key pair, NULL = ephemeral
    double watch_s;                 // redraw interval, s (0 = once)
    int json;                       // print the raw JSON object
    const char *serve;              // --serve [HOST:]PORT: the dashboard, NULL none
} status_opts_t;

static volatile sig_atomic_t s_stop;

static void s_on_signal(int sig)
{
    (void) sig;
    s_stop = 1;
}

static void s_usage(FILE *out)
{
    fprintf(out,
            "usage: swarm status swarm://HOST:PORT/KEY [--key NAME] [--watch [SECONDS]] [--json]\n"
            "       swarm status tcp://HOST:PORT --router-key KEY [...]\n"
            "       swarm status ADDR [--router-key KEY] --serve [HOST:]PORT [--watch SECONDS]\n"
            "  ADDR               the router: the swarm://HOST:PORT/KEY token it printed, or\n"
            "                     tcp://HOST:PORT with --router-key\n"
            "  --router-key KEY   the router's public key: its .pub file or the 40-char Z85 text\n"
            "  --key NAME         our key pair NAME.key/NAME.pub (a private swarm admits only\n"
            "                     listed keys); default: a fresh key for this run\n"
            "  --watch [SECONDS]  redraw every SECONDS (default 2) until Ctrl-C\n"
            "  --json             print the router's JSON object, one line (for scripts)\n"
            "  --serve [HOST:]PORT  a web dashboard of the swarm: the page at /, the JSON at\n"
            "                     /api/state, Prometheus metrics at /metrics; HOST defaults to\n"
            "                     127.0.0.1 (0.0.0.0: every interface), PORT 0 picks a free one;\n"
            "                     it asks the router every SECONDS of --watch (default 1)\n");
}

static int s_bad(const char *what, const char *value)
{
    fprintf(stderr, "swarm status: %s%s%s%s (swarm status --help)\n", what, value ? " '" : "",
            value ? value : "", value ? "'" : "");
    return -EINVAL;
}

// An optional --watch SECONDS: taken only when the next argument is a number.
static int s_watch_arg(const char *s, double *out)
{
    char *stop = NULL;
    double v = s ? strtod(s, &stop) : 0;
    if (!s || stop == s || *stop || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

static int s_parse_args(int argc, char **argv, status_opts_t *o)
{
    *o = (status_opts_t) {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            s_usage(stdout);
            return 1;
        } else if (!strcmp(a, "--json")) {
            o->json = 1;
        } else if (!strcmp(a, "--serve")) {
            if (!next || !*next || next[0] == '-')
                return s_bad("--serve needs [HOST:]PORT to listen on, e.g. 127.0.0.1:8080", NULL);
            o->serve = next;
            i++;
        } else if (!strcmp(a, "--watch")) {
            o->watch_s = 2;
            if (s_watch_arg(next, &o->watch_s) == 0)
                i++;
            if (o->watch_s < 0.1 || o->watch_s > 86400)
                return s_bad("--watch takes seconds from 0.1 to 86400, not", next);
        } else if (!strcmp(a, "--router-key") || !strcmp(a, "--key")) {
            if (!next || !*next)
                return s_bad(!strcmp(a, "--key") ? "--key needs the NAME of a key pair"
                                                 : "--router-key needs a .pub file or Z85 key",
                             NULL);
            *(!strcmp(a, "--key") ? &o->key : &o->router_key) = next;
            i++;
        } else if (a[0] == '-') {
            return s_bad("unknown flag", a);
        } else if (o->addr) {
            return s_bad("one router address only; unexpected argument", a);
        } else {
            o->addr = a;
        }
    }
    if (o->serve && o->json)
        return s_bad("--serve and --json: the dashboard serves the JSON at /api/state; pick one",
                     NULL);
    if (o->serve && o->watch_s == 0)
        o->watch_s = 1;
    if (!o->addr)
        return s_bad("give the router's address, e.g. swarm status swarm://HOST:PORT/KEY (the "
                     "token it printed)", NULL);
    char err[600];
    if (node_join_parse(o->addr, &o->target, err, sizeof err) != 0) {
        fprintf(stderr, "swarm status: %s\n", err);
        return -EINVAL;
    }
    o->addr = o->target.endpoint;
    if (!o->router_key && o->target.router_key[0])
        o->router_key = o->target.router_key;
    if (!o->router_key)
        return s_bad("--router-key is required with tcp://HOST:PORT: the router's .pub file or "
                     "its Z85 key", NULL);
    return 0;
}

// The router's public key from Z85 text or a .pub file; our pair from
// NAME.key/.pub or fresh. 0 or -errno with one line printed.
static int s_keys(const status_opts_t *o, net_key_t **server, net_key_t **ours)
{
    char err[512] = "";
    // net_key_load* read files into sodium memory before net has called
    // sodium_init (an abort in sodium_malloc otherwise)
    if (sodium_init() < 0) {
        fprintf(stderr, "swarm status: libsodium failed to initialise\n");
        return -ENOSYS;
    }
    int rc = -EINVAL;
    if (strlen(o->router_key) == NET_KEY_Z85_LEN)
        rc = net_key_from_z85(o->router_key, server);
    if (rc < 0)
        rc = net_key_load_public(o->router_key, server, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "swarm status: --router-key: %s\n", err); // err names the file
        return rc;
    }
    if (o->key)
        rc = net_key_load(o->key, ours, err, sizeof err);
    else if ((rc = net_key_generate(ours)) < 0)
        snprintf(err, sizeof err, "cannot generate a key pair (%s)", strerror(-rc));
    if (rc < 0)
        fprintf(stderr, "swarm status: %s%s\n", o->key ? "--key: " : "", err);
    return rc;
}

int node_status_ask(net_client_t *client, const char *addr, uint64_t since, net_msg_t **reply,
                    char *err, size_t errlen)
{
    char why[256] = "";
    net_msg_t *req = net_msg_new(NET_MSG_STATUS);
    char meta[40];
    snprintf(meta, sizeof meta, "since=%llu", (unsigned long long) since);
    if (!req || (since && net_msg_set_meta(req, meta) < 0)) {
        net_msg_destroy(&req);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    net_retry_t retry = {.timeout_ms = STATUS_TIMEOUT_MS, .tries = STATUS_TRIES};
    int rc = net_client_request(client, &req, &retry, reply, why, sizeof why);
    if (rc == -EINTR || (rc < 0 && s_stop))
        return -EINTR;
    if (rc == -ETIMEDOUT)
        snprintf(err, errlen, "no answer from %s within %d s: is the router running, and is "
                 "--router-key its public key? (a private swarm also needs --key NAME of a key "
                 "on its allow-list)", addr, STATUS_TIMEOUT_MS * STATUS_TRIES / 1000);
    else if (rc < 0)
        snprintf(err, errlen, "asking %s: %s", addr, why[0] ? why : strerror(-rc));
    if (rc < 0)
        return rc;
    int type = net_msg_head_const(*reply)->type;
    if (type == NET_MSG_STATUS)
        return 0;
    char reason[256] = "";
    if (type != NET_MSG_ERROR)
        snprintf(err, errlen, "%s answered %s, not STATUS: is it a swarm router?", addr,
                 net_msg_type_name(type));
    if (type == NET_MSG_ERROR && net_msg_meta_get(*reply, "reason", reason, sizeof reason) < 0)
        snprintf(reason, sizeof reason, "(no reason given)");
    for (char *c = reason; *c; c++)
        *c = *c < 0x20 || *c > 0x7e ? '?' : *c; // a peer's text: no control codes
    if (type == NET_MSG_ERROR)
        snprintf(err, errlen, "the router at %s refused: %s", addr, reason);
    net_msg_destroy(reply);
    return -EPROTO;
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

// The tables, built in a buffer first so that a redraw is one write.
static int s_draw(const status_opts_t *o, const status_t *st)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *out = open_memstream(&buf, &n);
    if (!out) {
        fprintf(stderr, "swarm status: out of memory\n");
        return -ENOMEM;
    }
    if (o->watch_s > 0)
        fputs("\033[H\033[2J", out); // home, clear
    s_print_head(out, o->addr, st);
    s_print_stages(out, st);
    s_print_peers(out, st);
    if (o->watch_s > 0)
        fprintf(out, "\nevery %g s; Ctrl-C to stop\n", o->watch_s);
    fclose(out);
    fwrite(buf, 1, n, stdout);
    fflush(stdout);
    free(buf);
    return 0;
}

// Ask once and print the tables or the JSON line. 0 or a negative errno,
// with one line printed.
static int s_show(net_client_t *client, const status_opts_t *o, status_t *st)
{
    net_msg_t *reply = NULL;
    char err[512] = "";
    int rc = node_status_ask(client, o->addr, 0, &reply, err, sizeof err);
    if (rc < 0) {
        if (rc != -EINTR)
            fprintf(stderr, "swarm status: %s\n", err);
        return rc;
    }
    size_t len = 0;
    const char *text = net_msg_meta(reply, &len);
    rc = s_status_parse(text, len, st, NULL, err, sizeof err);
    if (rc < 0) {
        fprintf(stderr, "swarm status: %s sent a malformed status: %s\n", o->addr, err);
    } else if (o->json) {
        s_print_json(stdout, text, len);
        fflush(stdout);
    } else {
        rc = s_draw(o, st);
    }
    net_msg_destroy(&reply);
    return rc;
}

// Sleep s seconds unless Ctrl-C comes first.
static void s_sleep(double s)
{
    struct timespec t = {(time_t) s, (long) (fmod(s, 1) * 1e9)};
    while (!s_stop && nanosleep(&t, &t) < 0 && errno == EINTR)
        ;
}

// Ask, print, and with --watch repeat until Ctrl-C. After a first good
// answer, a missed one is reported and the watch goes on (a router may be
// restarting); the first one failing ends the command.
static int s_run(net_client_t *client, const status_opts_t *o)
{
    status_t *st = malloc(sizeof *st);
    if (!st) {
        fprintf(stderr, "swarm status: out of memory\n");
        return 1;
    }
    int rc = s_show(client, o, st);
    int status = rc == -EINTR ? 130 : rc < 0 ? 1 : 0;
    while (status == 0 && o->watch_s > 0 && !s_stop) {
        s_sleep(o->watch_s);
        if (!s_stop)
            (void) s_show(client, o, st); // a miss was printed; keep watching
    }
    free(st);
    return status;
}

int cmd_status(int argc, char **argv)
{
    status_opts_t o;
    int rc = s_parse_args(argc, argv, &o);
    if (rc != 0)
        return rc > 0 ? 0 : 1;
    net_key_t *server = NULL, *ours = NULL;
    net_client_t *client = NULL;
    int status = 1;
    if (s_keys(&o, &server, &ours) < 0)
        goto out_destroy_keys;
    char err[512] = "";
    net_client_config_t c = {
        .endpoint = o.addr, .server = server, .key = ours,
        .limits = {.max_tensors = 0, .max_dims = 1, .max_dim = 1, .max_payload = 1,
                   .max_meta = NET_META_MAX},
    };
    if (net_client_new(&c, &client, err, sizeof err) < 0) {
        fprintf(stderr, "swarm status: %s: %s\n", o.addr, err);
        goto out_destroy_keys;
    }
    struct sigaction sa = {.sa_handler = s_on_signal}; // no SA_RESTART: waits end early
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    status = o.serve ? node_dashboard_run(client, o.addr, o.serve, o.watch_s, &s_stop)
                     : s_run(client, &o);
    net_client_destroy(&client);
out_destroy_keys:
    net_key_destroy(&ours);
    net_key_destroy(&server);
    return status;
}
