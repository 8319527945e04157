/* sim.c - `swarm sim`: the router engine (swarm/) against a simulated swarm
 * (swarm/sim.c), with every model, training and router flag of `swarm
 * router` and a few of its own: how many peers, how fast, how far, how
 * often one dies. It prints the engine's progress and one last line of
 * what the run reached and whether every invariant held; a violation
 * prints the one command that replays it (the same seed, the same run).
 */
#include "router_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define SIM_SPEEDS_MAX 4096

typedef struct {
    swarm_sim_opts_t o;      // for swarm_sim_run
    double speeds[SIM_SPEEDS_MAX]; // the mix, one entry per share
    int verbose;             // the engine's lines to stderr
} sim_flags_t;

static void s_help(FILE *out)
{
    fprintf(out,
        "usage: swarm sim --peers N --stages S [--steps K] [--seed X] [--speeds LIST]\n"
        "                 [--latency MS] [--kill-every SECONDS] [--limit SECONDS] [--verbose]\n"
        "                 [router and training flags of swarm router]\n"
        "Train on a simulated swarm, in virtual time, deterministic from --seed: the real\n"
        "router engine, peers that answer as nodes do, tensors of constants and gradients\n"
        "whose sums are checked exactly. The last line says what it reached and whether\n"
        "every invariant held (each update the sum of exactly its step's micro-batches, no\n"
        "honest peer lost, no rollback a kill did not cause, nothing left in flight).\n"
        "  --peers N          peers that join at the start (>= 1)\n"
        "  --speeds LIST      their speeds in training tokens/s, each drawn from the list;\n"
        "                     TOKS or TOKSxSHARE, comma-separated: 20000x9,400000 is nine\n"
        "                     CPUs to one GPU (default 20000)\n"
        "  --latency MS       one way between the router and each peer (default 20)\n"
        "  --kill-every S     kill a random peer every S virtual seconds; a new one joins\n"
        "                     1 s later (default 0: never)\n"
        "  --limit S          virtual seconds before the run counts as stuck (default 36000)\n"
        "  --verbose          the engine's log lines on stderr\n"
        "  --save-every N     checkpoints every N steps, kept in memory (a rollback goes back\n"
        "                     to the last; files only with --save DIR)\n");
}

static int s_bad(char *err, size_t n, const char *flag, const char *v, const char *want)
{
    snprintf(err, n, "%s %s: expected %s", flag, v, want);
    return -EINVAL;
}

// --speeds TOKS[xSHARE],...
static int s_speeds(sim_flags_t *f, const char *v, char *err, size_t n)
{
    const char *p = v;
    f->o.nspeeds = 0;
    while (*p) {
        char *end;
        double tok = strtod(p, &end);
        long share = 1;
        if (end == p || !(tok > 0 && tok < 1e12))
            return s_bad(err, n, "--speeds", v, "TOKS or TOKSxSHARE, comma-separated (20000x9,400000)");
        p = end;
        if (*p == 'x') {
            share = strtol(p + 1, &end, 10);
            if (end == p + 1 || share < 1 || share > SIM_SPEEDS_MAX)
                return s_bad(err, n, "--speeds", v, "a share of 1..4096 after x");
            p = end;
        }
        if (*p && *p != ',')
            return s_bad(err, n, "--speeds", v, "TOKS or TOKSxSHARE, comma-separated (20000x9,400000)");
        if (*p == ',')
            p++;
        for (long k = 0; k < share; k++) {
            if (f->o.nspeeds == SIM_SPEEDS_MAX)
                return s_bad(err, n, "--speeds", v, "at most 4096 shares in all");
            f->speeds[f->o.nspeeds++] = tok;
        }
    }
    if (f->o.nspeeds == 0)
        return s_bad(err, n, "--speeds", v, "at least one speed");
    f->o.speeds = f->speeds;
    return 0;
}

