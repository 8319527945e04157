#!/bin/sh
# local-swarm.sh -n NODES -s STAGES [--steps N] [--speeds 1,0.5,...] [--chaos SEED]
#                [--build DIR] [router flags...]
# A whole swarm on this machine: a router on a free loopback port and NODES
# `swarm node` processes (--threads 1 each), with fresh keys in a temporary
# folder. Streams the router's log, waits for it to finish, stops every
# process it started (also on Ctrl-C, TERM or an error), prints the router's
# last lines and exits with the router's status. Flags it does not know go
# to `swarm router` (e.g. --layers 2 --embd 32 --batch 8).
# Environment: BUILD (default build), SWARM (default $BUILD/swarm), KEEP=1
# keeps the folder of keys and logs, TIMEOUT (s, default 3600) bounds the run,
# ORDERED=1 starts each node once the one before it has joined (join order,
# and so the split of --assign even, is then the nodes' order).
# It does not pick a port: the router binds port 0 and says which it got.
# --speeds gives node i a speed (node --slowdown 1/speed); --chaos SEED
# SIGKILLs a random node every CHAOS_EVERY s (default 20) and starts a
# replacement of the same speed, and in between SIGSTOPs another for 5 s
# (CHAOS_STALL=0: no stalls), all drawn from SEED.
# For scripts/wan-swarm.sh: WRAP=CMD starts the router as `CMD router
# SWARM...` and node I as `CMD nodeI SWARM...` (CMD must exec it, keeping
# the pid); LISTEN=EP is the router's --listen (default tcp://127.0.0.1:0);
# JOIN=EP is where nodes join (default: where the router listens).

me=local-swarm.sh
usage() {
    sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
}
die() {
    echo "$me: $*" >&2
    exit 1
}
is_count() {
    case $1 in '' | *[!0-9]*) return 1 ;; esac
    [ "$1" -ge 1 ] 2>/dev/null
}

# ---- flags: ours are taken out, the rest stay in "$@" for the router ----
nodes=""
stages=""
steps=""
build=${BUILD:-build}
build_flag=""
left=$#
while [ "$left" -gt 0 ]; do
    a=$1
    shift
    left=$((left - 1))
    case $a in
    -n | --nodes | -s | --stages | --steps | --build | --speeds | --chaos)
        [ "$left" -gt 0 ] || die "$a needs a value (see $me --help)"
        v=$1
        shift
        left=$((left - 1))
        case $a in
        -n | --nodes) nodes=$v ;;
        -s | --stages) stages=$v ;;
        --steps) steps=$v ;;
        --build) build=$v build_flag=1 ;;
        --speeds) speeds=$v ;;
        --chaos) chaos=$v ;;
        esac
        ;;
    -h | --help)
        usage
        exit 0
        ;;
    --iters | --resume)
        # the schedule comes from these (or the checkpoint): no default steps
        own_schedule=1
        set -- "$@" "$a"
        ;;
    *) set -- "$@" "$a" ;;
    esac
done
# --steps N is the router's --iters N; without it (and without --iters or
# --resume among the router flags) a short run of 50 steps
[ -z "$steps" ] && [ -z "${own_schedule:-}" ] && steps=50
is_count "$nodes" || die "-n NODES: expected a whole number >= 1, got '$nodes'"
is_count "$stages" || die "-s STAGES: expected a whole number >= 1, got '$stages'"
[ -z "$steps" ] || is_count "$steps" || die "--steps N: expected a whole number >= 1, got '$steps'"
[ "$nodes" -ge "$stages" ] || die "-n $nodes nodes cannot serve -s $stages stages (one node per stage at least)"
timeout=${TIMEOUT:-3600}
is_count "$timeout" || die "TIMEOUT: expected whole seconds >= 1, got '$timeout'"
[ -n "$build_flag" ] && SWARM=""
SWARM=${SWARM:-$build/swarm}
[ -x "$SWARM" ] || die "$SWARM is not an executable; run make (or give --build DIR)"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/local-swarm.XXXXXX") || die "cannot create a temporary folder"

