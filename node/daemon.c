/* daemon.c - `swarm node`: the volunteer daemon. It says HELLO to a router
 * until it is assigned a stage, loads that stage's state, then serves the
 * router's FWD and BWD micro-batches, STEP (its gradient), UPDATE (AdamW)
 * and STATE_GET until Ctrl-C, message by message as docs/swarm.md says.
 * This file is the node's connection, queue and timers; the work itself
 * (the stage, its cache, each request's answer) is worker.c's, which
 * `swarm sim --numeric` runs without a socket. Its flags: daemon_flags.c.
 *
 * It decides nothing about the schedule: what runs when is the router's.
 * Everything from the network is checked before use; a bad request gets an
 * ERROR reply and the node keeps running.
 */
#include "daemon_int.h"
#include "swarm.h"
#include "worker.h"

#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <signal.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DAEMON_HELLO_MS 2000        // HELLO resend interval until ASSIGN, ms
#define DAEMON_HEARTBEAT_MS 1000    // HEARTBEAT interval until the router tells one, ms
#define DAEMON_SILENCE_MS 10000     // router silent this long: say HELLO again, ms
#define DAEMON_RECONNECT_MS 5000    // no ASSIGN this long: a fresh link (and handshake), ms
#define DAEMON_BYE_MS 300           // time BYE gets to leave (the socket lingers 0), ms
#define DAEMON_QUEUE_MAX 4096       // requests held in the local FIFO
#define DAEMON_HELLO_IDS 64         // recent HELLO ids (an ERROR to one is fatal)
#define DAEMON_BENCH_S 0.3          // seconds spent measuring tokens/s at start

// ---- state -----------------------------------------------------------------

typedef struct {
    daemon_opts_t o;                       // flags
    blas_backend_t *be;                    // compute (never closed)
    net_key_t *router_key;                 // the router's public key
    node_identity_t id;                    // our key pair, claimed for this process
    net_client_t *client;                  // DEALER to the router
    node_worker_t *w;                      // the stage and its work (worker.c)
    net_msg_t *queue[DAEMON_QUEUE_MAX];    // FIFO of received messages
    int64_t queue_at[DAEMON_QUEUE_MAX];    // when each arrived, net_clock_ms
    size_t queued;                         // messages in the FIFO
    int64_t hello_at;                      // next HELLO due, net_clock_ms
    int64_t heartbeat_at;                  // next HEARTBEAT due, net_clock_ms
    int beat_ms;                           // HEARTBEAT interval, ms (the router's beat_ms)
    int beat_refused;                      // a beat_ms that was no interval was logged
    int silent;                            // 1 while the router's silence is logged
    int finished;                          // 1 after the router said its run is over
    int stalled;                           // --misbehave slowclaim, ckptstall: said so
    int64_t reconnect_at;                  // next fresh link while unassigned, net_clock_ms
    int reconnects;                        // fresh links since the last message
    uint64_t next_id;                      // id of our next request
    uint64_t hello_ids[DAEMON_HELLO_IDS];  // ids of recent HELLOs
    int hello_next;                        // ring index into hello_ids
    double tok_s_bench;                    // tokens/s measured at start
    size_t memory;                         // its budget for a stage (--memory, or 90% free)
    size_t heap_idle;                      // heap in use before any stage (s_heap)
    size_t rss_idle;                       // resident bytes then (s_rss)
    int exit_code;                         // >= 0: leave the loop with this code
} daemon_t;

static volatile sig_atomic_t s_stop;       // set by SIGINT/SIGTERM

// ---- logs ------------------------------------------------------------------

static void s_vsay(FILE *out, const char *fmt, va_list ap)
{
    char when[16];
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(when, sizeof when, "%H:%M:%S", &tm);
    fprintf(out, "%s ", when);
    vfprintf(out, fmt, ap);
    fputc('\n', out);
    fflush(out);
}

// One line on stdout: a notable event.
__attribute__((format(printf, 1, 2)))
static void s_log(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    s_vsay(stdout, fmt, ap);
    va_end(ap);
}

