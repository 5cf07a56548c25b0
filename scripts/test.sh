#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test: the release build (every test except
# the label "long": training to a quality target for minutes), then the ASan+UBSan build of the
# libraries and their unit tests (every test not labelled "slow" or "long"; the process-level
# tests of apps/ run in the release build only).
#
# Usage: scripts/test.sh                 what CI runs
#        scripts/test.sh --release-only  skip the sanitizer build
#        MESHLEARN_SLOW_TESTS=1 scripts/test.sh   also the long scenarios: the CNN quality target,
#                                                robust aggregation trained to the accuracy target
#                                                for every rule, more crash-test kills
set -euo pipefail
cd "$(dirname "$0")/.."
release_only=0
for arg in "$@"; do
  case "$arg" in
    --release-only) release_only=1 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "test.sh: unknown option '$arg'" >&2; exit 2 ;;
  esac
done

bash scripts/setup.sh --test
jobs="${MESHLEARN_JOBS:-$(nproc)}"
start=$(date +%s)

# Each stage says how long it took, so a CI log shows where the time goes.
stage_start=$(date +%s)
stage_done() {
  echo "test.sh: $1 took $(( $(date +%s) - stage_start ))s"
  stage_start=$(date +%s)
}

bash scripts/build.sh release
stage_done "the release build"
echo "== release tests =="
long=(-LE long)
if [ -n "${MESHLEARN_SLOW_TESTS:-}" ]; then long=(); fi
ctest --test-dir build -j "$jobs" --output-on-failure --timeout 900 "${long[@]}"
stage_done "the release tests"

if [ "$release_only" -eq 0 ]; then
  bash scripts/build.sh asan
  stage_done "the sanitizer build"
  echo "== sanitizer tests (ASan + UBSan, labels 'slow' and 'long' excluded) =="
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan -j "$jobs" --output-on-failure --timeout 1200 -LE 'slow|long'
  stage_done "the sanitizer tests"
fi
echo "test.sh: all tests passed in $(( $(date +%s) - start ))s"
