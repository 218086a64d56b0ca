#!/usr/bin/env bash
# Tensor parallelism on the GPU machine (issue #36; carry ".device/carry", made by
# scripts/device-bundle.sh): the CUDA TP tests of backend_compare, each in its own process (a rank
# that never meets its peers ends its step with a device error after 60 s, which poisons that
# process's CUDA context: the tests after it would fail for nothing), then the rest of
# backend_compare (TP 1). On one GPU the ranks share it; with GPUS >= 2 (nvidia-h200-x2) the
# 8B-shaped benches of TP 1 and TP 2 and a 70B-shaped b1 at TP 2 follow (BENCH=0 skips them).
# Usage: [GPUS=2] [TP_AR="peer nccl"] scripts/device-tp.sh
set -uo pipefail
source "$(dirname "$0")/device-env.sh"
row() { printf '%-60s %s\n' "$1" "$2" | tee -a "$OUT/summary.txt"; }
: > "$OUT/summary.txt"
for t in 'Fixtures/CudaTensorParallel.MatchesOneRank/*' 'CudaTensorParallel.DeviceSamplingOnRankZero' 'CudaTensorParallel.SwappedBlocksComeBackExactly' \
         'CudaTensorParallel.Fp8WeightsMatchTheCpusRanks'; do
  log="$OUT/tp_$(echo "$t" | tr -c 'A-Za-z0-9\n' '_').log"
  timeout 300 $B/tests/backend_compare_test --gtest_filter="$t" > "$log" 2>&1
  row "$t" "rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$log" | head -2 | tr '\n' ' ')"
  grep -E '^\[ cuda tp \]' "$log" >> "$OUT/tp_figures.txt"
done
timeout 300 $B/tests/backend_compare_test --gtest_filter='-*CudaTensorParallel*' > "$OUT/compare.log" 2>&1
row "backend_compare_test (the rest)" "rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/compare.log" | head -2 | tr '\n' ' ')"
if [[ ${GPUS:-1} -ge 2 && ${BENCH:-1} == 1 ]]; then
  common=(--model tests/fixtures/configs/llama-3.1-8b --tokenizer $B/tok --load-format dummy --device cuda)
  for tp in 1 2; do
    for ar in ${TP_AR:-peer}; do
      [[ $tp == 1 && $ar != peer ]] && continue
      opt=(--tensor-parallel-size $tp --tensor-parallel-all-reduce $ar)
      timeout 300 $B/bin/lmserve bench latency "${common[@]}" "${opt[@]}" --batch-size 1 --input-len 128 --output-len 256 > "$OUT/b1_tp${tp}_$ar.log" 2>&1
      row "b1 TP $tp $ar" "rc=$? $(grep -iE 'step|avg' "$OUT/b1_tp${tp}_$ar.log" | tail -1)"
      timeout 300 $B/bin/lmserve bench throughput "${common[@]}" "${opt[@]}" --input-len 128 --output-len 128 --num-prompts 3000 > "$OUT/t128_tp${tp}_$ar.log" 2>&1
      row "128/128 TP $tp $ar" "rc=$? $(grep -iE 'tok/s|tokens/s' "$OUT/t128_tp${tp}_$ar.log" | tail -1)"
    done
  done
  # Llama-3.1-70B's shape in bf16 (141 GB of weights): loads and serves only split over two GPUs.
  big=(--model tests/fixtures/configs/llama-3.1-70b --tokenizer $B/tok --load-format dummy --device cuda --tensor-parallel-size 2)
  timeout 400 $B/bin/lmserve bench latency "${big[@]}" --batch-size 1 --input-len 128 --output-len 128 > "$OUT/b1_70b_tp2.log" 2>&1
  row "70B b1 TP 2" "rc=$? $(grep -iE 'step|avg' "$OUT/b1_70b_tp2.log" | tail -1)"
fi
echo "== figures"; cat "$OUT/tp_figures.txt" 2>/dev/null
