#!/bin/sh
# test_memory.sh BUILD - nodes with memory budgets (swarm node --memory), as
# the router plans with them: a 2-stage model whose stage 0 needs about
# 36.6 MiB and stage 1 about 20.6 MiB (the router prints both). A node of
# 28 MiB joins first and is given stage 1, the only one it holds (by speed
# alone the first joiner gets stage 0); one of 96 MiB takes stage 0; one of
# 12 MiB holds neither: the router says so in one line, tells it, and it
# waits. Mid-run each node's stage holds no more than its budget, and what
# it counts (the one formula) is within 10% of the heap its allocations
# measurably added; every step's loss equals swarm train's. Then --stages
# auto for a model about 3x what any node may hold: two nodes cannot hold
# it in two stages (the router says what it would need), four hold it in
# four, each within its budget; the only node of a stage is killed and the
# router says what it waits for until another takes it; the losses are
# swarm train's. Then the only node that can hold a stage of a 2-stage cut
# dies: the router cuts the model into 3 for the nodes left, each within
# its budget, and the losses are swarm train's. Nodes of 80, 40, 40 and
# 40 MiB get 2 stages of two replicas, not one stage on the largest. Bad
# --memory values get one line each. Ends with "N passed, N failed".
BUILD=${1:-build}
SWARM="$BUILD/swarm"
. tests/lib.sh

head -c 60000 "$BUILD/corpus.txt" >"$TMP/data.txt"
MODEL="--layers 3 --heads 4 --embd 256 --block 64 --batch 8 --micro-batch 4 --iters 14 --warmup 2 --lr 1e-3 --eval-every 0 --data $TMP/data.txt"
# shellcheck disable=SC2086
"$SWARM" train $MODEL --threads 1 --quiet --loss-log "$TMP/train.txt" >/dev/null 2>&1 \
    || bad "swarm train failed"
"$SWARM" keygen "$TMP/router" >/dev/null

# shellcheck disable=SC2086
SWARM_PLAIN=1 "$SWARM" router $MODEL --stages 2 --listen "tcp://127.0.0.1:0" --key "$TMP/router" \
    --min-nodes 2 --log-every 1 --loss-log "$TMP/swarm.txt" >"$TMP/router.log" 2>&1 &
router=$!
pids="$pids $router"
endpoint=$(wait_endpoint "$TMP/router.log")
log="$TMP/router.log"
needs=$(grep "a node holds for its stage" "$log")
need0=$(echo "$needs" | sed -n 's/.* stage 0 \([0-9.]*\) MiB, 1 \([0-9.]*\) MiB .*/\1/p')
need1=$(echo "$needs" | sed -n 's/.* stage 0 \([0-9.]*\) MiB, 1 \([0-9.]*\) MiB .*/\2/p')
if awk -v a="$need0" -v b="$need1" 'BEGIN { exit !(a > 28 && b < 28 && b > 12) }'; then
    ok "the router says what each stage needs: ${needs#swarm router: }"
else
    bad "the stages' needs: '$needs'"
fi

# mid first: it must get stage 1 (the speed rule alone would give it stage 0)
start_node "$log" mid "$SWARM" --memory 28M
start_node "$log" big "$SWARM" --memory 96M
"$SWARM" keygen "$TMP/small" >/dev/null
"$SWARM" node --join "$endpoint" --router-key "$TMP/router.pub" --key "$TMP/small" --threads 1 \
    --name small --memory 12M >"$TMP/small.log" 2>&1 &
small=$!
pids="$pids $small"
if grep -q "(mid, .*) joins stage 1$" "$log" && grep -q "(big, .*) joins stage 0$" "$log"; then
    ok "mid (28 MiB) is given stage 1, the one it holds; big (96 MiB) stage 0"
else
    bad "the stages given:"; grep "joins stage" "$log"
fi
wait_grep "$log" "(small) holds no stage" 10
told=$(grep "(small) holds no stage" "$log")
if [ "$(grep -c "(small) holds no stage" "$log")" -eq 1 ] && ! grep -q "(small, .*) joins stage" "$log" \
    && wait_grep "$TMP/small.log" "the router says: no stage of this swarm fits your --memory 12.0 MiB" 10; then
    ok "small (12 MiB) holds neither: ${told#swarm router: }; it is told: $(sed -n 's/.*the router says: //p' "$TMP/small.log" | head -n 1)"
