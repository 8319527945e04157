#!/bin/sh
# test_audit.sh BUILD - liars in the gradient path, with real processes
# (BUILD/swarm-misbehave --misbehave MODE@STEP). First run: four honest
# nodes and two liars on 2 stages of three replicas each, --audit 1 (every
# gradient sum recomputed by another replica): one liar sends its gradient
# sums pointing the other way (grad), one the true loss with its input
# gradients reversed (dx). Each is named in one log line and expelled at
# the step of its first lie, that step starts over, every step's loss
# equals `swarm train`'s (1e-4 relative) and the final model.bgpt its
# weights (1e-4). Second run: a stage's only replica claims a gradient
# norm of 1e150 a micro-batch (sumsq), which would clip every stage's
# update to nothing: it is banned, its stage rolls back, an honest node
# takes its place, and the losses are swarm train's again. Third run: a
# replica sends, when a checkpoint reads its stage's state, parameters other
# than those its checksum is of (state): it is expelled, and the losses and
# the final model are swarm train's. Fourth run, at the default --audit: a
# replica's sum is true but for one element of FLT_MAX (gradinf): its norm
# has it audited, it is expelled, and the 12 steps' losses are swarm
# train's. Fifth run, --audit 1: a replica reports its replicas' parameter
# checksum while it computes with 1% larger parameters (checksum): consensus
# cannot see it, an audit of its first sum expels it, and the 12 steps'
# losses are swarm train's. Sixth run: a replica claims a millionth of its
# speed and holds the work it is given (slowclaim), another never answers
# a checkpoint's read (ckptstall): the first is named, the second banned
# at the read's deadline and that checkpoint skipped, and the 16 steps'
# losses are swarm train's. Seventh run, --audit 1: a fast node beside two
# slow ones, one of which lies only in the sums it recomputes for audits
# (recount): the fast node's share is split between them, the split round
# fails, the liar is expelled where it recomputes a share whole, and the
# losses and the final model are swarm train's. Ends with "N passed, N
# failed".
BUILD=${1:-build}
SWARM="$BUILD/swarm"
LIAR="$BUILD/swarm-misbehave"
. tests/lib.sh

ITERS=40
tiny_reference "$ITERS" 1e-3 12
# shellcheck disable=SC2086
"$SWARM" train $TINY --threads 1 --quiet --save "$TMP/train" >/dev/null 2>&1 \
    || bad "swarm train --save failed"
"$SWARM" keygen "$TMP/router" >/dev/null

SLOWDOWN=4

# expect NAME PATTERN WHAT: the log says it caught NAME
expect() {
    line=$(grep -E "\($1\) $2" "$log" | head -n 1)
    if [ -n "$line" ]; then ok "$3: ${line#swarm router: }"; else bad "$3: no line matching '$2'"; fi
}

# start_router LOG FLAGS...: a 2-stage router of TINY (joins by count, no
# rebalancing) logging to LOG; $router, $endpoint
start_router() {
    log=$1
    shift
    # shellcheck disable=SC2086
    SWARM_PLAIN=1 "$SWARM" router $TINY --stages 2 --listen "tcp://127.0.0.1:0" --key "$TMP/router" \
        --assign even --rebalance-every 0 --log-every 1 "$@" >"$log" 2>&1 &
    router=$!
    pids="$pids $router"
    endpoint=$(wait_endpoint "$log")
}

# router_finished COMMAND [N]: the router exits 0 after N steps (default
# ITERS; ok shows what COMMAND prints)
router_finished() {
    rf_n=${2:-$ITERS}
    wait_exit "$router" 240 || { bad "router still running after 240 s"; tail -20 "$log"; }
    wait "$router"
    rf_rc=$?
    if [ $rf_rc -eq 0 ] && grep -q "^summary | iters $rf_n " "$log"; then
        ok "router finished $rf_n steps: $(eval "$1")"
    else
        bad "router exit $rf_rc:"; tail -10 "$log"
    fi
}

