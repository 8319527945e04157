/* router_setup.c - what `swarm router` and `swarm sim` share: the router's
 * flags, the model's set-up (data, weights or checkpoint, hyperparameters,
 * the plan and the micro-batch), the engine's config from them, and the
 * callbacks that are the model's (the schedule, the clip) or the
 * terminal's (log lines, the progress line, the loss log).
 */
#include "router_int.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void router_io_log(void *ctx, int to_stderr, const char *line)
{
    (void) ctx;
    if (to_stderr & SWARM_LOG_HELD)
        return; // counted in the next such line shown
    fputs(line, to_stderr ? stderr : stdout);
    if (!to_stderr)
        fflush(stdout); // the tests read it as it comes
}

void router_io_trace(void *ctx, const char *line)
{
    router_t *r = ctx;
    fputs(line, r->trace);
}

double router_io_lr_at(void *ctx, long step)
{
    const router_t *r = ctx;
    return node_lr_at(step, r->hp.iters, r->hp.warmup, r->hp.lr, r->hp.min_lr);
}

float router_io_clip_scale(void *ctx, double norm)
{
    const router_t *r = ctx;
    return node_clip_scale(norm, (float) r->hp.grad_clip);
}

int router_tty(void)
{
    return isatty(STDERR_FILENO) && !getenv("SWARM_PLAIN");
}

// A step ended: the loss log, the plot's curve, the progress line.
void router_io_stepped(void *ctx, const swarm_engine_step_t *st)
{
    router_t *r = ctx;
    node_curve_add(&r->logs, st->step, st->loss, st->lr);
    if (r->curve && st->step < r->hp.iters)
        r->curve[st->step] = st->loss;
    long done = st->step + 1;
    char to[40] = ""; // --steps ends this run before the schedule does
    if (st->stop < st->iters)
        snprintf(to, sizeof to, " to step %ld", st->stop);
    if (router_tty())
        fprintf(stderr, "\r\033[Kstep %ld/%ld | loss %.4f | lr %.2e | %.0f tok/s | peers %d | ETA %.0f s%s",
                done, st->iters, st->loss, st->lr, st->tok_s, st->ready, st->eta_s, to);
    else if (done % r->o.log_every == 0 || done == st->stop)
        fprintf(stderr, "step %ld/%ld | loss %.4f | lr %.2e | %.0f tok/s | peers %d | ETA %.0f s%s\n",
                done, st->iters, st->loss, st->lr, st->tok_s, st->ready, st->eta_s, to);
}

// --wire, --grad-wire, --window: 1 when `a` is one of them (set from v),
// 0 when it is not, -EINVAL for a bad value.
static int s_wire_flag(router_t *r, const char *a, const char *v, char *err, size_t n)
{
    long x;
    if (!strcmp(a, "--wire") || !strcmp(a, "--grad-wire"))
        return net_dtype_parse(a + 2, v, !strcmp(a, "--wire") ? &r->c.wire : &r->c.grad_wire, err,
                               n) == 0 ? 1 : -EINVAL;
    if (strcmp(a, "--window") != 0)
        return 0;
    r->c.window_mode = !strcmp(v, "all")    ? SWARM_WINDOW_ALL
                     : !strcmp(v, "auto") ? SWARM_WINDOW_AUTO
                                          : SWARM_WINDOW_FIXED;
    if (r->c.window_mode != SWARM_WINDOW_FIXED)
        return 1;
    if (node_parse_long("window", v, 1, 1L << 20, &x, err, n) != 0) {
        snprintf(err, n, "--window %s: expected all, auto or a whole number of micro-batches >= 1",
                 v);
        return -EINVAL;
    }
    r->c.window = (int) x;
    return 1;
}

