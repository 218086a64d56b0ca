#!/usr/bin/env bash
# Installs lmserve's build and test dependencies from Debian 12 packages.
# Idempotent: packages already present are skipped, and nothing is done
# (no apt-get update, no root needed) when everything is there.
#
#   scripts/install-deps.sh            build + test dependencies
#   scripts/install-deps.sh --train    also the Debian text packages the demo
#                                      model is trained on (tools/train_demo)
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config ccache git curl python3
  libboost1.81-dev          # Beast/Asio (header-only parts)
  nlohmann-json3-dev
  libspdlog-dev libfmt-dev
  libcli11-dev
  libyaml-cpp-dev
  libssl-dev
  libsqlite3-dev
  libpcre2-dev
  libutf8proc-dev
  libjemalloc-dev           # the lmserve binary's allocator (LMSERVE_JEMALLOC)
  libgtest-dev libgmock-dev
  libbenchmark-dev
  clang libclang-rt-14-dev  # libFuzzer targets (scripts/run-fuzz.sh)
  nginx-light               # the gateway's overhead comparison (scripts/gateway-overhead.sh)
  wrk                       # the HTTP load client of that comparison
  redis-server libhiredis-dev  # the gateway's limits shared by several instances (and their tests)
  prometheus                # promtool and the server: deploy/prometheus's rules tested, a live scrape
  systemd python3-yaml python3-jsonschema  # deploy/systemd verified, deploy/kubernetes checked (tests/deploy)
  libjs-chart.js            # the dashboard's charts, built into the binary
  chromium chromium-driver python3-selenium  # the dashboard's browser test
)

# Node.js runs the end-to-end suite (the official openai client). Some Node.js builds bring
# npm themselves; Debian's separate npm package is only needed when npm is missing.
packages+=(nodejs)
command -v npm >/dev/null || packages+=(npm)

if [[ "${1:-}" == "--train" ]]; then
  # Text corpora for the demo model (see models/demo/README.md for licences).
  packages+=(fortunes-zh jargon-text wordnet-base)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -q
"${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
