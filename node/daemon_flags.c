/* daemon_flags.c - `swarm node`'s flags and its --router-key: each value
 * checked, and a bad one named with its fix in one line.
 */
#include "daemon_int.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// ---- flags -----------------------------------------------------------------

enum { O_JOIN = 1, O_ROUTER_KEY, O_KEY, O_DEVICE, O_THREADS, O_NAME, O_CACHE, O_HELP, O_SLOW,
       O_EXIT_DONE, O_MISBEHAVE, O_MEMORY };

static const struct option s_long[] = {
    {"join", 1, 0, O_JOIN}, {"router-key", 1, 0, O_ROUTER_KEY}, {"key", 1, 0, O_KEY},
    {"device", 1, 0, O_DEVICE}, {"threads", 1, 0, O_THREADS}, {"name", 1, 0, O_NAME},
    {"cache-mb", 1, 0, O_CACHE}, {"slowdown", 1, 0, O_SLOW}, {"help", 0, 0, O_HELP},
    {"exit-when-done", 0, 0, O_EXIT_DONE}, {"memory", 1, 0, O_MEMORY},
#ifdef SWARM_MISBEHAVE
    {"misbehave", 1, 0, O_MISBEHAVE},
#endif
    {0, 0, 0, 0},
};

void daemon_usage(FILE *out)
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
        "  --memory SIZE           what this node may hold for its stage (its state,\n"
        "                          cached activations, buffers), e.g. 4G (default: 90%%\n"
        "                          of the memory available at start: RAM for the CPU,\n"
        "                          the GPU's free memory for cuda)\n"
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
    static const char *modes[] = { "", "nan", "scale", "drift", "flood", "speed", "shuffle", "crash",
                                   "grad", "sumsq", "dx", "state", "gradinf", "rmswalk", "checksum",
                                   "slowclaim", "ckptstall", "joinhold", "recount" };
    const char *at = strchr(arg, '@');
    size_t len = at ? (size_t) (at - arg) : strlen(arg);
    for (int m = 1; m < (int) (sizeof modes / sizeof modes[0]); m++) {
        if (strlen(modes[m]) == len && !strncmp(arg, modes[m], len)) {
            o->misbehave = m;
            return at ? node_parse_long("misbehave STEP", at + 1, 0, LONG_MAX, &o->misbehave_from,
                                        err, n) : 0;
        }
    }
    snprintf(err, n, "--misbehave %s: expected nan|scale|drift|flood|speed|shuffle|crash|grad|sumsq|dx|state|gradinf|rmswalk|checksum|slowclaim|ckptstall|joinhold|recount[@STEP]", arg);
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
    case O_MEMORY: rc = node_parse_size("memory", arg, &o->memory, err, n); break;
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
int daemon_parse(int argc, char **argv, daemon_opts_t *o, char *err, size_t n)
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

int daemon_router_key_load(const char *arg, net_key_t **out, char *err, size_t n)
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
