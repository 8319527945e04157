#!/bin/sh
# test_wan.sh BUILD - the swarm over emulated internet links
# (scripts/wan-swarm.sh: a network namespace per process, each node's link
# 20 ms each way with 1% of its segments lost). Needs root and network
# namespaces; skipped with a message otherwise.
#  - fp32 on the wire: 10 steps of the tiny model on 2 stages have every
#    step's loss equal to `swarm train`'s (to 1e-4 relative);
#  - fp16 and int8 on the wire: the runs train, and every step's loss stays
#    within a relative TOL of the fp32 run's: fp16 1e-3 (twice its rounding
#    of one value, 2^-11), int8 4e-3 (about its bound on one value, 1/254 of
#    its block's largest). Errors of opposite signs mostly cancel in a loss,
#    so these are loose: the measured differences are 1.6e-5 and 2.4e-4;
#  - a third node joining mid-run over 2 Mbit/s links (its stage's state
#    takes longer than a step) loads the current step's state and serves,
#    and the losses stay swarm train's.
# Ends with "N passed, N failed".
BUILD=${1:-build}
SWARM="$BUILD/swarm"
. tests/lib.sh

if [ "$(id -u)" -ne 0 ]; then
    echo "SKIP test_wan: needs root (network namespaces); run make test as root to include it"
    lib_done
    exit 0
fi
if ! ip netns add "swtest$$" 2>/dev/null; then
    echo "SKIP test_wan: network namespaces are not available here (ip netns add failed)"
    lib_done
    exit 0
fi
ip netns del "swtest$$"

# refused, with the reason, when not root (and nothing made)
if command -v setpriv >/dev/null; then
    if setpriv --reuid=65534 --regid=65534 --clear-groups sh scripts/wan-swarm.sh -n 2 -s 2 \
        >"$TMP/noroot.out" 2>&1; then
        bad "wan-swarm.sh ran as nobody"
    elif grep -q "needs root" "$TMP/noroot.out"; then
        ok "not root: $(cat "$TMP/noroot.out")"
    else
        bad "wan-swarm.sh as nobody:"; cat "$TMP/noroot.out"
    fi
fi

head -c 30000 "$BUILD/corpus.txt" >"$TMP/data.txt"
TINY="--layers 2 --heads 4 --embd 32 --block 16 --batch 4 --micro-batch 2 --warmup 2 --lr 1e-2 --eval-every 0 --data $TMP/data.txt"
# shellcheck disable=SC2086
"$SWARM" train $TINY --iters 10 --threads 1 --quiet --loss-log "$TMP/train.txt" >/dev/null 2>&1 \
    || bad "swarm train reference run"

# wan WIRE: 10 steps through the emulated links, losses in $TMP/WIRE.txt
# (KEEP=1: local-swarm.sh keeps the router's whole log, in a folder under $TMP)
wan() {
    # shellcheck disable=SC2086
    KEEP=1 TMPDIR="$TMP" TIMEOUT=60 timeout 90 sh scripts/wan-swarm.sh --build "$BUILD" -n 2 -s 2 --steps 10 \
        --delay 20ms --loss 1% $TINY --wire "$1" --loss-log "$TMP/$1.txt" >"$TMP/$1.log" 2>&1
}
# wan_log OUT WHAT: nothing was faulted (lossy, slow links are no fault):
# the router's log kept from OUT's run has no node lost, banned or refused,
# and no rollback
wan_log() {
    cl_log="$(kept_dir "$1")/router.log"
    if [ ! -s "$cl_log" ]; then
        bad "$2: no router log kept ('$cl_log')"
    else
        check_log "$2, the log: no node lost, banned or refused; no rollback" "$cl_log" 0
    fi
}

wan fp32
rc=$?
how=$(sed -n 's/.*; shaped by \([a-z/]*\).*/\1/p' "$TMP/fp32.log" | head -1)
if [ $rc -eq 0 ] && losses_match "$TMP/fp32.txt" "$TMP/train.txt" 10; then
    ok "20 ms links, 1% loss ($how), fp32: every step's loss equals swarm train's"
