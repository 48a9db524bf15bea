#!/usr/bin/env bash
# The main job: train the default MoH language model (configs/moh-75.json, 75% of heads active)
# on the King James Bible for MINUTES of wall time (the final validation included), then report
# validation bits per byte against the order-0 entropy of the validation text, and print a sample.
#   tools/lm_main.sh [MINUTES] [OUT_DIR]      (defaults: 10, runs/kjv-moh-75)
set -euo pipefail
usage="usage: tools/lm_main.sh [MINUTES] [OUT_DIR]   (defaults: 10, runs/kjv-moh-75)"
case "${1:-}" in -h | --help) echo "$usage"; exit 0 ;; esac
[ $# -le 2 ] || { echo "tools/lm_main.sh: $# arguments, expected at most 2; $usage" >&2; exit 2; }
if ! [[ "${1:-10}" =~ ^([0-9]+([.][0-9]*)?|[.][0-9]+)$ ]] || [[ "${1:-10}" =~ ^[0.]+$ ]]; then
  echo "tools/lm_main.sh: MINUTES is '${1:-}', expected a number > 0; $usage" >&2
  exit 2
fi
minutes=${1:-10}
out=${2:-}
case "$out" in "" | /*) ;; *) out="$PWD/$out" ;; esac   # a relative OUT_DIR is relative to where you are
cd "$(dirname "$0")/.."
out=${out:-runs/kjv-moh-75}
bash tools/setup.sh
make -s
bash tools/data/fetch.sh data >/dev/null
if [ -e "$out/model.safetensors" ] || [ -e "$out/optimizer.safetensors" ]; then
  echo "== $out holds an earlier run: moving it to $out.prev"
  rm -rf "$out.prev" && mv "$out" "$out.prev"
fi
echo "== training moh-75 on data/kjv for ${minutes} minutes (output: $out)"
./build/moh train --config moh-75 --data data/kjv --out "$out" --max-minutes "$minutes" --eval-every 100
# the training run's final validation is the whole split with the `moh eval` metric: read it
# back from metrics.jsonl rather than evaluating again
echo "== validation (held-out books: Colossians .. Revelation; the run's final validation, whole split, \`moh eval\` metric)"
tail -n 1 "$out/metrics.jsonl" |
  sed -n 's/.*"val_loss": \([0-9.]*\), "val_bpb": \([0-9.]*\), "val_tokens": \([0-9]*\).*/val_loss \1 nats | \2 bits\/byte | \3 predictions/p'
python3 - data/kjv/val.txt <<'PY' 2>/dev/null || true
import collections, math, sys
b = open(sys.argv[1], 'rb').read()
n = len(b); c = collections.Counter(b)
print("order-0 entropy of the validation text: %.4f bits/byte" % -sum(v / n * math.log2(v / n) for v in c.values()))
PY
echo "== sample"
./build/moh sample --checkpoint "$out" --prompt "And God said" --max-tokens 300 --seed 7
