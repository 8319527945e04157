/* dashboard.c - `swarm status ADDR --serve [HOST:]PORT`: a read-only web
 * server, in its own process, over the router's STATUS. The main thread
 * asks the router every few seconds (CurveZMQ, with the status key: the
 * HTTP side holds no secret), checks the answer as `swarm status` does,
 * adds the history that is new since its cursor to what it holds, and
 * renders two texts: the document (/api/state, the same as `swarm status
 * --json`) and the Prometheus metrics (/metrics). libmicrohttpd's thread
 * serves those and the page (node/dashboard.html, built into the binary)
 * from what the last poll left, under a lock. README.md, "Watching a
 * swarm: the dashboard"; docs/swarm.md, "Status".
 */
#include "node.h"
#include "net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BOARD_CONNECTIONS 64    // HTTP connections at once
#define BOARD_TIMEOUT_S 10      // an idle HTTP connection is closed after this
#define BOARD_SERIES_MAX 65536  // points of a series held (a router keeps 4096): the newest

extern const char swarm_dashboard_start[], swarm_dashboard_end[]; // dashboard_page.S

// What the HTTP thread serves, as the poll loop left it.
typedef struct {
    pthread_mutex_t lock;
    char *state;                // /api/state: the document (200), or the 503 body while down
    int up;                     // the last poll was answered with a good status
    char *metrics;              // /metrics
} board_t;

// What the poll loop holds between polls.
typedef struct {
    json_t *doc;                // the router's document with all its history so far
    uint64_t cursor;            // the history's cursor: the next poll asks since it
    long polls, failures;       // polls asked, of them unanswered or malformed
    time_t down_since;          // when the router stopped answering, 0 while it answers
    int told;                   // the log said it does not answer
    char error[600];            // why, while it does not
} poll_t;

// ---- the document: the new history added to what is held -----------------------

// Keep the newest `keep` entries of the array at h[key] (copied into a new
// one: removing from the front one by one would cost the square).
static void s_keep_last(json_t *h, const char *key, size_t keep)
{
    json_t *a = json_object_get(h, key), *tail;
    size_t n = json_array_size(a);
    if (n <= keep || !(tail = json_array()))
        return;
    for (size_t i = n - keep; i < n; i++)
        if (json_array_append(tail, json_array_get(a, i)) < 0)
            break;
    json_object_set_new(h, key, tail);
}

// fresh (a checked document, taken) replaces the held one; when its
// history is only what is new since our cursor, the held history comes
// first. Afterwards the held document is what a poll from cursor 0 gives.
static void s_merge(poll_t *p, json_t *fresh)
{
    json_t *h = json_object_get(fresh, "history");
    json_t *old = p->doc ? json_object_get(p->doc, "history") : NULL;
    double since = json_number_value(json_object_get(h, "since"));
    if (h && old && since > 0 && since == (double) p->cursor) {
        static const char *const series[] = {"loss", "evals", "speed", "events"};
        for (size_t k = 0; k < sizeof series / sizeof series[0]; k++) {
            json_t *was = json_object_get(old, series[k]), *now = json_object_get(h, series[k]);
            if (json_is_array(was) && json_is_array(now) && json_array_extend(was, now) == 0)
                json_object_set(h, series[k], was);
            s_keep_last(h, series[k], BOARD_SERIES_MAX); // whatever it sends
        }
        double kept = json_number_value(json_object_get(h, "events_kept"));
        if (kept >= 0 && kept < 1e6)
            s_keep_last(h, "events", (size_t) kept);
    }
    if (h) {
        json_object_set_new(h, "since", json_integer(0));
        double cursor = json_number_value(json_object_get(h, "cursor"));
        p->cursor = cursor > 0 && cursor < 1e18 ? (uint64_t) cursor : 0;
    }
    json_decref(p->doc);
    p->doc = fresh;
}

// ---- /metrics: the Prometheus text format ------------------------------------------

