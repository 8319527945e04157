/* policy_int.h - what the plans' two files share (policy_plan.c: the
 * searches for the best split and the moves that take the swarm there;
 * policy_audit.c: what audits cost a split, and the repair that shortens
 * the longest): the context a plan works in, and the functions each
 * calls in the other.
 */
#ifndef SWARM_POLICY_INT_H
#define SWARM_POLICY_INT_H

#include "swarm.h"

#define PLAN_EXACT_PEERS 12       // movable peers the exact search takes
#define PLAN_AUDIT_PEERS 2000     // counted peers whose plans weigh audits (plan_repair)

typedef struct wi {
    double w;
    int i;
} wi_t; // a peer and its weight, to sort by weight

typedef struct {
    const swarm_peer_view_t *v;
    const swarm_plan_t *pl;
    int n, S;
    double *w;         // each counted peer's weight (0: not counted)
    double *u;         // scratch: a stage's speeds (plan_audit_s)
    double audit;      // the fraction of steps audited that plan_value weighs: the
                       // plan's, up to PLAN_AUDIT_PEERS counted peers; 0 beyond
    int counted;       // peers counted (ready or joining on a stage)
    double k;          // a step's time over the bound's (swarm_plan_t step_k), 1 or more
    int *from;         // its stage now (-1: not counted)
    int *movable;      // it may change stage
    int *at;           // the assignment being worked on
    int *scratch;      // another
    int *wave;         // the wave each peer's move starts in (s_waves)
    int *mov, nmov;    // the movable peers
    int waves;         // a plan's exact search: splits that waves reach
    struct wi *order, *list; // the movable peers by weight; the bottleneck's
    double T[SWARM_MAX_STAGES]; // each stage's summed speed under `at`
    int count[SWARM_MAX_STAGES]; // its peers under `at`
    int own[SWARM_MAX_STAGES];   // of them, its own ready replicas now
    int keep_own[SWARM_MAX_STAGES]; // how many of those it must keep
    int ready[SWARM_MAX_STAGES];    // its ready peers now
    int joining[SWARM_MAX_STAGES];  // and those joining it now
} plan_ctx_t;

// policy_plan.c
int plan_holds(const plan_ctx_t *c, int i, int s); // peer i may serve stage s
double plan_low(const plan_ctx_t *c, int *which);  // the bound under `at` (and its stage)
int plan_may_leave(const plan_ctx_t *c, int i, int s);
void plan_put(plan_ctx_t *c, int i, int s);        // peer i to stage s, the totals kept
double plan_worth(const swarm_plan_t *pl, double low, double high, double f);

// policy_audit.c
double plan_value(plan_ctx_t *c);                  // what a plan weighs a split by
void plan_repair(plan_ctx_t *c, int priced);       // the longest audits shortened

#endif
