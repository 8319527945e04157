#!/bin/sh
# gpu.sh BUILD - `make test-gpu`, on a machine with an NVIDIA GPU: every CUDA
# op against the CPU's (check_cuda), the PyTorch reference tests of the model
# on CUDA (SWARM_TEST_DEVICE=cuda check_node), and a stage with a CPU and a
# GPU replica whose checksums must agree after every step (gpu_swarm.sh).
# Without a usable GPU it says why, SKIP, and passes. TF32 stays off (the
# checks hold CUDA to the CPU within 1e-5). Ends with "N passed, N failed".
BUILD=${1:-build}
SWARM="$BUILD/swarm"
unset SWARM_CUDA_TF32 SWARM_TEST_DEVICE
pass=0
fail=0
out=$(mktemp /tmp/swarm-gpu.XXXXXX)
trap 'rm -f "$out"' EXIT INT TERM

if ! "$SWARM" train --device cuda --layers 1 --heads 2 --embd 32 --block 16 --batch 1 --iters 1 \
    --eval-every 0 --quiet >"$out" 2>&1; then
    echo "SKIP: make test-gpu: $(grep -m1 -- '--device cuda' "$out" || tail -1 "$out")"
    echo "0 passed, 0 failed"
    exit 0
fi
echo "== GPU: $(sed -n 's/^swarm train | \([^|]*\) |.*/\1/p' "$out")"

# check RUNNER [ENV...]: a Check runner's summary added to the counts
check() {
    runner=$1
    shift
    echo "== $* $runner"
    env "$@" "$runner" >"$out" 2>&1
    rc=$?
    cat "$out"
    line=$(grep -E 'Checks: [0-9]+, Failures: [0-9]+, Errors: [0-9]+' "$out" | tail -1)
    if [ -z "$line" ]; then
        echo "gpu.sh: $runner printed no Check summary (exit $rc)"
        fail=$((fail + 1))
        return
    fi
    n=$(echo "$line" | sed -E 's/.*Checks: ([0-9]+).*/\1/')
    f=$(echo "$line" | sed -E 's/.*Failures: ([0-9]+).*/\1/')
    e=$(echo "$line" | sed -E 's/.*Errors: ([0-9]+).*/\1/')
    pass=$((pass + n - f - e))
    fail=$((fail + f + e))
    [ $rc -eq 0 ] || [ $((f + e)) -gt 0 ] || fail=$((fail + 1))
}
check "$BUILD/check_cuda"
check "$BUILD/check_node" SWARM_TEST_DEVICE=cuda CK_TIMEOUT_MULTIPLIER=4

echo "== tests/gpu_swarm.sh"
sh tests/gpu_swarm.sh "$BUILD" >"$out" 2>&1
cat "$out"
line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$out" | tail -1)
if [ -n "$line" ]; then
    pass=$((pass + $(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/')))
    fail=$((fail + $(echo "$line" | sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/')))
else
    echo "gpu.sh: gpu_swarm.sh printed no summary"
    fail=$((fail + 1))
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
