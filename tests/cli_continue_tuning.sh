#!/usr/bin/env bash
# MHA -> MoH conversion and continue-tuning from the command line (issue 11), on the tiny ChatML
# GGUF fixture (4 heads, BPE vocabulary of 1024): `moh convert --to-moh` writes a query-norm /
# learned MoH checkpoint with the tokenizer; with top_k = every routed head it evaluates exactly as
# the dense model; `moh train --init` tunes it (loss finite, checkpoint reloads, STE on); sample
# and eval read it; bad head splits, stray options and a routed source are refused in one line.
#   tests/cli_continue_tuning.sh path/to/moh
set -uo pipefail
. "$(dirname "$0")/lib.sh"
FIX=$(cd "$(dirname "$0")" && pwd)/fixtures/gguf_llama/tiny-chat.gguf
# expect_fail CODE PATTERN cmd...: exit status CODE and one stderr line matching PATTERN
expect_fail() { if one_line_error "$@"; then ok; else bad "$why"; fi; }
field() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$@"; }
# (--precision fp32: the models are compared to 1e-5, each eval in the same precision)
bpb() { "$MOH" eval --checkpoint "$1" --data "$T/text.txt" --split all --seq-len 32 --json --precision fp32 2>/dev/null |
        python3 -c 'import json, sys; print("%.9f" % json.load(sys.stdin)["bits_per_byte"])'; }

for i in $(seq 1 60); do echo "In the beginning $i was the Word, and the Word was with God."; done > "$T/text.txt"

"$MOH" convert --model "$FIX" --out "$T/qn" --to-moh > "$T/log" || bad "convert --to-moh (defaults)"
check "grep -q '2 shared + top-1 of 2 routed' '$T/log'" "default split is h/2 shared + half of the rest: $(cat "$T/log")"
check "[[ \$(field '$T/qn/config.json' router) == query_norm && \$(field '$T/qn/config.json' straight_through) == True ]]" \
      "converted config: router query_norm, straight_through true"
check "[[ -f '$T/qn/tokenizer.json' ]]" "the converted folder keeps the tokenizer"

# top_k = all routed heads: the dense model's numbers
"$MOH" convert --model "$FIX" --out "$T/all" --to-moh --shared-heads 1 --top-k 3 > /dev/null || bad "convert K=all"
"$MOH" convert --model "$FIX" --out "$T/dense" > /dev/null || bad "convert dense"
d=$(bpb "$T/dense") a=$(bpb "$T/all") q=$(bpb "$T/qn")
echo "  bits/byte: dense $d, K=all $a, 2 + top-1 of 2: $q"
check "python3 -c 'import sys; d, a, q = map(float, sys.argv[1:]); sys.exit(not (abs(a - d) <= 1e-5 * d and abs(q - d) > 1e-4))' $d $a $q" \
      "K=all must equal dense ($a vs $d) and K<all differ ($q)"

# continue-tuning: query-norm (STE) and learned
for r in query_norm learned; do
  "$MOH" convert --model "$FIX" --out "$T/$r-init" --to-moh --router $r --shared-heads 2 --top-k 1 > /dev/null || bad "convert $r"
  "$MOH" train --init "$T/$r-init" --data "$T/text.txt" --out "$T/$r" --steps 4 --batch-size 2 --seq-len 32 \
    --lr 1e-3 --log-every 1 > "$T/train.log" 2>&1 || bad "train --init ($r): $(tail -3 "$T/train.log")"
  check "grep -q 'router $r' '$T/train.log' && grep -q '^done: 4 steps' '$T/train.log'" "train --init $r: $(tail -3 "$T/train.log")"
  check "[[ \$(field '$T/$r/config.json' router) == $r && -f '$T/$r/tokenizer.json' ]]" "tuned $r checkpoint: router and tokenizer"
  check "! cmp -s '$T/$r-init/model.safetensors' '$T/$r/model.safetensors'" "tuning $r changed no weight"
  "$MOH" sample --checkpoint "$T/$r" --prompt "In the" --max-tokens 8 --temperature 0 > "$T/s" 2>&1 || bad "sample $r: $(cat "$T/s")"
  check "[[ \$(bpb '$T/$r') =~ ^[0-9.]+$ ]]" "eval of tuned $r"
done
check "grep -q '\"wg.weight\\|self_attn.wg.weight' <(head -c 4000 '$T/learned/model.safetensors')" "the learned router's wg is in the checkpoint"

# refusals: one line each
expect_fail 2 "need --to-moh" "$MOH" convert --model "$FIX" --out "$T/x1" --top-k 1
expect_fail 2 "expected 0..3" "$MOH" convert --model "$FIX" --out "$T/x2" --to-moh --shared-heads 4
expect_fail 2 "expected 1..2" "$MOH" convert --model "$FIX" --out "$T/x3" --to-moh --shared-heads 2 --top-k 3
expect_fail 2 "query_norm|learned" "$MOH" convert --model "$FIX" --out "$T/x4" --to-moh --router topk
expect_fail 1 "already routes" "$MOH" convert --model "$T/qn" --out "$T/x5" --to-moh
VIT=$(cd "$(dirname "$0")" && pwd)/fixtures/vit/dense_token
expect_fail 2 "recipe for pretrained language models" "$MOH" convert --model "$VIT" --out "$T/x6" --to-moh
"$MOH" convert --model "$VIT" --out "$T/vit-moh" --to-moh --router learned --shared-heads 1 --top-k 1 > /dev/null || bad "a ViT converts with the learned router"
expect_fail 2 "writes a folder" "$MOH" convert --model "$FIX" --out "$T/x7.gguf" --to-moh
expect_fail 2 "always F32" "$MOH" convert --model "$FIX" --out "$T/x8" --outtype f16
expect_fail 2 "expected 0 <= X <= 1" "$MOH" convert --model "$FIX" --out "$T/x9" --to-moh --router learned --router-std 1e300
expect_fail 2 "is for --router query_norm" "$MOH" convert --model "$FIX" --out "$T/x9" --to-moh --router learned --no-straight-through
expect_fail 2 "need --router learned" "$MOH" convert --model "$FIX" --out "$T/x9" --to-moh --seed 3
expect_fail 1 "already holds a model" "$MOH" convert --model "$FIX" --out "$T/qn" --to-moh
check "[[ ! -e '$T/x1' && ! -e '$T/x2' && ! -e '$T/x3' && ! -e '$T/x5/model.safetensors' && ! -e '$T/x6' && ! -e '$T/x7.gguf' && ! -e '$T/x8' && ! -e '$T/x9' ]]" "a refused conversion wrote something"

finish
