/* sim.c - `swarm sim`: the router engine (swarm/) against a simulated swarm
 * (swarm/sim.c), with every model, training and router flag of `swarm
 * router` and a few of its own: how many peers, how fast, how far, how
 * often one dies. It prints the engine's progress and one last line of
 * what the run reached and whether every invariant held; a violation
 * prints the one command that replays it (the same seed, the same run).
 */
#include "router_int.h"
#include "worker.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SIM_SPEEDS_MAX 4096

typedef struct {
    swarm_sim_opts_t o;      // for swarm_sim_run
    double speeds[SIM_SPEEDS_MAX]; // the mix, one entry per share
    double memories[SIM_SPEEDS_MAX]; // --memory's mix, the same way
    double as_params;        // --as-params N: stages' needs as for N parameters, 0 the model's
    int verbose;             // the engine's lines to stderr
    int numeric;             // --numeric: each peer runs node/worker.c
    long long sim_seed;      // --sim-seed: the sim's own draws; -1: --seed's
    const char *churn_path;  // --churn FILE
    swarm_sim_churn_t churn; // read from it
} sim_flags_t;

static const char *const s_lie_names[SIM_LIES] = { "", "nan", "scale", "drift", "shuffle", "speed",
                                                    "grad", "sumsq", "dx", "state", "rmswalk",
                                                    "slowclaim", "ckptstall", "joinhold",
                                                    "recount" };

static void s_help(FILE *out)
{
    fprintf(out,
        "usage: swarm sim --peers N [--stages S|auto] [--steps K] [--seed X] [--numeric]\n"
        "                 [--speeds LIST [--shares]] [--latency MS] [--bandwidth MBIT]\n"
        "                 [--jitter MS] [--loss F] [--kill-every S] [--leave-rate R]\n"
        "                 [--stall-every S] [--router-bandwidth MBIT] [--direct]\n"
        "                 [--speed-noise F] [--liars N] [--churn FILE] [--limit S] [--verbose]\n"
        "                 [--memory LIST] [--as-params N]\n"
        "                 [router and training flags of swarm router]\n"
        "Train on a simulated swarm, in virtual time, deterministic from --seed: the real\n"
        "router engine, peers that answer as nodes do. Synthetic (the default): tensors of\n"
        "constants and gradients whose sums are checked exactly; --numeric: each peer runs\n"
        "the node's real code on the model, and --loss-log compares with swarm train's.\n"
        "The last line says what it reached and whether every invariant held (each update\n"
        "the sum of exactly its step's micro-batches, no honest peer lost, no rollback a\n"
        "fault did not cause, nothing left in flight). Without --stages, or with --stages\n"
        "auto, the stages are chosen as swarm router chooses them, for the --peers (their\n"
        "--memory and --speeds mixes in their shares).\n"
        "  --peers N          peers that join at the start (>= 1); with --churn, about the\n"
        "                     most that are up at once\n"
        "  --numeric          peers compute with the node's real code (small models)\n"
        "  --memory LIST      what each may hold for a stage, said in its HELLO, each drawn\n"
        "                     from the list: SIZE or SIZExSHARE, comma-separated: 8Gx3,24G\n"
        "                     is three of 8 GiB to one of 24; as many as --speeds: each\n"
        "                     peer takes the one at its speed's place (a device's speed\n"
        "                     and memory); the peers that join at the start take the\n"
        "                     mixes in their shares, in order, the later ones draw\n"
        "                     (default: unknown, any stage)\n"
        "  --as-params N      plan memory as for a model of N parameters (3e9): each\n"
        "                     stage's state (16 bytes a parameter) times N over the\n"
        "                     model's parameters; its activations, buffers and the\n"
        "                     tensors stay the model's (default: the model's own)\n"
        "  --speeds LIST      their speeds in training tokens/s, each drawn from the list;\n"
        "                     TOKS or TOKSxSHARE, comma-separated: 20000x9,400000 is nine\n"
        "                     CPUs to one GPU (default 20000)\n"
        "  --shares           the peers that join at the start take the mixes in their\n"
        "                     shares, in order, as with --memory, not by draws: --peers 3\n"
        "                     --speeds 24000x2,12000 is two of 24000 and one of 12000\n"
        "                     whatever the seed; the later ones draw (not with --churn)\n"
        "  --latency MS       one way between the router and each peer (default 20);\n"
        "                     LO-HI: each peer draws its own from the range (20-100)\n"
        "  --bandwidth MBIT   each peer's link, each way, Mbit/s (default 0: unlimited);\n"
        "                     LO-HI: each peer draws its own (10-100)\n"
        "  --router-bandwidth MBIT  the router's own link, each way, shared by every\n"
        "                     message; the router is told it, as swarm router's flag of\n"
        "                     the name (default 0: unlimited, the router told nothing)\n"
        "  --direct           project activations sent node to node: the tensors of a\n"
        "                     FWD, a BWD and their RESULT take the peers' links, not\n"
        "                     the router's\n"
        "  --jitter MS        up to this much more latency a message, in order (default 0)\n"
        "  --speed-noise F    each peer runs at 1 +/- F of its speed, drawn again every\n"
        "                     10 virtual s, and says so (a machine shared with others)\n"
        "  --loss F           the fraction of messages that lose a segment and wait 200 ms,\n"
        "                     with what follows them on the link (default 0)\n"
        "  --kill-every S     kill a random peer every S virtual seconds; a new one joins\n"
        "                     1 s later (default 0: never)\n"
        "  --leave-rate R     or: each peer leaves R times an hour on average, a Poisson\n"
        "                     process (1: a departure a peer-hour); a new one joins 1 s\n"
        "                     later (default 0: never)\n"
        "  --stall-every S    stop a random peer every S virtual seconds, as SIGSTOP does\n"
        "                     (default 0: never)\n"
        "  --stall S          for this long (default 3)\n"
        "  --liars N          the last N of the peers lie, from a step 1..4 on (default 0)\n"
        "  --lie-from STEP    they start lying at STEP instead (honest until then)\n"
        "  --lies LIST        the ways they may lie, each liar drawing one: nan, scale,\n"
        "                     drift, shuffle (--numeric only), speed, grad, sumsq, dx,\n"
        "                     state, rmswalk, slowclaim, ckptstall, joinhold (default:\n"
        "                     all of them), recount (only the sums it recomputes of\n"
        "                     another's share for an audit lie)\n"
        "  --churn FILE       peers come and go as a trace of ../shared/data/traces/ says,\n"
        "                     tiled over --peers (copies at phases of the trace)\n"
        "  --churn-scale X    the trace runs X times faster (default 1)\n"
        "  --limit S          virtual seconds before the run counts as stuck (default 36000)\n"
        "  --sim-seed X       the sim's own draws (peers, speeds, faults) from X, the\n"
        "                     model's and the batches' from --seed (default: --seed's)\n"
        "  --verbose          the engine's log lines on stderr\n"
        "  --save-every N     checkpoints every N steps, kept in memory (a rollback goes back\n"
        "                     to the last; files only with --save DIR)\n");
}

