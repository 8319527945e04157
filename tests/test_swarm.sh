#!/bin/sh
# test_swarm.sh BUILD - a real swarm on loopback: a router and 4 node
# processes (2 stages x 2 replicas) train a tiny model for 20 steps; every
# step's loss must equal `swarm train`'s with the same flags to 1e-4
# relative, and the replicas' checksums must agree after every step (the
# router counts mismatches and fails on any); its --trace accounts for every
# step and request (scripts/trace-steps.sh). Then the refusals: a node of
# another protocol version and a status client with a wrong key. Last, a
# router without --micro-batch: it says what it chose, and its losses are
# swarm train's with that micro-batch.
# Ends with "N passed, N failed".
BUILD=${1:-build}
SWARM="$BUILD/swarm"
. tests/lib.sh

head -c 30000 "$BUILD/corpus.txt" >"$TMP/data.txt"
TINY="--layers 2 --heads 4 --embd 32 --block 16 --batch 4 --micro-batch 2 --iters 20 --warmup 2 --lr 1e-2 --eval-every 0 --data $TMP/data.txt"

# the single-process reference
# shellcheck disable=SC2086
"$SWARM" train $TINY --threads 1 --quiet --loss-log "$TMP/train.txt" >/dev/null 2>&1 \
    || bad "swarm train reference run"

"$SWARM" keygen "$TMP/router" >/dev/null
# shellcheck disable=SC2086
"$SWARM" router $TINY --stages 2 --min-nodes 4 --listen "tcp://127.0.0.1:0" --key "$TMP/router" \
    --loss-log "$TMP/swarm.txt" --log-every 5 --trace "$TMP/trace.txt" >"$TMP/router.log" 2>&1 &
router=$!
pids="$router"
if ! endpoint=$(wait_endpoint "$TMP/router.log"); then
    bad "router did not start:"; cat "$TMP/router.log"
    lib_done; exit 1
fi
ok "router listening on $endpoint"

# before the nodes come (the run is over in seconds): a status client with the wrong router key gets
# no answer and says why
"$SWARM" keygen "$TMP/stranger" >/dev/null
if ! "$SWARM" status "$endpoint" --router-key "$TMP/stranger.pub" >"$TMP/status.out" 2>&1 \
    && grep -q "router-key" "$TMP/status.out"; then
    ok "status with a wrong router key is refused: $(head -1 "$TMP/status.out")"
else
    bad "status with a wrong router key"; cat "$TMP/status.out"
fi
if "$SWARM" status "$endpoint" --router-key "$TMP/router.pub" --json >"$TMP/status.json" 2>&1 \
    && grep -q '"state": "waiting"' "$TMP/status.json"; then
    ok "status --json answers: the router is waiting for its nodes"
else
    bad "status --json"; cat "$TMP/status.json"
fi
# each stage's cost: one block each, and stage 1 also the head and its loss
flops=$(grep -o '"flops_per_token": [0-9]*' "$TMP/status.json" | awk '{ printf "%s ", $2 }')
if echo "$flops" | awk 'NF == 2 && $1 > 0 && $2 > $1 { ok = 1 } END { exit !ok }'; then
    ok "status --json: each stage's flops_per_token, the last (with the head) dearer: $flops"
else
    bad "status --json flops_per_token: '$flops'"; cat "$TMP/status.json"
fi

# a node of an older protocol is refused with the reason; garbage frames
# from an authenticated peer are dropped with one log line each
ROGUE="$BUILD/rogue"
rpub=$(grep -v '^#' "$TMP/router.pub" | head -1 | tr -d '[:space:]')
if "$ROGUE" oldproto "$endpoint" "$rpub" >"$TMP/rogue.out" 2>&1 \
    && grep -q "refused: protocol version 0, router speaks 1" "$TMP/rogue.out"; then
    ok "a node of protocol 0 is refused: $(cat "$TMP/rogue.out")"
else
    bad "old protocol"; cat "$TMP/rogue.out"
fi
"$ROGUE" garbage "$endpoint" "$rpub" >/dev/null 2>&1
if [ "$(grep -c "bad message from" "$TMP/router.log")" -ge 3 ]; then
    ok "garbage frames refused, one line each: $(grep -m1 "bad message from" "$TMP/router.log")"
else
    bad "garbage frames"; cat "$TMP/router.log"
fi

for i in 1 2 3 4; do
    "$SWARM" keygen "$TMP/node$i" >/dev/null
    "$SWARM" node --join "$endpoint" --router-key "$TMP/router.pub" --key "$TMP/node$i" \
        --threads 1 --name "node$i" >"$TMP/node$i.log" 2>&1 &
    pids="$pids $!"
