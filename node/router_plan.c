/* router_plan.c - `swarm router --stages auto` (its default): the stages
 * chosen for the machines at hand. Before the engine exists the router
 * listens, keeps each node's HELLO (the memory it may hold for a stage, the
 * speed it measured), and plans once --min-nodes nodes (at least 2) have
 * said it: of the cuts into 1, 2, ... stages, the one
 * swarm_policy_cut_choose weighs best for them. The cut into S stages is
 * node_plan_make's (by compute) when the nodes hold it; else the one
 * balanced by compute within the budgets of the nodes that would hold each
 * stage (s_cut_within: larger stages for larger nodes), which ASSIGN's
 * cut= tells the nodes. node_plan_stage_memory says what each stage needs.
 * The engine then takes the HELLOs it kept as if they came now. A swarm
 * whose nodes can hold no plan waits for more and says what it needs.
 * Mid-run the engine cuts the model again, through router_io_cut, when no
 * node known can hold a stage of its cut (swarm/engine_replan.c).
 */
#include "router_int.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GATHER_MAX 4096      // HELLOs kept while planning (one a key)

typedef struct {
    net_peer_t who;
    net_msg_t *hello;        // the last HELLO of that key
    double memory;           // what it said it may hold, 0 unknown (any)
    double tok_s;            // the speed it measured at start, 0 unknown
} gathered_t;

// The micro-batch for S stages on n nodes: --micro-batch, or the router's
// own choice for n / S replicas a stage.
static int s_micro(const router_t *r, int S, int n)
{
    return r->o.micro > 0 ? r->hp.micro
                          : router_micro_choose(r->hp.batch, r->hp.cfg.T, S, n > S ? n / S : 1);
}

// The position of stage s of S in the pipeline: what its need and cost
// depend on beside its blocks (the embeddings on the first, the head on
// the last).
static int s_end(int s, int S)
{
    return (s == 0) | (s == S - 1) << 1;
}

// What a stage of k blocks at place e (s_end) needs and costs, for k in
// 1..L: need[e * (L + 1) + k], cost[...] (need at micro-batch micro). A
// stage at a place in a plan of 3 (of 1 for e = 3; a last stage runs to
// the model's end) tells them. 0, or -1 out of memory (free *need then).
static int s_by_blocks(const router_t *r, int micro, double **need, double **cost)
{
    int L = r->hp.cfg.L;
    *need = malloc(4 * (size_t) (L + 1) * 2 * sizeof **need);
    if (!*need)
        return -1;
    *cost = *need + 4 * (L + 1);
    for (int e = 0; e < 4; e++)
        for (int k = 1; k <= L; k++) {
            node_plan_t t = { .stages = e == 3 ? 1 : 3 };
            int s = e == 1 || e == 3 ? 0 : e == 2 ? 2 : 1;
            t.first[s] = e & 2 ? L - k : 0, t.first[s + 1] = e & 2 ? L : k;
            (*need)[e * (L + 1) + k] = router_need(r, node_plan_stage_memory(&r->hp.cfg, &t, s,
                                                                              micro));
            (*cost)[e * (L + 1) + k] = node_plan_stage_cost(&r->hp.cfg, &t, s);
        }
    return 0;
}

// Of the cuts into S stages whose stage s needs at most cap[s] bytes (by
// s_by_blocks's need and cost), the one whose costliest stage costs least
// (node_plan_make's balance, within memory), into *plan: that cost, or
// INFINITY when no cut fits the caps.
static double s_cut_within(int L, int S, const double *need, const double *cost,
                           const double *cap, node_plan_t *plan)
{
    double *best = malloc((size_t) (S + 1) * (L + 1) * sizeof *best);
    int *from = malloc((size_t) (S + 1) * (L + 1) * sizeof *from);
    if (!best || !from) {
        free(best), free(from);
        return INFINITY;
    }
    // best[s][l]: the least costliest stage with blocks [0, l) in stages [0, s)
    for (int i = 0; i < (S + 1) * (L + 1); i++)
        best[i] = INFINITY;
    best[0] = 0.0;
    for (int s = 1; s <= S; s++)
        for (int l = s; l <= L - (S - s); l++)
            for (int a = s - 1; a < l; a++) {
                int e = s_end(s - 1, S), k = l - a;
                if (!(best[(s - 1) * (L + 1) + a] < INFINITY) || need[e * (L + 1) + k] > cap[s - 1])
                    continue;
                double worst = fmax(best[(s - 1) * (L + 1) + a], cost[e * (L + 1) + k]);
                if (worst < best[s * (L + 1) + l]) { // (ties: the earlier cut)
                    best[s * (L + 1) + l] = worst;
                    from[s * (L + 1) + l] = a;
                }
            }
    double got = best[S * (L + 1) + L];
    if (got < INFINITY) {
        memset(plan, 0, sizeof *plan);
        plan->stages = S;
        plan->first[S] = L;
        for (int s = S, l = L; s > 0; s--)
            plan->first[s - 1] = l = from[s * (L + 1) + l];
    }
    free(best), free(from);
    return got;
}

