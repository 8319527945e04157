# lib.sh - what the swarm integration scripts share: pass/fail counters, a
# scratch folder and the processes a test started (all killed at exit, also
# stopped ones), waiting for a router's endpoint or a log line, and comparing loss logs
# with `swarm train`'s. Sourced: `. tests/lib.sh` from the repo root.
pass=0
fail=0
pids=""
# (named after the script: `.` passes no arguments in every shell)
TMP=$(mktemp -d "/tmp/swarm-$(basename "$0" .sh).XXXXXX")
# (a subshell's processes: their pids appended to $TMP/pids, which the
# caller's $pids cannot learn)
lib_cleanup() {
    for p in $pids $(cat "$TMP/pids" 2>/dev/null); do
        kill -CONT "$p" 2>/dev/null
        kill -9 "$p" 2>/dev/null
    done
    wait 2>/dev/null
    [ -n "${KEEP:-}" ] || rm -rf "$TMP"
}
trap lib_cleanup EXIT INT TERM
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }

# wait_endpoint LOG: the router's "listening on" endpoint (bounded: 10 s)
wait_endpoint() {
    for _ in $(seq 1 100); do
        e=$(sed -n 's/^swarm router: listening on \(tcp:.*\)$/\1/p' "$1")
        [ -n "$e" ] && { echo "$e"; return 0; }
        sleep 0.1
    done
    return 1
}

# wait_grep FILE PATTERN SECONDS: until FILE has a line matching PATTERN
wait_grep() {
    for _ in $(seq 1 $(($3 * 10))); do
        grep -q -e "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

# wait_exit PID SECONDS: until the process exits; kill it after SECONDS
wait_exit() {
    for _ in $(seq 1 $(($2 * 10))); do
        kill -0 "$1" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -9 "$1" 2>/dev/null
    return 1
}

# losses_match LOG TRAIN N [TOL]: the last line written for each step of LOG
# ("step loss ...") equals TRAIN's to TOL relative (1e-4; 0: every printed
# digit), for N steps
losses_match() {
    awk '{ loss[$1] = $2 } END { for (s in loss) print s, loss[s] }' "$1" | sort -n >"$TMP/final.txt"
    [ "$(wc -l <"$TMP/final.txt")" -eq "$3" ] && paste -d' ' "$TMP/final.txt" "$2" | awk -v tol="${4:-1e-4}" '
        { d = $2 - $4; if (d < 0) d = -d
          if ((tol == 0 && $2 != $4) || d > tol * $4 || $1 != $3) { print "step " $1 ": " $2 " vs " $4; bad = 1 } }
        END { exit bad }'
}

# losses_said TOL: how losses_match held them, for an ok line
losses_said() {
    [ "$1" = 0 ] && echo "to every printed digit" || echo "to $1 relative"
}

# clean_run RC LOG: the router exited 0 and its replicas' checksums agreed
# after every step (its summary line)
clean_run() {
    [ "$1" -eq 0 ] && grep -q "checksum mismatches 0" "$2"
}

# What the router logs when a peer leaves the swarm (s_peer_dead's
# reasons: lost, silent, left, replaced, dropped, banned, expelled, resynced),
# after "swarm router: peer N (NAME) "
LIB_DEATH_RE=': dead$|left \(BYE\)$|was replaced by a new process with its key$|: dropped$|banned for [0-9]+ s \(failure [0-9]+\)$|expelled for the run$|it fetches their state again$'

# log_invariants LOG ROLLBACKS FAULTED...: what a router's log shows holds
# beyond the final losses: no peer but the FAULTED names (the ones the test
# killed, stopped, removed or made lie) was declared dead, banned, expelled
# or refused, and the run rolled back exactly ROLLBACKS times (a rollback
# nobody caused is a bug a replay hides). Prints each violation; fails if
# there is one.
log_invariants() {
    inv_log=$1 inv_rb=$2
    shift 2
    inv_bad=0
    # "swarm router: peer 3 (node2) missed the deadline ...: banned for 5 s (failure 1)",
    # "... (node2) is not connected: dead", "... of peer 3 (node2), which is connected"
    { grep -E "^swarm router: peer [0-9]+ \([^,)]*\) " "$inv_log" | grep -E "$LIB_DEATH_RE" \
        | sed 's/^swarm router: peer [0-9]* (\([^,)]*\)).*/\1 &/'
      grep -E "^swarm router: refused a second node with the key .* of peer [0-9]+ \([^)]*\)" "$inv_log" \
        | sed 's/^.* of peer [0-9]* (\([^)]*\)).*/\1 &/'; } >"$TMP/inv_bans.txt"
    while read -r inv_name inv_line; do
        inv_faulted=0
        for inv_f in "$@"; do [ "$inv_name" = "$inv_f" ] && inv_faulted=1; done
        if [ $inv_faulted -eq 0 ]; then
            echo "invariant: an honest peer was lost, banned or refused: $inv_line"
            inv_bad=1
        fi
    done <"$TMP/inv_bans.txt"
    # a log that held lines of joins and deaths back (a burst past the
    # router's limit) cannot show that no honest peer was lost
    if grep -q "more lines of joins and deaths not shown" "$inv_log"; then
        echo "invariant: the router held lines of joins and deaths back; the log cannot tell:"
        grep "more lines of joins and deaths not shown" "$inv_log" | head -2
        inv_bad=1
    fi
    inv_n=$(grep -c "lost every replica at step .*: rolling back" "$inv_log")
    if [ "$inv_n" -ne "$inv_rb" ]; then
        echo "invariant: $inv_n rollbacks, $inv_rb caused:"
        grep "rolling back" "$inv_log" | head -3
        inv_bad=1
    fi
    return $inv_bad
}

# check_log WHAT LOG ROLLBACKS FAULTED...: ok "WHAT" when log_invariants
# holds, else bad, with the log's lines about joins, moves, losses, bans and
# rollbacks
check_log() {
    ck_what=$1 ck_log=$2 ck_rb=$3
    shift 3
    if log_invariants "$ck_log" "$ck_rb" "$@"; then
        ok "$ck_what"
    else
        bad "$ck_what: the log shows what the losses hide (faulted: ${*:-none})"
        grep -E "joins|moving|dead|banned|expelled|refused|dropped|rolling|applies" "$ck_log" | head -20
    fi
}

# log_emptied LOG: how many times, by the router's log, a peer's leaving
# (LIB_DEATH_RE) left a stage with no ready replica while the swarm trained:
# the rollbacks the faults caused, where a test cannot know which stage
# each of its victims served (chaos). Follows the log's joins, moves,
# "ready on stage" lines and rollbacks, as the router counts (s_ready_count).
log_emptied() {
    LIB_DEATH_RE=$LIB_DEATH_RE awk '
        function name_of(l) { sub(/^swarm router: peer [0-9]+ \(/, "", l); sub(/[,)].*/, "", l); return l }
        function clear(n) { for (n in ready) ready[n] = 0; started = 0 }
        BEGIN { death = ENVIRON["LIB_DEATH_RE"] }
        / swarm; [0-9]+ stages of / { for (i = 1; i < NF; i++) if ($(i + 1) == "stages") stages = $i + 0 }
        /^swarm router: every stage has a peer; training from step / { started = 1 }
        /^swarm router: stage [0-9]+ lost every replica at step / { clear() }
        /^swarm router: peer [0-9]+ \([^,)]*, .*\) joins stage [0-9]+$/ { ready[name_of($0)] = 0 }
        /^swarm router: peer [0-9]+ \([^,)]*\) ready on stage [0-9]+, / {
            n = name_of($0); ready[n] = 1; s = $0; sub(/.* ready on stage /, "", s); stage[n] = s + 0 }
        /^swarm router: peer [0-9]+ \([^,)]*\) / && $0 ~ death {
            n = name_of($0)
            if (!ready[n]) next
            ready[n] = 0
            if (!started) next
            for (s = 0; s < stages; s++) {
                c = 0
                for (m in ready) if (ready[m] && stage[m] == s) c++
                if (c == 0) { emptied++; clear(); break }
            }
        }
        END { print emptied + 0 }' "$1"
}

