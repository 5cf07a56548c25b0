#!/usr/bin/env bash
# Installs what meshlearn needs to build, test and run, from Debian packages only.
# Idempotent: installs only what is missing and runs `apt-get update` at most once.
# Usage: scripts/setup.sh            what the main job needs (scripts/run.sh)
#        scripts/setup.sh --test     also what only the tests need (scripts/test.sh)
# (as root, or with sudo available)
set -euo pipefail
with_test=0
for arg in "$@"; do
  case "$arg" in
    --test) with_test=1 ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option '$arg' (known: --test)" >&2; exit 2 ;;
  esac
done

# Build toolchain and libraries. Each line says why the package is here.
packages=(
  build-essential cmake ninja-build pkg-config git   # toolchain
  clang-format clang-tidy clang libclang-rt-14-dev   # format/lint targets, libFuzzer
  libsodium-dev          # BLAKE2b, ed25519, argon2id, secretbox
  libsqlite3-dev         # ledger storage
  libcpp-httplib-dev     # HTTP server and client
  nlohmann-json3-dev     # JSON-RPC, reports, --json output
  libcli11-dev           # command-line parsing
  libspdlog-dev libfmt-dev  # logging
  libtomlplusplus-dev    # config and task files
  libzstd-dev zlib1g-dev # zstd on the wire; gzip for IDX datasets
  libgtest-dev libgmock-dev  # unit tests
  libbenchmark-dev       # micro-benchmarks
  libopenblas-dev        # GEMM baseline in bench/ only
  dataset-fashion-mnist  # the real dataset for examples and tests
  prometheus             # promtool checks the GET /metrics pages in tests
  libpython3.11-minimal libpython3.11-stdlib  # the code-gpt corpus: /usr/lib/python3.11/**/*.py
)
# Only the tests use these; each test skips, visibly, where its package is missing.
if [ "$with_test" -eq 1 ]; then
  packages+=(
    chromium             # headless browser test of the dashboard (its charts are inline SVG)
    python3-nacl         # the Python client (python/): ed25519 signatures, encrypted keys
    python3-torch        # PyTorch comparisons: GPT-2 layout check, torch export, benches
    etcd-server etcd-client  # the replicated sequencer's tests (`chain serve --cluster`; etcdctl: backups)
  )
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${#missing[@]} missing package(s): ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"
