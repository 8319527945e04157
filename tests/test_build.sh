#!/bin/sh
# test_build.sh - the Makefile's detection: it says which OpenBLAS build it
# links and whether nvcc is there (and so the CUDA plugin built), and follows
# what the machine has.
# Ends with "N passed, N failed".
unset MAKELEVEL MAKEFLAGS MFLAGS MAKEOVERRIDES
pass=0
fail=0
check() {  # NAME PATTERN OUTPUT
    if echo "$3" | grep -q -- "$2"; then
        pass=$((pass + 1)); echo "ok   $1: $(echo "$3" | grep -- "$2" | head -1)"
    else
        fail=$((fail + 1)); echo "FAIL $1: wanted /$2/ in:"; echo "$3" | sed 's/^/     /'
    fi
}
out=$(make -n all 2>&1)
check "prints the OpenBLAS build" "^openblas: \(openmp\|pthread\) build" "$out"
check "prints the nvcc detection" "^nvcc: " "$out"
out=$(PATH=/usr/bin:/bin make -n all CUDA_HOME=/nonexistent 2>&1)
check "no nvcc when neither PATH nor CUDA_HOME has one" "^nvcc: not found, CPU backend only" "$out"
out=$(PATH=/usr/bin:/bin make -n -B all V=1 CUDA_HOME=/nonexistent 2>&1)
if echo "$out" | grep -q "swarm-cuda.so"; then
    fail=$((fail + 1)); echo "FAIL without nvcc, make still builds the plugin:"; echo "$out" | grep swarm-cuda
else
    pass=$((pass + 1)); echo "ok   without nvcc, no CUDA plugin is built"
fi
if [ -x /usr/local/cuda/bin/nvcc ]; then
    out=$(PATH=/usr/bin:/bin make -n all CUDA_HOME=/usr/local/cuda 2>&1)
    check "nvcc found under CUDA_HOME" "^nvcc: found at /usr/local/cuda/bin/nvcc, building the CUDA plugin" "$out"
    out=$(PATH=/usr/bin:/bin make -n -B build/swarm-cuda.so V=1 CUDA_HOME=/usr/local/cuda 2>&1)
    check "the plugin: sm_75 to sm_90 and PTX" "gencode arch=compute_75,code=sm_75 .*arch=compute_90,code=compute_90" "$out"
    check "the plugin: cudart static and cuBLAS" "-cudart static .*-lcublas" "$out"
    check "the plugin: one exported symbol" "--version-script=blas/cuda.map" "$out"
fi
# make demo and make test install what is missing first: what was detected
# is said by the make that builds after the install (on a fresh machine the
# first make saw no pkg-config and said "pthread", then linked OpenMP's).
# (make -n runs the recipes that call $(MAKE): the order is the real one.)
for goal in demo test; do
    out=$(make -n $goal 2>&1)
    deps_at=$(echo "$out" | grep -n "scripts/deps.sh" | head -1 | cut -d: -f1)
    said_at=$(echo "$out" | grep -n "^openblas: " | head -1 | cut -d: -f1)
    if [ -n "$deps_at" ] && [ -n "$said_at" ] && [ "$said_at" -gt "$deps_at" ] \
       && [ "$(echo "$out" | grep -c "^openblas: ")" -eq 1 ]; then
        pass=$((pass + 1)); echo "ok   make $goal says what it detected once, after make deps"
    else
        fail=$((fail + 1)); echo "FAIL make $goal: not one detection line after make deps:"
        echo "$out" | grep "scripts/deps.sh\|^openblas: \|^nvcc: " | sed 's/^/     /'
    fi
done
# Without the OpenMP build's folder the Makefile takes pkg-config's OpenBLAS,
# and which build that is is pkg-config's to say: Debian's alternatives
# point openblas.pc at the pthread build when both are installed (priority
# 100 to the OpenMP build's 95, whatever the order they came in), unless
# an administrator chose the other.
if pkg-config --variable=openblas_config openblas 2>/dev/null | grep -q USE_OPENMP=1; then
    pc_variant=openmp
else
    pc_variant=pthread
fi
out=$(make -n all OPENBLAS_OMP_DIR=/nonexistent 2>&1)
check "falls back to pkg-config's OpenBLAS without the OpenMP folder (openblas.pc: $pc_variant)" \
    "^openblas: $pc_variant build" "$out"
pc_libs=$(pkg-config --libs openblas 2>/dev/null | sed 's/ *$//')
out=$(make -n -B build/swarm V=1 OPENBLAS_OMP_DIR=/nonexistent 2>&1 | grep -- "-o build/swarm")
if echo "$out" | grep -qF -- " ${pc_libs:--lopenblas} " && ! echo "$out" | grep -q /nonexistent; then
    pass=$((pass + 1)); echo "ok   the fallback links pkg-config's --libs openblas: ${pc_libs:--lopenblas}"
else
    fail=$((fail + 1)); echo "FAIL the fallback does not link pkg-config's '${pc_libs:--lopenblas}':"
    echo "$out" | sed 's/^/     /'
fi
# the status JSON (node/router.c, node/status.c) links what pkg-config says of jansson
jansson_libs=$(pkg-config --libs jansson 2>/dev/null | sed 's/ *$//')
out=$(make -n -B build/swarm build/check_node V=1 2>&1 | grep -- "-o build/\(swarm\|check_node\)$")
if [ "$(echo "$out" | grep -cF -- " ${jansson_libs:--ljansson} ")" -eq 2 ]; then
    pass=$((pass + 1)); echo "ok   swarm and check_node link pkg-config's --libs jansson: ${jansson_libs:--ljansson}"
else
    fail=$((fail + 1)); echo "FAIL swarm and check_node do not both link '${jansson_libs:--ljansson}':"
    echo "$out" | sed 's/^/     /'
fi
omp=/usr/lib/$(gcc -print-multiarch)/openblas-openmp
if [ -f "$omp/libopenblas.so" ]; then
    out=$(make -n -B build/swarm V=1 2>&1 | grep -- "-o build/swarm")
    check "links the OpenMP OpenBLAS when present" "-L$omp" "$out"
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