# caught_at LIAR STEP: the first dispute LIAR is in is at STEP, the step of
# its first lie (every sum audited: none of its lies reaches an update)
caught_at() {
    at=$(grep "does not reproduce the gradient of .*($1)\|($1) does not reproduce" "$log" \
        | head -n 1 | sed -n 's/^swarm router: step \([0-9]*\): .*/\1/p')
    if [ "$at" = "$2" ]; then
        ok "$1 is caught at the step of its first lie (step $at)"
    else
        bad "$1: first caught at step '${at:-never}', its first lie was at step $2"
    fi
}

# same_model DIR: DIR/model.bgpt holds swarm train's weights (1e-4)
same_model() {
    if line=$("$BUILD/bgpt_diff" "$1/model.bgpt" "$TMP/train/model.bgpt" 1e-4); then
        ok "the final model.bgpt is swarm train's: $line"
    else
        bad "the final model differs from swarm train's: $line"
    fi
}

# ---- grad and dx: caught by audits ----
start_router "$TMP/router.log" --min-nodes 6 --verify 0 --audit 1 --save "$TMP/ck" \
    --loss-log "$TMP/swarm.txt"
# joins alternate between the stages (--assign even): a liar and two honest
# replicas on each, so that a third replica decides every dispute
start_node "$log" honest0 "$SWARM"
start_node "$log" honest1 "$SWARM"
start_node "$log" honest2 "$SWARM"
start_node "$log" honest3 "$SWARM"
start_node "$log" grad "$LIAR" --misbehave grad@3
start_node "$log" dx "$LIAR" --misbehave dx@3
router_finished "grep -o 'gradient sums audited.*' \"\$log\""
# every step's update waited for its audits (--audit 1), and the summary says
# what they took
if grep -q "^audits | all $ITERS steps waited for audits, [0-9.]* s each (none without to compare)$" "$log"; then
    ok "the summary says what the audits took: $(grep -o '^audits | .*' "$log")"
else
    bad "no 'audits | all $ITERS steps waited ...' line: $(grep '^audits |' "$log")"
fi

expect grad "(returned|recomputed) a stage 0 gradient that two replicas contradict: expelled for the run" \
    "gradient sums pointing the other way are caught by an audit"
expect dx "(returned|recomputed) a stage 1 gradient that two replicas contradict: expelled for the run" \
    "the true loss with reversed input gradients is caught by an audit"
caught_at grad 3
caught_at dx 3
if [ "$(grep -c "starting the step over (a peer whose gradient it used was caught lying)" "$log")" -ge 1 ]; then
    ok "the step the liars fed was started over"
else
    bad "no step was started over after a liar was caught"
fi
check_losses "$TMP/swarm.txt" "$TMP/train.txt" "$ITERS" "despite the liars"
same_model "$TMP/ck"
# with --assign even and no moves, two honest replicas serve each stage
# throughout: no stage is ever left without one, so no rollback
check_log "the log: no honest node lost, banned or expelled; no rollback" "$log" 0 grad dx

# ---- sumsq: a stage's only replica, caught by the norm bound ----
start_router "$TMP/router2.log" --min-nodes 2 --save "$TMP/ck2" --save-every 5 \
    --loss-log "$TMP/swarm2.txt"
start_node "$log" honest4 "$SWARM"
start_node "$log" sumsq "$LIAR" --misbehave sumsq@8
if wait_grep "$log" "(sumsq) sent a gradient sum of norm .* a micro-batch" 120; then
    start_node "$log" honest5 "$SWARM"
else
    bad "the sumsq liar was not caught within 120 s"
fi
router_finished "echo \$(grep -c 'rolling back' \"\$log\") rollbacks"
expect sumsq "sent a gradient sum of norm [0-9.e+]* a micro-batch, .*x the stage's median .*: banned for" \
    "a norm 1e150 times too large from a stage's only replica is refused and its sender banned"
