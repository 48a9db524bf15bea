#!/usr/bin/env bash
# The CUDA paths of the CLI (`moh layer --device cuda`, `moh bench attention --device cuda`): on a
# machine without a GPU (or a build without CUDA) each says why in one line and exits 1; usage
# errors exit 2; with a GPU, `moh layer --device cuda` writes the same tensors as the CPU path
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
finish