# ---- processes: every pid we start, stopped by pid on any exit ----
router=""
tailer=""
node_pids=""
alive() {
    kill -0 "$1" 2>/dev/null
}
# run WHO CMD...: become CMD, through "$WRAP WHO" when WRAP is set; started
# with & so that $! is CMD's pid
run() {
    who=$1
    shift
    if [ -n "${WRAP:-}" ]; then exec "$WRAP" "$who" "$@"; fi
    exec "$@"
}
# stop PIDS...: TERM, up to 5 s to leave, then KILL; reaps them all
stop() {
    for p in "$@"; do alive "$p" && kill -TERM "$p" 2>/dev/null; done
    tries=50
    while [ "$tries" -gt 0 ]; do
        busy=""
        for p in "$@"; do alive "$p" && busy=1; done
        [ -z "$busy" ] && break
        sleep 0.1
        tries=$((tries - 1))
    done
    for p in "$@"; do
        if alive "$p"; then
            echo "$me: pid $p ignored TERM for 5 s; killing it" >&2
            kill -KILL "$p" 2>/dev/null
        fi
    done
    for p in "$@"; do wait "$p" 2>/dev/null; done
}
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    trap '' INT TERM
    # shellcheck disable=SC2086 # pid lists split on spaces
    stop $tailer $node_pids $router
    if [ "${KEEP:-0}" = 1 ]; then
        echo "$me: keys and logs kept in $TMP" >&2
    else
        rm -rf "$TMP"
    fi
}
trap cleanup EXIT
trap 'echo "$me: interrupted; stopping the swarm" >&2; exit 130' INT
trap 'exit 143' TERM

# ---- keys ----
"$SWARM" keygen "$TMP/router" >/dev/null || die "swarm keygen $TMP/router failed"
i=1
while [ "$i" -le "$nodes" ]; do
    "$SWARM" keygen "$TMP/node$i" >/dev/null || die "swarm keygen $TMP/node$i failed"
    i=$((i + 1))
done

# ---- the router, and the port it picked (bounded: 20 s) ----
run router "$SWARM" router --listen "${LISTEN:-tcp://127.0.0.1:0}" --key "$TMP/router" --stages "$stages" \
    ${steps:+--iters "$steps"} --min-nodes "$nodes" "$@" >"$TMP/router.log" 2>&1 &
router=$!
endpoint=""
tries=200
while [ "$tries" -gt 0 ] && [ -z "$endpoint" ]; do
    endpoint=$(sed -n 's/^swarm router: listening on \(tcp:\/\/[0-9.]*:[0-9][0-9]*\)$/\1/p' \
        "$TMP/router.log" | head -n 1)
    [ -n "$endpoint" ] && break
    if ! alive "$router"; then
        wait "$router"
        rc=$?
        router=""
        echo "$me: the router exited (status $rc) before listening; its log:" >&2
        sed 's/^/  /' "$TMP/router.log" >&2
        exit 1
    fi
    sleep 0.1
    tries=$((tries - 1))
done
if [ -z "$endpoint" ]; then
    echo "$me: the router printed no 'listening on' line within 20 s; its log:" >&2
    sed 's/^/  /' "$TMP/router.log" >&2
    exit 1
fi
tail -n +1 -f "$TMP/router.log" &
tailer=$!

# ---- the nodes ----
# slowdown_of I: 1/speed of node I from --speeds (1 when not given)
slowdown_of() {
    echo "${speeds:-}" | awk -F, -v i="$1" '{ v = (i <= NF && $i != "") ? $i : 1 }
        END { if (v <= 0 || v > 1) v = 1; printf "%g", 1 / v }'
}
node_slow=""  # "pid:slowdown" of every node started
node_names="" # "pid:nodeI" of every node started
start_node() {  # I [SLOWDOWN]
    [ -f "$TMP/node$1.key" ] || "$SWARM" keygen "$TMP/node$1" >/dev/null
    slow=${2:-$(slowdown_of "$1")}
    run "node$1" "$SWARM" node --join "${JOIN:-$endpoint}" --router-key "$TMP/router.pub" --key "$TMP/node$1" \
        --threads 1 --name "node$1" --slowdown "$slow" --exit-when-done >"$TMP/node$1.log" 2>&1 &
    node_pids="$node_pids $!"
    node_slow="$node_slow $!:$slow"
    node_names="$node_names $!:node$1"
}
# slowdown_of_pid PID: the slowdown node PID was started with
slowdown_of_pid() {
    for e in $node_slow; do [ "${e%%:*}" = "$1" ] && echo "${e#*:}"; done
}
# name_of_pid PID: node PID's --name (nodeI), as the router's log names it
name_of_pid() {
    for e in $node_names; do [ "${e%%:*}" = "$1" ] && echo "${e#*:}"; done
}
i=1
while [ "$i" -le "$nodes" ]; do
    start_node "$i"
    if [ "${ORDERED:-0}" = 1 ]; then # joined (bounded: 30 s) before the next starts
        tries=300
        while [ "$tries" -gt 0 ] && ! grep -q "^swarm router: peer [0-9]* (node$i, .*) joins" "$TMP/router.log"; do
            sleep 0.1
            tries=$((tries - 1))
        done
    fi
    i=$((i + 1))
