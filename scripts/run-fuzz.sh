#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (preset `fuzz`) and runs each for a bounded time
# from the seeds in tests/fuzz/seeds (copied, so the repository is not modified).
# Usage: scripts/run-fuzz.sh [SECONDS_PER_TARGET [TARGET...]]   (default 45 s, every target).
# FUZZ_WORK=DIR keeps the corpora, logs and crash inputs there (default: a temporary directory,
# removed at the end); FUZZ_NO_BUILD=1 runs the binaries already in build/fuzz. With
# FUZZ_CPU_SECONDS=N each target runs until it has used N seconds of CPU (the long runs' measure,
# whatever else the machine is doing), SECONDS then being only an upper bound of wall time.
# FUZZ_TIMEOUT=S: libFuzzer's wall-clock limit per input (default 10 s; a long run at a low
# priority beside other work needs more, or a slow input's starved wall time reads as a hang).
# Exits non-zero on a crash.
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-45}
shift $(( $# > 0 ? 1 : 0 ))
targets=("$@")
(( ${#targets[@]} )) || targets=(tokenizer template safetensors grammar openai_request tool_calls gateway_config answer guard route_fields http_request upstream)
command -v clang++ >/dev/null || { echo "run-fuzz: clang++ not found (scripts/install-deps.sh installs it)" >&2; exit 1; }
if [[ -z ${FUZZ_NO_BUILD:-} ]]; then
  cmake --preset fuzz > build/fuzz.configure.log 2>&1 || { cat build/fuzz.configure.log; exit 1; }
  cmake --build --preset fuzz -j "$(nproc)" > build/fuzz.build.log 2>&1 || { tail -50 build/fuzz.build.log; exit 1; }
fi

if [[ -n ${FUZZ_WORK:-} ]]; then
  work=$FUZZ_WORK
  mkdir -p "$work"
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
rc=0
for target in "${targets[@]}"; do
  mkdir -p "$work/$target" "$work/$target-artifacts"
  cp tests/fuzz/seeds/$target/* "$work/$target/"
  TIMEFORMAT='%R %U %S'  # the target's wall, user and system seconds, from bash's `time`
  { time (
      build/fuzz/tests/fuzz/${target}_fuzz -max_total_time="$seconds" -rss_limit_mb=2048 -timeout="${FUZZ_TIMEOUT:-10}" \
        -artifact_prefix="$work/$target-artifacts/" -print_final_stats=1 "$work/$target" > "$work/$target.log" 2>&1 &
      pid=$!
      if [[ -n ${FUZZ_CPU_SECONDS:-} ]]; then
        ticks=$(getconf CLK_TCK)
        # SIGINT once the target's CPU time is spent: libFuzzer prints its statistics and exits 72.
        while kill -0 "$pid" 2>/dev/null; do
          used=$(awk -v t="$ticks" '{print int(($14 + $15) / t)}' "/proc/$pid/stat" 2>/dev/null || echo 0)
          ((used >= FUZZ_CPU_SECONDS)) && { kill -INT "$pid"; break; }
          sleep 5
        done
      fi
      wait "$pid"
      status=$?
      ((status == 72)) && grep -q "run interrupted" "$work/$target.log" && status=0
      exit $status
    ); } 2> "$work/$target.cpu"
  if (($? == 0)); then
    runs=$(sed -nE 's/.*stat::number_of_executed_units: *([0-9]+).*/\1/p' "$work/$target.log")
    cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+' "$work/$target.log" | tail -1)
    read -r wall cpu < <(awk '{printf "%.0f %.0f", $1, $2 + $3}' "$work/$target.cpu")
    echo "fuzz ${target}_fuzz: ${runs:-?} inputs in ${wall}s (${cpu} CPU s), no crash (${cov:-cov ?})"
  else
    echo "fuzz ${target}_fuzz: FAILED"
    grep -E "^(==[0-9]+==|SUMMARY|    #[0-9] )" "$work/$target.log" | head -20
    for f in "$work/$target-artifacts"/*; do [[ -f $f ]] && { echo "input ($f):"; base64 "$f"; }; done
    rc=1
  fi
done
exit $rc
