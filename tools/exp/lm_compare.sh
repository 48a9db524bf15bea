#!/usr/bin/env bash
# MoH vs MHA on the KJV split (docs/results-lm.md): every config in CONFIGS x every seed in SEEDS,
# equal parameters (up to router weights), equal tokens and schedule (--steps fixed), then the
# whole validation split with `moh eval`. JOBS runs in parallel, one thread each.
#   STEPS=200 BATCH=8 SEEDS="1 2" JOBS=2 tools/exp/lm_compare.sh [OUT_ROOT]
set -euo pipefail
cd "$(dirname "$0")/../.."
root=${1:-runs/lm-compare}
steps=${STEPS:-200}
batch=${BATCH:-8}
seeds=${SEEDS:-1 2}
configs=${CONFIGS:-mha moh-90 moh-75 moh-50}
jobs=${JOBS:-2}
mkdir -p "$root"
run_one() {
  local cfg=$1 seed=$2 out=$root/$1-s$2
  if [ ! -s "$out/eval.json" ]; then
    if [ -s "$out/optimizer.safetensors" ]; then   # finish an interrupted run
      OMP_NUM_THREADS=${THREADS:-1} ./build/moh train --resume --data data/kjv --out "$out" --quiet
    else
      OMP_NUM_THREADS=${THREADS:-1} ./build/moh train --config "$cfg" --data data/kjv --out "$out" \
        --steps "$steps" --batch-size "$batch" --seed "$seed" --eval-every 100 --quiet
    fi
    OMP_NUM_THREADS=${THREADS:-1} ./build/moh eval --checkpoint "$out" --data data/kjv/val.txt --json > "$out/eval.json"
  fi
  echo "$cfg seed $seed: $(cat "$out/eval.json" | cut -c1-80)"
}
export -f run_one; export root steps batch
for cfg in $configs; do for seed in $seeds; do echo "$cfg $seed"; done; done |
  xargs -P "$jobs" -n 2 bash -c 'run_one "$0" "$1"'
python3 tools/exp/lm_table.py "$root"