static int s_bad(char *err, size_t n, const char *flag, const char *v, const char *want)
{
    snprintf(err, n, "%s %s: expected %s", flag, v, want);
    return -EINVAL;
}

// One VALUE of a mix (NUL-terminated) into *out: 0, or -EINVAL with err
// (whole: the flag's value, for the line)
typedef int (*mix_value_fn)(const char *value, const char *whole, double *out, char *err,
                            size_t n);

// a speed in tokens/s
static int s_speed(const char *value, const char *whole, double *out, char *err, size_t n)
{
    char *end;
    *out = strtod(value, &end);
    if (end == value || *end || !(*out > 0 && *out < 1e12))
        return s_bad(err, n, "--speeds", whole, "TOKS or TOKSxSHARE, comma-separated (20000x9,400000)");
    return 0;
}

// a memory budget (swarm node --memory's sizes)
static int s_size(const char *value, const char *whole, double *out, char *err, size_t n)
{
    (void) whole;
    size_t bytes;
    if (node_parse_size("memory", value, &bytes, err, n) != 0)
        return -EINVAL;
    *out = (double) bytes;
    return 0;
}

// FLAG's mix v, "VALUE or VALUExSHARE, comma-separated" (form, as the line
// says it), into out[SIM_SPEEDS_MAX], one entry a share: their count, or
// -EINVAL with err naming the problem
static int s_mix(const char *flag, const char *v, const char *form, const char *each,
                 mix_value_fn read, double *out, char *err, size_t n)
{
    int count = 0;
    for (const char *p = v; *p;) {
        size_t len = strcspn(p, ","), at = strcspn(p, "x,");
        char value[32];
        long share = 1;
        double x;
        if (at >= sizeof value || len == 0)
            return s_bad(err, n, flag, v, form);
        memcpy(value, p, at);
        value[at] = '\0';
        if (read(value, v, &x, err, n) != 0)
            return -EINVAL;
        if (at < len) {
            char *end;
            share = strtol(p + at + 1, &end, 10);
            if (end != p + len || share < 1 || share > SIM_SPEEDS_MAX)
                return s_bad(err, n, flag, v, "a share of 1..4096 after x");
        }
        for (long k = 0; k < share; k++) {
            if (count == SIM_SPEEDS_MAX)
                return s_bad(err, n, flag, v, "at most 4096 shares in all");
            out[count++] = x;
        }
        p += len + (p[len] == ',');
    }
    return count > 0 ? count : s_bad(err, n, flag, v, each);
}

