#!/usr/bin/env bash
# A gtest program's GPU tests (scripts/gpu-check.sh). A test that finds no
# GPU skips itself, and so reads as passed: here a run passes only if tests
# ran, every one passed, and none skipped but those named in ALLOWED_SKIPS
# (a comma list; a test that is one process's half of another).
# Usage: scripts/gpu/gtest.sh PROGRAM FILTER [ALLOWED_SKIPS]
set -uo pipefail
program=$1 filter=$2 allowed=${3:-}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$program" --gtest_filter="$filter" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
passed=$(sed -nE 's/^\[  PASSED  \] ([0-9]+) tests?\..*/\1/p' "$log" | tail -1)
skipped=$(grep -E '^\[  SKIPPED \] [A-Za-z_0-9]+\.[A-Za-z_0-9/]+' "$log" |
  awk '{print $4}' | sort -u | grep -vxF -e "${allowed//,/$'\n'}" -e '' || true)
if ((rc != 0)); then
  echo "gtest.sh: exit $rc"
  exit "$rc"
fi
if [[ -n $skipped ]]; then
  echo "gtest.sh: skipped, so not run on a GPU:" $skipped
  grep -m1 -E 'no GPU' "$log"
  exit 1
fi
if [[ -z $passed || $passed -eq 0 ]]; then
  echo "gtest.sh: no test ran (filter $filter)"
  exit 1
fi
echo "gtest.sh: $passed tests passed"
