#!/bin/sh
# test_rollback.sh BUILD - the only node of a stage is SIGKILLed mid-run:
# the router rolls the whole swarm back to its last checkpoint, waits for a
# new node, and replays; every step's loss (the replay's, for steps run
# twice) equals `swarm train`'s, to every digit printed: a step is two
# micro-batches, whose gradients sum to the same bits wherever they ran
# (docs/numerics.md). Then with a spare: 3 nodes on 2 stages, the
# only node of stage 1 dies and no new one comes: a replica of stage 0
# moves to stage 1 and the run finishes with the same losses. Last, 7 nodes
# on 3 stages (3, 2, 2): both nodes of stages 1 and 2 die at once; two
# replicas of stage 0 move, one to each.
# Ends with "N passed, N failed".
BUILD=${1:-build}
SWARM="$BUILD/swarm"
. tests/lib.sh

tiny_reference 40 1e-2 4
"$SWARM" keygen "$TMP/router" >/dev/null

start_ckpt_router "$TMP/router.log" --listen "tcp://127.0.0.1:0" --min-nodes 2
endpoint=$(wait_endpoint "$TMP/router.log")
start_node() {  # I
    "$SWARM" keygen "$TMP/node$1" >/dev/null
    "$SWARM" node --join "$endpoint" --router-key "$TMP/router.pub" --key "$TMP/node$1" \
        --threads 1 --name "node$1" --slowdown 60 >"$TMP/node$1.log" 2>&1 &
    eval "pid_node$1=$!"
    pids="$pids $!"
}
start_node 1
start_node 2
# kill_stage1 LOG: once LOG has step 12, SIGKILL the first node it put on
# stage 1; $victim is its pid (empty if none), $name its name
kill_stage1() {
    victim=""
    for _ in $(seq 1 600); do
        if grep -q "^step 12/40 " "$1"; then
            name=$(sed -n 's/^swarm router: peer [0-9]* (\(node[0-9]\), .*) joins stage 1$/\1/p' "$1" | head -1)
            victim=$(eval "echo \$pid_$name")
            kill -9 "$victim"
            return
        fi
        sleep 0.05
    done
}
kill_stage1 "$TMP/router.log"
[ -n "$victim" ] && ok "SIGKILLed the only node of stage 1 after step 12" || bad "no victim"
for _ in $(seq 1 200); do
    grep -q "rolling back to step 10" "$TMP/router.log" && break
    sleep 0.05
done
# (at step 12 to 15: the kill follows the log line of step 12, and the
# router finds a dead node when a request to it fails)
if grep -q "stage 1 lost every replica at step 1[2-5]: rolling back to step 10" "$TMP/router.log"; then
    ok "rollback: $(grep -m1 "rolling back" "$TMP/router.log" | cut -c1-100)"
else
    bad "no rollback"; tail -5 "$TMP/router.log"
fi
start_node 3
wait_exit "$router" 60 || { bad "router still running after 60 s"; tail -10 "$TMP/router.log"; }
wait "$router"
rc=$?
if clean_run $rc "$TMP/router.log" \
    && grep -q "(node3) ready on stage 1" "$TMP/router.log"; then
    ok "a new node took stage 1 and the run finished"
else
    bad "router exit $rc"; tail -15 "$TMP/router.log"
fi
# the last line written for each step is the one that counts
if losses_match "$TMP/swarm.txt" "$TMP/train.txt" 40 0; then
    ok "every step's loss equals swarm train's $(losses_said 0) across the rollback"
else
    bad "losses differ:"; paste -d' ' "$TMP/final.txt" "$TMP/train.txt" | head -45
fi
# rollback_log LOG ROLLBACKS WHAT FAULTED...: ok/bad on log_invariants, showing
# the log's joins, losses and rollbacks
rollback_log() {
    cl_log=$1 cl_rb=$2 cl_what=$3
    shift 3
    check_log "the log: only $* lost, $cl_rb rollback(s) ($cl_what)" "$cl_log" "$cl_rb" "$@"
}
# one rollback: the only replica of stage 1 killed once, and no replica to
# spare until node3 comes
rollback_log "$TMP/router.log" 1 "the kill emptied stage 1 once" "$name"