# kept_dir OUT: the folder scripts/local-swarm.sh kept (KEEP=1), by its
# output OUT: its router.log is the whole log, which its stream of it (a
# tail -f stopped when the router exits) may end short of
kept_dir() {
    sed -n 's/^local-swarm\.sh: keys and logs kept in \(.*\)$/\1/p' "$1" | tail -n 1
}

# tiny_reference ITERS LR [BATCH]: the tiny test model's flags in TINY (on
# 30 kB of the built-in corpus; batch 8 unless given) and its `swarm train`
# losses in $TMP/train.txt
tiny_reference() {
    head -c 30000 "$BUILD/corpus.txt" >"$TMP/data.txt"
    TINY="--layers 2 --heads 4 --embd 32 --block 16 --batch ${3:-8} --micro-batch 2 --iters $1 --warmup 2 --lr $2 --eval-every 0 --data $TMP/data.txt"
    # shellcheck disable=SC2086
    "$BUILD/swarm" train $TINY --threads 1 --quiet --loss-log "$TMP/train.txt" >/dev/null 2>&1
}

# start_ckpt_router LOG [flags]: a 2-stage router of TINY with the key
# $TMP/router, a checkpoint every 5 steps in $TMP/ck and its losses in
# $TMP/swarm.txt; $router is its pid
start_ckpt_router() {
    log=$1
    shift
    # shellcheck disable=SC2086
    SWARM_PLAIN=1 "$BUILD/swarm" router $TINY --stages 2 --key "$TMP/router" --save "$TMP/ck" \
        --save-every 5 --log-every 1 --loss-log "$TMP/swarm.txt" "$@" >"$log" 2>&1 &
    router=$!
    pids="$pids $router"
}

# start_node LOG NAME BINARY [FLAGS...]: a node of BINARY (swarm, or the
# test build swarm-misbehave) keyed $TMP/NAME joins the router at $endpoint
# (key $TMP/router.pub) with one thread, --slowdown ${SLOWDOWN:-8}, its log
# in $TMP/NAME.log; returns once the router's LOG says it was assigned
start_node() {
    sn_log=$1 sn_name=$2 sn_bin=$3
    shift 3
    "$BUILD/swarm" keygen "$TMP/$sn_name" >/dev/null
    # shellcheck disable=SC2154 # endpoint: the caller's (wait_endpoint)
    "$sn_bin" node --join "$endpoint" --router-key "$TMP/router.pub" --key "$TMP/$sn_name" \
        --threads 1 --name "$sn_name" --slowdown "${SLOWDOWN:-8}" "$@" >"$TMP/$sn_name.log" 2>&1 &
    pids="$pids $!"
    for _ in $(seq 1 300); do
        grep -q "($sn_name, .*) joins stage" "$sn_log" && return 0
        sleep 0.05
    done
    bad "$sn_name was never assigned"
}

# check_losses LOG TRAIN N WHAT [TOL]: ok/bad on losses_match, showing the
# first differing lines
check_losses() {
    if losses_match "$1" "$2" "$3" "${5:-1e-4}"; then
        ok "every step's loss equals swarm train's $(losses_said "${5:-1e-4}") $4"
    else
        bad "losses differ $4:"; paste -d' ' "$1" "$2" | head
    fi
}

lib_done() {
    echo "$pass passed, $fail failed"
    [ $fail -eq 0 ]
}
