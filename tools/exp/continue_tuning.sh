#!/usr/bin/env bash
# The MoH-LLaMA3 recipe on SmolLM2-135M (issue 11, docs/continue-tuning.md): convert the dense
# model to MoH, continue-tune every arm on the same KJV tokens with the same schedule, and
# measure bits per byte on held-out KJV books and on fortunes (never tuned on).
#
#   tools/exp/continue_tuning.sh [TOKENS ...]      default: 32768 131072
#
# Arms: dense (as loaded, 0 tokens), dense tuned, moh75 (query-norm, 3 shared + top-4 of 6 = 7/9
# heads) converted (0 tokens) and tuned with the straight-through estimator, moh75-learned (learned
# router) converted and tuned. Every tuned arm: B=4 x T=512 = 2048 tokens per step, lr 5e-5 (10 %
# warmup, cosine to 0.1x), weight decay 0.1, clip 1, seed 1; the training split is KJV minus the
# held-out books. Evaluation: T=512 chunks of the first 40,000 bytes of the held-out books
# (Colossians ..) and the first 1,000 bytes of every fortunes topic file (44 topics).
# Env: MOH (default build/moh), OUT (runs/continue-tuning), MODEL (the SmolLM2 GGUF), ARMS (subset),
# THREADS (OMP_NUM_THREADS). Appends one JSON line per (arm, tokens) to $OUT/results.jsonl;
# tools/exp/ct_table.py prints the table.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
MOH=${MOH:-build/moh}
OUT=${OUT:-runs/continue-tuning}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
ARMS=${ARMS:-"dense moh75 moh75-learned"}
BUDGETS=("$@")
[[ ${#BUDGETS[@]} -gt 0 ]] || BUDGETS=(32768 131072)
T=512 B=4
[[ -f $MODEL ]] || { echo "continue_tuning.sh: $MODEL missing: run tools/data/fetch_smollm2.sh" >&2; exit 1; }
[[ -f data/kjv/train.txt ]] || { echo "continue_tuning.sh: data/kjv missing: run tools/data/fetch.sh" >&2; exit 1; }
mkdir -p "$OUT/data/kjv"
ln -sf "$repo/data/kjv/train.txt" "$OUT/data/kjv/train.txt"
head -c 40000 data/kjv/val.txt > "$OUT/data/kjv/val.txt"
: > "$OUT/data/fortunes.txt"
for f in data/fortunes/*.txt; do
  [[ $(basename "$f") == topics.txt ]] && continue
  head -c 1000 "$f" >> "$OUT/data/fortunes.txt"
done

# bits/byte of checkpoint $1 on text $2 (whole file, T-token chunks)
bpb() {
  "$MOH" eval --checkpoint "$1" --data "$2" --split all --seq-len $T --batch-size 1 --json 2>/dev/null |
    python3 -c 'import json, sys; d = json.load(sys.stdin); print(d["bits_per_byte"], sum(map(sum, d["head_share"])) / sum(map(len, d["head_share"])))'
}
record() { # arm tokens ckpt seconds
  read -r kjv share < <(bpb "$3" "$OUT/data/kjv/val.txt")
  read -r fort _ < <(bpb "$3" "$OUT/data/fortunes.txt")
  printf '{"arm": "%s", "tokens": %s, "kjv_bpb": %s, "fortunes_bpb": %s, "head_share": %s, "train_s": %s}\n' \
    "$1" "$2" "$kjv" "$fort" "$share" "$4" | tee -a "$OUT/results.jsonl"
}

for arm in $ARMS; do
  src=$OUT/$arm-init
  if [[ ! -f $src/config.json ]]; then
    case $arm in
      dense) "$MOH" convert --model "$MODEL" --out "$src" ;;
      moh75) "$MOH" convert --model "$MODEL" --out "$src" --to-moh --shared-heads 3 --top-k 4 ;;
      moh75-learned) "$MOH" convert --model "$MODEL" --out "$src" --to-moh --router learned --shared-heads 3 --top-k 4 ;;
      moh50) "$MOH" convert --model "$MODEL" --out "$src" --to-moh --shared-heads 3 --top-k 2 ;;
      *) echo "continue_tuning.sh: unknown arm $arm" >&2; exit 2 ;;
    esac
    record "$arm" 0 "$src" 0
  fi
  for tok in "${BUDGETS[@]}"; do
    run=$OUT/$arm-$tok
    [[ -f $run/config.json ]] && continue
    steps=$(( (tok + B * T - 1) / (B * T) ))
    t0=$(date +%s)
    "$MOH" train --init "$src" --data "$OUT/data/kjv" --out "$run" --steps "$steps" --batch-size $B --seq-len $T \
      --lr 5e-5 --min-lr-ratio 0.1 --weight-decay 0.1 --grad-clip 1 --seed 1 --eval-every 0 --log-every 4 \
      2>&1 | tee "$run.log" | grep -E "^(step|done)" || true
    record "$arm" "$tok" "$run" $(( $(date +%s) - t0 ))
  done
done
python3 tools/exp/ct_table.py "$OUT/results.jsonl"
