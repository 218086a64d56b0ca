#!/usr/bin/env bash
# The gateway's overhead against Debian's nginx as the same reverse proxy (proxy_buffering off,
# HTTP/1.1 keep-alive upstream), in front of the same fast fake replica, driven by the same client
# (wrk), on loopback. Both proxies get PROXY_WORKERS workers (nginx worker_processes, the
# gateway's io_threads) on the same cores (PROXY_CPU); the fake replica and the client run on
# others (FAKE_CPUS, CLIENT_CPUS). Each case is measured against the replica directly, so "added"
# is the proxy's own cost. On the GPU machine (16 cores) the proxy's core is the bottleneck with
#   PROXY_CPU=1 FAKE_CPUS=2-5 FAKE_THREADS=4 CLIENT_CPUS=6-15 WRK_THREADS=8 CONNS="1 256"
#
#   scripts/gateway-overhead.sh                 BUILD=build/release DURATION=10 CONNS="1 32"
#
# BUILD_B=DIR adds a second gateway (DIR/lmserve, on the same cores, target "gateway_b"): an A/B
# of two builds in the same run, since two runs on the GPU machine may land on different hosts.
# LMSERVE=FILE, LMSERVE_B=FILE and FAKE=FILE name the binaries directly (a device bundle's);
# B_PRELOAD=LIB runs gateway B with LD_PRELOAD=LIB (an allocator, say) for an A/B of one build.
# With POLICY=1 and a B, B also runs with the policies on (target "gateway_pb").
# POLICY=1 adds the same build with issue #30's policies on (target "gateway_p"): an API key with
# rpm/tpm limits (every client sends it), the audit trail (in the run's temporary directory), the
# default guard rules and a tenant regex.
#
# Prints a table per concurrency: requests/s and p50/p99 latency per target, plain JSON answers
# and SSE streams (16 events each), and the latency each proxy adds at p50/p99. One connection
# shows the latency a proxy adds to an unloaded request; 32 load it. "CPU us/req" is the proxy
# process's CPU time (user + system, /proc) per request: its cost whatever the client's core
# allows, so 1e6 / it is what one core of that proxy can carry; "user" is its user-space part.
set -euo pipefail
BUILD=${BUILD:-build/release}
DURATION=${DURATION:-10}
CONNS=${CONNS:-"1 32"}
PROXY_CPU=${PROXY_CPU:-1}
CLIENT_CPUS=${CLIENT_CPUS:-0}       # wrk's
FAKE_CPUS=${FAKE_CPUS:-$CLIENT_CPUS}  # the fake replica's
WRK_THREADS=${WRK_THREADS:-1}
FAKE_THREADS=${FAKE_THREADS:-1}
PROXY_WORKERS=${PROXY_WORKERS:-1}   # nginx worker_processes and the gateway's io_threads
UP_PORT=${UP_PORT:-19181}
NGINX_PORT=${NGINX_PORT:-19182}
GW_PORT=${GW_PORT:-19183}
GWB_PORT=${GWB_PORT:-19184}
GWP_PORT=${GWP_PORT:-19185}
POLICY=${POLICY:-}
CHUNKS=${CHUNKS:-16}
REPEAT=${REPEAT:-3}  # rounds over all targets, interleaved; the table gives each figure's median

fake=${FAKE:-$BUILD/tests/gateway/lmserve_fake_upstream_server}
lmserve=${LMSERVE:-$BUILD/lmserve}
lmserve_b=${LMSERVE_B:-${BUILD_B:+$BUILD_B/lmserve}}
B_PRELOAD=${B_PRELOAD:-}
[[ -z $B_PRELOAD || -n $lmserve_b ]] || lmserve_b=$lmserve
GWPB_PORT=${GWPB_PORT:-19186}
for f in "$fake" "$lmserve" ${lmserve_b:+"$lmserve_b"}; do [[ -x $f ]] || { echo "gateway-overhead: build $f first" >&2; exit 1; }; done
for t in nginx wrk taskset python3; do command -v $t >/dev/null || { echo "gateway-overhead: needs $t (scripts/install-deps.sh)" >&2; exit 1; }; done
# One HTTP exchange with python3 (the GPU machine has no curl).
http() {  # METHOD URL [BODY]
  python3 - "$@" <<'PY'
import sys, urllib.request
import os
headers = {"Content-Type": "application/json"}
if os.environ.get("AUTH"): headers["Authorization"] = "Bearer " + os.environ["AUTH"]
req = urllib.request.Request(sys.argv[2], method=sys.argv[1], data=sys.argv[3].encode() if len(sys.argv) > 3 else None,
                             headers=headers)
try:
    print(urllib.request.urlopen(req, timeout=5).read().decode())
except Exception as e:
    print(e); sys.exit(1)
PY
}