done

if ! wait_exit "$router" 120; then
    bad "router still running after 120 s"; tail -20 "$TMP/router.log"
    for i in 1 2 3 4; do tail -5 "$TMP/node$i.log"; done
fi
wait "$router"
rc=$?
if clean_run $rc "$TMP/router.log"; then
    ok "router finished 20 steps, replicas' checksums agreed after every step"
else
    bad "router exit $rc:"; tail -20 "$TMP/router.log"
fi
if [ "$(grep -c "joins stage" "$TMP/router.log")" -eq 4 ] \
    && grep -q "joins stage 0" "$TMP/router.log" && grep -q "joins stage 1" "$TMP/router.log"; then
    ok "4 nodes joined, both stages served"
else
    bad "joins"; grep "joins" "$TMP/router.log"
fi
# batch 4 in micro-batches of 2 over 2 stages: (2 - 1) / (2 + 2 - 1) of a
# step; 9 micro-batches of 2 would make it 1 / 10
if grep -q -e "2 micro-batches a step over 2 stages: .* idle about 33% of every step; a larger --batch (18 windows keep it to 10%)" \
    "$TMP/router.log"; then
    ok "the router says how much of a step the pipeline's fill and drain take"
else
    bad "no fill-and-drain hint for 2 micro-batches over 2 stages"; grep "micro-batch" "$TMP/router.log"
fi
if losses_match "$TMP/swarm.txt" "$TMP/train.txt" 20; then
    ok "every step's loss equals swarm train's to 1e-4 relative"
else
    bad "losses differ:"; paste -d' ' "$TMP/swarm.txt" "$TMP/train.txt" | head -20
fi
# quiet_log LOG WHAT: nothing was faulted (the rogue and the garbage never
# join): no node lost, banned or refused, and no rollback
quiet_log() {
    if [ ! -s "$1" ]; then
        bad "$2: no router log ('$1')"
    else
        check_log "$2, the log: no node lost, banned or refused; no rollback" "$1" 0
    fi
}
quiet_log "$TMP/router.log" "4 nodes x 2 stages"
# --trace: a line per step and per request; every FWD/BWD sent is done;
# trace-steps.sh accounts for each peer the trace has working in steps
# 5..19 (which replicas get work depends on their measured speeds) and
# each stage
steps=$(awk '$2 == "step"' "$TMP/trace.txt" | wc -l)
working=$(awk '$2 == "send" && $3 >= 5 && ($4 == "FWD" || $4 == "BWD") { print $NF }' "$TMP/trace.txt" \
          | sort -u | wc -l)
sent=$(awk '$2 == "send" && ($4 == "FWD" || $4 == "BWD")' "$TMP/trace.txt" | wc -l)
done_=$(awk '$2 == "done" && ($4 == "FWD" || $4 == "BWD")' "$TMP/trace.txt" | wc -l)
sh scripts/trace-steps.sh "$TMP/trace.txt" 5 >"$TMP/steps.out" 2>&1
peers=$(awk '/^ +peer/ { on = 1; next } /^ +stage/ { on = 0 } on && $3 > 0 && $3 <= 1 && $4 > 0' "$TMP/steps.out" | wc -l)
stages=$(awk '/^ +stage +idle/ { on = 1; next } on' "$TMP/steps.out" | wc -l)
if [ "$steps" -eq 20 ] && [ "$sent" -ge 120 ] && [ "$sent" -eq "$done_" ] && [ "$working" -ge 2 ] \
    && [ "$peers" -eq "$working" ] && [ "$stages" -eq 2 ] && grep -q "^steps 5..19: " "$TMP/steps.out"; then
    ok "--trace: 20 steps, $sent FWD/BWD requests all answered; trace-steps.sh: the $peers peers at work busy, 2 stages"
else
    bad "--trace: $steps steps, $sent sent, $done_ done, $peers peers of $working at work, $stages stages:"
    cat "$TMP/steps.out"
fi

# one replica per stage (gradients stay on the nodes), through the local
# swarm script: the same losses again
# (KEEP=1: the router's whole log stays, in a folder under $TMP)
# shellcheck disable=SC2086
KEEP=1 TMPDIR="$TMP" timeout 120 sh scripts/local-swarm.sh --build "$BUILD" -n 2 -s 2 --steps 20 $TINY \
    --loss-log "$TMP/single.txt" >"$TMP/local.log" 2>&1
