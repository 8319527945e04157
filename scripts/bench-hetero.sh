#!/bin/sh
# bench-hetero.sh [BUILD] - uneven peers: six nodes of speeds 1, 1, 1/2, 1/4,
# 1/4, 1/8 (relative; SLOW=2 makes the fastest node 2x slower than this
# machine's core, so that the six fit on two cores) serve the 3 stages of
# the baby configuration. Each run trains for SECONDS_RUN (default 60);
# the bench reports the throughput of its second half (each step's end
# timed by the router's --trace) against the bound (the least, over stages,
# of what the stage's replicas sustain together, as the nodes measure it;
# the mean of `swarm status` every 5 s over the same half) and against the
# best bound any assignment of these nodes could have (the mean over the
# same samples). Runs, side by side:
#   even      static even split by join order (--assign even, no rebalancing)
#   speed     joins by speed, no rebalancing
#   rebalance joins by count, rebalancing on (the router must find the split)
#   default   joins by speed, rebalancing on (the defaults)
#   noverify  the defaults without spot verification (--verify 0): its cost
#   noaudit   the defaults without gradient audits (--audit 0): their cost
#   audit01   the defaults auditing a tenth of the steps (--audit 0.1)
#   auditall  the defaults with proven replicas audited as often as new ones
#             (--audit-proven 0.3): what proving a record saves
#   unchecked the defaults with no spot checks and no audits (--verify 0
#             --audit 0): what all the verification costs
#   gradfp16  the defaults with replicas' gradient sums in fp16 (--grad-wire):
#             what the gradient exchange between steps costs
#   halfbatch the defaults with half the batch (BATCH, default 192): what
#             each step's fixed costs (pipeline fill and drain, the
#             exchange, the updates) take
#   auto      the defaults with --window auto (Little's law) instead of all
#   chaos     the defaults with a SIGKILL every 20 s and a replacement of the
#             same speed (longer run; compared with default over the same span)
# Each run says too what its measured half held: its steps, how many of
# them were audited and the moves made in it, from which most of the
# spread between runs comes (an audited step took 3 times a step here),
# and the half taken apart: a step's mean time and an audited one's, and
# the steps not audited alone against the bound (what the two cores leave
# the swarm between audits).
# A benchmark: prints ratios, asserts nothing.
# With BASE (another build's folder), each run is made with both builds,
# one right after the other (the order alternating from run to run, as
# the machine drifts), its rows NAME and NAME@base: side by side in one run.
# Every run checkpoints every SAVE_EVERY steps (default 1: a rollback
# replays one step at most, ~2.7 s here, as two of batch 96 did; a
# checkpoint rides behind the step's updates and stalls no step); the
# chaos line counts rollbacks too.
#   SECONDS_RUN=60 SLOW=2 SAVE_EVERY=1 [ONLY="default-long chaos"] scripts/bench-hetero.sh [BUILD [BASE]]
set -eu
BUILD=${1:-build}
BASE=${2:-}
SWARM="$BUILD/swarm"
[ -z "$BASE" ] || [ -x "$BASE/swarm" ] || { echo "bench-hetero.sh: $BASE/swarm missing (BASE: the folder of the build to compare with)" >&2; exit 1; }
RUN=${SECONDS_RUN:-60}
SLOW=${SLOW:-2}
SAVE_EVERY=${SAVE_EVERY:-1}
SHARED=${SWARM_SHARED:-../shared}
[ -x "$SWARM" ] || { echo "bench-hetero.sh: $SWARM missing; run make" >&2; exit 1; }
OUT=$(mktemp -d /tmp/swarm-hetero.XXXXXX)
trap 'rm -rf "$OUT"' EXIT INT TERM
# 96 micro-batches a step: a pipeline's fill, drain and update cost the
# same time each step: most of what a step of 48 loses here (halfbatch
# shows it)
BATCH=${BATCH:-192}
T=64
BABY="--layers 4 --heads 4 --embd 128 --block $T --batch $BATCH --micro-batch 2 --lr 1e-3 --eval-every 0 --iters 100000"
if [ -f "$SHARED/data/tinyshakespeare.txt" ]; then
    BABY="$BABY --data $SHARED/data/tinyshakespeare.txt"
fi
SPEEDS=$(awk -v s="$SLOW" 'BEGIN { printf "%g,%g,%g,%g,%g,%g", 1/s, 1/s, 0.5/s, 0.25/s, 0.25/s, 0.125/s }')

. scripts/bench-lib.sh

