#!/bin/sh
# test_cuda.sh BUILD - the CUDA backend as far as a machine without a GPU can
# check it: the plugin is built when nvcc is found and exports one entry
# point, the swarm binary links no CUDA library, --device cuda fails with the
# reason and the fix while --device auto falls back to the CPU and says why,
# with the plugin next to the binary, hidden, moved or installed; the GPU
# checks (check_cuda, gpu_swarm.sh, make test-gpu, bench-gpu.sh) skip cleanly;
# and blas/cuda.cu's kernels, run on the CPU emulation (swarm-cuda-emu.so),
# match the CPU backend, train, and keep a CPU and an emulated GPU replica
# in agreement. On a machine with a GPU the same checks take the GPU's side.
# Ends with "N passed, N failed".
BUILD=${1:-build}
SWARM="$BUILD/swarm"
. tests/lib.sh
unset SWARM_CUDA_PLUGIN SWARM_CUDA_TF32 SWARM_TEST_DEVICE MAKELEVEL MAKEFLAGS MFLAGS

PLUGIN="$BUILD/swarm-cuda.so"
EMU="$PWD/$BUILD/swarm-cuda-emu.so"
TINY="--layers 1 --heads 2 --embd 32 --block 16 --batch 2 --iters 3 --eval-every 0 --quiet --threads 1"
head -c 20000 "$BUILD/corpus.txt" >"$TMP/data.txt"
TINY="$TINY --data $TMP/data.txt"
NVCC=$(command -v nvcc || { [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] && echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc"; })

# expect_fail NAME PATTERN CMD...: non-zero exit, one stderr line matching PATTERN, no stdout
expect_fail() {
    name=$1 pattern=$2
    shift 2
    "$@" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    if [ $rc -ne 0 ] && [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q -- "$pattern" "$TMP/err" \
        && [ ! -s "$TMP/out" ]; then
        ok "$name: $(cat "$TMP/err")"
    else
        bad "$name: exit $rc, wanted one line /$pattern/:"; sed 's/^/     /' "$TMP/err" "$TMP/out"
    fi
}

# expect_auto NAME PATTERN CMD...: trains, says once on stdout how auto chose
expect_auto() {
    name=$1 pattern=$2
    shift 2
    if "$@" >"$TMP/out" 2>"$TMP/err" && [ "$(grep -c "device auto: " "$TMP/out")" -eq 1 ] \
        && grep -q -- "$pattern" "$TMP/out" && grep -q "^summary |" "$TMP/out"; then
        ok "$name: $(grep "device auto: " "$TMP/out")"
    else
        bad "$name: wanted /$pattern/:"; sed 's/^/     /' "$TMP/out" "$TMP/err"
    fi
}

# ---- the build ---------------------------------------------------------------
if ldd "$SWARM" | grep -E -q 'libcudart|libcublas|libcuda\.'; then
    bad "the swarm binary links a CUDA library:"; ldd "$SWARM"
else
    ok "ldd $SWARM: no libcudart, libcublas or libcuda"
fi
if [ -z "$NVCC" ]; then
    echo "SKIP: nvcc not found (PATH, CUDA_HOME): no CUDA plugin to check; its checks below say 'no CUDA plugin'"
    have_plugin=0
elif [ -f "$PLUGIN" ]; then
    have_plugin=1
    ok "nvcc at $NVCC: $PLUGIN was built"
    syms=$(nm -D --defined-only "$PLUGIN" | awk '$2 == "T" { print $3 }' | tr '\n' ' ')
    if [ "$syms" = "blas_cuda_open " ]; then
        ok "the plugin exports one function: $syms"
    else
        bad "the plugin exports: $syms"
    fi
    if ldd "$PLUGIN" | grep -q 'libcudart\.so'; then
        bad "the plugin links libcudart dynamically:"; ldd "$PLUGIN"
    else
        ok "the plugin carries cudart (static); it needs $(ldd "$PLUGIN" | grep -o 'libcublas\.so[.0-9]*' | head -1)"
    fi
else
    have_plugin=0
    bad "nvcc at $NVCC but no $PLUGIN"
fi

# ---- the plugin as built: is there a GPU? --------------------------------------
gpu=0
# shellcheck disable=SC2086
if "$SWARM" train $TINY --device cuda >"$TMP/probe" 2>&1; then
    gpu=1
    echo "note: a usable GPU: $(sed -n 's/^swarm train | \([^|]*\) |.*/\1/p' "$TMP/probe")"
    # shellcheck disable=SC2086
    expect_auto "auto takes the GPU" "device auto: cuda (cuda:0 " "$SWARM" train $TINY
elif [ $have_plugin = 1 ]; then
    # shellcheck disable=SC2086
    expect_fail "train --device cuda without a GPU" "^swarm train: --device cuda: no usable GPU: .*--device cpu" \
        "$SWARM" train $TINY --device cuda
    # shellcheck disable=SC2086
    expect_auto "train --device auto without a GPU" "^swarm train: device auto: cpu (no usable GPU: " \
        "$SWARM" train $TINY
    "$SWARM" keygen "$TMP/r" >/dev/null
    expect_fail "node --device cuda without a GPU" "^swarm node: --device cuda:0: no usable GPU: " \
        "$SWARM" node --join tcp://127.0.0.1:9 --router-key "$TMP/r.pub" --key "$TMP/n" --device cuda:0
else
    # shellcheck disable=SC2086
    expect_fail "train --device cuda without a plugin" "^swarm train: --device cuda: no CUDA plugin: " \
        "$SWARM" train $TINY --device cuda
fi

# ---- hidden, moved, installed ------------------------------------------------
# shellcheck disable=SC2086
expect_fail "plugin hidden: --device cuda" \
    "^swarm train: --device cuda: no CUDA plugin: SWARM_CUDA_PLUGIN=/nonexistent/swarm-cuda.so: No such file.*make.*--device cpu" \
    env SWARM_CUDA_PLUGIN=/nonexistent/swarm-cuda.so "$SWARM" train $TINY --device cuda
# shellcheck disable=SC2086
expect_auto "plugin hidden: --device auto" \
    "^swarm train: device auto: cpu (no CUDA plugin: SWARM_CUDA_PLUGIN=/nonexistent" \
    env SWARM_CUDA_PLUGIN=/nonexistent/swarm-cuda.so "$SWARM" train $TINY
mkdir -p "$TMP/moved"
cp "$SWARM" "$TMP/moved/swarm"
# shellcheck disable=SC2086
expect_fail "binary moved away from its plugin" \
    "no CUDA plugin: neither $TMP/moved/swarm-cuda.so nor $TMP/moved/../lib/swarm/swarm-cuda.so exists" \
    "$TMP/moved/swarm" train $TINY --device cuda
if [ $have_plugin = 1 ]; then
    make -s install BUILD="$BUILD" PREFIX=/usr DESTDIR="$TMP/inst" >"$TMP/make.out" 2>&1
    if [ -x "$TMP/inst/usr/bin/swarm" ] && [ -f "$TMP/inst/usr/lib/swarm/swarm-cuda.so" ]; then
        ok "make install puts the plugin in PREFIX/lib/swarm"
        # shellcheck disable=SC2086
        "$TMP/inst/usr/bin/swarm" train $TINY --device cuda >"$TMP/out" 2>&1
        if grep -q "no usable GPU\|^summary |" "$TMP/out" && ! grep -q "no CUDA plugin" "$TMP/out"; then
            ok "the installed binary finds it: $(head -1 "$TMP/out" | cut -c1-100)"
        else
            bad "the installed binary"; cat "$TMP/out"
        fi
    else
        bad "make install"; cat "$TMP/make.out"; find "$TMP/inst"
    fi
fi

# ---- the GPU checks skip cleanly without a GPU ---------------------------------
"$BUILD/check_cuda" >"$TMP/out" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "Failures: 0, Errors: 0" "$TMP/out"; then
    ok "check_cuda: $(grep -m1 "SKIP" "$TMP/out" || echo "ran on the GPU") ($(grep Checks "$TMP/out"))"
else
    bad "check_cuda exit $rc:"; cat "$TMP/out"
fi
for script in tests/gpu.sh tests/gpu_swarm.sh scripts/bench-gpu.sh; do
    [ $gpu = 0 ] || break # a GPU is here: make test-gpu runs these for real
    if sh "$script" "$BUILD" >"$TMP/out" 2>&1 && grep -q "SKIP" "$TMP/out"; then
        ok "$script without a GPU: $(grep -m1 SKIP "$TMP/out" | cut -c1-110)..."
    else
        bad "$script without a GPU:"; cat "$TMP/out"
    fi
done

# ---- blas/cuda.cu's kernels on the CPU emulation -------------------------------
if [ ! -f "$EMU" ]; then
    echo "SKIP: no $EMU (no C++ compiler): the kernels are not checked here"
    lib_done
    exit $?
fi
SWARM_CUDA_PLUGIN="$EMU" "$BUILD/check_cuda" >"$TMP/out" 2>&1
rc=$?
if [ $rc -eq 0 ] && ! grep -q SKIP "$TMP/out" && grep -q "100%: Checks: [1-9]" "$TMP/out"; then
    ok "check_cuda on the emulated kernels: every op matches the CPU's ($(grep Checks "$TMP/out"))"
else
    bad "check_cuda on the emulated kernels, exit $rc:"; cat "$TMP/out"
fi
# shellcheck disable=SC2086
"$SWARM" train $TINY --device cpu --loss-log "$TMP/cpu.txt" >/dev/null 2>&1
# shellcheck disable=SC2086
if SWARM_CUDA_PLUGIN="$EMU" "$SWARM" train $TINY --device cuda --loss-log "$TMP/emu.txt" >"$TMP/out" 2>&1 \
    && losses_match "$TMP/emu.txt" "$TMP/cpu.txt" 3; then
    ok "swarm train --device cuda on the emulated kernels: the CPU's losses to 1e-4"
else
    bad "train on the emulated kernels:"; cat "$TMP/out"; paste "$TMP/emu.txt" "$TMP/cpu.txt"
fi
# a node's default budget on a GPU: 90% of what the device has free (the
# emulation has 1 GiB, 768 MiB of it free), not of its total
"$SWARM" keygen "$TMP/emu-router" >/dev/null
SWARM_CUDA_PLUGIN="$EMU" "$SWARM" node --join tcp://127.0.0.1:9 --router-key "$TMP/emu-router.pub" \
    --key "$TMP/emu-node" --device cuda:0 >"$TMP/node.out" 2>&1 &
emu_node=$!
pids="$pids $emu_node"
if wait_grep "$TMP/node.out" "memory budget 691.2 MiB: 90% of the 768.0 MiB of the GPU's memory free" 20; then
    ok "a GPU node's default budget: $(grep -o "memory budget .*" "$TMP/node.out" | head -n 1)"
else
    bad "a GPU node's default budget:"; cat "$TMP/node.out"
fi
kill "$emu_node" 2>/dev/null
wait "$emu_node" 2>/dev/null
SWARM_CUDA_PLUGIN="$EMU" GPU_SWARM_STEPS=4 CPU_SLOWDOWN=300 sh tests/gpu_swarm.sh "$BUILD" >"$TMP/out" 2>&1
if grep -q "^5 passed, 0 failed" "$TMP/out"; then
    ok "gpu_swarm.sh with an emulated GPU node: $(grep -m1 "checksums agreed" "$TMP/out" | cut -c6-)"
else
    bad "gpu_swarm.sh with an emulated GPU node:"; cat "$TMP/out"
fi
lib_done
