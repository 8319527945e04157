#!/bin/sh
# gpu-check.sh - on a machine with an NVIDIA GPU, everything there is to
# check, in one run within a time budget (BUDGET seconds, default 480):
# build (nvcc builds the plugin), `make test-gpu`, then `make bench-gpu`
# with the time left. Prints the GPU, each part's outcome and its time.
# Unlike make test-gpu it fails when there is no usable GPU: it is meant for
# a GPU machine. Exit 0 only when the build and every GPU test passed.
#   BUDGET=480 scripts/gpu-check.sh
set -u
BUDGET=${BUDGET:-480}
BUILD=build
start=$(date +%s)
left() { echo $((BUDGET - ($(date +%s) - start))); }
say() { echo "gpu-check: [$(($(date +%s) - start)) s] $*"; }

command -v nvidia-smi >/dev/null && nvidia-smi -L
say "building (make -j$(nproc))"
if ! timeout "$(left)" make -j"$(nproc)" all "$BUILD/check_cuda" "$BUILD/check_node" "$BUILD/rogue"; then
    say "FAIL: the build failed (missing packages? make deps installs them)"
    exit 1
fi
[ -f "$BUILD/swarm-cuda.so" ] || { say "FAIL: no $BUILD/swarm-cuda.so: is nvcc on the PATH or CUDA_HOME set?"; exit 1; }
if ! "$BUILD/swarm" train --device cuda --layers 1 --heads 2 --embd 32 --block 16 --batch 1 --iters 1 \
    --eval-every 0 --quiet >/tmp/gpu-check.probe.$$ 2>&1; then
    say "FAIL: $(cat /tmp/gpu-check.probe.$$)"
    rm -f /tmp/gpu-check.probe.$$
    exit 2
fi
say "GPU: $(sed -n 's/^swarm train | \([^|]*\) |.*/\1/p' /tmp/gpu-check.probe.$$)"
rm -f /tmp/gpu-check.probe.$$

# the tests first, with at most 5/8 of the budget; the benchmark gets the rest
t=$(( $(left) * 5 / 8 ))
say "make test-gpu (at most $t s)"
timeout "$t" make --no-print-directory test-gpu
tests=$?
[ $tests -eq 124 ] && say "make test-gpu ran out of time"
say "make test-gpu: exit $tests"

t=$(( $(left) - 10 ))
if [ "$t" -gt 30 ]; then
    say "make bench-gpu (at most $t s)"
    timeout "$t" make --no-print-directory bench-gpu || say "bench-gpu stopped (exit $?)"
else
    say "no time left for bench-gpu"
fi
say "done: tests $([ $tests -eq 0 ] && echo passed || echo FAILED)"
exit $tests
