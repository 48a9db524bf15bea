#!/usr/bin/env bash
# --precision fp32|bf16 through the CLI on a tiny LM: a CPU without bf16 hardware (simulated with
# MOH_NO_BF16=1) runs fp32 and says so in one line, with the fp32 run's exact losses; --precision
# fp32 equals no flag bitwise; where the CPU has bf16, training says which kernels run, its losses
# track fp32, eval in bf16 gives the fp32 bits/byte to 1e-2, and the checkpoint stays F32.
set -uo pipefail
. "$(dirname "$0")/lib.sh"

verses 800 > "$T/corpus.txt"
cat > "$T/tiny.json" <<J
{"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
 "vocab_size": 256, "max_position_embeddings": 32, "rms_norm_eps": 1e-5, "rope_theta": 10000,
 "router": "learned", "shared_heads": 1, "top_k": 2, "load_balance_coef": 0.01}
J
common=(--config "$T/tiny.json" --data "$T/corpus.txt" --batch-size 4 --seq-len 32 --steps 12 --eval-tokens 1000 --seed 3)
losses() { grep -o '"loss": [0-9.]*' "$1/metrics.jsonl" | tr '\n' ' '; }

"$MOH" train "${common[@]}" --out "$T/none" --quiet || bad "train (no flag) exited $?"
"$MOH" train "${common[@]}" --out "$T/fp32" --precision fp32 --quiet || bad "train --precision fp32 exited $?"
check "cmp -s '$T/none/model.safetensors' '$T/fp32/model.safetensors'" "--precision fp32 differs from no flag"

# no bf16 hardware: fp32, one line saying so, the fp32 losses exactly
MOH_NO_BF16=1 "$MOH" train "${common[@]}" --out "$T/off" --precision bf16 > "$T/off.txt" 2>&1 || bad "train without bf16 exited $?"
check "grep -q -- '--precision bf16 runs fp32: MOH_NO_BF16 is set' '$T/off.txt'" "no fallback line: $(head -3 "$T/off.txt")"
check "[ \"\$(losses '$T/off')\" = \"\$(losses '$T/fp32')\" ]" "fallback losses differ from fp32"
MOH_NO_BF16=1 "$MOH" eval --checkpoint "$T/fp32" --data "$T/corpus.txt" --precision bf16 > /dev/null 2> "$T/offe.txt" || bad "eval without bf16 exited $?"
check "grep -q 'runs fp32' '$T/offe.txt'" "eval: no fallback line"
"$MOH" train --precision fp16 "${common[@]}" --out "$T/x" > /dev/null 2> "$T/bad.txt"
check "[ \$? -eq 2 ] && grep -q 'fp32|bf16' '$T/bad.txt'" "--precision fp16 not refused with the choices"

if grep -qw avx512_bf16 /proc/cpuinfo || grep -qw amx_bf16 /proc/cpuinfo; then
  "$MOH" train "${common[@]}" --out "$T/bf16" --precision bf16 > "$T/bf.txt" 2>&1 || bad "train --precision bf16 exited $?"
  check "grep -q '^compute: bf16 .*oneDNN matmul' '$T/bf.txt'" "no compute line: $(head -3 "$T/bf.txt")"
  check "[ \"\$(losses '$T/bf16')\" != \"\$(losses '$T/fp32')\" ]" "bf16 losses equal fp32 bitwise (bf16 not used?)"
  # every step's loss within 2 % of fp32
  paste <(losses "$T/fp32" | tr ' ' '\n' | grep .) <(losses "$T/bf16" | tr ' ' '\n' | grep .) > "$T/pairs.txt"
  check "awk '{ d = \$1 - \$2; if (d < 0) d = -d; if (d > 0.02 * \$1) bad = 1 } END { exit bad }' '$T/pairs.txt'" \
        "bf16 losses stray from fp32: $(tr '\n' ' ' < "$T/pairs.txt")"
  check "python3 -c 'import json,struct,sys; f=open(sys.argv[1],\"rb\"); n=struct.unpack(\"<Q\",f.read(8))[0]; h=json.loads(f.read(n)); sys.exit(any(v[\"dtype\"]!=\"F32\" for k,v in h.items() if k!=\"__metadata__\"))' '$T/bf16/model.safetensors'" \
        "bf16 checkpoint is not all F32"
  a=$("$MOH" eval --checkpoint "$T/fp32" --data "$T/corpus.txt" --json 2>/dev/null | grep -o '"bits_per_byte": [0-9.]*' | grep -o '[0-9.]*$')
  b=$("$MOH" eval --checkpoint "$T/fp32" --data "$T/corpus.txt" --json --precision bf16 2>/dev/null | grep -o '"bits_per_byte": [0-9.]*' | grep -o '[0-9.]*$')
  check "awk -v a='$a' -v b='$b' 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0 && d <= 0.01 * a && a != b) }'" \
        "eval bf16 bits/byte $b vs fp32 $a"
else
  echo "cli_bf16: no AVX512-BF16 / AMX-BF16 here: the bf16 runs are not checked"
fi

finish