// One line on stderr: something went wrong.
__attribute__((format(printf, 1, 2)))
static void s_warn(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    s_vsay(stderr, fmt, ap);
    va_end(ap);
}

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int s_keys_load(daemon_t *d, char *err, size_t n)
{
    // net_key_load* read files into sodium memory before net calls
    // sodium_init (sodium_malloc aborts otherwise)
    if (sodium_init() < 0) {
        snprintf(err, n, "libsodium failed to initialise");
        return -ENOSYS;
    }
    const char *token = d->o.target.router_key;
    int rc = daemon_router_key_load(d->o.router_key ? d->o.router_key : token, &d->router_key, err, n);
    if (rc == 0 && d->o.router_key && token[0] && strcmp(net_key_public(d->router_key), token)) {
        snprintf(err, n, "--router-key %s is not the key in --join's token; give one of them "
                 "(the token alone is enough)", d->o.router_key);
        rc = -EINVAL;
    }
    if (rc == 0)
        rc = node_identity_open(d->o.key, &d->id, err, n);
    return rc;
}

// Whether d lies in this way now (never outside test builds).
static int s_lying(const daemon_t *d, int mode)
{
#ifdef SWARM_MISBEHAVE
    node_worker_status_t st;
    node_worker_status(d->w, &st);
    return d->o.misbehave == mode && st.step >= d->o.misbehave_from;
#else
    (void) d;
    (void) mode;
    return 0;
#endif
}

// Whether d has a stage assigned.
static int s_assigned(const daemon_t *d)
{
    node_worker_status_t st;
    node_worker_status(d->w, &st);
    return st.stage >= 0;
}


// ---- start: measure, connect ------------------------------------------------

// Small deterministic parameters for the measurement.
static void s_bench_fill(float *p, size_t n)
{
    uint32_t state = 12345;
    for (size_t i = 0; i < n; i++) {
        state = state * 1664525u + 1013904223u;
        p[i] = ((float) (state >> 8) / 16777216.0f - 0.5f) * 0.04f;
    }
}

// Tokens/s of forward + backward of a block of the default shape; 0 when
// the measurement cannot run.
static double s_bench(blas_backend_t *be)
{
    enum { B = 4, T = 64 };
    node_config_t cfg = { .V = NODE_VOCAB, .T = T, .C = 128, .L = 1, .H = 4 };
    node_plan_t plan;
    node_stage_t *st = NULL;
    node_acts_t *acts = NULL;
    int32_t tokens[B * T];
    char err[256];
    double rate = 0.0, elapsed = 0.0, t0;
    float loss;
    if (node_plan_make(&cfg, 1, &plan, err, sizeof err) != 0)
        goto out;
    st = node_stage_new(&cfg, &plan, 0, be, err, sizeof err);
    acts = st ? node_acts_new(st, B, err, sizeof err) : NULL;
    if (!acts)
        goto out;
    s_bench_fill(node_stage_params(st), node_stage_param_count(st));
    for (int i = 0; i < B * T; i++)
        tokens[i] = (i * 37 + 11) % NODE_VOCAB;
    node_stage_in_t in = { .tokens = tokens, .targets = tokens,
                           .loss_scale = 1.0f / (B * T), .want_backward = 1 };
    if (node_stage_params_changed(st) != 0 || node_stage_forward(st, acts, &in, NULL, &loss, NULL))
        goto out; // the first run warms up threads and caches
    long runs = 0;
    for (t0 = s_now(); elapsed < DAEMON_BENCH_S; runs++, elapsed = s_now() - t0)
        if (node_stage_forward(st, acts, &in, NULL, &loss, NULL) != 0)
            goto out;
    rate = (double) runs * B * T / elapsed;
out:
    node_acts_destroy(&acts);
    node_stage_destroy(&st);
    return rate;
}

// The most one message from the router may carry: what the node may hold
// (its budget is at least its stage's need, which holds the largest a
// router sends it: the stage's state). The transport drops a larger frame
// before anything of it is allocated, and the link with it.
static uint64_t s_frame_cap(const daemon_t *d)
{
    uint64_t cap = (uint64_t) d->memory + 4096;
    return d->memory > 0 && cap < NET_PAYLOAD_MAX ? cap : NET_PAYLOAD_MAX;
}