else
    bad "small: '$told'"; tail -3 "$TMP/small.log"
fi

# mid-run (its cache filled by a few steps): what each stage holds, within
# its budget and within 10% of its heap's growth
wait_grep "$log" "^step 8/" 60
for _ in $(seq 1 100); do
    "$SWARM" status "$endpoint" --router-key "$TMP/router.pub" --json >"$TMP/status.json" 2>/dev/null
    [ "$(jq '[.peers[] | select(.memory_heap != null)] | length' "$TMP/status.json" 2>/dev/null)" = 2 ] && break
    sleep 0.1
done
for n in mid big; do
    row=$(jq -r ".peers[] | select(.name == \"$n\") | \"\\(.memory) \\(.memory_used) \\(.memory_heap)\"" "$TMP/status.json")
    # shellcheck disable=SC2086
    set -- $row
    if [ $# -eq 3 ] && awk -v b="$1" -v u="$2" -v h="$3" 'BEGIN { d = h - u; if (d < 0) d = -d
            exit !(u > 0 && u <= b && d <= 0.1 * u) }'; then
        ok "$n's stage holds $(($2 / 1024)) KiB of its $(($1 / 1024)) KiB; its heap grew $(($3 / 1024)) KiB"
    else
        bad "$n's memory (budget, counted, heap): '$row'"
    fi
done

wait_exit "$router" 120 || bad "router still running after 120 s"
wait "$router"
rc=$?
if clean_run $rc "$log"; then ok "router finished 14 steps"; else bad "router exit $rc"; tail -5 "$log"; fi
check_losses "$TMP/swarm.txt" "$TMP/train.txt" 14 "(nodes of 28 and 96 MiB)"
if kill -0 "$small" 2>/dev/null; then ok "small waits (it is still there after the run)"; else bad "small left"; fi

# ---- --stages auto: a model about 3x what any node may hold ----
# L=4 C=256: its whole training state is about 70 MiB; nodes of 24 MiB. Two
# join first: no plan they can hold (the router says what it would need);
# once four have, 4 stages of about 20 MiB each, and the losses are swarm
# train's
MODEL2="--layers 4 --heads 4 --embd 256 --block 64 --batch 8 --micro-batch 4 --iters 18 --warmup 2 --lr 1e-3 --eval-every 0 --data $TMP/data.txt"
# shellcheck disable=SC2086
"$SWARM" train $MODEL2 --threads 1 --quiet --loss-log "$TMP/train2.txt" >/dev/null 2>&1 \
    || bad "swarm train (the larger model) failed"
# start_auto LOG FLAGS...: a router of MODEL2 with FLAGS, its lines in LOG;
# sets router and endpoint
start_auto() {
    sa_log=$1
    shift
    # shellcheck disable=SC2086
    SWARM_PLAIN=1 "$SWARM" router $MODEL2 --listen "tcp://127.0.0.1:0" --key "$TMP/router" \
        --log-every 1 "$@" >"$sa_log" 2>&1 &
    router=$!
    pids="$pids $router"
    endpoint=$(wait_endpoint "$sa_log")
}
# join_auto NAME [MEMORY]: a node of MEMORY (default 24M)
join_auto() {
    "$SWARM" keygen "$TMP/$1" >/dev/null
    "$SWARM" node --join "$endpoint" --router-key "$TMP/router.pub" --key "$TMP/$1" --threads 1 \
        --name "$1" --memory "${2:-24M}" --slowdown 4 >"$TMP/$1.log" 2>&1 &
    pids="$pids $!"
}
start_auto "$TMP/auto.log" --stages auto --min-nodes 2 --loss-log "$TMP/swarm2.txt"
join_auto a1
join_auto a2
if wait_grep "$TMP/auto.log" "cannot hold the model: in 2 stages it needs [0-9.]* and [0-9.]* MiB a stage; in 4 (the most it has) " 20; then
    ok "two nodes of 24 MiB: $(sed -n 's/^swarm router: \(the 2 nodes known.*\)/\1/p' "$TMP/auto.log")"
