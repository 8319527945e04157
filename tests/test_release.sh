#!/bin/sh
# test_release.sh BUILD - `make release`: BUILD/release/swarm-linux-x86_64
# needs only glibc (its NEEDED list, what ldd finds, no RPATH), and runs
# where no other library exists: in a bare root holding the file and the
# glibc files it names (chroot as root, else in a user namespace, else SKIP),
# it trains 3 steps to the same losses as BUILD/swarm, and a router and a
# node started from it train 2 steps over loopback, the node joining with the
# line the router prints. SWARM_RELEASE=FILE tests FILE instead of building
# one (SWARM_RELEASE=build/swarm must fail). Ends with "N passed, N failed".
unset MAKELEVEL MAKEFLAGS MFLAGS MAKEOVERRIDES
BUILD=${1:-build}
. tests/lib.sh

# what glibc installs; anything else in NEEDED is a library a volunteer lacks
GLIBC_LIBS="ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libmvec.so.1 libdl.so.2 libpthread.so.0 librt.so.1 libresolv.so.2 libutil.so.1"
is_glibc() { case " $GLIBC_LIBS " in *" $1 "*) return 0 ;; esac; return 1; }

# ---- the build -------------------------------------------------------------
if [ -n "${SWARM_RELEASE:-}" ]; then
    REL=$SWARM_RELEASE
    echo "testing $REL (SWARM_RELEASE), not building one"
else
    REL="$BUILD/release/swarm-linux-x86_64"
    start=$(date +%s)
    # (and BUILD/swarm, from the same objects, for the losses below)
    if make --no-print-directory BUILD="$BUILD" release "$BUILD/swarm" >"$TMP/make.log" 2>&1 && [ -x "$REL" ]; then
        ok "make BUILD=$BUILD release in $(($(date +%s) - start)) s: $(grep -m1 '^release: ' "$TMP/make.log")"
    else
        bad "make BUILD=$BUILD release:"; tail -20 "$TMP/make.log"
        lib_done; exit 1
    fi
fi

# ---- what it needs -----------------------------------------------------------
if ! readelf -d "$REL" >"$TMP/dynamic.txt" 2>&1; then
    bad "readelf -d $REL:"; cat "$TMP/dynamic.txt"
    lib_done; exit 1
