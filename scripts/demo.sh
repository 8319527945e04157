#!/bin/sh
# demo.sh BUILD - a local swarm on this machine: a router and 2 nodes, each
# serving one of 2 pipeline stages of a small byte-level GPT (L=4 H=4 C=128
# T=64), train for about a minute on the corpus built into swarm
# (its own docs and sources), showing the loss fall; then a sample from the
# router's checkpoint. Needs no data file and no network beyond loopback.
set -eu
BUILD=${1:-build}
DIR="$BUILD/demo"
rm -rf "$DIR"
echo "== scripts/local-swarm.sh -n 2 -s 2: a router and 2 nodes on loopback, 1500 steps"
sh scripts/local-swarm.sh --build "$BUILD" -n 2 -s 2 --iters 1500 --warmup 40 --lr 2e-3 \
    --eval-every 250 --eval-iters 10 --save "$DIR"
echo
echo "== swarm sample --ckpt $DIR --prompt 'static int ' --tokens 400"
"$BUILD/swarm" sample --ckpt "$DIR" --prompt "static int " --tokens 400 --temperature 0.7
echo
echo "== the loss curve: $DIR/loss.csv and $DIR/loss.svg; the weights: $DIR/model.bgpt"
echo "== train the same model in one process: $BUILD/swarm train --save DIR (see README)"