rc=$?
# one replica a stage: stage 0 applies its own update (its UPDATE sent right behind its STEP)
if clean_run $rc "$TMP/local.log" \
    && grep -q "stage 0's only replica applies its own update" "$TMP/local.log" \
    && losses_match "$TMP/single.txt" "$TMP/train.txt" 20; then
    ok "local-swarm.sh, 2 nodes x 2 stages (no gradient traffic, stage 0 updates itself): the same losses as swarm train"
else
    bad "local-swarm.sh exit $rc:"; tail -20 "$TMP/local.log"; paste -d' ' "$TMP/single.txt" "$TMP/train.txt" | head
fi
quiet_log "$(kept_dir "$TMP/local.log")/router.log" "local-swarm.sh, 2 nodes x 2 stages"

# no --micro-batch: the router chooses one and says so in its start-up line
# (batch 4 of 64-byte windows over 2 stages: 4 micro-batches of 1, the most
# of 64 tokens or more); the losses are swarm train's with that micro-batch
CHOICE="--layers 2 --heads 4 --embd 32 --block 64 --batch 4 --warmup 2 --lr 1e-2 --eval-every 0 --data $TMP/data.txt"
# shellcheck disable=SC2086
KEEP=1 TMPDIR="$TMP" timeout 120 sh scripts/local-swarm.sh --build "$BUILD" -n 2 -s 2 --steps 10 $CHOICE \
    --loss-log "$TMP/chosen.txt" >"$TMP/chosen.log" 2>&1
rc=$?
line=$(grep -m1 "^swarm router: .* batch 4 in micro-batches of [0-9]* (chosen: .*; --micro-batch sets it)$" \
    "$TMP/chosen.log")
micro=$(echo "$line" | sed -n 's/.* in micro-batches of \([0-9]*\) (chosen: .*/\1/p')
# shellcheck disable=SC2086
"$SWARM" train $CHOICE --iters 10 --micro-batch "${micro:-4}" --threads 1 --quiet \
    --loss-log "$TMP/train-chosen.txt" >/dev/null 2>&1 || bad "swarm train --micro-batch ${micro:-4} run"
# (an open swarm, local-swarm.sh's: the start-up says what its audits cost)
if clean_run $rc "$TMP/chosen.log" && [ "$micro" = 1 ] \
    && ! grep -q "filling and draining the pipeline leaves" "$TMP/chosen.log" \
    && echo "$line" | grep -q "take ~20% of a step, a larger --batch shrinks that: 9 windows keep it to 10%;" \
    && grep -q "^swarm router: any key may join an open swarm, so in 30% of the steps, drawn in secret, another replica recomputes each gradient sum .*--allow FILE (private: no audits)$" "$TMP/chosen.log" \
    && losses_match "$TMP/chosen.txt" "$TMP/train-chosen.txt" 10; then
    ok "no --micro-batch: the router says ${line#*of 1 }; losses equal swarm train --micro-batch 1's"
else
    bad "the router's own micro-batch (exit $rc): '$line'"; tail -20 "$TMP/chosen.log"
    paste -d' ' "$TMP/chosen.txt" "$TMP/train-chosen.txt" | head
fi
quiet_log "$(kept_dir "$TMP/chosen.log")/router.log" "no --micro-batch"

# no --stages either, on two nodes that each hold the model: one stage of
# two replicas, and the batch cut so that both work every step (4 windows
# in micro-batches of 2, not one of 4 that one replica computes while the
# other waits); the losses are swarm train --micro-batch 2's
# shellcheck disable=SC2086
SWARM_PLAIN=1 "$SWARM" router $CHOICE --iters 10 --listen "tcp://127.0.0.1:0" --key "$TMP/router" \
    --log-every 1 --loss-log "$TMP/auto.txt" >"$TMP/auto.log" 2>&1 &
router=$!
pids="$pids $router"
endpoint=$(wait_endpoint "$TMP/auto.log")
auto_nodes=""
for i in 1 2; do
    "$SWARM" keygen "$TMP/auto$i" >/dev/null
    "$SWARM" node --join "$endpoint" --router-key "$TMP/router.pub" --key "$TMP/auto$i" \
        --threads 1 --name "auto$i" >"$TMP/auto$i.log" 2>&1 &
    auto_nodes="$auto_nodes $!"
done
pids="$pids$auto_nodes"
wait_exit "$router" 60 || bad "no --stages: router still running after 60 s"
wait "$router"
rc=$?
# shellcheck disable=SC2086
kill -INT $auto_nodes 2>/dev/null # (each then says what it computed)
# shellcheck disable=SC2086
"$SWARM" train $CHOICE --iters 10 --micro-batch 2 --threads 1 --quiet \
    --loss-log "$TMP/train-auto.txt" >/dev/null 2>&1 || bad "swarm train --micro-batch 2 run"
