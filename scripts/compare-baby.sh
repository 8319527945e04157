#!/bin/sh
# compare-baby.sh [BUILD] [swarm train flags...] - the baby GPT (L=4 H=4
# C=128 T=64 B=12, 2000 steps, lr 1e-3, seed 1337) from baby_init.bgpt,
# against PyTorch's baby_losses.txt: the mean per-step loss of every 250-step
# window within 0.02, and the val loss at step 2000 within 0.02 of 1.8617.
# Extra flags go to swarm train (e.g. --stages 2 --micro-batch 4).
# NODES=N runs it as a local swarm instead: a router and N nodes, one stage
# each (scripts/local-swarm.sh).
# A benchmark script, not a CI test: about 3-7 minutes on 2 cores.
set -eu
BUILD=${1:-build}
[ $# -gt 0 ] && shift
SHARED=${SWARM_SHARED:-../shared}
REF="$SHARED/data/ref"
if [ ! -f "$REF/baby_init.bgpt" ]; then
    echo "compare-baby: $REF/baby_init.bgpt not found; set SWARM_SHARED" >&2
    exit 1
fi
TMP=$(mktemp -d /tmp/swarm-baby.XXXXXX)
trap 'rm -rf "$TMP"' EXIT INT TERM
set -- --layers 4 --heads 4 --embd 128 --block 64 --batch 12 --iters 2000 \
    --lr 1e-3 --seed 1337 --eval-every 250 --eval-iters 20 --data "$SHARED/data/tinyshakespeare.txt" \
    --init "$REF/baby_init.bgpt" --loss-log "$TMP/losses.txt" --log-every 250 "$@"
if [ -n "${NODES:-}" ]; then
    sh scripts/local-swarm.sh --build "$BUILD" -n "$NODES" -s "$NODES" --steps 2000 "$@" | tee "$TMP/out"
else
    "$BUILD/swarm" train "$@" | tee "$TMP/out"
fi
echo
echo "window        swarm    PyTorch  diff"
paste -d' ' "$TMP/losses.txt" "$REF/baby_losses.txt" | awk '
    { w = int($1 / 250); s[w] += $2; p[w] += $5; n[w]++ }
    END {
        bad = 0
        for (i = 0; i < 8; i++) {
            d = (s[i] - p[i]) / n[i]; if (d < 0) d = -d
            printf "%4d-%-4d   %.4f   %.4f   %.4f %s\n", i * 250, i * 250 + 249, s[i] / n[i], p[i] / n[i], d, d <= 0.02 ? "ok" : "OVER 0.02"
            if (d > 0.02) bad = 1
        }
        exit bad
    }' && windows=ok || windows=bad
val=$(sed -n 's/^step  2000 | train [0-9.]* | val \([0-9.]*\).*/\1/p' "$TMP/out")
awk -v v="$val" 'BEGIN { d = v - 1.8617; if (d < 0) d = -d
    printf "val loss at step 2000: %s, PyTorch 1.8617, diff %.4f %s\n", v, d, d <= 0.02 ? "ok" : "OVER 0.02"
    exit d > 0.02 }' && vok=ok || vok=bad
[ "$windows" = ok ] && [ "$vok" = ok ] && echo "compare-baby: PASS" || { echo "compare-baby: FAIL"; exit 1; }
