/* status.c - `swarm status tcp://HOST:PORT --router-key KEY`: ask a router
 * for its STATUS and show it, as tables for people or as the raw JSON object
 * for scripts, once or every few seconds (--watch).
 *
 * The reply comes from the network, so its JSON is read by a small bounded
 * parser that knows exactly the shape of docs/swarm.md (numbers, strings,
 * arrays of flat objects), skips what it does not know and never trusts a
 * length. It does not change anything in the swarm: STATUS is read-only.
 */
#include "node.h"
#include "net.h"

#include <errno.h>
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
#define STATUS_DEPTH_MAX 16     // nesting the parser accepts in skipped values
#define STATUS_TEXT_MAX 64      // bytes kept of a string field

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
    double banned_s;                // seconds of its ban still to run
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
    size_t peers_dropped;           // peers beyond STATUS_PEERS_MAX
} status_t;

// ---- a bounded JSON reader ---------------------------------------------------

typedef struct {
    const char *start;              // first byte of the text
    const char *p;                  // next byte to read
    const char *end;                // one past the last byte
    char err[200];                  // what went wrong, first error only
} s_json_t;

typedef int (*s_field_fn)(s_json_t *j, const char *key, void *ctx);

static int s_json_fail(s_json_t *j, const char *what)
{
    if (!j->err[0])
        snprintf(j->err, sizeof j->err, "at byte %td: %s", j->p - j->start, what);
    return -EPROTO;
}

static void s_json_ws(s_json_t *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

// Skip whitespace and consume c; 0 or -EPROTO.
static int s_json_expect(s_json_t *j, char c, const char *what)
{
    s_json_ws(j);
    if (j->p >= j->end || *j->p != c)
        return s_json_fail(j, what);
    j->p++;
    return 0;
}

static int s_json_peek(s_json_t *j)
{
    s_json_ws(j);
    return j->p < j->end ? (unsigned char) *j->p : -1;
}

static int s_hex4(const char *s, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        v = v << 4 | (unsigned) d;
    }
    *out = v;
    return 0;
}

// One escape after the backslash; *c gets the byte to keep ('?' for anything
// that is not printable ASCII, so no peer can write control codes to a
// terminal).
static int s_json_escape(s_json_t *j, char *c)
{
    if (j->p >= j->end)
        return s_json_fail(j, "string ends inside an escape");
    char e = *j->p++;
    const char *from = "\"\\/bfnrt", *to = "\"\\/     ";
    const char *hit = strchr(from, e);
    if (e && hit) {
        *c = to[hit - from];
        return 0;
    }
    unsigned u;
    if (e != 'u' || j->end - j->p < 4 || s_hex4(j->p, &u) < 0)
        return s_json_fail(j, "bad escape in a string");
    j->p += 4;
    *c = u >= 0x20 && u < 0x7f ? (char) u : '?';
    return 0;
}

// A string into out (cap >= 1 bytes, NUL-terminated, truncated to fit,
// printable ASCII only). out may be NULL to skip it.
static int s_json_string(s_json_t *j, char *out, size_t cap)
{
    size_t n = 0;
    if (s_json_expect(j, '"', "expected a string") < 0)
        return -EPROTO;
    for (;;) {
        if (j->p >= j->end)
            return s_json_fail(j, "string not closed");
        unsigned char b = (unsigned char) *j->p++;
        char c = (char) b;
        if (b == '"')
            break;
        if (b < 0x20)
            return s_json_fail(j, "control character inside a string");
        if (b == '\\' && s_json_escape(j, &c) < 0)
            return -EPROTO;
        if (b >= 0x7f)
            c = '?';
        if (out && n + 1 < cap)
            out[n++] = c;
    }
    if (out)
        out[n] = '\0';
    return 0;
}

