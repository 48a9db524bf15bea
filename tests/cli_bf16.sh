#!/usr/bin/env bash
# --precision fp32|bf16 through the CLI on a tiny LM: a CPU without bf16 hardware (simulated with
# MOH_NO_BF16=1) runs fp32 and says so in one line, with the fp32 run's exact losses; --precision
# fp32 equals no flag bitwise; where the CPU has bf16, training says which kernels run, its losses
# track fp32, eval in bf16 gives the fp32 bits/byte to 1e-2, and the checkpoint stays F32; on an
# AVX-512 CPU `moh sample --precision bf16` decodes in bf16 and says with which kernels, and
# `moh bench decode --precision both` gives bf16 rows with their ratio to fp32.
# The same for the image families on vit-moh-75 (reference and head-sparse attention) and
# dit-moh-75 (train, eval; the DiT's sample too), 3 tiny steps each: without bf16 the weights and
# images equal fp32 bitwise.
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

# no flag: --precision auto, which names its choice and both times on the compute line, and runs
# exactly what it chose (compared below with the explicit runs)
"$MOH" train "${common[@]}" --out "$T/none" > "$T/none.txt" 2>&1 || bad "train (no flag) exited $?"
auto=$(grep -o -- '--precision auto chose [a-z0-9]* ([^)]*fp32 [0-9]* ms, bf16 [0-9]* ms' "$T/none.txt" | awk '{print $4}')
MOH_NO_BF16=1 "$MOH" train "${common[@]}" --out "$T/none_off" > "$T/none_off.txt" 2>&1 || bad "auto without bf16 exited $?"
check "grep -q -- '--precision auto chose fp32 (MOH_NO_BF16 is set' '$T/none_off.txt'" "auto without bf16: $(grep compute "$T/none_off.txt")"
check "[ -n '$auto' ]" "auto named no choice: $(grep compute "$T/none.txt")"
"$MOH" train "${common[@]}" --out "$T/fp32" --precision fp32 --quiet || bad "train --precision fp32 exited $?"
check "cmp -s '$T/none_off/model.safetensors' '$T/fp32/model.safetensors'" "auto without bf16 differs from --precision fp32"
[ "$auto" = fp32 ] && { check "cmp -s '$T/none/model.safetensors' '$T/fp32/model.safetensors'" "auto chose fp32 but differs from it"; }

# no bf16 hardware: fp32, one line saying so, the fp32 losses exactly
MOH_NO_BF16=1 "$MOH" train "${common[@]}" --out "$T/off" --precision bf16 > "$T/off.txt" 2>&1 || bad "train without bf16 exited $?"
check "grep -q -- '--precision bf16 runs fp32: MOH_NO_BF16 is set' '$T/off.txt'" "no fallback line: $(head -3 "$T/off.txt")"
check "[ \"\$(losses '$T/off')\" = \"\$(losses '$T/fp32')\" ]" "fallback losses differ from fp32"
MOH_NO_BF16=1 "$MOH" eval --checkpoint "$T/fp32" --data "$T/corpus.txt" --precision bf16 > /dev/null 2> "$T/offe.txt" || bad "eval without bf16 exited $?"
check "grep -q 'runs fp32' '$T/offe.txt'" "eval: no fallback line"
"$MOH" train --precision fp16 "${common[@]}" --out "$T/x" > /dev/null 2> "$T/bad.txt"
check "[ \$? -eq 2 ] && grep -q 'auto|fp32|bf16' '$T/bad.txt'" "--precision fp16 not refused with the choices"