// Take the router's own flags out of argv; the rest are training flags.
static int s_router_flags(router_t *r, int *argc, char **argv, char *err, size_t n)
{
    int out = 1, rc, stages_given = 0; // --stages: 1 a number, 2 auto (0 none: auto too)
    r->listen = "tcp://*:7070";
    r->c.rebalance_every = 5.0;
    r->c.tensor_bound = 100.0;
    r->c.verify = 0.05;
    r->c.audit = -1.0; // below: by the kind of swarm
    r->c.audit_proven = -1.0; // below: from --audit
    r->c.wire = r->c.grad_wire = NET_DTYPE_F32;
    r->c.window_mode = SWARM_WINDOW_ALL;
    for (int i = 1; i < *argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < *argc ? argv[i + 1] : NULL;
        int takes = !strcmp(a, "--listen") || !strcmp(a, "--key") || !strcmp(a, "--allow")
                 || !strcmp(a, "--min-nodes") || !strcmp(a, "--window")
                 || !strcmp(a, "--rebalance-every") || !strcmp(a, "--tensor-bound")
                 || !strcmp(a, "--verify") || !strcmp(a, "--audit") || !strcmp(a, "--assign")
                 || !strcmp(a, "--audit-proven")
                 || !strcmp(a, "--wire") || !strcmp(a, "--grad-wire") || !strcmp(a, "--trace")
                 || !strcmp(a, "--router-bandwidth");
        if (takes && !v) {
            snprintf(err, n, "%s needs a value; see 'swarm router --help'", a);
            return -EINVAL;
        }
        if (!strcmp(a, "--listen")) {
            r->listen = v;
        } else if (!strcmp(a, "--key")) {
            r->key_name = v;
        } else if (!strcmp(a, "--allow")) {
            r->allow_path = v;
        } else if (!strcmp(a, "--trace")) {
            r->trace_path = v;
        } else if ((rc = s_wire_flag(r, a, v, err, n)) != 0) {
            if (rc < 0)
                return rc;
        } else if (!strcmp(a, "--min-nodes")) {
            long x;
            if (node_parse_long(a + 2, v, 0, 1000000, &x, err, n) != 0)
                return -EINVAL;
            r->c.min_nodes = (int) x;
        } else if (!strcmp(a, "--rebalance-every") || !strcmp(a, "--tensor-bound")) {
            char *end;
            double x = strtod(v, &end);
            if (*v == '\0' || *end || !(x >= 0 && x <= 86400)) {
                snprintf(err, n, "%s %s: expected a number 0..86400 (0 = never)", a, v);
                return -EINVAL;
            }
            *(!strcmp(a, "--tensor-bound") ? &r->c.tensor_bound : &r->c.rebalance_every) = x;
        } else if (!strcmp(a, "--router-bandwidth")) {
            char *end;
            double x = strtod(v, &end);
            if (*v == '\0' || *end || !(x >= 0.1 && x <= 1e6)) {
                snprintf(err, n, "--router-bandwidth %s: expected the Mbit/s this machine's link "
                         "carries each way, 0.1..1000000 (for example 20 for a home uplink)", v);
                return -EINVAL;
            }
            r->c.router_mbit = x;
        } else if (!strcmp(a, "--verify") || !strcmp(a, "--audit") || !strcmp(a, "--audit-proven")) {
            char *end;
            int audit = strncmp(a, "--audit", 7) == 0;
            double x = strtod(v, &end);
            if (*v == '\0' || *end || !(x >= 0 && x <= 1)) {
                snprintf(err, n, "%s %s: expected a fraction 0..1 of %s", a, v,
                         audit ? "steps to audit a gradient sum in" : "forwards to check");
                return -EINVAL;
            }
            *(!audit ? &r->c.verify : !strcmp(a, "--audit") ? &r->c.audit : &r->c.audit_proven) = x;
        } else if (!strcmp(a, "--assign")) {
            if (strcmp(v, "speed") != 0 && strcmp(v, "even") != 0) {
                snprintf(err, n, "--assign %s: expected speed or even", v);
                return -EINVAL;
            }
            r->c.assign_even = !strcmp(v, "even");
        } else if (!strcmp(a, "--open")) {
            r->allow_path = NULL;
            continue;
        } else if (!strcmp(a, "--stages") && v && !strcmp(v, "auto")) {
            stages_given = 2;
        } else {
            stages_given |= !strcmp(a, "--stages");
            argv[out++] = argv[i];
            continue;
        }
        i++;
    }
    *argc = out;
    r->auto_stages = stages_given != 1; // planned once nodes have joined (router_plan.c)
    // an open swarm audits gradient sums; a private one admits only keys its
    // owner listed, and trusts them unless --audit says otherwise
    if (r->c.audit < 0.0)
        r->c.audit = r->allow_path ? 0.0 : SWARM_AUDIT_DEFAULT;
    // a proven replica (SWARM_AUDIT_PROVEN audits passed in a row) is drawn
    // at a tenth of --audit; --audit 1 checks every sum of every replica
    if (r->c.audit_proven < 0.0)
        r->c.audit_proven = r->c.audit >= 1.0 ? 1.0 : r->c.audit * SWARM_AUDIT_PROVEN_SHARE;
    if (r->c.audit_proven > r->c.audit) {
        snprintf(err, n, "--audit-proven %g: expected at most --audit's %g (a replica that has "
                 "passed its audits is drawn less often, not more)", r->c.audit_proven, r->c.audit);
        return -EINVAL;
    }
    return 0;
}

double router_fill_idle(int G, int S)
{
    return (double) (S - 1) / (G + S - 1);
}

int router_batch_for(int micro, int S)
{
    int G = 1;
    while (router_fill_idle(G, S) > MICRO_IDLE)
        G++;
    return G * micro;
}

