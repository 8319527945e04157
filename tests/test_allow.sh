#!/bin/sh
# test_allow.sh BUILD - a private swarm's allow-list, edited while it trains
# (SIGHUP): a node whose key is not on the list is refused; once its key is
# added and the router gets SIGHUP, its next attempt is admitted and it
# serves a stage; `swarm status` with the router's own key pair reads the
# table, a key on no list does not; an unreadable list on SIGHUP keeps the one in use; a key
# removed + SIGHUP gets that node dropped (it exits, saying why) while the
# others train on. The schedule is longer than the test: the router is
# stopped 20 steps after the removal, and every step's loss must equal
# `swarm train`'s over as many steps of the same schedule.
# Ends with "N passed, N failed".
BUILD=${1:-build}
SWARM="$BUILD/swarm"
. tests/lib.sh

STEPS=100000
head -c 30000 "$BUILD/corpus.txt" >"$TMP/data.txt"
TINY="--layers 2 --heads 4 --embd 32 --block 16 --batch 4 --micro-batch 2 --iters $STEPS --warmup 2 --lr 3e-3 --eval-every 0 --data $TMP/data.txt"

for k in router node1 node2 node3; do "$SWARM" keygen "$TMP/$k" >/dev/null; done
pub() { grep -v '^#' "$TMP/$1.pub" | head -1; }
{ echo "# the swarm's nodes"; pub node1; pub node2; } >"$TMP/allow.txt"

# shellcheck disable=SC2086
SWARM_PLAIN=1 "$SWARM" router $TINY --stages 2 --min-nodes 2 --listen "tcp://127.0.0.1:0" \
    --key "$TMP/router" --allow "$TMP/allow.txt" --loss-log "$TMP/swarm.txt" --log-every 1 \
    >"$TMP/router.log" 2>&1 &
router=$!
pids="$router"
if ! endpoint=$(wait_endpoint "$TMP/router.log"); then
    bad "router did not start:"; cat "$TMP/router.log"
    lib_done; exit 1
fi
# (a private swarm trusts its listed keys: no audits, and no line about them)
if grep -q "private swarm" "$TMP/router.log" && ! grep -q "any key may join" "$TMP/router.log"; then
    ok "router listening on $endpoint, private swarm, no audits said"
else
    bad "the private router's start-up:"; head -8 "$TMP/router.log"
fi

# node N [flags]: start node N, its pid in pid_nodeN
node() {
    n=$1
    shift
    "$SWARM" node --join "$endpoint" --router-key "$TMP/router.pub" --key "$TMP/node$n" \
        --threads 1 --name "node$n" "$@" >"$TMP/node$n.log" 2>&1 &
    eval "pid_node$n=$!"
    pids="$pids $!"
}

# the stranger first: refused (no ASSIGN), it keeps trying
node 3 --slowdown 20
if wait_grep "$TMP/node3.log" "connecting again" 15 && ! grep -q "node3" "$TMP/router.log"; then
    ok "a node whose key is not on the list is refused: $(grep -m1 "connecting again" "$TMP/node3.log")"
else
    bad "node3 not refused:"; cat "$TMP/node3.log"; grep node3 "$TMP/router.log"
fi
node 1 --slowdown 20
node 2 --slowdown 20
if wait_grep "$TMP/router.log" "^step 3/$STEPS " 60; then
    ok "node1 and node2 train"
else
    bad "no training:"; tail -20 "$TMP/router.log"
fi

# the operator asks on the router's machine: swarm status finds the router's
# own key pair beside its .pub and the router admits it, though it is on no
# list; a key that is on none and not the router's gets no answer
if "$SWARM" status "$endpoint" --router-key "$TMP/router.pub" --json >"$TMP/status.json" 2>&1 \
    && [ "$(jq '[.peers[] | select(.name == "node1" or .name == "node2")] | length' "$TMP/status.json")" = 2 ] \
    && ! "$SWARM" status "$endpoint" --router-key "$TMP/router.pub" --key "$TMP/node3" \
        >"$TMP/status3.out" 2>&1; then
    ok "the router's own key pair reads the private swarm's table; node3's is not answered: $(head -1 "$TMP/status3.out")"
else
    bad "status of the private swarm:"; head -5 "$TMP/status.json"; cat "$TMP/status3.out"
fi

# a list the router cannot read: the one in use stays
cp "$TMP/allow.txt" "$TMP/allow.good"
echo "not a key" >>"$TMP/allow.txt"
kill -HUP "$router"
if wait_grep "$TMP/router.log" "keeping the allow-list in use (2 keys)" 10; then
    ok "a bad list on SIGHUP is refused: $(grep -m1 "SIGHUP:" "$TMP/router.log")"
