#!/bin/sh
# gpu_swarm.sh BUILD - a swarm whose one stage has two replicas, one node on
# the CPU and one on CUDA (`swarm node --device cuda`): the router compares
# their checksums after every step and there must be no mismatch (the CPU's
# AdamW applies the same summed gradient on both), the losses follow
# `swarm train --device cpu` to 1e-4 relative, the GPU node computed
# gradients, and it says what device memory it took. Says SKIP and passes without a usable GPU. Part of
# `make test-gpu`; test_cuda.sh runs it on the CPU emulation of the kernels.
# GPU_SWARM_STEPS (default 20) sets the run's length; CPU_SLOWDOWN slows the
# CPU node (node --slowdown) so that the other gets work too.
# Ends with "N passed, N failed".
BUILD=${1:-build}
SWARM="$BUILD/swarm"
. tests/lib.sh

STEPS=${GPU_SWARM_STEPS:-20}
FLAGS="--layers 2 --heads 4 --embd 64 --block 32 --batch 8 --micro-batch 2 --warmup 2 --lr 1e-2 --eval-every 0"
head -c 60000 "$BUILD/corpus.txt" >"$TMP/data.txt"
FLAGS="$FLAGS --data $TMP/data.txt --iters $STEPS"

# shellcheck disable=SC2086
if ! "$SWARM" train $FLAGS --iters 1 --device cuda --quiet >"$TMP/probe" 2>&1; then
    echo "SKIP: gpu_swarm: $(grep -m1 -- '--device cuda' "$TMP/probe" || tail -1 "$TMP/probe")"
    lib_done
    exit 0
fi

# shellcheck disable=SC2086
"$SWARM" train $FLAGS --device cpu --threads 1 --quiet --loss-log "$TMP/train.txt" >/dev/null 2>&1 \
    || bad "swarm train reference run"

"$SWARM" keygen "$TMP/router" >/dev/null
# shellcheck disable=SC2086
"$SWARM" router $FLAGS --stages 1 --min-nodes 2 --listen "tcp://127.0.0.1:0" --key "$TMP/router" \
    --loss-log "$TMP/swarm.txt" --log-every 5 >"$TMP/router.log" 2>&1 &
router=$!
pids="$router"
if ! endpoint=$(wait_endpoint "$TMP/router.log"); then
    bad "router did not start:"; cat "$TMP/router.log"
    lib_done; exit 1
fi
i=0
for device in cpu cuda; do
    i=$((i + 1))
    slow=""
    [ "$device" = cpu ] && [ -n "${CPU_SLOWDOWN:-}" ] && slow="--slowdown $CPU_SLOWDOWN"
    "$SWARM" keygen "$TMP/node$i" >/dev/null
    # shellcheck disable=SC2086
    "$SWARM" node --join "$endpoint" --router-key "$TMP/router.pub" --key "$TMP/node$i" \
        --threads 1 --device "$device" --name "$device" $slow >"$TMP/node$i.log" 2>&1 &
    pids="$pids $!"
    eval "node_$device=$!"
done

# while it trains: the GPU node says what device memory it took (the
# CPU's says none)
device_used=""
for _ in $(seq 1 3000); do
    kill -0 "$router" 2>/dev/null || break
    "$SWARM" status "$endpoint" --router-key "$TMP/router.pub" --json >"$TMP/status.json" 2>/dev/null
    device_used=$(jq -r '.peers[] | select(.name == "cuda") | .device_used // empty' "$TMP/status.json" 2>/dev/null)
    [ -n "$device_used" ] && break
    sleep 0.2
done
cpu_device=$(jq -r '.peers[] | select(.name == "cpu") | .device_used' "$TMP/status.json" 2>/dev/null)
if [ "${device_used:-0}" -gt 0 ] 2>/dev/null && [ "$cpu_device" = null ]; then
    ok "the GPU node took $((device_used / 1024)) KiB of device memory (its heartbeat's device_used; the CPU node: none)"
else
    bad "device memory: GPU node '$device_used', CPU node '$cpu_device'"
fi

if ! wait_exit "$router" 600; then
    bad "router still running after 600 s"; tail -20 "$TMP/router.log"
fi
wait "$router"
rc=$?
# shellcheck disable=SC2154
kill -INT "$node_cpu" "$node_cuda" 2>/dev/null
wait_exit "$node_cpu" 10
wait_exit "$node_cuda" 10

if clean_run $rc "$TMP/router.log" \
    && [ "$(grep -c "joins stage 0" "$TMP/router.log")" -ge 2 ]; then
    ok "a CPU and a GPU replica of one stage: checksums agreed after each of $STEPS steps"
else
    bad "router exit $rc:"; tail -n 20 "$TMP/router.log"; tail -n 5 "$TMP/node1.log" "$TMP/node2.log"
fi
if grep -q "cuda:" "$TMP/node2.log" && grep -q "cpu:" "$TMP/node1.log"; then
    ok "the nodes ran on $(grep -m1 -o 'cuda:[^:]*' "$TMP/node2.log") and the CPU"
else
    bad "devices"; head -5 "$TMP/node1.log" "$TMP/node2.log"
fi
work=$(sed -n 's/.*left the swarm (\([0-9]*\) micro-batches.*/\1/p' "$TMP/node2.log")
if [ "${work:-0}" -gt 0 ]; then
    ok "the GPU node computed $work of the $((STEPS * 4)) micro-batches' gradients"
else
    bad "the GPU node computed no gradient ('${work}')"; tail -5 "$TMP/node2.log"
fi
if losses_match "$TMP/swarm.txt" "$TMP/train.txt" "$STEPS"; then
    ok "every step's loss equals swarm train --device cpu's to 1e-4 relative"
else
    bad "losses differ:"; paste -d' ' "$TMP/final.txt" "$TMP/train.txt" | head -20
fi
lib_done