bf16hw=0 # the CPU has bf16 hardware, and MOH_NO_BF16 does not hide it
if { grep -qw avx512_bf16 /proc/cpuinfo || grep -qw amx_bf16 /proc/cpuinfo; } && [ "${MOH_NO_BF16:-0}" = 0 ]; then bf16hw=1; fi
if [ "$bf16hw" = 1 ]; then
  "$MOH" train "${common[@]}" --out "$T/bf16" --precision bf16 > "$T/bf.txt" 2>&1 || bad "train --precision bf16 exited $?"
  check "grep -q '^compute: bf16 .*oneDNN matmul' '$T/bf.txt'" "no compute line: $(head -3 "$T/bf.txt")"
  [ "$auto" = bf16 ] && { check "cmp -s '$T/none/model.safetensors' '$T/bf16/model.safetensors'" "auto chose bf16 but differs from it"; }
  check "[ \"\$(losses '$T/bf16')\" != \"\$(losses '$T/fp32')\" ]" "bf16 losses equal fp32 bitwise (bf16 not used?)"
  # every step's loss within 2 % of fp32
  paste <(losses "$T/fp32" | tr ' ' '\n' | grep .) <(losses "$T/bf16" | tr ' ' '\n' | grep .) > "$T/pairs.txt"
  check "awk '{ d = \$1 - \$2; if (d < 0) d = -d; if (d > 0.02 * \$1) bad = 1 } END { exit bad }' '$T/pairs.txt'" \
        "bf16 losses stray from fp32: $(tr '\n' ' ' < "$T/pairs.txt")"
  check "python3 -c 'import json,struct,sys; f=open(sys.argv[1],\"rb\"); n=struct.unpack(\"<Q\",f.read(8))[0]; h=json.loads(f.read(n)); sys.exit(any(v[\"dtype\"]!=\"F32\" for k,v in h.items() if k!=\"__metadata__\"))' '$T/bf16/model.safetensors'" \
        "bf16 checkpoint is not all F32"
  a=$("$MOH" eval --checkpoint "$T/fp32" --data "$T/corpus.txt" --json --precision fp32 2>/dev/null | grep -o '"bits_per_byte": [0-9.]*' | grep -o '[0-9.]*$')
  b=$("$MOH" eval --checkpoint "$T/fp32" --data "$T/corpus.txt" --json --precision bf16 2>/dev/null | grep -o '"bits_per_byte": [0-9.]*' | grep -o '[0-9.]*$')
  check "awk -v a='$a' -v b='$b' 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0 && d <= 0.01 * a && a != b) }'" \
        "eval bf16 bits/byte $b vs fp32 $a"
else
  echo "cli_bf16: no AVX512-BF16 / AMX-BF16 here: the bf16 runs are not checked"
fi