else
    bad "two nodes of 24 MiB: no line saying what the swarm needs"; tail -3 "$TMP/auto.log"
fi
join_auto a3
join_auto a4
if wait_grep "$TMP/auto.log" "^swarm router: --stages auto: 4 stages for the 4 nodes known" 20; then
    ok "$(grep -- '--stages auto: 4 stages' "$TMP/auto.log" | sed 's/^swarm router: //'); $(grep 'a node holds for its stage' "$TMP/auto.log" | sed 's/^swarm router: //; s/ (its state.*//')"
else
    bad "--stages auto chose no plan for four nodes of 24 MiB:"; tail -5 "$TMP/auto.log"
fi
wait_grep "$TMP/auto.log" "^step 5/" 60
"$SWARM" status "$endpoint" --router-key "$TMP/router.pub" --json >"$TMP/status2.json" 2>/dev/null
# what each counts for its stage and cache, and what its heap and resident
# set grew by over its own idle start, each within its budget
over=$(jq '[.peers[] | select(.memory_used == null or .memory_used > .memory
    or .memory_heap == null or .memory_heap > .memory or .rss_grown == null or .rss_grown > .memory)]
    | length' "$TMP/status2.json")
held=$(jq -r '[.peers[] | "\(.name) \((.memory_used // 0) / 1048576 | floor) MiB (heap +\((.memory_heap // 0) / 1048576 | floor), resident +\((.rss_grown // 0) / 1048576 | floor))"] | join(", ")' "$TMP/status2.json")
if [ "$over" = 0 ] && [ "$(jq '.peers | length' "$TMP/status2.json")" = 4 ]; then
    ok "each of the 4 nodes holds its stage within its 24 MiB: $held"
else
    bad "the 4 nodes' memory ($over over or unknown): $held"
fi
# the only node of a4's stage dies (the HELLOs kept go to the engine in
# the order they came: which stage is a4's is the log's to say): no other
# node can spare a replica that holds it, so the swarm rolls back and says
# what it waits for; a new node of 24 MiB takes the stage and the run
# ends with swarm train's losses
a4_stage=$(sed -n 's/^swarm router: peer [0-9]* (a4, .*) joins stage \([0-9]*\)$/\1/p' "$TMP/auto.log" | head -n 1)
pkill -9 -f -- "--name a4 "
if wait_grep "$TMP/auto.log" "stage $a4_stage: no other stage has a replica to spare that can hold it; waiting for a node to serve it (one with --memory of" 20; then
    ok "a4 killed: $(grep "stage $a4_stage: no other stage" "$TMP/auto.log" | head -n 1 | sed 's/^swarm router: //')"
else
    bad "a4 killed: no line saying what the swarm waits for"; tail -5 "$TMP/auto.log"
fi
join_auto a5
wait_exit "$router" 120 || bad "--stages auto: router still running after 120 s"
wait "$router"
rc=$?
if [ -n "$a4_stage" ] && clean_run $rc "$TMP/auto.log" && grep -q "(a5, .*) joins stage $a4_stage$" "$TMP/auto.log"; then
    ok "--stages auto: a5 took a4's stage $a4_stage and the router finished 18 steps"
else
    bad "--stages auto: exit $rc"; tail -5 "$TMP/auto.log"
fi
check_losses "$TMP/swarm2.txt" "$TMP/train2.txt" 18 "(--stages auto, 4 nodes of 24 MiB, one replaced)"

# ---- --stages auto cuts the model again ----
# the same model on two nodes of 40 MiB: 2 stages of about 37 MiB. Two of
# 24 MiB hold neither and wait. The first big node dies, and with it the
# only node that can hold its stage: the router cuts the model into 3
# stages (about 35, 21 and 20 MiB) for the big node and the two small
# ones, each takes one within its budget, and the run replays from the
# checkpoint (the start: no --save) to swarm train's losses
start_auto "$TMP/recut.log" --stages auto --min-nodes 2 --loss-log "$TMP/swarm3.txt"
join_auto b1 40M
join_auto b2 40M
if wait_grep "$TMP/recut.log" "^swarm router: --stages auto: 2 stages for the 2 nodes known" 20; then
    ok "$(grep -- '--stages auto: 2 stages' "$TMP/recut.log" | sed 's/^swarm router: //')"
