# bench-lib.sh - what the local-swarm benchmarks share (bench-hetero.sh,
# bench-defaults.sh, bench-dashboard.sh, bench-memory.sh): the router's
# endpoint, its status, its throughput over a run's
# second half from --trace, and the bound averaged over that half. Sourced
# after SWARM (the binary) and T (--block) are set; prints numbers, asserts
# nothing.

# endpoint_of LOG: the endpoint a router logging to LOG listens on, waited
# for (10 s); nothing if it never says
endpoint_of() {
    for _ in $(seq 1 100); do
        eo=$(sed -n 's/^swarm router: listening on \(tcp:.*\)$/\1/p' "$1")
        [ -n "$eo" ] && { echo "$eo"; return 0; }
        sleep 0.1
    done
}

# status_of DIR: the router's status as JSON (one line), or nothing
status_of() {
    ep=$(sed -n 's/^swarm router: listening on \(tcp:.*\)$/\1/p' "$1/router.log" | head -n 1)
    if [ -n "$ep" ]; then "$SWARM" status "$ep" --router-key "$1/router.pub" --json 2>/dev/null || true; fi
}
# field JSON KEY: a top-level number
field() {
    echo "$1" | sed -n "s/^{\"step\": [0-9]*.*\"$2\": \([0-9.]*\).*/\1/p" | head -n 1
}
# ratio X Y: X / Y to two places, "?" where Y is not above 0
ratio() {
    awk -v x="$1" -v y="$2" 'BEGIN { if (y > 0) printf "%.2f", x / y; else print "?" }'
}
# tok_s TRACE BATCH: training tokens/s over the second half of a run, from
# the times the router's --trace gives each step's end (the steps between
# two samples of `swarm status` would be off by up to a step at each end)
tok_s() {
    awk -v bt="$2" -v t="$T" '$2 == "step" { n++; at[n] = $1; st[n] = $3 }
        END {
            if (n < 3) { print 0; exit }
            mid = at[1] + (at[n] - at[1]) / 2
            for (a = 1; at[a] < mid; a++) ;
            if (a >= n) { print 0; exit }
            printf "%.0f", (st[n] - st[a]) * bt * t * 1000 / (at[n] - at[a])
        }' "$1"
}
# swarm_dir LOG: the logs folder local-swarm.sh (KEEP=1) says it uses,
# waited for (20 s), then its first step (60 s); nothing if it never says
swarm_dir() {
    dir=""
    for _ in $(seq 1 100); do
        dir=$(sed -n 's/^local-swarm.sh: router .* logs in \(.*\)$/\1/p' "$1" | head -n 1)
        [ -n "$dir" ] && break
        sleep 0.2
    done
    [ -n "$dir" ] || return 0
    for _ in $(seq 1 300); do
        grep -q "^step " "$dir/router.log" 2>/dev/null && break
        sleep 0.2
    done
    echo "$dir"
}
# half_bound DIR DURATION NAP: from the middle of a DURATION-second run to
# its end, `swarm status` every NAP s (what the nodes measure drifts by a
# tenth or more from one sample to the next); sets $bound to the mean of
# the samples' bound_tok_s, $last_status to the last sample and $statuses
# to all of them, one a line
half_bound() {
    sleep $(($2 / 2))
    bounds="" statuses="" left=$(($2 - $2 / 2))
    while :; do
        last_status=$(status_of "$1")
        statuses="$statuses$last_status
"
        bounds="$bounds $(field "$last_status" bound_tok_s)"
        [ "$left" -le 0 ] && break
        nap=$((left < $3 ? left : $3))
        sleep "$nap"
        left=$((left - nap))
    done
    bound=$(echo "$bounds" | tr ' ' '\n' | awk '$1 > 0 { s += $1; n++ } END { if (n) printf "%.0f", s / n }')
}