static int s_client_open(daemon_t *d, char *err, size_t n)
{
    net_client_config_t c = {
        .endpoint = d->o.join, .server = d->router_key, .key = d->id.key,
        .limits = { .max_tensors = NET_TENSORS_MAX, .max_dims = NET_DIMS_MAX,
                    .max_dim = 1u << 30, .max_payload = s_frame_cap(d), .max_meta = 1u << 16 },
    };
    char why[512] = "";
    int rc = net_client_new(&c, &d->client, why, sizeof why);
    if (rc != 0)
        snprintf(err, n, "--join %s: %s", d->o.join, why);
    return rc;
}

// The first line, once the node can run: who it is (two nodes on one
// machine: two keys), and its name follows the key (host, host-2, ...).
static void s_identity_say(daemon_t *d)
{
    const char *note = d->id.note;
    char how[200] = "";
    if (d->id.made || note[0])
        snprintf(how, sizeof how, " (%s%s%s)", d->id.made ? "new" : "",
                 d->id.made && note[0] ? "; " : "", note);
    s_log("node key %s.key%s, public key %s", d->id.name, how, net_key_public(d->id.key));
    size_t len = strlen(d->o.name);
    if (!d->o.name_given && d->id.index > 1 && len + 12 < sizeof d->o.name)
        snprintf(d->o.name + len, sizeof d->o.name - len, "-%d", d->id.index);
}

// The worker's notable lines, as ours.
static void s_worker_log(void *ctx, const char *line)
{
    (void) ctx;
    s_log("%s", line);
}

// Bytes of heap in use now (glibc's mallinfo2: small blocks and mmapped
// ones), what the node's allocations add up to, measured.
static size_t s_heap(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

// This process's resident set in bytes (/proc/self/statm), 0 unknown.
static size_t s_rss(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long pages = 0, rss = 0;
    int ok = f && fscanf(f, "%llu %llu", &pages, &rss) == 2;
    if (f)
        fclose(f);
    long page = sysconf(_SC_PAGESIZE);
    return ok && page > 0 ? (size_t) (rss * (unsigned long long) page) : 0;
}

// Bytes of RAM the kernel says are available now (MemAvailable), 0 unknown.
static size_t s_ram_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[128];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return (size_t) kb * 1024;
}

// The node's memory budget: --memory, or 90% of what is available at
// start (RAM for the CPU, the device's memory for a GPU). Said once.
static void s_memory_budget(daemon_t *d)
{
    int cpu = !strcmp(d->be->name, "cpu");
    size_t avail = cpu ? s_ram_available() : d->be->memory;
    d->memory = d->o.memory ? d->o.memory : (size_t) (0.9 * (double) avail);
    if (d->o.memory)
        s_log("memory budget %.1f MiB (--memory)", d->memory / 1048576.0);
    else if (d->memory)
        s_log("memory budget %.1f MiB: 90%% of the %.1f MiB %s (--memory to change it)",
              d->memory / 1048576.0, avail / 1048576.0,
              cpu ? "of RAM available" : "of the GPU's memory free");
    else
        s_log("memory budget unknown (this machine does not say what it has free): any stage "
              "(--memory to set one)");
}

