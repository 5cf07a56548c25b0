#!/usr/bin/env bash
# The main job: installs what is missing, builds (release), and runs a local meshlearn network
# that trains a real model on Fashion-MNIST with verification — or, until the devnet lands in
# this checkout, a local training run of the same model.
#
# Usage: scripts/run.sh [extra devnet/train flags]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh release meshlearn
bin=build/apps/meshlearn
out=out
mkdir -p "$out"
if "$bin" devnet --help >/dev/null 2>&1; then
  exec "$bin" devnet --solvers 4 --task examples/fashion-mlp.toml --out "$out/devnet" "$@"
else
  exec "$bin" train examples/fashion-mlp.toml --out "$out/fashion-mlp" "$@"
fi