done
next_node=$((nodes + 1))
# chaos_pick K N: a number in 1..N for event K, drawn from the seed
chaos_pick() {
    awk -v s="$chaos" -v k="$1" -v n="$2" 'BEGIN { srand(s * 7919 + k); print 1 + int(rand() * n) }'
}
chaos_every=${CHAOS_EVERY:-20}
chaos_event=0
stopped=
stopped_at=0 # $ticks when it was stopped
echo "$me: router $endpoint, $nodes nodes, $stages stages, ${steps:-the router's} steps; logs in $TMP" >&2

# ---- wait for the router (bounded: TIMEOUT s); give up if every node has
# been gone for 30 s while it still runs ----
show_nodes() {
    i=1
    while [ "$i" -le "$nodes" ]; do
        echo "---- node$i: last lines of $TMP/node$i.log" >&2
        tail -n 5 "$TMP/node$i.log" >&2
        i=$((i + 1))
    done
}
ticks=$((timeout * 5))
orphaned=0
failed=""
while alive "$router" && [ "$ticks" -gt 0 ]; do
    if [ -n "${chaos:-}" ]; then
        chaos_tick=$(( (timeout * 5 - ticks) % (chaos_every * 5) ))
        live=""
        for p in $node_pids; do alive "$p" && live="$live $p"; done
        count=$(echo $live | wc -w)
        # 5 s (25 ticks) after the stop, also when that is past the end of the
        # period (CHAOS_EVERY under 10); a stopped node that was killed since
        # is not continued
        if [ -n "$stopped" ] && [ $((stopped_at - ticks)) -ge 25 ]; then
            if alive "$stopped"; then
                kill -CONT "$stopped" 2>/dev/null
                echo "$me: chaos: SIGCONT pid $stopped ($(name_of_pid "$stopped"))" >&2
            fi
            stopped=""
        fi
        if [ "$chaos_tick" -eq $((chaos_every * 5 - 1)) ] && [ "$count" -gt 1 ]; then
            chaos_event=$((chaos_event + 1))
            victim=$(echo $live | cut -d' ' -f"$(chaos_pick "$chaos_event" "$count")")
            kill -KILL "$victim" 2>/dev/null
            echo "$me: chaos: SIGKILL pid $victim ($(name_of_pid "$victim")); starting node$next_node" >&2
            start_node "$next_node" "$(slowdown_of_pid "$victim")" # as fast as the one it replaces
            next_node=$((next_node + 1))
        elif [ "$chaos_tick" -eq $((chaos_every * 5 / 2)) ] && [ "$count" -gt 2 ] && [ -z "$stopped" ] \
            && [ "${CHAOS_STALL:-1}" != 0 ]; then
            chaos_event=$((chaos_event + 1))
            stopped=$(echo $live | cut -d' ' -f"$(chaos_pick "$chaos_event" "$count")")
            stopped_at=$ticks
            kill -STOP "$stopped" 2>/dev/null
            echo "$me: chaos: SIGSTOP pid $stopped ($(name_of_pid "$stopped")) for 5 s" >&2
        fi
    fi
    any=""
    for p in $node_pids; do alive "$p" && any=1; done
    if [ -n "$any" ]; then orphaned=0; else orphaned=$((orphaned + 1)); fi
    [ "$orphaned" -ge 150 ] && break
    sleep 0.2
    ticks=$((ticks - 1))
done
if alive "$router"; then
    if [ "$orphaned" -ge 150 ]; then
        echo "$me: every node has exited and the router still runs after 30 s; stopping it" >&2
        show_nodes
    else
        echo "$me: the router still runs after TIMEOUT=$timeout s; stopping it" >&2
    fi
    stop "$router"
    router=""
    rc=1
else
    wait "$router"
    rc=$?
    router=""
    [ "$rc" -eq 0 ] || failed="$me: the router exited with status $rc"
    # a finished run's nodes exit by themselves (--exit-when-done): 5 s at most
    for _ in $(seq 1 25); do
        any=""
        for p in $node_pids; do alive "$p" && any=1; done
        [ -z "$any" ] && break
        sleep 0.2
    done
fi
stop "$tailer"
tailer=""
echo "---- router's last lines ($TMP/router.log)"
tail -n 8 "$TMP/router.log"
[ -n "$failed" ] && echo "$failed" >&2
exit "$rc"
