#!/bin/sh
# sim-audit.sh BUILD [SEEDS] [AUDIT] [LIE_FROM] - how soon audits catch a
# liar that lies in every gradient sum: SEEDS (default 200) synthetic
# swarms of 9 peers on 3 stages (three replicas each), one of them a `grad`
# liar from a step 1..4 on, 60 steps at --audit AUDIT (default: swarm's,
# 0.3). For each seed swarm sim says how many steps after its first lie
# the liar was caught, and how many of its unaudited sums were applied
# before. Prints the share of seeds caught within 20 steps next to what
# the sampling rate gives (1 - (1 - AUDIT)^20), the most steps any seed
# took, and the unaudited lies applied on average; the last line is
#   audit | seeds N | within 20: X (computed Y) | most steps M | applied A a seed | never caught K | failed F
# LIE_FROM: the liar is honest until that step (--lie-from), long enough
# to have passed its audits (proven: drawn at --audit-proven, a tenth of
# AUDIT), and the run is LIE_FROM + 400 steps; computed is then
# 1 - (1 - AUDIT / 10)^20.
# A measurement: it exits 1 only when a run breaks an invariant or a liar
# is never caught.
BUILD=${1:-build}
SEEDS=${2:-200}
AUDIT=${3:-0.3}
LIE_FROM=${4:-}
SWARM="$BUILD/swarm"
[ -x "$SWARM" ] || { echo "sim-audit.sh: no $SWARM (make first)" >&2; exit 2; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
iters=60 late="" rate=$AUDIT
if [ -n "$LIE_FROM" ]; then
    iters=$((LIE_FROM + 400)) late="--lie-from $LIE_FROM"
    rate=$(awk -v a="$AUDIT" 'BEGIN { print (a >= 1 ? 1 : a / 10) }')
fi

failed=0
for seed in $(seq 1 "$SEEDS"); do
    if ! SWARM_PLAIN=1 "$SWARM" sim --peers 9 --stages 3 --layers 3 --heads 4 --embd 32 \
        --block 16 --batch 12 --micro-batch 2 --iters "$iters" --eval-every 0 --liars 1 --lies grad \
        $late --audit "$AUDIT" --sim-seed "$seed" >"$TMP/out" 2>&1; then
        failed=$((failed + 1))
        echo "FAIL seed $seed: $(tail -1 "$TMP/out")"
        continue
    fi
    # "lying gradient sums: caught at most N steps after the first, M unaudited applied, K liars never caught"
    sed -n 's/.*caught at most \(-\{0,1\}[0-9]*\) steps after the first, \([0-9]*\) unaudited applied, \([0-9]*\) liars never caught.*/\1 \2 \3/p' \
        "$TMP/out" >>"$TMP/seen"
done
awk -v seeds="$SEEDS" -v audit="$rate" -v failed="$failed" '
    { n++; if ($1 >= 0 && $1 <= 20) within++; if ($1 > most) most = $1; applied += $2; loose += $3 }
    END {
        printf "audit | seeds %d | within 20: %.3f (computed %.4f) | most steps %d | applied %.2f a seed | never caught %d | failed %d\n",
            seeds, n ? within / n : 0, 1 - (1 - audit) ^ 20, most, n ? applied / n : 0, loose, failed
        exit failed > 0 || loose > 0 || n < seeds - failed
    }' "$TMP/seen"
