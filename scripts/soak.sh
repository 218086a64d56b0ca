#!/usr/bin/env bash
# Soak (issue #35): `lmserve serve` on the demo model (CPU) under twice the load it can run at
# once — CONCURRENCY streaming clients against --max-num-seqs SEQS, with a small waiting queue so
# that some answers are 429 — and a share of the requests cut off by the client
# (tests/soak/soak_client.mjs), for DURATION seconds. Every INTERVAL seconds it samples the
# server's RSS, threads and open file descriptors (/proc) and its running / waiting requests
# and KV usage (/metrics) into $OUT/samples.csv. After the load: every request must have been
# answered 200 (a whole stream, no error event) or 429/503, none running or waiting, KV usage 0, and RSS, threads
# and descriptors flat (the last quarter's mean within LEAK_PCT% of the second quarter's).
# With GATEWAY=1 the clients go through `lmserve gateway` in front of the server: its RSS,
# threads and descriptors are sampled and checked as well, and nothing may be left outstanding
# on the replica after the load.
# Prints a summary and exits non-zero if a check fails.
# Usage: [DURATION=3600] [CONCURRENCY=128] [SEQS=64] [QUEUE=32] [ABORT=0.2] [INTERVAL=10]
#        [LEAK_PCT=10] [OUT=/tmp/soak] [GATEWAY=0] scripts/soak.sh [LMSERVE_BINARY]
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/dev/lmserve}
duration=${DURATION:-3600} concurrency=${CONCURRENCY:-128} seqs=${SEQS:-64} queue=${QUEUE:-32}
abort=${ABORT:-0.2} interval=${INTERVAL:-10} leak=${LEAK_PCT:-10} out=${OUT:-/tmp/soak} port=${PORT:-18431}
mkdir -p "$out"
"$bin" serve --model models/demo --served-model-name demo --device cpu --host 127.0.0.1 --port "$port" \
  --max-num-seqs "$seqs" --max-num-queued-reqs "$queue" > "$out/serve.log" 2>&1 &
pid=$!
gw=$pid gw_port=$port  # without a gateway, its columns repeat the server's
trap 'kill $pid $gw 2>/dev/null' EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.2; done
if [[ ${GATEWAY:-0} == 1 ]]; then
  gw_port=$((port + 1))
  printf 'listen: 127.0.0.1:%s\naccess_log: false\nmodels:\n  - name: demo\n    backends:\n      - {url: http://127.0.0.1:%s}\n' \
    "$gw_port" "$port" > "$out/gateway.yaml"
  "$bin" gateway --config "$out/gateway.yaml" > "$out/gateway.log" 2>&1 &
  gw=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$gw_port/ready" >/dev/null && break; sleep 0.2; done
fi
metric() { curl -s "http://127.0.0.1:${2:-$port}/metrics" | awk -v m="$1" '$1 ~ "^"m"({|$)" {s += $2} END {print s + 0}'; }
proc() { echo "$(awk '/^VmRSS/ {print $2}' /proc/$1/status),$(awk '/^Threads/ {print $2}' /proc/$1/status),$(ls /proc/$1/fd | wc -l)"; }
sample() {
  local outstanding=0
  [[ $gw != "$pid" ]] && outstanding=$(metric 'lmserve:gateway_backend_outstanding_requests' "$gw_port")
  echo "$(date +%s),$(proc $pid),$(metric 'vllm:num_requests_running'),$(metric 'vllm:num_requests_waiting'),$(metric 'vllm:kv_cache_usage_perc'),$(proc $gw),$outstanding"
}
echo "time,rss_kb,threads,fds,running,waiting,kv_usage,gw_rss_kb,gw_threads,gw_fds,gw_outstanding" > "$out/samples.csv"
node tests/soak/soak_client.mjs "http://127.0.0.1:$gw_port" "$duration" "$concurrency" "$abort" > "$out/client.json" 2> "$out/client.err" &
client=$!
while kill -0 $client 2>/dev/null; do sample >> "$out/samples.csv"; sleep "$interval"; done
wait $client
sleep 3
sample > "$out/after.csv"
python3 - "$out" "$leak" <<'PY'
import csv, json, sys
out, leak = sys.argv[1], float(sys.argv[2])
rows = list(csv.DictReader(open(f"{out}/samples.csv")))
after = open(f"{out}/after.csv").read().strip().split(",")
client = json.loads(open(f"{out}/client.json").read())
fails = []
n = len(rows)
q = max(1, n // 4)
def mean(rs, k): return sum(float(r[k]) for r in rs) / len(rs)
print(f"soak: {n} samples; client {json.dumps(client)}")
for k in ("rss_kb", "threads", "fds", "gw_rss_kb", "gw_threads", "gw_fds"):
    a, b = mean(rows[q:2 * q], k), mean(rows[-q:], k)
    print(f"  {k}: second quarter {a:.0f}, last quarter {b:.0f} ({100 * (b / a - 1):+.1f}%)")
    if b > a * (1 + leak / 100) + (2 if "rss" not in k else 0): fails.append(f"{k} grew")
running, waiting, kv, outstanding = float(after[4]), float(after[5]), float(after[6]), float(after[10])
print(f"  after the load: running {running:.0f}, waiting {waiting:.0f}, KV usage {kv:.3f}, outstanding at the gateway {outstanding:.0f}")
if running or waiting or kv or outstanding: fails.append("requests or KV blocks left after the load")
if client["otherStatus"] or client["unfinished"] or client["networkErrors"]: fails.append("answers other than 200/429/503 or unfinished streams")
if client.get("errorEvents"): fails.append("streams that ended with an error event")
if client["ok"] == 0: fails.append("no request completed")
print("soak: " + ("FAILED: " + "; ".join(fails) if fails else "passed"))
sys.exit(1 if fails else 0)
PY
