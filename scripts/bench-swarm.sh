#!/bin/sh
# bench-swarm.sh [BUILD] - local swarms of 1, 2 and 4 stages (one node of one
# thread per stage) against `swarm train` with the same total threads, run
# side by side on the baby configuration; the router's CPU time, memory and
# bytes on the wire per step. A benchmark: prints ratios, asserts nothing.
#   ITERS=60 MICRO=2 scripts/bench-swarm.sh build
set -eu
BUILD=${1:-build}
SWARM="$BUILD/swarm"
ITERS=${ITERS:-60}
MICRO=${MICRO:-2}
SHARED=${SWARM_SHARED:-../shared}
TMP=$(mktemp -d /tmp/swarm-bench.XXXXXX)
trap 'rm -rf "$TMP"' EXIT INT TERM
BABY="--layers 4 --heads 4 --embd 128 --block 64 --batch 12 --lr 1e-3 --eval-every 0 --micro-batch $MICRO"
if [ -f "$SHARED/data/tinyshakespeare.txt" ]; then
    BABY="$BABY --data $SHARED/data/tinyshakespeare.txt --init $SHARED/data/ref/baby_init.bgpt"
fi
tok_s() { sed -n 's/^summary | .*| tok\/s \([0-9.]*\) .*/\1/p' "$1" | tail -1; }

echo "== baby GPT, $ITERS steps, micro-batches of $MICRO, $(nproc) cores"
printf "%-8s %-10s %12s %12s %8s   %s\n" stages threads "train tok/s" "swarm tok/s" ratio "router"
for S in 1 2 4; do
    # shellcheck disable=SC2086
    "$SWARM" train $BABY --iters "$ITERS" --threads "$S" --quiet >"$TMP/train" 2>&1
    # shellcheck disable=SC2086
    sh scripts/local-swarm.sh --build "$BUILD" -n "$S" -s "$S" --steps "$ITERS" $BABY >"$TMP/swarm" 2>&1
    t=$(tok_s "$TMP/train")
    w=$(tok_s "$TMP/swarm")
    router=$(sed -n 's/^router | //p' "$TMP/swarm" | tail -1)
    printf "%-8s %-10s %12.0f %12.0f %8.2f   %s\n" "$S" "$S" "$t" "$w" \
        "$(echo "$w $t" | awk '{print $1 / $2}')" "$router"
done
echo "(goal: a 2-stage local swarm at >= 0.8x swarm train; with more threads than cores"
echo " both sides are oversubscribed alike)"
