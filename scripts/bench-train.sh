#!/bin/sh
# bench-train.sh BUILD - `make bench`: tokens/s of `swarm train` on the baby
# configuration (L=4 H=4 C=128 T=64 B=12), its GFLOP/s against the OpenBLAS
# sgemm peak measured here, and PyTorch (ref_gpt.py) side by side when it is
# installed. Runs alternate, A B A B, and the best of each is kept, since
# these machines are noisy. A benchmark: it prints numbers, it asserts nothing.
#   ITERS=150 THREADS=<all cores> scripts/bench-train.sh build
set -eu
BUILD=${1:-build}
SWARM="$BUILD/swarm"
for f in "$SWARM" "$BUILD/bench_gemm"; do
    [ -x "$f" ] || { echo "bench-train.sh: $f missing; run make bench" >&2; exit 1; }
done
ITERS=${ITERS:-150}
THREADS=${THREADS:-$(nproc)}
SHARED=${SWARM_SHARED:-../shared}
REF="$SHARED/anchors/ref_gpt.py"
TMP=$(mktemp -d /tmp/swarm-bench.XXXXXX)
trap 'rm -rf "$TMP"' EXIT INT TERM

BABY="--layers 4 --heads 4 --embd 128 --block 64 --batch 12 --lr 1e-3 --seed 1337 --eval-every 0"
if [ -f "$SHARED/data/tinyshakespeare.txt" ]; then
    DATA="--data $SHARED/data/tinyshakespeare.txt"
    INIT="--init $SHARED/data/ref/baby_init.bgpt"
else
    echo "bench: $SHARED/data absent: built-in corpus, fresh weights, no PyTorch comparison"
    DATA="" INIT=""
fi

tok_s() { sed -n 's/.*| tok\/s \([0-9.]*\).*/\1/p' "$1" | tail -1; }
threads_of() {  # peak thread count of a running pid
    peak=0
    # until it exits (a zombie still answers kill -0, so read its state)
    while grep -q '^State:[[:space:]]*[RSD]' "/proc/$1/status" 2>/dev/null; do
        n=$(awk '/^Threads:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0)
        [ "${n:-0}" -gt "$peak" ] && peak=$n
        sleep 0.5
    done
    echo "$peak"
}

echo "== OpenBLAS sgemm, $THREADS threads"
"$BUILD/bench_gemm" "$THREADS" | tee "$TMP/gemm"
PEAK=$(awk '/^peak_gflops/ {print $2}' "$TMP/gemm")

have_torch=0
if [ -n "$INIT" ] && [ -f "$REF" ] && /usr/bin/python3 -c "import torch" 2>/dev/null; then
    have_torch=1
fi

best_swarm=0 best_torch=0 best_torch_plain=0
for round in 1 2; do
    echo "== round $round: swarm train, $ITERS steps, $THREADS threads"
    # shellcheck disable=SC2086
    "$SWARM" train $BABY $DATA $INIT --iters "$ITERS" --threads "$THREADS" --quiet >"$TMP/swarm" 2>&1 &
    pid=$!
    peak_threads=$(threads_of $pid)
    wait $pid
    tail -1 "$TMP/swarm"
    echo "   threads seen in the process: $peak_threads (asked for $THREADS)"
    t=$(tok_s "$TMP/swarm")
    best_swarm=$(echo "$t $best_swarm" | awk '{print ($1 > $2) ? $1 : $2}')
    if [ $have_torch = 1 ]; then
        echo "== round $round: PyTorch ref_gpt.py, $THREADS threads, OMP_WAIT_POLICY=PASSIVE OPENBLAS_THREAD_TIMEOUT=4"
        # shellcheck disable=SC2086
        OMP_WAIT_POLICY=PASSIVE OPENBLAS_THREAD_TIMEOUT=4 /usr/bin/python3 "$REF" $BABY $DATA \
            --load "$SHARED/data/ref/baby_init.bgpt" --iters "$ITERS" --threads "$THREADS" >"$TMP/torch" 2>&1
        tail -1 "$TMP/torch"
        t=$(tok_s "$TMP/torch")
        best_torch=$(echo "$t $best_torch" | awk '{print ($1 > $2) ? $1 : $2}')
    fi
done
if [ $have_torch = 1 ]; then
    echo "== PyTorch in a plain environment (its OpenMP and OpenBLAS pools spin against each other)"
    # shellcheck disable=SC2086
    /usr/bin/python3 "$REF" $BABY $DATA --load "$SHARED/data/ref/baby_init.bgpt" --iters "$ITERS" \
        --threads "$THREADS" >"$TMP/torch_plain" 2>&1
    tail -1 "$TMP/torch_plain"
    best_torch_plain=$(tok_s "$TMP/torch_plain")
fi

# One knob, no oversubscription: how idle threads wait. swarm's default is
# a short spin (GOMP_SPINCOUNT=1000); against it, never spinning
# (PASSIVE), libgomp's own default (a spin of 300,000, about a ms) and
# spinning for good (ACTIVE). Quiet, beside a niced busy loop, beside a busy
# loop of the same priority (any other program on a volunteer's desktop),
# and beside a second swarm train of as many threads (the two's sum).
echo "== threads: how idle threads wait (tok/s, 40 steps each)"
WAYS="swarm|SWARM_BENCH=1 PASSIVE|OMP_WAIT_POLICY=PASSIVE libgomp|GOMP_SPINCOUNT=300000 ACTIVE|OMP_WAIT_POLICY=ACTIVE"
short() {  # OUT ENV...
    out=$1; shift
    # shellcheck disable=SC2086
    env "$@" "$SWARM" train $BABY $DATA $INIT --iters 40 --threads "$THREADS" --quiet >"$out" 2>&1
}
printf "   %-26s" ""
for w in $WAYS; do printf " %9s" "${w%%|*}"; done
echo
for beside in quiet "niced loop" "loop" "a second run"; do
    busy=""
    case $beside in
        "niced loop") nice -n 19 sh -c 'while :; do :; done' & busy=$! ;;
        loop) sh -c 'while :; do :; done' & busy=$! ;;
    esac
    printf "   %-26s" "$beside"
    for w in $WAYS; do
        if [ "$beside" = "a second run" ]; then
            short "$TMP/short2" ${w#*|} &
            short "$TMP/short" ${w#*|}
            wait $!
            printf " %9.0f" "$(awk -v a="$(tok_s "$TMP/short")" -v b="$(tok_s "$TMP/short2")" 'BEGIN { print a + b }')"
        else
            short "$TMP/short" ${w#*|}
            printf " %9.0f" "$(tok_s "$TMP/short")"
        fi
    done
    echo
    [ -n "$busy" ] && kill "$busy"
done

echo
echo "== summary (best of 2 rounds, $ITERS steps, $THREADS threads)"
awk -v s="$best_swarm" -v p="$PEAK" 'BEGIN {
    g = s * 5595648 / 1e9
    printf "swarm train: %.0f tok/s, %.1f GFLOP/s = %.0f%% of the sgemm peak (%.1f GFLOP/s)\n", s, g, 100 * g / p, p }'
if [ $have_torch = 1 ]; then
    awk -v s="$best_swarm" -v t="$best_torch" -v q="$best_torch_plain" 'BEGIN {
        printf "PyTorch:     %.0f tok/s (tuned env), %.0f tok/s (plain env)\n", t, q
        printf "ratio swarm / PyTorch: %.2fx (tuned), %.2fx (plain)\n", s / t, s / q }'
fi
