#!/bin/sh
# test_deps.sh [BUILD] - scripts/deps.sh as make deps runs it: one line per
# step while apt's hundreds of lines go to a log; when apt fails, what it
# said, where its log is and the fix; sudo when not root; a clear error
# without root or apt-get. apt-get, sudo and id are stand-ins on PATH, so it
# needs neither root nor the network and installs nothing (the packages are
# SWARM_EXTRA_DEBS that no machine has). Ends with "N passed, N failed".
. tests/lib.sh

mkdir -p "$TMP/bin" "$TMP/tmp"
# the stand-in apt-get: 200 lines of progress and a warning a call, each
# call in $TMP/calls; `update` fails with STUB_FAIL_UPDATE=exit, fetches
# nothing but exits 0 with STUB_FAIL_UPDATE=warn (as apt-get does without a
# network); `install` of a package named no-such-* fails as apt's does
cat >"$TMP/bin/apt-get" <<'EOF'
#!/bin/sh
echo "apt-get $* (DEBIAN_FRONTEND=${DEBIAN_FRONTEND:-})" >>"$STUB_CALLS"
i=0
while [ $i -lt 200 ]; do echo "Get:$i http://deb.example.org/debian stub/main [1 kB]"; i=$((i + 1)); done
echo "W: stub warning" >&2
case " $* " in
*" update "*)
    case "${STUB_FAIL_UPDATE:-}" in
    exit) echo "E: stub: could not resolve deb.example.org" >&2; exit 100 ;;
    warn) echo "W: Failed to fetch http://deb.example.org/debian/InRelease  Temporary failure resolving 'deb.example.org'" >&2 ;;
    esac ;;
*" install "*)
    for a in "$@"; do
        case "$a" in no-such-*) echo "E: Unable to locate package $a" >&2; exit 100 ;; esac
        # with STUB_GCC_DIR, installing gcc puts a gcc 12 there whose
        # libstdc++.a and libgfortran.a are not found
        if [ "$a" = gcc ] && [ -n "${STUB_GCC_DIR:-}" ]; then
            printf '#!/bin/sh\ncase "$1" in\n-dumpversion) echo 12.2.0 ;;\n-print-file-name=*) echo "${1#-print-file-name=}" ;;\n-print-multiarch) echo x86_64-linux-gnu ;;\nesac\n' >"$STUB_GCC_DIR/gcc"
            chmod +x "$STUB_GCC_DIR/gcc"
        fi
    done ;;
esac
exit 0
EOF
# sudo runs the command and says so; id -u is STUB_UID (0 unless set)
# shellcheck disable=SC2016
printf '#!/bin/sh\necho "sudo $*" >>"$STUB_CALLS"\nexec "$@"\n' >"$TMP/bin/sudo"
# shellcheck disable=SC2016
printf '#!/bin/sh\n[ "$1" = -u ] && { echo "${STUB_UID:-0}"; exit 0; }\nexec /usr/bin/id "$@"\n' >"$TMP/bin/id"
chmod +x "$TMP/bin/apt-get" "$TMP/bin/sudo" "$TMP/bin/id"
# a PATH with what deps.sh runs but no apt-get and no sudo
mkdir -p "$TMP/bare"
for t in sh pkg-config dpkg-query grep gcc cc make mktemp date tail sed rm wc env cat; do
    p=$(command -v "$t") && ln -s "$p" "$TMP/bare/$t"
done
ln -s "$TMP/bin/id" "$TMP/bare/id"

# deps EXTRA_DEBS [VAR=VALUE...]: run deps.sh with the stand-ins (at most
# 30 s): its output in $TMP/out, exit status in $rc, time in $secs
deps() {
    extra=$1
    shift
    : >"$TMP/calls"
    t0=$(date +%s)
    env PATH="$TMP/bin:$PATH" TMPDIR="$TMP/tmp" STUB_CALLS="$TMP/calls" SWARM_EXTRA_DEBS="$extra" "$@" \
        timeout 30 sh scripts/deps.sh >"$TMP/out" 2>&1
    rc=$?
    secs=$(($(date +%s) - t0))
}
show() { sed 's/^/     /' "$TMP/out"; }

# ---- apt succeeds: a line a step, nothing of apt's, no log left ----
deps "swarm-stub-a swarm-stub-b"
n=$(sed -n 's/^deps: missing:\(.*\)$/\1/p' "$TMP/out" | wc -w)
if [ $rc -eq 0 ] && [ "$n" -ge 2 ] && [ "$(wc -l <"$TMP/out")" -eq $((n + 3)) ] \
    && ! grep -qv '^deps: ' "$TMP/out" \
    && grep -qx 'deps: apt-get update \.\.\.' "$TMP/out" \
    && grep -qx 'deps: installing swarm-stub-a (asked for in SWARM_EXTRA_DEBS) \.\.\.' "$TMP/out" \
    && grep -q "^deps: done ($n packages in [0-9]* s)$" "$TMP/out"; then
    ok "apt's $(((n + 1) * 201)) lines stay out: $n packages, $((n + 3)) lines of deps:"
else
    bad "deps.sh with apt succeeding (exit $rc):"; show
fi
if [ -z "$(ls "$TMP/tmp")" ]; then
    ok "no log left behind when apt succeeded"
else
    bad "a log left behind when apt succeeded: $(ls "$TMP/tmp")"
fi
if grep -q '^apt-get .*update (DEBIAN_FRONTEND=noninteractive)$' "$TMP/calls" \
    && grep -q '^apt-get .*install -y --no-install-recommends swarm-stub-b (DEBIAN_FRONTEND=noninteractive)$' "$TMP/calls" \
    && ! grep -q '^sudo' "$TMP/calls"; then
    ok "as root: apt-get update, then apt-get install of each package, non-interactive, no sudo"
