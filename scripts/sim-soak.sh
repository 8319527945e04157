#!/bin/sh
# sim-soak.sh BUILD FIRST COUNT [--numeric] | BUILD --seconds N [--numeric] -
# swarm sim on many seeds, each a different swarm drawn from its seed:
# 3-12 peers on 2-4 stages of uneven speeds (CPUs and a GPU), links of
# 0-50 ms, and faults. Synthetic (the default): peers killed and replaced
# every 3-8 virtual seconds (with checkpoints every 10 steps) or never,
# evaluations, spot checks; and one seed in four a crowd of 40-299 peers
# with liars, kills or departures, and stalls (crowd_flags_of). --numeric: peers that run the node's
# real code on a small model, with kills and joins, stalls, or liars, and
# every step's loss must equal `swarm train`'s to 1e-4 (one reference run
# per batch size: the model and its batches come from --seed 1337, the
# swarm from --sim-seed). Seeds FIRST..FIRST+COUNT-1, or fresh seeds (from
# the clock) for N seconds. Prints one line per failing seed with the
# command that replays it, then "sim-soak: N seeds (FIRST..LAST), N
# failed"; exits 1 on a failure. JOBS seeds run at once (default: one a
# core).
set -u
BUILD=${1:-build}
SWARM="$BUILD/swarm"
# and what the engine keeps counted as it goes (its micro-batches' places,
# its routing rows) must agree with its tables after every call
export SWARM_SIM_CHECK=1
numeric=0
for a in "$@"; do [ "$a" = --numeric ] && numeric=1; done
if [ "${2:-}" = --seconds ]; then
    seconds=${3:?--seconds N}
    first=$(( $(date +%s) % 1000000 * 1000 ))
    count=0
else
    seconds=0
    first=${2:-1}
    count=${3:-100}
fi
[ -x "$SWARM" ] || { echo "sim-soak.sh: no $SWARM (make first)" >&2; exit 2; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# pick N LIST...: the (seed-drawn) N-th word of LIST
pick() { shift "$(( $1 % ($# - 1) + 1 ))"; echo "$1"; }

# the swarm of seed $1, as swarm sim's flags: one seed in four a crowd
# (crowd_flags_of), the rest small
flags_of() {
    h=$(( ($1 * 2654435761 + 12345) % 4294967296 ))
    if [ $(( h / 65537 % 4 )) = 0 ]; then
        crowd_flags_of "$1"
        return
    fi
    stages=$(pick $(( h % 97 )) 2 2 3 4)
    kill=$(pick $(( h / 131 )) 0 3 5 8)
    # with kills, at least two replicas a stage on average and checkpoints
    # every 10 steps (else a kill that empties a stage sends the run back to
    # step 0 faster than it can get anywhere)
    if [ "$kill" = 0 ]; then
        peers=$(( stages + 1 + h / 7 % (13 - stages) )) save=""
    else
        peers=$(( 2 * stages + h / 7 % (13 - 2 * stages) )) save="--save-every 10"
    fi
    latency=$(pick $(( h / 1031 )) 0 5 20 50)
    batch=$(pick $(( h / 7919 )) 8 12 16)
    speeds=$(pick $(( h / 104729 )) 2000 2000,4000 1000x3,20000 3000x9,60000)
    echo "--peers $peers --stages $stages --layers 4 --heads 4 --embd 32 --block 16" \
         "--batch $batch --micro-batch 2 --iters 40 --eval-every 20 --eval-iters 2" \
         "--kill-every $kill $save --latency $latency --speeds $speeds --limit 3000 --seed $1"
}

# a crowd: 40-299 peers on 3-8 stages of a volunteer mix (CPUs of 25-100
# tok/s, a tenth GPUs 10-80 times faster) over links of 20-100 ms and
# 10-100 Mbit/s, with 0-5 liars (every synthetic way, verifiers that lie
# only in what they recompute too) and, at once, kills or departures and
# stalls. (Found: a replica banned after its sum came in
# and let back at once carried its sum to another stage; a liar's claim of
# next to nothing held each step for minutes.)
CROWD_LIES=nan,scale,drift,speed,grad,sumsq,dx,state,rmswalk,slowclaim,ckptstall,joinhold,recount
crowd_flags_of() {
    h=$(( ($1 * 2654435761 + 777) % 4294967296 ))
    peers=$(( 40 + h % 260 ))
    stages=$(( 3 + h / 300 % 6 ))
    kill=$(pick $(( h / 11 )) 0 15 30)
    leave=0
    [ "$kill" = 0 ] && leave=$(( h / 17 % 2 ))
    echo "--peers $peers --stages $stages --layers 8 --heads 2 --embd 8 --block 16" \
         "--micro-batch 4 --batch $(( (peers / stages + 4) * 4 )) --iters 60 --eval-every 0" \
         "--save-every 10 --speeds 25x6,50x6,100x6,1000,2000 --latency 20-100 --bandwidth 10-100" \
         "--liars $(( h / 7 % 6 )) --lies $CROWD_LIES --kill-every $kill --leave-rate $leave" \
         "--stall-every $(pick $(( h / 13 )) 0 20 40) --limit 100000 --seed $1"
}

# --numeric: the model (and its reference runs, one per batch size)
MODEL="--layers 4 --heads 4 --embd 32 --block 16 --micro-batch 2 --iters 30 --warmup 2"
MODEL="$MODEL --lr 1e-3 --eval-every 0 --seed 1337 --data $TMP/data.txt"
if [ $numeric = 1 ]; then
    head -c 30000 "$BUILD/corpus.txt" >"$TMP/data.txt"
    for b in 8 12; do
        # shellcheck disable=SC2086
        "$SWARM" train $MODEL --batch $b --threads 1 --quiet --loss-log "$TMP/ref$b.txt" \
            >/dev/null 2>&1 || { echo "sim-soak.sh: swarm train failed" >&2; exit 2; }
    done
fi

# the numeric swarm of seed $1: its faults are one of none, kills (and the
# joins that replace them), stalls (3 s, as SIGSTOP), both, or liars (every
# way of swarm sim --lies: NaNs, 1000x or reversed activations, drifting
# parameters, a false speed, reversed gradient sums or input gradients, a
# huge norm; every forward verified and every gradient sum audited, so
# that no lie reaches an update and the losses stay swarm train's). Liars
# come without kills: a liar left alone on its stage by a kill is one no
# check can tell (its replicas' consensus is what catches a drift).
numeric_flags_of() {
    h=$(( ($1 * 2654435761 + 777) % 4294967296 ))
    stages=$(pick $(( h % 89 )) 2 2 3 4)
    faults=$(pick $(( h / 97 )) none kills stalls both liars)
    batch=$(pick $(( h / 7919 )) 8 12)
    latency=$(pick $(( h / 1031 )) 0 5 20)
    speeds=$(pick $(( h / 104729 )) 2000 2000,4000 1000x3,20000)
    peers=$(( stages + 1 + h / 7 % (13 - stages) )) more=""
    case $faults in
        kills|both) peers=$(( 2 * stages + h / 7 % (13 - 2 * stages) ))
                    more="--kill-every $(pick $(( h / 131 )) 0.5 1 2) --save-every 5" ;;
    esac
    case $faults in
        stalls|both) more="$more --stall-every $(pick $(( h / 137 )) 2 4 8) --stall $(pick $(( h / 139 )) 1 2)" ;;
        liars) liars=$(( 1 + h / 139 % 2 ))
               peers=$(( 2 * stages + liars + h / 7 % (13 - 2 * stages - liars) ))
               more="--liars $liars --lies nan,scale,drift,shuffle,speed,grad,sumsq,dx,state --verify 1 --audit 1" ;;
    esac
    echo "--numeric --peers $peers --stages $stages $MODEL --batch $batch $more" \
         "--latency $latency --speeds $speeds --limit 3000 --sim-seed $1"
}