// A label value: backslash, quote and newline escaped (the format's rule),
// other control bytes dropped.
static void s_label(FILE *f, const char *text)
{
    for (const char *c = text ? text : ""; *c; c++) {
        if (*c == '\\' || *c == '"')
            fprintf(f, "\\%c", *c);
        else if (*c == '\n')
            fputs("\\n", f);
        else if ((unsigned char) *c >= 0x20)
            fputc(*c, f);
    }
}

static void s_family(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

// One sample; a null (unknown) value is left out, as Prometheus expects.
static void s_sample(FILE *f, const char *name, const char *labels, const json_t *v)
{
    if (!json_is_number(v))
        return;
    char text[32];
    double x = json_number_value(v);
    snprintf(text, sizeof text, "%.15g", x);
    if (strtod(text, NULL) != x) // the shortest that reads back the same
        snprintf(text, sizeof text, "%.17g", x);
    fprintf(f, "%s%s %s\n", name, labels, text);
}

// A gauge of the document's top level.
static void s_top(FILE *f, const json_t *doc, const char *key, const char *name, const char *help)
{
    s_family(f, name, "gauge", help);
    s_sample(f, name, "", json_object_get(doc, key));
}

// A gauge for each entry of the document's `table` ("stages" or "peers").
static void s_each(FILE *f, const json_t *doc, const char *table, const char *key,
                   const char *name, const char *help)
{
    const json_t *e;
    size_t i;
    s_family(f, name, "gauge", help);
    json_array_foreach(json_object_get(doc, table), i, e) {
        char *labels = NULL;
        size_t n = 0;
        FILE *l = open_memstream(&labels, &n);
        if (!l)
            continue;
        double stage = json_number_value(json_object_get(e, "stage"));
        if (!strcmp(table, "peers")) {
            fprintf(l, "{peer=\"%.0f\",name=\"", json_number_value(json_object_get(e, "id")));
            s_label(l, json_string_value(json_object_get(e, "name")));
            fprintf(l, "\",stage=\"%.0f\"}", stage);
        } else {
            fprintf(l, "{stage=\"%.0f\"}", stage);
        }
        fclose(l);
        s_sample(f, name, labels, json_object_get(e, key));
        free(labels);
    }
}

// Counters of the document's "counters".
static void s_counters(FILE *f, const json_t *doc)
{
    static const struct { const char *key, *name, *help; } c[] = {
        {"rollbacks", "swarm_rollbacks_total", "Times a stage lost every replica and the swarm went back to its last checkpoint."},
        {"restarts", "swarm_step_restarts_total", "Steps started over because a replica's outputs were found wrong."},
        {"expelled", "swarm_expelled_total", "Peers expelled for the run (diverged, or caught lying)."},
        {"bans", "swarm_bans_total", "Peers banned for a while or for the run."},
        {"checkpoints", "swarm_checkpoints_total", "Checkpoints taken whole."},
        {"checksum_mismatches", "swarm_checksum_mismatches_total", "Replicas whose parameters differed from their stage's after a step."},
        {"resyncs", "swarm_resyncs_total", "Replicas resynced from one that agrees."},
        {"spot_checks", "swarm_spot_checks_total", "Forwards verified on a second replica."},
        {"audits", "swarm_audits_total", "Gradient sums recomputed by another replica."},
        {"audit_caught", "swarm_audit_liars_caught_total", "Audits that expelled a liar."},
        {"step_seconds", "swarm_step_seconds_total", "Seconds the training steps took."},
        {"audited_steps", "swarm_audited_steps_total", "Steps whose update waited for an audit."},
        {"audited_step_seconds", "swarm_audited_step_seconds_total",
         "Seconds those steps took (against swarm_step_seconds_total: what the audits cost)."},
        {"status_refused", "swarm_status_refused_total", "STATUS requests the router refused: over its budget (a flood)."},
        {"dropped_unread", "swarm_messages_dropped_total", "Messages dropped unread: a type no node sends unasked, tensors on a control message, or a key that never said HELLO."},
    };
    const json_t *counters = json_object_get(doc, "counters");
    for (size_t k = 0; k < sizeof c / sizeof c[0]; k++) {
        s_family(f, c[k].name, "counter", c[k].help);
        s_sample(f, c[k].name, "", json_object_get(counters, c[k].key));
    }
    s_family(f, "swarm_wire_bytes_total", "counter",
             "Tensor bytes the router received (in) and sent (out), by kind.");
    static const char *const dirs[] = {"in", "out"};
    static const char *const kinds[] = {"activations", "gradients", "state"};
    for (int d = 0; d < 2; d++) {
        char key[16];
        snprintf(key, sizeof key, "wire_%s", dirs[d]);
        for (int k = 0; k < 3; k++) {
            char labels[64];
            snprintf(labels, sizeof labels, "{direction=\"%s\",kind=\"%s\"}", dirs[d], kinds[k]);
            s_sample(f, "swarm_wire_bytes_total", labels,
                     json_object_get(json_object_get(counters, key), kinds[k]));
        }
    }
}

// The gauges of the document's top level, and of each entry of "stages"
// and "peers": its key, the metric, its HELP.
typedef struct {
    const char *table, *key, *name, *help;
} gauge_t;
static const gauge_t s_tops[] = {
    {NULL, "step", "swarm_step", "Optimizer steps done."},
    {NULL, "iters", "swarm_steps_planned", "Steps of the schedule."},
    {NULL, "loss", "swarm_loss", "The last step's training loss."},
    {NULL, "loss_avg", "swarm_loss_average", "Moving average of the training loss."},
    {NULL, "tok_s", "swarm_tokens_per_second", "Training tokens a second over the run's steps."},
    {NULL, "bound_tok_s", "swarm_bound_tokens_per_second",
     "The least over stages of what its replicas sustain: the swarm's bound."},
    {NULL, "eta_s", "swarm_eta_seconds",
     "Seconds to the end of this run: the schedule's, or sooner with --steps."},
};
static const gauge_t s_tables[] = {
    {"stages", "replicas", "swarm_stage_replicas", "Ready replicas of the stage."},
    {"stages", "tok_s", "swarm_stage_tokens_per_second", "Tokens a second the stage's replicas run, summed."},
    {"stages", "node_tok_s", "swarm_stage_bound_tokens_per_second",
     "Tokens a second the stage's replicas say they sustain, summed."},
    {"stages", "queue", "swarm_stage_queue", "Requests waiting at the stage's replicas."},
    {"stages", "memory_need", "swarm_stage_memory_need_bytes",
     "Bytes a node holds for the stage: its state, a micro-batch's activations, buffers."},
    {"peers", "tok_s", "swarm_peer_tokens_per_second", "Tokens a second the peer runs."},
    {"peers", "inflight", "swarm_peer_inflight", "Requests sent to the peer, not yet answered."},
    {"peers", "heartbeat_age_s", "swarm_peer_heartbeat_age_seconds", "Seconds since the peer was last heard."},
    {"peers", "failures", "swarm_peer_failures", "Requests the peer failed."},
    {"peers", "memory", "swarm_peer_memory_budget_bytes", "Bytes the peer may hold for its stage (its --memory)."},
    {"peers", "memory_used", "swarm_peer_memory_used_bytes", "Bytes the peer's stage holds, as it counts them."},
    {"peers", "rss", "swarm_peer_resident_bytes", "The peer process's resident set."},
    {"peers", "rss_grown", "swarm_peer_resident_grown_bytes",
     "Resident bytes the peer process added since before it held a stage."},
    {"peers", "device_used", "swarm_peer_device_used_bytes",
     "GPU memory the peer process took since its start."},
};

// The metrics text (malloc'd) of what the poll loop holds.
static char *s_metrics(const poll_t *p)
{
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    if (!f)
        return NULL;
    int up = p->down_since == 0 && p->doc;
    s_family(f, "swarm_router_up", "gauge", "1 when the router answered the last status poll.");
    fprintf(f, "swarm_router_up %d\n", up);
    s_family(f, "swarm_status_polls_total", "counter", "Status polls the dashboard asked.");
    fprintf(f, "swarm_status_polls_total %ld\n", p->polls);
    s_family(f, "swarm_status_poll_failures_total", "counter",
             "Status polls unanswered or answered with a malformed status.");
    fprintf(f, "swarm_status_poll_failures_total %ld\n", p->failures);
    if (up) {
        const json_t *doc = p->doc, *e;
        for (size_t k = 0; k < sizeof s_tops / sizeof s_tops[0]; k++)
            s_top(f, doc, s_tops[k].key, s_tops[k].name, s_tops[k].help);
        const char *state = json_string_value(json_object_get(doc, "state"));
        static const char *const states[] = {"waiting", "training", "done"};
        s_family(f, "swarm_state", "gauge", "1 for the run's state.");
        for (int k = 0; k < 3; k++)
            fprintf(f, "swarm_state{state=\"%s\"} %d\n", states[k], state && !strcmp(state, states[k]));
        static const char *const peer_states[] = {"joining", "ready", "moving", "banned", "dead"};
        s_family(f, "swarm_peers", "gauge", "Peers in the router's table, by state.");
        for (int k = 0; k < 5; k++) {
            size_t i, count = 0;
            json_array_foreach(json_object_get(doc, "peers"), i, e) {
                const char *s = json_string_value(json_object_get(e, "state"));
                count += s && !strcmp(s, peer_states[k]);
            }
            fprintf(f, "swarm_peers{state=\"%s\"} %zu\n", peer_states[k], count);
        }
        for (size_t k = 0; k < sizeof s_tables / sizeof s_tables[0]; k++)
            s_each(f, doc, s_tables[k].table, s_tables[k].key, s_tables[k].name, s_tables[k].help);
        s_counters(f, doc);
    }
    fclose(f);
    return text;
}

// ---- the texts the HTTP side serves -------------------------------------------------

// /api/state: the document while the router answers; else the 503 body
// {"error", "unreachable_since", "last"}. malloc'd; NULL out of memory.
static char *s_state_text(const poll_t *p)
{
    size_t flags = JSON_ENSURE_ASCII | JSON_REAL_PRECISION(15);
    if (p->down_since == 0 && p->doc)
        return json_dumps(p->doc, flags);
    char since[32] = "";
    struct tm tm;
    time_t t = p->down_since ? p->down_since : time(NULL);
    strftime(since, sizeof since, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
    json_t *body = json_pack("{s:s, s:s, s:O}", "error", p->error, "unreachable_since", since,
                             "last", p->doc ? p->doc : json_null());
    char *text = body ? json_dumps(body, flags) : NULL;
    json_decref(body);
    return text;
}

static void s_publish(board_t *b, const poll_t *p)
{
    char *state = s_state_text(p), *metrics = s_metrics(p);
    pthread_mutex_lock(&b->lock);
    if (state) {
        free(b->state);
        b->state = state;
        b->up = p->down_since == 0 && p->doc;
    }
    if (metrics) {
        free(b->metrics);
        b->metrics = metrics;
    }
    pthread_mutex_unlock(&b->lock);
}

// ---- HTTP (libmicrohttpd's thread) ----------------------------------------------------

static enum MHD_Result s_respond(struct MHD_Connection *c, unsigned code, const char *type,
                                 const char *body, size_t len, enum MHD_ResponseMemoryMode mode)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *) body, mode);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    MHD_add_response_header(r, "Cache-Control", "no-store");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    // the page's own script and style only: what the peers named themselves stays text
    MHD_add_response_header(r, "Content-Security-Policy",
                            "default-src 'none'; script-src 'unsafe-inline'; style-src "
                            "'unsafe-inline'; connect-src 'self'; img-src data:");
    enum MHD_Result rc = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result s_copy(board_t *b, struct MHD_Connection *c, int metrics)
{
    pthread_mutex_lock(&b->lock);
    const char *text = metrics ? b->metrics : b->state;
    unsigned code = metrics || b->up ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE;
    enum MHD_Result rc = text ? s_respond(c, code, metrics ? "text/plain; version=0.0.4; charset=utf-8"
                                                           : "application/json",
                                          text, strlen(text), MHD_RESPMEM_MUST_COPY)
                              : MHD_NO;
    pthread_mutex_unlock(&b->lock);
    return rc;
}

