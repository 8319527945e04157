#!/bin/sh
# bench-gpu.sh BUILD - `make bench-gpu`: tokens/s of `swarm train --device
# cuda` on the baby configuration (L=4 H=4 C=128 T=64 B=12) and on a
# GPU-sized one (L=12 H=12 C=768 T=1024 B=8), each beside PyTorch eager fp32
# (ref_gpt.py's model through scripts/torch-gpu.py, TF32 off) on the same GPU
# when torch with CUDA is installed. Without a usable GPU it says why and
# exits 0. A benchmark: it prints numbers, it asserts nothing. swarm's
# figure counts its first step (cuBLAS set-up); PyTorch's skips 2 warm-up steps.
#   BABY_ITERS=300 BIG_ITERS=20 PYTHON=/usr/bin/python3 scripts/bench-gpu.sh build
set -u
BUILD=${1:-build}
SWARM="$BUILD/swarm"
BABY_ITERS=${BABY_ITERS:-300}
BIG_ITERS=${BIG_ITERS:-20}
PYTHON=${PYTHON:-python3}
SHARED=${SWARM_SHARED:-../shared}
REF="$SHARED/anchors/ref_gpt.py"
TMP=$(mktemp -d /tmp/swarm-bench-gpu.XXXXXX)
trap 'rm -rf "$TMP"' EXIT INT TERM
unset SWARM_CUDA_TF32

if ! "$SWARM" train --device cuda --layers 1 --heads 2 --embd 32 --block 16 --batch 1 --iters 1 \
    --eval-every 0 --quiet >"$TMP/probe" 2>&1; then
    echo "bench-gpu: SKIP: $(grep -m1 -- '--device cuda' "$TMP/probe" || tail -1 "$TMP/probe")"
    exit 0
fi
if [ -f "$SHARED/data/tinyshakespeare.txt" ]; then
    DATA="$SHARED/data/tinyshakespeare.txt"
else
    DATA="$BUILD/corpus.txt"
fi
have_torch=0
if [ -f "$REF" ] && "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    have_torch=1
else
    echo "bench-gpu: no PyTorch with CUDA ($PYTHON) or no $REF: swarm alone"
fi

tok_s() { sed -n 's/.*| tok\/s \([0-9.]*\).*/\1/p' "$1" | tail -1; }

# run NAME ITERS FLAGS...: swarm then PyTorch on one configuration
run() {
    name=$1 iters=$2
    shift 2
    echo "== $name: $*"
    "$SWARM" train "$@" --device cuda --iters "$iters" --eval-every 0 --quiet --data "$DATA" \
        >"$TMP/swarm" 2>&1
    head -1 "$TMP/swarm"
    tail -1 "$TMP/swarm"
    s=$(tok_s "$TMP/swarm")
    t=""
    if [ $have_torch = 1 ]; then
        "$PYTHON" scripts/torch-gpu.py --ref "$REF" --data "$DATA" --iters "$iters" "$@" >"$TMP/torch" 2>&1
        tail -1 "$TMP/torch"
        t=$(tok_s "$TMP/torch")
    fi
    printf "%s %s %s\n" "$name" "${s:-0}" "${t:-0}" >>"$TMP/summary"
}

run baby "$BABY_ITERS" --layers 4 --heads 4 --embd 128 --block 64 --batch 12
run gpu-sized "$BIG_ITERS" --layers 12 --heads 12 --embd 768 --block 1024 --batch 8

echo
echo "== summary: $(sed -n 's/^swarm train | \([^|]*\) |.*/\1/p' "$TMP/probe")"
awk '{
    torch = $3 > 0 ? sprintf("%9.0f", $3) : "        -"
    ratio = $3 > 0 ? sprintf("%.2fx", $2 / $3) : "-"
    printf "%-10s swarm %9.0f tok/s   PyTorch %s tok/s   swarm/PyTorch %s\n", $1, $2, torch, ratio }' "$TMP/summary"
