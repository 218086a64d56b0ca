#!/usr/bin/env bash
# Issue #31's flood on the GPU machine: `lmserve serve` (Llama-3.1-8B shape, dummy bf16 weights)
# under LOW_CLIENTS clients each sending a LOW_IN-token prompt for LOW_OUT tokens on the low lane,
# while one client asks HIGH_IN-token questions for HIGH_OUT tokens on the high lane, one after
# the other: one `bench serve` run with a --group per lane. Then (LEAK=1) a burst of the same
# flood cut off after LEAK_SECONDS (every client disconnects), and the server's /metrics must show
# nothing running, waiting or holding KV blocks. Results in $OUT: bench.log (per-group tables),
# metrics.txt, serve.log, summary.txt.
# (LMSERVE, TOK and MODEL_ARGS override the binary, the tokenizer and the model flags, e.g. to try
# the script on models/demo.)
# Usage: [LANES="high:0.2:ttft=300ms:tpot=50ms,low"] [SERVE_EXTRA=...] [LOW_CLIENTS=300] [LOW_IN=10000]
#        [LOW_OUT=1024] [HIGH_PROMPTS=30] [HIGH_IN=260] [HIGH_OUT=64] [LEAK=1] [LEAK_SECONDS=20]
#        scripts/device-flood.sh
set -uo pipefail
source "$(dirname "$0")/device-env.sh"
L=${LMSERVE:-$B/bin/lmserve}
TOK=${TOK:-$B/tok}
MODEL_ARGS=${MODEL_ARGS:-"--model tests/fixtures/configs/llama-3.1-8b --tokenizer $TOK --load-format dummy"}
PORT=${PORT:-8011}
URL=http://127.0.0.1:$PORT
# GET a path: curl where there is one, else Python (the GPU machine has both, a bare host maybe not).
get() {
  if command -v curl > /dev/null; then curl -sf "$URL$1"; else
    python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' "$URL$1" 2>/dev/null
  fi
}
"$L" serve $MODEL_ARGS --port $PORT \
  --lanes "${LANES:-high:0.2,low}" ${SERVE_EXTRA:-} > "$OUT/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT
for _ in $(seq 600); do
  get /ready > /dev/null && break
  kill -0 $server 2>/dev/null || { echo "serve exited"; tail -20 "$OUT/serve.log"; exit 1; }
  sleep 0.5
done
t_ready=$(date +%s)
echo "serve ready; lanes ${LANES:-high:0.2,low}" | tee "$OUT/summary.txt"
grep -E "step-time model|KV cache" "$OUT/serve.log" | tail -2 >> "$OUT/summary.txt"
flood() {  # extra bench args...
  "$L" bench serve --base-url $URL --tokenizer $TOK --header x-lmserve-lane:low --dataset-name random \
    --random-input-len ${LOW_IN:-10000} --random-output-len ${LOW_OUT:-1024} --num-prompts ${LOW_CLIENTS:-300} \
    --max-concurrency ${LOW_CLIENTS:-300} --seed 1 "$@"
}
timeout ${BENCH_TIMEOUT:-480} bash -c "$(declare -f flood); L=$L URL=$URL TOK=$TOK LOW_IN=${LOW_IN:-10000} LOW_OUT=${LOW_OUT:-1024} LOW_CLIENTS=${LOW_CLIENTS:-300} flood \"\$@\"" flood --group "name=high,lane=high,num-prompts=${HIGH_PROMPTS:-30},max-concurrency=1,input-len=${HIGH_IN:-260},output-len=${HIGH_OUT:-64}" \
  --result-json "$OUT/groups.json" > "$OUT/bench.log" 2>&1
echo "bench serve rc=$? in $(( $(date +%s) - t_ready )) s" >> "$OUT/summary.txt"
sed -n '/^group /,$p' "$OUT/bench.log" >> "$OUT/summary.txt"
grep -E "^  status" "$OUT/bench.log" | sort | uniq -c >> "$OUT/summary.txt"
get /metrics > "$OUT/metrics.txt"
grep -E '^(lmserve:lane_tpot_target_unmet_steps_total|lmserve:step_time_model_seconds|vllm:num_preemptions_total|lmserve:admission_limit_episodes_total)' \
  "$OUT/metrics.txt" >> "$OUT/summary.txt"
echo "[LIMIT] lines: $(grep -c '\[LIMIT\]' "$OUT/serve.log"), by lane: $(grep -o '\[LIMIT\] [a-z_]* .*lane=[a-z]*' "$OUT/serve.log" | awk '{print $2, $NF}' | sort | uniq -c | tr '\n' ';')" >> "$OUT/summary.txt"
grep '\[TARGET\]' "$OUT/serve.log" | head -3 >> "$OUT/summary.txt"
if [[ ${LEAK:-1} == 1 ]]; then
  timeout -s INT ${LEAK_SECONDS:-20} bash -c "$(declare -f flood); L=$L URL=$URL TOK=$TOK LOW_IN=${LOW_IN:-10000} LOW_OUT=${LOW_OUT:-1024} LOW_CLIENTS=${LOW_CLIENTS:-300} flood" \
    > "$OUT/burst.log" 2>&1
  sleep 3
  get /metrics > "$OUT/metrics_after_disconnect.txt"
  echo "after every client disconnected:" >> "$OUT/summary.txt"
  grep -E '^(vllm:num_requests_running|vllm:num_requests_waiting|vllm:kv_cache_usage_perc)\{' "$OUT/metrics_after_disconnect.txt" >> "$OUT/summary.txt"
fi
cat "$OUT/summary.txt"
