#!/usr/bin/env bash
# The CUDA paths of the CLI (`moh layer --device cuda`, `moh bench attention --device cuda`): on a
# machine without a GPU (or a build without CUDA) each says why in one line and exits 1; usage
# errors exit 2; --device of the model commands (train, eval, sample, analyze): cuda refused in one
# line with nothing written (the CUDA backend does not run whole models yet, issue 27), auto runs on
# the CPU and train's start line names the device and why; with a GPU, `moh layer --device cuda` writes the same tensors as the CPU path
# (the values are checked by tests/test_cuda_attn.c and tools/gpu/layer_cli_check.py).
set -u
. "$(dirname "$0")/lib.sh"
FIX=tests/fixtures/layer/learned_gqa_rope500k
args=(layer --config "$FIX/config.json" --weights "$FIX/weights.safetensors" --input "$FIX/input.safetensors")
expect_fail() { if one_line_error "$@"; then ok; else bad "$why"; fi; }

expect_fail 2 "cpu|cuda" "$MOH" "${args[@]}" --output "$T/o.safetensors" --device tpu
expect_fail 2 "reference runs on the CPU" "$MOH" "${args[@]}" --output "$T/o.safetensors" --device cuda --path reference
expect_fail 2 "shapes" "$MOH" bench attention --device cuda --shapes nosuchshape
if "$MOH" "${args[@]}" --output "$T/o.safetensors" --device cuda 2>"$T/err.txt"; then
    echo "a GPU is present: moh layer --device cuda ran"
    ok
else
    # no GPU here, or no CUDA in this build: one line naming it, nothing written
    check '[ "$(wc -l < "$T/err.txt")" -eq 1 ] && grep -qE "CUDA|head_dim" "$T/err.txt"' \
          "moh layer --device cuda without a GPU: $(cat "$T/err.txt")"
    check '[ ! -e "$T/o.safetensors" ]' "moh layer --device cuda failed but wrote its output"
    expect_fail 1 "device cuda" "$MOH" bench attention --device cuda --shapes vit-b-197 --repeats 1
fi

# --device on the model commands (src/backend: the registry and its resolution)
verses 300 > "$T/t.txt"
cat > "$T/lm.json" <<'EOF2'
{"model_type": "llama", "vocab_size": 256, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
 "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 16, "router": "learned",
 "shared_heads": 1, "top_k": 2}
EOF2
tr=(train --config "$T/lm.json" --data "$T/t.txt" --steps 2 --batch-size 2 --seq-len 16)
expect_fail 2 "auto|cpu|cuda" "$MOH" "${tr[@]}" --out "$T/x" --device gpu
expect_fail 1 "^moh train: --device cuda: " "$MOH" "${tr[@]}" --out "$T/c" --device cuda
check '[ ! -e "$T/c" ]' "train --device cuda failed but made its --out"
"$MOH" "${tr[@]}" --out "$T/a" > "$T/auto.txt" 2>&1 || bad "train --device auto: $(tail -2 "$T/auto.txt")"
check "grep -q '^compute: .*; device cpu' '$T/auto.txt'" "train's start line names no device: $(grep compute "$T/auto.txt")"
if ! grep -q "^compute: .*device cpu (auto: " "$T/auto.txt"; then
  echo "note: --device auto gave no fallback reason (a GPU build on a GPU?): $(grep compute "$T/auto.txt")"
fi
"$MOH" "${tr[@]}" --out "$T/p" --device cpu --quiet || bad "train --device cpu"
check 'cmp -s "$T/a/model.safetensors" "$T/p/model.safetensors"' "--device auto and cpu trained different weights"
expect_fail 1 "^moh eval: --device cuda" "$MOH" eval --checkpoint "$T/a" --data "$T/t.txt" --device cuda
expect_fail 1 "^moh sample: --device cuda" "$MOH" sample --checkpoint "$T/a" --device cuda --max-tokens 2
expect_fail 1 "^moh analyze: --device cuda" "$MOH" analyze --checkpoint "$T/a" --data "$T/t.txt:x" --out "$T/an" --device cuda
check '[ ! -e "$T/an" ]' "analyze --device cuda failed but made its --out"
"$MOH" sample --checkpoint "$T/a" --device auto --max-tokens 2 > /dev/null 2>&1 || bad "sample --device auto"
finish
