/* daemon.c - `swarm node`: the volunteer daemon. It says HELLO to a router
 * until it is assigned a stage, loads that stage's state, then serves the
 * router's FWD and BWD micro-batches, STEP (its gradient), UPDATE (AdamW)
 * and STATE_GET until Ctrl-C, message by message as docs/swarm.md says.
 *
 * It decides nothing about the schedule: what runs when is the router's.
 * Everything from the network is checked before use; a bad request gets an
 * ERROR reply and the node keeps running.
 */
#include "net.h"
#include "node.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define DAEMON_HELLO_MS 2000        // HELLO resend interval until ASSIGN, ms
#define DAEMON_HEARTBEAT_MS 1000    // HEARTBEAT interval, ms
#define DAEMON_SILENCE_MS 10000     // router silent this long: say HELLO again, ms
#define DAEMON_RECONNECT_MS 5000    // no ASSIGN this long: a fresh link (and handshake), ms
#define DAEMON_BYE_MS 300           // time BYE gets to leave (the socket lingers 0), ms
#define DAEMON_QUEUE_MAX 4096       // requests held in the local FIFO
#define DAEMON_SLOTS_MAX 256        // micro-batches of cached activations at most
#define DAEMON_HELLO_IDS 64         // recent HELLO ids (an ERROR to one is fatal)
#define DAEMON_BENCH_S 0.3          // seconds spent measuring tokens/s at start

// ---- state -----------------------------------------------------------------

typedef struct {
    const char *join;         // router endpoint, tcp://HOST:PORT (in target)
    node_join_t target;       // --join, parsed (a token carries the router's key)
    const char *router_key;   // the router's .pub file, or its Z85 key; NULL: the token's
    int name_given;           // --name was given
    int exit_when_done;       // --exit-when-done: exit 0 once the router's run is over
    const char *key;          // our key pair NAME (NAME.key, NAME.pub); NULL = default
    const char *device;       // backend: auto, cpu, cuda[:N]
    int threads;              // CPU threads, 0 = all cores
    char name[65];            // shown in the router's table
    long cache_mb;            // MiB of cached activations at most
    double slowdown;          // >= 1: sleep so that work takes this many times longer
    int misbehave;            // MIS_* (test builds only: --misbehave)
    long misbehave_from;      // the step it starts at
} daemon_opts_t;

// A test build (build/swarm-misbehave, -DSWARM_MISBEHAVE) has --misbehave
// MODE[@STEP]: from STEP on the node lies in one way (or, crash, dies the
// first time a BWD it is about to serve has a STEP queued behind it), so
// that tests can watch the router cope. The swarm binary has no such flag.
enum { MIS_NONE, MIS_NAN, MIS_SCALE, MIS_DRIFT, MIS_FLOOD, MIS_SPEED, MIS_SHUFFLE, MIS_CRASH };

typedef struct {
    node_acts_t *acts;        // activations of one micro-batch (micro windows)
    uint64_t step;            // key: step of the FWD that filled it
    uint32_t mb;              // key: micro-batch of that FWD
    uint64_t seq;             // fill order (larger = newer); 0 = free
} daemon_slot_t;

typedef struct {
    node_config_t cfg;        // model shape
    int stages;               // S
    int stage;                // s
    int micro;                // windows per micro-batch
    long peer;                // the router's id for us (logs), -1 unknown
    long step;                // the swarm's step
    int wire;                 // NET_DTYPE_* of the activations and dx we send (meta wire)
    int grad_wire;            // NET_DTYPE_* of the gradient sums we send (meta grad_wire)
} daemon_assign_t;

