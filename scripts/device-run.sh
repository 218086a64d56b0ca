#!/usr/bin/env bash
# Runs named steps on the GPU machine so that every log comes back: the device tool returns at
# most 8 files from $OUT, so step NAME runs with OUT=/tmp/device-logs/NAME, and at the end (also
# when a step fails or times out) the whole folder is packed into $OUT/logs.tar.gz; the steps'
# summary.txt / table.txt and their last output lines are collected in $OUT/summary.txt, which
# is printed last. DEADLINE (epoch seconds): steps that would start later are skipped.
# Usage: scripts/device-run.sh 'NAME: COMMAND' ...
#   e.g. scripts/device-run.sh 'check: SANITIZE=1 scripts/device-check.sh' \
#          'profile: scripts/device-profile.sh b1 decode:2 --batch-size 1 --input-len 128 --output-len 4' \
#          'bench: LAT_BATCHES="1 64" scripts/device-bench.sh latency'
set -uo pipefail
FINAL=${OUT:-/tmp/out}
LOGS=/tmp/device-logs
rm -rf "$LOGS"
mkdir -p "$LOGS" "$FINAL"
summary=$FINAL/summary.txt
: > "$summary"
pack() { tar -C /tmp -czf "$FINAL/logs.tar.gz" device-logs 2>/dev/null; }
trap pack EXIT
for step in "$@"; do
  name=${step%%:*}
  cmd=${step#*:}
  if [[ -n ${DEADLINE:-} && $(date +%s) -ge $DEADLINE ]]; then
    echo "== $name: skipped (deadline)" >> "$summary"
    continue
  fi
  mkdir -p "$LOGS/$name"
  t0=$(date +%s)
  OUT=$LOGS/$name bash -c "$cmd" > "$LOGS/$name/output.txt" 2>&1
  rc=$?
  echo "== $name (rc=$rc, $(( $(date +%s) - t0 )) s):$cmd" >> "$summary"
  if [[ -s $LOGS/$name/summary.txt || -s $LOGS/$name/table.txt ]]; then
    cat "$LOGS/$name"/summary.txt "$LOGS/$name"/table.txt 2>/dev/null >> "$summary"
  else
    tail -${TAIL:-12} "$LOGS/$name/output.txt" >> "$summary"
  fi
  pack
done
cat "$summary"