else
    bad "wan-swarm.sh fp32 exit $rc:"; tail -20 "$TMP/fp32.log"
    paste -d' ' "$TMP/fp32.txt" "$TMP/train.txt" 2>/dev/null | head
fi
wan_log "$TMP/fp32.log" "fp32"
prefix=$(sed -n 's/.*each in namespace \(ws[0-9]*\)nI.*/\1/p' "$TMP/fp32.log" | head -1)
if [ -n "$prefix" ] && ! ip netns list | grep -q "^$prefix"; then
    ok "wan-swarm.sh removed its namespaces ($prefix*)"
else
    bad "namespaces of the run ('$prefix') left: $(ip netns list | tr '\n' ' ')"
fi

# close WIRE TOL: WIRE's run trained and stayed within TOL (relative) of fp32's
close() {
    [ -s "$TMP/$1.txt" ] && [ "$(wc -l <"$TMP/$1.txt")" -eq 10 ] \
        && grep -q "^wire | activations $1:" "$TMP/$1.log" \
        && paste -d' ' "$TMP/$1.txt" "$TMP/fp32.txt" | awk -v tol="$2" '
            NR == 1 { first = $2 } { last = $2 }
            { d = $2 - $5; if (d < 0) d = -d; if (d > tol * $5) { print "step " $1 ": " $2 " vs " $5; bad = 1 }
              if (d > worst * $5) worst = d / $5 }
            END { if (last >= first) { print "did not train: " first " -> " last; bad = 1 }
                  printf "largest relative difference %.2g\n", worst >"/dev/stderr"; exit bad }'
}
for w in fp16:1e-3 int8:4e-3; do
    wire=${w%%:*}
    tol=${w#*:}
    wan "$wire"
    rc=$?
    if [ $rc -eq 0 ] && close "$wire" "$tol" 2>"$TMP/$wire.diff"; then
        ok "--wire $wire: trains, every step within $tol relative of fp32 ($(cat "$TMP/$wire.diff"))"
    else
        bad "--wire $wire exit $rc: $(cat "$TMP/$wire.diff")"; tail -5 "$TMP/$wire.log"
        paste -d' ' "$TMP/$wire.txt" "$TMP/fp32.txt" | head
    fi
    wan_log "$TMP/$wire.log" "--wire $wire"
done

# a node joining mid-run over slow links: 2 Mbit/s, so its stage's state
# takes longer than a step; it must load the state of the step it joins at
# (the next step waits for it), serve, and keep the losses swarm train's
# shellcheck disable=SC2086
KEEP=1 TMPDIR="$TMP" ORDERED=1 TIMEOUT=90 timeout 120 sh scripts/wan-swarm.sh --build "$BUILD" -n 3 -s 2 --steps 10 \
    --delay 20ms --rate 2mbit --min-nodes 2 $TINY --loss-log "$TMP/join.txt" >"$TMP/join.log" 2>&1
rc=$?
started=$(grep -n "training from step" "$TMP/join.log" | head -1 | cut -d: -f1)
ready=$(grep -n "(node3) ready on stage" "$TMP/join.log" | head -1 | cut -d: -f1)
if [ $rc -eq 0 ] && [ -n "$started" ] && [ -n "$ready" ] && [ "$ready" -gt "$started" ] \
    && ! grep -q "refused a request" "$TMP/join.log" && grep -q "checksum mismatches 0" "$TMP/join.log" \
    && losses_match "$TMP/join.txt" "$TMP/train.txt" 10; then
    ok "a node joining mid-run over 2 Mbit/s links loads the current step's state and serves; losses equal swarm train's"
else
    bad "join over slow links (exit $rc):"; grep -E "joins|ready on|refused|banned|mismatch" "$TMP/join.log" | head
    paste -d' ' "$TMP/join.txt" "$TMP/train.txt" 2>/dev/null | head
fi
wan_log "$TMP/join.log" "join over slow links"

lib_done
