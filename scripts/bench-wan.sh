#!/bin/sh
# bench-wan.sh [BUILD] - the swarm over emulated internet links, from one run:
#  1. throughput of the baby configuration (L=4 H=4 C=128 T=64 B=12,
#     micro-batches of 2) on 2 stages, one node of one thread each, over
#     links of DELAY each way and RATE (scripts/wan-swarm.sh) against the
#     same swarm on loopback, for --wire fp32, fp16 and int8; again with a
#     batch BIG_BATCH times larger, where the latency of a step is shared by
#     more tokens;
#  2. the loss after LOSS_STEPS steps with each format against fp32 on the
#     same data (loopback: the network does not change the numbers);
#  3. gradient averaging (2 replicas a stage): bytes a step and throughput
#     over the links with fp32 and fp16 sums, and what fp16 sums cost in loss
#     after GRAD_LOSS_STEPS steps.
# A benchmark: prints ratios and differences, asserts nothing. The links
# need root (network namespaces); without it those rows say so.
#   STEPS=30 BIG_BATCH=8 BIG_STEPS=6 LOSS_STEPS=300 GRAD_LOSS_STEPS=150
#   DELAY=50ms RATE=50mbit JITTER=0ms LOSS=0% scripts/bench-wan.sh build
# About 7 minutes on 2 cores (more when the machine is busy).
set -u
BUILD=${1:-build}
SWARM="$BUILD/swarm"
STEPS=${STEPS:-30}
BIG_BATCH=${BIG_BATCH:-8}
BIG_STEPS=${BIG_STEPS:-6}
LOSS_STEPS=${LOSS_STEPS:-300}
GRAD_LOSS_STEPS=${GRAD_LOSS_STEPS:-150}
DELAY=${DELAY:-50ms}
RATE=${RATE:-50mbit}
JITTER=${JITTER:-0ms}
LOSS=${LOSS:-0%}
SHARED=${SWARM_SHARED:-../shared}
[ -x "$SWARM" ] || { echo "bench-wan: $SWARM is not built; run make" >&2; exit 1; }
TMP=$(mktemp -d /tmp/swarm-bench-wan.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
BABY="--layers 4 --heads 4 --embd 128 --block 64 --lr 1e-3 --micro-batch 2"
if [ -f "$SHARED/data/tinyshakespeare.txt" ]; then
    BABY="$BABY --data $SHARED/data/tinyshakespeare.txt --init $SHARED/data/ref/baby_init.bgpt"
else
    echo "bench-wan: $SHARED/data not found: the built-in corpus and fresh weights instead"
fi
wan_ok=""
if [ "$(id -u)" -eq 0 ] && ip netns add "swbench$$" 2>/dev/null; then
    ip netns del "swbench$$"
    wan_ok=1
fi
t0=$(date +%s)
progress() {
    echo "   ... $* ($(($(date +%s) - t0)) s)" >&2
}

# field FILE WHAT: a number from a swarm router's summary
field() {
    case $2 in
    tok_s) sed -n 's/^summary | .*| tok\/s \([0-9.]*\) .*/\1/p' "$1" | tail -1 ;;
    acts) sed -n 's/^wire | activations [a-z0-9]*: \([0-9.]*\) MB\/step in, \([0-9.]*\) out.*/\1 \2/p' "$1" \
        | tail -1 | awk '{ printf "%.3f", $1 + $2 }' ;;
    grads) sed -n 's/.*| gradient sums [a-z0-9]*: \([0-9.]*\) in, \([0-9.]*\) out.*/\1 \2/p' "$1" \
        | tail -1 | awk '{ printf "%.3f", $1 + $2 }' ;;
    window) sed -n 's/.*| window [a-z]*, mean \([0-9.]*\) of \([0-9]*\).*/\1\/\2/p' "$1" | tail -1 ;;
    esac
}
ratio() {
    echo "$1 $2" | awk '{ if ($1 > 0 && $2 > 0) printf "%.2f", $1 / $2; else printf "-" }'
}
# swarm OUT NODES WAN STEPS FLAGS...: a local swarm (WAN=1: over the links)
swarm() {
    out=$1 nodes=$2 wan=$3 steps=$4
    shift 4
    if [ "$wan" = 1 ]; then
        sh scripts/wan-swarm.sh --build "$BUILD" -n "$nodes" -s 2 --steps "$steps" --delay "$DELAY" \
            --jitter "$JITTER" --rate "$RATE" --loss "$LOSS" --eval-every 0 "$@" >"$out" 2>&1
    else
        sh scripts/local-swarm.sh --build "$BUILD" -n "$nodes" -s 2 --steps "$steps" \
            --eval-every 0 "$@" >"$out" 2>&1
    fi
}

