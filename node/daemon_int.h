/* daemon_int.h - what daemon.c and daemon_flags.c share (private to
 * node/daemon*.c): `swarm node`'s flags.
 */
#ifndef SWARM_NODE_DAEMON_INT_H
#define SWARM_NODE_DAEMON_INT_H

#include "net.h"
#include "node.h"

#include <stdio.h>

typedef struct {
    const char *join;         // router endpoint, tcp://HOST:PORT (in target)
    node_join_t target;       // --join, parsed (a token carries the router's key)
    const char *router_key;   // the router's .pub file, or its Z85 key; NULL: the token's
    int name_given;           // --name was given
    int exit_when_done;       // --exit-when-done: exit 0 once the router's run is over
    const char *key;          // our key pair NAME (NAME.key, NAME.pub); NULL = default
    const char *device;       // backend: auto, cpu, cuda[:N]
    int threads;              // CPU threads, 0 = all cores
    char name[65];            // shown in the router's table
    long cache_mb;            // MiB of cached activations at most
    size_t memory;            // --memory: bytes it may hold for its stage, 0 = the default
    double slowdown;          // >= 1: sleep so that work takes this many times longer
    int misbehave;            // MIS_* (test builds only: --misbehave)
    long misbehave_from;      // the step it starts at
} daemon_opts_t;

// A test build (build/swarm-misbehave, -DSWARM_MISBEHAVE) has --misbehave
// MODE[@STEP]: from STEP on the node lies in one way (or, crash, dies the
// first time a BWD it is about to serve has a STEP queued behind it), so
// that tests can watch the router cope. The swarm binary has no such flag.
// The lies in what it computes are the worker's (NODE_LIE_*: nan, scale,
// drift, shuffle, grad, sumsq, dx, state, gradinf, rmswalk, checksum);
// flood, speed, crash, slowclaim (a speed claimed a million times too
// small, then no FWD or BWD answered), ckptstall (no STATE_GET answered)
// and joinhold (the state it is to load held 3 s, then BYE and exit) are
// the daemon's own.
enum { MIS_NONE, MIS_NAN, MIS_SCALE, MIS_DRIFT, MIS_FLOOD, MIS_SPEED, MIS_SHUFFLE, MIS_CRASH,
       MIS_GRAD, MIS_SUMSQ, MIS_DX, MIS_STATE, MIS_GRADINF, MIS_RMSWALK, MIS_CHECKSUM,
       MIS_SLOWCLAIM, MIS_CKPTSTALL, MIS_JOINHOLD, MIS_RECOUNT };

void daemon_usage(FILE *out);
// argv into o: 0, 1 for --help, or -EINVAL with a reason naming the flag.
int daemon_parse(int argc, char **argv, daemon_opts_t *o, char *err, size_t n);
// --router-key ARG (a .pub file or a Z85 key) into *out: 0, or -errno
// with the reason and the fix in err.
int daemon_router_key_load(const char *arg, net_key_t **out, char *err, size_t n);

#endif
