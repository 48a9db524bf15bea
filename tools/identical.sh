#!/usr/bin/env bash
# Prints one SHA-256 per fixed-seed training run (model.safetensors after a few steps) for the
# families and their compute paths: LM (head-sparse and reference attention, router none, bf16),
# ViT (reference, head-sparse, bf16) and DiT (reference, head-sparse, bf16). A refactor that must
# not change results compares this output before and after (diff of the two listings). The fp32
# runs name --precision fp32 (the default, auto, chooses by measured speed).
#   tools/identical.sh path/to/moh > hashes.txt
set -euo pipefail
. "$(dirname "$0")/../tests/lib.sh"
verses 3000 > "$T/text.txt"
cat > "$T/lm.json" <<'J'
{"model_type": "llama", "vocab_size": 256, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32,
 "router": "learned", "shared_heads": 1, "top_k": 2}
J
sed 's/"router": "learned", "shared_heads": 1, "top_k": 2/"router": "none"/' "$T/lm.json" > "$T/lm_mha.json"
band_idx "$T/vit_data" 200 50 gz
cat > "$T/vit.json" <<'J'
{"model_type": "vit", "embed_dim": 16, "depth": 2, "num_heads": 4, "mlp_ratio": 2,
 "router": "learned", "shared_heads": 1, "top_k": 2}
J
column_idx "$T/dit_data" 64 16 7
cat > "$T/dit.json" <<'J'
{"model_type": "dit", "input_size": 8, "patch_size": 2, "num_classes": 4, "hidden_size": 16, "depth": 2,
 "num_heads": 4, "mlp_ratio": 2, "router": "learned", "shared_heads": [2, 4], "top_k": [1, 0]}
J
run() { # name, moh train arguments...
  local name=$1; shift
  "$MOH" train "$@" --out "$T/$name" --seed 7 --quiet > "$T/$name.log" 2>&1 || { echo "$name: FAILED"; cat "$T/$name.log"; return 0; }
  echo "$name $(sha256sum < "$T/$name/model.safetensors" | cut -c1-16)"
}
lm=(--data "$T/text.txt" --steps 4 --batch-size 4 --seq-len 32 --eval-limit 64)
run lm_sparse --config "$T/lm.json" "${lm[@]}" --sparse-attn --precision fp32
run lm_reference --config "$T/lm.json" "${lm[@]}" --reference-attention --precision fp32
run lm_mha --config "$T/lm_mha.json" "${lm[@]}" --precision fp32
run lm_bf16 --config "$T/lm.json" "${lm[@]}" --sparse-attn --precision bf16
run lm_muon --config "$T/lm.json" "${lm[@]}" --optimizer muon --precision fp32
vit=(--config "$T/vit.json" --data "$T/vit_data" --steps 3 --batch-size 16 --shards 2 --eval-limit 32)
run vit_reference "${vit[@]}" --reference-attention --precision fp32
run vit_sparse "${vit[@]}" --sparse-attn --precision fp32
run vit_bf16 "${vit[@]}" --sparse-attn --precision bf16
dit=(--config "$T/dit.json" --data "$T/dit_data" --steps 3 --batch-size 8 --shards 2 --ema-decay 0.9 --eval-limit 16)
run dit_reference "${dit[@]}" --reference-attention --precision fp32
run dit_sparse "${dit[@]}" --sparse-attn --precision fp32
run dit_bf16 "${dit[@]}" --sparse-attn --precision bf16