else
    bad "--stages auto chose no plan for two nodes of 40 MiB:"; tail -5 "$TMP/recut.log"
fi
join_auto c1
join_auto c2
wait_grep "$TMP/c1.log" "the router says: no stage of this swarm fits your --memory 24.0 MiB" 20 \
    && wait_grep "$TMP/c2.log" "the router says: no stage of this swarm fits your --memory 24.0 MiB" 20 \
    || bad "the nodes of 24 MiB were not told they hold no stage of 2"
wait_grep "$TMP/recut.log" "^step 5/" 60
b1_stage=$(sed -n 's/^swarm router: peer [0-9]* (b1, .*) joins stage \([0-9]*\)$/\1/p' "$TMP/recut.log" | head -n 1)
pkill -9 -f -- "--name b1 "
if wait_grep "$TMP/recut.log" "stage $b1_stage of 2 has no node that can hold it (.* MiB): the model is cut again, into 3 stages for the 3 nodes known (one replica a stage), from step 0$" 40; then
    ok "b1 killed: $(grep "has no node that can hold it" "$TMP/recut.log" | head -n 1 | sed 's/^swarm router: //')"
else
    bad "b1 killed: the model was not cut again"; tail -8 "$TMP/recut.log"
fi
wait_grep "$TMP/recut.log" "^step 12/" 90
"$SWARM" status "$endpoint" --router-key "$TMP/router.pub" --json >"$TMP/status3.json" 2>/dev/null
over=$(jq '[.peers[] | select(.state == "ready") | select(.memory_used == null or .memory_used > .memory)] | length' "$TMP/status3.json")
held=$(jq -r '[.peers[] | select(.state == "ready") | "\(.name) stage \(.stage) \((.memory_used // 0) / 1048576 | floor) of \(.memory / 1048576 | floor) MiB"] | join(", ")' "$TMP/status3.json")
if [ "$over" = 0 ] && [ "$(jq '[.peers[] | select(.state == "ready")] | length' "$TMP/status3.json")" = 3 ] \
    && [ "$(jq '.stages | length' "$TMP/status3.json")" = 3 ]; then
    ok "3 stages, each node within its budget: $held"
else
    bad "after the new cut ($over over or unknown): $held"; jq -c '.stages' "$TMP/status3.json"
fi
wait_exit "$router" 120 || bad "the new cut: router still running after 120 s"
wait "$router"
rc=$?
if clean_run $rc "$TMP/recut.log"; then
    ok "the new cut: the router finished 18 steps"
else
    bad "the new cut: exit $rc"; tail -5 "$TMP/recut.log"
fi
check_log "the new cut: no node but b1 lost, one rollback" "$TMP/recut.log" 1 b1
check_losses "$TMP/swarm3.txt" "$TMP/train2.txt" 18 "(--stages auto, cut again from 2 stages into 3)"

# ---- --stages auto cuts within unequal budgets ----
# nodes of 56 and 24 MiB: the model cut by compute into 2 stages (about 37
# MiB each) fits neither the small node nor, in 3, two nodes; cut within
# their memory, 3 blocks (about 50 MiB) go to the large node and 1 (about
# 20 MiB) to the small one: each node gets a stage in proportion to what
# it holds, within it, and the losses are swarm train's
start_auto "$TMP/uneven.log" --min-nodes 2 --loss-log "$TMP/swarm5.txt"
join_auto e1 56M
join_auto e2 24M
if wait_grep "$TMP/uneven.log" "^swarm router: --stages auto: 2 stages for the 2 nodes known" 20 \
    && wait_grep "$TMP/uneven.log" "^swarm router: the model is cut within the nodes' memory, not by compute alone: stage 0 blocks 0-2, stage 1 block 3 (by compute: 2, 2 blocks a stage)$" 5; then
    ok "nodes of 56 and 24 MiB, no --stages: $(grep -- '--stages auto: 2 stages' "$TMP/uneven.log" | sed 's/^swarm router: //'); $(grep "the model is cut within" "$TMP/uneven.log" | sed 's/^swarm router: //')"