work=$(mktemp -d)
echo "gateway-overhead: files (the audit trail) on $(df -T "$work" | awk 'NR == 2 { print $2 }')"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

taskset -c "$FAKE_CPUS" "$fake" --port "$UP_PORT" --threads "$FAKE_THREADS" --chunks "$CHUNKS" >"$work/fake.log" 2>&1 &
pids+=($!)

mkdir -p "$work/nginx/logs"
cat >"$work/nginx/nginx.conf" <<CONF
worker_processes $PROXY_WORKERS;
daemon off;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $work/nginx/body;
  proxy_temp_path $work/nginx/proxy;
  fastcgi_temp_path $work/nginx/fastcgi;
  uwsgi_temp_path $work/nginx/uwsgi;
  scgi_temp_path $work/nginx/scgi;
  upstream replica { server 127.0.0.1:$UP_PORT; keepalive 256; }
  server {
    listen 127.0.0.1:$NGINX_PORT;
    location / {
      proxy_pass http://replica;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
CONF
taskset -c "$PROXY_CPU" nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" &
pids+=($!)
nginx_master=$!

cat >"$work/gateway.yaml" <<CONF
listen: 127.0.0.1:$GW_PORT
io_threads: $PROXY_WORKERS
access_log: false
models:
  - name: m
    policy: least_outstanding
    backends:
      - {url: http://127.0.0.1:$UP_PORT}
CONF
taskset -c "$PROXY_CPU" "$lmserve" --log-level warning gateway --config "$work/gateway.yaml" >"$work/gateway.log" 2>&1 &
pids+=($!)
gateway_pid=$!
targets="direct:$UP_PORT nginx:$NGINX_PORT gateway:$GW_PORT"
gateway_b_pid=""
# Gateway B: another binary, or the same one under B_PRELOAD.
b_env=(env ${B_PRELOAD:+LD_PRELOAD=$B_PRELOAD})
if [[ -n $lmserve_b ]]; then
  taskset -c "$PROXY_CPU" "${b_env[@]}" "$lmserve_b" --log-level warning gateway --config "$work/gateway.yaml" --port "$GWB_PORT" >"$work/gateway_b.log" 2>&1 &
  pids+=($!)
  gateway_b_pid=$!
  targets="$targets gateway_b:$GWB_PORT"
fi

gateway_p_pid=""
gateway_pb_pid=""
auth_header=""
if [[ -n $POLICY ]]; then
  head -c 48 /dev/urandom | base64 >"$work/key.secret"
  key=$("$lmserve" gateway keys add --db "$work/keys.sqlite" --key-secret-file "$work/key.secret" --tenant bench --rpm 1000000000 --tpm 1000000000000 |
        grep -o 'sk-lms-[A-Za-z0-9_-]*' | head -1)
  auth_header="wrk.headers[\"Authorization\"] = \"Bearer $key\""
  { sed -e "s/^listen: .*/listen: 127.0.0.1:$GWP_PORT/" "$work/gateway.yaml"
    cat <<CONF
keys_db: $work/keys.sqlite
key_secret_file: $work/key.secret
audit: {dir: $work/audit}
guard: {default_rules: true}
tenants:
  bench: {deny: ["(?i)password"]}
CONF
  } >"$work/gateway_p.yaml"
  taskset -c "$PROXY_CPU" "$lmserve" --log-level warning gateway --config "$work/gateway_p.yaml" >"$work/gateway_p.log" 2>&1 &
  pids+=($!)
  gateway_p_pid=$!
  targets="$targets gateway_p:$GWP_PORT"
  if [[ -n $lmserve_b ]]; then
    sed -e "s#^listen: .*#listen: 127.0.0.1:$GWPB_PORT#" -e "s#^audit: .*#audit: {dir: $work/audit_b}#" "$work/gateway_p.yaml" >"$work/gateway_pb.yaml"
    taskset -c "$PROXY_CPU" "${b_env[@]}" "$lmserve_b" --log-level warning gateway --config "$work/gateway_pb.yaml" >"$work/gateway_pb.log" 2>&1 &
    pids+=($!)
    gateway_pb_pid=$!
    targets="$targets gateway_pb:$GWPB_PORT"
  fi
fi

ports="$UP_PORT $NGINX_PORT $GW_PORT"; [[ -n $lmserve_b ]] && ports="$ports $GWB_PORT"; [[ -n $POLICY ]] && ports="$ports $GWP_PORT"
[[ -n $POLICY && -n $lmserve_b ]] && ports="$ports $GWPB_PORT"
for port in $ports; do
  for _ in $(seq 100); do http GET "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.05; done
done

for mode in plain stream; do
  stream=false; [[ $mode == stream ]] && stream=true
  cat >"$work/$mode.lua" <<LUA
wrk.method = "POST"
wrk.body = '{"model":"m","prompt":"hello","max_tokens":16,"stream":$stream}'
wrk.headers["Content-Type"] = "application/json"
$auth_header
LUA
done

# Checks that each target answers as the replica does before measuring it.
for port in $ports; do
  out=$(AUTH=${key:-} http POST "http://127.0.0.1:$port/v1/completions" '{"model":"m","prompt":"x","stream":true}')
  [[ $out == *"data: [DONE]"* ]] || { echo "gateway-overhead: port $port did not stream: $out" >&2; exit 1; }
done

nginx_workers=$(pgrep -P "$nginx_master" | tr '\n' ' ')
# CPU seconds processes have used (user + system, every thread), from /proc.
# cpu_of PIDS: user + system; usr_of PIDS: user alone.
cpu_of() { local t=0; for p in "$@"; do t=$(awk -v hz="$(getconf CLK_TCK)" -v t="$t" '{ print t + ($14 + $15) / hz }' "/proc/$p/stat"); done; echo "$t"; }
usr_of() { local t=0; for p in "$@"; do t=$(awk -v hz="$(getconf CLK_TCK)" -v t="$t" '{ print t + $14 / hz }' "/proc/$p/stat"); done; echo "$t"; }
# TCP segments sent on this machine (network namespace) so far: every process's, loopback's both
# ends, so a target's count a request less the replica's own (target "direct") is what its proxy
# adds (pure ACKs among them).
segs_now() { awk '$1 == "Tcp:" { if (!h) { for (i = 1; i <= NF; i++) if ($i == "OutSegs") c = i; h = 1 } else print $c }' /proc/net/snmp; }
# Context switches of processes so far (every thread's, voluntary and not).
ctx_of() { local n=0 p; for p in "$@"; do n=$(( n + $(awk '/ctxt_switches/ { s += $2 } END { print s + 0 }' /proc/"$p"/task/*/status) )); done; echo "$n"; }
# The time of a fixed loop (5 million additions) on the proxies' first core, in ms, taken right
# after each measurement: the core's own speed, which on a shared host moves between rounds (by
# up to twice, docs/perf.md), so that a round's ratio can be read against it.
core_loop_ms() {
  local t0 t1
  t0=$(date +%s%N); taskset -c "${PROXY_CPU%%[-,]*}" awk 'BEGIN { for (i = 0; i < 5e6; i++) s += i }'; t1=$(date +%s%N)
  echo $(( (t1 - t0) / 1000000 ))
}
declare -A proxy_pid=([direct]="" [nginx]=$nginx_workers [gateway]=$gateway_pid [gateway_b]=$gateway_b_pid [gateway_p]=$gateway_p_pid [gateway_pb]=$gateway_pb_pid)

results="$work/results.txt"
for round in $(seq "$REPEAT"); do
for conns in $CONNS; do
  threads=$(( WRK_THREADS < conns ? WRK_THREADS : conns ))  # wrk wants a connection per thread at least
  for mode in plain stream; do
    for target in $targets; do
      name=${target%%:*}; port=${target##*:}
      taskset -c "$CLIENT_CPUS" wrk -t"$threads" -c"$conns" -d1s -s "$work/$mode.lua" "http://127.0.0.1:$port/v1/completions" >/dev/null  # warm-up
      pid=${proxy_pid[$name]}
      before=0; ubefore=0; cbefore=0; [[ -n $pid ]] && before=$(cpu_of $pid) && ubefore=$(usr_of $pid) && cbefore=$(ctx_of $pid)
      sbefore=$(segs_now)
      taskset -c "$CLIENT_CPUS" wrk -t"$threads" -c"$conns" -d"${DURATION}s" --latency -s "$work/$mode.lua" "http://127.0.0.1:$port/v1/completions" >"$work/out.txt"
      segs=$(( $(segs_now) - sbefore ))
      cpu=0; usr=0; ctx=0
      [[ -n $pid ]] && cpu=$(awk -v a="$before" -v b="$(cpu_of $pid)" 'BEGIN { print b - a }') && usr=$(awk -v a="$ubefore" -v b="$(usr_of $pid)" 'BEGIN { print b - a }') &&
        ctx=$(( $(ctx_of $pid) - cbefore ))
      loop=$(core_loop_ms)
      echo "$conns $mode $name $cpu $usr $loop $segs $ctx $(tr '\n' '|' <"$work/out.txt")" >>"$results"
    done
  done
done
done

python3 - "$results" "$DURATION" <<'PY'
import re, statistics, sys
runs = {}
def ms(v):
    m = re.match(r"([\d.]+)(us|ms|s)", v)
    x = float(m.group(1))
    return x / 1000 if m.group(2) == "us" else x * 1000 if m.group(2) == "s" else x
order = []
for line in open(sys.argv[1]):
    conns, mode, name, cpu, usr, loop, segs, ctx, text = line.split(" ", 8)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
    p50 = ms(re.search(r"50%\s+(\S+)", text).group(1))
    p99 = ms(re.search(r"99%\s+(\S+)", text).group(1))
    errs = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    sock = re.search(r"Socket errors: (.*?)\|", text)
    total = int(re.search(r"(\d+) requests in", text).group(1))
    runs.setdefault((conns, mode, name), []).append((rps, p50, p99, int(errs.group(1)) if errs else 0, sock.group(1) if sock else "", float(cpu) / total * 1e6, float(usr) / total * 1e6, int(loop), int(segs) / total, int(ctx) / total))
    if conns not in order: order.append(conns)
med = lambda xs, i: statistics.median(x[i] for x in xs)
rows = {k: (med(v, 0), med(v, 1), med(v, 2), sum(x[3] for x in v), ";".join(x[4] for x in v if x[4]), med(v, 5), med(v, 6), med(v, 8), med(v, 9)) for k, v in runs.items()}
print(f"wrk -d{sys.argv[2]}s; medians of {len(next(iter(runs.values())))} interleaved rounds")
print(f"{'conns':>5} {'mode':7} {'target':10} {'req/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'+p50 ms':>8} {'+p99 ms':>8} {'CPU us/req':>10} {'user':>6} {'segs':>5} {'cs':>5}  errors")
print("(segs: TCP segments sent a request, every process's; cs: the proxy's context switches a request)")
for conns in order:
    for mode in ("plain", "stream"):
        d = rows[(conns, mode, "direct")]
        for name in [n for n in ("direct", "nginx", "gateway", "gateway_b", "gateway_p", "gateway_pb") if (conns, mode, n) in rows]:
            r = rows[(conns, mode, name)]
            add = "" if name == "direct" else f"{r[1]-d[1]:8.3f} {r[2]-d[2]:8.3f}"
            cpu = "" if name == "direct" else f"{r[5]:10.1f} {r[6]:6.1f}"
            cs = "" if name == "direct" else f"{r[8]:5.2f}"
            print(f"{conns:>5} {mode:7} {name:10} {r[0]:10.0f} {r[1]:8.3f} {r[2]:8.3f} {add:>17} {cpu:>17} {r[7]:5.2f} {cs:>5}  {r[3]} {r[4]}")
print("each round, req/s (CPU us/req, user us/req, the proxy core's fixed loop in ms after it):")
for (conns, mode, name), v in runs.items():
    if name != "direct":
        print(f"  {conns:>5} {mode:7} {name:10} " + "  ".join(f"{x[0]:.0f} ({x[5]:.1f}, {x[6]:.1f}, {x[7]})" for x in v))
PY