# best_bound JSON: the best least-stage sum over every assignment of the ready
# peers to 3 stages (3^n assignments; n <= 8 here). A peer's tok/s is of
# its own stage; on another it is scaled by the ratio of the two stages'
# flops_per_token (stages cost differently: stage 1 of this plan has two
# blocks, the others one)
best_bound() {
    # one object a line (a Z85 key may hold a brace, never a quote)
    echo "$1" | sed 's/{"id": /\n"id": /g; s/{"stage": /\n"stage": /g' | awk '
        /^"stage": [0-9]*, "replicas"/ {
            match($0, /"flops_per_token": [0-9.]+/); cost[nc++] = substr($0, RSTART + 19, RLENGTH - 19) }
        /^"id": / && /"state": "ready"/ {
            match($0, /"stage": [0-9]+/); st = substr($0, RSTART + 9, RLENGTH - 9)
            match($0, /"node_tok_s": [0-9.]+/); v[n + 0] = substr($0, RSTART + 14, RLENGTH - 14); s[n++] = st }
        END {
            if (nc != 3) { print 0; exit }
            best = 0; total = 1; for (i = 0; i < n; i++) total *= 3
            for (a = 0; a < total; a++) {
                t[0] = t[1] = t[2] = 0; x = a
                for (i = 0; i < n; i++) { k = x % 3; x = int(x / 3); t[k] += v[i] * cost[s[i]] / cost[k] }
                low = t[0] < t[1] ? t[0] : t[1]; low = low < t[2] ? low : t[2]
                if (low > best) best = low
            }
            printf "%.0f", best }'
}

# in_half TRACE LOG BATCH BOUND: what the measured half held that a run to
# run spread comes from: its steps, how many of them the audits' draw
# picked (an AUDIT sent), and the moves the router made in it (a state
# fetched, and a replica alone on its stage until then audited at --audit
# until proven); and the half taken apart: the mean time of a step the
# draw picked and of one it did not, and the tok/s of the steps it did not
# pick alone, against BOUND: what the swarm makes between audits
in_half() {
    awk -v bt="$3" -v t="$T" '$2 == "step" { n++; at[n] = $1; st[n] = $3 }
        $2 == "send" && $4 == "AUDIT" { aud[$3] = 1 }
        END {
            if (n < 3) exit
            mid = at[1] + (at[n] - at[1]) / 2
            for (a = 1; at[a] < mid; a++) ;
            if (a >= n) exit
            for (k = a + 1; k <= n; k++) {
                ms = at[k] - at[k - 1]
                if (st[k] in aud) { m++; am += ms } else { p++; pm += ms }
            }
            printf "%d %d %d %.0f %.0f %.0f\n", st[n] - st[a], m + 0, st[a],
                m ? am / m : 0, p ? pm / p : 0, (p && pm > 0 ? p * bt * t * 1000 / pm : 0) }' "$1" | {
        read -r steps audited from audited_ms plain_ms plain_tok || return 0
        moved=$(sed -n 's/^swarm router: step \([0-9]*\): moving peer .*/\1/p' "$2" |
            awk -v f="$from" '$1 >= f { m++ } END { print m + 0 }')
        [ "$audited" -gt 0 ] && audited_ms="an audited one $audited_ms ms" || audited_ms="none audited"
        echo "$steps steps, $audited audited, $moved moves; a step $plain_ms ms, $audited_ms;" \
            "the steps not audited alone: $plain_tok tok/s," \
            "$(ratio "$plain_tok" "${4:-0}") of the bound"
    }
}