// --lies nan,scale,...
static int s_lies(sim_flags_t *f, const char *v, char *err, size_t n)
{
    f->o.lies = 0;
    for (const char *p = v; *p;) {
        size_t len = strcspn(p, ",");
        int k = 1;
        while (k < SIM_LIES && !(strlen(s_lie_names[k]) == len && !strncmp(p, s_lie_names[k], len)))
            k++;
        if (k == SIM_LIES)
            return s_bad(err, n, "--lies", v, "ways from nan, scale, drift, shuffle, speed, "
                         "grad, sumsq, dx, state, rmswalk, slowclaim, ckptstall, joinhold, "
                         "recount, comma-separated");
        f->o.lies |= 1u << k;
        p += len + (p[len] == ',');
    }
    if (f->o.lies == 0)
        return s_bad(err, n, "--lies", v, "at least one way to lie");
    return 0;
}

// Take the sim's own flags out of argv. 1 for --help.
static int s_flags(sim_flags_t *f, int *argc, char **argv, char *err, size_t n)
{
    int out = 1;
    static const char *const takes_value[] = { "--peers", "--speeds", "--latency",
        "--kill-every", "--limit", "--stall-every", "--stall", "--liars", "--lies", "--churn",
        "--lie-from",
        "--churn-scale", "--sim-seed", "--bandwidth", "--jitter", "--loss", "--leave-rate",
        "--speed-noise",
        "--router-bandwidth", "--memory", "--as-params" };
    f->o.latency_ms = 20;
    f->o.limit_s = 36000;
    f->o.stall_s = 3;
    f->o.churn_scale = 1;
    f->sim_seed = -1;
    for (int i = 1; i < *argc; i++) {
        const char *a = argv[i], *v = i + 1 < *argc ? argv[i + 1] : NULL;
        int takes = 0;
        for (size_t k = 0; k < sizeof takes_value / sizeof *takes_value; k++)
            takes |= !strcmp(a, takes_value[k]);
        if (!strcmp(a, "--help") || !strcmp(a, "-h"))
            return 1;
        if (!strcmp(a, "--verbose") || !strcmp(a, "--numeric") || !strcmp(a, "--direct")
            || !strcmp(a, "--shares")) {
            if (!strcmp(a, "--verbose"))
                f->verbose = 1;
            else if (!strcmp(a, "--direct"))
                f->o.direct = 1;
            else if (!strcmp(a, "--shares"))
                f->o.shares = 1;
            else
                f->numeric = 1;
            continue;
        }
        if (!takes) {
            argv[out++] = argv[i];
            continue;
        }
        if (!v) {
            snprintf(err, n, "%s needs a value; see 'swarm sim --help'", a);
            return -EINVAL;
        }
        char *end;
        double x = strtod(v, &end), hi = x;
        int number = *v && !*end;
        // --latency and --bandwidth take a range LO-HI too: each peer its own
        if (!number && *v && *end == '-' && end != v
            && (!strcmp(a, "--latency") || !strcmp(a, "--bandwidth"))) {
            char *end2;
            hi = strtod(end + 1, &end2);
            number = end2 != end + 1 && !*end2 && hi > x;
        }
        if (!strcmp(a, "--speeds")) {
            if ((f->o.nspeeds = s_mix(a, v, "TOKS or TOKSxSHARE, comma-separated (20000x9,400000)",
                                      "at least one speed", s_speed, f->speeds, err, n)) < 0)
                return -EINVAL;
            f->o.speeds = f->speeds;
        } else if (!strcmp(a, "--memory")) {
            if ((f->o.nmemories = s_mix(a, v, "SIZE or SIZExSHARE, comma-separated (8Gx3,24G)",
                                        "at least one size", s_size, f->memories, err, n)) < 0)
                return -EINVAL;
            f->o.memories = f->memories;
        } else if (!strcmp(a, "--as-params")) {
            if (!number || !(x >= 1 && x <= 1e13))
                return s_bad(err, n, a, v, "a number of parameters, 1..1e13 (3e9)");
            f->as_params = x;
        } else if (!strcmp(a, "--lies")) {
            if (s_lies(f, v, err, n) != 0)
                return -EINVAL;
        } else if (!strcmp(a, "--churn")) {
            f->churn_path = v;
        } else if (!strcmp(a, "--liars")) {
            if (!number || x < 0 || x > 1000000 || x != (int) x)
                return s_bad(err, n, a, v, "a whole number of liars, 0 or more");
            f->o.liars = (int) x;
        } else if (!strcmp(a, "--lie-from")) {
            if (!number || x < 1 || x > 1e9 || x != (long) x)
                return s_bad(err, n, a, v, "a step, 1 or more");
            f->o.lie_from = (long) x;
        } else if (!strcmp(a, "--stall-every")) {
            if (!number || x < 0 || x > 1e6)
                return s_bad(err, n, a, v, "virtual seconds, 0 (never) or more");
            f->o.stall_every_s = x;
        } else if (!strcmp(a, "--stall")) {
            if (!number || x < 0 || x > 1e6)
                return s_bad(err, n, a, v, "virtual seconds, 0 or more");
            f->o.stall_s = x;
        } else if (!strcmp(a, "--bandwidth")) {
            if (!number || x < 0 || hi > 1e6 || (hi > x && x <= 0))
                return s_bad(err, n, a, v, "Mbit/s, 0 (unlimited) or more, or a range LO-HI "
                             "(10-100) of more than 0");
            f->o.bandwidth_mbit = x;
            f->o.bandwidth_hi_mbit = hi;
        } else if (!strcmp(a, "--jitter")) {
            if (!number || x < 0 || x > 10000)
                return s_bad(err, n, a, v, "milliseconds, 0..10000");
            f->o.jitter_ms = (int64_t) x;
        } else if (!strcmp(a, "--speed-noise")) {
            if (!number || !(x >= 0 && x <= 0.9))
                return s_bad(err, n, a, v, "a fraction, 0..0.9 (0.2: each peer at 0.8-1.2 of its speed)");
            f->o.speed_noise = x;
        } else if (!strcmp(a, "--loss")) {
            if (!number || x < 0 || x > 0.5)
                return s_bad(err, n, a, v, "a fraction of messages, 0..0.5");
            f->o.loss = x;
        } else if (!strcmp(a, "--sim-seed")) {
            if (!number || x < 0 || x > 9e15 || x != (long long) x)
                return s_bad(err, n, a, v, "a whole number, 0 or more");
            f->sim_seed = (long long) x;
        } else if (!strcmp(a, "--churn-scale")) {
            if (!number || !(x >= 1e-3 && x <= 1e9))
                return s_bad(err, n, a, v, "a factor, 0.001..1e9 (100: a trace hour in 36 s)");
            f->o.churn_scale = x;
        } else if (!strcmp(a, "--peers")) {
            if (!number || x < 1 || x > 1000000 || x != (int) x)
                return s_bad(err, n, a, v, "a whole number of peers, 1..1000000");
            f->o.peers = (int) x;
        } else if (!strcmp(a, "--latency")) {
            if (!number || x < 0 || hi > 10000)
                return s_bad(err, n, a, v, "milliseconds, 0..10000, or a range LO-HI (20-100)");
            f->o.latency_ms = (int64_t) x;
            f->o.latency_hi_ms = (int64_t) hi;
        } else if (!strcmp(a, "--router-bandwidth")) {
            if (!number || x < 0 || x > 1e7)
                return s_bad(err, n, a, v, "Mbit/s, 0 (unlimited) or more");
            f->o.router_mbit = x;
        } else if (!strcmp(a, "--leave-rate")) {
            if (!number || x < 0 || x > 1e6)
                return s_bad(err, n, a, v, "departures a peer an hour, 0 (never) or more");
            f->o.leave_rate = x;
        } else if (!strcmp(a, "--kill-every")) {
            if (!number || x < 0 || x > 1e6)
                return s_bad(err, n, a, v, "virtual seconds, 0 (never) or more");
            f->o.kill_every_s = x;
        } else if (!number || x <= 0 || x > 1e9) {
            return s_bad(err, n, a, v, "virtual seconds, more than 0");
        } else {
            f->o.limit_s = x;
        }
        i++;
    }
    *argc = out;
    if (f->o.peers < 1) {
        snprintf(err, n, "--peers N is required (the peers of the simulated swarm); see "
                 "'swarm sim --help'");
        return -EINVAL;
    }
    if (f->o.leave_rate > 0 && f->o.kill_every_s > 0) {
        snprintf(err, n, "--leave-rate and --kill-every: give one of them (two ways to kill "
                 "peers)");
        return -EINVAL;
    }
    if (f->o.liars > f->o.peers) {
        snprintf(err, n, "--liars %d: more than the %d --peers", f->o.liars, f->o.peers);
        return -EINVAL;
    }
    if (f->o.lies == 0) // every way, but shuffle where constants reversed are the same
        f->o.lies = ((1u << SIM_LIES) - 2) & ~(1u << SIM_LIE_RECOUNT)
                    & ~(f->numeric ? 0u : 1u << SIM_LIE_SHUFFLE);
    if (!f->numeric && (f->o.lies & (1u << SIM_LIE_SHUFFLE))) {
        snprintf(err, n, "--lies shuffle needs --numeric (the synthetic peers' activations are "
                 "constants: reversed, they are the same)");
        return -EINVAL;
    }
    if (f->churn_path && f->o.shares) {
        snprintf(err, n, "--shares with --churn: the trace's peers come and go, each drawing "
                 "its speed; leave out one of the two");
        return -EINVAL;
    }
    if (f->churn_path && swarm_sim_churn_load(f->churn_path, &f->churn, err, n) != 0)
        return -EINVAL;
    if (f->churn_path)
        f->o.churn = &f->churn;
    return 0;
}