plan=$(grep -- "--stages auto: " "$TMP/auto.log" | tail -n 1)
wait_grep "$TMP/auto1.log" "left the swarm" 20
wait_grep "$TMP/auto2.log" "left the swarm" 20
work1=$(sed -n 's/.*left the swarm (\([0-9]*\) micro-batches.*/\1/p' "$TMP/auto1.log")
work2=$(sed -n 's/.*left the swarm (\([0-9]*\) micro-batches.*/\1/p' "$TMP/auto2.log")
if clean_run $rc "$TMP/auto.log" \
    && [ "$plan" = "swarm router: --stages auto: 1 stage for the 2 nodes known (micro-batches of 2; two replicas a stage fit)" ] \
    && [ "${work1:-0}" -gt 0 ] && [ "${work2:-0}" -gt 0 ] \
    && losses_match "$TMP/auto.txt" "$TMP/train-auto.txt" 10; then
    ok "no --stages, no --micro-batch: ${plan#swarm router: }; the nodes computed $work1 and $work2 micro-batches; losses equal swarm train --micro-batch 2's"
else
    bad "no --stages (exit $rc): '$plan', work $work1 and $work2"; tail -5 "$TMP/auto.log"
fi
check_log "no --stages: no node lost, no rollback" "$TMP/auto.log" 0

# a crowd: 300 peers, each with a key of its own, connect at once and say
# HELLO while the router waits for its nodes (more than the 256 entries its
# peer table once had: crowd257 on were ignored), then leave without a
# word; two real nodes train after them. The table grows, reuses the
# entries of the dead once it holds 64, and the run is swarm train's, with
# no one but the crowd lost. The router's log holds most of the crowd's
# join lines back (40 at once, then 10 a second) and counts them
"$SWARM" keygen "$TMP/crowd-router" >/dev/null
# shellcheck disable=SC2086
SWARM_PLAIN=1 "$SWARM" router $TINY --stages 2 --min-nodes 2 --listen "tcp://127.0.0.1:0" \
    --key "$TMP/crowd-router" --loss-log "$TMP/crowd.txt" >"$TMP/crowd.log" 2>&1 &
crouter=$!
pids="$pids $crouter"
endpoint=$(wait_endpoint "$TMP/crowd.log")
cpub=$(grep -v '^#' "$TMP/crowd-router.pub" | head -1 | tr -d '[:space:]')
"$ROGUE" crowd 300 "$endpoint" "$cpub" >"$TMP/crowd.out" 2>&1
crowd_rc=$?
for i in 1 2; do
    "$SWARM" node --join "$endpoint" --router-key "$TMP/crowd-router.pub" --threads 1 \
        --key "$TMP/cnode$i" --name "cnode$i" >"$TMP/cnode$i.log" 2>&1 &
    pids="$pids $!"
done
wait_exit "$crouter" 120 || bad "crowd: router still running after 120 s"
wait "$crouter"
rc=$?
crowd_ids=$(grep -c "^swarm router: peer [0-9]* (crowd[0-9]*, " "$TMP/crowd.log")
held=$(sed -n 's/.* (\([0-9]*\) more lines of joins and deaths not shown)$/\1/p' "$TMP/crowd.log" \
    | awk '{ n += $1 } END { print n + 0 }')
# the nodes' own logs: their peer ids (after the crowd's) and the run's end
last_id=$(sed -n 's/.*assigned stage [0-9]* of [0-9]* (peer \([0-9]*\)).*/\1/p' "$TMP"/cnode[12].log \
    | sort -n | tail -1)
ends=$(cat "$TMP"/cnode[12].log | grep -c "step 20 of 20")
lost=$(sed 's/ ([0-9]* more lines of joins and deaths not shown)$//' "$TMP/crowd.log" \
    | grep -E "^swarm router: peer [0-9]+ \(cnode[12]\) " | grep -cE "$LIB_DEATH_RE")
if [ $crowd_rc -eq 0 ] && [ "$crowd_ids" -lt 300 ] && [ $((crowd_ids + held)) -ge 300 ] \
    && [ "${last_id:-0}" -gt 300 ] && [ "$ends" -eq 2 ] && [ "$lost" -eq 0 ] \
    && clean_run $rc "$TMP/crowd.log" && losses_match "$TMP/crowd.txt" "$TMP/train.txt" 20; then
    ok "a crowd of 300 peers came and went: $(cat "$TMP/crowd.out") ($crowd_ids lines shown, $held held back); then 2 nodes trained as swarm train"