typedef struct {
    daemon_opts_t o;                       // flags
    blas_backend_t *be;                    // compute (never closed)
    net_key_t *router_key;                 // the router's public key
    node_identity_t id;                    // our key pair, claimed for this process
    net_client_t *client;                  // DEALER to the router
    daemon_assign_t as;                    // what we were assigned
    node_plan_t plan;                      // stages of as.cfg
    node_stage_t *stage;                   // NULL until ASSIGN
    int ready;                             // 1 once STATE loaded the stage
    long step;                             // updates applied
    long samples;                          // micro-batches accumulated since UPDATE
    long samples_total;                    // micro-batches of gradient computed here, all steps
    int norm_only;                         // the last STEP asked only for the sum of squares
    int32_t *tokens, *targets;             // (micro, T)
    float *x, *dy, *out;                   // (micro, T, C)
    daemon_slot_t slots[DAEMON_SLOTS_MAX]; // activation cache, nslots used
    int nslots;                            // slots with acts allocated
    uint64_t seq;                          // last slot fill number
    net_msg_t *queue[DAEMON_QUEUE_MAX];    // FIFO of received messages
    int64_t queue_at[DAEMON_QUEUE_MAX];    // when each arrived, net_clock_ms
    size_t queued;                         // messages in the FIFO
    int64_t hello_at;                      // next HELLO due, net_clock_ms
    int64_t heartbeat_at;                  // next HEARTBEAT due, net_clock_ms
    int silent;                            // 1 while the router's silence is logged
    int finished;                          // 1 after the router said its run is over
    int64_t reconnect_at;                  // next fresh link while unassigned, net_clock_ms
    int reconnects;                        // fresh links since the last message
    uint64_t next_id;                      // id of our next request
    uint64_t hello_ids[DAEMON_HELLO_IDS];  // ids of recent HELLOs
    int hello_next;                        // ring index into hello_ids
    double tok_s_bench;                    // tokens/s measured at start
    double tok_s;                          // training tokens/s on its stage (0 = none yet)
    double work_tok, work_s;               // decaying sums behind tok_s (s_tok_s_note)
    double busy;                           // s: compute of the last FWD/BWD (with --slowdown)
    double usual_s[3];                     // s: usual compute of a FWD, BWD, fused pair (0 = none yet)
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

// ---- flags -----------------------------------------------------------------

enum { O_JOIN = 1, O_ROUTER_KEY, O_KEY, O_DEVICE, O_THREADS, O_NAME, O_CACHE, O_HELP, O_SLOW,
       O_EXIT_DONE, O_MISBEHAVE };

static const struct option s_long[] = {
    {"join", 1, 0, O_JOIN}, {"router-key", 1, 0, O_ROUTER_KEY}, {"key", 1, 0, O_KEY},
    {"device", 1, 0, O_DEVICE}, {"threads", 1, 0, O_THREADS}, {"name", 1, 0, O_NAME},
    {"cache-mb", 1, 0, O_CACHE}, {"slowdown", 1, 0, O_SLOW}, {"help", 0, 0, O_HELP},
    {"exit-when-done", 0, 0, O_EXIT_DONE},
#ifdef SWARM_MISBEHAVE
    {"misbehave", 1, 0, O_MISBEHAVE},
#endif
    {0, 0, 0, 0},
};

static void s_usage(FILE *out)
{
    fprintf(out,
        "usage: swarm node --join swarm://HOST:PORT/KEY [flags]\n"
        "       swarm node --join tcp://HOST:PORT --router-key KEY [flags]\n"
        "Join a swarm as a volunteer: hold one pipeline stage of the model, run its\n"
        "forward and backward passes for the router and apply its updates.\n"
        "\n"
        "  --join ADDR             the router (required): the swarm://HOST:PORT/KEY token\n"
        "                          it printed (address and key), or tcp://HOST:PORT\n"
        "  --router-key KEY        with tcp://: the router's public key, its .pub file or\n"
        "                          the 40-character Z85 key in single quotes\n"
        "  --key NAME              this node's key pair NAME.key / NAME.pub, made if\n"
        "                          missing (default: the first of\n"
        "                          $XDG_CONFIG_HOME/swarm/node, node-2, ... that no other\n"
        "                          node on this machine uses)\n"
        "  --name NAME             shown in the router's table (default: the host name,\n"
        "                          with -N for the key node-N)\n"
        "  --device DEV            auto, cpu or cuda[:N] (default auto: a GPU if one works)\n"
        "  --threads N             CPU threads (default: all cores)\n"
        "  --slowdown F            work F times slower (sleeps), to emulate a slower device\n"
        "                          (default 1)\n"
        "  --cache-mb N            activations kept for backward, MiB (default 512;\n"
        "                          0 recomputes the forward for every backward)\n"
        "  --exit-when-done        exit 0 when the router's run is over (default: wait\n"
        "                          for the router's next run)\n"
        "Ctrl-C says BYE to the router and leaves.\n");
}

static int s_parse_name(daemon_opts_t *o, const char *arg, char *err, size_t n)
{
    size_t len = strlen(arg);
    int bad = len == 0 || len >= sizeof o->name;
    for (size_t i = 0; i < len && !bad; i++)
        bad = (unsigned char) arg[i] < 0x20 || arg[i] == 0x7f;
    if (bad) {
        snprintf(err, n, "--name '%s': expected 1..%zu printable characters", arg,
                 sizeof o->name - 1);
        return -EINVAL;
    }
    memcpy(o->name, arg, len + 1);
    return 0;
}

#ifdef SWARM_MISBEHAVE
static int s_parse_misbehave(daemon_opts_t *o, const char *arg, char *err, size_t n)
{
    static const char *modes[] = { "", "nan", "scale", "drift", "flood", "speed", "shuffle", "crash" };
    const char *at = strchr(arg, '@');
    size_t len = at ? (size_t) (at - arg) : strlen(arg);
    for (int m = 1; m < (int) (sizeof modes / sizeof modes[0]); m++) {
        if (strlen(modes[m]) == len && !strncmp(arg, modes[m], len)) {
            o->misbehave = m;
            return at ? node_parse_long("misbehave STEP", at + 1, 0, LONG_MAX, &o->misbehave_from,
                                        err, n) : 0;
        }
    }
    snprintf(err, n, "--misbehave %s: expected nan|scale|drift|flood|speed|shuffle|crash[@STEP]", arg);
    return -EINVAL;
}
#endif

static int s_parse_join(daemon_opts_t *o, const char *arg, char *err, size_t n)
{
    char why[600];
    int rc = node_join_parse(arg, &o->target, why, sizeof why);
    if (rc == 0)
        o->join = o->target.endpoint;
    else
        snprintf(err, n, "--join %s", why);
    return rc;
}

// 0, 1 for --help, or -EINVAL with a reason.
static int s_parse_one(daemon_opts_t *o, int id, const char *arg, const char *flag, char *err,
                       size_t n)
{
    long v = 0;
    int rc = 0;
    switch (id) {
    case O_JOIN: rc = s_parse_join(o, arg, err, n); break;
    case O_ROUTER_KEY: o->router_key = arg; break;
    case O_KEY: o->key = arg; break;
    case O_DEVICE: o->device = arg; break;
    case O_THREADS: rc = node_parse_long("threads", arg, 0, 4096, &v, err, n); o->threads = (int) v; break;
    case O_NAME: rc = s_parse_name(o, arg, err, n); o->name_given = 1; break;
    case O_EXIT_DONE: o->exit_when_done = 1; break;
    case O_CACHE: rc = node_parse_long("cache-mb", arg, 0, 1L << 24, &o->cache_mb, err, n); break;
    case O_SLOW: {
        char *end;
        o->slowdown = strtod(arg, &end);
        if (*arg == '\0' || *end || !(o->slowdown >= 1.0 && o->slowdown <= 1000.0)) {
            snprintf(err, n, "--slowdown %s: expected a factor 1..1000 (2 = twice as slow)", arg);
            rc = -EINVAL;
        }
        break;
    }
    case O_HELP: rc = 1; break;
#ifdef SWARM_MISBEHAVE
    case O_MISBEHAVE: rc = s_parse_misbehave(o, arg, err, n); break;
#endif
    case ':': snprintf(err, n, "%s: needs a value", flag); rc = -EINVAL; break;
    default: snprintf(err, n, "%s: unknown flag; see swarm node --help", flag); rc = -EINVAL; break;
    }
    return rc;
}

// 0, 1 for --help, or -EINVAL with a reason naming the flag.
static int s_parse(int argc, char **argv, daemon_opts_t *o, char *err, size_t n)
{
    *o = (daemon_opts_t) { .device = "auto", .cache_mb = 512, .slowdown = 1.0 };
    if (gethostname(o->name, sizeof o->name - 1) != 0 || !o->name[0])
        snprintf(o->name, sizeof o->name, "node");
    opterr = 0;
    optind = 1;
    int id, rc = 0;
    while (rc == 0 && (id = getopt_long(argc, argv, ":h", s_long, NULL)) != -1) {
        char flag[64];
        if (id == '?' && optopt)
            snprintf(flag, sizeof flag, "-%c", optopt);
        else
            snprintf(flag, sizeof flag, "%s", argv[optind - 1]);
        rc = s_parse_one(o, id == 'h' ? O_HELP : id, optarg, flag, err, n);
    }
    if (rc == 0 && optind < argc) {
        snprintf(err, n, "%s: unexpected argument", argv[optind]);
        rc = -EINVAL;
    } else if (rc == 0 && !o->join) {
        snprintf(err, n, "--join is required: the router to join (paste the line `swarm router` "
                 "printed: swarm node --join swarm://HOST:PORT/KEY)");
        rc = -EINVAL;
    } else if (rc == 0 && !o->router_key && !o->target.router_key[0]) {
        snprintf(err, n, "--router-key is required with --join tcp://HOST:PORT: the router's .pub "
                 "file or its Z85 key (or join with the swarm://HOST:PORT/KEY token the router "
                 "printed)");
        rc = -EINVAL;
    }
    return rc;
}

// ---- keys ------------------------------------------------------------------

static int s_router_key_load(const char *arg, net_key_t **out, char *err, size_t n)
{
    char why[512] = "";
    int file = access(arg, F_OK) == 0;
    if (!file && strlen(arg) == NET_KEY_Z85_LEN) {
        if (net_key_from_z85(arg, out) == 0)
            return 0;
        snprintf(err, n, "--router-key %s: neither a file nor a valid Z85 key (paste the key the "
                 "router printed, in single quotes)", arg);
        return -EINVAL;
    }
    if (!file) {
        // most often a key the shell changed: unquoted, $x and ! expand
        snprintf(err, n, "--router-key %s: no such file, and not a key: a key is %d Z85 "
                 "characters, this is %zu; paste the key the router printed in single quotes "
                 "('KEY'), or give its .pub file", arg, NET_KEY_Z85_LEN, strlen(arg));
        return -EINVAL;
    }
    int rc = net_key_load_public(arg, out, why, sizeof why);
    if (rc == -EINVAL) // why says "regenerate": not ours to, it is the router's
        snprintf(err, n, "--router-key %s: not a public key file (one line of %d Z85 "
                 "characters); copy the router's .pub again, or join with the token it printed",
                 arg, NET_KEY_Z85_LEN);
    else if (rc != 0)
        snprintf(err, n, "--router-key %s", why);
    return rc;
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
    int rc = s_router_key_load(d->o.router_key ? d->o.router_key : token, &d->router_key, err, n);
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
    return d->o.misbehave == mode && d->step >= d->o.misbehave_from;
#else
    (void) d;
    (void) mode;
    return 0;
#endif
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

static int s_client_open(daemon_t *d, char *err, size_t n)
{
    net_client_config_t c = {
        .endpoint = d->o.join, .server = d->router_key, .key = d->id.key,
        .limits = { .max_tensors = NET_TENSORS_MAX, .max_dims = NET_DIMS_MAX,
                    .max_dim = 1u << 30, .max_payload = NET_PAYLOAD_MAX, .max_meta = 1u << 16 },
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

static net_msg_t *s_msg_reply(const net_msg_t *req, int type)
{
    net_msg_t *msg = net_msg_reply(req, type);
    if (!msg)
        abort();
    return msg;
}

static void s_meta_set(net_msg_t *msg, const char *text)
{
    if (net_msg_set_meta(msg, text) != 0)
        abort(); // our own meta is short
}

// Add "key=value" lines to msg's meta, after what it has.
__attribute__((format(printf, 2, 3)))
static void s_meta_add(net_msg_t *msg, const char *fmt, ...)
{
    char text[1024];
    size_t len = 0;
    const char *old = net_msg_meta(msg, &len);
    int used = old ? snprintf(text, sizeof text, "%.*s\n", (int) len, old) : 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text + used, sizeof text - (size_t) used, fmt, ap);
    va_end(ap);
    s_meta_set(msg, text);
}

static void s_hello_send(daemon_t *d)
{
    char meta[512];
    double tok_s = d->tok_s_bench * (s_lying(d, MIS_SPEED) ? 1000.0 : 1.0); // the same yardstick for every node
    snprintf(meta, sizeof meta, "proto=1\nname=%s\ndevice=%s\nthreads=%d\nmemory=%zu\ntok_s=%.1f",
             d->o.name, d->be->device, d->be->threads, d->be->memory, tok_s);
    net_msg_t *msg = s_msg_new(NET_MSG_HELLO);
    s_meta_set(msg, meta);
    uint64_t id = d->next_id;
    if (s_send(d, &msg, 0) == 0) {
        d->hello_ids[d->hello_next] = id;
        d->hello_next = (d->hello_next + 1) % DAEMON_HELLO_IDS;
    }
}

static void s_heartbeat_send(daemon_t *d)
{
    char meta[256];
    double tok_s = d->tok_s > 0 ? d->tok_s : d->tok_s_bench;
    // micro-batches our activation cache holds (once one has been made)
    size_t each = d->nslots ? node_acts_bytes(d->slots[0].acts) : 0;
    size_t slots = each ? ((size_t) d->o.cache_mb << 20) / each : 0;
    slots = slots > DAEMON_SLOTS_MAX ? DAEMON_SLOTS_MAX : slots < 1 && each ? 1 : slots;
    if (s_lying(d, MIS_SPEED))
        tok_s *= 1000.0;
    snprintf(meta, sizeof meta, "stage=%d\nqueue=%zu\ntok_s=%.1f\nstep=%ld\nslots=%zu",
             node_stage_index(d->stage), d->queued, tok_s, d->step, slots);
    for (int i = 0; i < (s_lying(d, MIS_FLOOD) ? 500 : 1); i++) {
        net_msg_t *msg = s_msg_new(NET_MSG_HEARTBEAT);
        s_meta_set(msg, meta);
        (void) s_send(d, &msg, 0);
    }
}

// Answer req with ERROR reason=TEXT (one line).
static void s_reply_error(daemon_t *d, const net_msg_t *req, const char *reason)
{
    char meta[600];
    snprintf(meta, sizeof meta, "reason=%s", reason);
    for (char *p = meta; *p; p++)
        if (*p == '\n')
            *p = ' ';
    net_msg_t *msg = s_msg_reply(req, NET_MSG_ERROR);
    s_meta_set(msg, meta);
    (void) s_send(d, &msg, 1);
}

// A RESULT to req with meta checksum=HEX of our parameters.
static net_msg_t *s_checksum_reply(daemon_t *d, const net_msg_t *req, char hex[65])
{
    char meta[80];
    node_stage_checksum(d->stage, hex);
    snprintf(meta, sizeof meta, "checksum=%s", hex);
    net_msg_t *msg = s_msg_reply(req, NET_MSG_RESULT);
    s_meta_set(msg, meta);
    return msg;
}

// ---- reading requests ------------------------------------------------------

static int s_meta_long(const net_msg_t *msg, const char *key, long lo, long hi, long *out,
                       char *err, size_t n)
{
    char text[64], *end;
    int rc = net_msg_meta_get(msg, key, text, sizeof text);
    if (rc != 0) {
        snprintf(err, n, "meta %s: %s", key, rc == -ENOENT ? "missing" : "value too long");
        return -EPROTO;
    }
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > hi) {
        snprintf(err, n, "meta %s=%s: expected a whole number in %ld..%ld", key, text, lo, hi);
        return -EPROTO;
    }
    *out = v;
    return 0;
}

// A number written with %a (or plainly), finite, in lo..hi.
static int s_meta_double(const net_msg_t *msg, const char *key, double lo, double hi,
                         double *out, char *err, size_t n)
{
    char text[64], *end;
    int rc = net_msg_meta_get(msg, key, text, sizeof text);
    if (rc != 0) {
        snprintf(err, n, "meta %s: %s", key, rc == -ENOENT ? "missing" : "value too long");
        return rc == -ENOENT ? -ENOENT : -EPROTO;
    }
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !isfinite(v) || v < lo || v > hi) {
        snprintf(err, n, "meta %s=%s: expected a number in %g..%g", key, text, lo, hi);
        return -EPROTO;
    }
    *out = v;
    return 0;
}

static void s_dims_text(const uint32_t *dims, int ndims, char *out, size_t cap)
{
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < ndims && used < cap; i++)
        used += (size_t) snprintf(out + used, cap - used, i ? "x%u" : "%u", dims[i]);
}

