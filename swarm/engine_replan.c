/* engine_replan.c - a new cut of the model when the nodes at hand cannot
 * serve the one it has (--stages auto: the caller gives io.cut). Between
 * steps, while the swarm waits for its state (before training, or after a
 * rollback: the stages then reload the checkpoint from the router's copy),
 * a stage that no node serves nor joins for REPLAN_GRACE_MS, and that no
 * other stage can spare a replica for, has no node that can hold it. The
 * engine then asks the caller for the tables of each cut into 1, 2, ...
 * stages and takes the one the caller's first cut was chosen by
 * (swarm_policy_cut_choose: by the bound of each cut's best split of the
 * nodes known, each within its memory, then two replicas a stage before
 * one, then the fewest stages). Every node is given a
 * stage of the new cut: those that cover it first, the rest by the policy
 * (swarm_policy_assign); each loads the router's copy of the last
 * checkpoint, and the run replays from it as after any rollback. The
 * micro-batch stays the run's, so the steps are the same steps. When no
 * cut fits, the log says what the swarm needs and the engine asks again
 * every REPLAN_EVERY_MS as nodes come and go.
 */
#include "engine_int.h"

#define REPLAN_GRACE_MS 5000   // a stage empty this long is for a new cut
#define REPLAN_EVERY_MS 2000   // between tries while no cut fits
#define REPLAN_HEARD_MS 5000   // a node told it holds no stage counts if heard this recently

// A stage with no replica ready and none joining.
static int s_empty_stage(const swarm_engine_t *r)
{
    for (int s = 0; s < r->stages; s++) {
        if (engine_ready_count(r, s) > 0)
            continue;
        if (!engine_joining_to(r, s))
            return s;
    }
    return -1;
}

// A node a new cut may count on: a live one (ready or joining), or one
// waiting because it could hold no stage of the old cut, heard from lately.
static int s_counted(const swarm_engine_t *r, int p)
{
    const peer_t *pe = &r->peers[p];
    if (pe->state == P_READY || pe->state == P_JOINING)
        return !pe->failed;
    return pe->state == P_DEAD && pe->no_fit && r->now_ms - pe->last_seen <= REPLAN_HEARD_MS
        && engine_secs(r) >= pe->banned_until;
}

// The engine's tables become those of the cut into S stages: every node
// leaves its old stage, what was judged per stage (the RMS and norm
// bounds, the audits drawn) starts again, and buffers sized by the
// largest stage go (they are made again at the new size when needed).
static void s_recut(swarm_engine_t *r, int S, const size_t *n, const size_t *off,
                    const double *cost, const double *need, const char *text)
{
    for (int i = 0; i < r->req_slots; i++)
        if (engine_req_at(r, i)->id)
            engine_req_done(r, engine_req_at(r, i)); // states on their way: of the old cut
    engine_mbs_clear(r);
    for (int p = r->npeers - 1; p >= 0; p--) { // (from the last: no list is shifted)
        peer_t *pe = &r->peers[p];
        if (pe->state == P_READY)
            engine_peer_state(r, p, P_JOINING);
        pe->stage = -1;
        pe->moving = pe->got_grad = pe->in_step = pe->norm_only = pe->self_to = 0;
        pe->inflight = pe->working = pe->held_thirds = 0;
        pe->held_kind[0] = pe->held_kind[1] = 0;
        pe->node_tok_s = 0.0; // said of its old stage
        pe->slots = 0;
        pe->busy[0] = pe->busy[1] = 0.0;
        pe->moved_at = engine_secs(r); // no rebalancing move before it has served a while
        free(pe->grad);
        free(pe->audit_sums);
        pe->grad = pe->audit_sums = NULL;
    }
    free(r->audit_sum);
    r->audit_sum = NULL;
    r->stages = S;
    snprintf(r->cut, sizeof r->cut, "%s", text);
    r->max_stage_n = 0;
    for (int s = 0; s < S; s++) {
        r->stage_n[s] = n[s];
        r->stage_off[s] = off[s];
        r->stage_cost[s] = cost[s];
        r->stage_need[s] = need[s] > 0 ? need[s] : 0.0;
        r->max_stage_n = n[s] > r->max_stage_n ? n[s] : r->max_stage_n;
    }
    memset(r->rms, 0, sizeof r->rms);
    memset(r->norms, 0, sizeof r->norms);
    memset(r->steps_open, 0, sizeof r->steps_open);
    memset(r->stepped, 0, sizeof r->stepped);
    engine_audits_reset(r);
    engine_mbs_clear(r); // (its counts are by the stages)
    r->pending = r->redo_pending = r->ckpt_pending = r->update_pending = 0;
}

// Place the counted nodes idx[k] on the new cut: to[k] >= 0 covers a
// stage; the rest go where the policy puts a joiner.
static void s_place(swarm_engine_t *r, const int *idx, const int *to, int k)
{
    for (int i = 0; i < k; i++)
        if (to[i] >= 0)
            engine_admit(r, idx[i], to[i], NULL);
    for (int i = 0; i < k; i++)
        if (to[i] < 0)
            engine_admit(r, idx[i], -1, NULL);
}