// --stages auto: the plan router_gather would make for the --peers that
// join first, their budgets and speeds taken from the --memory and
// --speeds mixes in their shares (the draws are the sim's, made later). 0, or -EINVAL with why in err.
static int s_plan_auto(router_t *r, const sim_flags_t *f, char *err, size_t n)
{
    int peers = f->o.peers;
    double *mem = calloc(2 * (size_t) peers, sizeof *mem), *speed = mem + peers;
    if (!mem) {
        snprintf(err, n, "out of memory for a plan of %d peers", peers);
        return -ENOMEM;
    }
    for (int i = 0; i < peers; i++) {
        size_t m = (size_t) i * (size_t) f->o.nmemories / (size_t) peers;
        size_t v = (size_t) i * (size_t) f->o.nspeeds / (size_t) peers;
        mem[i] = f->o.nmemories > 0 ? f->memories[m] : 0.0;
        speed[i] = f->o.nspeeds > 0 ? f->speeds[v] : 20000.0;
    }
    char why[600];
    double bounds[SWARM_MAX_STAGES];
    int rc = router_plan_for(r, mem, speed, peers, bounds, why, sizeof why);
    free(mem);
    if (rc != 0) {
        snprintf(err, n, "--stages auto: %s", why);
        return -EINVAL;
    }
    printf("sim: --stages auto: %d stage%s for the %d peers (%s; micro-batches of %d)\n",
           r->o.stages, r->o.stages == 1 ? "" : "s", peers,
           r->auto_replicas == 2 ? "two replicas a stage fit" : "one replica a stage: no cut fits two",
           r->hp.micro);
    printf("sim: the cuts weighed, by the bound of their best split of these peers over the "
           "chosen one's:");
    int most = peers < r->hp.cfg.L ? peers : r->hp.cfg.L;
    most = most < SWARM_MAX_STAGES ? most : SWARM_MAX_STAGES;
    int unheld = 0;
    for (int S = 1; S <= most; S++)
        if (bounds[S - 1] >= 0.0)
            printf(" %d %.2f%s", S, bounds[S - 1] / bounds[r->o.stages - 1],
                   S == r->o.stages ? " (chosen)" : "");
        else
            printf(" %d -", S), unheld++;
    printf("%s\n", unheld ? " (-: no peer holds some stage of it)" : "");
    return 0;
}