# the image families on their shipped configs (28x28 IDX data written here, a few tiny steps):
# ViT vit-moh-75 (reference attention, its default, and head-sparse) and DiT dit-moh-75
band_idx "$T/img" 96 32
f32() { python3 -c 'import json,struct,sys; f=open(sys.argv[1],"rb"); n=struct.unpack("<Q",f.read(8))[0]; h=json.loads(f.read(n)); sys.exit(any(v["dtype"]!="F32" for k,v in h.items() if k!="__metadata__"))' "$1"; }
field() { "$MOH" eval --checkpoint "$1" --data "$T/img" --json "${@:3}" 2>/dev/null | grep -o "\"$2\": [0-9.e-]*" | head -1 | grep -o '[0-9.e-]*$'; }
for run in "vit-moh-75:" "vit-moh-75:--sparse-attn" "dit-moh-75:"; do
  c=${run%%:*} extra=${run#*:} tag=${run//[:-]/_}
  img=(--config "$c" --data "$T/img" --batch-size 8 --shards 2 --steps 3 --train-limit 48 --eval-limit 16 --seed 5 $extra)
  "$MOH" train "${img[@]}" --out "$T/${tag}f" --precision fp32 --quiet || bad "$c $extra: train fp32 exited $?"
  MOH_NO_BF16=1 "$MOH" train "${img[@]}" --out "$T/${tag}o" --precision bf16 > "$T/${tag}o.txt" 2>&1 || bad "$c $extra: train without bf16 exited $?"
  check "grep -q -- '--precision bf16 runs fp32: MOH_NO_BF16 is set' '$T/${tag}o.txt'" "$c $extra: no fallback line"
  check "cmp -s '$T/${tag}f/model.safetensors' '$T/${tag}o/model.safetensors'" "$c $extra: fallback weights differ from fp32"
  [ "$bf16hw" = 1 ] || continue
  "$MOH" train "${img[@]}" --out "$T/${tag}b" --precision bf16 > "$T/${tag}b.txt" 2>&1 || bad "$c $extra: train bf16 exited $?"
  check "grep -q '^compute: bf16 .*oneDNN matmul' '$T/${tag}b.txt'" "$c $extra: no compute line: $(head -3 "$T/${tag}b.txt")"
  check "! cmp -s '$T/${tag}f/model.safetensors' '$T/${tag}b/model.safetensors'" "$c $extra: bf16 weights equal fp32 (bf16 not used?)"
  check "f32 '$T/${tag}b/model.safetensors'" "$c $extra: bf16 checkpoint is not all F32"
  # every step's loss within 2 % of fp32
  paste <(losses "$T/${tag}f" | grep -o '[0-9][0-9.]*') <(losses "$T/${tag}b" | grep -o '[0-9][0-9.]*') > "$T/${tag}p.txt"
  check "[ \$(wc -l < '$T/${tag}p.txt') -eq 3 ] && awk '{ d = \$1 - \$2; if (d < 0) d = -d; if (d > 0.02 * \$1) bad = 1 } END { exit bad }' '$T/${tag}p.txt'" \
        "$c $extra: bf16 losses stray from fp32: $(tr '\n' ' ' < "$T/${tag}p.txt")"
  # eval in bf16 of the fp32 checkpoint: the plain loss within 2 %
  key=ce_loss; [ "$c" = dit-moh-75 ] && key=val_mse
  a=$(field "$T/${tag}f" $key $extra --precision fp32) b=$(field "$T/${tag}f" $key $extra --precision bf16)
  check "awk -v a='$a' -v b='$b' 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0 && d <= 0.02 * a && a != b) }'" \
        "$c $extra: eval bf16 $key $b vs fp32 $a"
done
# DiT sampling: bf16 differs from fp32 but stays close; without bf16 hardware the fp32 images exactly
smp=(--checkpoint "$T/dit_moh_75_f" --n 2 --steps 4 --seed 2)
"$MOH" sample "${smp[@]}" --out-idx "$T/sf.idx" 2>/dev/null > /dev/null || bad "sample fp32 exited $?"
MOH_NO_BF16=1 "$MOH" sample "${smp[@]}" --out-idx "$T/so.idx" --precision bf16 > /dev/null 2> "$T/so.txt" || bad "sample without bf16 exited $?"
check "grep -q 'runs fp32: MOH_NO_BF16 is set' '$T/so.txt' && cmp -s '$T/sf.idx' '$T/so.idx'" "sample fallback: no line, or images differ from fp32"
if [ "$bf16hw" = 1 ]; then
  "$MOH" sample "${smp[@]}" --out-idx "$T/sb.idx" --precision bf16 > /dev/null 2> "$T/sb.txt" || bad "sample bf16 exited $?"
  check "grep -q 'compute bf16' '$T/sb.txt'" "sample bf16: no compute line"
  check "python3 -c 'import sys; a=open(sys.argv[1],\"rb\").read()[16:]; b=open(sys.argv[2],\"rb\").read()[16:]; d=sum(abs(x-y) for x,y in zip(a,b))/len(a); sys.exit(not (len(a)==len(b) and 0 < d < 8))' '$T/sf.idx' '$T/sb.idx'" \
        "sample bf16 images not close to fp32 (mean abs pixel difference outside (0, 8))"
fi

# bf16 KV-cache decoding: any AVX-512 CPU (vdpbf16ps with AVX512-BF16, else bf16 widened to fp32)
if grep -qw avx512bw /proc/cpuinfo && grep -qw avx512vl /proc/cpuinfo; then
  "$MOH" sample --checkpoint "$T/fp32" --prompt "verse 1" --max-tokens 30 --temperature 0 --precision bf16 \
    > "$T/sb.out" 2> "$T/sb.err" || bad "sample --precision bf16 exited $?"
  check "grep -q '^moh sample: decoding with bf16 weights and KV cache' '$T/sb.err' && [ \$(wc -c < '$T/sb.out') -ge 37 ]" \
        "sample bf16: $(cat "$T/sb.err")"
  MOH_NO_BF16=1 "$MOH" sample --checkpoint "$T/fp32" --prompt "verse 1" --max-tokens 30 --temperature 0 --precision bf16 \
    > /dev/null 2> "$T/sw.err" || bad "sample --precision bf16 without AVX512-BF16 exited $?"
  check "grep -q 'avx512 widen+fma kernels' '$T/sw.err'" "sample bf16, MOH_NO_BF16=1: $(cat "$T/sw.err")"
  # bench decode --precision both: fp32 rows, then bf16 rows, each with its ratio to its fp32 twin
  "$MOH" bench decode --model small --context 40 --tokens 4 --repeats 1 --threads 1 --precision both --json \
    > "$T/bd.json" 2>/dev/null || bad "bench decode --precision both exited $?"
  check "python3 - '$T/bd.json' <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert [x['precision'] for x in r] == ['fp32'] * 3 + ['bf16'] * 3 and [x['top_k'] for x in r] == [0, 4, 2] * 2, r
for f, b in zip(r[:3], r[3:]):
    assert f['speedup_vs_fp32'] == 1.0 and abs(b['speedup_vs_fp32'] - b['tokens_per_s'] / f['tokens_per_s']) < 2e-3 * b['speedup_vs_fp32'], (f, b)
    assert b['active'] == f['active'], (f, b)
PY" "bench decode --precision both: $(head -c 600 "$T/bd.json")"
fi

finish
