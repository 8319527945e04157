#!/bin/sh
# demo.sh BUILD - train a small byte-level GPT for about a minute on the
# corpus built into swarm (its own docs and sources), show the loss falling,
# then generate a sample from the checkpoint. Needs no data file.
set -eu
BUILD=${1:-build}
SWARM="$BUILD/swarm"
DIR="$BUILD/demo"
rm -rf "$DIR"
echo "== swarm train: 600 steps of the baby GPT (L=4 H=4 C=128 T=64) on the built-in corpus"
"$SWARM" train --iters 600 --warmup 50 --lr 2e-3 --eval-every 100 --eval-iters 10 \
    --save "$DIR" --log-every 50
echo
echo "== swarm sample --ckpt $DIR --prompt 'static int ' --tokens 400"
"$SWARM" sample --ckpt "$DIR" --prompt "static int " --tokens 400 --temperature 0.7
echo
echo "== the loss curve is in $DIR/loss.csv; the weights in $DIR/model.bgpt (PyTorch-loadable)"