static int s_desc(const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;
    return (x < y) - (x > y);
}

// The needs and costs of plan's S stages at micro-batch micro.
static void s_tables(const router_t *r, const node_plan_t *plan, int micro, double *need,
                     double *cost)
{
    for (int s = 0; s < plan->stages; s++) {
        need[s] = router_need(r, node_plan_stage_memory(&r->hp.cfg, plan, s, micro));
        cost[s] = node_plan_stage_cost(&r->hp.cfg, plan, s);
    }
}

// The cut of S stages at micro-batch micro for nodes of budgets mem[n]
// (0: any; mem NULL: none known), into *plan: node_plan_make's (compute
// balanced) when the nodes hold `replicas` of each of its stages; else
// the cut balanced within the budgets of the nodes that would hold each
// stage (the largest S of them, or 2S paired, the largest stages at
// either end of the pipeline), when there is one. Two replicas before
// one. 0; -1 when the model has no cut of S stages (a cut the nodes
// cannot hold is still given: the balanced one).
static int s_cut_for(const router_t *r, int S, int micro, const double *mem, int n,
                     node_plan_t *plan)
{
    char err[256];
    if (node_plan_make(&r->hp.cfg, S, plan, err, sizeof err) != 0)
        return -1;
    if (!mem || n < S)
        return 0;
    double need[NODE_MAX_LAYERS], cost[NODE_MAX_LAYERS], *by = malloc((size_t) n * sizeof *by);
    int *to = malloc((size_t) n * sizeof *to);
    if (!by || !to) {
        free(by), free(to);
        return 0;
    }
    s_tables(r, plan, micro, need, cost);
    for (int i = 0; i < n; i++)
        by[i] = mem[i] > 0.0 ? mem[i] : INFINITY;
    qsort(by, (size_t) n, sizeof *by, s_desc);
    double *bn = NULL, *bc = NULL; // s_by_blocks's, made once when first needed
    for (int k = 2; k >= 1; k--) {
        if ((long) k * S > n)
            continue;
        if (swarm_policy_cut_fits(need, S, k, mem, n, to))
            break; // the balanced cut
        double cap[NODE_MAX_LAYERS], rev[NODE_MAX_LAYERS];
        for (int s = 0; s < S; s++) // stage s's k nodes hold what the least of them holds
            cap[s] = by[(size_t) k * s + (size_t) k - 1], rev[S - 1 - s] = cap[s];
        if (!bn && s_by_blocks(r, micro, &bn, &bc) != 0)
            break; // (bn NULL)
        node_plan_t a, b; // the largest stages first, or last: the cheaper costliest stage
        double ca = s_cut_within(r->hp.cfg.L, S, bn, bc, cap, &a);
        double cb = s_cut_within(r->hp.cfg.L, S, bn, bc, rev, &b);
        if (ca < INFINITY || cb < INFINITY) {
            *plan = ca <= cb ? a : b;
            break;
        }
    }
    free(bn), free(by), free(to);
    return 0;
}

// The nodes a cut is chosen for before the engine exists.
typedef struct {
    const router_t *r;
    const double *mem;       // their budgets (0: any), NULL none known
    int n;
} cut_for_t;

// swarm_cut_need_fn before the engine exists: the needs and costs of the
// cut into S stages for those nodes at the micro-batch the router would
// choose for S.
static int s_need_of(void *ctx, int S, double *need, double *cost)
{
    const cut_for_t *f = ctx;
    node_plan_t plan;
    int micro = s_micro(f->r, S, f->n);
    if (s_cut_for(f->r, S, micro, f->mem, f->n, &plan) != 0)
        return -1;
    s_tables(f->r, &plan, micro, need, cost);
    return 0;
}

int router_io_cut(void *ctx, int stages, const double *mem, int nmem, size_t *n, size_t *off,
                  double *cost, double *need, char *text)
{
    const router_t *r = ctx;
    node_plan_t plan;
    if (s_cut_for(r, stages, r->hp.micro, mem, nmem, &plan) != 0)
        return -1;
    router_cut_tables(r, &plan, n, off, cost, need);
    node_plan_text(&plan, text, SWARM_CUT_MAX);
    return 0;
}

