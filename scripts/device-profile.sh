#!/usr/bin/env bash
# One engine step of the Llama-3.1-8B shape kernel by kernel under ncu (GPU machine; bundle from
# scripts/device-bundle.sh in .device/carry): `lmserve bench latency --enforce-eager` with
# --profile-step bracketing the chosen step, ncu timing each kernel
# (gpu__time_duration, clocks left alone). Writes $OUT/ncu_NAME.csv and prints its summary
# (scripts/ncu-summary.py).
# Usage: [BUNDLE=.device/carry/x.tar.gz] scripts/device-profile.sh NAME STEP [bench latency options]
#   STEP: decode:N (the N-th decode step) | prefill:N | N
#   e.g. scripts/device-profile.sh b200_ctx1500 decode:2 --batch-size 200 --input-len 1500 --output-len 4
# KERNEL=REGEX [COUNT=1]: instead, ncu's full section set (stall reasons, occupancy, memory and
# pipe use) for the first COUNT kernels of that step whose names match, as text in $OUT/ncu_NAME.txt,
# of which the headline metrics are printed.
set -uo pipefail
name=$1 step=$2
shift 2
export LD_LIBRARY_PATH=$PWD/.device/bundle/lib:/usr/local/cuda/lib64
bundle=${BUNDLE:-.device/carry/bundle.tar.gz}
if [[ -f $bundle && ! -x .device/bundle/bin/lmserve ]]; then tar -C .device -xzf "$bundle"; fi
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
NCU=$(ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
args=(bench latency --model tests/fixtures/configs/llama-3.1-8b --tokenizer .device/bundle/tok
  --load-format dummy --enforce-eager --gpu-memory-utilization ${GPU_MEM:-0.6} --profile-step "$step" "$@")
if [[ -n ${KERNEL:-} ]]; then
  timeout ${PROFILE_TIMEOUT:-180} "$NCU" --clock-control none --profile-from-start off \
    --set full --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio" -k "regex:$KERNEL" -c ${COUNT:-1} .device/bundle/bin/lmserve "${args[@]}" > "$OUT/ncu_$name.txt" 2>&1
  echo "ncu $name ($KERNEL): rc=$?"
  grep -E '^  [a-z_]+.*\(|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Executed Ipc A|No Eligible|Warp Cycles Per Issued|L1/TEX Hit|L2 Hit|Dynamic Shared|Bank' "$OUT/ncu_$name.txt" | head -${TOP:-60}
  # The largest stall reasons of each kernel (warps stalled per issued instruction).
  awk '/^  [a-zA-Z_].*\(/ {k=$0} /issue_stalled/ && $NF+0 > 0.3 {print "   ", $1, $NF}' "$OUT/ncu_$name.txt" | sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | head -40
  exit 0
fi
timeout ${PROFILE_TIMEOUT:-180} "$NCU" --clock-control none --profile-from-start off \
  --metrics gpu__time_duration.sum --csv --log-file "$OUT/ncu_$name.csv" .device/bundle/bin/lmserve "${args[@]}" > "$OUT/ncu_$name.log" 2>&1
echo "ncu $name: rc=$?"
python3 scripts/ncu-summary.py "$OUT/ncu_$name.csv" | head -${TOP:-16}
