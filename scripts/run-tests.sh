#!/usr/bin/env bash
# Runs every test of a built preset (make test): CTest, the fuzz targets for a bounded time
# (LMSERVE_FUZZ_SECONDS per target, default 45; 0 skips), then the end-to-end suite
# (tests/e2e/run.sh: lmserve serve driven by the official openai npm client). Prints why skipped tests were skipped (e.g. no GPU) and ends with one line,
# "tests: N passed, N failed, N skipped". Exits non-zero on any failure.
set -uo pipefail
preset=${1:-release}
build="build/$preset"
cd "$(dirname "$0")/.."

"$build/lmserve" version | sed 's/^/  /'
out=$(mktemp)
trap 'rm -f "$out"' EXIT
ctest --preset "$preset" -j "$(nproc)" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}

total=$(sed -nE 's/.*tests passed, ([0-9]+) tests? failed out of ([0-9]+).*/\2/p' "$out" | tail -1)
failed=$(sed -nE 's/.*tests passed, ([0-9]+) tests? failed out of ([0-9]+).*/\1/p' "$out" | tail -1)
skipped=$(grep -cE '^\s+[0-9]+ - .*\((Skipped|Disabled)\)$' "$out")
if [[ -z $total ]]; then
  echo "run-tests: ctest printed no summary" >&2
  exit 1
fi

log="$build/Testing/Temporary/LastTest.log"
if ((skipped > 0)) && [[ -f $log ]]; then
  echo "Skipped tests and why:"
  grep -A1 ": Skipped" "$log" | grep -v -e ": Skipped" -e '^--$' | sort | uniq -c | sed 's/^/  /'
fi

# Bounded fuzzing of every libFuzzer target (scripts/run-fuzz.sh), 30 s each by default.
fuzz_seconds=${LMSERVE_FUZZ_SECONDS:-30}
if ((fuzz_seconds > 0)); then
  fuzz_out=$(scripts/run-fuzz.sh "$fuzz_seconds")
  fuzz_rc=$?
  echo "$fuzz_out"
  fuzz_pass=$(grep -c "no crash" <<<"$fuzz_out")
  fuzz_targets=$(grep -c "^fuzz " <<<"$fuzz_out")
  total=$((total + fuzz_targets))
  failed=$((failed + fuzz_targets - fuzz_pass))
  ((fuzz_rc == 0)) || rc=1
fi

if [[ -x tests/e2e/run.sh ]]; then
  e2e_out=$(tests/e2e/run.sh "$build/lmserve" 2>&1)
  e2e_rc=$?
  echo "$e2e_out" | grep -E "^(not ok|# (tests|pass|fail))|^e2e:" || true
  e2e_pass=$(sed -nE 's/^# pass ([0-9]+)$/\1/p' <<<"$e2e_out" | tail -1)
  e2e_fail=$(sed -nE 's/^# fail ([0-9]+)$/\1/p' <<<"$e2e_out" | tail -1)
  total=$((total + ${e2e_pass:-0} + ${e2e_fail:-0}))
  failed=$((failed + ${e2e_fail:-0}))
  if ((e2e_rc != 0)); then
    rc=1
    ((${e2e_fail:-0} > 0)) || { failed=$((failed + 1)); total=$((total + 1)); echo "$e2e_out" | tail -20; }
  fi
fi
echo "tests: $((total - failed - skipped)) passed, $failed failed, $skipped skipped"
exit $rc