// Without --micro-batch the router picks it: the largest divisor of the
// batch that keeps the fill and drain within MICRO_IDLE and gives each of
// a stage's R replicas a micro-batch a step; but none of fewer than
// MICRO_MIN_TOKENS tokens (windows x T), under which each request's fixed
// costs (the router's hop, waking the node, decoding) eat what the
// pipeline gains (docs/performance.md). When no divisor does both, the
// smallest with enough tokens; one stage of one replica (no pipeline, no
// one to share with), the whole batch.
int router_micro_choose(int batch, int T, int S, int R)
{
    int best = batch;
    for (int m = batch; m >= 1 && (long) m * T >= MICRO_MIN_TOKENS; m--) {
        if (batch % m != 0)
            continue;
        best = m;
        if (batch / m >= R && router_fill_idle(batch / m, S) <= MICRO_IDLE)
            break;
    }
    return best;
}

int router_setup(router_t *r, int argc, char **argv, char *err, size_t n)
{
    int rc = s_router_flags(r, &argc, argv, err, n);
    if (rc == 0)
        rc = node_train_parse(argc, argv, &r->o, err, n);
    if (rc != 0)
        return rc;
    if (r->trace_path) {
        if (!(r->trace = fopen(r->trace_path, "w"))) {
            snprintf(err, n, "--trace %s: %s", r->trace_path, strerror(errno));
            return -EINVAL;
        }
        setvbuf(r->trace, NULL, _IOLBF, 0); // whole lines, also if the router is killed
    }
    if (r->o.data) {
        rc = swarm_data_load(r->o.data, &r->data, err, n);
    } else {
        size_t len;
        const uint8_t *bytes = node_corpus(&len);
        r->data = swarm_data_wrap(bytes, len, "(built-in corpus)");
    }
    if (rc == 0)
        rc = node_train_weights(&r->o, &r->c.params, &r->c.m, &r->c.v, &r->c.step, err, n);
    if (rc != 0)
        return rc;
    r->hp = node_train_hparams(&r->o);
    if (r->o.micro == 0 && r->hp.batch >= 1) // no --micro-batch given
        r->hp.micro = router_micro_choose(r->hp.batch, r->hp.cfg.T, r->o.stages,
                                          r->c.min_nodes > r->o.stages
                                              ? r->c.min_nodes / r->o.stages : 1);
    if (r->hp.micro < 1 || r->hp.batch % r->hp.micro != 0) {
        snprintf(err, n, "--micro-batch %d must divide --batch %d", r->hp.micro, r->hp.batch);
        return -EINVAL;
    }
    rc = node_config_check(&r->hp.cfg, err, n);
    if (rc == 0)
        rc = node_plan_make(&r->hp.cfg, r->o.stages, &r->plan, err, n);
    if (rc == 0)
        rc = swarm_data_check(r->data, r->hp.cfg.T, err, n);
    return rc;
}

// The engine's config from the model, the plan and the flags: it knows
// stages as parameter counts and costs, and the run as numbers.
double router_need(const router_t *r, node_memory_t m)
{
    double state = (double) m.state * (r->need_scale > 0 ? r->need_scale : 1.0);
    return (double) node_memory_need(m) - (double) m.state + state;
}

void router_cut_tables(const router_t *r, const node_plan_t *plan, size_t *n, size_t *off,
                       double *cost, double *need)
{
    const node_config_t *m = &r->hp.cfg;
    for (int s = 0; s < plan->stages; s++) {
        node_plan_stage_range(m, plan, s, &off[s], &n[s]);
        cost[s] = node_plan_stage_cost(m, plan, s);
        need[s] = router_need(r, node_plan_stage_memory(m, plan, s, r->hp.micro));
    }
}

void router_config(router_t *r)
{
    swarm_engine_config_t *c = &r->c;
    const node_config_t *m = &r->hp.cfg;
    c->shape = (swarm_shape_t) { .V = m->V, .T = m->T, .C = m->C, .L = m->L, .H = m->H };
    c->stages = r->plan.stages;
    router_cut_tables(r, &r->plan, c->stage_n, c->stage_off, c->stage_cost, c->stage_need);
    node_plan_text(&r->plan, c->cut, sizeof c->cut); // (ASSIGN says it: a cut may be uneven)
    c->nparams = node_config_params(m);
    c->batch = r->hp.batch;
    c->micro = r->hp.micro;
    c->iters = r->hp.iters;
    c->steps = r->o.steps;
    c->seed = r->hp.seed;
    c->eval_every = r->o.eval_every;
    c->eval_iters = r->hp.eval_iters;
    c->save = r->o.save != NULL;
    c->save_every = r->o.save_every;
    c->weight_decay = r->hp.weight_decay;
    c->grad_clip = r->hp.grad_clip;
    c->data = r->data;
}