static int s_setup(daemon_t *d, char *err, size_t n)
{
    char why[512] = "";
    int rc = s_keys_load(d, err, n);
    if (rc != 0)
        return rc;
    d->be = blas_backend_open(d->o.device, d->o.threads, why, sizeof why);
    if (!d->be) {
        snprintf(err, n, "%s", why); // names --device already
        return -ENODEV;
    }
    s_identity_say(d);
    if (why[0])
        s_log("%s", why); // what --device auto chose
    // with --slowdown F, the speed of the device F times slower it plays
    d->tok_s_bench = s_bench(d->be) / d->o.slowdown;
    s_memory_budget(d);
    d->heap_idle = s_heap(); // before any stage: what a stage adds is measured from here
    d->rss_idle = s_rss();
    node_worker_config_t wc = { .be = d->be, .cache_mb = d->o.cache_mb, .memory = d->memory,
                                .slowdown = d->o.slowdown, .log = s_worker_log };
    if (!(d->w = node_worker_new(&wc)))
        abort(); // a bookkeeping allocation
    // the lies in what it computes are the worker's (the others: NODE_LIE_NONE)
    static const int lies[MIS_RECOUNT + 1] = { [MIS_NAN] = NODE_LIE_NAN,
        [MIS_SCALE] = NODE_LIE_SCALE, [MIS_DRIFT] = NODE_LIE_DRIFT,
        [MIS_SHUFFLE] = NODE_LIE_SHUFFLE, [MIS_GRAD] = NODE_LIE_GRAD,
        [MIS_SUMSQ] = NODE_LIE_SUMSQ, [MIS_DX] = NODE_LIE_DX, [MIS_STATE] = NODE_LIE_STATE,
        [MIS_GRADINF] = NODE_LIE_GRADINF, [MIS_RMSWALK] = NODE_LIE_RMSWALK,
        [MIS_CHECKSUM] = NODE_LIE_CHECKSUM, [MIS_RECOUNT] = NODE_LIE_RECOUNT };
    if (lies[d->o.misbehave] != NODE_LIE_NONE)
        node_worker_lie(d->w, lies[d->o.misbehave], d->o.misbehave_from);
    s_log("%s: %.0f tokens/s (forward + backward of a block of the default shape%s)",
          d->be->device, d->tok_s_bench, d->o.slowdown > 1.0 ? ", with --slowdown" : "");
    rc = s_client_open(d, err, n);
    if (rc == 0)
        s_log("joining %s as '%s'", d->o.join, d->o.name);
    d->next_id = ((uint64_t) randombytes_random() << 32) | 1;
    return rc;
}

// ---- sending ---------------------------------------------------------------

// Send msg (taken). Requests get a fresh id. Failures are logged when loud.
static int s_send(daemon_t *d, net_msg_t **msg, int loud)
{
    net_head_t *head = net_msg_head(*msg);
    int type = head->type;
    if (!(head->flags & NET_FLAG_REPLY))
        head->id = d->next_id++;
    int rc = net_client_send(d->client, msg);
    if (rc != 0 && loud)
        s_warn("cannot send %s to the router: %s", net_msg_type_name(type), strerror(-rc));
    return rc;
}

static net_msg_t *s_msg_new(int type)
{
    net_msg_t *msg = net_msg_new(type);
    if (!msg)
        abort(); // a bookkeeping allocation
    return msg;
}

// What d claims of its speed, as a factor of what it has: --misbehave
// speed 1000x (from its step on), slowclaim a millionth from its first
// word (a deadline once followed from the claim); 1 for an honest node.
static double s_claimed(const daemon_t *d)
{
    return (s_lying(d, MIS_SPEED) ? 1000.0 : 1.0) * (d->o.misbehave == MIS_SLOWCLAIM ? 1e-6 : 1.0);
}

// The HELLO: who this node is, what it may hold, and its speed.
static void s_hello_send(daemon_t *d)
{
    char meta[512];
    double tok_s = d->tok_s_bench * s_claimed(d); // the same yardstick for every node
    snprintf(meta, sizeof meta, "proto=1\nname=%s\ndevice=%s\nthreads=%d\nmemory=%zu\ntok_s=%.6g",
             d->o.name, d->be->device, d->be->threads, d->memory, tok_s);
    net_msg_t *msg = s_msg_new(NET_MSG_HELLO);
    node_meta_set(msg, meta);
    uint64_t id = d->next_id;
    if (s_send(d, &msg, 0) == 0) {
        d->hello_ids[d->hello_next] = id;
        d->hello_next = (d->hello_next + 1) % DAEMON_HELLO_IDS;
    }
}

static void s_heartbeat_send(daemon_t *d)
{
    char meta[384];
    node_worker_status_t st;
    node_worker_status(d->w, &st);
    double tok_s = (st.tok_s > 0 ? st.tok_s : d->tok_s_bench) * s_claimed(d);
    size_t heap = s_heap(), rss = s_rss();
    size_t device = d->be->memory_used ? d->be->memory_used(d->be) : 0; // (a GPU's)
    snprintf(meta, sizeof meta, "stage=%d\nqueue=%zu\ntok_s=%.6g\nstep=%ld\nslots=%zu\n"
             "memory_used=%zu\nmemory_heap=%zu\nrss=%zu\nrss_grown=%zu\ndevice_used=%zu",
             st.stage, d->queued, tok_s, st.step, st.slots, st.memory_used,
             heap > d->heap_idle ? heap - d->heap_idle : 0, rss,
             rss > d->rss_idle ? rss - d->rss_idle : 0, device);
    for (int i = 0; i < (s_lying(d, MIS_FLOOD) ? 500 : 1); i++) {
        net_msg_t *msg = s_msg_new(NET_MSG_HEARTBEAT);
        node_meta_set(msg, meta);
        (void) s_send(d, &msg, 0);
    }
}

