#!/usr/bin/env bash
# MHA vs MoH-ViT on Fashion-MNIST (docs/results-vit.md): every config in CONFIGS x every seed in
# SEEDS, same recipe and epochs, one run at a time (each uses 2 data-parallel shards = 2 threads),
# then `moh eval --json` of the final checkpoint on the t10k split and the table.
#   EPOCHS=25 SEEDS="1 2" tools/exp/vit_compare.sh [OUT_ROOT]
set -euo pipefail
cd "$(dirname "$0")/../.."
root=${1:-runs/vit-compare}
epochs=${EPOCHS:-25}
seeds=${SEEDS:-1 2}
configs=${CONFIGS:-vit-mha vit-moh-90 vit-moh-75 vit-moh-50}
data=${DATA:-/usr/share/datasets/fashion-mnist}
mkdir -p "$root"
for cfg in $configs; do
  for seed in $seeds; do
    out=$root/$cfg-s$seed
    if [ ! -s "$out/eval.json" ]; then
      if [ -s "$out/optimizer.safetensors" ]; then   # finish an interrupted run
        ./build/moh train --resume --out "$out" --data "$data" --log-every 500
      else
        ./build/moh train --config "$cfg" --data "$data" --out "$out" --epochs "$epochs" \
          --sparse-attn --crop-pad 1 --shards 2 --seed "$seed" --log-every 500
      fi
      ./build/moh eval --checkpoint "$out" --data "$data" --json > "$out/eval.json"
    fi
    echo "$cfg seed $seed: accuracy $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["accuracy"])' "$out/eval.json")"
  done
done
python3 tools/exp/vit_table.py "$root"