else
    bad "nodes of 56 and 24 MiB: not 2 stages cut within their memory"; grep "swarm router: " "$TMP/uneven.log" | tail -4
fi
wait_grep "$TMP/uneven.log" "^step 5/" 60
"$SWARM" status "$endpoint" --router-key "$TMP/router.pub" --json >"$TMP/status5.json" 2>/dev/null
over=$(jq '[.peers[] | select(.memory_used == null or .memory_used > .memory
    or .memory_heap == null or .memory_heap > .memory)] | length' "$TMP/status5.json")
held=$(jq -r '[.peers[] | "\(.name) stage \(.stage) \((.memory_used // 0) / 1048576 | floor) of \(.memory / 1048576 | floor) MiB"] | join(", ")' "$TMP/status5.json")
e1_at=$(jq '[.peers[] | select(.name == "e1") | .stage][0]' "$TMP/status5.json")
if [ "$over" = 0 ] && [ "$e1_at" = 0 ] && [ "$(jq '.peers | length' "$TMP/status5.json")" = 2 ]; then
    ok "each node within its budget, the large one on the large stage: $held"
else
    bad "nodes of 56 and 24 MiB ($over over or unknown): $held"
fi
wait_exit "$router" 120 || bad "uneven budgets: router still running after 120 s"
wait "$router"
rc=$?
if clean_run $rc "$TMP/uneven.log"; then ok "uneven budgets: the router finished 18 steps"; else bad "uneven budgets: exit $rc"; tail -5 "$TMP/uneven.log"; fi
check_losses "$TMP/swarm5.txt" "$TMP/train2.txt" 18 "(2 stages cut within budgets of 56 and 24 MiB)"

# ---- --stages auto buys a spare replica before fewer stages ----
# one node of 80 MiB holds the whole model (70.7 MiB), but with three of
# 40 MiB the router cuts 2 stages of two replicas each: one stage on one
# node would roll back at its first death, and leave three nodes idle
start_auto "$TMP/spare.log" --stages auto --min-nodes 4
join_auto d1 80M
join_auto d2 40M
join_auto d3 40M
join_auto d4 40M
if wait_grep "$TMP/spare.log" "^swarm router: --stages auto: 2 stages for the 4 nodes known (micro-batches of 4; two replicas a stage fit)$" 20 \
    && wait_grep "$TMP/spare.log" "^step 3/" 60; then
    "$SWARM" status "$endpoint" --router-key "$TMP/router.pub" --json >"$TMP/status4.json" 2>/dev/null
    per=$(jq -r '[.peers[] | select(.state == "ready") | .stage] | group_by(.) | map(length) | map(tostring) | join(",")' "$TMP/status4.json")
    if [ "$per" = "2,2" ]; then
        ok "nodes of 80, 40, 40, 40 MiB: $(grep -- '--stages auto: 2 stages' "$TMP/spare.log" | sed 's/^swarm router: //'), ready replicas by stage: $per"
    else
        bad "nodes of 80, 40, 40, 40 MiB: ready replicas by stage: $per"
    fi
else
    bad "nodes of 80, 40, 40, 40 MiB: not 2 stages of two replicas"; grep -- "--stages auto" "$TMP/spare.log"; tail -3 "$TMP/spare.log"
fi
kill "$router" 2>/dev/null
wait "$router" 2>/dev/null

# bad --memory values: one line each, naming the value
for v in 12x 100K -5G; do
    if "$SWARM" node --join "$endpoint" --router-key "$TMP/router.pub" --memory "$v" >"$TMP/bad.out" 2>&1; then
        bad "--memory $v was taken"
    elif [ "$(wc -l <"$TMP/bad.out")" -eq 1 ] && grep -q -- "--memory $v: expected a size" "$TMP/bad.out"; then
        ok "--memory $v: $(cat "$TMP/bad.out")"
    else
        bad "--memory $v:"; cat "$TMP/bad.out"
    fi
done

lib_done