// A number (or null, read as NAN). Only JSON's characters go to strtod, so
// it never sees hex; the value must be finite.
static int s_json_number(s_json_t *j, double *out)
{
    s_json_ws(j);
    // null is "not known"; nan and inf are not JSON, but a router that
    // printed a diverged loss with %f writes them: read them as not known
    static const char *const words[] = {"null", "-nan", "nan", "-inf", "inf"};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
        size_t n = strlen(words[i]);
        if ((size_t) (j->end - j->p) >= n && memcmp(j->p, words[i], n) == 0) {
            j->p += n;
            *out = NAN;
            return 0;
        }
    }
    char buf[64];
    size_t n = 0;
    while (j->p + n < j->end && n < sizeof buf - 1 && j->p[n] && strchr("+-0123456789.eE", j->p[n]))
        n++;
    memcpy(buf, j->p, n);
    buf[n] = '\0';
    char *stop = NULL;
    double v = n ? strtod(buf, &stop) : 0;
    if (!n || n == sizeof buf - 1 || stop != buf + n || !isfinite(v))
        return s_json_fail(j, "expected a number");
    j->p += n;
    *out = v;
    return 0;
}

static int s_json_skip(s_json_t *j, int depth);

// '{' "key": value, ... '}' with field(j, key, ctx) reading each value.
static int s_json_object(s_json_t *j, s_field_fn field, void *ctx)
{
    if (s_json_expect(j, '{', "expected '{'") < 0)
        return -EPROTO;
    if (s_json_peek(j) == '}') {
        j->p++;
        return 0;
    }
    for (;;) {
        char key[32];
        if (s_json_string(j, key, sizeof key) < 0 ||
            s_json_expect(j, ':', "expected ':' after a key") < 0 || field(j, key, ctx) < 0)
            return -EPROTO;
        int c = s_json_peek(j);
        j->p += c == ',' || c == '}';
        if (c == '}')
            return 0;
        if (c != ',')
            return s_json_fail(j, "expected ',' or '}' in an object");
    }
}

// '[' value, ... ']' with item(j, index, ctx) reading each value.
static int s_json_array(s_json_t *j, int (*item)(s_json_t *, size_t, void *), void *ctx)
{
    if (s_json_expect(j, '[', "expected '['") < 0)
        return -EPROTO;
    if (s_json_peek(j) == ']') {
        j->p++;
        return 0;
    }
    for (size_t i = 0;; i++) {
        if (item(j, i, ctx) < 0)
            return -EPROTO;
        int c = s_json_peek(j);
        j->p += c == ',' || c == ']';
        if (c == ']')
            return 0;
        if (c != ',')
            return s_json_fail(j, "expected ',' or ']' in an array");
    }
}

static int s_skip_field(s_json_t *j, const char *key, void *ctx)
{
    (void) key;
    return s_json_skip(j, *(int *) ctx);
}

static int s_skip_item(s_json_t *j, size_t i, void *ctx)
{
    (void) i;
    return s_json_skip(j, *(int *) ctx);
}

// Any value, to a bounded depth: what a newer router adds is ignored.
static int s_json_skip(s_json_t *j, int depth)
{
    if (depth >= STATUS_DEPTH_MAX)
        return s_json_fail(j, "nested too deep");
    int c = s_json_peek(j), next = depth + 1;
    if (c == '{')
        return s_json_object(j, s_skip_field, &next);
    if (c == '[')
        return s_json_array(j, s_skip_item, &next);
    if (c == '"')
        return s_json_string(j, NULL, 0);
    static const char *const words[] = {"true", "false"}; // null: as a number
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
        size_t n = strlen(words[i]);
        if ((size_t) (j->end - j->p) >= n && memcmp(j->p, words[i], n) == 0) {
            j->p += n;
            return 0;
        }
    }
    double ignored;
    return s_json_number(j, &ignored);
}

// ---- the status object -------------------------------------------------------

// A numeric field (or null): the error names the key.
static int s_num(s_json_t *j, const char *key, double *out)
{
    if (s_json_number(j, out) == 0)
        return 0;
    j->err[0] = '\0'; // say which field
    char what[64];
    snprintf(what, sizeof what, "\"%s\" is not a finite number", key);
    return s_json_fail(j, what);
}

// A string field (or null, read as ""): the error names the key.
static int s_str(s_json_t *j, const char *key, char *out, size_t cap)
{
    int c = s_json_peek(j);
    if (c == '"')
        return s_json_string(j, out, cap);
    if (c == 'n' && j->end - j->p >= 4 && memcmp(j->p, "null", 4) == 0) {
        j->p += 4;
        out[0] = '\0';
        return 0;
    }
    char what[64];
    snprintf(what, sizeof what, "\"%s\" is not a string", key);
    return s_json_fail(j, what);
}

