#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan + coverage in the libraries too) and runs
# a short pass of each over its committed seed corpus. New interesting inputs go to a scratch
# directory, not into fuzz/corpus/; copy the ones worth keeping by hand.
#
# Usage: scripts/fuzz.sh [runs]          inputs per target (default 20000)
#        FUZZ_TARGETS="ledger_decode_fuzz" scripts/fuzz.sh 100000
#        MESHLEARN_JOBS=2                 build parallelism (default 2)
#
# Targets and corpora: ledger_decode_fuzz <- fuzz/corpus/ledger_decode (transaction and block
# decoding), rpc_fuzz <- fuzz/corpus/rpc (JSON-RPC handlers). A crash leaves its input as
# crash-* in the working directory and makes this script fail.
set -euo pipefail
cd "$(dirname "$0")/.."
runs="${1:-20000}"
jobs="${MESHLEARN_JOBS:-2}"
targets="${FUZZ_TARGETS:-ledger_decode_fuzz rpc_fuzz}"

if ! command -v clang++ >/dev/null; then
  echo "fuzz.sh: clang++ is needed (apt-get install clang)" >&2
  exit 1
fi

cmake -S . -B build-fuzz -G Ninja \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DMESHLEARN_BUILD_FUZZ=ON -DMESHLEARN_BUILD_TESTS=OFF >/dev/null

corpus_of() {
  case "$1" in
    ledger_decode_fuzz) echo fuzz/corpus/ledger_decode ;;
    rpc_fuzz) echo fuzz/corpus/rpc ;;
    *) echo "fuzz/corpus/${1%_fuzz}" ;;
  esac
}

status=0
for t in $targets; do
  if ! ninja -C build-fuzz -t targets all | grep -q "^$t:"; then
    echo "fuzz.sh: target $t is not defined in this tree; skipping"
    continue
  fi
  ninja -C build-fuzz -j "$jobs" "$t"
  bin=$(find build-fuzz -type f -name "$t" -perm -u+x | head -n 1)
  scratch=$(mktemp -d)
  echo "== $t: $runs runs over $(corpus_of "$t") =="
  if ! "$bin" -runs="$runs" -max_len=65536 -timeout=10 "$scratch" "$(corpus_of "$t")"; then
    status=1
  fi
  rm -rf "$scratch"
done
exit "$status"
