#!/bin/sh
# bench-defaults.sh [BUILD] - the router's micro-batch default against the
# old one, side by side: local swarms of the baby model (batch 12) over 2
# and 3 stages, NODES single-threaded nodes each (default 3), once with
# --micro-batch 12 (the old default: one micro-batch a step, no pipelining)
# and once with no --micro-batch (the router chooses; its start-up line says
# what). Runs alternate old/new, ROUNDS times (these machines are noisy).
# Each trains SECONDS_RUN s (default 16); throughput is that of the second
# half (step ends from the router's --trace), against the bound `swarm
# status --json` gives (the least over stages of what its replicas sustain,
# as the nodes measure it; the mean of a sample every 2 s over the same
# half), and the split at the end (replicas a stage: where the third node
# of 2 stages goes moves the bound, and runs differ by it). A benchmark:
# prints numbers, asserts nothing.
#   SECONDS_RUN=16 ROUNDS=2 NODES=3 [STAGES="2 3"] [MICROS="12 -"] scripts/bench-defaults.sh build
# MICROS lists the --micro-batch of each run, "-" for none (the default).
# SLOW=F runs every node F times slower (--slowdown F, default 1), so that
# NODES nodes need NODES/F cores: with F >= NODES/cores each node computes
# as if on a core of its own, which is what the bound assumes. Each run's
# last column, "level", is the most fill and drain allow when the stages
# take alike, G/(G+S-1) for G
# micro-batches a step over S stages.
# FLAGS adds router flags to every run (e.g. FLAGS="--audit 0": an open
# swarm audits a stage of two or more replicas, and its update waits).
#   NODES=4 STAGES=4 SLOW=3 MICROS=- scripts/bench-defaults.sh build
set -eu
BUILD=${1:-build}
SWARM="$BUILD/swarm"
RUN=${SECONDS_RUN:-16}
ROUNDS=${ROUNDS:-2}
NODES=${NODES:-3}
STAGES=${STAGES:-2 3}
MICROS=${MICROS:-12 -}
SLOW=${SLOW:-1}
SHARED=${SWARM_SHARED:-../shared}
[ -x "$SWARM" ] || { echo "bench-defaults.sh: $SWARM missing; run make" >&2; exit 1; }
OUT=$(mktemp -d /tmp/swarm-defaults.XXXXXX)
pid="" # the local swarm running now, stopped (by its pid) on any exit
trap '[ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && wait "$pid"; rm -rf "$OUT"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
BATCH=12
T=64
BABY="--layers 4 --heads 4 --embd 128 --block $T --batch $BATCH --lr 1e-3 --eval-every 0 --iters 100000 ${FLAGS:-}"
if [ -f "$SHARED/data/tinyshakespeare.txt" ]; then
    BABY="$BABY --data $SHARED/data/tinyshakespeare.txt"
fi

. scripts/bench-lib.sh

# run S MICRO: a local swarm of S stages for RUN s; MICRO "-" for no
# --micro-batch. Appends "S MICRO CHOSEN TOK BOUND" to $OUT/results.
run() {
    s=$1 micro=$2 name="s$1-m$2-$(date +%s%N)"
    flag="--micro-batch $micro" label=$micro
    [ "$micro" = - ] && flag="" label=default
    echo "bench-defaults.sh: $s stages, --micro-batch $label: $RUN s ..." >&2
    # shellcheck disable=SC2086
    env KEEP=1 sh scripts/local-swarm.sh --build "$BUILD" -n "$NODES" -s "$s" $BABY $flag --speeds "$SPEEDS" \
        --trace "$OUT/$name.trace" >"$OUT/$name.log" 2>&1 &
    pid=$!
    dir=$(swarm_dir "$OUT/$name.log")
    if [ -z "$dir" ]; then
        echo "bench-defaults.sh: $s stages, --micro-batch $label: the swarm did not start:" >&2
        tail -5 "$OUT/$name.log" >&2
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        pid=""
        return 0
    fi
    half_bound "$dir" "$RUN" 2
    st=$last_status
    # replicas a stage, e.g. 2+1 (which stage got the third node moves the bound)
    split=$(echo "$st" | grep -o '"replicas": [0-9]*' | sed 's/.* //' | paste -sd+ -)
    chosen=$(sed -n 's/^swarm router: .* batch [0-9]* in micro-batches of \([0-9]*\).*/\1/p' \
        "$dir/router.log" | head -n 1)
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    pid=""
    rm -rf "$dir"
    tok=$(tok_s "$OUT/$name.trace" "$BATCH")
    echo "$s $micro ${chosen:-?} $tok ${bound:-0}" >>"$OUT/results"
    printf "%-7s %-12s %6s %6s %10s %10s %7s %7s\n" "$s" "$label" "${chosen:-?}" "${split:-?}" "$tok" "${bound:-?}" \
        "$(ratio "$tok" "${bound:-0}")" \
        "$(awk -v m="${chosen:-0}" -v s="$s" -v b="$BATCH" 'BEGIN { if (m > 0) printf "%.2f", (b / m) / (b / m + s - 1); else print "?" }')"
}

SPEEDS=$(awk -v n="$NODES" -v f="$SLOW" 'BEGIN { for (i = 1; i <= n; i++) printf "%s%g", (i > 1 ? "," : ""), 1 / f }')
echo "== baby GPT, batch $BATCH, $NODES nodes of one thread (--slowdown $SLOW), $(nproc) cores; load $(uptime | sed 's/.*load average: //')"
echo "   tok/s over the second half of each ${RUN}-second run; rounds alternate"
printf "%-7s %-12s %6s %6s %10s %10s %7s %7s\n" stages "--micro-batch" micro split "tok/s" bound "/bound" "level"
r=1
while [ "$r" -le "$ROUNDS" ]; do
    for s in $STAGES; do
        for m in $MICROS; do run "$s" "$m"; done
    done
    r=$((r + 1))
done
echo "== means over $ROUNDS round(s)"
printf "%-7s %-12s %6s %10s %7s\n" stages "--micro-batch" micro "tok/s" "/bound"
awk '{ k = $1 " " $2; if (!(k in n)) order[++K] = k; n[k]++; c[k] = $3; t[k] += $4
       if ($5 > 0) { f[k] += $4 / $5; nf[k]++ } }
     END { for (i = 1; i <= K; i++) { k = order[i]; split(k, p, " ")
               printf "%-7s %-12s %6s %10.0f %7s\n", p[1], p[2] == "-" ? "default" : p[2], c[k],
                   t[k] / n[k], nf[k] ? sprintf("%.2f", f[k] / nf[k]) : "?" } }' "$OUT/results"
echo "(goal: the default at >= 0.8 of its bound and above --micro-batch 12 in tok/s, on 2-4 stages)"
if awk -v n="$NODES" -v f="$SLOW" -v c="$(nproc)" 'BEGIN { exit !(n / f > c) }'; then
    echo "(note: $NODES nodes on $(nproc) cores: the bound is what each stage's nodes sustain while they"
    echo " compute, and they cannot all compute at once; one node a stage over S stages reaches at"
    echo " most about $(nproc)/S of it here)"
fi