// What a peer holds for each stage (and, with --as-params, of what model).
static void s_needs_say(const router_t *r, double as_params)
{
    if (as_params > 0)
        printf("sim: memory planned as for a model of %.3g parameters: each stage's state "
               "(16 bytes a parameter) %.4g times the model's (%zu parameters), its "
               "activations and buffers the model's\n", as_params, r->need_scale, r->c.nparams);
    int gib = r->c.stage_need[0] >= 1073741824.0;
    router_cut_say(r, "sim");
    printf("sim: a peer holds for its stage");
    for (int s = 0; s < r->c.stages; s++)
        printf("%s %d %.2f %s", s ? "," : "", s, r->c.stage_need[s] / (gib ? 1073741824.0 : 1048576.0),
               gib ? "GiB" : "MiB");
    printf("\n");
}

// ---- --numeric: each peer a node/worker.c -------------------------------------

// A state's checksum, as the nodes compute it
static void s_checksum(void *ctx, const float *params, size_t n, char hex[65])
{
    (void) ctx;
    node_params_checksum(params, n, hex);
}

static void *s_node_open(void *ctx, int peer, int lie, long from)
{
    static const int lies[SIM_LIES] = { [SIM_LIE_NAN] = NODE_LIE_NAN,
        [SIM_LIE_SCALE] = NODE_LIE_SCALE, [SIM_LIE_DRIFT] = NODE_LIE_DRIFT,
        [SIM_LIE_SHUFFLE] = NODE_LIE_SHUFFLE, [SIM_LIE_GRAD] = NODE_LIE_GRAD,
        [SIM_LIE_SUMSQ] = NODE_LIE_SUMSQ, [SIM_LIE_DX] = NODE_LIE_DX, [SIM_LIE_STATE] = NODE_LIE_STATE,
        [SIM_LIE_RMSWALK] = NODE_LIE_RMSWALK, [SIM_LIE_RECOUNT] = NODE_LIE_RECOUNT };
    (void) peer;
    node_worker_config_t c = { .be = ctx, .cache_mb = 512, .slowdown = 1.0 };
    node_worker_t *w = node_worker_new(&c);
    if (w && lie > 0 && lie < SIM_LIES && lies[lie])
        node_worker_lie(w, lies[lie], from);
    return w;
}