// Take the sim's own flags out of argv. 1 for --help.
static int s_flags(sim_flags_t *f, int *argc, char **argv, char *err, size_t n)
{
    int out = 1;
    f->o.latency_ms = 20;
    f->o.limit_s = 36000;
    for (int i = 1; i < *argc; i++) {
        const char *a = argv[i], *v = i + 1 < *argc ? argv[i + 1] : NULL;
        int takes = !strcmp(a, "--peers") || !strcmp(a, "--speeds") || !strcmp(a, "--latency")
                 || !strcmp(a, "--kill-every") || !strcmp(a, "--limit");
        if (!strcmp(a, "--help") || !strcmp(a, "-h"))
            return 1;
        if (!strcmp(a, "--verbose")) {
            f->verbose = 1;
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
        double x = strtod(v, &end);
        int number = *v && !*end;
        if (!strcmp(a, "--speeds")) {
            if (s_speeds(f, v, err, n) != 0)
                return -EINVAL;
        } else if (!strcmp(a, "--peers")) {
            if (!number || x < 1 || x > 1000000 || x != (int) x)
                return s_bad(err, n, a, v, "a whole number of peers, 1..1000000");
            f->o.peers = (int) x;
        } else if (!strcmp(a, "--latency")) {
            if (!number || x < 0 || x > 10000)
                return s_bad(err, n, a, v, "milliseconds, 0..10000");
            f->o.latency_ms = (int64_t) x;
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
    return 0;
}

// The engine's lines (with --verbose; the sim reads them all).
static void s_log(void *ctx, int to_stderr, const char *line)
{
    (void) ctx;
    (void) to_stderr;
    fputs(line, stderr);
}

static void s_replay(FILE *out, int argc, char **argv)
{
    fprintf(out, "replay: swarm sim");
    for (int i = 1; i < argc; i++) // argv[0] is "sim"
        fprintf(out, " %s", argv[i]);
    fprintf(out, "\n");
}

int cmd_sim(int argc, char **argv)
{
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
    if (rc == 0) {
        router_config(r);
        rc = node_curve_open(&r->o, &r->logs, err, sizeof err);
    }
    swarm_sim_result_t res;
    if (rc == 0) {
        f.o.seed = r->hp.seed;
        if (r->o.save_every > 0)
            r->c.save = 1; // checkpoints in memory (written only with --save DIR)
        if (r->c.min_nodes == 0)
            r->c.min_nodes = f.o.peers < r->c.stages ? r->c.stages : f.o.peers;
        swarm_engine_io_t model = { .ctx = r, .log = f.verbose ? s_log : NULL,
                                    .lr_at = router_io_lr_at,
                                    .clip_scale = router_io_clip_scale,
                                    .stepped = router_io_stepped,
                                    .trace = r->trace ? router_io_trace : NULL };
        rc = swarm_sim_run(&r->c, &f.o, &model, &res, err, sizeof err);
        r->c.params = r->c.m = r->c.v = NULL; // the engine's, freed with it
    }
    if (rc != 0 && rc != 1) {
        fprintf(stderr, "swarm sim: %s\n", err);
    } else if (rc == 0) {
        if (router_tty())
            fprintf(stderr, "\n");
        printf("sim | peers %d | stages %d | steps %ld | seed %llu | tok/s %.0f | bound %.0f | "
               "best %.0f | /bound %.2f | /best %.2f | us/request %.1f | rollbacks %d | ",
               f.o.peers, r->c.stages, res.steps, (unsigned long long) f.o.seed, res.tok_s,
               res.bound, res.best, res.bound > 0 ? res.tok_s / res.bound : 0.0,
               res.best > 0 ? res.tok_s / res.best : 0.0, res.us_per_request, res.rollbacks);
        if (res.violation[0]) {
            printf("invariants FAILED: %s\n", res.violation);
            s_replay(stdout, nargs, args);
        } else {
            printf("invariants ok\n");
        }
        rc = res.violation[0] ? 1 : 0;
    }
    free(r->c.params);
    free(r->c.m);
    free(r->c.v);
    node_curve_close(&r->logs);
    swarm_data_destroy(&r->data);
    if (r->trace)
        fclose(r->trace);
    free(r);
    free(args);
    return rc == 0 ? 0 : rc == 1 ? 0 : 1;
}
