#!/usr/bin/env bash
# One engine step of the Llama-3.1-8B shape kernel by kernel under ncu (GPU machine; bundle from
# scripts/device-bundle.sh in .device/carry): `lmserve bench latency --enforce-eager` with
# LMSERVE_CUDA_PROFILE_STEP bracketing the chosen step, ncu timing each kernel
# (gpu__time_duration, clocks left alone). Writes $OUT/ncu_NAME.csv and prints its summary
# (scripts/ncu-summary.py).
# Usage: [BUNDLE=.device/carry/x.tar.gz] scripts/device-profile.sh NAME STEP [bench latency options]
#   STEP: decode:N (the N-th decode step) | prefill:N | N
#   e.g. scripts/device-profile.sh b200_ctx1500 decode:2 --batch-size 200 --input-len 1500 --output-len 4
set -uo pipefail
name=$1 step=$2
shift 2
export LD_LIBRARY_PATH=$PWD/.device/bundle/lib:/usr/local/cuda/lib64
bundle=${BUNDLE:-.device/carry/bundle.tar.gz}
if [[ -f $bundle && ! -x .device/bundle/bin/lmserve ]]; then tar -C .device -xzf "$bundle"; fi
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
NCU=$(ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
LMSERVE_CUDA_PROFILE_STEP=$step timeout ${PROFILE_TIMEOUT:-180} "$NCU" --clock-control none --profile-from-start off \
  --metrics gpu__time_duration.sum --csv --log-file "$OUT/ncu_$name.csv" \
  .device/bundle/bin/lmserve bench latency --model tests/fixtures/configs/llama-3.1-8b --tokenizer .device/bundle/tok \
  --load-format dummy --enforce-eager --gpu-memory-utilization ${GPU_MEM:-0.6} "$@" > "$OUT/ncu_$name.log" 2>&1
echo "ncu $name: rc=$?"
python3 scripts/ncu-summary.py "$OUT/ncu_$name.csv" | head -${TOP:-16}