else
    bad "crowd (exit $rc, $crowd_ids crowd lines, $held held, nodes' ids ${last_id:-none}, $ends ends, $lost lost): $(cat "$TMP/crowd.out")"
    grep -v "crowd[0-9]" "$TMP/crowd.log" | tail -10
fi

# rogue_node NAME KIND [ARGS] [-- NODE FLAGS]: a rogue router of KIND (its
# pid in rogue_pid, its output in $TMP/NAME.out) and a node joined to it
# (its pid in rogue_node, its log in $TMP/NAME-node.log)
"$SWARM" keygen "$TMP/esc-router" >/dev/null
rogue_node() {
    rn_name=$1 rn_kind=$2
    shift 2
    rn_args=
    while [ $# -gt 0 ] && [ "$1" != -- ]; do rn_args="$rn_args $1"; shift; done
    [ $# -gt 0 ] && shift
    # shellcheck disable=SC2086
    "$ROGUE" "$rn_kind" "$TMP/esc-router" $rn_args >"$TMP/$rn_name.out" 2>&1 &
    rogue_pid=$!
    pids="$pids $rogue_pid"
    wait_grep "$TMP/$rn_name.out" "listening on" 10
    rn_ep=$(sed -n 's/^rogue: listening on //p' "$TMP/$rn_name.out")
    "$SWARM" node --join "$rn_ep" --router-key "$TMP/esc-router.pub" --threads 1 \
        --key "$TMP/$rn_name-node" "$@" >"$TMP/$rn_name-node.log" 2>&1 &
    rogue_node=$!
    pids="$pids $rogue_node"
}

# a router whose refusal holds terminal escapes (it would clear the
# node's screen and retitle its terminal): the node says it was refused,
# in one line with no control byte, and exits 1
rogue_node esc escrouter
esc_node=$rogue_node
wait_exit "$esc_node" 30
wait "$esc_node"
rc=$?
refused=$(grep "refused us" "$TMP/esc-node.log")
if [ $rc -eq 1 ] && [ -n "$refused" ] && ! LC_ALL=C grep -q "$(printf '\033')" "$TMP/esc-node.log" \
    && ! LC_ALL=C grep -q "$(printf '\007')" "$TMP/esc-node.log"; then
    ok "a router's refusal with terminal escapes reaches the node's log as text: ${refused#*: }"
else
    bad "the node refused by a router with escapes (exit $rc):"; cat -v "$TMP/esc-node.log" | tail -5
fi

# a router whose answer is larger than the node may hold (a 32 MiB ERROR
# fatal=1 to a node of --memory 8M): the node's transport drops it unread,
# link and all, so the node never reads the fatal, and it goes on
rogue_node big bigrouter 32 -- --memory 8M
big_rogue=$rogue_pid big_node=$rogue_node
wait_grep "$TMP/big.out" "big answer" 20
sleep 2
if kill -0 "$big_node" 2>/dev/null && grep -q "big answer 32 MiB" "$TMP/big.out" \
    && ! grep -q "refused us" "$TMP/big-node.log"; then
    ok "a router's answer over the node's --memory is dropped unread: the node runs on ($(grep -c "big answer" "$TMP/big.out") sent)"
else
    bad "the node sent 32 MiB with --memory 8M:"; tail -5 "$TMP/big-node.log"; cat "$TMP/big.out"
fi
kill "$big_node" "$big_rogue" 2>/dev/null

# a router that tells a heartbeat interval that is none (20 ms, with a
# terminal escape), again and again: the node says once, as text, that it
# ignores it, and runs on
rogue_node beat beatrouter
beat_rogue=$rogue_pid beat_node=$rogue_node
wait_grep "$TMP/beat-node.log" "heartbeat interval" 20
sleep 3 # HELLOs every 2 s: answered again
told=$(grep -c "heartbeat interval" "$TMP/beat-node.log")
if kill -0 "$beat_node" 2>/dev/null && [ "$told" -eq 1 ] \
    && grep -q "ignoring the router's heartbeat interval beat_ms=20?\[2J (not 1000-60000 ms)" "$TMP/beat-node.log" \
    && ! LC_ALL=C grep -q "$(printf '\033')" "$TMP/beat-node.log"; then
    ok "a heartbeat interval that is none is ignored, said once: $(grep "heartbeat interval" "$TMP/beat-node.log" | sed 's/.*swarm node: //')"
else
    bad "the node told beat_ms=20 with an escape (said $told times):"; cat -v "$TMP/beat-node.log" | tail -5
fi
kill "$beat_node" "$beat_rogue" 2>/dev/null

lib_done
