#!/usr/bin/env bash
# clang-tidy on the C++ files changed against origin/main (or the last commit when there is no
# remote). Usage: scripts/lint.sh [build-dir]   (needs compile_commands.json from a configure)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
base=$(git rev-parse --verify -q origin/main || git rev-parse HEAD~1 2>/dev/null || true)
files=$(git diff --name-only ${base:+"$base"} -- '*.cc' | while read -r f; do [ -f "$f" ] && echo "$f"; done)
if [ -z "$files" ]; then
  echo "lint: no changed .cc files"
  exit 0
fi
echo "lint: clang-tidy on $(echo "$files" | wc -l) file(s)"
clang-tidy -p "$build" --quiet $files
