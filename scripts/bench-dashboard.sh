#!/bin/sh
# bench-dashboard.sh [BUILD] - what `swarm status --serve` costs the router,
# side by side on the same machine: the same local swarm (2 stages, NODES
# single-threaded nodes, STEPS steps of a small model) with no dashboard,
# with one polling once a second (the default), and with one polling ten
# times a second (so that the cost stands above the noise); runs alternate,
# ROUNDS times. Reports the router's CPU seconds (its summary line, getrusage)
# over the run's wall time, and the dashboard's extra CPU as a share of the
# router's. That difference is within the noise of the runs; so first
# BUILD/bench_status (make BUILD/bench_status) times the engine's STATUS
# reply itself (a poll a second after the last, with 40 peers and with
# 1000), which the last line puts against the router's measured CPU use.
# A benchmark: prints numbers, asserts nothing.
#   STEPS=3000 ROUNDS=2 NODES=3 scripts/bench-dashboard.sh build
set -eu
BUILD=${1:-build}
SWARM="$BUILD/swarm"
STEPS=${STEPS:-3000}
ROUNDS=${ROUNDS:-2}
NODES=${NODES:-3}
[ -x "$SWARM" ] || { echo "bench-dashboard.sh: $SWARM missing; run make" >&2; exit 1; }
OUT=$(mktemp -d /tmp/swarm-bench-dashboard.XXXXXX)
trap 'pkill -P $$ 2>/dev/null; rm -rf "$OUT"' EXIT
head -c 200000 "$BUILD/corpus.txt" >"$OUT/data.txt"
MODEL="--layers 2 --heads 4 --embd 64 --block 32 --batch 8 --micro-batch 2 --lr 1e-3 --eval-every 500 --eval-iters 2 --iters $STEPS --data $OUT/data.txt"
"$SWARM" keygen "$OUT/router" >/dev/null
T=32
. scripts/bench-lib.sh

# run NAME POLL: one swarm (POLL: the dashboard's seconds between polls, - none);
# prints "NAME cpu wall polls"
run() {
    d="$OUT/$1"
    mkdir -p "$d"
    # shellcheck disable=SC2086
    SWARM_PLAIN=1 "$SWARM" router $MODEL --stages 2 --listen tcp://127.0.0.1:0 --key "$OUT/router" \
        --log-every 1000 --min-nodes "$NODES" >"$d/router.log" 2>&1 &
    router=$!
    ep=$(endpoint_of "$d/router.log")
    dash=""
    if [ "$2" != - ]; then
        "$SWARM" status "$ep" --router-key "$OUT/router.pub" --serve 127.0.0.1:0 --watch "$2" \
            >"$d/dash.log" 2>&1 &
        dash=$!
    fi
    for n in $(seq 1 "$NODES"); do
        [ -f "$OUT/n$n.key" ] || "$SWARM" keygen "$OUT/n$n" >/dev/null
        "$SWARM" node --join "$ep" --router-key "$OUT/router.pub" --key "$OUT/n$n" --threads 1 \
            --name "n$n" >"$d/n$n.log" 2>&1 &
    done
    wait "$router" || true
    polls=0
    if [ -n "$dash" ]; then
        port=$(sed -n 's|^swarm status: dashboard at http://127.0.0.1:\([0-9]*\)/.*|\1|p' "$d/dash.log")
        polls=$(curl -s --max-time 5 "http://127.0.0.1:$port/metrics" \
            | sed -n 's/^swarm_status_polls_total //p')
        kill "$dash" 2>/dev/null || true
    fi
    pkill -f -- "--join $ep" 2>/dev/null || true
    wait 2>/dev/null || true
    cpu=$(sed -n 's/^router | cpu \([0-9.]*\) s .*/\1/p' "$d/router.log")
    wall=$(sed -n 's/^summary | .* wall \([0-9.]*\) s .*/\1/p' "$d/router.log")
    echo "$1 ${cpu:-?} ${wall:-?} ${polls:-0}"
}

if [ -x "$BUILD/bench_status" ]; then
    "$BUILD/bench_status" 40 | tee "$OUT/status40.txt"
    "$BUILD/bench_status" 1000 | tee "$OUT/status1000.txt"
fi
echo "bench-dashboard: $NODES nodes on 2 stages, $STEPS steps; the router's CPU with no dashboard, one at 1 poll/s, one at 10 polls/s"
for r in $(seq 1 "$ROUNDS"); do
    run none -
    run poll1 1
    run poll10 0.1
done | tee "$OUT/runs.txt" | awk '{ printf "  %-7s router cpu %6.2f s of %6.1f s wall (%4.1f%%), %d polls\n", $1, $2, $3, 100 * $2 / $3, $4 }'
awk '{ cpu[$1] += $2; wall[$1] += $3; polls[$1] += $4; n[$1]++ }
    END {
        base = cpu["none"] / wall["none"]
        for (k = 1; k <= 2; k++) {
            name = k == 1 ? "poll1" : "poll10"
            share = cpu[name] / wall[name]
            per = polls[name] > 0 ? (cpu[name] - base * wall[name]) / polls[name] * 1000 : 0
            printf "%s: the router at %.2f%% CPU against %.2f%% with none: %+.2f%% of its CPU (%.2f ms a poll)\n",
                name, 100 * share, 100 * base, 100 * (share - base) / base, per
        }
        print 100 * base > "'"$OUT/base.txt"'"
    }' "$OUT/runs.txt"
for n in 40 1000; do
    [ -f "$OUT/status$n.txt" ] || continue
    core=$(sed -n 's/.*at one poll a second: \([0-9.]*\)% of one core/\1/p' "$OUT/status$n.txt")
    awk -v c="$core" -v b="$(cat "$OUT/base.txt")" -v n="$n" 'BEGIN {
        printf "a dashboard polling a router of %d peers once a second: %.3f%% of a core, %.2f%% of the router'"'"'s %.1f%%\n",
            n, c, 100 * c / b, b }'
done
