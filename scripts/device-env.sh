# Sourced by the GPU-machine scripts (device-check.sh, device-bench.sh):
# what scripts/device-bundle.sh packed, unpacked afresh into .device/bundle (the GPU machine may
# keep an old one; BUNDLE picks another packed file, e.g. one made with NAME=...), its libraries
# on the search path, B its folder, and $OUT (default /tmp/out) made.
export LD_LIBRARY_PATH=$PWD/.device/bundle/lib:/usr/local/cuda/lib64 LMSERVE_SOURCE_DIR=$PWD
B=.device/bundle
bundle=${BUNDLE:-.device/carry/bundle.tar.gz}
if [[ -f $bundle ]]; then rm -rf .device/bundle && tar -C .device -xzf "$bundle"; fi
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
