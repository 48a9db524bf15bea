#!/usr/bin/env bash
# Decoding from ggml's quantised blocks (issue 29): moh convert --outtype q8_0 / q4_1 writes a GGUF
# whose matrices are Q8_0 / Q4_1 blocks (a 4-bit file keeps the embedding Q8_0); moh chat and moh
# sample decode such a file from its own blocks by default and say so (head_dim 8 here: attn_output,
# read per head, stays float), in fp32 with --precision fp32, and quantise a float model with
# --precision q8_0 / q4_0 / q4_1; moh bench decode runs the file's blocks (gguf) and quantised
# precisions side by side (every one of them at once); a float file asked for its blocks, a bad
# precision and a type name in the wrong case (its right spelling suggested) are one-line errors.
# (tests/test_decode_quant.c checks the numbers; this checks the commands.)
#   tests/cli_quant.sh path/to/moh
set -uo pipefail
. "$(dirname "$0")/lib.sh"
FIX=$(cd "$(dirname "$0")" && pwd)/fixtures/gguf_llama
CHAT=$FIX/tiny-chat.gguf
expect_fail() { local msg=$1; shift; if one_line_error "$@"; then ok; else bad "$msg: $why"; fi; }

"$MOH" convert --model "$CHAT" --out "$T/q8.gguf" --outtype q8_0 > /dev/null || bad "convert --outtype q8_0"
"$MOH" convert --model "$CHAT" --out "$T/q41.gguf" --outtype q4_1 > /dev/null || bad "convert --outtype q4_1"
# a quantised GGUF reads back: the same tokenizer, every matrix within its blocks' rounding
"$MOH" convert --model "$T/q8.gguf" --out "$T/q8dir" > /dev/null || bad "q8_0 gguf -> folder"
"$MOH" convert --model "$CHAT" --out "$T/f32dir" > /dev/null || bad "f32 gguf -> folder"
check "python3 - '$T/f32dir/model.safetensors' '$T/q8dir/model.safetensors' <<'PY'
import json, struct, sys, array
def read(p):
    f = open(p, 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n)); d = f.read()
    out = {}
    for k, v in h.items():
        if k == '__metadata__': continue
        x = array.array('f'); x.frombytes(d[v['data_offsets'][0]:v['data_offsets'][1]]); out[k] = (v['shape'], x)
    return out
a, b = read(sys.argv[1]), read(sys.argv[2])
assert a.keys() == b.keys()
for k in a:
    (s, x), (_, y) = a[k], b[k]
    if len(s) == 1:
        assert x == y, k                      # norms stay F32
        continue
    for r in range(0, len(x), s[-1]):         # per block of 32: half a step of amax / 127 (the step an f16)
        for j in range(r, r + s[-1], 32):
            amax = max(abs(v) for v in x[j:j + 32])
            assert max(abs(u - v) for u, v in zip(x[j:j + 32], y[j:j + 32])) <= amax / 127 * 0.6 + 1e-7, k
    assert x != y, k                          # quantised indeed
PY" "q8_0 gguf: weights not within the blocks' rounding of the float ones"

