#!/usr/bin/env bash
# Issue #37 on the GPU machine: how long `lmserve serve` of the Llama-3.1-8B shape takes from
# process start to /ready 200, cold and with a warm tuning cache (--load-format dummy), each
# start-up phase's seconds (lmserve:startup_seconds); then a real-size random checkpoint
# (`lmserve model write-random`, sharded as the published one) loaded by serve from the page
# cache (and cold when the page cache may be dropped), its weights_read + weights_to_device
# rate. Results in $OUT: summary.txt (the table), serve_*.log, metrics_*.txt.
# Usage: [CKPT=/tmp/lmserve-8b-random] [RUNS="dummy-cold dummy-warm ckpt-warm ckpt-cold"] scripts/device-startup.sh
set -uo pipefail
source "$(dirname "$0")/device-env.sh"
L=${LMSERVE:-$B/bin/lmserve}
TOK=${TOK:-$B/tok}
CONFIG=${CONFIG:-tests/fixtures/configs/llama-3.1-8b}
CKPT=${CKPT:-/tmp/lmserve-8b-random}
CACHE=$OUT/tuning-cache
PORT=${PORT:-8013}
get() { python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "http://127.0.0.1:$PORT$1" 2>/dev/null; }
summary=$OUT/summary.txt
: > "$summary"
# One start: the seconds from launch to /ready 200 (polled every 50 ms), and the phases.
start() {  # name, serve args...
  local name=$1
  shift
  local t0 t1
  t0=$(date +%s.%N)
  "$L" serve "$@" --port $PORT > "$OUT/serve_$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 6000); do
    get /ready > /dev/null && break
    kill -0 $pid 2>/dev/null || { echo "$name: serve exited" | tee -a "$summary"; tail -20 "$OUT/serve_$name.log"; return 1; }
    sleep 0.05
  done
  t1=$(date +%s.%N)
  get /metrics | grep '^lmserve:startup_seconds' > "$OUT/metrics_$name.txt"
  printf '%-12s ready after %6.2f s; phases: %s\n' "$name" "$(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}')" \
    "$(sed -E 's/.*phase="([^"]+)"} ([0-9.e+-]+)/\1 \2/' "$OUT/metrics_$name.txt" | awk '{printf "%s %.2f, ", $1, $2}')" | tee -a "$summary"
  grep -E "tuning cache|weights to device  done|generating dummy weights  done|capturing CUDA graphs  done" "$OUT/serve_$name.log" | sed 's/^/    /' | tee -a "$summary"
  kill $pid
  wait $pid 2>/dev/null
}
for run in ${RUNS:-dummy-cold dummy-warm ckpt-warm ckpt-cold}; do
  case $run in
    dummy-cold) rm -rf "$CACHE"; start dummy-cold --model $CONFIG --tokenizer $TOK --load-format dummy --tuning-cache "$CACHE" ;;
    dummy-warm) start dummy-warm --model $CONFIG --tokenizer $TOK --load-format dummy --tuning-cache "$CACHE" ;;
    ckpt-warm)
      if [[ ! -f $CKPT/model.safetensors.index.json ]]; then
        "$L" model write-random $CONFIG "$CKPT" --shard-size 5e9 2>&1 | tail -1 | tee -a "$summary"
      fi
      cat "$CKPT"/*.safetensors > /dev/null  # in the page cache
      start ckpt-warm --model "$CKPT" --tokenizer $TOK --tuning-cache "$CACHE" ;;
    ckpt-cold)
      if sync && echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then
        start ckpt-cold --model "$CKPT" --tokenizer $TOK --tuning-cache "$CACHE"
      else
        echo "ckpt-cold: the page cache cannot be dropped here (not root); not run" | tee -a "$summary"
      fi ;;
  esac
done
