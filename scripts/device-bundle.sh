#!/usr/bin/env bash
# Gathers what a GPU-machine run needs into one compressed file, .device/carry/bundle.tar.gz
# (ignored by git), to pass in the device tool's `carry` as ".device/carry": the lmserve binary,
# the GPU test binaries and the product benchmark (tests/bench/cuda_benchmark.cpp), the shared
# libraries they link that the GPU machine may lack (everything but libc/libstdc++ and CUDA's
# own, which resolve there), and a Llama 3 tokenizer for the 8B-shaped benchmarks — stripped
# and packed, because a call carries 64 MiB at most with the checkout. scripts/device-check.sh and scripts/device-bench.sh unpack it into
# .device/bundle on the GPU machine by themselves.
# TOOLS="nginx wrk" adds this machine's programs of those names (and their libraries) to bin/,
# for runs that need them there (scripts/gateway-overhead.sh: PATH=.device/bundle/bin:$PATH);
# LIBS="/usr/lib/.../libx.so.2" adds those libraries to lib/ (one to LD_PRELOAD there, say).
# Usage: [TESTS="backend_compare_test engine_e2e_test"] [TOKENIZER=DIR] [NAME=bundle] [TOOLS=...] [LIBS=...]
#        scripts/device-bundle.sh [PRESET]   (default release; build it first)
# NAME=x packs .device/carry/x.tar.gz instead, so that two builds (say main and a branch) travel
# in one call; the device scripts take BUNDLE=.device/carry/x.tar.gz.
set -euo pipefail
shopt -s nullglob  # TESTS=" ": the binary alone
cd "$(dirname "$0")/.."
preset=${1:-release}
build="build/$preset"
dest=.device/bundle
tests=${TESTS:-backend_compare_test engine_e2e_test backend_devices_test cuda_benchmark}
tokenizer=${TOKENIZER:-../shared/data/tokenizers/Llama-3.2-3B-Instruct}
[[ -x $build/lmserve ]] || { echo "device-bundle: build $preset first (make build PRESET=$preset)" >&2; exit 1; }

name=${NAME:-bundle}
rm -rf "$dest" ".device/carry/$name.tar.gz"
mkdir -p "$dest/bin" "$dest/tests" "$dest/lib" .device/carry
cp "$build/lmserve" "$dest/bin/"
for t in ${TOOLS:-}; do
  f=$(command -v "$t") || { echo "device-bundle: no program $t here (scripts/install-deps.sh)" >&2; exit 1; }
  cp -L "$f" "$dest/bin/"
done
for t in $tests; do
  f=$(find "$build/tests" -type f -executable -name "$t" | head -1)
  [[ -n $f ]] || { echo "device-bundle: no test binary $t in $build/tests" >&2; exit 1; }
  cp "$f" "$dest/tests/"
done

system_lib='^(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux-x86-64|linux-vdso|libcuda|libcublas|libcublasLt|libnccl|libnvidia-ml)\.so'
for f in "$dest"/bin/* "$dest"/tests/*; do
  ldd "$f" | awk '$3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ $name =~ $system_lib ]] || cp -L "$path" "$dest/lib/$name"
done
for l in ${LIBS:-}; do cp -L "$l" "$dest/lib/"; done
strip "$dest"/bin/* "$dest"/tests/* "$dest"/lib/* 2>/dev/null || true
if [[ -d $tokenizer ]]; then
  mkdir -p "$dest/tok"
  cp "$tokenizer"/tokenizer*.json "$dest/tok/"
  [[ -f $tokenizer/special_tokens_map.json ]] && cp "$tokenizer/special_tokens_map.json" "$dest/tok/"
fi
tar -C .device -czf ".device/carry/$name.tar.gz" bundle
du -sh "$dest" | awk '{print "device-bundle: " $1 " in '"$dest"'"}'
du -sh ".device/carry/$name.tar.gz" | awk '{print "device-bundle: " $1 " packed in .device/carry/'"$name"'.tar.gz (carry \".device/carry\")"}'
