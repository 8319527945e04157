#!/bin/sh
# deps.sh [fuzz|test] - install what swarm needs to build and test, from Debian
# packages. Installs only what is missing (checked with pkg-config and dpkg),
# through sudo when not root. Prints what it does; exits non-zero with the
# fix when it cannot install. `deps.sh fuzz` (make fuzz) also needs clang
# with libFuzzer and its sanitizer runtimes (Debian bookworm: clang and
# libclang-rt-dev, which pulls libclang-rt-14-dev). `deps.sh test` (make
# test) also installs what tests swarm status --serve as its users meet it:
# headless Chromium, a Prometheus server, curl and jq; and g++ (the CUDA
# kernels on the CPU) and iproute2 (test_wan's network namespaces).
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
have_pc jansson || need="$need libjansson-dev"
have_pc libmicrohttpd || need="$need libmicrohttpd-dev"
have_pc check || need="$need check"
# make release links libzmq's C++ runtime and OpenBLAS's Fortran one
# statically: their .a files come with g++ and gfortran, not with gcc, in
# packages named for gcc's version (none is named while gcc is missing: a
# fresh machine gets them once gcc is in, below)
have_a() { f=$(gcc -print-file-name="$1" 2>/dev/null) && [ "$f" != "$1" ] && [ -f "$f" ]; }
static_runtimes() {
    command -v gcc >/dev/null 2>&1 || return 0
    gcc_major=$(gcc -dumpversion)
    gcc_major=${gcc_major%%.*}
    have_a libstdc++.a || printf ' libstdc++-%s-dev' "$gcc_major"
    have_a libgfortran.a || printf ' libgfortran-%s-dev' "$gcc_major"
}
need="$need$(static_runtimes)"
if [ "${1:-}" = test ]; then
    command -v chromium >/dev/null 2>&1 || need="$need chromium"
    { command -v prometheus && command -v promtool; } >/dev/null 2>&1 || need="$need prometheus"
    command -v curl >/dev/null 2>&1 || need="$need curl"
    command -v jq >/dev/null 2>&1 || need="$need jq"
    # without them test_cuda and test_wan say SKIP and check nothing
    command -v "${CXX:-g++}" >/dev/null 2>&1 || need="$need g++"
    command -v ip >/dev/null 2>&1 || need="$need iproute2"
fi
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
    case "${1:-}" in
    fuzz) extras=", clang with libFuzzer" ;;
    test) extras=", chromium, prometheus, curl, jq, g++, iproute2" ;;
    *) extras="" ;;
    esac
    echo "deps: all present (openblas, libzmq, libsodium, jansson, libmicrohttpd, check, pkg-config$extras)"
    exit 0
