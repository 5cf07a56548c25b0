#!/usr/bin/env bash
# Configures and builds one build type. Used by run.sh and test.sh; handy by hand too.
# Usage: scripts/build.sh [release|asan] [ninja targets...]
#   release -> build/       (-O2, warnings are errors)
#   asan    -> build-asan/  (Debug -O1 with AddressSanitizer + UndefinedBehaviorSanitizer; the
#              libraries and their unit tests, not apps/: see MESHLEARN_BUILD_APPS)
set -euo pipefail
cd "$(dirname "$0")/.."
kind="${1:-release}"
shift || true
jobs="${MESHLEARN_JOBS:-$(nproc)}"
case "$kind" in
  release)
    dir=build
    flags=(-DCMAKE_BUILD_TYPE=Release -DMESHLEARN_WERROR=ON -DMESHLEARN_BUILD_TESTS=ON)
    ;;
  asan)
    dir=build-asan
    flags=(-DCMAKE_BUILD_TYPE=Debug -DMESHLEARN_SANITIZE=ON -DMESHLEARN_WERROR=ON
           -DMESHLEARN_BUILD_TESTS=ON -DMESHLEARN_BUILD_BENCH=OFF -DMESHLEARN_BUILD_APPS=OFF)
    ;;
  *)
    echo "build.sh: unknown build kind '$kind'; use release or asan" >&2
    exit 2
    ;;
esac
# A second tree for parallel work (helpers, experiments): MESHLEARN_BUILD_DIR=build-x.
dir="${MESHLEARN_BUILD_DIR:-$dir}"
# ccache, where installed (developer machines), shares objects between build trees.
if command -v ccache > /dev/null; then
  flags+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
mkdir -p "$dir"
cmake -S . -B "$dir" -G Ninja "${flags[@]}" > "$dir/configure.log" 2>&1 || {
  cat "$dir/configure.log" >&2
  exit 1
}
echo "build: $kind in $dir/ with $jobs jobs"
ninja -C "$dir" -j "$jobs" "$@"