static enum MHD_Result s_answer(void *cls, struct MHD_Connection *c, const char *url,
                                const char *method, const char *version, const char *upload,
                                size_t *upload_len, void **per_request)
{
    (void) version;
    (void) upload;
    (void) per_request;
    board_t *b = cls;
    static const char not_get[] = "the dashboard is read-only: GET /, /api/state or /metrics\n";
    static const char missing[] = "not here: the dashboard serves /, /api/state and /metrics\n";
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        return s_respond(c, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain", not_get,
                         sizeof not_get - 1, MHD_RESPMEM_PERSISTENT);
    if (*upload_len) { // a GET with a body: not read
        *upload_len = 0;
        return MHD_YES;
    }
    if (!strcmp(url, "/") || !strcmp(url, "/index.html"))
        return s_respond(c, MHD_HTTP_OK, "text/html; charset=utf-8", swarm_dashboard_start,
                         (size_t) (swarm_dashboard_end - swarm_dashboard_start),
                         MHD_RESPMEM_PERSISTENT);
    if (!strcmp(url, "/api/state") || !strcmp(url, "/metrics"))
        return s_copy(b, c, !strcmp(url, "/metrics"));
    return s_respond(c, MHD_HTTP_NOT_FOUND, "text/plain", missing, sizeof missing - 1,
                     MHD_RESPMEM_PERSISTENT);
}

