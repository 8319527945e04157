#!/bin/sh
# test_router_restart.sh BUILD - the router itself is SIGKILLed mid-run and
# started again with --resume on the same address: the nodes reconnect on
# their own, training continues from the last checkpoint, and every step's
# loss (the resumed run's, for steps it replayed) equals `swarm train`'s.
# Ends with "N passed, N failed".
BUILD=${1:-build}
SWARM="$BUILD/swarm"
. tests/lib.sh

# 100 steps: the third node, started at step 20, takes about a second to
# measure itself and join, and the resumed swarm runs ~20 steps a second
ITERS=100
tiny_reference $ITERS 1e-2 4
"$SWARM" keygen "$TMP/router" >/dev/null

start_ckpt_router "$TMP/router1.log" --listen "tcp://127.0.0.1:0" --min-nodes 2
endpoint=$(wait_endpoint "$TMP/router1.log")
for i in 1 2; do
    "$SWARM" keygen "$TMP/node$i" >/dev/null
    "$SWARM" node --join "$endpoint" --router-key "$TMP/router.pub" --key "$TMP/node$i" \
        --threads 1 --name "node$i" --slowdown 60 >"$TMP/node$i.log" 2>&1 &
    pids="$pids $!"
done
killed=0
for _ in $(seq 1 600); do
    if grep -q "^step 12/$ITERS " "$TMP/router1.log"; then
        kill -9 "$router" && killed=1
        break
    fi
    sleep 0.05
done
wait "$router" 2>/dev/null
if [ $killed = 1 ] && ! grep -q "^summary" "$TMP/router1.log"; then
    ok "router SIGKILLed after step 12 (last checkpoint: step 10)"
else
    bad "could not kill the router mid-run"; tail -5 "$TMP/router1.log"
fi

start_ckpt_router "$TMP/router2.log" --listen "$endpoint" --resume "$TMP/ck"
# a third node joins mid-run: it gets its stage's state from a live replica
for _ in $(seq 1 600); do
    grep -q "^step 20/$ITERS " "$TMP/router2.log" && break
    sleep 0.05
done
"$SWARM" keygen "$TMP/node3" >/dev/null
"$SWARM" node --join "$endpoint" --router-key "$TMP/router.pub" --key "$TMP/node3" \
    --threads 1 --name node3 --slowdown 60 >"$TMP/node3.log" 2>&1 &
pids="$pids $!"
wait_exit "$router" 60 || { bad "resumed router still running after 60 s"; tail -10 "$TMP/router2.log"; }
wait "$router"
rc=$?
if [ $rc -eq 0 ] && grep -q "resumed from $TMP/ck at step 10" "$TMP/router2.log" \
    && grep -q "checksum mismatches 0" "$TMP/router2.log"; then
    ok "resumed at step 10; the nodes came back on their own and finished the run"
else
    bad "resume: exit $rc"; tail -15 "$TMP/router2.log"; tail -5 "$TMP/node1.log"
fi
sums=$(sed -n "s/.*step $ITERS: updated, checksum \([0-9a-f]*\)\$/\1/p" "$TMP"/node[123].log | sort | uniq -c)
if grep -q "peer [0-9]* (node3) ready on stage" "$TMP/router2.log" && grep -q "step $ITERS: updated" "$TMP/node3.log" \
    && [ "$(echo "$sums" | wc -l)" -eq 2 ] && echo "$sums" | grep -q "^ *2 "; then
    ok "a node that joined at step 20 ends with its replica's checksum: $(echo $sums)"
else
    bad "the joining node"; echo "$sums"; tail -5 "$TMP/node3.log"; grep node3 "$TMP/router2.log"
fi
# the last line written for each step is the one that counts
if losses_match "$TMP/swarm.txt" "$TMP/train.txt" $ITERS; then
    ok "every step's loss equals swarm train's to 1e-4 relative across the restart"
else
    bad "losses differ:"; paste -d' ' "$TMP/final.txt" "$TMP/train.txt" | head -45
fi
# the logs: the router was killed, no node: neither router lost, banned or
# refused one, nor rolled back (the resume from step 10 is no rollback)
for l in router1 router2; do
    check_log "$l's log: no node lost, banned or refused; no rollback" "$TMP/$l.log" 0
done

lib_done
