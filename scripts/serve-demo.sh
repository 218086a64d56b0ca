#!/usr/bin/env bash
# Starts `lmserve serve` on the demo model (make serve). Usage: serve-demo.sh BINARY MODEL HOST PORT
set -euo pipefail
bin=$1 model=$2 host=$3 port=$4
url="http://$host:$port"
cat <<MSG
lmserve: serving $model at $url (Ctrl-C stops it)
Try:
  curl $url/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model": "demo", "messages": [{"role": "user", "content": "What does \"kernel\" mean?"}], "max_tokens": 64}'
MSG
exec "$bin" serve --model "$model" --served-model-name demo --host "$host" --port "$port"
