#!/bin/sh
# bench-memory.sh [BUILD] - a model no node can hold, side by side with one
# process that holds it: a GPT-2-small-shaped model (L=12 H=12 C=768
# T=256, byte vocabulary: about 85M parameters, 1.4 GB of training state)
# trained STEPS steps by `swarm train` (one process, no cap, THREADS
# threads) and by a local swarm of NODES single-threaded nodes each capped
# at MEMORY (below 1 GB) with `swarm router --stages auto`. Prints each
# one's tokens/s, the plan the router chose, each node's memory (its
# budget, what the formula says its stage needs, what it counts, what its
# heap measurably grew by, its RSS and how much that grew since before it
# held a stage) and the one process's peak RSS. A
# benchmark: prints numbers, asserts nothing. About 5 minutes on 2 cores.
#   STEPS=3 NODES=4 MEMORY=700M THREADS=2 scripts/bench-memory.sh build
set -eu
BUILD=${1:-build}
SWARM="$BUILD/swarm"
STEPS=${STEPS:-3}
NODES=${NODES:-4}
MEMORY=${MEMORY:-700M}
THREADS=${THREADS:-2}
SHARED=${SWARM_SHARED:-../shared}
[ -x "$SWARM" ] || { echo "bench-memory.sh: $SWARM missing; run make" >&2; exit 1; }
OUT=$(mktemp -d /tmp/swarm-bench-memory.XXXXXX)
trap 'pkill -P $$ 2>/dev/null; rm -rf "$OUT"' EXIT
DATA="$SHARED/data/tinyshakespeare.txt"
[ -f "$DATA" ] || { head -c 400000 "$BUILD/corpus.txt" >"$OUT/data.txt"; DATA="$OUT/data.txt"; }
GPT2="--layers 12 --heads 12 --embd 768 --block 256 --batch 8 --micro-batch 2 --iters $STEPS --warmup 1 --lr 3e-4 --eval-every 0 --data $DATA"

echo "bench-memory: L=12 H=12 C=768 T=256, batch 8 in micro-batches of 2, $STEPS steps"
TIME=""
[ -x /usr/bin/time ] && TIME="/usr/bin/time -f %M -o $OUT/train.rss" # GNU time: the peak RSS
# shellcheck disable=SC2086
$TIME "$SWARM" train $GPT2 --threads "$THREADS" --loss-log "$OUT/train.txt" >"$OUT/train.log" 2>&1 \
    || { tail -3 "$OUT/train.log"; exit 1; }
train_tok=$(sed -n 's/^summary | .* tok\/s \([0-9]*\).*/\1/p' "$OUT/train.log" | tail -n 1)
rss="?"
[ -s "$OUT/train.rss" ] && rss=$(($(cat "$OUT/train.rss") / 1024))
echo "swarm train, one process, $THREADS threads: ${train_tok:-?} tok/s, peak RSS $rss MiB"

"$SWARM" keygen "$OUT/router" >/dev/null
T=256
. scripts/bench-lib.sh
# shellcheck disable=SC2086
SWARM_PLAIN=1 "$SWARM" router $GPT2 --stages auto --min-nodes "$NODES" --listen tcp://127.0.0.1:0 \
    --key "$OUT/router" --log-every 1 --loss-log "$OUT/swarm.txt" >"$OUT/router.log" 2>&1 &
router=$!
ep=$(endpoint_of "$OUT/router.log")
for n in $(seq 1 "$NODES"); do
    "$SWARM" keygen "$OUT/n$n" >/dev/null
    "$SWARM" node --join "$ep" --router-key "$OUT/router.pub" --key "$OUT/n$n" --threads 1 \
        --name "n$n" --memory "$MEMORY" >"$OUT/n$n.log" 2>&1 &
done
# what each node holds, sampled once the cache has filled (the second step)
for _ in $(seq 1 3000); do
    grep -q "^step 2/" "$OUT/router.log" 2>/dev/null && break
    kill -0 "$router" 2>/dev/null || break
    sleep 0.2
done
"$SWARM" status "$ep" --router-key "$OUT/router.pub" --json >"$OUT/status.json" 2>/dev/null || true
wait "$router" || true
sed -n 's/^swarm router: \(--stages auto: [0-9]* stage.*\)/\1/p; s/^swarm router: \(a node holds for its stage.*\) (its state.*/\1/p' "$OUT/router.log"
swarm_tok=$(sed -n 's/^summary | .* tok\/s \([0-9]*\) .*/\1/p' "$OUT/router.log")
echo "the swarm, $NODES nodes of $MEMORY, one thread each: ${swarm_tok:-?} tok/s"
jq -r '.stages as $st | .peers[] | "  \(.name): stage \(.stage), budget \(.memory / 1048576 | floor) MiB, the formula \($st[.stage].memory_need / 1048576 | floor) MiB (one cached micro-batch), counts \((.memory_used // 0) / 1048576 | floor) MiB, heap grew \((.memory_heap // 0) / 1048576 | floor) MiB, RSS \((.rss // 0) / 1048576 | floor) MiB (grew \((.rss_grown // 0) / 1048576 | floor) MiB since before its stage)"' \
    "$OUT/status.json" 2>/dev/null || echo "  (no status sampled)"
paste "$OUT/swarm.txt" "$OUT/train.txt" 2>/dev/null | awk '{ printf "  step %s: swarm %s, swarm train %s\n", $1, $2, $5 }' | tail -n "$STEPS"
