#!/usr/bin/env bash
# Part-1 benchmarks on the GPU machine: Llama-3.1-8B shape, dummy bf16 weights. Each run's
# full output goes to $OUT/<name>.log; the last lines are printed as a table.
# Usage: [EXTRA="--device-sampling"] [BENCH_TIMEOUT=300] [LAT_BATCHES="1 8 64 256"]
#        [N128=1000] [N1000=100] [N2048=64] scripts/device-bench.sh [latency|throughput|all]
set -uo pipefail
export LD_LIBRARY_PATH=$PWD/.device/bundle/lib:/usr/local/cuda/lib64
L=.device/bundle/bin/lmserve
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
M="--model tests/fixtures/configs/llama-3.1-8b --tokenizer .device/bundle/tok --load-format dummy ${EXTRA:-}"
what=${1:-all}
run() {  # name, args...
  local name=$1; shift
  local t0=$(date +%s)
  timeout ${BENCH_TIMEOUT:-300} "$L" bench "$@" > "$OUT/$name.log" 2>&1
  local rc=$? t1=$(date +%s)
  printf '== %s (rc=%d, %d s): lmserve bench %s\n' "$name" $rc $((t1 - t0)) "$*" >> "$OUT/table.txt"
  grep -E '^(backend|prefill|decode|bandwidth|requests|engine|throughput)' "$OUT/$name.log" >> "$OUT/table.txt"
  [[ $rc == 0 ]] || tail -3 "$OUT/$name.log" >> "$OUT/table.txt"
}
: > "$OUT/table.txt"
if [[ $what == latency || $what == all ]]; then
  for b in ${LAT_BATCHES:-1 8 64 256}; do run "latency_b$b" latency $M --batch-size $b --input-len 128 --output-len 256; done
fi
if [[ $what == throughput || $what == all ]]; then
  for kv in bfloat16 fp8_e5m2; do
    run "tp_128_$kv" throughput $M --kv-cache-dtype $kv --input-len 128 --output-len 128 --num-prompts ${N128:-1000}
    run "tp_1000_$kv" throughput $M --kv-cache-dtype $kv --input-len 1000 --output-len 1000 --num-prompts ${N1000:-100}
    run "tp_2048_$kv" throughput $M --kv-cache-dtype $kv --input-len 2048 --output-len 2048 --num-prompts ${N2048:-64}
  done
fi
cat "$OUT/table.txt"
