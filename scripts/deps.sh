#!/bin/sh
# deps.sh [fuzz] - install what swarm needs to build and test, from Debian
# packages. Installs only what is missing (checked with pkg-config and dpkg),
# through sudo when not root. Prints what it does; exits non-zero with the
# fix when it cannot install. `deps.sh fuzz` (make fuzz) also needs clang
# with libFuzzer and its sanitizer runtimes (Debian bookworm: clang and
# libclang-rt-dev, which pulls libclang-rt-14-dev).
set -eu

need=""
have_pc() { command -v pkg-config >/dev/null 2>&1 && pkg-config --exists "$1"; }
have_deb() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed"; }

command -v pkg-config >/dev/null 2>&1 || need="$need pkg-config"
command -v cc >/dev/null 2>&1 || need="$need gcc"
command -v make >/dev/null 2>&1 || need="$need make"
have_pc openblas || need="$need libopenblas-dev"
# the OpenMP build of OpenBLAS shares one thread pool with swarm's own loops
[ -d /usr/lib/"$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)"/openblas-openmp ] \
    || have_deb libopenblas-openmp-dev || need="$need libopenblas-openmp-dev"
have_pc libzmq || need="$need libzmq3-dev"
have_pc libsodium || need="$need libsodium-dev"
have_pc check || need="$need check"
for extra in ${SWARM_EXTRA_DEBS:-}; do have_deb "$extra" || need="$need $extra"; done
if [ "${1:-}" = fuzz ]; then
    # a libFuzzer target links only when clang finds libclang_rt.fuzzer
    probe=$(mktemp -d)
    printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n);\n%s\n' \
        'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void) d; (void) n; return 0; }' \
        >"$probe/probe.c"
    if ! clang -fsanitize=fuzzer,address,undefined "$probe/probe.c" -o "$probe/probe" >/dev/null 2>&1; then
        need="$need clang"
        fuzz_rt=1 # and the runtimes' package, where the release has one (after apt-get update)
    fi
    rm -rf "$probe"
fi

if [ -z "$need" ]; then
    echo "deps: all present (openblas, libzmq, libsodium, check, pkg-config${1:+, clang with libFuzzer})"
    exit 0
fi
echo "deps: installing:$need"
if [ "$(id -u)" = 0 ]; then
    SUDO=""
elif command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
else
    echo "deps: need root to install:$need" >&2
    echo "deps: run as root: apt-get install$need" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "deps: no apt-get here; install the equivalents of:$need" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq || echo "deps: apt-get update failed; trying with the current package lists" >&2
# Debian 12 and later ship clang's sanitizer and libFuzzer runtimes apart
if [ -n "${fuzz_rt:-}" ] && apt-cache show libclang-rt-dev >/dev/null 2>&1; then
    need="$need libclang-rt-dev"
fi
# shellcheck disable=SC2086
if ! $SUDO apt-get install -y -qq --no-install-recommends $need; then
    echo "deps: apt-get install failed for:$need" >&2
    echo "deps: check the network and package sources, then run 'make deps' again" >&2
    exit 1
fi
echo "deps: done"