// Answer req with ERROR reason=TEXT (one line).
static void s_reply_error(daemon_t *d, const net_msg_t *req, const char *reason)
{
    net_msg_t *msg = node_worker_error(req, reason);
    (void) s_send(d, &msg, 1);
}

// ---- ASSIGN ----------------------------------------------------------------

// The HEARTBEAT interval the router's ASSIGN or HEARTBEAT tells (a big
// swarm's nodes beat less often: docs/wire.md), checked; a next HEARTBEAT
// due later than the new interval comes sooner.
static void s_beat_told(daemon_t *d, const net_msg_t *msg)
{
    char said[32];
    int ms = swarm_beat_ms(msg, said, sizeof said);
    if (ms < 0 && !d->beat_refused++)
        s_warn("ignoring the router's heartbeat interval beat_ms=%s (not 1000-60000 ms); "
               "heartbeats stay every %d ms", said, d->beat_ms);
    if (ms > 0)
        d->beat_ms = ms;
    if (ms > 0 && d->heartbeat_at > net_clock_ms() + ms)
        d->heartbeat_at = net_clock_ms() + ms;
}

static void s_on_assign(daemon_t *d, const net_msg_t *msg)
{
    s_beat_told(d, msg);
    char err[512] = "";
    int rc = node_worker_assign(d->w, msg, err, sizeof err);
    if (rc >= 0)
        d->finished = 0; // a router's run (again)
    if (rc < 0) {
        s_warn("ASSIGN refused: %s", err);
        s_reply_error(d, msg, err);
    }
}

// ---- dispatch --------------------------------------------------------------

static int s_is_hello_id(const daemon_t *d, uint64_t id)
{
    for (int i = 0; i < DAEMON_HELLO_IDS; i++)
        if (d->hello_ids[i] == id && id != 0)
            return 1;
    return 0;
}

static void s_on_error(daemon_t *d, const net_msg_t *msg)
{
    char reason[512];
    if (net_msg_meta_get(msg, "reason", reason, sizeof reason) != 0)
        snprintf(reason, sizeof reason, "(no reason given)");
    for (char *c = reason; *c; c++) // the router's text: no control codes reach a terminal
        *c = (unsigned char) *c < 0x20 || *c == 0x7f ? '?' : *c;
    char fatal[4] = "", notice[4] = "";
    if (net_msg_meta_get(msg, "fatal", fatal, sizeof fatal) != 0)
        fatal[0] = '\0'; // an ERROR that ends the node says fatal=1
    if (net_msg_meta_get(msg, "notice", notice, sizeof notice) == 0 && !strcmp(notice, "1")) {
        s_log("the router says: %s", reason); // news for us, nothing failed
        return;
    }
    if (((net_msg_head_const(msg)->flags & NET_FLAG_REPLY)
         && s_is_hello_id(d, net_msg_head_const(msg)->id)) || !strcmp(fatal, "1")) {
        s_warn("swarm node: the router refused us: %s", reason);
        d->exit_code = 1;
    } else {
        s_warn("router error: %s", reason);
    }
}

