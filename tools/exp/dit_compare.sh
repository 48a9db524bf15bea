#!/usr/bin/env bash
# DiT (MHA) vs MoH-DiT-90 vs MoH-DiT-75 on Fashion-MNIST at equal steps and seeds (issue 12,
# docs/results-dit.md): train each config, measure its samples under a moh ViT classifier, then
# time training and sampling of all three back to back in one run.
#
#   tools/exp/dit_compare.sh [STEPS] [SAMPLES] [SEEDS]     default: 2000 5000 "1"
#
# Training: moh train --config dit-X --steps STEPS --seed S (batch 64, constant lr 1e-3 after a
# 10 % warmup, EMA 0.999; everything else the config's defaults). Samples: SAMPLES images,
# balanced over classes, DDIM 50, guidance 4, noise seed 1, the EMA weights, every model on the
# head-sparse path (router none there is dense MHA). Speeds: moh bench train (tokens/s of the
# three, both attention paths) and moh sample of 50 images (DDIM 50, guidance 4) per model,
# interleaved, 3 repeats. tools/exp/dit_table.py prints the table.
# Env: MOH (build/moh), OUT (runs/dit-compare), DATA (/usr/share/datasets/fashion-mnist),
# CLF (the classifier; trained here with vit-mha for 7 minutes if missing), CONFIGS, CFG1_SAMPLES
# (also evaluate without guidance on that many samples; default 0 = skip).
# One JSON line per (config, seed) in $OUT/results.jsonl, speeds in $OUT/speed.jsonl.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
MOH=${MOH:-build/moh}
OUT=${OUT:-runs/dit-compare}
DATA=${DATA:-/usr/share/datasets/fashion-mnist}
CLF=${CLF:-$OUT/vit-clf}
CONFIGS=${CONFIGS:-"dit-mha dit-moh-90 dit-moh-75"}
CFG1_SAMPLES=${CFG1_SAMPLES:-0}
STEPS=${1:-2000} SAMPLES=${2:-5000} SEEDS=${3:-1}
[[ -f $DATA/train-images-idx3-ubyte || -f $DATA/train-images-idx3-ubyte.gz ]] ||
  { echo "dit_compare.sh: no Fashion-MNIST IDX files in $DATA (../shared/notes/DATA.md)" >&2; exit 1; }
mkdir -p "$OUT"
[[ -f $CLF/config.json ]] ||
  "$MOH" train --config vit-mha --data "$DATA" --out "$CLF" --max-minutes 7 > "$OUT/vit-clf.log" 2>&1

for seed in $SEEDS; do
  for c in $CONFIGS; do
    run=$OUT/$c-s$seed
    [[ -f $run/model.safetensors ]] ||
      "$MOH" train --config "$c" --data "$DATA" --out "$run" --steps "$STEPS" --seed "$seed" > "$run.log" 2>&1
    val=$(python3 -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print([x for x in r if "val_mse" in x][-1]["val_mse"])' "$run/metrics.jsonl")
    ev() { # cfg samples -> "acc fid"
      "$MOH" eval --checkpoint "$run" --data "$DATA" --classifier "$CLF" --samples "$2" --sampler ddim --steps 50 \
        --cfg "$1" --seed 1 --sparse-attn --json 2>/dev/null |
        python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["class_accuracy"], d["fid"])'
    }
    read -r acc fid < <(ev 4 "$SAMPLES")
    acc1=null fid1=null
    [[ $CFG1_SAMPLES -gt 0 ]] && read -r acc1 fid1 < <(ev 1 "$CFG1_SAMPLES")
    printf '{"config": "%s", "seed": %s, "steps": %s, "val_mse": %s, "samples": %s, "class_accuracy": %s, "fid": %s, "cfg1_samples": %s, "class_accuracy_cfg1": %s, "fid_cfg1": %s}\n' \
      "$c" "$seed" "$STEPS" "$val" "$SAMPLES" "$acc" "$fid" "$CFG1_SAMPLES" "$acc1" "$fid1" | tee -a "$OUT/results.jsonl"
  done
done

# speeds, in one run: training (random batches of 64 images) and sampling (50 images, DDIM 50, cfg 4)
seed=${SEEDS%% *}
"$MOH" bench train --configs "$(echo $CONFIGS | tr ' ' ,)" --batch 64 --steps 2 --repeats 5 > "$OUT/bench_train.txt"
for r in 1 2 3; do
  for c in $CONFIGS; do
    /usr/bin/time -o "$OUT/time.txt" -f %e "$MOH" sample --checkpoint "$OUT/$c-s$seed" --class all --n 5 --sampler ddim \
      --steps 50 --cfg 4 --seed $r --sparse-attn --out "$OUT/$c-s$seed-grid.png" > /dev/null 2> "$OUT/sample.err"
    s=$(tail -1 "$OUT/time.txt")
    printf '{"config": "%s", "repeat": %s, "images": 50, "seconds": %s}\n' "$c" "$r" "$s" | tee -a "$OUT/speed.jsonl"
  done
done
