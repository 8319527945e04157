#!/bin/sh
# sim-soak.sh BUILD FIRST COUNT | BUILD --seconds N - swarm sim on many seeds,
# each a different small swarm drawn from its seed: 3-12 peers on 2-4
# stages of uneven speeds (CPUs and a GPU), links of 0-50 ms, peers killed
# and replaced every 3-8 virtual seconds (with checkpoints every 10 steps)
# or never, evaluations, spot checks. Seeds FIRST..FIRST+COUNT-1, or fresh seeds (from the clock) for N
# seconds. Prints one line per failing seed with the command that replays
# it, then "sim-soak: N seeds (FIRST..LAST), N failed"; exits 1 on a failure.
set -u
BUILD=${1:-build}
SWARM="$BUILD/swarm"
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

# pick N LIST...: the (seed-drawn) N-th word of LIST
pick() { shift "$(( $1 % ($# - 1) + 1 ))"; echo "$1"; }

# the swarm of seed $1, as swarm sim's flags
flags_of() {
    h=$(( ($1 * 2654435761 + 12345) % 4294967296 ))
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

ran=0 failed=0 seed=$first start=$(date +%s)
while :; do
    if [ "$seconds" -gt 0 ]; then
        [ $(( $(date +%s) - start )) -ge "$seconds" ] && break
    elif [ $ran -ge "$count" ]; then
        break
    fi
    f=$(flags_of "$seed")
    # shellcheck disable=SC2086
    out=$(SWARM_PLAIN=1 timeout 60 "$SWARM" sim $f 2>/dev/null | grep "^sim |")
    case "$out" in
        *"invariants ok") ;;
        *) failed=$((failed + 1))
           echo "FAIL seed $seed: ${out:-no sim line (crashed or timed out)}"
           echo "     replay: $SWARM sim $f" ;;
    esac
    ran=$((ran + 1))
    seed=$((seed + 1))
done
echo "sim-soak: $ran seeds ($first..$((seed - 1))), $failed failed"
[ $failed -eq 0 ]
