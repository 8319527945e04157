/* engine_audit.h - what an audit of a replica's gradient sum keeps
 * (engine_audit.c, engine_audit_out.c): the target's record of the step's
 * audit, and the candidates a hand-out weighs. Private to swarm/engine*.c.
 */
#ifndef SWARM_ENGINE_AUDIT_H
#define SWARM_ENGINE_AUDIT_H

#include "swarm.h"

// An audit of one replica's gradient sum (engine_audit.c), kept in the
// target's entry; a dispute asks up to AUDIT_VOTERS verifiers in all. Its
// first round may split the share among up to SWARM_AUDIT_PARTS verifiers
// (swarm.h; engine_audit_out.c), each recomputing a part of it.
#define AUDIT_VOTERS 3
typedef struct {
    int want;                // drawn: its sum of this step is to be recomputed
    int forced;              // whatever the draw (engine_audit_force): 2 its own tensor or sum
                             // was outside its stage's bound, 1 it fed one that was
    int open;                // a verifier recomputes it now
    int done;                // settled (or its verdict given)
    int by[AUDIT_VOTERS];    // the replicas recomputing it whole: later ones decide a dispute
    int n;                   // of them asked
    int agree[AUDIT_VOTERS]; // each one's result matched the target's
    int counted[AUDIT_VOTERS]; // each one's sum was of the target's share
    int dx_bads[AUDIT_VOTERS]; // each one's dx_bad and dx_fp (audit_part_t)
    double dx_fps[AUDIT_VOTERS][3];
    int abandoned;           // its target died: nothing more is sent, nothing judged
    int share;               // micro-batches of its share, when it was drawn
    int parts;               // verifiers of the split round now open (0: none is)
    int parts_out;           // of them, whose sum has not come (nor will: lost)
    int parts_in;            // of them, whose sum came (added in the target's audit_sums)
    int split_by[SWARM_AUDIT_PARTS]; // the split round's verifiers
    int split_bad;           // a part differed from the target's, or was not of its count
    int split_lost;          // a verifier of the split round was lost
    int whole;               // a split round did not settle it: one verifier recomputes it whole
} audit_t;

// What one verifier recomputes of its target's share (the whole of it, or
// a part of a split round), kept in the verifier's entry while its
// audit_of names the target: the target's micro-batches from index next
// to end, not including end.
typedef struct {
    int next;                // the next micro-batch to send (end or past: all sent)
    int end;                 // the index after the part (G: to the share's end)
    int mbs;                 // micro-batches in the part
    int left;                // of them, not answered yet
    int inflight;            // its requests not answered yet
    int asked_sum;           // its STEP audit=1 is sent
    int dx_bad;              // an input gradient (or the last stage's loss) differed
    double dx_fp[3];         // its input gradients' sum of squares and weighed sum, its losses' sum
} audit_part_t;

// A replica that could recompute a share, in a hand-out (engine_audit_out.c).
typedef struct {
    double sp;               // its speed, tok/s
    double load;             // micro-batches of the share it recomputes now
    double psp, pload;       // the sums of both over the faster candidates
    int p;
} audit_cand_t;

#endif
