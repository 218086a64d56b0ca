#!/usr/bin/env bash
# Whether the gateway's cost a request drifts with time (issue #30): the gateway with the policies
# of scripts/gateway-overhead.sh's POLICY=1 (a keyed tenant with rpm/tpm limits, the audit trail,
# the default guard rules and a tenant regex) alone on core 1 for ROUNDS rounds of D seconds of wrk
# (-c256, on CLIENT_CPUS), one process throughout, its CPU time a request per round from /proc;
# then the plain gateway likewise. Per round: requests a second, CPU (user, system) and minor page
# faults a request, resident memory, and the time a fixed loop takes on that core right after the
# round (a change in the core's own speed shows there too), and the host's page cache, dirty and
# writeback pages (the audit trail's writes; a container's memory limit scales the kernel's dirty
# thresholds). GPU machine, with a bundle of
#   TESTS="lmserve_fake_upstream_server" TOOLS="nginx wrk" NAME=gwa scripts/device-bundle.sh release
# Usage: [ROUNDS=10] [D=5] [FAKE_CPUS=2-5] [CLIENT_CPUS=6-15] [WRK_THREADS=8] [TARGETS="policy plain"]
#        [MALLOC=...: the gateways' MALLOC_CONF, e.g. dirty_decay_ms:-1,muzzy_decay_ms:-1]
#        [AUDIT_DIR=...: the audit trail's folder, e.g. under /dev/shm, removed after the run;
#         default a temporary one] [GATEWAY=FILE: the gateways' binary, default the bundle's lmserve]
#        scripts/device-gateway-drift.sh
set -uo pipefail
BUNDLE=${BUNDLE:-.device/carry/gwa.tar.gz} source "$(dirname "$0")/device-env.sh"
B=$PWD/.device/bundle; export LD_LIBRARY_PATH=$B/lib; export PATH=$B/bin:$PATH
w=$(mktemp -d); cd $w
audit=${AUDIT_DIR:-$w/audit}
taskset -c ${FAKE_CPUS:-2-5} $B/tests/lmserve_fake_upstream_server --port 19381 --threads 4 --chunks 16 > fake.log 2>&1 & fp=$!
head -c 48 /dev/urandom | base64 > key.secret
key=$(lmserve gateway keys add --db keys.sqlite --key-secret-file key.secret --tenant bench --rpm 1000000000 --tpm 1000000000000 | grep -o 'sk-lms-[A-Za-z0-9_-]*' | head -1)
printf 'listen: 127.0.0.1:19383\nio_threads: 1\naccess_log: false\nmodels:\n  - name: m\n    policy: least_outstanding\n    backends:\n      - {url: http://127.0.0.1:19381}\n' > plain.yaml
{ sed 's/19383/19385/' plain.yaml; printf "keys_db: $w/keys.sqlite\nkey_secret_file: $w/key.secret\naudit: {dir: $audit}\nguard: {default_rules: true}\ntenants:\n  bench: {deny: [\"(?i)password\"]}\n"; } > policy.yaml
printf 'wrk.method = "POST"\nwrk.body = %s\nwrk.headers["Content-Type"] = "application/json"\n' "'{\"model\":\"m\",\"prompt\":\"hello\",\"max_tokens\":16,\"stream\":false}'" > plain.lua
{ cat plain.lua; echo "wrk.headers[\"Authorization\"] = \"Bearer $key\""; } > policy.lua
hz=$(getconf CLK_TCK)
declare -A port_of=([policy]=19385 [plain]=19383)
for name in ${TARGETS:-policy plain}; do
  port=${port_of[$name]}
  env ${MALLOC:+MALLOC_CONF=$MALLOC} taskset -c 1 ${GATEWAY:-lmserve} --log-level warning gateway --config $name.yaml > $name.log 2>&1 & gp=$!
  sleep 1.5
  for r in $(seq ${ROUNDS:-10}); do
    a=$(awk '{print $14, $15, $10}' /proc/$gp/stat)
    taskset -c ${CLIENT_CPUS:-6-15} wrk -t${WRK_THREADS:-8} -c256 -d${D:-5}s -s $name.lua http://127.0.0.1:$port/v1/completions > wrk.txt
    b=$(awk '{print $14, $15, $10}' /proc/$gp/stat)
    n=$(grep -o '^ *[0-9]* requests' wrk.txt | awk '{print $1}')
    rss=$(awk '/VmRSS/ {print int($2 / 1024)}' /proc/$gp/status)
    dirty=$(awk '/^(Dirty|Writeback|Cached):/ {printf "%s%d", n++ ? "/" : "", $2 / 1024}' /proc/meminfo)
    t0=$(date +%s%N); taskset -c 1 awk 'BEGIN { for (i = 0; i < 5e6; i++) s += i }'; t1=$(date +%s%N)
    echo "$a $b $n" | awk -v hz=$hz -v r=$r -v nm=$name -v d=${D:-5} -v rss=$rss -v dirty=$dirty -v loop=$(( (t1 - t0) / 1000000 )) '{u=($4-$1)/hz; s=($5-$2)/hz; printf "%s round %d: %d req/s, CPU %.1f us/req (user %.1f, system %.1f), %.3f minor faults/req, RSS %d MB, cached/dirty/writeback %s MB, loop %d ms\n", nm, r, $7/d, (u+s)*1e6/$7, u*1e6/$7, s*1e6/$7, ($6-$3)/$7, rss, dirty, loop}'
  done
  kill $gp; wait $gp 2>/dev/null
  if [[ $name == policy ]]; then du -sh $audit | awk '{print "audit trail: " $1}'; rm -rf $audit; fi
done
kill $fp; wait $fp 2>/dev/null
cd / && rm -rf "$w"
