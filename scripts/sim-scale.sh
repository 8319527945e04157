#!/bin/sh
# sim-scale.sh [BUILD] - the router engine at internet scale, in swarm sim:
# a volunteer swarm (a tail of slow CPUs, speeds 1, 2 and 4; one peer in
# ten a GPU 20-40x the middle CPU; links of 20-100 ms and 10-100 Mbit/s)
# over 8 stages of a small model, for STEPS steps (default 1000) of
# synthetic work, each step a micro-batch a peer (peers / 8 micro-batches,
# each through the 8 stages). Prints, for each swarm size of PEERS (default
# "100 1000 10000 30000"), what docs/scale.md tabulates: the engine's CPU
# per request, its memory at most, the sim's wall time, and the engine's
# assignment against the best split's bound (bound/best); then the 10,000
# peers (CHURN_PEERS) under churn: each trace given, tiled, at the trace's
# own speed (CHURN_SCALE=20: twenty times faster), and a Poisson departure
# a peer-hour. A benchmark: prints, asserts nothing (each run's own
# invariants must hold, or it says which failed). At 10,000 peers a steady
# step takes about 0.4 s of this machine's core, a step under churn 0.3-0.5.
#   STEPS=1000 PEERS="100 1000 10000" CHURN="oobleck-g4dn.csv" scripts/sim-scale.sh build
set -eu
BUILD=${1:-build}
SWARM="$BUILD/swarm"
STEPS=${STEPS:-1000}
PEERS=${PEERS:-100 1000 10000 30000}
CHURN_PEERS=${CHURN_PEERS:-10000}
TRACES=${SWARM_SHARED:-../shared}/data/traces
CHURN=${CHURN-oobleck-g4dn.csv bamboo-g4dn-us-east-1c.csv}
CHURN_SCALE=${CHURN_SCALE:-1}
[ -x "$SWARM" ] || { echo "sim-scale.sh: $SWARM missing; run make" >&2; exit 1; }
OUT=$(mktemp -d /tmp/swarm-scale.XXXXXX)
trap 'rm -rf "$OUT"' EXIT INT TERM
# speeds scaled down with the micro-batch (256 tokens): a CPU takes 2.5-10 s
# a micro-batch, a GPU 0.13-0.26 s, longer than its link's round trip, as
# with the GPT-2-sized micro-batches the ratios stand for; activations of
# 2,048 numbers keep ten thousand peers within a core
MODEL="--stages 8 --layers 8 --heads 2 --embd 8 --block 16 --micro-batch 16 --eval-every 0
    --save-every 50 --speeds 25x6,50x6,100x6,1000,2000 --latency 20-100 --bandwidth 10-100
    --limit 100000000"

# run NAME PEERS FLAGS...: one sim, its numbers as a table row
run() {
    name=$1 peers=${2%%:*} steps=$STEPS
    case $2 in *:*) steps=${2#*:} ;; esac
    shift 2
    # a micro-batch a peer each step (each passes all 8 stages), at least 8
    g=$(((peers + 7) / 8 > 8 ? (peers + 7) / 8 : 8))
    echo "sim-scale.sh: $name: $peers peers, $steps steps ..." >&2
    # shellcheck disable=SC2086
    SWARM_PLAIN=1 /usr/bin/env time -f "%M" -o "$OUT/rss" "$SWARM" sim --peers "$peers" $MODEL \
        --batch $((g * 16)) --iters "$steps" --seed 1 "$@" >"$OUT/$name.out" 2>&1 || true
    line=$(grep "^sim |" "$OUT/$name.out" || echo "sim | (no result: $(tail -1 "$OUT/$name.out"))")
    mem=$(sed -n 's/.*engine memory at most \([0-9.]*\) MB.*/\1/p' "$OUT/$name.out")
    get() { echo "$line" | sed -n "s#.*| $1 \([0-9.]*\) .*#\1#p"; }
    ok=$(echo "$line" | grep -q "invariants ok" && echo ok || echo FAILED)
    printf "%-22s %7s %8s %9s %9s %9s %8s %9s %8s %6s\n" "$name" "$peers" "$(get us/request)" \
        "${mem:-?}" "$(($(cat "$OUT/rss" 2>/dev/null || echo 0) / 1024))" "$(get wall)" \
        "$(get bound/best)" "$(get /bound)" "$(get rollbacks)" "$ok"
    [ "$ok" = ok ] || grep "invariants" "$OUT/$name.out" | head -2 >&2
    grep "^sim: churn from\|^sim: the router's link" "$OUT/$name.out" >&2 || true
}

echo "== swarm sim, 8 stages, $STEPS steps; $(nproc) cores"
printf "%-22s %7s %8s %9s %9s %9s %8s %9s %8s %6s\n" run peers "us/req" "engine MB" "RSS MB" \
    "wall s" "bound/best" "/bound" rollbacks inv
# (steps: each run's own, the sim's line says how many it ran)
for p in $PEERS; do
    run "steady" "$p"
done
for t in $CHURN; do
    [ -f "$TRACES/$t" ] || { echo "sim-scale.sh: no $TRACES/$t; skipped" >&2; continue; }
    run "churn-$t" "$CHURN_PEERS" --churn "$TRACES/$t" --churn-scale "$CHURN_SCALE"
done
run "poisson-1-a-peer-hour" "$CHURN_PEERS" --leave-rate 1