static int s_count_check(const net_msg_t *req, int want, char *err, size_t n)
{
    int have = net_msg_head_const(req)->ntensors;
    if (have == want)
        return 0;
    snprintf(err, n, "%d tensors, expected %d", have, want);
    return -EPROTO;
}

enum { KIND_I32, KIND_FLOAT, KIND_F32 }; // raw int32; any float codec; exact float32

// Tensor i of req has the dtype kind and exactly dims.
static int s_tensor_check(const net_msg_t *req, int i, int kind, const uint32_t *dims, int ndims,
                          const char *what, char *err, size_t n)
{
    const net_shape_t *t = &net_msg_head_const(req)->tensors[i];
    int ok = kind == KIND_I32 ? t->dtype == NET_DTYPE_I32
           : kind == KIND_F32 ? t->dtype == NET_DTYPE_F32
           : t->dtype == NET_DTYPE_F32 || t->dtype == NET_DTYPE_F16 || t->dtype == NET_DTYPE_I8;
    if (!ok) {
        snprintf(err, n, "tensor %d (%s): dtype %d, expected %s", i, what, t->dtype,
                 kind == KIND_I32 ? "i32" : kind == KIND_F32 ? "f32" : "f32, f16 or i8");
        return -EPROTO;
    }
    ok = t->ndims == ndims;
    for (int k = 0; k < ndims && ok; k++)
        ok = t->dims[k] == dims[k];
    if (!ok) {
        char have[64], want[64];
        s_dims_text(t->dims, t->ndims, have, sizeof have);
        s_dims_text(dims, ndims, want, sizeof want);
        snprintf(err, n, "tensor %d (%s): dims %s, expected %s", i, what, have, want);
        return -EPROTO;
    }
    return 0;
}