// The node's answer, as daemon.c gives it: an ERROR with the reason for a
// request it refuses.
static net_msg_t *s_node_answer(void *ctx, void *node, const net_msg_t *msg)
{
    char err[512] = "";
    net_msg_t *reply = NULL;
    (void) ctx;
    int rc = net_msg_head_const(msg)->type == NET_MSG_ASSIGN
           ? node_worker_assign(node, msg, err, sizeof err)
           : node_worker_serve(node, msg, &reply, err, sizeof err);
    return rc < 0 ? node_worker_error(msg, err) : reply;
}

static void s_node_status(void *ctx, void *node, int *stage, int *ready, long *step)
{
    node_worker_status_t st;
    (void) ctx;
    node_worker_status(node, &st);
    *stage = st.stage;
    *ready = st.ready;
    *step = st.step;
}

static void s_node_close(void *ctx, void *node)
{
    node_worker_t *w = node;
    (void) ctx;
    node_worker_destroy(&w);
}

// The engine's lines (with --verbose; the sim reads them all).
static void s_log(void *ctx, int to_stderr, const char *line)
{
    (void) ctx;
    if (!(to_stderr & SWARM_LOG_HELD)) // (as swarm router's log shows them)
        fputs(line, stderr);
}

static void s_replay(FILE *out, int argc, char **argv)
{
    fprintf(out, "replay: swarm sim");
    for (int i = 1; i < argc; i++) // argv[0] is "sim"
        fprintf(out, " %s", argv[i]);
    fprintf(out, "\n");
}

// Seconds of wall time since *t0.
static double s_wall(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double) (t.tv_sec - t0->tv_sec) + 1e-9 * (double) (t.tv_nsec - t0->tv_nsec);
}

static struct timespec s_wall0; // when the sim started

// A step ended: the progress line, its ETA in this machine's seconds (the
// engine's is of the swarm's virtual ones: 958 s at step 30 of a 10,000-peer
// run of 150 steps that ended a minute later).
static void s_stepped(void *ctx, const swarm_engine_step_t *st)
{
    swarm_engine_step_t wall = *st;
    long done = st->step + 1;
    if (done > 0 && st->stop > done)
        wall.eta_s = s_wall(&s_wall0) / (double) done * (double) (st->stop - done);
    else
        wall.eta_s = 0.0;
    router_io_stepped(ctx, &wall);
}