// A socket listening at `serve` ([HOST:]PORT, HOST an IPv4 address or
// localhost; 127.0.0.1 when absent): the fd and the address it got in
// *where, or -1 with one line printed.
static int s_listen(const char *serve, char *where, size_t cap)
{
    char host[64] = "127.0.0.1";
    const char *colon = strrchr(serve, ':'), *port_text = colon ? colon + 1 : serve;
    if (colon && (size_t) (colon - serve) < sizeof host && colon > serve)
        snprintf(host, sizeof host, "%.*s", (int) (colon - serve), serve);
    char *end = NULL;
    long port = strtol(port_text, &end, 10);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t) port)};
    if (!strcmp(host, "localhost"))
        snprintf(host, sizeof host, "127.0.0.1");
    if (!*port_text || *end || port < 0 || port > 65535 || (colon && colon - serve >= 64) ||
        inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        fprintf(stderr, "swarm status: --serve '%s': give [HOST:]PORT, HOST an IPv4 address "
                "(default 127.0.0.1; 0.0.0.0 for every interface), e.g. --serve 127.0.0.1:8080\n",
                serve);
        return -1;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    socklen_t len = sizeof sa;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, (struct sockaddr *) &sa, sizeof sa) < 0 || listen(fd, 64) < 0 ||
        getsockname(fd, (struct sockaddr *) &sa, &len) < 0) {
        int e = errno;
        fprintf(stderr, "swarm status: --serve %s: cannot listen on %s:%ld (%s)%s\n", serve, host,
                port, strerror(e),
                e == EADDRINUSE ? ": another program has that port; pick another, or 0 for any"
                : e == EACCES ? ": ports below 1024 need root; pick one above"
                : e == EADDRNOTAVAIL ? ": no interface of this machine has that address" : "");
        if (fd >= 0)
            close(fd);
        return -1;
    }
    snprintf(where, cap, "%s:%u", host, (unsigned) ntohs(sa.sin_port));
    return fd;
}

