#!/bin/sh
# bench-net.sh BUILD - net's benchmark: CurveZMQ round trips and throughput
# on loopback (1 KiB and 4 MiB messages) and each tensor codec's MB/s.
# Prints the machine it ran on first; never part of make test.
set -eu
BUILD=${1:-build}
if [ ! -x "$BUILD/bench_net" ]; then
    echo "bench-net: $BUILD/bench_net missing; run: make bench-net" >&2
    exit 1
fi
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -1)
echo "bench-net: $(uname -m), ${cpu:-unknown CPU}, $(nproc) cores," \
     "libzmq $(pkg-config --modversion libzmq 2>/dev/null || echo '?')," \
     "libsodium $(pkg-config --modversion libsodium 2>/dev/null || echo '?')"
[ $# -gt 0 ] && shift
"$BUILD/bench_net" "$@"