fi
needed=$(sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' "$TMP/dynamic.txt" | tr '\n' ' ')
others=""
for lib in $needed; do is_glibc "$lib" || others="$others $lib"; done
if [ -z "$others" ]; then
    ok "NEEDED is glibc only: ${needed:-nothing}"
else
    bad "NEEDED has libraries beyond glibc:$others (all: $needed)"
fi
if grep -qE '\((RPATH|RUNPATH)\)' "$TMP/dynamic.txt"; then
    bad "it has a library path of the build machine: $(grep -E 'RPATH|RUNPATH' "$TMP/dynamic.txt")"
else
    ok "no RPATH or RUNPATH"
fi
# ldd: every library it loads, also the ones NEEDED's libraries need
ldd "$REL" >"$TMP/ldd.txt" 2>&1
loaded=$(awk '$2 == "=>" { print $1 } $1 ~ /^\// { n = split($1, p, "/"); print p[n] }' "$TMP/ldd.txt" | tr '\n' ' ')
others=""
for lib in $loaded; do is_glibc "$lib" || others="$others $lib"; done
if [ -n "$loaded" ] && [ -z "$others" ] && ! grep -q "not found" "$TMP/ldd.txt"; then
    ok "ldd loads glibc only: $loaded"
else
    bad "ldd loads more than glibc:$others"; sed 's/^/     /' "$TMP/ldd.txt"
fi
interp=$(readelf -l "$REL" 2>/dev/null | sed -n 's/.*Requesting program interpreter: \(.*\)\]/\1/p')
if [ "$interp" = /lib64/ld-linux-x86-64.so.2 ]; then
    ok "program interpreter $interp"
else
    bad "program interpreter '$interp', not /lib64/ld-linux-x86-64.so.2"
fi
if "$REL" --help 2>&1 | grep -q "^usage: swarm COMMAND"; then
    ok "--help says what it is: $("$REL" --help 2>&1 | head -1)"
else
    bad "--help:"; "$REL" --help 2>&1 | head -5
fi

# ---- a bare root: the file and the glibc files ldd names, nothing else --------
ROOT="$TMP/root"
mkdir -p "$ROOT/home"
cp "$REL" "$ROOT/swarm-linux-x86_64"
for path in $(awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' "$TMP/ldd.txt"); do
    is_glibc "$(basename "$path")" || continue
    mkdir -p "$ROOT$(dirname "$path")"
    cp -L "$path" "$ROOT$path"
done
[ -n "$interp" ] && [ -e "$interp" ] && [ ! -e "$ROOT$interp" ] && mkdir -p "$ROOT$(dirname "$interp")" \
    && cp -L "$interp" "$ROOT$interp"
# $IN runs a command in the root, with an empty environment but for HOME;
# env, chroot and unshare each exec the next, so $! is the swarm process
# (a shell function run with & would leave it behind when killed)
IN="env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/home SWARM_PLAIN=1"
if [ "$(id -u)" = 0 ]; then
    IN="$IN chroot $ROOT"
else
    IN="$IN unshare -r chroot $ROOT"
fi
# the loader alone runs in the root: if not, chroot itself is what fails
# shellcheck disable=SC2086
if ! $IN "${interp:-/lib64/ld-linux-x86-64.so.2}" --version >"$TMP/probe.txt" 2>&1; then
    echo "SKIP the bare-root runs: '$IN' cannot run the loader here ($(head -1 "$TMP/probe.txt"));" \
        "run as root for them"
    lib_done; exit
fi
files=$(cd "$ROOT" && find . -type f | sort | tr '\n' ' ')
ok "a bare root with $(echo "$files" | wc -w) files: $files"

# shellcheck disable=SC2086
if $IN /swarm-linux-x86_64 --help >"$TMP/help.txt" 2>&1 && grep -q "^usage: swarm COMMAND" "$TMP/help.txt"; then
    ok "in the bare root, --help runs"
else
    bad "in the bare root, --help:"; head -5 "$TMP/help.txt"
fi

# 3 steps of the default model on the built-in corpus, as BUILD/swarm trains them
TRAIN="--steps 3 --iters 3 --eval-every 0 --threads 1 --device cpu --quiet"
# shellcheck disable=SC2086
if $IN /swarm-linux-x86_64 train $TRAIN --loss-log /train.txt >"$TMP/train.log" 2>&1 \
    && [ "$(wc -l <"$ROOT/train.txt" 2>/dev/null)" -eq 3 ]; then
    ok "in the bare root, train runs 3 steps: $(tr '\n' ' ' <"$ROOT/train.txt")"
else
    bad "in the bare root, train:"; sed 's/^/     /' "$TMP/train.log"
fi
if [ -x "$BUILD/swarm" ] && [ -s "$ROOT/train.txt" ]; then
    # shellcheck disable=SC2086
    "$BUILD/swarm" train $TRAIN --loss-log "$TMP/ref.txt" >/dev/null 2>&1
    check_losses "$ROOT/train.txt" "$TMP/ref.txt" 3 "(release in a bare root vs $BUILD/swarm)"
fi

# a router and one node, both the release file in the bare root, on loopback
# shellcheck disable=SC2086
$IN /swarm-linux-x86_64 router --listen tcp://127.0.0.1:0 --stages 1 --steps 2 --iters 2 \
    --eval-every 0 --threads 1 --log-every 1 --loss-log /swarm.txt >"$TMP/router.log" 2>&1 &
router=$!
pids="$pids $router"
if ! endpoint=$(wait_endpoint "$TMP/router.log"); then
    bad "in the bare root, the router did not start:"; sed 's/^/     /' "$TMP/router.log"
    lib_done; exit 1
fi
# the first line a volunteer is told to run, less a closing "  (comment)":
# word by word, what a shell makes of it pasted in must be the words as
# printed, less their quotes (a bare $, &, ( or ; is not)
join=$(sed -n 's/^ *swarm node \(--join .*\)$/\1/p' "$TMP/router.log" | head -1 | sed 's/   *(.*)$//')
set -f
# shellcheck disable=SC2086
meant=$(printf '%s\n' ${join:---join $endpoint} | sed "s/^'\(.*\)'\$/\1/")
set +f
said=$( (eval "printf '%s\n' $join") 2>/dev/null)
if [ -n "$join" ] && [ "$said" = "$meant" ]; then
    eval "set -- $join"
    ok "the router prints a join line that pastes into a shell: swarm node $join"
else
    bad "no join line that pastes into a shell as it is (a shell reads '$(echo "$said" | tr '\n' ' ')'):"
    sed 's/^/     /' "$TMP/router.log"
    set -f
    oldifs=$IFS
    IFS='
'
    # shellcheck disable=SC2086
    set -- $meant
    IFS=$oldifs
    set +f
fi
# shellcheck disable=SC2086
$IN /swarm-linux-x86_64 node "$@" --threads 1 >"$TMP/node.log" 2>&1 &
node=$!
pids="$pids $node"
# until the router is done (the node stays, waiting for the next router)
for _ in $(seq 1 600); do
    if ! kill -0 "$router" 2>/dev/null || ! kill -0 "$node" 2>/dev/null; then break; fi
    sleep 0.1
done
kill -0 "$router" 2>/dev/null && { sleep 1; kill -TERM "$router"; }
wait "$router"
rc=$?
if clean_run "$rc" "$TMP/router.log" && [ "$(wc -l <"$ROOT/swarm.txt" 2>/dev/null)" -eq 2 ]; then
    ok "in the bare root, a router and a node train 2 steps: $(tr '\n' ' ' <"$ROOT/swarm.txt")"
else
    bad "in the bare root, router and node (router exit $rc):"
    sed 's/^/     router: /' "$TMP/router.log"; sed 's/^/     node: /' "$TMP/node.log"
fi
if grep -q "node key /home/.config/swarm/node.key (new)" "$TMP/node.log"; then
    ok "the node made itself a key pair: $(grep -o 'node key .*(new)' "$TMP/node.log")"
else
    bad "the node's first key pair:"; sed 's/^/     /' "$TMP/node.log"
fi
kill -INT "$node" 2>/dev/null
wait_exit "$node" 10

# the dashboard in the bare root: its page is in the file, its HTTP server
# (libmicrohttpd, linked without GnuTLS) answers, and with no router there
# /api/state says why
key=$(sed -n 's/^swarm router: public key \(.*\)$/\1/p' "$TMP/router.log")
# shellcheck disable=SC2086
$IN /swarm-linux-x86_64 status tcp://127.0.0.1:9 --router-key "$key" --serve 127.0.0.1:0 \
    >"$TMP/dash.log" 2>&1 &
dash=$!
pids="$pids $dash"
wait_grep "$TMP/dash.log" "dashboard at http://" 10
url=$(sed -n 's|^swarm status: dashboard at \(http://[0-9.:]*/\).*|\1|p' "$TMP/dash.log")
if [ -n "$url" ] && curl -s --max-time 5 "$url" | grep -q "<title>swarm</title>" \
    && curl -s --max-time 5 "${url}api/state" | grep -q '"error": "no answer from tcp://127.0.0.1:9'; then
    ok "in the bare root, swarm status --serve serves its page and /api/state at $url"
else
    bad "in the bare root, swarm status --serve:"; sed 's/^/     /' "$TMP/dash.log"
fi
kill "$dash" 2>/dev/null

lib_done
