/* router_plan.c - `swarm router --stages auto`: the number of stages chosen
 * for the machines at hand. Before the engine exists the router listens,
 * keeps each node's HELLO (the memory it may hold for a stage), and plans
 * once --min-nodes nodes (at least 2) have said it: the fewest stages whose
 * each stage one of those nodes can hold, the largest node for the largest
 * stage (node_plan_make cuts by compute; node_plan_stage_memory says what
 * each stage needs). The engine then takes the HELLOs it kept as if they
 * came now. A swarm whose nodes can hold no plan waits for more and says
 * what it needs. Mid-run the engine cuts the model again, through
 * router_io_cut, when no node known can hold a stage of its cut
 * (swarm/engine_replan.c).
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

// The micro-batch for S stages: --micro-batch, or the router's own choice.
static int s_micro(const router_t *r, int S)
{
    return r->o.micro > 0 ? r->hp.micro : router_micro_choose(r->hp.batch, r->hp.cfg.T, S);
}

// swarm_cut_need_fn before the engine exists: the needs of the cut into
// S stages at the micro-batch the router would choose for S.
static int s_need_of(void *ctx, int S, double *need, double *cost)
{
    const router_t *r = ctx;
    node_plan_t plan;
    char err[256];
    if (node_plan_make(&r->hp.cfg, S, &plan, err, sizeof err) != 0)
        return -1;
    for (int s = 0; s < S; s++) {
        need[s] = router_need(r, node_plan_stage_memory(&r->hp.cfg, &plan, s, s_micro(r, S)));
        cost[s] = node_plan_stage_cost(&r->hp.cfg, &plan, s);
    }
    return 0;
}

int router_io_cut(void *ctx, int stages, size_t *n, size_t *off, double *cost, double *need)
{
    const router_t *r = ctx;
    node_plan_t plan;
    char err[256];
    if (node_plan_make(&r->hp.cfg, stages, &plan, err, sizeof err) != 0)
        return -1;
    router_cut_tables(r, &plan, n, off, cost, need);
    return 0;
}

// " A, B and C MiB a stage" for the cut into S stages (" MiB a stage ..."
// shortened past 8 of them): what snprintf into buf[n] returned.
static size_t s_needs_list(router_t *r, int S, char *buf, size_t n)
{
    double need[NODE_MAX_LAYERS], cost[NODE_MAX_LAYERS], most = 0;
    if (S < 1 || s_need_of(r, S, need, cost) != 0)
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
    int replicas, S = swarm_policy_cut_choose(r->hp.cfg.L, mem, speed, n, s_need_of, r, &replicas,
                                              to, bounds);
    free(to);
    if (S > 0 && node_plan_make(&r->hp.cfg, S, &plan, why, wn) == 0) {
        r->plan = plan;
        r->o.stages = S;
        r->hp.micro = s_micro(r, S);
        r->auto_replicas = replicas;
        return 0;
    }
    // the most stages these nodes could have: what each would need
    S = n < r->hp.cfg.L ? n : r->hp.cfg.L;
    size_t at = (size_t) snprintf(why, wn, "the %d node%s known (the largest may hold %.1f MiB) "
                                  "cannot hold the model: in %d stage%s it needs", n,
                                  n == 1 ? "" : "s", largest / 1048576.0, S, S == 1 ? "" : "s");
    at += s_needs_list(r, S, why + (at < wn ? at : wn), at < wn ? wn - at : 0);
    if (S < r->hp.cfg.L) {
        at += (size_t) snprintf(why + (at < wn ? at : wn), at < wn ? wn - at : 0,
                                "; in %d (the most it has)", r->hp.cfg.L);
        at += s_needs_list(r, r->hp.cfg.L, why + (at < wn ? at : wn), at < wn ? wn - at : 0);
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