# losses_equal LOG REF: each step's last loss in LOG (a rollback logs the
# steps it replays again) equals REF's to 1e-4 relative, every step there
losses_equal() {
    awk '{ loss[$1] = $2 } END { for (s in loss) print s, loss[s] }' "$1" | sort -n \
        | paste -d' ' - "$2" | awk '
        { d = $2 - $4; if (d < 0) d = -d; if ($1 != $3 || d > 1e-4 * $4) bad++; n++ }
        END { exit !(n > 0 && bad == 0) }'
}

# run_seed SEED: its result in $TMP/res.SEED: nothing, or the lines of a failure
run_seed() {
    if [ $numeric = 1 ]; then
        f="$(numeric_flags_of "$1") --loss-log $TMP/loss.$1.txt"
    else
        f=$(flags_of "$1")
    fi
    # shellcheck disable=SC2086
    out=$(SWARM_PLAIN=1 timeout 60 "$SWARM" sim $f 2>/dev/null | grep "^sim |")
    if [ $numeric = 1 ] && [ "${out##*invariants }" = ok ] \
        && ! losses_equal "$TMP/loss.$1.txt" "$TMP/ref$(echo "$f" | sed 's/.*--batch \([0-9]*\).*/\1/').txt"; then
        out="$out, but its losses differ from swarm train's"
    fi
    rm -f "$TMP/loss.$1.txt"
    case "$out" in
        *"invariants ok") : >"$TMP/res.$1" ;;
        *) printf "FAIL seed %s: %s\n     replay: %s\n" "$1" "${out:-no sim line (crashed or timed out)}" \
               "$SWARM sim $f" >"$TMP/res.$1" ;;
    esac
}

# JOBS seeds at a time (default: one a core), their results in seed order
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 1)}
ran=0 failed=0 seed=$first start=$(date +%s)
while :; do
    if [ "$seconds" -gt 0 ]; then
        [ $(( $(date +%s) - start )) -ge "$seconds" ] && break
        n=$JOBS
    else
        [ $ran -ge "$count" ] && break
        n=$(( count - ran < JOBS ? count - ran : JOBS ))
    fi
    k=0
    while [ $k -lt "$n" ]; do
        run_seed $((seed + k)) &
        k=$((k + 1))
    done
    wait
    k=0
    while [ $k -lt "$n" ]; do
        if [ -s "$TMP/res.$((seed + k))" ]; then
            cat "$TMP/res.$((seed + k))"
            failed=$((failed + 1))
        fi
        rm -f "$TMP/res.$((seed + k))"
        k=$((k + 1))
    done
    ran=$((ran + n))
    seed=$((seed + n))
done
echo "sim-soak: $ran $([ $numeric = 1 ] && echo "numeric ")seeds ($first..$((seed - 1))), $failed failed"
[ $failed -eq 0 ]