fi
echo "deps: missing:$need"
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
# what each package is for, on its line of progress
why() {
    case "$1" in
    pkg-config) echo "how make finds the libraries" ;;
    gcc) echo "the C compiler" ;;
    libstdc++-*-dev) echo "the C++ runtime that make release links in, for libzmq" ;;
    libgfortran-*-dev) echo "the Fortran runtime that make release links in, for OpenBLAS" ;;
    make) echo "GNU make, the build" ;;
    libopenblas-dev) echo "OpenBLAS, the matrix products" ;;
    libopenblas-openmp-dev) echo "OpenBLAS's OpenMP build, one thread pool with swarm's loops" ;;
    libzmq3-dev) echo "ZeroMQ, the transport" ;;
    libsodium-dev) echo "libsodium, CurveZMQ keys and BLAKE2b checksums" ;;
    libjansson-dev) echo "jansson, the router's status JSON" ;;
    libmicrohttpd-dev) echo "libmicrohttpd, the web server of swarm status --serve" ;;
    chromium) echo "headless Chromium, to test the dashboard's page as a browser draws it" ;;
    prometheus) echo "Prometheus and promtool, to test the dashboard's /metrics" ;;
    curl) echo "curl, the tests' HTTP client" ;;
    jq) echo "jq, to read JSON in the tests" ;;
    g++) echo "the C++ compiler, to check the CUDA kernels on the CPU in make test" ;;
    iproute2) echo "ip and tc, for the emulated slow links of test_wan" ;;
    check) echo "Check, the unit tests" ;;
    clang) echo "clang, for the libFuzzer targets of make fuzz" ;;
    libclang-rt-dev) echo "clang's libFuzzer and sanitizer runtimes" ;;
    *) case " ${SWARM_EXTRA_DEBS:-} " in
       *" $1 "*) echo "asked for in SWARM_EXTRA_DEBS" ;;
       *) echo "to build and test swarm" ;;
       esac ;;
    esac
}
# apt's own output (hundreds of lines of progress) goes to a log that is
# shown only when apt fails; stdin is /dev/null so that apt never waits on
# a question, and a dpkg lock held by another apt is waited for a minute
log=$(mktemp "${TMPDIR:-/tmp}/swarm-deps.$$.XXXXXX") || exit 1
keep_log=""
from_line=1 # where the last apt-get's output starts in the log
apt_run() {
    echo "== apt-get $*" >>"$log"
    from_line=$(($(wc -l <"$log") + 1))
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=60 "$@" \
        >>"$log" 2>&1 </dev/null
}
# fail_install PACKAGE: the end of apt's log, where it is, the fix; exit 1
fail_install() {
    echo "deps: apt-get install $1 failed; it said (the last 60 lines):" >&2
    tail -n "+$from_line" "$log" | tail -n 60 | sed 's/^/    /' >&2
    echo "deps: the whole log: $log" >&2
    if [ -n "$keep_log" ]; then
        echo "deps: fix: apt-get update could not fetch the package lists (see the log): check the network, a proxy (Acquire::http::Proxy) and the sources in /etc/apt/sources.list, then run 'make deps' again" >&2
    elif grep -q "Unable to locate package\|has no installation candidate" "$log"; then
        from=""
        [ "$(why "$1")" != "asked for in SWARM_EXTRA_DEBS" ] || from=" (it comes from SWARM_EXTRA_DEBS)"
        echo "deps: fix: apt knows no package $1; check the name$from and the sources in /etc/apt/sources.list, then run 'make deps' again" >&2
    elif grep -q "Could not get lock" "$log"; then
        echo "deps: fix: another apt or dpkg holds its lock (unattended-upgrades?); wait for it to finish, then run 'make deps' again" >&2
    else
        echo "deps: fix: check the network and the package sources ('${SUDO:+sudo }apt-get update'), then run 'make deps' again, or install by hand: ${SUDO:+sudo }apt-get install$need" >&2
    fi
    exit 1
}
start=$(date +%s)
echo "deps: apt-get update ..."
# apt-get update exits 0 when it could not fetch a list (a warning): look
if ! apt_run update || tail -n "+$from_line" "$log" | grep -q '^W: Failed to fetch\|^E: '; then
    echo "deps: apt-get update could not fetch every package list (its output: $log); trying with the lists there are" >&2
    keep_log=1
fi
# Debian 12 and later ship clang's sanitizer and libFuzzer runtimes apart
if [ -n "${fuzz_rt:-}" ] && apt-cache show libclang-rt-dev >/dev/null 2>&1; then
    need="$need libclang-rt-dev"
fi
count=0
install_each() {
    for pkg in "$@"; do
        echo "deps: installing $pkg ($(why "$pkg")) ..."
        apt_run install -y --no-install-recommends "$pkg" || fail_install "$pkg"
        count=$((count + 1))
    done
}
install_each $need
# shellcheck disable=SC2046 # (a word a package)
case " $need " in
*" gcc "*) install_each $(static_runtimes) ;; # (gcc is in now: its version's)
esac
[ -n "$keep_log" ] || rm -f "$log"
echo "deps: done ($count package$([ $count -eq 1 ] || echo s) in $(($(date +%s) - start)) s)"
