#!/usr/bin/env bash
# `moh analyze` of every MoH ViT of tools/exp/vit_compare.sh against the MHA twin of the same seed,
# on all 10,000 t10k images (17 tokens each), then the summary table (docs/analysis.md).
#   tools/exp/vit_analysis.sh [RUN_ROOT] [OUT_ROOT]
set -euo pipefail
cd "$(dirname "$0")/../.."
root=${1:-runs/vit-compare}
out=${2:-runs/vit-analysis}
data=${DATA:-/usr/share/datasets/fashion-mnist}
rows=()
for run in "$root"/vit-moh-*-s*; do
  name=$(basename "$run"); seed=${name##*-s}
  [ -s "$run/model.safetensors" ] && [ -s "$root/vit-mha-s$seed/model.safetensors" ] || continue
  ./build/moh analyze --checkpoint "$run" --compare "$root/vit-mha-s$seed" --data "$data" \
    --max-tokens 17000 --out "$out/$name" >"$out.$name.log" 2>&1 || { cat "$out.$name.log"; exit 1; }
  rows+=("$name=$out/$name")
done
python3 tools/exp/analysis_table.py "${rows[@]}"