else
    bad "apt-get calls as root:"; sed 's/^/     /' "$TMP/calls"
fi

# ---- apt fails: what it said, the log, the fix; quickly ----
deps "swarm-stub-a no-such-package-xyz"
log=$(sed -n 's/^deps: the whole log: //p' "$TMP/out")
n=$(sed -n 's/^deps: missing:\(.*\)$/\1/p' "$TMP/out" | wc -w) # calls: update, then n installs
if [ $rc -eq 1 ] && [ "$secs" -le 10 ] \
    && grep -q '^deps: apt-get install no-such-package-xyz failed' "$TMP/out" \
    && grep -qx '    E: Unable to locate package no-such-package-xyz' "$TMP/out" \
    && grep -q "^deps: fix: apt knows no package no-such-package-xyz; check the name (it comes from SWARM_EXTRA_DEBS)" "$TMP/out" \
    && [ "$(wc -l <"$TMP/out")" -le 70 ]; then
    ok "a failing install shows apt's last lines and the fix (exit 1 in $secs s, $(wc -l <"$TMP/out") lines)"
else
    bad "deps.sh with apt failing (exit $rc in $secs s):"; show
fi
if [ -n "$log" ] && [ -f "$log" ] && [ "$(grep -c '^Get:' "$log")" -eq $(((n + 1) * 200)) ] \
    && ! grep -q '^    Get:[0-9]* .*swarm-stub-a' "$TMP/out" \
    && [ "$(grep -c '^    Get:' "$TMP/out")" -le 60 ]; then
    ok "the failure names its log ($log: every line of apt's $((n + 1)) calls), shows only the failing call's end"
else
    bad "the failure's log '$log':"; show
fi

# ---- apt-get update fails: said once, installs go on, the log is kept ----
for how in exit warn; do
    deps "swarm-stub-a" STUB_FAIL_UPDATE=$how
    log=$(sed -n 's/^deps: apt-get update could not fetch every package list (its output: \(.*\)); trying with the lists there are$/\1/p' "$TMP/out")
    if [ $rc -eq 0 ] && [ -n "$log" ] && grep -q "stub: could not resolve\|Temporary failure resolving" "$log" \
        && grep -q '^deps: done (' "$TMP/out" && ! grep -qv '^deps: ' "$TMP/out"; then
        ok "apt-get update failing ($how) is one line naming its log, and the installs go on"
    else
        bad "deps.sh with apt-get update failing ($how, exit $rc):"; show
    fi
done
deps "no-such-package-xyz" STUB_FAIL_UPDATE=warn
if [ $rc -eq 1 ] && grep -q "^deps: fix: apt-get update could not fetch the package lists" "$TMP/out"; then
    ok "an install failing after a failed apt-get update: $(grep '^deps: fix' "$TMP/out" | cut -c1-80)..."
else
    bad "deps.sh failing after a failed apt-get update (exit $rc):"; show
fi

# ---- no gcc (a fresh machine): gcc, then its version's static runtimes ----
mkdir -p "$TMP/nogcc"
for t in sh pkg-config dpkg-query grep make mktemp date tail sed rm wc env cat timeout printf chmod; do
    p=$(command -v "$t") && ln -sf "$p" "$TMP/nogcc/$t"
done
ln -sf "$TMP/bin/apt-get" "$TMP/nogcc/apt-get"
ln -sf "$TMP/bin/id" "$TMP/nogcc/id"
: >"$TMP/calls"
env PATH="$TMP/nogcc" TMPDIR="$TMP/tmp" STUB_CALLS="$TMP/calls" STUB_GCC_DIR="$TMP/nogcc" \
    SWARM_EXTRA_DEBS= timeout 30 sh scripts/deps.sh >"$TMP/out" 2>&1
rc=$?
installs=$(sed -n 's/^apt-get .*install -y --no-install-recommends \([^ ]*\) .*/\1/p' "$TMP/calls" | tr '\n' ' ')
case "$installs" in
*"gcc libstdc++-12-dev libgfortran-12-dev "*) got=1 ;;
*) got= ;;
esac
if [ $rc -eq 0 ] && [ -n "$got" ] && grep -q '^deps: installing libgfortran-12-dev (the Fortran runtime' "$TMP/out"; then
    ok "no gcc: gcc, then gcc 12's static runtimes for make release ($installs)"
else
    bad "deps.sh without gcc (exit $rc, installs: $installs):"; show
fi

# ---- not root: through sudo; without sudo or apt-get, the fix ----
deps "swarm-stub-a" STUB_UID=1000
if [ $rc -eq 0 ] && grep -q '^sudo env DEBIAN_FRONTEND=noninteractive apt-get .*install .*swarm-stub-a$' "$TMP/calls"; then
    ok "not root: apt-get through sudo"
else
    bad "deps.sh not root (exit $rc):"; show; sed 's/^/     /' "$TMP/calls"
fi
env PATH="$TMP/bare" STUB_UID=1000 SWARM_EXTRA_DEBS=swarm-stub-a sh scripts/deps.sh >"$TMP/out" 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q '^deps: run as root: apt-get install.* swarm-stub-a$' "$TMP/out"; then
    ok "not root and no sudo: $(grep '^deps: run as root' "$TMP/out")"
else
    bad "deps.sh not root, no sudo (exit $rc):"; show
fi
env PATH="$TMP/bare" SWARM_EXTRA_DEBS=swarm-stub-a sh scripts/deps.sh >"$TMP/out" 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q '^deps: no apt-get here; install the equivalents of:.* swarm-stub-a$' "$TMP/out"; then
    ok "no apt-get: $(grep '^deps: no apt-get' "$TMP/out")"
else
    bad "deps.sh without apt-get (exit $rc):"; show
fi
lib_done
