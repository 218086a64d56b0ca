#!/usr/bin/env bash
# Issue #31's mixed run on the GPU machine: the same NUM requests (log-normal lengths, medians
# 400 in / 200 out, clipped at 4096, seed 0) through the engine alone (`bench throughput`, at
# most CONC sequences at once) and through `lmserve serve` with CONC streaming clients
# (`bench serve --max-concurrency CONC`), both with BATCHED tokens per step at most. Results in
# $OUT: throughput.log, serve_bench.log, serve.log, metrics.txt, summary.txt.
# (LMSERVE, TOK and MODEL_ARGS override the binary, the tokenizer and the model flags.)
# Usage: [CONC=64] [NUM=1000] [BATCHED=8192] [SERVE_EXTRA=...] scripts/device-mixed-serve.sh
set -uo pipefail
source "$(dirname "$0")/device-env.sh"
L=${LMSERVE:-$B/bin/lmserve}
TOK=${TOK:-$B/tok}
MODEL_ARGS=${MODEL_ARGS:-"--model tests/fixtures/configs/llama-3.1-8b --tokenizer $TOK --load-format dummy"}
PORT=${PORT:-8012}
URL=http://127.0.0.1:$PORT
# GET a path: curl where there is one, else Python (the GPU machine has both, a bare host maybe not).
get() {
  if command -v curl > /dev/null; then curl -sf "$URL$1"; else
    python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' "$URL$1" 2>/dev/null
  fi
}
CONC=${CONC:-64}
NUM=${NUM:-1000}
BATCHED=${BATCHED:-8192}
M=$MODEL_ARGS
MIX="--dataset-name mixed --mixed-input-median 400 --mixed-output-median 200 --mixed-max-input-len 4096 --mixed-max-output-len 4096 --num-prompts $NUM --seed 0"
: > "$OUT/summary.txt"
timeout 300 "$L" bench throughput $M $MIX --max-num-seqs $CONC --max-num-batched-tokens $BATCHED --sustained-rate-seconds 0 \
  > "$OUT/throughput.log" 2>&1
echo "== bench throughput (rc=$?): --max-num-seqs $CONC --max-num-batched-tokens $BATCHED, $NUM mixed requests" >> "$OUT/summary.txt"
grep -E '^(requests|throughput|engine|per step)' "$OUT/throughput.log" >> "$OUT/summary.txt"
"$L" serve $M --port $PORT --max-num-seqs $CONC --max-num-batched-tokens $BATCHED ${SERVE_EXTRA:-} > "$OUT/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT
for _ in $(seq 600); do
  get /ready > /dev/null && break
  kill -0 $server 2>/dev/null || { echo "serve exited"; tail -20 "$OUT/serve.log"; exit 1; }
  sleep 0.5
done
"$L" bench serve --base-url $URL --tokenizer $TOK $MIX --max-concurrency $CONC > "$OUT/serve_bench.log" 2>&1
echo "== serve + bench serve (rc=$?): --max-concurrency $CONC, streaming" >> "$OUT/summary.txt"
grep -E '^(successful|failed|duration|request throughput|output tokens/s|TTFT|TPOT|ITL|E2E)' "$OUT/serve_bench.log" >> "$OUT/summary.txt"
get /metrics > "$OUT/metrics.txt"
grep -E '^(lmserve:engine_host_phase_seconds_total|lmserve:engine_forward_seconds_total|lmserve:engine_host_seconds_total|lmserve:engine_steps_total|vllm:num_preemptions_total)' \
  "$OUT/metrics.txt" >> "$OUT/summary.txt"
cat "$OUT/summary.txt"