# chat: the file's blocks by default (said on stderr), fp32 on request, quantised from floats on request
printf 'hi there\nbye\n' | "$MOH" chat --model "$T/q8.gguf" --max-tokens 5 --seed 3 > "$T/c1.out" 2> "$T/c1.err"; rc=$?
check "[ $rc -eq 0 ] && [ \$(wc -l < '$T/c1.out') -eq 2 ] && grep -q \"decoding with the file's own blocks: quantised matrices 7 q8_0\" '$T/c1.err'" "chat q8_0 gguf: rc $rc: $(cat "$T/c1.err")"
printf 'hi there\nbye\n' | "$MOH" chat --model "$T/q8.gguf" --max-tokens 5 --seed 3 --precision fp32 > /dev/null 2> "$T/c2.err"; rc=$?
check "[ $rc -eq 0 ] && ! grep -q 'quantised' '$T/c2.err'" "chat --precision fp32 on a q8_0 gguf: rc $rc: $(cat "$T/c2.err")"
printf 'hi\n' | "$MOH" chat --model "$T/q41.gguf" --max-tokens 5 > /dev/null 2> "$T/c3.err"; rc=$?
check "[ $rc -eq 0 ] && grep -q 'quantised matrices 1 q8_0, 6 q4_1' '$T/c3.err'" "chat q4_1 gguf (embedding q8_0): rc $rc: $(cat "$T/c3.err")"
printf 'hi\n' | "$MOH" chat --model "$CHAT" --max-tokens 5 --precision q4_0 > /dev/null 2> "$T/c4.err"; rc=$?
check "[ $rc -eq 0 ] && grep -q 'weights quantised here from the float ones: quantised matrices 1 q8_0, [0-9]* q4_0' '$T/c4.err'" "chat --precision q4_0: rc $rc: $(cat "$T/c4.err")"
# sample: the same default and flags; greedy text from the file's blocks is reproducible
"$MOH" sample --model "$T/q8.gguf" --prompt "hello" --max-tokens 8 --temperature 0 > "$T/s1.out" 2> "$T/s1.err" || bad "sample q8_0 gguf exited $?"
"$MOH" sample --model "$T/q8.gguf" --prompt "hello" --max-tokens 8 --temperature 0 > "$T/s2.out" 2>/dev/null
check "grep -q \"file's own blocks\" '$T/s1.err' && cmp -s '$T/s1.out' '$T/s2.out' && [ \$(wc -c < '$T/s1.out') -gt 5 ]" "sample q8_0 gguf: $(cat "$T/s1.err")"
expect_fail "sample --precision q2_K" 2 'precision' "$MOH" sample --model "$T/q8.gguf" --precision q2_K
# bench decode: the file's blocks and a quantisation side by side, each row named, ratios to the first
"$MOH" bench decode --model "$T/q8.gguf" --precision fp32,gguf,q4_1 --context 16 --tokens 4 --repeats 1 --threads 1 --json > "$T/bd.json" 2>/dev/null || bad "bench decode --precision fp32,gguf,q4_1 exited $?"
check "python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert [x[\"precision\"] for x in r] == [\"fp32\", \"gguf\", \"q4_1\"] and r[0][\"decode_vs_first_precision\"] == 1.0 and all(x[\"decode_tokens_per_s\"] > 0 for x in r), r' '$T/bd.json'" "bench decode rows: $(head -c 400 "$T/bd.json")"
"$MOH" bench decode --model "$CHAT" --precision gguf --context 16 --tokens 2 --repeats 1 > /dev/null 2> "$T/b.err"; rc=$?
check "[ $rc -eq 1 ] && [ \$(grep -vc '^\[loading' '$T/b.err') -eq 1 ] && grep -q 'gguf: --precision gguf: the file holds no matrices of q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K or q6_K' '$T/b.err'" "bench decode gguf on a float file: rc $rc: $(cat "$T/b.err")"
expect_fail "bench decode --precision fp32,q3" 2 'expected a comma list' "$MOH" bench decode --model "$CHAT" --precision fp32,q3
expect_fail "bench decode --precision q4_1,gguf,q4_1" 2 "'q4_1' given twice" "$MOH" bench decode --model "$CHAT" --precision q4_1,gguf,q4_1
expect_fail "bench decode q8_0 on a synthetic model" 2 'needs --model PATH' "$MOH" bench decode --model small --precision q8_0
# every precision at once (each once; the list once overran a 6-slot array), one row each
all=fp32,bf16,gguf,q8_0,q4_0,q4_1,q5_0,q5_1,q4_K,q5_K,q6_K
"$MOH" bench decode --model "$T/q8.gguf" --precision $all --context 16 --tokens 2 --repeats 1 --threads 1 --json > "$T/ba.json" 2> "$T/ba.err"; rc=$?
check "[ $rc -eq 0 ] && python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); p=[x[\"precision\"] for x in r]; assert len(p) == len(set(p)) and set(p) - {\"bf16\"} == set(sys.argv[2].split(\",\")) - {\"bf16\"}, p' '$T/ba.json' $all" "bench decode --precision $all: rc $rc: $(tail -n 2 "$T/ba.err")"
# a type name in another case: the right one suggested
expect_fail "convert --outtype q4_k" 2 "did you mean 'q4_K'" "$MOH" convert --model "$CHAT" --out "$T/y.gguf" --outtype q4_k
# a folder output stays F32
expect_fail "convert --outtype q4_1 to a folder" 2 'always F32' "$MOH" convert --model "$CHAT" --out "$T/x" --outtype q4_1
finish