// Tokens or targets: i32 (micro, T), each a byte value.
static int s_tokens_get(daemon_t *d, const net_msg_t *req, int i, int32_t *dst, const char *what,
                        char *err, size_t n)
{
    uint32_t dims[2] = { (uint32_t) d->as.micro, (uint32_t) d->as.cfg.T };
    size_t count = (size_t) dims[0] * dims[1], bytes = 0;
    int rc = s_tensor_check(req, i, KIND_I32, dims, 2, what, err, n);
    const uint8_t *raw = rc == 0 ? net_msg_raw(req, i, &bytes) : NULL;
    if (rc == 0 && (!raw || bytes != count * 4)) {
        snprintf(err, n, "tensor %d (%s): %zu bytes, expected %zu", i, what, bytes, count * 4);
        rc = -EPROTO;
    }
    for (size_t k = 0; k < count && rc == 0; k++) {
        const uint8_t *b = raw + 4 * k; // little-endian on the wire, unaligned
        dst[k] = (int32_t) ((uint32_t) b[0] | (uint32_t) b[1] << 8 | (uint32_t) b[2] << 16
                            | (uint32_t) b[3] << 24);
        if (dst[k] < 0 || dst[k] >= d->as.cfg.V) {
            snprintf(err, n, "tensor %d (%s): value %d at %zu is outside 0..%d", i, what, dst[k],
                     k, d->as.cfg.V - 1);
            rc = -EPROTO;
        }
    }
    return rc;
}

// Activations: floats (micro, T, C).
static int s_acts_get(daemon_t *d, const net_msg_t *req, int i, float *dst, const char *what,
                      char *err, size_t n)
{
    uint32_t dims[3] = { (uint32_t) d->as.micro, (uint32_t) d->as.cfg.T, (uint32_t) d->as.cfg.C };
    int rc = s_tensor_check(req, i, KIND_FLOAT, dims, 3, what, err, n);
    if (rc == 0 && (rc = net_tensor_get(req, i, dst, (size_t) dims[0] * dims[1] * dims[2])) != 0)
        snprintf(err, n, "tensor %d (%s): cannot decode (%s)", i, what, strerror(-rc));
    return rc;
}

// A stage-sized vector: f32 [n], exact.
static int s_vector_get(daemon_t *d, const net_msg_t *req, int i, float *dst, const char *what,
                        char *err, size_t n)
{
    size_t count = node_stage_param_count(d->stage);
    uint32_t dims[1] = { count > UINT32_MAX ? 0 : (uint32_t) count };
    int rc = s_tensor_check(req, i, KIND_F32, dims, 1, what, err, n);
    if (rc == 0 && (rc = net_msg_tensor(req, i, dst, count)) != 0)
        snprintf(err, n, "tensor %d (%s): cannot decode (%s)", i, what, strerror(-rc));
    return rc;
}

// A stage-sized gradient sum: f32 [n], or the fp16/int8 of --grad-wire.
static int s_grad_get(daemon_t *d, const net_msg_t *req, int i, float *dst, char *err, size_t n)
{
    size_t count = node_stage_param_count(d->stage);
    uint32_t dims[1] = { count > UINT32_MAX ? 0 : (uint32_t) count };
    int rc = s_tensor_check(req, i, KIND_FLOAT, dims, 1, "gradient", err, n);
    if (rc == 0 && (rc = net_tensor_get(req, i, dst, count)) != 0)
        snprintf(err, n, "tensor %d (gradient): cannot decode (%s)", i, strerror(-rc));
    return rc;
}

// The stage input: tokens on stage 0, else x; tensor 0.
static int s_input_get(daemon_t *d, const net_msg_t *req, char *err, size_t n)
{
    if (node_stage_is_first(d->stage))
        return s_tokens_get(d, req, 0, d->tokens, "tokens", err, n);
    return s_acts_get(d, req, 0, d->x, "x", err, n);
}

// A request for our stage (and, need_step, our step) with a state loaded.
static int s_check_request(daemon_t *d, const net_msg_t *req, int need_step, char *err, size_t n)
{
    const net_head_t *h = net_msg_head_const(req);
    int rc = -EPROTO;
    if (!d->stage)
        snprintf(err, n, "no stage assigned yet");
    else if (h->stage != (uint32_t) node_stage_index(d->stage))
        snprintf(err, n, "stage %" PRIu32 ", this node holds stage %d", h->stage,
                 node_stage_index(d->stage));
    else if (!d->ready)
        snprintf(err, n, "stage %d has no state loaded yet (STATE first)",
                 node_stage_index(d->stage));
    else if (need_step && h->step != (uint64_t) d->step)
        snprintf(err, n, "step %" PRIu64 ", this node is at step %ld", h->step, d->step);
    else
        rc = 0;
    return rc;
}

// A lie about an activation: a NaN in it (sent raw, past the encoder's
// check), every value 1000 times too large, or the right values in the
// wrong places (reversed: finite, of the right size, and wrong).
static int s_lie_acts(daemon_t *d, net_msg_t *msg, const float *src, const uint32_t *dims)
{
    size_t count = (size_t) dims[0] * dims[1] * dims[2];
    float *lie = malloc(count * sizeof(float));
    if (!lie)
        return -ENOMEM;
    for (size_t i = 0; i < count; i++)
        lie[i] = s_lying(d, MIS_SCALE) ? 1000.0f * src[i]
               : s_lying(d, MIS_SHUFFLE) ? src[count - 1 - i] : src[i];
    if (s_lying(d, MIS_NAN))
        lie[count / 2] = NAN;
    int rc = net_msg_add_raw(msg, NET_DTYPE_F32, dims, 3, lie, count * sizeof(float));
    free(lie);
    return rc;
}