// " A, B and C MiB a stage" for the cut into S stages by compute for
// `nodes` nodes (" up to X MiB a stage" past 8 of them): what snprintf
// into buf[n] returned.
static size_t s_needs_list(router_t *r, int S, int nodes, char *buf, size_t n)
{
    double need[NODE_MAX_LAYERS], cost[NODE_MAX_LAYERS], most = 0;
    cut_for_t f = { r, NULL, nodes }; // (compute balanced, the micro-batch for that many)
    if (S < 1 || s_need_of(&f, S, need, cost) != 0)
        return (size_t) snprintf(buf, n, " (no such cut)");
    size_t at = 0;
    for (int s = 0; s < S; s++)
        most = fmax(most, need[s]);
    if (S > 8)
        return (size_t) snprintf(buf, n, " up to %.1f MiB a stage", most / 1048576.0);
    for (int s = 0; s < S; s++)
        at += (size_t) snprintf(buf + (at < n ? at : n), at < n ? n - at : 0, "%s%.1f",
                                s == 0 ? " " : s == S - 1 ? " and " : ", ", need[s] / 1048576.0);
    at += (size_t) snprintf(buf + (at < n ? at : n), at < n ? n - at : 0, " MiB a stage");
    return at;
}

int router_plan_for(router_t *r, const double *mem, const double *speed, int n, double *bounds,
                    char *why, size_t wn)
{
    int *to = malloc((size_t) (n > 0 ? n : 1) * sizeof *to);
    if (!to) {
        snprintf(why, wn, "out of memory for a plan of %d nodes", n);
        return -ENOMEM;
    }
    double largest = 0;
    for (int i = 0; i < n; i++)
        largest = mem[i] > largest ? mem[i] : largest;
    node_plan_t plan;
    cut_for_t f = { r, mem, n };
    int replicas, S = swarm_policy_cut_choose(r->hp.cfg.L, mem, speed, n, s_need_of, &f,
                                              &replicas, to, bounds);
    free(to);
    if (S > 0 && s_cut_for(r, S, s_micro(r, S, n), mem, n, &plan) == 0) {
        r->plan = plan;
        r->o.stages = S;
        r->hp.micro = s_micro(r, S, n);
        r->auto_replicas = replicas;
        return 0;
    }
    // the most stages these nodes could have: what each would need
    S = n < r->hp.cfg.L ? n : r->hp.cfg.L;
    size_t at = (size_t) snprintf(why, wn, "the %d node%s known (the largest may hold %.1f MiB) "
                                  "cannot hold the model: in %d stage%s it needs", n,
                                  n == 1 ? "" : "s", largest / 1048576.0, S, S == 1 ? "" : "s");
    at += s_needs_list(r, S, n, why + (at < wn ? at : wn), at < wn ? wn - at : 0);
    if (S < r->hp.cfg.L) {
        at += (size_t) snprintf(why + (at < wn ? at : wn), at < wn ? wn - at : 0,
                                "; in %d (the most it has)", r->hp.cfg.L);
        at += s_needs_list(r, r->hp.cfg.L, n, why + (at < wn ? at : wn), at < wn ? wn - at : 0);
    }
    snprintf(why + (at < wn ? at : wn), at < wn ? wn - at : 0,
             ": waiting for more nodes, or larger ones");
    return -EAGAIN;
}

// A HELLO's meta number `key` in [0, 1e18), 0 when absent or bad (unknown).
static double s_meta_number(const net_msg_t *m, const char *key)
{
    char text[32] = "", *end = NULL;
    if (net_msg_meta_get(m, key, text, sizeof text) != 0)
        return 0;
    double v = strtod(text, &end);
    return end != text && *end == '\0' && v >= 0 && v < 1e18 ? v : 0;
}

// A HELLO from who kept (the last of each key: a node started again with
// another --memory says so). 1 when kept.
static int s_keep(gathered_t *g, int *n, const net_peer_t *who, net_msg_t **m)
{
    double memory = s_meta_number(*m, "memory"), tok_s = s_meta_number(*m, "tok_s");
    for (int i = 0; i < *n; i++) {
        if (strcmp(g[i].who.key, who->key) != 0)
            continue;
        net_msg_destroy(&g[i].hello);
        g[i] = (gathered_t) {*who, *m, memory, tok_s};
        *m = NULL;
        return 1;
    }
    if (*n == GATHER_MAX)
        return 0; // (the rest join once the engine is there)
    g[(*n)++] = (gathered_t) {*who, *m, memory, tok_s};
    *m = NULL;
    return 1;
}

