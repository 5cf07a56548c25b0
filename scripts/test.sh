#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test: the release build (every test except
# the label "long": training to a quality target for minutes), then the ASan+UBSan build of the
# libraries and their unit tests (every test not labelled "slow" or "long"; the process-level
# tests of apps/ run in the release build only), built while the release tests run. Each stage
# prints how long it took.
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

# The sanitizer build runs beside the release tests, at the lowest priority: the release tests
# spend most of their time waiting for devnet blocks, and the build takes that idle CPU instead of
# running after them. It runs in a session of its own, so that a failure stops all of it; where the
# kernel shares CPU time by session (sched_autogroup), that session is lowered too, since `nice`
# alone then only orders processes within one session.
asan_pid=""
if [ "$release_only" -eq 0 ]; then
  mkdir -p build-asan
  setsid -w bash -c '{ echo 19 > /proc/self/autogroup; } 2> /dev/null || true
                     exec nice -n 19 bash scripts/build.sh asan' > build-asan/build.log 2>&1 &
  asan_pid=$!
  trap 'kill -- -"$asan_pid" 2> /dev/null || true' EXIT
fi
echo "== release tests =="
long=(-LE long)
if [ -n "${MESHLEARN_SLOW_TESTS:-}" ]; then long=(); fi
release_status=0
ctest --test-dir build -j "$jobs" --output-on-failure --timeout 900 "${long[@]}" || release_status=$?
stage_done "the release tests"
if [ "$release_status" -ne 0 ]; then exit "$release_status"; fi

if [ "$release_only" -eq 0 ]; then
  if ! wait "$asan_pid"; then
    cat build-asan/build.log >&2
    echo "test.sh: the sanitizer build failed" >&2
    exit 1
  fi
  trap - EXIT
  stage_done "the rest of the sanitizer build"
  echo "== sanitizer tests (ASan + UBSan, labels 'slow' and 'long' excluded) =="
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan -j "$jobs" --output-on-failure --timeout 1200 -LE 'slow|long'
  stage_done "the sanitizer tests"
fi
echo "test.sh: all tests passed in $(( $(date +%s) - start ))s"