check_losses "$TMP/swarm2.txt" "$TMP/train.txt" "$ITERS" "after the rollback the liar caused"
rb=$(log_emptied "$log")
check_log "the log: no honest node lost, banned or expelled; $rb rollbacks (stages the liar emptied)" \
    "$log" "$rb" sumsq

# ---- state: a replica whose state is not the one its checksum is of ----
start_router "$TMP/router3.log" --min-nodes 3 --save "$TMP/ck3" --save-every 1 \
    --loss-log "$TMP/swarm3.txt"
start_node "$log" honest6 "$SWARM"
start_node "$log" honest7 "$SWARM"
start_node "$log" state "$LIAR" --misbehave state@2
router_finished "echo \$(grep -c 'checkpoint of step .* skipped' \"\$log\") checkpoints skipped"
# a checkpoint every step, each stage's part read from a replica drawn at
# random: the liar's turn comes
expect state "sent a stage state whose checksum [0-9a-f]* is not the [0-9a-f]* it reported: expelled for the run" \
    "a state other than the one its checksum is of is refused and its sender expelled"
check_losses "$TMP/swarm3.txt" "$TMP/train.txt" "$ITERS" "with a liar among the checkpoints' sources"
same_model "$TMP/ck3"
check_log "the log: no honest node lost, banned or expelled; no rollback" "$log" 0 state

# ---- gradinf: one element of FLT_MAX, caught by the norm bound's audit ----
# the default --audit (0.3) with the open swarm's draw: the sum's norm, far
# above the stage's median, has it audited whatever the draw; three
# replicas of stage 0 (the liar and two honest), so a third decides
start_router "$TMP/router4.log" --min-nodes 5 --steps 12 --loss-log "$TMP/swarm4.txt"
for n in honest8 honest9 honest10 honest11; do start_node "$log" $n "$SWARM"; done
start_node "$log" gradinf "$LIAR" --misbehave gradinf@4
router_finished "grep -o 'gradient sums audited.*' \"\$log\"" 12
expect gradinf "sent a gradient sum of norm .*x the stage's median" \
    "a sum with one element of FLT_MAX is audited for its norm"
expect gradinf "(returned|recomputed) a stage 0 gradient that two replicas contradict: expelled for the run" \
    "and its sender expelled"
head -n 12 "$TMP/train.txt" >"$TMP/train12.txt"
check_losses "$TMP/swarm4.txt" "$TMP/train12.txt" 12 "with a sum of FLT_MAX"
check_log "the log: no honest node lost, banned or expelled; no rollback" "$log" 0 gradinf

# ---- checksum: its replicas' checksum, other parameters ----
# stage 0: the liar and two honest replicas, so a third decides; its lie
# starts at its update into step 3, so step 3's sum is its first wrong one
start_router "$TMP/router5.log" --min-nodes 5 --steps 12 --verify 0 --audit 1 \
    --loss-log "$TMP/swarm5.txt"
for n in honest12 honest13 honest14 honest15; do start_node "$log" $n "$SWARM"; done
start_node "$log" checksum "$LIAR" --misbehave checksum@2
router_finished "grep -o 'checksum mismatches.*' \"\$log\"" 12
expect checksum "(returned|recomputed) a stage 0 gradient that two replicas contradict: expelled for the run" \
    "a replica reporting its replicas' checksum while computing with other parameters is caught by an audit"
if grep -q "(checksum) reports checksum" "$log"; then
    bad "the checksum liar's checksum disagreed with its replicas': $(grep -m1 '(checksum) reports' "$log")"
else
    ok "its checksum agreed with its replicas' every step: consensus alone could not see it"
fi
caught_at checksum 3
check_losses "$TMP/swarm5.txt" "$TMP/train12.txt" 12 "with a liar about its checksum"
check_log "the log: no honest node lost, banned or expelled; no rollback" "$log" 0 checksum