// The router leaves: its run is over (done=1, at step= of steps=), or it
// stops and may come back. Said once; then HELLO now and then, quietly,
// so that the router's next run (or its restart) finds us.
static void s_on_bye(daemon_t *d, const net_msg_t *msg)
{
    char done[4] = "", step[24] = "?", steps[24] = "?";
    if (net_msg_meta_get(msg, "done", done, sizeof done) != 0)
        done[0] = '\0';
    if (net_msg_meta_get(msg, "step", step, sizeof step) != 0 || strspn(step, "0123456789") != strlen(step))
        snprintf(step, sizeof step, "?");
    if (net_msg_meta_get(msg, "steps", steps, sizeof steps) != 0 || strspn(steps, "0123456789") != strlen(steps))
        snprintf(steps, sizeof steps, "?");
    d->finished = 1;
    d->silent = 0;
    if (!strcmp(done, "1") && d->o.exit_when_done) {
        s_log("the run is over (step %s of %s, the router says); exiting (--exit-when-done)",
              step, steps);
        d->exit_code = 0;
    } else if (!strcmp(done, "1")) {
        s_log("the run is over (step %s of %s, the router says); waiting for the router's next "
              "run (Ctrl-C leaves)", step, steps);
    } else {
        s_log("the router stopped at step %s of %s; waiting for it to come back (Ctrl-C leaves)",
              step, steps);
    }
    d->hello_at = net_clock_ms() + DAEMON_HELLO_MS;
}

// A request of the router: 0 and maybe *reply, or an error with a reason.
static int s_on_request(daemon_t *d, const net_msg_t *msg, net_msg_t **reply, char *err,
                        size_t n)
{
    if (net_msg_head_const(msg)->type == NET_MSG_BYE) {
        s_on_bye(d, msg);
        return 0;
    }
    return node_worker_serve(d->w, msg, reply, err, n);
}

// --misbehave slowclaim (a speed claimed a million times below its own,
// then no FWD or BWD answered) and ckptstall (no STATE_GET answered: a
// checkpoint's read, a joiner's state): whether d holds this request for
// good, said once. joinhold: the state it is to load is held
// DAEMON_JOINHOLD_MS (the swarm waits for a joiner's state), then the node
// says BYE and exits 0 (a test starts it again, and again).
#define DAEMON_JOINHOLD_MS 3000
static void s_leave(daemon_t *d);
static int s_stall_maybe(daemon_t *d, const net_head_t *h)
{
    if (h->type == NET_MSG_STATE && s_lying(d, MIS_JOINHOLD)) {
        s_warn("swarm node: --misbehave joinhold: holding the state of step %" PRIu64
               " %d ms, then leaving", h->step, DAEMON_JOINHOLD_MS);
        struct timespec t = { DAEMON_JOINHOLD_MS / 1000, (DAEMON_JOINHOLD_MS % 1000) * 1000000L };
        while (nanosleep(&t, &t) < 0 && errno == EINTR)
            ;
        s_leave(d);
        d->exit_code = 0;
        return 1;
    }
    int held = (h->type == NET_MSG_FWD || h->type == NET_MSG_BWD) ? s_lying(d, MIS_SLOWCLAIM)
             : h->type == NET_MSG_STATE_GET && s_lying(d, MIS_CKPTSTALL);
    if (held && !d->stalled) {
        s_warn("swarm node: --misbehave %s: holding %s of step %" PRIu64 " (and each one after)",
               d->o.misbehave == MIS_SLOWCLAIM ? "slowclaim" : "ckptstall",
               net_msg_type_name(h->type), h->step);
        d->stalled = 1;
    }
    return held;
}

// Serve one message (taken) that arrived at `arrived` (net_clock_ms).
static void s_serve(daemon_t *d, net_msg_t **msg_p, int64_t arrived)
{
    const net_head_t *h = net_msg_head_const(*msg_p);
    net_msg_t *reply = NULL;
    char err[512] = "";
    if (!(h->flags & NET_FLAG_REPLY) && s_stall_maybe(d, h)) {
        net_msg_destroy(msg_p);
        return;
    }
    if (h->type == NET_MSG_ASSIGN)
        s_on_assign(d, *msg_p);
    else if (h->type == NET_MSG_ERROR)
        s_on_error(d, *msg_p);
    else if (!(h->flags & NET_FLAG_REPLY)
             && s_on_request(d, *msg_p, &reply, err, sizeof err) != 0) {
        s_warn("%s step %" PRIu64 " stage %" PRIu32 " mb %" PRIu32 ": %s",
               net_msg_type_name(h->type), h->step, h->stage, h->mb, err);
        net_msg_destroy(&reply);
        s_reply_error(d, *msg_p, err);
    }
    if (reply && (h->type == NET_MSG_FWD || h->type == NET_MSG_BWD)) {
        // how long we held it and how much of that was work: the router
        // tells the network's round trip from its own (docs/swarm.md, window)
        node_worker_status_t st;
        node_worker_status(d->w, &st);
        node_meta_add(reply, "held=%.6f\nbusy=%.6f", (double) (net_clock_ms() - arrived) / 1000.0,
                      st.busy);
    }
    if (reply)
        (void) s_send(d, &reply, 1);
    net_msg_destroy(msg_p); // other replies are stale or unasked for
}

