#!/usr/bin/env bash
# Gathers what a GPU-machine run needs into .device/bundle (ignored by git), to pass in the
# device tool's `carry`: the lmserve binary, the test binaries, and the shared libraries
# they link that the GPU machine may lack (everything but libc/libstdc++ and CUDA's own,
# which resolve there). On the GPU machine:
#   export LD_LIBRARY_PATH=$PWD/.device/bundle/lib LMSERVE_SOURCE_DIR=$PWD
#   .device/bundle/bin/lmserve version --self-test
#   .device/bundle/tests/backend_devices_test
# Usage: scripts/device-bundle.sh [PRESET]   (default release; build it first)
set -euo pipefail
cd "$(dirname "$0")/.."
preset=${1:-release}
build="build/$preset"
dest=.device/bundle
[[ -x $build/lmserve ]] || { echo "device-bundle: build $preset first (make build PRESET=$preset)" >&2; exit 1; }

rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/tests" "$dest/lib"
cp "$build/lmserve" "$dest/bin/"
find "$build/tests" -type f -executable -name '*_test' -exec cp {} "$dest/tests/" \;

system_lib='^(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux-x86-64|linux-vdso|libcuda|libcublas|libcublasLt|libnccl|libnvidia-ml)\.so'
for f in "$dest"/bin/* "$dest"/tests/*; do
  ldd "$f" | awk '$3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ $name =~ $system_lib ]] || cp -L "$path" "$dest/lib/$name"
done
du -sh "$dest" | awk '{print "device-bundle: " $1 " in '"$dest"'"}'
ls "$dest/lib"
