#!/usr/bin/env bash
# The main job: installs what is missing, builds (release), and runs a local meshlearn network —
# a ledger and 4 nodes as processes on loopback — that trains the Fashion-MNIST MLP with DiLoCo
# (`meshlearn devnet`, docs/submitters.md), with verification on and one of the 4 solvers a
# deliberate cheater (`--adversary solver:lazy`: it skips steps), so the run shows verification
# catching, slashing and not paying it while the model still ends bit-equal to an honest run.
# The task runs at `full` assurance (every segment of every unit replayed by another node), so a
# node that poisons the model instead (`--adversary solver:noisy`) is caught every time too.
# Writes out/devnet/model.safetensors and
# out/devnet/report.json (the metric, rounds, units, bytes moved, the money: spent, paid to
# solvers, verifiers and aggregators, treasury cut, refunded; and whether the final weights equal
# the in-process reference bit for bit; every key in docs/submitters.md).
#
# Usage: scripts/run.sh [extra devnet flags, e.g. --task examples/fashion-cnn.toml]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh release meshlearn
bin=build/apps/meshlearn
out=out/devnet
# A devnet directory holds one chain: start each run from a fresh one.
rm -rf "$out"
mkdir -p out
exec "$bin" devnet --solvers 4 --task examples/fashion-mlp.toml --assurance full \
  --adversary solver:lazy --out "$out" "$@"