// The next message to serve: a BWD before the FWDs ahead of it, and a FWD
// or BWD before a STATE_GET ahead of it (it reads the parameters and
// moments, which only UPDATE changes: a checkpoint's read waits for a gap
// in the work instead of holding up the next step's first forward), but
// nothing overtakes any other control message (ASSIGN, STATE, STEP,
// UPDATE, ...).
static net_msg_t *s_queue_pick(daemon_t *d, int64_t *arrived)
{
    size_t work = d->queued; // the first BWD, else the first FWD, within reach
    for (size_t i = 0; i < d->queued; i++) {
        int type = net_msg_head_const(d->queue[i])->type;
        if (type == NET_MSG_BWD) {
            work = i;
            break;
        }
        if (type == NET_MSG_FWD && work == d->queued)
            work = i;
        if (type != NET_MSG_FWD && type != NET_MSG_STATE_GET)
            break;
    }
    size_t pick = work < d->queued ? work : 0;
    net_msg_t *msg = d->queue[pick];
    *arrived = d->queue_at[pick];
    memmove(&d->queue[pick], &d->queue[pick + 1], (d->queued - pick - 1) * sizeof *d->queue);
    memmove(&d->queue_at[pick], &d->queue_at[pick + 1], (d->queued - pick - 1) * sizeof *d->queue_at);
    d->queued--;
    return msg;
}

// Move every message waiting (the first one waited for until deadline_ms)
// into the FIFO.
static void s_drain(daemon_t *d, int64_t deadline_ms)
{
    char err[512];
    while (d->queued < DAEMON_QUEUE_MAX) {
        net_msg_t *msg = NULL;
        int rc = net_client_recv(d->client, deadline_ms, &msg, err, sizeof err);
        if (rc == 0 && net_msg_head_const(msg)->type == NET_MSG_HEARTBEAT) {
            s_beat_told(d, msg); // the router's probe of the link, or a new interval
            net_msg_destroy(&msg);
        } else if (rc == 0) {
            d->queue_at[d->queued] = net_clock_ms();
            d->queue[d->queued++] = msg;
            deadline_ms = 0; // the rest only if already there
        } else if (rc == -EPROTO) {
            s_warn("dropped a malformed message from the router: %s", err);
        } else {
            if (rc != -ETIMEDOUT && rc != -EINTR) {
                s_warn("swarm node: receiving from the router failed: %s", strerror(-rc));
                d->exit_code = 1;
            }
            break;
        }
    }
}

// ---- the loop --------------------------------------------------------------

// HELLO until assigned (or while the router is silent), HEARTBEAT when assigned.
static void s_timers(daemon_t *d, int64_t now)
{
    int64_t quiet = net_client_silence_ms(d->client, now);
    if (s_assigned(d) && quiet > DAEMON_SILENCE_MS && !d->silent && !d->finished) {
        s_log("the router has been silent for %lld s; saying HELLO again (it may have "
              "restarted)", (long long) quiet / 1000);
        d->silent = 1;
        d->hello_at = now;
    } else if (quiet <= DAEMON_SILENCE_MS && d->silent) {
        s_log("the router is back");
        d->silent = 0;
    }
    if (!s_assigned(d) && quiet > DAEMON_RECONNECT_MS && now >= d->reconnect_at) {
        // a router that refused our key (not yet on its allow-list) ends the
        // link for good: libzmq does not retry it, so start a fresh one
        if (d->reconnects++ == 0)
            s_log("no answer from the router in %d s; connecting again every %d s (a private "
                  "swarm admits only keys on its allow-list)", DAEMON_RECONNECT_MS / 1000,
                  DAEMON_RECONNECT_MS / 1000);
        if (net_client_reconnect(d->client) != 0)
            s_warn("cannot connect to %s again", d->o.join);
        d->reconnect_at = now + DAEMON_RECONNECT_MS;
        d->hello_at = now;
    } else if (quiet <= DAEMON_RECONNECT_MS) {
        d->reconnects = 0;
    }
    if ((!s_assigned(d) || d->silent || d->finished) && now >= d->hello_at) {
        s_hello_send(d);
        d->hello_at = now + DAEMON_HELLO_MS;
    }
    if (s_assigned(d) && now >= d->heartbeat_at) {
        s_heartbeat_send(d);
        d->heartbeat_at = now + d->beat_ms;
    }
}