# ---- a spare replica takes the empty stage (no new node) ----
rm -rf "$TMP/ck" "$TMP/swarm.txt"
# joins by count (4 and 6 on stage 0, 5 on stage 1), and no moves but the refill
start_ckpt_router "$TMP/router2.log" --listen "tcp://127.0.0.1:0" --min-nodes 3 --assign even --rebalance-every 0
endpoint=$(wait_endpoint "$TMP/router2.log")
start_node 4
start_node 5
start_node 6
kill_stage1 "$TMP/router2.log"
[ -n "$victim" ] && ok "SIGKILLed the only node of stage 1 (2 on stage 0) after step 12" || bad "no victim"
wait_exit "$router" 60 || { bad "router still running after 60 s"; tail -10 "$TMP/router2.log"; }
wait "$router"
rc=$?
if clean_run $rc "$TMP/router2.log" \
    && grep -q "moving peer .* from stage 0 (2 replicas) to stage 1, which lost every replica" "$TMP/router2.log"; then
    ok "$(grep -m1 "which lost every replica" "$TMP/router2.log" | cut -c15-110)"
else
    bad "no spare moved (router exit $rc)"; grep "swarm router" "$TMP/router2.log" | tail -15
fi
check_losses "$TMP/swarm.txt" "$TMP/train.txt" 40 "after a spare replica took the lost stage" 0
# one rollback: the kill emptied stage 1; the spare leaves stage 0 one
rollback_log "$TMP/router2.log" 1 "the kill emptied stage 1 once" "$name"

# ---- two stages empty at once: each takes a spare of stage 0 ----
rm -rf "$TMP/ck" "$TMP/swarm.txt"
# shellcheck disable=SC2086
"$SWARM" train $TINY --layers 3 --threads 1 --quiet --loss-log "$TMP/train3.txt" >/dev/null 2>&1
start_ckpt_router "$TMP/router3.log" --listen "tcp://127.0.0.1:0" --layers 3 --stages 3 --min-nodes 7 \
    --assign even --rebalance-every 0
endpoint=$(wait_endpoint "$TMP/router3.log")
for i in 7 8 9 10 11 12 13; do start_node $i; done  # stages 0 1 2 0 1 2 0 in join order
wait_grep "$TMP/router3.log" "^step 12/40 " 60
names=$(sed -n 's/^swarm router: peer [0-9]* (\(node[0-9]*\), .*) joins stage [12]$/\1/p' "$TMP/router3.log")
victims=$(for name in $names; do eval "echo \$pid_$name"; done)
# shellcheck disable=SC2086
[ "$(echo $victims | wc -w)" -eq 4 ] && kill -9 $victims && ok "SIGKILLed both nodes of stages 1 and 2 at once" \
    || bad "victims: '$victims'"
wait_exit "$router" 60 || { bad "router still running after 60 s"; tail -10 "$TMP/router3.log"; }
wait "$router"
rc=$?
moved=$(grep -c "from stage 0 ([23] replicas) to stage [12], which lost every replica" "$TMP/router3.log")
if clean_run $rc "$TMP/router3.log" && [ "$moved" -eq 2 ]; then
    ok "a spare of stage 0 moved to each empty stage; the run finished"
else
    bad "router exit $rc, $moved moves:"; grep "swarm router" "$TMP/router3.log" | tail -15
fi
check_losses "$TMP/swarm.txt" "$TMP/train3.txt" 40 "after two stages took spares" 0
# one rollback: the first stage found empty rolls the swarm back; it trains
# again only once every stage has a ready replica, so the other stage's
# losses come while it is still rolling back (its dead replicas hold the
# refill back until they are found dead)
# shellcheck disable=SC2086 # one name a word
rollback_log "$TMP/router3.log" 1 "the kills emptied stages 1 and 2 at once" $names

lib_done
