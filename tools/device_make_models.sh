#!/usr/bin/env bash
# Trains the demo model and makes the reference fixtures on the GPU machine.
# Expects .device/corpus from tools/train_demo/prepare_corpus.py (carried in).
# Leaves models/demo and tests/fixtures in $OUT/models.tgz, logs in $OUT.
set -euo pipefail
: "${OUT:?OUT must name the folder for results}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c 'import torch, transformers, tokenizers; print(torch.__version__, transformers.__version__, tokenizers.__version__)'
rm -rf models/demo
python3 tools/train_demo/train.py --corpus .device/corpus --heldout tests/fixtures/demo_heldout.txt \
    --out models/demo "$@" 2>&1 | tee "$OUT/train.log"
python3 tools/make_fixtures/make_fixtures.py --demo models/demo --out tests/fixtures 2>&1 | tee "$OUT/fixtures.log"
tar czf "$OUT/models.tgz" models/demo tests/fixtures
du -sh models/demo tests/fixtures