# ---- slowclaim and ckptstall: stalls that once cost the liar nothing ----
# stage 0: two honest replicas and one that claims a millionth of its speed
# and, from step 2, answers no forward or backward; stage 1: an honest
# replica and one that, from step 2, answers no STATE_GET (a checkpoint
# every step, each stage's part read from a replica drawn at random)
# (--slowdown 60: the peers are measured, which takes 0.2 s of work each,
# and the deadlines' floor is theirs)
SLOWDOWN=60
start_router "$TMP/router6.log" --min-nodes 5 --steps 16 --save "$TMP/ck6" --save-every 1 \
    --loss-log "$TMP/swarm6.txt"
start_node "$log" honest16 "$SWARM"
start_node "$log" honest17 "$SWARM"
start_node "$log" slowclaim "$LIAR" --misbehave slowclaim@2
start_node "$log" ckptstall "$LIAR" --misbehave ckptstall@2
start_node "$log" honest18 "$SWARM"
router_finished "echo \$(grep -c 'checkpoint of step .* skipped' \"\$log\") checkpoints skipped" 16
expect slowclaim "says it sustains [0-9.e+-]* tok/s, under 1/20 of the median the router measures" \
    "a tiny claimed speed is named"
expect slowclaim "missed the deadline of a (FWD|BWD) request: banned for" \
    "and the work it holds is failed at its deadline (its stage's fastest's, or the floor's), not its claim's"
expect ckptstall "missed the deadline of a STATE_GET request: banned for" \
    "a replica that ignores a checkpoint's read is banned at its deadline"
if grep -q "checkpoint of step [0-9]* skipped" "$log"; then
    ok "that checkpoint is skipped: $(grep -m1 'checkpoint of step [0-9]* skipped' "$log" | cut -c15-)"
else
    bad "no checkpoint was skipped for the stalled read"
fi
head -n 16 "$TMP/train.txt" >"$TMP/train16.txt"
check_losses "$TMP/swarm6.txt" "$TMP/train16.txt" 16 "with a tiny claim and a stalled checkpoint read"
check_log "the log: no honest node lost, banned or expelled; no rollback" "$log" 0 slowclaim ckptstall

# ---- recount: a verifier that lies only in what it recomputes ----
# stage 0: a fast node (--slowdown 1) and two slow ones (8), one of which
# reverses the sums it recomputes of another's share (its own are true);
# stage 1: three slow honest ones. Every sum audited: the fast node's
# share is split between the two slow ones, the round does not add up,
# and one replica recomputes the share whole; the liar is expelled where
# it recomputes a share whole (two contradict it); if an honest one
# confirms the fast node first, both slow ones take no part until each
# has recomputed a whole share that two confirm, and get whole ones first
start_router "$TMP/router7.log" --min-nodes 6 --verify 0 --audit 1 --audit-proven 1 \
    --save "$TMP/ck7" --loss-log "$TMP/swarm7.txt"
SLOWDOWN=1
start_node "$log" fast "$SWARM"
SLOWDOWN=8
start_node "$log" honest19 "$SWARM"
start_node "$log" slow "$SWARM"
start_node "$log" honest20 "$SWARM"
start_node "$log" recount "$LIAR" --misbehave recount
start_node "$log" honest21 "$SWARM"
router_finished "grep -o 'gradient sums audited.*' \"\$log\""
if grep -q "shares split [1-9]" "$log" \
    && grep -q "stage 0: the 2 replicas that split the share of peer [0-9]* (fast) do not reproduce" "$log"; then
    ok "the fast node's share was split, and a split round with the liar in it did not add up"
else
    bad "no split round of the fast node's share failed: $(grep -o 'shares split [0-9]*' "$log")"
fi
expect recount "recomputed a stage 0 gradient that two replicas contradict: expelled for the run" \
    "a verifier that lies only in what it recomputes is caught where it recomputes a share whole"
check_losses "$TMP/swarm7.txt" "$TMP/train.txt" "$ITERS" "with a verifier that lies"
same_model "$TMP/ck7"
check_log "the log: no honest node lost, banned or expelled; no rollback" "$log" 0 recount

lib_done