// Append an activation-shaped f32 tensor (micro, T, C) to msg.
static int s_acts_add(daemon_t *d, net_msg_t *msg, const float *src, const char *what, char *err,
                      size_t n)
{
    uint32_t dims[3] = { (uint32_t) d->as.micro, (uint32_t) d->as.cfg.T, (uint32_t) d->as.cfg.C };
    if (s_lying(d, MIS_NAN) || s_lying(d, MIS_SCALE) || s_lying(d, MIS_SHUFFLE))
        return s_lie_acts(d, msg, src, dims); // as f32, which the router decodes too
    int pow2 = 0, rc = net_tensor_add(msg, d->as.wire, dims, 3, src, &pow2);
    if (rc != 0)
        snprintf(err, n, "cannot send %s: %s", what,
                 rc == -EDOM ? "it holds a NaN or infinite value" : strerror(-rc));
    else if (pow2 != 0)
        s_meta_add(msg, "pow2_%d=%d", net_msg_head(msg)->ntensors - 1, pow2);
    return rc;
}

// ---- activation cache --------------------------------------------------------

static daemon_slot_t *s_slot_find(daemon_t *d, uint64_t step, uint32_t mb)
{
    for (int i = 0; i < d->nslots; i++)
        if (d->slots[i].seq && d->slots[i].step == step && d->slots[i].mb == mb)
            return &d->slots[i];
    return NULL;
}

// Room for one more micro-batch of activations within --cache-mb (the first
// one is always allowed: nothing runs without it).
static int s_slot_room(const daemon_t *d)
{
    if (d->nslots == 0)
        return 1;
    if (d->nslots == DAEMON_SLOTS_MAX)
        return 0;
    size_t bytes = node_acts_bytes(d->slots[0].acts);
    return (size_t) (d->nslots + 1) * bytes <= (size_t) d->o.cache_mb << 20;
}

static daemon_slot_t *s_slot_oldest(daemon_t *d)
{
    daemon_slot_t *old = &d->slots[0];
    for (int i = 1; i < d->nslots; i++)
        if (d->slots[i].seq < old->seq)
            old = &d->slots[i];
    return old;
}

// A slot for (step, mb): its own, a free one, a new one within --cache-mb,
// or the oldest one, evicted. -ENOMEM when not even one can be allocated.
static int s_slot_take(daemon_t *d, uint64_t step, uint32_t mb, daemon_slot_t **out, char *err,
                       size_t n)
{
    daemon_slot_t *slot = s_slot_find(d, step, mb);
    for (int i = 0; i < d->nslots && !slot; i++)
        if (!d->slots[i].seq)
            slot = &d->slots[i];
    if (!slot && s_slot_room(d)) {
        node_acts_t *acts = node_acts_new(d->stage, d->as.micro, err, n);
        if (acts) {
            slot = &d->slots[d->nslots++];
            slot->acts = acts;
        } else if (d->nslots == 0) {
            return -ENOMEM;
        }
    }
    if (!slot)
        slot = s_slot_oldest(d);
    slot->step = step;
    slot->mb = mb;
    slot->seq = ++d->seq;
    *out = slot;
    return 0;
}

// Forget every cached forward (after an update the parameters changed).
static void s_slots_drop(daemon_t *d)
{
    for (int i = 0; i < d->nslots; i++)
        d->slots[i].seq = 0;
}

static void s_slots_free(daemon_t *d)
{
    for (int i = 0; i < d->nslots; i++)
        node_acts_destroy(&d->slots[i].acts);
    memset(d->slots, 0, sizeof d->slots);
    d->nslots = 0;
}

// ---- FWD, BWD -------------------------------------------------------------

// After FWD/BWD work of `seconds` that did `part` of its tokens' training
// work (a forward a third, a backward two thirds, the last stage's fused
// forward and backward all of it): sleep for --slowdown, then fold it into
// tok_s, the training tokens/s this node sustains on its stage (decaying
// sums of work and time, so recent requests count most).
// A device F times slower takes F times the usual compute of such work:
// the sleep is F - 1 times this request's compute, but never more than F - 1
// times the usual (a running mean), so that a moment of contention on the
// host (the scheduler, another process) is not magnified F times.
static void s_tok_s_note(daemon_t *d, double seconds, double part)
{
    if (seconds <= 0.0)
        return;
    if (d->o.slowdown > 1.0) {
        double *usual = &d->usual_s[part < 0.5 ? 0 : part < 0.9 ? 1 : 2];
        double extra = (d->o.slowdown - 1.0) * (*usual > 0.0 ? fmin(seconds, *usual) : seconds);
        *usual = *usual > 0.0 ? 0.9 * *usual + 0.1 * seconds : seconds;
        struct timespec ts = { (time_t) extra, (long) ((extra - (double) (time_t) extra) * 1e9) };
        nanosleep(&ts, NULL);
        seconds += extra;
    }
    d->work_tok = 0.95 * d->work_tok + part * d->as.micro * d->as.cfg.T;
    d->work_s = 0.95 * d->work_s + seconds;
    d->tok_s = d->work_tok / d->work_s;
    d->busy = seconds;
}

// Forward of the inputs in d's buffers into slot; the last stage runs its
// backward too (scale > 0). y or dx land in d->out.
static int s_forward(daemon_t *d, daemon_slot_t *slot, float scale, float *loss, char *err,
                     size_t n)
{
    node_stage_in_t in = {
        .tokens = d->tokens, .x = d->x, .targets = d->targets, .loss_scale = scale,
        .want_backward = node_stage_is_last(d->stage) && scale != 0.0f,
    };
    int rc = node_stage_forward(d->stage, slot->acts, &in, d->out, loss, d->out);
    if (rc != 0)
        snprintf(err, n, "forward failed on %s: %s", d->be->device, strerror(-rc));
    return rc;
}

// Read FWD's tensors (and the last stage's scale) into d's buffers.
static int s_fwd_inputs(daemon_t *d, const net_msg_t *req, float *scale, char *err, size_t n)
{
    int last = node_stage_is_last(d->stage), want = 1 + last;
    double v = 0.0;
    int rc = s_count_check(req, want, err, n);
    if (rc == 0)
        rc = s_input_get(d, req, err, n);
    if (rc == 0 && last)
        rc = s_tokens_get(d, req, want - 1, d->targets, "targets", err, n);
    // an evaluation batch (eval=1) runs forward only: scale stays 0
    char eval[8];
    int evaluating = last && net_msg_meta_get(req, "eval", eval, sizeof eval) == 0 && !strcmp(eval, "1");
    if (rc == 0 && last && !evaluating)
        rc = s_meta_double(req, "scale", 1e-30, 1.0, &v, err, n);
    *scale = (float) v;
    return rc;
}

static int s_on_fwd(daemon_t *d, const net_msg_t *req, net_msg_t **reply, char *err, size_t n)
{
    const net_head_t *h = net_msg_head_const(req);
    daemon_slot_t *slot = NULL;
    float scale = 0.0f, loss = 0.0f;
    double t0 = s_now();
    int rc = s_check_request(d, req, 1, err, n);
    if (rc == 0)
        rc = s_fwd_inputs(d, req, &scale, err, n);
    if (rc == 0)
        rc = s_slot_take(d, h->step, h->mb, &slot, err, n);
    if (rc == 0)
        rc = s_forward(d, slot, scale, &loss, err, n);
    if (rc != 0)
        goto out;
    int last = node_stage_is_last(d->stage), first = node_stage_is_first(d->stage);
    *reply = s_msg_reply(req, NET_MSG_RESULT);
    if (last) {
        char meta[64];
        snprintf(meta, sizeof meta, "loss=%.9g", loss);
        s_meta_set(*reply, meta);
        d->samples += scale != 0.0f;
        slot->seq = 0; // nothing to keep: its backward already ran (or none will)
    }
    if (!(last && first) && !(last && scale == 0.0f))
        rc = s_acts_add(d, *reply, d->out, last ? "dx" : "y", err, n);
    s_tok_s_note(d, s_now() - t0, last && scale != 0.0f ? 1.0 : 1.0 / 3.0);
out:
    if (rc != 0 && slot)
        slot->seq = 0;
    return rc;
}