int cmd_sim(int argc, char **argv)
{
    clock_gettime(CLOCK_MONOTONIC, &s_wall0);
    struct timespec wall0 = s_wall0;
    char err[1024] = "";
    sim_flags_t f = { 0 };
    router_t *r = calloc(1, sizeof *r);
    char **args = malloc((size_t) (argc + 1) * sizeof *args);
    if (!r || !args)
        abort();
    memcpy(args, argv, (size_t) argc * sizeof *args);
    int nargs = argc;
    int rc = s_flags(&f, &argc, argv, err, sizeof err);
    if (rc == 0)
        rc = router_setup(r, argc, argv, err, sizeof err);
    if (rc == 1) {
        s_help(stdout);
        printf("and every flag of swarm router but its socket's (swarm router --help)\n");
    }
    if (rc == 0 && f.o.router_mbit > 0)
        r->c.router_mbit = f.o.router_mbit; // as swarm router --router-bandwidth is told it
    if (rc == 0 && f.as_params > 0)
        r->need_scale = f.as_params / (double) node_config_params(&r->hp.cfg);
    if (rc == 0 && r->auto_stages)
        rc = s_plan_auto(r, &f, err, sizeof err);
    if (rc == 0) {
        router_config(r);
        rc = node_curve_open(&r->o, &r->logs, err, sizeof err);
    }
    swarm_sim_result_t res;
    if (rc == 0) {
        f.o.seed = f.sim_seed >= 0 ? (uint64_t) f.sim_seed : r->hp.seed;
        uint64_t key = f.o.seed ^ 0x5eC2e7ull; // the checks' key: the sim's own draw
        r->c.secret = swarm_splitmix64(&key);
        if (r->o.save_every > 0)
            r->c.save = 1; // checkpoints in memory (written only with --save DIR)
        if (f.as_params > 0 || f.o.nmemories > 0)
            s_needs_say(r, f.as_params);
        if (r->c.min_nodes == 0 && r->auto_stages) // the replicas the plan was made for
            r->c.min_nodes = r->c.stages * r->auto_replicas;
        else if (r->c.min_nodes == 0 && f.o.nmemories > 0) // (not all may hold a stage)
            r->c.min_nodes = r->c.stages;
        else if (r->c.min_nodes == 0) // with --churn, whoever is up at the start
            r->c.min_nodes = f.o.peers < r->c.stages || f.o.churn ? r->c.stages : f.o.peers;
        if (f.o.churn) { // as swarm/sim_churn.c tiles it
            int copies = (f.o.peers + f.churn.most / 2) / f.churn.most;
            copies = copies < 1 ? 1 : copies;
            char tiling[96] = "one copy of it";
            if (copies > 1)
                snprintf(tiling, sizeof tiling, "%d copies of it side by side, each 1/%d of the "
                         "trace ahead of the last", copies, copies);
            printf("sim: churn from %s: %d machines up at most over %.1f h; %s, its counts "
                   "times %.2f, %g times faster (a trace hour in %.0f s)\n", f.churn_path,
                   f.churn.most, (double) f.churn.span_ms / 3.6e6, tiling,
                   (double) f.o.peers / ((double) copies * f.churn.most), f.o.churn_scale,
                   3600.0 / f.o.churn_scale);
        }
        swarm_sim_nodes_t nodes = { .open = s_node_open, .answer = s_node_answer,
                                    .status = s_node_status, .close = s_node_close };
        if (f.numeric && !(nodes.ctx = blas_backend_open("cpu", 1, err, sizeof err)))
            rc = -ENODEV;
        if (f.numeric)
            f.o.nodes = &nodes;
        swarm_engine_io_t model = { .ctx = r, .log = f.verbose ? s_log : NULL,
                                    .lr_at = router_io_lr_at,
                                    .clip_scale = router_io_clip_scale,
                                    .stepped = s_stepped,
                                    .trace = r->trace ? router_io_trace : NULL,
                                    .checksum = s_checksum };
        if (rc == 0) {
            rc = swarm_sim_run(&r->c, &f.o, &model, &res, err, sizeof err);
            r->c.params = r->c.m = r->c.v = NULL; // the engine's, freed with it
        }
    }
    if (rc != 0 && rc != 1) {
        fprintf(stderr, "swarm sim: %s\n", err);
    } else if (rc == 0) {
        if (router_tty())
            fprintf(stderr, "\n");
        char lies[256] = "";
        if (res.catch_steps >= 0 || res.lies_applied > 0 || res.liars_loose > 0)
            snprintf(lies, sizeof lies, "; lying gradient sums: caught at most %ld steps after "
                     "the first, %d unaudited applied, %d liars never caught",
                     res.catch_steps, res.lies_applied, res.liars_loose);
        if (res.drift_applied > 0) // (nothing compares a stage's only replica with another)
            snprintf(lies + strlen(lies), sizeof lies - strlen(lies), "; %d updates carried "
                     "the work of a stage's only replica, drifted", res.drift_applied);
        if (res.copies_lost > 0) // (one against one, the vote keeps the older replica's)
            snprintf(lies + strlen(lies), sizeof lies - strlen(lies), "; %d honest replicas "
                     "expelled holding a copy of such a replica's state", res.copies_lost);
        printf("sim: %s peers; faults: %d killed, %d stalled, %d liars (%d caught); %d joined; "
               "engine memory at most %.1f MB (its formula: %.1f)%s\n",
               f.numeric ? "numeric" : "synthetic", res.kills, res.stalls, f.o.liars,
               res.liars_caught, res.joins, res.memory / 1e6, res.memory_bound / 1e6, lies);
        if (f.o.nmemories > 0)
            printf("sim: --memory: %d live peer%s at the end held no stage (none fits its "
                   "memory; best counts them out)\n", res.idle, res.idle == 1 ? "" : "s");
        // (best, below, is the whole swarm's speed spread as if a peer could
        // be cut: a few uneven peers cannot reach it, and this tells how
        // near the best whole split the router's was)
        printf("sim: %sat the end the engine's assignment's bound was %.0f, %.3f of the best "
               "split the policy finds%s (%.0f)\n", f.o.nmemories > 0 ? "--memory: " : "",
               res.bound_end, res.best_held > 0 ? res.bound_end / res.best_held : 0.0,
               f.o.nmemories > 0 ? " within the peers' memory" : "", res.best_held);
        if (r->c.audit > 0.0) { // (a step started over, or run again after a rollback, is drawn again)
            char cost[256];
            swarm_audit_cost_text(res.timed_steps, res.train_time, res.audited_steps,
                                  res.audited_time, cost, sizeof cost);
            printf("sim: audits: %d gradient sums recomputed, in %d %s %ld steps (each step's "
                   "sums are audited together: a replica's with probability %g until it passed "
                   "%d, %g after); %d shares split among several replicas; %s\n", res.audits,
                   res.audit_steps,
                   res.rollbacks || res.audit_steps > res.steps ? "tries at its" : "of", res.steps, r->c.audit, SWARM_AUDIT_PROVEN, r->c.audit_proven, res.audit_splits, cost);
        }
        printf("sim: the router's link carried %.2f MB/s to the peers and %.2f from them%s; "
               "its engine took %.3f of a core\n", res.router_mb_s[0], res.router_mb_s[1],
               f.o.direct ? " (activations node to node: --direct)" : "", res.engine_core);
        printf("sim | peers %d | stages %d | steps %ld | seed %llu | tok/s %.0f | bound %.0f | "
               "best %.0f | /bound %.2f | /best %.2f | bound/best %.3f | us/request %.1f | "
               "wall %.1f s | rollbacks %d | ",
               f.o.peers, r->c.stages, res.steps, (unsigned long long) f.o.seed, res.tok_s,
               res.bound, res.best, res.bound > 0 ? res.tok_s / res.bound : 0.0,
               res.best > 0 ? res.tok_s / res.best : 0.0, res.best > 0 ? res.bound / res.best : 0.0,
               res.us_per_request, s_wall(&wall0), res.rollbacks);
        if (res.violation[0]) {
            printf("invariants FAILED: %s\n", res.violation);
            s_replay(stdout, nargs, args);
        } else {
            printf("invariants ok\n");
        }
        rc = res.violation[0] ? -EPROTO : 0; // exit 1 (rc 1 is --help's)
    }
    free(r->c.params);
    free(r->c.m);
    free(r->c.v);
    node_curve_close(&r->logs);
    swarm_data_destroy(&r->data);
    if (r->trace)
        fclose(r->trace);
    swarm_sim_churn_free(&f.churn);
    free(r);
    free(args);
    return rc == 0 ? 0 : rc == 1 ? 0 : 1;
}