int router_gather(router_t *r, volatile sig_atomic_t *stop, char *err, size_t n)
{
    gathered_t *g = calloc(GATHER_MAX, sizeof *g);
    if (!g) {
        snprintf(err, n, "out of memory for the nodes' HELLOs");
        return -ENOMEM;
    }
    int count = 0, want = r->c.min_nodes > 2 ? r->c.min_nodes : 2, rc = -EAGAIN;
    char why[600] = "", said[600] = "";
    printf("swarm router: --stages auto: the stages are chosen once %d nodes have joined, for "
           "the memory they say they may hold\n", want);
    fflush(stdout);
    while (rc == -EAGAIN && !*stop) {
        net_peer_t who;
        net_msg_t *m = NULL;
        char e[256];
        if (net_server_recv(r->srv, net_clock_ms() + 200, &who, &m, e, sizeof e) != 0)
            continue;
        int type = net_msg_head_const(m)->type;
        if (type == NET_MSG_HELLO && s_keep(g, &count, &who, &m) && count >= want) {
            double mem[GATHER_MAX], speed[GATHER_MAX];
            for (int i = 0; i < count; i++)
                mem[i] = g[i].memory, speed[i] = g[i].tok_s;
            rc = router_plan_for(r, mem, speed, count, NULL, why, sizeof why);
            if (rc == -EAGAIN && strcmp(why, said) != 0) {
                printf("swarm router: %s\n", why);
                fflush(stdout);
                snprintf(said, sizeof said, "%s", why);
            }
        } else if (type == NET_MSG_STATUS) {
            net_msg_t *a = net_msg_reply(m, NET_MSG_ERROR);
            char meta[160];
            snprintf(meta, sizeof meta, "reason=the router is choosing its stages (--stages auto): "
                     "%d of %d nodes have joined", count, want);
            if (a && net_msg_set_meta(a, meta) == 0 && net_server_send(r->srv, &who, &a) != 0)
                fprintf(stderr, "swarm router: a STATUS could not be answered\n");
            net_msg_destroy(&a); // (a send took it)
        }
        net_msg_destroy(&m);
    }
    if (rc == 0) {
        router_config(r);
        printf("swarm router: --stages auto: %d stage%s for the %d nodes known (micro-batches of "
               "%d; %s)\n", r->o.stages, r->o.stages == 1 ? "" : "s", count, r->hp.micro,
               r->auto_replicas == 2 ? "two replicas a stage fit"
                                     : "one replica a stage: no cut fits two");
        router_needs_say(r);
        r->gathered = g;
        r->ngathered = count;
        return 0;
    }
    for (int i = 0; i < count; i++)
        net_msg_destroy(&g[i].hello);
    free(g);
    snprintf(err, n, "stopped while choosing its stages");
    return -EINTR;
}

void router_needs_say(const router_t *r)
{
    printf("swarm router: a node holds for its stage");
    for (int s = 0; s < r->c.stages; s++)
        printf("%s %d %.1f MiB", s ? "," : "", s, r->c.stage_need[s] / 1048576.0);
    printf(" (its state, a micro-batch's activations, buffers); it is given only a stage its "
           "--memory holds\n");
    router_cut_say(r, "swarm router");
}

void router_cut_say(const router_t *r, const char *who)
{
    node_plan_t even;
    char err[256];
    if (node_plan_make(&r->hp.cfg, r->plan.stages, &even, err, sizeof err) == 0
        && memcmp(even.first, r->plan.first, sizeof even.first) != 0) {
        printf("%s: the model is cut within the nodes' memory, not by compute alone:", who);
        for (int pass = 0; pass < 2; pass++) {
            const node_plan_t *p = pass ? &even : &r->plan;
            printf("%s", pass ? " (by compute:" : "");
            for (int s = 0; s < p->stages; s++) {
                int a = p->first[s], b = p->first[s + 1] - 1;
                if (pass)
                    printf("%s %d", s ? "," : "", b - a + 1);
                else if (a == b)
                    printf("%s stage %d block %d", s ? "," : "", s, a);
                else
                    printf("%s stage %d blocks %d-%d", s ? "," : "", s, a, b);
            }
        }
        printf(" blocks a stage)\n");
    }
    fflush(stdout);
}

void router_gathered_replay(router_t *r)
{
    gathered_t *g = r->gathered;
    int64_t now = net_clock_ms();
    for (int i = 0; i < r->ngathered; i++) {
        swarm_engine_message(r->engine, now, &g[i].who, g[i].hello);
        net_msg_destroy(&g[i].hello);
    }
    free(g);
    r->gathered = NULL;
    r->ngathered = 0;
}