// ---- the poll loop -----------------------------------------------------------------

// Sleep s seconds unless *stop comes first.
static void s_nap(double s, volatile sig_atomic_t *stop)
{
    for (double left = s; left > 0 && !*stop; left -= 0.05) {
        struct timespec t = {0, (long) (fmin(left, 0.05) * 1e9)};
        nanosleep(&t, NULL);
    }
}

// An answer's status text (len bytes, from the network): checked, and
// added to what p holds. 0, or -EPROTO with the reason in err.
static int s_take(poll_t *p, const char *text, size_t len, char *err, size_t errlen)
{
    json_t *fresh = NULL;
    int rc = node_status_load(text, len, &fresh, err, errlen);
    if (rc == 0) {
        p->down_since = 0;
        p->error[0] = '\0';
        s_merge(p, fresh);
    }
    return rc;
}

int node_dashboard_feed(const char *const *texts, const size_t *lens, int n, char **state,
                        char **metrics)
{
    poll_t p = {0};
    int taken = 0;
    for (int i = 0; i < n; i++) {
        char why[400] = "";
        p.polls++;
        if (s_take(&p, texts[i], lens[i], why, sizeof why) == 0) {
            taken++;
            continue;
        }
        p.failures++;
        p.down_since = p.down_since ? p.down_since : 1;
        snprintf(p.error, sizeof p.error, "a malformed status: %s", why);
    }
    *state = s_state_text(&p);
    *metrics = s_metrics(&p);
    json_decref(p.doc);
    return taken;
}

