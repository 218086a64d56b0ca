#!/usr/bin/env bash
# Part-1 benchmarks on the GPU machine: Llama-3.1-8B shape, dummy bf16 weights. Each run's
# full output goes to $OUT/<name>.log; the last lines are printed as a table.
# Usage: [EXTRA="--host-sampling"] [BENCH_TIMEOUT=300] [LAT_BATCHES="1 8 64 256"]
#        [TP_LENS="128 1000 2048"] [TP_KVS="bfloat16 fp8_e5m2"] [N128=1000] [N1000=100] [N2048=64]
#        [DEADLINE=<epoch seconds>: runs that would start later are skipped]
#        [NMIX=1000] (mixed: log-normal lengths, medians 400 in / 200 out, clipped at 4096, next to
#        the uniform run of the same means)
#        scripts/device-bench.sh [latency|throughput|mixed|all ...]   (in the order given)
set -uo pipefail
source "$(dirname "$0")/device-env.sh"
L=$B/bin/lmserve
M="--model tests/fixtures/configs/llama-3.1-8b --tokenizer .device/bundle/tok --load-format dummy ${EXTRA:-}"
run() {  # name, args...
  local name=$1; shift
  if [[ -n ${DEADLINE:-} && $(date +%s) -ge $DEADLINE ]]; then
    printf '== %s: skipped (deadline)\n' "$name" >> "$OUT/table.txt"
    return
  fi
  local t0=$(date +%s)
  timeout ${BENCH_TIMEOUT:-300} "$L" bench "$@" > "$OUT/$name.log" 2>&1
  local rc=$? t1=$(date +%s)
  printf '== %s (rc=%d, %d s): lmserve bench %s\n' "$name" $rc $((t1 - t0)) "$*" >> "$OUT/table.txt"
  grep -E '^(backend|prefill|decode|bandwidth|requests|engine|per step|throughput|====|mixed lengths)' "$OUT/$name.log" >> "$OUT/table.txt"
  [[ $rc == 0 ]] || tail -3 "$OUT/$name.log" >> "$OUT/table.txt"
}
touch "$OUT/table.txt"
for what in "${@:-all}"; do
  if [[ $what == latency || $what == all ]]; then
    for b in ${LAT_BATCHES:-1 8 64 256}; do run "latency_b$b" latency $M --batch-size $b --input-len 128 --output-len 256; done
  fi
  if [[ $what == throughput || $what == all ]]; then
    for len in ${TP_LENS:-128 1000 2048}; do
      n=N$len
      for kv in ${TP_KVS:-bfloat16 fp8_e5m2}; do
        run "tp_${len}_$kv" throughput $M --kv-cache-dtype $kv --input-len $len --output-len $len --num-prompts ${!n:-100}
      done
    done
  fi
  if [[ $what == mixed || $what == all ]]; then
    for kv in ${TP_KVS:-bfloat16 fp8_e5m2}; do
      run "mixed_$kv" throughput $M --kv-cache-dtype $kv --dataset-name mixed --mixed-input-median 400 --mixed-output-median 200 \
        --mixed-max-input-len 4096 --mixed-max-output-len 4096 --num-prompts ${NMIX:-1000} --compare-uniform
    done
  fi
done
cat "$OUT/table.txt"
