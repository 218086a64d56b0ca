#!/usr/bin/env bash
# Part-1 CUDA checks on the GPU machine, in one call (carry ".device/carry", made by
# scripts/device-bundle.sh):
# backend_compare (its attention sweep covers each decode kernel and unit shape by its own
# arguments), the engine tests on CUDA, compute-sanitizer.
# Logs go to $OUT; a summary table is printed last. SANITIZE=0 skips compute-sanitizer;
# MEM_FILTER / RACE_FILTER narrow the sanitizer runs (racecheck is slow: minutes on model tests);
# RACE_ARGS adds compute-sanitizer options. Not --kernel-name-exclude kns=nvjet: with it (H200,
# CUDA 13.0) only the cuBLAS kernels ran and the tests of our kernels failed.
set -uo pipefail
source "$(dirname "$0")/device-env.sh"
row() { printf '%-44s %s\n' "$1" "$2" >> "$OUT/summary.txt"; }
: > "$OUT/summary.txt"
$B/bin/lmserve version --self-test > "$OUT/version.log" 2>&1; row "version --self-test" "rc=$?"
timeout 300 $B/tests/backend_compare_test > "$OUT/compare.log" 2>&1; rc=$?
row "backend_compare_test" "rc=$rc $(grep -E '^\[  (PASSED|FAILED)' "$OUT/compare.log" | head -2 | tr '\n' ' ')"
LMSERVE_TEST_BACKEND=cuda timeout 300 $B/tests/engine_e2e_test > "$OUT/engine_cuda.log" 2>&1; rc=$?
row "engine_e2e_test on CUDA" "rc=$rc $(grep -E '^\[  (PASSED|FAILED)' "$OUT/engine_cuda.log" | head -2 | tr '\n' ' ')"
if [[ ${SANITIZE:-1} == 1 ]]; then
  CS=/usr/local/cuda/bin/compute-sanitizer
  timeout 400 $CS --tool memcheck --error-exitcode 9 $B/tests/backend_compare_test --gtest_filter="${MEM_FILTER:-*ActOps*:*KvOps*bs16_gqa4*:*KvOps*bs32_gqa8*:*Padded*:*Rejects*:*DeviceSampl*:*demo*}" > "$OUT/memcheck.log" 2>&1
  row "compute-sanitizer memcheck" "rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)"
  timeout ${RACE_TIMEOUT:-400} $CS --tool racecheck --error-exitcode 9 ${RACE_ARGS:-} $B/tests/backend_compare_test --gtest_filter="${RACE_FILTER:-*ActOps*:*KvOps*bs16_gqa4_d128*:*KvOps*bs32_gqa8_d64*:*Padded*:*DeviceSampl*}" > "$OUT/racecheck.log" 2>&1
  row "compute-sanitizer racecheck" "rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck.log" | tail -1)"
fi
cat "$OUT/summary.txt"