# ---- 1. throughput ----
# table BATCH STEPS: loopback and links side by side for each format
table() {
    echo
    echo "== 2 stages, batch $1 (micro-batches of 2), $2 steps, $(nproc) cores"
    printf "%-6s %14s %12s %7s %18s %10s\n" wire "loopback tok/s" "links tok/s" ratio "activations MB/step" window
    for w in fp32 fp16 int8; do
        # shellcheck disable=SC2086
        progress "batch $1, $w: loopback"
        swarm "$TMP/lo" 2 0 "$2" $BABY --batch "$1" --wire "$w"
        wt="-" win="-"
        if [ -n "$wan_ok" ]; then
            progress "batch $1, $w: over the links"
            # shellcheck disable=SC2086
            swarm "$TMP/wan" 2 1 "$2" $BABY --batch "$1" --wire "$w"
            wt=$(field "$TMP/wan" tok_s)
            win=$(field "$TMP/wan" window)
            [ -z "$how" ] && how=$(sed -n 's/.*; shaped by //p' "$TMP/wan" | head -1)
        fi
        lt=$(field "$TMP/lo" tok_s)
        printf "%-6s %14.0f %12s %7s %18s %10s\n" "$w" "${lt:-0}" "$wt" "$(ratio "$wt" "$lt")" \
            "$(field "$TMP/lo" acts)" "$win"
    done
}
how=""
echo "== baby GPT over emulated links: delay $DELAY each way, jitter $JITTER, rate $RATE, loss $LOSS"
echo "   load average at the start: $(cut -d' ' -f1-3 /proc/loadavg) (loopback is CPU-bound, the links mostly"
echo "   latency-bound: other work on the machine lowers loopback more and flatters the ratios)"
[ -n "$wan_ok" ] || echo "   (the link rows need root and network namespaces: skipped)"
table 12 "$STEPS"
table $((12 * BIG_BATCH)) "$BIG_STEPS"
[ -n "$how" ] && echo "links shaped by $how"
echo "(goal: int8 over the links at >= 0.7x loopback for batch 12)"

# ---- 2. loss ----
# loss_run NAME NODES STEPS FLAGS...: STEPS steps on loopback, losses in TMP/NAME.txt
loss_run() {
    name=$1 nodes=$2 n=$3
    shift 3
    progress "loss, $name: $n steps"
    # shellcheck disable=SC2086
    sh scripts/local-swarm.sh --build "$BUILD" -n "$nodes" -s 2 --steps "$n" $BABY --batch 12 \
        --eval-every "$n" --eval-iters 20 --loss-log "$TMP/$name.txt" "$@" >"$TMP/$name.out" 2>&1
}
# loss_line NAME REF STEPS: the mean loss of the last 50 steps and the val loss at the end, against REF's
loss_line() {
    val=$(sed -n "s/^step *$3 | train [0-9.]* | val \([0-9.]*\).*/\1/p" "$TMP/$1.out" | tail -1)
    rval=$(sed -n "s/^step *$3 | train [0-9.]* | val \([0-9.]*\).*/\1/p" "$TMP/$2.out" | tail -1)
    paste -d' ' "$TMP/$1.txt" "$TMP/$2.txt" | awk -v n="$3" -v name="$1" -v val="${val:-0}" \
        -v rval="${rval:-0}" '
        $1 >= n - 50 { a += $2; b += $5; k++ }
        END { if (!k) { printf "%-14s (no losses)\n", name; exit }
              d = (a - b) / k; dv = val - rval
              printf "%-14s %10.4f %+10.6f %10.4f %+10.6f %s\n", name, a / k, d, val, dv,
                     (d < 0.02 && d > -0.02 && dv < 0.02 && dv > -0.02) ? "ok" : "OVER 0.02" }'
}
echo
echo "== loss after $LOSS_STEPS steps, same data and weights (loopback)"
loss_run fp32 2 "$LOSS_STEPS" --wire fp32
loss_run fp16 2 "$LOSS_STEPS" --wire fp16
loss_run int8 2 "$LOSS_STEPS" --wire int8
printf "%-14s %10s %10s %10s %10s\n" wire "train*" "vs fp32" "val" "vs fp32"
for w in fp32 fp16 int8; do loss_line "$w" fp32 "$LOSS_STEPS"; done
echo "(* mean training loss of the last 50 steps; goal: within 0.02 of fp32)"

# ---- 3. gradient averaging ----
echo
echo "== gradient averaging: 4 nodes, 2 replicas a stage, batch 12"
printf "%-10s %16s %20s %12s\n" sums "gradient MB/step" "activations MB/step" "links tok/s"
for g in fp32 fp16; do
    gt="-"
    progress "gradient sums $g: loopback"
    # shellcheck disable=SC2086
    swarm "$TMP/g" 4 0 10 $BABY --batch 12 --grad-wire "$g"
    if [ -n "$wan_ok" ]; then
        progress "gradient sums $g: over the links"
        # shellcheck disable=SC2086
        swarm "$TMP/gw" 4 1 10 $BABY --batch 12 --grad-wire "$g"
        gt=$(field "$TMP/gw" tok_s)
    fi
    printf "%-10s %16s %20s %12s\n" "$g" "$(field "$TMP/g" grads)" "$(field "$TMP/g" acts)" "$gt"
done
loss_run grads-fp32 4 "$GRAD_LOSS_STEPS"
loss_run grads-fp16 4 "$GRAD_LOSS_STEPS" --grad-wire fp16
echo "loss after $GRAD_LOSS_STEPS steps (loopback):"
printf "%-14s %10s %10s %10s %10s\n" sums "train*" "vs fp32" "val" "vs fp32"
loss_line grads-fp32 grads-fp32 "$GRAD_LOSS_STEPS"
loss_line grads-fp16 grads-fp32 "$GRAD_LOSS_STEPS"
echo "bench-wan: $(($(date +%s) - t0)) s; load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