static int s_bwd_inputs(daemon_t *d, const net_msg_t *req, char *err, size_t n)
{
    int rc = s_check_request(d, req, 1, err, n);
    if (rc == 0 && node_stage_is_last(d->stage)) {
        snprintf(err, n, "BWD to the last stage (it runs its backward in FWD)");
        rc = -EPROTO;
    }
    if (rc == 0)
        rc = s_count_check(req, 2, err, n);
    if (rc == 0)
        rc = s_input_get(d, req, err, n);
    if (rc == 0)
        rc = s_acts_get(d, req, 1, d->dy, "dy", err, n);
    return rc;
}

static int s_on_bwd(daemon_t *d, const net_msg_t *req, net_msg_t **reply, char *err, size_t n)
{
    const net_head_t *h = net_msg_head_const(req);
    double t0 = s_now();
    float loss;
    int rc = s_bwd_inputs(d, req, err, n);
    if (rc != 0)
        return rc;
    daemon_slot_t *slot = s_slot_find(d, h->step, h->mb);
    if (!slot) { // evicted or never seen: recompute the forward from the input
        rc = s_slot_take(d, h->step, h->mb, &slot, err, n);
        if (rc == 0)
            rc = s_forward(d, slot, 0.0f, &loss, err, n);
    }
    if (rc == 0 && (rc = node_stage_backward(d->stage, slot->acts, d->dy, d->out)) != 0)
        snprintf(err, n, "backward failed on %s: %s", d->be->device, strerror(-rc));
    if (slot)
        slot->seq = 0; // its backward ran (or failed): the activations are spent
    if (rc != 0)
        return rc;
    d->samples++;
    *reply = s_msg_reply(req, NET_MSG_RESULT);
    if (!node_stage_is_first(d->stage))
        rc = s_acts_add(d, *reply, d->out, "dx", err, n);
    s_tok_s_note(d, s_now() - t0, 2.0 / 3.0);
    return rc;
}

// ---- STEP, UPDATE, STATE, STATE_GET ----------------------------------------

// UPDATE's meta: lr, scale (clip factor; not in a STEP that applies the
// update itself: want_scale 0), t = step + 1, wd (0.1 if absent).
static int s_update_opts(daemon_t *d, const net_msg_t *req, int want_scale, node_adamw_t *opt,
                         char *err, size_t n)
{
    double lr = 0.0, scale = 1.0, wd = 0.1;
    long t = 0;
    int rc = s_meta_double(req, "lr", 0.0, 1e3, &lr, err, n);
    if (rc == 0 && want_scale)
        rc = s_meta_double(req, "scale", 0.0, 1e30, &scale, err, n);
    if (rc == 0)
        rc = s_meta_long(req, "t", 1, LONG_MAX, &t, err, n);
    if (rc == 0 && t != d->step + 1) {
        snprintf(err, n, "meta t=%ld, expected %ld (this node is at step %ld)", t, d->step + 1,
                 d->step);
        rc = -EPROTO;
    }
    if (rc == 0 && (rc = s_meta_double(req, "wd", 0.0, 1e3, &wd, err, n)) == -ENOENT)
        rc = 0;
    *opt = (node_adamw_t) {
        .lr = lr, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = (float) wd,
        .grad_scale = (float) scale, .t = t,
    };
    return rc;
}

// The step's update with the gradient in the stage's buffers: AdamW, the
// step count, and the parameters' checksum in hex. 0 or -errno.
static int s_apply(daemon_t *d, const node_adamw_t *opt, char hex[65], char *err, size_t n)
{
    node_stage_adamw(d->stage, opt);
    if (s_lying(d, MIS_DRIFT))
        node_stage_params(d->stage)[0] += 1e-3f; // parameters that drift from its replicas'
    int rc = node_stage_params_changed(d->stage);
    node_stage_grads_zero(d->stage);
    s_slots_drop(d);
    d->samples_total += d->samples;
    d->samples = 0;
    d->step = opt->t;
    if (rc != 0) {
        d->ready = 0; // the device copy is stale: wait for STATE
        snprintf(err, n, "cannot upload the parameters to %s: %s", d->be->device, strerror(-rc));
        return rc;
    }
    node_stage_checksum(d->stage, hex);
    if (d->step % 10 == 0)
        s_log("step %ld: updated, checksum %.16s", d->step, hex);
    return 0;
}

// STEP apply=1: this node is its stage's only replica and the last to
// finish the step, so it applies the update at once instead of waiting a
// round trip for UPDATE (docs/swarm.md, "The last stage to finish applies
// its own update"). others= is the other stages' sum of squares and clip=
// the bound on the global norm: the clip factor is the one the router forms
// from the same two numbers; lr, wd and t as in UPDATE. The reply carries
// the checksum after the update.
static int s_step_apply(daemon_t *d, const net_msg_t *req, double sumsq, net_msg_t *reply,
                        char *err, size_t n)
{
    double others = 0.0, clip = 0.0;
    node_adamw_t opt;
    char hex[65];
    int rc = s_meta_double(req, "others", 0.0, 1e300, &others, err, n);
    if (rc == 0)
        rc = s_meta_double(req, "clip", 0.0, 1e30, &clip, err, n);
    if (rc == 0)
        rc = s_update_opts(d, req, 0, &opt, err, n);
    d->norm_only = 0; // no UPDATE follows
    if (rc != 0)
        return rc;
    opt.grad_scale = node_clip_scale(sqrt(others + sumsq), (float) clip);
    rc = s_apply(d, &opt, hex, err, n);
    if (rc == 0)
        s_meta_add(reply, "checksum=%s", hex);
    return rc;
}

