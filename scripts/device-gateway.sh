#!/usr/bin/env bash
# The gateway against nginx on the GPU machine's CPUs (issues #29 and #30), A/B against another
# build in the same call: scripts/gateway-overhead.sh with the core layouts the docs/perf.md
# figures use. Pack it here with
#   TESTS="lmserve_fake_upstream_server" TOOLS="nginx wrk" NAME=gwa scripts/device-bundle.sh release
# and put B's stripped, gzipped lmserve at .device/carry/lmserve_b.gz (carry ".device/carry").
# Usage: [REPEAT=N] scripts/device-gateway.sh four|one|both
#   four: the proxies on cores 0-3 (4 workers / io_threads), plain and streamed, 256 connections;
#         the fake replica on cores 4-7 and wrk on 8-15 unless FOUR_FAKE_CPUS / FOUR_FAKE_THREADS /
#         FOUR_CLIENT_CPUS / FOUR_WRK_THREADS say otherwise (a replica on 4-9 serves more streams)
#   one:  the proxies on core 1, with issue #30's policies (POLICY=1)
set -uo pipefail
BUNDLE=${BUNDLE:-.device/carry/gwa.tar.gz} source "$(dirname "$0")/device-env.sh"
export PATH=$PWD/.device/bundle/bin:$PATH
export LMSERVE=$PWD/.device/bundle/bin/lmserve FAKE=$PWD/.device/bundle/tests/lmserve_fake_upstream_server
if [[ -f .device/carry/lmserve_b.gz ]]; then
  gunzip -c .device/carry/lmserve_b.gz > /tmp/lmserve_b && chmod +x /tmp/lmserve_b
  export LMSERVE_B=/tmp/lmserve_b
fi
lscpu | grep -E "Model name|Thread|Core|Socket|NUMA node"
common="FAKE_THREADS=4 WRK_THREADS=8 CONNS=256 DURATION=4"
part=${1:-both}
[[ $part == four || $part == one || $part == both ]] || { echo "device-gateway: four, one or both" >&2; exit 2; }
if [[ $part != one ]]; then
  env $common PROXY_CPU=0-3 PROXY_WORKERS=4 FAKE_CPUS=${FOUR_FAKE_CPUS:-4-7} FAKE_THREADS=${FOUR_FAKE_THREADS:-4} CLIENT_CPUS=${FOUR_CLIENT_CPUS:-8-15} \
    WRK_THREADS=${FOUR_WRK_THREADS:-8} REPEAT=${REPEAT:-3} scripts/gateway-overhead.sh 2>&1 | tee "$OUT/four.txt"
fi
if [[ $part != four ]]; then
  env $common POLICY=1 PROXY_CPU=1 FAKE_CPUS=2-5 CLIENT_CPUS=6-15 REPEAT=${REPEAT:-3} scripts/gateway-overhead.sh 2>&1 | tee "$OUT/one.txt"
fi