static int s_stage_field(s_json_t *j, const char *key, void *ctx)
{
    status_stage_t *s = ctx;
    if (!strcmp(key, "stage"))
        return s_num(j, key, &s->stage);
    if (!strcmp(key, "replicas"))
        return s_num(j, key, &s->replicas);
    if (!strcmp(key, "tok_s"))
        return s_num(j, key, &s->tok_s);
    if (!strcmp(key, "node_tok_s"))
        return s_num(j, key, &s->node_tok_s);
    if (!strcmp(key, "queue"))
        return s_num(j, key, &s->queue);
    return s_json_skip(j, 2);
}

static int s_peer_field(s_json_t *j, const char *key, void *ctx)
{
    status_peer_t *p = ctx;
    struct { const char *key; double *v; } nums[] = {
        {"id", &p->id}, {"stage", &p->stage}, {"tok_s", &p->tok_s},
        {"inflight", &p->inflight}, {"heartbeat_age_s", &p->heartbeat_age_s},
        {"failures", &p->failures}, {"banned_s", &p->banned_s},
    };
    struct { const char *key; char *s; } strs[] = {
        {"name", p->name}, {"key", p->key}, {"device", p->device}, {"state", p->state},
    };
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
        if (!strcmp(key, nums[i].key))
            return s_num(j, key, nums[i].v);
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++)
        if (!strcmp(key, strs[i].key))
            return s_str(j, key, strs[i].s, STATUS_TEXT_MAX);
    if (!strcmp(key, "why"))
        return s_str(j, key, p->why, sizeof p->why);
    return s_json_skip(j, 2);
}

static int s_stage_item(s_json_t *j, size_t i, void *ctx)
{
    status_t *st = ctx;
    (void) i;
    status_stage_t scratch, *s = st->nstages < STATUS_STAGES_MAX ? &st->stages[st->nstages]
                                                                 : &scratch;
    *s = (status_stage_t) {NAN, NAN, NAN, NAN, NAN};
    if (s_json_peek(j) != '{')
        return s_json_fail(j, "\"stages\" holds something that is not an object");
    if (s_json_object(j, s_stage_field, s) < 0)
        return -EPROTO;
    if (s == &scratch)
        st->stages_dropped++;
    else
        st->nstages++;
    return 0;
}

static int s_peer_item(s_json_t *j, size_t i, void *ctx)
{
    status_t *st = ctx;
    (void) i;
    status_peer_t scratch, *p = st->npeers < STATUS_PEERS_MAX ? &st->peers[st->npeers]
                                                              : &scratch;
    *p = (status_peer_t) {.id = NAN, .stage = NAN, .tok_s = NAN, .inflight = NAN,
                          .heartbeat_age_s = NAN, .failures = NAN, .banned_s = NAN};
    if (s_json_peek(j) != '{')
        return s_json_fail(j, "\"peers\" holds something that is not an object");
    if (s_json_object(j, s_peer_field, p) < 0)
        return -EPROTO;
    if (p == &scratch)
        st->peers_dropped++;
    else
        st->npeers++;
    return 0;
}

static int s_status_field(s_json_t *j, const char *key, void *ctx)
{
    status_t *st = ctx;
    struct { const char *key; double *v; } nums[] = {
        {"step", &st->step}, {"iters", &st->iters}, {"loss", &st->loss},
        {"loss_avg", &st->loss_avg}, {"tok_s", &st->tok_s}, {"eta_s", &st->eta_s},
        {"bound_tok_s", &st->bound_tok_s},
    };
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
        if (!strcmp(key, nums[i].key))
            return s_num(j, key, nums[i].v);
    if (!strcmp(key, "state"))
        return s_str(j, key, st->state, sizeof st->state);
    if (!strcmp(key, "stages") && s_json_peek(j) != 'n') // null: no table
        return s_json_array(j, s_stage_item, st);
    if (!strcmp(key, "peers") && s_json_peek(j) != 'n')
        return s_json_array(j, s_peer_item, st);
    return s_json_skip(j, 1);
}