# run_one BUILD NAME DURATION ENV... -- ROUTER FLAGS: a local swarm of
# BUILD's binary for DURATION s, its row NAME
run_one() {
    build=$1 name=$2 dur=$3
    shift 3
    SWARM="$build/swarm"
    envs=""
    while [ "$1" != "--" ]; do envs="$envs $1"; shift; done
    shift
    echo "bench-hetero.sh: $name: $dur s ..." >&2
    # shellcheck disable=SC2086
    # checkpoints: a stage that loses every replica (a kill of the last
    # one) rolls back SAVE_EVERY steps at most, not to the start
    # ORDERED: nodes join in order, so the even split is the same every run
    env KEEP=1 ORDERED=1 $envs sh scripts/local-swarm.sh --build "$build" -n 6 -s 3 --speeds "$SPEEDS" \
        $BABY --save "$OUT/ckpt-$name" --save-every "$SAVE_EVERY" --trace "$OUT/$name.trace" "$@" \
        >"$OUT/$name.log" 2>&1 &
    pid=$!
    dir=$(swarm_dir "$OUT/$name.log")
    if [ -z "$dir" ]; then
        echo "bench-hetero.sh: $name: the swarm did not start:" >&2
        tail -5 "$OUT/$name.log" >&2
        kill "$pid" 2>/dev/null || true
        return 0
    fi
    # the bound over the second half, a sample every 5 s; the best split's
    # too (the nodes' speeds, which it is worked out from, drift as the
    # bound's do: one sample's best moved by a fifth between runs)
    half_bound "$dir" "$dur" 5
    best=$(echo "$statuses" | while IFS= read -r b; do [ -n "$b" ] && best_bound "$b"; echo; done |
        awk '$1 > 0 { s += $1; n++ } END { if (n) printf "%.0f", s / n }')
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    rm -rf "$dir"
    moves=$(grep -c "moving peer" "$OUT/$name.log" || true)
    rollbacks=$(grep -c "lost every replica" "$OUT/$name.log" || true)
    [ "$rollbacks" -gt 0 ] && echo "bench-hetero.sh: $name: $rollbacks rollback(s) to a checkpoint" >&2
    kills=$(grep -c "chaos: SIGKILL" "$OUT/$name.log" || true)
    bt=$BATCH prev="" # a run's own --batch wins
    for a in "$@"; do
        [ "$prev" = --batch ] && bt=$a
        prev=$a
    done
    half=$(in_half "$OUT/$name.trace" "$OUT/$name.log" "$bt" "${bound:-0}")
    [ -z "$half" ] || echo "bench-hetero.sh: $name: its measured half: $half" >&2
    tok=$(tok_s "$OUT/$name.trace" "$bt")
    echo "$name $tok ${bound:-0} ${best:-0} $moves $kills" >>"$OUT/results"
    printf "%-17s %10s %10s %10s %8s %8s %6s %6s\n" "$name" "$tok" "${bound:-?}" "${best:-?}" \
        "$(ratio "$tok" "${bound:-0}")" \
        "$(ratio "$tok" "${best:-0}")" \
        "$moves" "$kills"
}

# run NAME DURATION ENV... -- ROUTER FLAGS: run_one of BUILD, and of BASE
# (NAME@base) before or after it, the order turning at every run
turn=0
run() {
    case " ${ONLY:-$1} " in *" $1 "*) ;; *) return 0 ;; esac
    if [ -z "$BASE" ]; then
        run_one "$BUILD" "$@"
        return 0
    fi
    row=$1 # (not run_one's $name, which each call sets)
    shift
    turn=$((1 - turn))
    if [ "$turn" = 1 ]; then
        run_one "$BUILD" "$row" "$@"
        run_one "$BASE" "$row@base" "$@"
    else
        run_one "$BASE" "$row@base" "$@"
        run_one "$BUILD" "$row" "$@"
    fi
}

echo "== baby GPT over 3 stages, 6 nodes of speeds $SPEEDS (x this machine's core), $(nproc) cores"
echo "   tok/s over the second half of each ${RUN}-second run"
printf "%-17s %10s %10s %10s %8s %8s %6s %6s\n" run "tok/s" bound "best" "/bound" "/best" moves kills
run even "$RUN" -- --assign even --rebalance-every 0
run speed "$RUN" -- --rebalance-every 0
run rebalance "$RUN" -- --assign even
run default "$RUN" --
run noverify "$RUN" -- --verify 0
run noaudit "$RUN" -- --audit 0
run audit01 "$RUN" -- --audit 0.1
run auditall "$RUN" -- --audit-proven 0.3
run unchecked "$RUN" -- --verify 0 --audit 0
run gradfp16 "$RUN" -- --grad-wire fp16
run auto "$RUN" -- --window auto
run halfbatch "$RUN" -- --batch $((BATCH / 2))
CHAOS=$((RUN * 3 / 2))
run default-long "$CHAOS" --
run chaos "$CHAOS" CHAOS_EVERY=20 CHAOS_STALL=0 -- --chaos 11
for b in "" @base; do
    awk -v b="$b" '$1 == "default-long" b { d = $2 } $1 == "chaos" b { c = $2 }
        END { if (d > 0) printf "chaos%s retained %.2f of the throughput without it (goal >= 0.85, no rollback but where a stage lost every replica)\n", b, c / d }' "$OUT/results"
done
echo "(goal: the defaults >= 0.9 of the bound and of the best split of these nodes)"
