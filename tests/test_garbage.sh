#!/bin/sh
# test_garbage.sh BUILD - garbage on the router's port changes nothing: a
# router and 2 nodes of the tiny model, all built with AddressSanitizer
# (make asan), train while tests/garbage.c floods the port for
# GARBAGE_TIME seconds (default 30): raw TCP junk and broken handshakes,
# and Curve clients of an open swarm sending random well-formed headers,
# truncated and oversized messages. Then: no crash, no ASan or LSan report
# in any log, the router still answers `swarm status`, its log stayed
# bounded, and every step's loss equals `swarm train`'s.
# Needs an ASan build; with another it says SKIP. Ends with "N passed, N failed".
BUILD=${1:-build-asan}
SWARM="$BUILD/swarm"
GARBAGE="$BUILD/garbage"
GARBAGE_TIME=${GARBAGE_TIME:-30}
. tests/lib.sh

if ! ldd "$SWARM" 2>/dev/null | grep -q libasan; then
    echo "SKIP: $SWARM is not an AddressSanitizer build (make asan runs this test)"
    lib_done; exit 0
fi
if [ ! -x "$GARBAGE" ]; then
    bad "$GARBAGE missing (make asan builds it)"
    lib_done; exit 1
fi
# leaks count as errors; every report goes to the process's log
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:exitcode=86"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="exitcode=86"

head -c 30000 "$BUILD/corpus.txt" >"$TMP/data.txt"
# a schedule no run here finishes: the router is stopped once the garbage
# is over, and its steps compared with the same schedule's in swarm train
TINY="--layers 2 --heads 4 --embd 32 --block 16 --batch 4 --micro-batch 2 --iters 100000 --warmup 2 --lr 1e-3 --eval-every 0 --data $TMP/data.txt"

"$SWARM" keygen "$TMP/router" >/dev/null
# shellcheck disable=SC2086
SWARM_PLAIN=1 "$SWARM" router $TINY --stages 2 --min-nodes 2 --listen "tcp://127.0.0.1:0" \
    --key "$TMP/router" --loss-log "$TMP/swarm.txt" --log-every 50 >"$TMP/router.log" 2>&1 &
router=$!
pids="$router"
if ! endpoint=$(wait_endpoint "$TMP/router.log"); then
    bad "router did not start:"; cat "$TMP/router.log"
    lib_done; exit 1
fi
for i in 1 2; do
    "$SWARM" keygen "$TMP/node$i" >/dev/null
    "$SWARM" node --join "$endpoint" --router-key "$TMP/router.pub" --key "$TMP/node$i" \
        --threads 1 --name "node$i" --slowdown 4 >"$TMP/node$i.log" 2>&1 &
    eval "pid_node$i=$!"
    pids="$pids $!"
done
if wait_grep "$TMP/router.log" "training from step 0" 60; then
    ok "router (open swarm) and 2 nodes train, all under ASan"
else
    bad "no training:"; tail -20 "$TMP/router.log"
fi

rpub=$(grep -v '^#' "$TMP/router.pub" | head -1 | tr -d '[:space:]')
"$GARBAGE" "$endpoint" "$rpub" "$GARBAGE_TIME" 7 >"$TMP/garbage.log" 2>&1
rc=$?
if [ $rc -eq 0 ]; then
    ok "garbage for $GARBAGE_TIME s: $(sed 's/^garbage: //' "$TMP/garbage.log")"
else
    bad "garbage exit $rc:"; cat "$TMP/garbage.log"
fi

if kill -0 "$router" 2>/dev/null \
    && "$SWARM" status "$endpoint" --router-key "$TMP/router.pub" >"$TMP/status.out" 2>&1 \
    && grep -q "training" "$TMP/status.out"; then
    ok "the router still answers swarm status: $(head -1 "$TMP/status.out")"
else
    bad "status after the garbage:"; cat "$TMP/status.out"; tail -20 "$TMP/router.log"
fi

# stop the run: the router says BYE, the nodes stay; then the nodes leave
kill -INT "$router"
wait_exit "$router" 30 || bad "router did not stop on SIGINT"
wait "$router"
rc=$?
for i in 1 2; do eval "kill -INT \$pid_node$i"; done
for i in 1 2; do
    eval "pid=\$pid_node$i"
    wait_exit "$pid" 30 || bad "node$i did not stop on SIGINT"
    wait "$pid" || bad "node$i exit $? (86: a sanitizer report)"
done
if [ $rc -eq 1 ] && grep -q "^swarm router: stopped" "$TMP/router.log" \
    && ! grep -q "^swarm router: peer .*\(dead\|dropped\)" "$TMP/router.log"; then
    ok "router stopped on SIGINT after $(grep -c . "$TMP/swarm.txt") steps; no node was lost"
else
    bad "router exit $rc:"; tail -20 "$TMP/router.log"
fi
# the garbage never joins (no valid HELLO): no peer of it, and neither node,
# may be lost, banned or refused, and nothing rolls back
check_log "the log: no peer lost, banned or refused; no rollback" "$TMP/router.log" 0

reports=$(grep -l -E "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:" \
    "$TMP"/router.log "$TMP"/node*.log "$TMP"/garbage.log 2>/dev/null)
if [ -z "$reports" ]; then
    ok "no AddressSanitizer, LeakSanitizer or UBSan report in any log"
else
    bad "sanitizer reports in: $reports"
    for f in $reports; do grep -A20 -E "ERROR: |runtime error:" "$f" | head -40; done
fi

# a flood is a line a second per sender and 10 a second in all, not a line a message
lines=$(grep -c "^swarm router: \(bad message\|refused\|.* never said HELLO\)" "$TMP/router.log")
limit=$((20 + 11 * (GARBAGE_TIME + 5)))
if [ "$lines" -le "$limit" ] && grep -q "similar lines not shown" "$TMP/router.log"; then
    ok "$lines log lines about the garbage (at most $limit): $(grep -m1 "similar lines not shown" "$TMP/router.log")"
else
    bad "$lines log lines about the garbage, limit $limit"
fi

steps=$(awk '{ print $1 }' "$TMP/swarm.txt" | sort -un | wc -l)
# shellcheck disable=SC2086
"$SWARM" train $TINY --threads 1 --quiet --steps "$steps" --loss-log "$TMP/train.txt" \
    >/dev/null 2>&1 || bad "swarm train reference run"
if [ "$steps" -ge 5 ] && losses_match "$TMP/swarm.txt" "$TMP/train.txt" "$steps"; then
    ok "all $steps steps' losses equal swarm train's to 1e-4 relative"
else
    bad "losses differ ($steps steps):"; paste -d' ' "$TMP/swarm.txt" "$TMP/train.txt" | head -20
fi
lib_done
