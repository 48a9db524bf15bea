#!/usr/bin/env bash
# The main job: train the default MoH language model (configs/moh-75.json, 75% of heads active)
# on the King James Bible for MINUTES of wall time (the final validation included), in bf16 where
# the CPU has it (AVX512-BF16 / AMX; else fp32, said in one line), then report validation bits per
# byte against the order-0 entropy of the validation text, and print a sample.
#   tools/lm_main.sh [MINUTES] [OUT_DIR] [CONFIG]   (defaults: 10, runs/kjv-CONFIG, moh-75)
# CONFIG = mha gives the dense twin under the same recipe (docs/results-lm.md compares the two).
set -euo pipefail
usage="usage: tools/lm_main.sh [MINUTES] [OUT_DIR] [CONFIG]   (defaults: 10, runs/kjv-CONFIG, moh-75)"
case "${1:-}" in -h | --help) echo "$usage"; exit 0 ;; esac
[ $# -le 3 ] || { echo "tools/lm_main.sh: $# arguments, expected at most 3; $usage" >&2; exit 2; }
if ! [[ "${1:-10}" =~ ^([0-9]+([.][0-9]*)?|[.][0-9]+)$ ]] || [[ "${1:-10}" =~ ^[0.]+$ ]]; then
  echo "tools/lm_main.sh: MINUTES is '${1:-}', expected a number > 0; $usage" >&2
  exit 2
fi
minutes=${1:-10}
out=${2:-}
config=${3:-moh-75}
case "$out" in "" | /*) ;; *) out="$PWD/$out" ;; esac   # a relative OUT_DIR is relative to where you are
if [ -f "$config" ] && [[ "$config" != /* ]]; then config="$PWD/$config"; fi   # a config file here, not a name
cd "$(dirname "$0")/.."
out=${out:-runs/kjv-$(basename "${config%.json}")}
bash tools/setup.sh
mkdir -p build
echo "== building build/moh (log: build/lm_main_build.log)"
make -s > build/lm_main_build.log 2>&1 || { tail -40 build/lm_main_build.log; exit 1; }
bash tools/data/fetch.sh data >/dev/null
if [ -e "$out/model.safetensors" ] || [ -e "$out/optimizer.safetensors" ]; then
  echo "== $out holds an earlier run: moving it to $out.prev"
  rm -rf "$out.prev" && mv "$out" "$out.prev"
fi
# The recipe for a 10-minute budget (docs/results-lm.md, "The main job"): the faster of fp32 and
# bf16 on this CPU (--precision auto, moh train's default: bf16 where AMX makes it win); Muon on the
# attention and MLP matrices (AdamW 0.9/0.95 on the rest); the trainer's LM defaults (batch
# 16 x 256, lr 2e-3 for both, warmup min(100, steps / 10)) but for weight decay 0.5 and the cosine decaying to 0;
# validation every 200 steps on 32768 predictions (the last: the whole split)
echo "== training $config on data/kjv for ${minutes} minutes (output: $out)"
./build/moh train --config "$config" --data data/kjv --out "$out" --max-minutes "$minutes" \
  --optimizer muon --weight-decay 0.5 --min-lr-ratio 0 --eval-every 200 --eval-limit 32768
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
