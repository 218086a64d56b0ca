#!/usr/bin/env bash
# End-to-end suite: starts `lmserve serve` on models/demo (port 0), runs the official openai
# client against it (node --test), then stops it with SIGTERM and checks it exits 0.
# Usage: tests/e2e/run.sh BUILD/lmserve
set -uo pipefail
bin=${1:?usage: tests/e2e/run.sh path/to/lmserve}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
command -v node >/dev/null || { echo "e2e: node not found" >&2; exit 1; }
(cd "$here" && npm ci --no-audit --no-fund --loglevel=error >/dev/null) || { echo "e2e: npm ci failed" >&2; exit 1; }

log=$(mktemp)
"$bin" serve --model "$root/models/demo" --port 0 --max-model-len 1024 >"$log" 2>&1 &
pid=$!
trap 'kill -9 $pid 2>/dev/null; rm -f "$log"' EXIT
port=""
for _ in $(seq 1 200); do
  port=$(sed -nE 's/.*on http:\/\/127\.0\.0\.1:([0-9]+).*/\1/p' "$log" | head -1)
  [[ -n $port ]] && break
  sleep 0.05
done
[[ -n $port ]] || { echo "e2e: server did not start"; cat "$log"; exit 1; }

LMSERVE_URL="http://127.0.0.1:$port" LMSERVE_BIN="$bin" LMSERVE_ROOT="$root" node --test "$here"/*.test.mjs
rc=$?
kill -TERM $pid
wait $pid
exit_code=$?
if ((exit_code != 0)); then
  echo "e2e: lmserve serve exited with $exit_code after SIGTERM"
  tail -20 "$log"
  rc=1
fi
exit $rc