// Parse the reply's meta (len bytes, not NUL-terminated) into *st.
// 0; -EPROTO with the reason in err.
static int s_status_parse(const char *text, size_t len, status_t *st, char *err, size_t errlen)
{
    memset(st, 0, sizeof *st);
    st->step = st->iters = st->loss = st->loss_avg = st->tok_s = st->eta_s = NAN;
    st->bound_tok_s = NAN;
    s_json_t j = {.start = text, .p = text, .end = text + len};
    int rc = text && len ? 0 : s_json_fail(&j, "empty (no JSON object)");
    if (rc == 0 && s_json_peek(&j) != '{')
        rc = s_json_fail(&j, "not a JSON object");
    if (rc == 0)
        rc = s_json_object(&j, s_status_field, st);
    if (rc == 0 && s_json_peek(&j) != -1)
        rc = s_json_fail(&j, "text after the JSON object");
    if (rc < 0)
        snprintf(err, errlen, "%s", j.err);
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
        if (p->banned_s > 0)
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
    int rc = s_status_parse(text, len, st, err, errlen);
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
            "  ADDR               the router: the swarm://HOST:PORT/KEY token it printed, or\n"
            "                     tcp://HOST:PORT with --router-key\n"
            "  --router-key KEY   the router's public key: its .pub file or the 40-char Z85 text\n"
            "  --key NAME         our key pair NAME.key/NAME.pub (a private swarm admits only\n"
            "                     listed keys); default: a fresh key for this run\n"
            "  --watch [SECONDS]  redraw every SECONDS (default 2) until Ctrl-C\n"
            "  --json             print the router's JSON object, one line (for scripts)\n");
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

// One STATUS request. 0 and *reply (type STATUS); else one line printed and
// a negative errno (-EINTR quietly on Ctrl-C).
static int s_ask(net_client_t *client, const char *addr, net_msg_t **reply)
{
    char err[256] = "";
    net_msg_t *req = net_msg_new(NET_MSG_STATUS);
    if (!req) {
        fprintf(stderr, "swarm status: out of memory\n");
        return -ENOMEM;
    }
    net_retry_t retry = {.timeout_ms = STATUS_TIMEOUT_MS, .tries = STATUS_TRIES};
    int rc = net_client_request(client, &req, &retry, reply, err, sizeof err);
    if (rc == -EINTR || (rc < 0 && s_stop))
        return -EINTR;
    if (rc == -ETIMEDOUT)
        fprintf(stderr, "swarm status: no answer from %s within %d s: is the router running, "
                "and is --router-key its public key? (a private swarm also needs --key NAME "
                "of a key on its allow-list)\n", addr, STATUS_TIMEOUT_MS * STATUS_TRIES / 1000);
    else if (rc < 0)
        fprintf(stderr, "swarm status: asking %s: %s\n", addr, err[0] ? err : strerror(-rc));
    if (rc < 0)
        return rc;
    int type = net_msg_head_const(*reply)->type;
    if (type == NET_MSG_STATUS)
        return 0;
    char reason[256] = "";
    if (type != NET_MSG_ERROR)
        fprintf(stderr, "swarm status: %s answered %s, not STATUS: is it a swarm router?\n", addr,
                net_msg_type_name(type));
    if (type == NET_MSG_ERROR && net_msg_meta_get(*reply, "reason", reason, sizeof reason) < 0)
        snprintf(reason, sizeof reason, "(no reason given)");
    for (char *c = reason; *c; c++)
        *c = *c < 0x20 || *c > 0x7e ? '?' : *c; // a peer's text: no control codes
    if (type == NET_MSG_ERROR)
        fprintf(stderr, "swarm status: the router at %s refused: %s\n", addr, reason);
    net_msg_destroy(reply);
    return -EPROTO;
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
    int rc = s_ask(client, o->addr, &reply);
    if (rc < 0)
        return rc;
    size_t len = 0;
    const char *text = net_msg_meta(reply, &len);
    char err[256] = "";
    rc = s_status_parse(text, len, st, err, sizeof err);
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
    status = s_run(client, &o);
    net_client_destroy(&client);
out_destroy_keys:
    net_key_destroy(&ours);
    net_key_destroy(&server);
    return status;
}
