#!/usr/bin/env bash
# The weight-streaming products on the GPU machine, in one call (carry ".device/carry", made by
# scripts/device-bundle.sh): backend_compare's product tests with each loop form, then
# tests/bench/cuda_benchmark at one and two rows for each form and each forced split
# (LMSERVE_CUDA_GEMV_PIPE=0 / 1: one buffer / two; LMSERVE_CUDA_GEMV_SPLIT), then `bench
# latency` at batch 1, alternating the default rules and the switches given by PICK (default
# "LMSERVE_CUDA_GEMV_PIPE=0"). Logs go to $OUT; a summary is printed last.
set -uo pipefail
source "$(dirname "$0")/device-env.sh"
: > "$OUT/summary.txt"
row() { echo "$*" >> "$OUT/summary.txt"; }
for pipe in 0 1; do
  LMSERVE_CUDA_GEMV_PIPE=$pipe timeout 200 $B/tests/backend_compare_test --gtest_filter='*ActOps*Gemm*:*ActOps*GateUp*:*CudaModel*' > "$OUT/compare_pipe$pipe.log" 2>&1
  row "backend_compare products/model PIPE=$pipe rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/compare_pipe$pipe.log" | head -2 | tr '\n' ' ')"
done
for pipe in 0 1; do
  for split in rule 1 2 4 8; do
    env LMSERVE_CUDA_GEMV_PIPE=$pipe $([[ $split != rule ]] && echo LMSERVE_CUDA_GEMV_SPLIT=$split) timeout 120 $B/tests/cuda_benchmark \
      --benchmark_filter='n:(1|2)/' --benchmark_format=csv > "$OUT/products_pipe${pipe}_split$split.csv" 2> /dev/null
    row "== PIPE=$pipe SPLIT=$split: us per product (m,k,n,gate_up)"
    python3 - "$OUT/products_pipe${pipe}_split$split.csv" >> "$OUT/summary.txt" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head = next((r for r in rows if r and r[0] == "name"), None)
if head:
    col = {n: i for i, n in enumerate(head)}
    for r in rows[rows.index(head) + 1:]:
        name = r[0].split("/iterations")[0]
        if "us" in col and len(r) == len(head) and r[col["us"]]:
            print(f'  {name:48s} {float(r[col["us"]]):8.1f} us {float(r[col["GB/s"]]):7.0f} GB/s')
        else:
            print(f'  {name:48s} {r[-1]}')
PY
  done
done
M="--model tests/fixtures/configs/llama-3.1-8b --tokenizer .device/bundle/tok --load-format dummy"
for arm in default "${PICK:-LMSERVE_CUDA_GEMV_PIPE=0}" default "${PICK:-LMSERVE_CUDA_GEMV_PIPE=0}"; do
  env $([[ $arm != default ]] && echo "$arm") timeout 60 $B/bin/lmserve bench latency $M --batch-size 1 --input-len 128 --output-len 256 > /tmp/l.log 2>&1
  row "b1 $arm rc=$? $(grep -E '^decode step|^bandwidth bound' /tmp/l.log | tr '\n' ' ')"
done
cat "$OUT/summary.txt"
