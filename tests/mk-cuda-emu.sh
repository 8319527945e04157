#!/bin/sh
# mk-cuda-emu.sh SRC OUT - blas/cuda.cu as plain C++ for the CPU emulation
# (tests/cuda_emu.h): the CUDA headers dropped, every kernel launch
# `k<<<grid, block>>>(args)` rewritten as `emu_launch(emu_cfg(grid, block), k, args)`.
set -e
sed -E -e '/^#include <(cublas_v2|cuda_runtime)\.h>/d' \
    -e 's/([A-Za-z_][A-Za-z0-9_]*)<<<([^>]*)>>>\(/emu_launch(emu_cfg(\2), \1, /g' "$1" >"$2.tmp"
if grep -n '<<<' "$2.tmp" >&2; then
    echo "mk-cuda-emu.sh: a kernel launch above was not rewritten" >&2
    exit 1
fi
mv "$2.tmp" "$2"