static int64_t s_next_due(const daemon_t *d, int64_t now)
{
    int64_t due = now + DAEMON_HEARTBEAT_MS;
    if (s_assigned(d) && d->heartbeat_at < due)
        due = d->heartbeat_at;
    if ((!s_assigned(d) || d->silent || d->finished) && d->hello_at < due)
        due = d->hello_at;
    return due;
}

// --misbehave crash: die without a word (as a machine that loses power)
// while a BWD is unserved and its stage's STEP is queued behind it: the
// router must run that backward elsewhere and ask for the sums again.
static void s_crash_maybe(const daemon_t *d, const net_msg_t *msg)
{
    if (!s_lying(d, MIS_CRASH) || net_msg_head_const(msg)->type != NET_MSG_BWD)
        return;
    for (size_t i = 0; i < d->queued; i++) {
        if (net_msg_head_const(d->queue[i])->type == NET_MSG_STEP) {
            s_warn("swarm node: --misbehave crash: dying with a BWD of step %" PRIu64
                   " unserved and the STEP behind it", net_msg_head_const(msg)->step);
            _exit(3);
        }
    }
}

static void s_run(daemon_t *d)
{
    d->exit_code = -1;
    while (!s_stop && d->exit_code < 0) {
        int64_t now = net_clock_ms();
        s_timers(d, now);
        s_drain(d, d->queued ? 0 : s_next_due(d, now));
        if (d->queued && !s_stop && d->exit_code < 0) {
            int64_t arrived = 0;
            net_msg_t *msg = s_queue_pick(d, &arrived);
            s_crash_maybe(d, msg);
            s_serve(d, &msg, arrived);
        }
    }
}

// Say BYE and give it a moment to leave before the socket closes.
static void s_leave(daemon_t *d)
{
    net_msg_t *bye = s_msg_new(NET_MSG_BYE);
    if (s_send(d, &bye, 1) == 0) {
        int64_t until = net_clock_ms() + DAEMON_BYE_MS;
        while (net_clock_ms() < until) {
            net_msg_t *msg = NULL;
            char err[256];
            if (net_client_recv(d->client, until, &msg, err, sizeof err) == 0)
                net_msg_destroy(&msg);
        }
    }
    node_worker_status_t st;
    node_worker_status(d->w, &st);
    s_log("left the swarm (%ld micro-batches of gradient computed here on %s)", st.samples_total,
          d->be->device);
}

static void s_on_signal(int sig)
{
    (void) sig;
    s_stop = 1;
}

static void s_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = s_on_signal; // no SA_RESTART: a blocking wait returns EINTR
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

static void s_teardown(daemon_t *d)
{
    node_worker_destroy(&d->w);
    while (d->queued)
        net_msg_destroy(&d->queue[--d->queued]);
    net_client_destroy(&d->client);
    node_identity_close(&d->id);
    net_key_destroy(&d->router_key);
    free(d);
}

int cmd_node(int argc, char **argv)
{
    daemon_t *d = calloc(1, sizeof *d);
    char err[1024] = "";
    if (!d)
        abort();
    d->id.lock_fd = -1;
    d->beat_ms = DAEMON_HEARTBEAT_MS;
    int rc = daemon_parse(argc, argv, &d->o, err, sizeof err);
    if (rc == 1) {
        daemon_usage(stdout);
        rc = 0;
        goto out;
    }
    s_signals();
    if (rc == 0)
        rc = s_setup(d, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "swarm node: %s\n", err);
        rc = 1;
        goto out;
    }
    s_run(d);
    rc = d->exit_code > 0 ? d->exit_code : 0;
    if (s_stop)
        s_leave(d);
out:
    s_teardown(d);
    return rc;
}