static int s_on_step(daemon_t *d, const net_msg_t *req, net_msg_t **reply, char *err, size_t n)
{
    int rc = s_check_request(d, req, 1, err, n);
    char discard[8];
    if (rc == 0 && net_msg_meta_get(req, "discard", discard, sizeof discard) == 0
        && !strcmp(discard, "1")) {
        // the router starts the step over: what was accumulated is void
        // (every request of the old attempt came before this one)
        node_stage_grads_zero(d->stage);
        s_slots_drop(d);
        d->samples = 0;
        *reply = s_msg_reply(req, NET_MSG_RESULT);
        return 0;
    }
    if (rc == 0 && (rc = node_stage_grads_fetch(d->stage)) != 0)
        snprintf(err, n, "cannot read the gradients from %s: %s", d->be->device, strerror(-rc));
    if (rc != 0)
        return rc;
    uint32_t dims[1] = { (uint32_t) node_stage_param_count(d->stage) };
    char meta[96], only[8], apply[8];
    // the only replica of its stage keeps its gradient: the router needs
    // just its sum of squares (for the global norm), and UPDATE brings none
    d->norm_only = net_msg_meta_get(req, "norm_only", only, sizeof only) == 0 && !strcmp(only, "1");
    double sumsq = d->norm_only ? node_sumsq(node_stage_grads(d->stage),
                                             node_stage_param_count(d->stage)) : 0.0;
    if (d->norm_only)
        snprintf(meta, sizeof meta, "samples=%ld\nsumsq=%a", d->samples, sumsq);
    else
        snprintf(meta, sizeof meta, "samples=%ld", d->samples);
    *reply = s_msg_reply(req, NET_MSG_GRAD);
    s_meta_set(*reply, meta);
    if (d->norm_only && net_msg_meta_get(req, "apply", apply, sizeof apply) == 0
        && !strcmp(apply, "1"))
        return s_step_apply(d, req, sumsq, *reply, err, n);
    if (d->norm_only)
        return 0;
    int pow2 = 0;
    rc = net_tensor_add(*reply, d->as.grad_wire, dims, 1, node_stage_grads(d->stage), &pow2);
    if (rc != 0)
        snprintf(err, n, "cannot send the gradient: %s",
                 rc == -EDOM ? "it holds a NaN or infinite value" : strerror(-rc));
    else if (pow2 != 0)
        s_meta_add(*reply, "pow2_0=%d", pow2);
    return rc;
}

static int s_on_update(daemon_t *d, const net_msg_t *req, net_msg_t **reply, char *err, size_t n)
{
    node_adamw_t opt;
    char hex[65];
    int rc = s_check_request(d, req, 1, err, n);
    int keep = d->norm_only; // apply our own gradient, kept since STEP
    d->norm_only = 0;
    if (rc == 0)
        rc = s_count_check(req, keep ? 0 : 1, err, n);
    if (rc == 0)
        rc = s_update_opts(d, req, 1, &opt, err, n);
    if (rc == 0 && !keep
        && (rc = s_grad_get(d, req, 0, node_stage_grads(d->stage), err, n)))
        node_stage_grads_zero(d->stage); // a half-copied sum must not mix with new work
    if (rc != 0)
        return rc;
    rc = s_apply(d, &opt, hex, err, n);
    if (rc == 0)
        *reply = s_checksum_reply(d, req, hex);
    return rc;
}

static int s_state_load(daemon_t *d, const net_msg_t *req, char *err, size_t n)
{
    int rc = s_count_check(req, 3, err, n);
    if (rc == 0)
        rc = s_vector_get(d, req, 0, node_stage_params(d->stage), "parameters", err, n);
    if (rc == 0)
        rc = s_vector_get(d, req, 1, node_stage_moment1(d->stage), "first moments", err, n);
    if (rc == 0)
        rc = s_vector_get(d, req, 2, node_stage_moment2(d->stage), "second moments", err, n);
    if (rc == 0 && (rc = node_stage_params_changed(d->stage)) != 0)
        snprintf(err, n, "cannot upload the parameters to %s: %s", d->be->device, strerror(-rc));
    return rc;
}

static int s_on_state(daemon_t *d, const net_msg_t *req, net_msg_t **reply, char *err, size_t n)
{
    const net_head_t *h = net_msg_head_const(req);
    char hex[65];
    int rc = -EPROTO;
    if (!d->stage)
        snprintf(err, n, "no stage assigned yet");
    else if (h->stage != (uint32_t) node_stage_index(d->stage))
        snprintf(err, n, "stage %" PRIu32 ", this node holds stage %d", h->stage,
                 node_stage_index(d->stage));
    else if (h->step > LONG_MAX)
        snprintf(err, n, "step %" PRIu64 " is out of range", h->step);
    else if ((rc = s_state_load(d, req, err, n)) != 0)
        d->ready = 0; // a half-loaded stage is not ready
    if (rc != 0)
        return rc;
    node_stage_grads_zero(d->stage);
    s_slots_drop(d);
    d->samples = 0;
    d->step = (long) h->step;
    d->ready = 1;
    *reply = s_checksum_reply(d, req, hex);
    s_log("stage %d: state loaded at step %ld, checksum %.16s", node_stage_index(d->stage),
          d->step, hex);
    return 0;
}

static int s_on_state_get(daemon_t *d, const net_msg_t *req, net_msg_t **reply, char *err,
                          size_t n)
{
    int rc = s_check_request(d, req, 0, err, n);
    if (rc != 0)
        return rc;
    uint32_t dims[1] = { (uint32_t) node_stage_param_count(d->stage) };
    const float *parts[3] = { node_stage_params(d->stage), node_stage_moment1(d->stage),
                              node_stage_moment2(d->stage) };
    *reply = s_msg_reply(req, NET_MSG_STATE);
    net_msg_head(*reply)->step = (uint64_t) d->step;
    for (int i = 0; i < 3 && rc == 0; i++)
        rc = net_msg_add_tensor(*reply, NET_DTYPE_F32, dims, 1, parts[i]);
    if (rc != 0)
        snprintf(err, n, "cannot send the state: %s",
                 rc == -EDOM ? "it holds a NaN or infinite value" : strerror(-rc));
    return rc;
}

// ---- ASSIGN ----------------------------------------------------------------

// Meta `key` of ASSIGN: the format of what we send (fp32 when absent).
static int s_assign_wire(const net_msg_t *msg, const char *key, int *dtype, char *err, size_t n)
{
    char text[16], why[128];
    *dtype = NET_DTYPE_F32;
    int rc = net_msg_meta_get(msg, key, text, sizeof text);
    if (rc == -ENOENT)
        return 0;
    if (rc != 0 || net_dtype_parse(key, text, dtype, why, sizeof why) != 0) {
        snprintf(err, n, "meta %s: expected fp32, fp16 or int8", key);
        return -EPROTO;
    }
    return 0;
}

static int s_assign_parse(const net_msg_t *msg, daemon_assign_t *a, char *err, size_t n)
{
    static const char *const keys[8] = { "V", "T", "C", "L", "H", "S", "stage", "micro" };
    static const long lo[8] = { 1, 1, 1, 1, 1, 1, 0, 1 };
    static const long hi[8] = { NODE_VOCAB, 1 << 20, 1 << 20, NODE_MAX_LAYERS, 1024,
                                NODE_MAX_LAYERS, NODE_MAX_LAYERS - 1, 1 << 20 };
    const net_head_t *h = net_msg_head_const(msg);
    long v[8];
    int rc = 0;
    for (int i = 0; i < 8 && rc == 0; i++)
        rc = s_meta_long(msg, keys[i], lo[i], hi[i], &v[i], err, n);
    if (rc != 0)
        return rc;
    *a = (daemon_assign_t) { .cfg = { (int) v[0], (int) v[1], (int) v[2], (int) v[3], (int) v[4] },
                             .stages = (int) v[5], .stage = (int) v[6], .micro = (int) v[7],
                             .peer = -1, .step = h->step > LONG_MAX ? -1 : (long) h->step };
    if (s_meta_long(msg, "peer", 0, LONG_MAX, &a->peer, err, n) != 0)
        a->peer = -1; // for logs only
    rc = s_assign_wire(msg, "wire", &a->wire, err, n);
    if (rc == 0)
        rc = s_assign_wire(msg, "grad_wire", &a->grad_wire, err, n);
    if (rc != 0)
        return rc;
    rc = -EPROTO;
    if (a->stage >= a->stages)
        snprintf(err, n, "meta stage=%d, but S=%d", a->stage, a->stages);
    else if (h->stage != (uint32_t) a->stage)
        snprintf(err, n, "header stage %" PRIu32 ", meta stage=%d", h->stage, a->stage);
    else if (a->step < 0)
        snprintf(err, n, "step %" PRIu64 " is out of range", h->step);
    else if ((uint64_t) a->micro * a->cfg.T * a->cfg.C * 4 > NET_PAYLOAD_MAX / 2)
        snprintf(err, n, "micro=%d: a micro-batch of %dx%dx%d floats is too big to send",
                 a->micro, a->micro, a->cfg.T, a->cfg.C);
    else
        rc = node_config_check(&a->cfg, err, n);
    return rc;
}