// The nodes a new cut is for: their budgets mem[k].
typedef struct {
    const swarm_engine_t *r;
    const double *mem;
    int k;
} cut_for_t;

// swarm_cut_need_fn of the caller's cuts for those nodes (the other
// tables are asked again for the cut chosen).
static int s_need_of(void *ctx, int S, double *need, double *cost)
{
    const cut_for_t *f = ctx;
    size_t n[SWARM_MAX_STAGES], off[SWARM_MAX_STAGES];
    char text[SWARM_CUT_MAX];
    return f->r->io.cut(f->r->io.ctx, S, f->mem, f->k, n, off, cost, need, text);
}

// What the largest stage of the most stages k nodes allow needs (0: none).
static double s_most(const cut_for_t *f, int *S)
{
    double need[SWARM_MAX_STAGES], cost[SWARM_MAX_STAGES], most = 0.0;
    *S = f->k < f->r->hp.cfg.L ? f->k : f->r->hp.cfg.L;
    *S = *S < SWARM_MAX_STAGES ? *S : SWARM_MAX_STAGES;
    if (*S > 0 && s_need_of((void *) f, *S, need, cost) == 0)
        for (int s = 0; s < *S; s++)
            most = need[s] > most ? need[s] : most;
    return most;
}

void engine_replan(swarm_engine_t *r)
{
    int empty = r->io.cut && !r->started ? s_empty_stage(r) : -1;
    if (empty < 0) {
        r->replan_from = 0;
        return;
    }
    int64_t now = r->now_ms;
    if (!r->replan_from)
        r->replan_from = now;
    if (now - r->replan_from < REPLAN_GRACE_MS || now - r->replan_tried < REPLAN_EVERY_MS)
        return;
    r->replan_tried = now;
    int *idx = malloc((size_t) (r->npeers ? r->npeers : 1) * (2 * sizeof(int) + sizeof(double)));
    if (!idx) {
        engine_warn(r, "swarm router: out of memory for a new cut of the model\n");
        return;
    }
    int *to = idx + r->npeers, k = 0;
    double *mem = r->by_peer, largest = 0.0; // scratch
    double *speed = (double *) (to + r->npeers); // (what each measured at start)
    for (int p = 0; p < r->npeers; p++) {
        if (!s_counted(r, p))
            continue;
        idx[k] = p;
        mem[k] = r->peers[p].memory;
        speed[k] = r->peers[p].hello_tok_s;
        largest = mem[k] > largest ? mem[k] : largest;
        k++;
    }
    size_t n[SWARM_MAX_STAGES], off[SWARM_MAX_STAGES];
    double cost[SWARM_MAX_STAGES], need[SWARM_MAX_STAGES];
    char text[SWARM_CUT_MAX];
    cut_for_t f = { r, mem, k };
    int replicas, S = swarm_policy_cut_choose(r->hp.cfg.L, mem, speed, k, s_need_of, &f,
                                              &replicas, to, NULL);
    if (S < 1 || r->io.cut(r->io.ctx, S, mem, k, n, off, cost, need, text) != 0) {
        int top;
        double most = s_most(&f, &top);
        char why[240];
        snprintf(why, sizeof why, "swarm router: stage %d has no node that can hold it (%.1f MiB), "
                 "and the %d node%s known (the largest may hold %.1f MiB) cannot hold the model "
                 "in any cut (the largest stage of %d needs %.1f MiB): waiting for more nodes, "
                 "or larger ones\n", empty, r->stage_need[empty] / 1048576.0, k, k == 1 ? "" : "s",
                 largest / 1048576.0, top, most / 1048576.0);
        if (strcmp(why, r->replan_said) != 0)
            engine_warn(r, "%s", why);
        snprintf(r->replan_said, sizeof r->replan_said, "%s", why);
        free(idx);
        return;
    }
    int was = r->stages;
    double held = r->stage_need[empty];
    s_recut(r, S, n, off, cost, need, text);
    const char *spare = replicas == 2 ? "two replicas a stage" : "one replica a stage";
    if (S == was)
        engine_warn(r, "swarm router: stage %d has no node that can hold it (%.1f MiB): the %d "
                    "nodes known are placed again on its %d stages (%s), from step %ld\n", empty,
                    held / 1048576.0, k, S, spare, r->step);
    else
        engine_warn(r, "swarm router: stage %d of %d has no node that can hold it (%.1f MiB): the "
                    "model is cut again, into %d stage%s for the %d node%s known (%s), from step "
                    "%ld\n", empty, was, held / 1048576.0, S, S == 1 ? "" : "s", k,
                    k == 1 ? "" : "s", spare, r->step);
    char line[64 + 24 * SWARM_MAX_STAGES];
    int at = snprintf(line, sizeof line, "swarm router: a node holds for its stage");
    for (int s = 0; s < S && at < (int) sizeof line - 24; s++)
        at += snprintf(line + at, sizeof line - (size_t) at, "%s %d %.1f MiB", s ? "," : "", s,
                       r->stage_need[s] / 1048576.0);
    engine_say(r, "%s\n", line);
    r->replan_said[0] = '\0';
    r->replan_from = 0;
    s_place(r, idx, to, k);
    free(idx);
}
