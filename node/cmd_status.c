/* cmd_status.c - `swarm status ADDR`: the command. Its flags, the keys, one
 * STATUS request (node_status_ask, the dashboard's too), and what it does
 * with the reply: the tables (node/status.c reads and prints the
 * document), the raw JSON line (--json), again every few seconds
 * (--watch), or the web dashboard (--serve, node/dashboard.c).
 */
#include "node.h"
#include "net.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define STATUS_TIMEOUT_MS 2000  // per try
#define STATUS_TRIES 2          // tries in all

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

// Without --key: the router's own key pair where this machine holds it
// (the .key beside --router-key's .pub, or the router's default pair) and
// it is the router's asked, so that the operator sees every peer's name in
// an open swarm, and is admitted to a private one; else -ENOENT.
static int s_operator_key(const char *router_key, const net_key_t *server, net_key_t **ours)
{
    char names[2][PATH_MAX], dir[PATH_MAX];
    int n = 0;
    size_t len = strlen(router_key);
    if (len > 4 && !strcmp(router_key + len - 4, ".pub") && len - 4 < PATH_MAX)
        snprintf(names[n++], PATH_MAX, "%.*s", (int) (len - 4), router_key);
    if (net_key_dir(dir, sizeof dir) == 0 && strlen(dir) + 8 < PATH_MAX)
        snprintf(names[n++], PATH_MAX, "%s/router", dir);
    for (int i = 0; i < n; i++) {
        char path[PATH_MAX + 8], err[512];
        snprintf(path, sizeof path, "%s.key", names[i]);
        if (access(path, R_OK) != 0 || net_key_load(names[i], ours, err, sizeof err) != 0)
            continue; // none here, or not one to use (its mode): a fresh pair then
        if (!strcmp(net_key_public(*ours), net_key_public(server)))
            return 0;
        net_key_destroy(ours);
    }
    return -ENOENT;
}

// The router's public key from Z85 text or a .pub file; our pair from
// NAME.key/.pub, the router's own (s_operator_key) or fresh. 0 or -errno with one line printed.
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
    else if (s_operator_key(o->router_key, *server, ours) == 0)
        rc = 0;
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

// The tables of the reply's status text, built in a buffer first so that
// a redraw is one write. 0, or node_status_show's error with err.
static int s_draw(const status_opts_t *o, const char *text, size_t len, char *err, size_t errlen)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *out = open_memstream(&buf, &n);
    if (!out) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    if (o->watch_s > 0)
        fputs("\033[H\033[2J", out); // home, clear
    int rc = node_status_show(text, len, o->addr, out, err, errlen);
    if (o->watch_s > 0)
        fprintf(out, "\nevery %g s; Ctrl-C to stop\n", o->watch_s);
    fclose(out);
    if (rc == 0) {
        fwrite(buf, 1, n, stdout);
        fflush(stdout);
    }
    free(buf);
    return rc;
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

// Ask once and print the tables or the JSON line. 0 or a negative errno,
// with one line printed.
static int s_show(net_client_t *client, const status_opts_t *o)
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
    rc = o->json ? node_status_show(text, len, o->addr, NULL, err, sizeof err)
                 : s_draw(o, text, len, err, sizeof err);
    if (rc == -ENOMEM) {
        fprintf(stderr, "swarm status: out of memory\n");
    } else if (rc < 0) {
        fprintf(stderr, "swarm status: %s sent a malformed status: %s\n", o->addr, err);
    } else if (o->json) {
        s_print_json(stdout, text, len);
        fflush(stdout);
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
    int rc = s_show(client, o);
    int status = rc == -EINTR ? 130 : rc < 0 ? 1 : 0;
    while (status == 0 && o->watch_s > 0 && !s_stop) {
        s_sleep(o->watch_s);
        if (!s_stop)
            (void) s_show(client, o); // a miss was printed; keep watching
    }
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