// One poll: the router's answer checked and added, or why not in p->error.
// The log says when the router stops answering and when it answers again.
static void s_poll(poll_t *p, net_client_t *client, const char *addr)
{
    net_msg_t *reply = NULL;
    char err[600] = "";
    p->polls++;
    int rc = node_status_ask(client, addr, p->down_since ? 0 : p->cursor, &reply, err, sizeof err);
    if (rc == -EINTR)
        return;
    if (rc == 0) {
        size_t len = 0;
        const char *text = net_msg_meta(reply, &len);
        char why[400] = "";
        rc = s_take(p, text, len, why, sizeof why);
        if (rc < 0)
            snprintf(err, sizeof err, "%s sent a malformed status: %s", addr, why);
        net_msg_destroy(&reply);
    }
    if (rc == 0) {
        if (p->told)
            printf("swarm status: %s answers again\n", addr);
        p->told = 0;
    } else {
        p->failures++;
        if (!p->told || strcmp(err, p->error) != 0)
            printf("swarm status: %s; the page says so, and the dashboard keeps asking\n", err);
        p->told = 1;
        if (!p->down_since)
            p->down_since = time(NULL);
        snprintf(p->error, sizeof p->error, "%s", err);
    }
    fflush(stdout);
}

int node_dashboard_run(net_client_t *client, const char *addr, const char *serve, double poll_s,
                       volatile sig_atomic_t *stop)
{
    char where[96];
    int fd = s_listen(serve, where, sizeof where);
    if (fd < 0)
        return 1;
    board_t b = {.lock = PTHREAD_MUTEX_INITIALIZER};
    poll_t p = {.down_since = time(NULL)};
    snprintf(p.error, sizeof p.error, "no answer from %s yet", addr);
    s_publish(&b, &p);
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO, 0, NULL, NULL, s_answer, &b,
        MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_LIMIT, (unsigned) BOARD_CONNECTIONS,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned) BOARD_TIMEOUT_S, MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "swarm status: --serve %s: the HTTP server did not start (libmicrohttpd)\n",
                serve);
        close(fd);
        return 1;
    }
    const char *host_note = !strncmp(where, "0.0.0.0:", 8) ? " (every interface: use this "
                            "machine's address)" : "";
    printf("swarm status: dashboard at http://%s/%s, metrics at /metrics; asking %s every %g s; "
           "Ctrl-C stops it\n", where, host_note, addr, poll_s);
    fflush(stdout);
    while (!*stop) {
        s_poll(&p, client, addr);
        s_publish(&b, &p);
        s_nap(poll_s, stop);
    }
    MHD_stop_daemon(d); // (closes fd)
    json_decref(p.doc);
    free(b.state);
    free(b.metrics);
    return 0;
}