else
    bad "bad list on SIGHUP"; tail -5 "$TMP/router.log"
fi

# the stranger's key added: admitted at its next attempt, serves a stage
{ cat "$TMP/allow.good"; pub node3; } >"$TMP/allow.txt"
kill -HUP "$router"
if wait_grep "$TMP/router.log" "reloaded: 3 keys" 10 \
    && wait_grep "$TMP/router.log" "(node3) ready on stage" 40; then
    ok "node3 admitted after its key was added + SIGHUP: $(grep "(node3, .*joins stage" "$TMP/router.log")"
else
    bad "node3 not admitted:"; tail -20 "$TMP/router.log"; tail -5 "$TMP/node3.log"
fi

# the original node of node3's stage removed: dropped, the others go on
stage=$(sed -n 's/^swarm router: peer [0-9]* (node3, .*) joins stage \([0-9]*\)$/\1/p' "$TMP/router.log" | head -1)
victim=$(sed -n "s/^swarm router: peer [0-9]* (\(node[12]\), .*) joins stage $stage\$/\1/p" "$TMP/router.log" | head -1)
grep -vF -e "$(pub "$victim")" "$TMP/allow.good" >"$TMP/allow.txt"
pub node3 >>"$TMP/allow.txt"
kill -HUP "$router"
eval "vpid=\$pid_$victim"
if wait_grep "$TMP/router.log" "($victim) was removed from the allow-list: dropped" 10 \
    && wait_exit "$vpid" 10 && grep -q "removed from the swarm's allow-list" "$TMP/$victim.log"; then
    ok "$victim (stage $stage) removed + SIGHUP: dropped, and it left: $(grep -m1 "refused us" "$TMP/$victim.log")"
else
    bad "$victim not dropped:"; tail -10 "$TMP/router.log"; tail -5 "$TMP/$victim.log"
fi

# the others train on: 20 more steps, then the router is stopped
after=$(awk '{ print $1 }' "$TMP/swarm.txt" | sort -n | tail -1)
if wait_grep "$TMP/router.log" "^step $((after + 20))/$STEPS " 60; then
    ok "training goes on without $victim: step $((after + 20)) reached"
else
    bad "no training after the removal:"; tail -20 "$TMP/router.log"
fi
kill -INT "$router"
wait_exit "$router" 30 || bad "router did not stop on SIGINT"
wait "$router"
rc=$?
if [ $rc -eq 1 ] && grep -q "^swarm router: stopped" "$TMP/router.log" \
    && grep -q "checksum mismatches 0" "$TMP/router.log"; then
    ok "router stopped on SIGINT; replicas agreed after every step"
else
    bad "router exit $rc:"; tail -20 "$TMP/router.log"
fi
steps=$(awk '{ print $1 }' "$TMP/swarm.txt" | sort -un | wc -l)
# shellcheck disable=SC2086
"$SWARM" train $TINY --threads 1 --quiet --steps "$steps" --loss-log "$TMP/train.txt" \
    >/dev/null 2>&1 || bad "swarm train reference run"
if losses_match "$TMP/swarm.txt" "$TMP/train.txt" "$steps"; then
    ok "all $steps steps' losses equal swarm train's to 1e-4 relative"
else
    bad "losses differ:"; paste -d' ' "$TMP/swarm.txt" "$TMP/train.txt" | head -20
fi
# the log: only the node whose key was removed was dropped (the stranger's
# refusals come before it is a peer: no line), and no rollback: node3 was
# ready on the dropped node's stage before the removal (else the log's
# joins and losses tell)
ready3=$(grep -n -m1 "^swarm router: peer [0-9]* (node3) ready on stage $stage," "$TMP/router.log" | cut -d: -f1)
drop=$(grep -n -m1 "($victim) was removed from the allow-list: dropped" "$TMP/router.log" | cut -d: -f1)
if [ -n "$ready3" ] && [ -n "$drop" ] && [ "$ready3" -lt "$drop" ] \
    && ! grep -q "^swarm router: step [0-9]*: moving peer" "$TMP/router.log"; then
    rb=0 why="node3 ready on stage $stage before $victim was dropped"
else
    rb=$(log_emptied "$TMP/router.log") why="by the log's joins and losses, $rb stages emptied"
fi
check_log "the log: only $victim was lost; $rb rollbacks ($why)" "$TMP/router.log" "$rb" "$victim"
lib_done
