#!/usr/bin/env bash
# Fault drill (issue #35): `lmserve serve` under a supervisor loop (as systemd's
# Restart=on-failure or a Kubernetes Deployment would run it) while streaming clients load it;
# the first run has a fault injected (FAULT, default the device out of memory at step 300), so
# its engine fails and the process exits with status 3; the supervisor starts it again without
# the fault. Clients retry a refused connection (the server restarting). Passes when the first
# run exited 3, a second run served, and every request was answered: a whole stream, an error
# event (those in flight at the fault), or 429/503 — none cut off without an answer, none lost.
# Usage: [FAULT=oom=300] [DURATION=40] [CONCURRENCY=16] [DEVICE=cpu] [OUT=/tmp/fault-drill]
#        [EXTRA="--model ..."] [CLIENT=python] scripts/fault-drill.sh [LMSERVE_BINARY]
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/dev/lmserve}
fault=${FAULT:-oom=300} duration=${DURATION:-40} concurrency=${CONCURRENCY:-16} device=${DEVICE:-cpu}
out=${OUT:-/tmp/fault-drill} port=${PORT:-18432}
mkdir -p "$out"
: > "$out/supervisor.log"
supervise() {
  local run=1 args=(--fault-injection "$fault")
  while [[ ! -f $out/stop ]]; do
    "$bin" serve --model models/demo --served-model-name demo --device "$device" --host 127.0.0.1 --port "$port" \
      --failure-exit-s 1 ${EXTRA:-} "${args[@]}" > "$out/serve.$run.log" 2>&1 &
    echo $! > "$out/serve.pid"
    wait $!
    local rc=$?
    echo "run $run exited with status $rc" >> "$out/supervisor.log"
    args=()  # the restarted process runs without the fault
    run=$((run + 1))
    [[ -f $out/stop ]] || sleep 0.5
  done
}
rm -f "$out/stop"
supervise &
sup=$!
for _ in $(seq 200); do python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "http://127.0.0.1:$port/health" 2>/dev/null && break; sleep 0.2; done
# Node's client where Node is installed; the standard-library Python one elsewhere (the GPU
# machine) or with CLIENT=python.
if [[ ${CLIENT:-node} == node ]] && command -v node > /dev/null; then client=(node tests/soak/soak_client.mjs); else client=(python3 tests/soak/soak_client.py); fi
"${client[@]}" "http://127.0.0.1:$port" "$duration" "$concurrency" 0 retry > "$out/client.json" 2> "$out/client.err"
touch "$out/stop"
kill "$(cat "$out/serve.pid")" 2>/dev/null
wait $sup
cat "$out/supervisor.log"
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
client = json.loads(open(f"{out}/client.json").read())
runs = open(f"{out}/supervisor.log").read().splitlines()
print("fault drill: client " + json.dumps(client))
fails = []
if not runs or "status 3" not in runs[0]: fails.append("the first run did not exit with status 3")
if len(runs) < 2: fails.append("no second run")
if client["unfinished"] or client["networkErrors"] or client["otherStatus"]: fails.append("requests without an answer")
if client["errorEvents"] == 0: fails.append("no request was in flight at the fault")
if client["ok"] == 0: fails.append("nothing was served")
print("fault drill: " + ("FAILED: " + "; ".join(fails) if fails else "passed"))
sys.exit(1 if fails else 0)
PY