static int s_assign_same(const daemon_t *d, const daemon_assign_t *a)
{
    const node_config_t *x = &d->as.cfg, *y = &a->cfg;
    return d->stage && x->V == y->V && x->T == y->T && x->C == y->C && x->L == y->L
        && x->H == y->H && d->as.stages == a->stages && d->as.stage == a->stage
        && d->as.micro == a->micro && d->as.wire == a->wire && d->as.grad_wire == a->grad_wire;
}

static void s_unassign(daemon_t *d)
{
    s_slots_free(d);
    node_stage_destroy(&d->stage);
    free(d->tokens);
    free(d->targets);
    free(d->x);
    free(d->dy);
    free(d->out);
    d->tokens = d->targets = NULL;
    d->x = d->dy = d->out = NULL;
    d->ready = 0;
    d->samples = 0;
}

static int s_assign_build(daemon_t *d, const daemon_assign_t *a, char *err, size_t n)
{
    s_unassign(d);
    int rc = node_plan_make(&a->cfg, a->stages, &d->plan, err, n);
    if (rc != 0)
        return rc;
    d->stage = node_stage_new(&a->cfg, &d->plan, a->stage, d->be, err, n);
    if (!d->stage)
        return -ENOMEM;
    size_t tokens = (size_t) a->micro * a->cfg.T, floats = tokens * a->cfg.C;
    d->tokens = malloc(tokens * sizeof(int32_t));
    d->targets = malloc(tokens * sizeof(int32_t));
    d->x = malloc(floats * sizeof(float));
    d->dy = malloc(floats * sizeof(float));
    d->out = malloc(floats * sizeof(float));
    if (!d->tokens || !d->targets || !d->x || !d->dy || !d->out) {
        snprintf(err, n, "out of memory for micro-batches of %d windows", a->micro);
        s_unassign(d);
        return -ENOMEM;
    }
    d->as = *a;
    d->step = a->step;
    d->tok_s = d->work_tok = d->work_s = 0.0;
    return 0;
}

static void s_on_assign(daemon_t *d, const net_msg_t *msg)
{
    daemon_assign_t a;
    char err[512] = "";
    int rc = s_assign_parse(msg, &a, err, sizeof err);
    if (rc == 0)
        d->finished = 0; // a router's run (again)
    if (rc == 0 && s_assign_same(d, &a)) {
        s_log("assigned stage %d of %d again (peer %ld): keeping it", a.stage, a.stages, a.peer);
        return;
    }
    if (rc == 0)
        rc = s_assign_build(d, &a, err, sizeof err);
    if (rc != 0) {
        s_warn("ASSIGN refused: %s", err);
        s_reply_error(d, msg, err);
        return;
    }
    s_log("assigned stage %d of %d (peer %ld): blocks %d..%d of L %d, C %d T %d H %d, "
          "micro %d, %zu parameters, step %ld; sends activations as %s, gradients as %s",
          a.stage, a.stages, a.peer, d->plan.first[a.stage], d->plan.first[a.stage + 1] - 1,
          a.cfg.L, a.cfg.C, a.cfg.T, a.cfg.H, a.micro, node_stage_param_count(d->stage), a.step,
          net_dtype_name(a.wire), net_dtype_name(a.grad_wire));
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
    switch (net_msg_head_const(msg)->type) {
    case NET_MSG_FWD: return s_on_fwd(d, msg, reply, err, n);
    case NET_MSG_BWD: return s_on_bwd(d, msg, reply, err, n);
    case NET_MSG_STEP: return s_on_step(d, msg, reply, err, n);
    case NET_MSG_UPDATE: return s_on_update(d, msg, reply, err, n);
    case NET_MSG_STATE: return s_on_state(d, msg, reply, err, n);
    case NET_MSG_STATE_GET: return s_on_state_get(d, msg, reply, err, n);
    case NET_MSG_BYE:
        s_on_bye(d, msg);
        return 0;
    default:
        snprintf(err, n, "a node does not serve %s", net_msg_type_name(net_msg_head_const(msg)->type));
        return -EPROTO;
    }
}

// Serve one message (taken) that arrived at `arrived` (net_clock_ms).
static void s_serve(daemon_t *d, net_msg_t **msg_p, int64_t arrived)
{
    const net_head_t *h = net_msg_head_const(*msg_p);
    net_msg_t *reply = NULL;
    char err[512] = "";
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
        s_meta_add(reply, "held=%.6f\nbusy=%.6f",
                   (double) (net_clock_ms() - arrived) / 1000.0, d->busy);
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
            net_msg_destroy(&msg); // the router's probe of the link: nothing to serve
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
    if (d->stage && quiet > DAEMON_SILENCE_MS && !d->silent && !d->finished) {
        s_log("the router has been silent for %lld s; saying HELLO again (it may have "
              "restarted)", (long long) quiet / 1000);
        d->silent = 1;
        d->hello_at = now;
    } else if (quiet <= DAEMON_SILENCE_MS && d->silent) {
        s_log("the router is back");
        d->silent = 0;
    }
    if (!d->stage && quiet > DAEMON_RECONNECT_MS && now >= d->reconnect_at) {
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
    if ((!d->stage || d->silent || d->finished) && now >= d->hello_at) {
        s_hello_send(d);
        d->hello_at = now + DAEMON_HELLO_MS;
    }
    if (d->stage && now >= d->heartbeat_at) {
        s_heartbeat_send(d);
        d->heartbeat_at = now + DAEMON_HEARTBEAT_MS;
    }
}

static int64_t s_next_due(const daemon_t *d, int64_t now)
{
    int64_t due = now + DAEMON_HEARTBEAT_MS;
    if (d->stage && d->heartbeat_at < due)
        due = d->heartbeat_at;
    if ((!d->stage || d->silent || d->finished) && d->hello_at < due)
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
    s_log("left the swarm (%ld micro-batches of gradient computed here on %s)", d->samples_total,
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
    s_unassign(d);
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
    int rc = s_parse(argc, argv, &d->o, err, sizeof err);
    if (rc == 1) {
        s_usage(stdout);
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
