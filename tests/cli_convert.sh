#!/usr/bin/env bash
# moh convert between moh / Hugging Face folders and GGUF: the tiny LLaMA fixture written as
# llama.cpp's converter writes it (tests/fixtures/gguf_llama) goes GGUF -> folder -> GGUF -> folder
# with byte-identical weights (q/k rows permuted and back), the folder's weights equal the
# fixture's HF-layout ones, an F16 file holds the weights to F16 precision, a trained byte LM
# exports and reads back, a MoH checkpoint is refused in one line, and eval runs on the GGUF; a BPE
# model's folder keeps its tokenizer, moh train --init continue-tunes it on BPE text, and the model
# (tiny-chat.gguf) exports GGUF -> GGUF with its tokenizer: same ids, logits and chat;
# `moh bench decode --model` runs on both.
#   tests/cli_convert.sh path/to/moh
set -uo pipefail
. "$(dirname "$0")/lib.sh"
FIX=$(cd "$(dirname "$0")" && pwd)/fixtures/gguf_llama

"$MOH" convert --model "$FIX/tiny-llama.gguf" --out "$T/a" > /dev/null || bad "gguf -> folder"
"$MOH" convert --model "$T/a" --out "$T/a.gguf" > /dev/null || bad "folder -> gguf"
"$MOH" convert --model "$T/a.gguf" --out "$T/b" > /dev/null || bad "gguf -> folder again"
check "cmp -s '$T/a/model.safetensors' '$T/b/model.safetensors'" "round trip changed the weights"
check "cmp -s '$T/a/model.safetensors' '$FIX/model.safetensors' || python3 - '$T/a/model.safetensors' '$FIX/model.safetensors' <<'PY'
import json, struct, sys, array
def read(p):
    f = open(p, 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n)); d = f.read()
    return {k: d[v['data_offsets'][0]:v['data_offsets'][1]] for k, v in h.items() if k != '__metadata__'}
a, b = read(sys.argv[1]), read(sys.argv[2])
assert a == b, [k for k in a if a[k] != b.get(k)]
PY" "the GGUF's weights differ from the HF layout"
"$MOH" convert --model "$T/a" --out "$T/h.gguf" --outtype f16 > /dev/null || bad "folder -> f16 gguf"
"$MOH" convert --model "$T/h.gguf" --out "$T/h" > /dev/null || bad "f16 gguf -> folder"
check "python3 - '$T/a/model.safetensors' '$T/h/model.safetensors' <<'PY'
import json, struct, sys, array
def read(p):
    f = open(p, 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n)); d = f.read()
    out = {}
    for k, v in h.items():
        if k == '__metadata__': continue
        x = array.array('f'); x.frombytes(d[v['data_offsets'][0]:v['data_offsets'][1]]); out[k] = x
    return out
a, b = read(sys.argv[1]), read(sys.argv[2])
worst = max(abs(x - y) / max(abs(x), 1e-3) for k in a for x, y in zip(a[k], b[k]))
assert 0 < worst < 1e-3, worst   # F16 rounding: relative error up to 2^-11 (and the file is not F32)
PY" "f16 export: weights not within F16 precision"
# the fixture has 260 tokens and no tokenizer: not a byte model (256 tokens), so the commands that
# read or write text refuse it in one line
printf 'some text for the tiny model, long enough for a few chunks of context.\n%.0s' 1 2 3 4 > "$T/t.txt"
for cmd in "eval --checkpoint $FIX/tiny-llama.gguf --data $T/t.txt" "sample --checkpoint $FIX/tiny-llama.gguf --prompt ab" \
           "tokenize --model $FIX/tiny-llama.gguf --text ab" "tokenize --model $T/a --text ab" "eval --checkpoint $T/a --data $T/t.txt"; do
  out=$("$MOH" $cmd 2>&1); rc=$?
  check "[ $rc -eq 1 ] && [ \$(wc -l <<<\"\$out\") -eq 1 ] && grep -q 'vocab_size 260 needs a tokenizer (tokenizer.* a byte model has 256 tokens)' <<<\"\$out\"" "$cmd: rc $rc: $out"
done
# a trained byte LM (dense) exports; a MoH one is refused
cat > "$T/d.json" <<'J'
{"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 64,
 "vocab_size": 256, "max_position_embeddings": 16, "router": "none"}
J
sed 's/"router": "none"/"router": "learned", "shared_heads": 1, "top_k": 2/' "$T/d.json" > "$T/m.json"
"$MOH" train --config "$T/d.json" --data "$T/t.txt" --out "$T/dense" --steps 2 --batch-size 2 --quiet || bad "train dense"
"$MOH" train --config "$T/m.json" --data "$T/t.txt" --out "$T/moh" --steps 2 --batch-size 2 --quiet || bad "train moh"
"$MOH" convert --model "$T/dense" --out "$T/dense.gguf" > /dev/null || bad "dense -> gguf"
"$MOH" convert --model "$T/dense.gguf" --out "$T/dense2" > /dev/null || bad "dense gguf -> folder"
check "same_tensors '$T/dense/model.safetensors' '$T/dense2/model.safetensors'" "dense byte LM round trip changed the weights"
# the exported byte vocabulary reads back as bytes, and sample and eval run on the .gguf
check "'$MOH' eval --checkpoint '$T/dense.gguf' --data '$T/t.txt' --json | grep -q '\"bits_per_byte\"'" "eval on a .gguf"
check "[ \"\$('$MOH' tokenize --model '$T/dense.gguf' --text 'ab c')\" = '97 98 32 99' ]" "tokenize on the exported gguf: $("$MOH" tokenize --model "$T/dense.gguf" --text 'ab c' 2>&1)"
check "'$MOH' sample --checkpoint '$T/dense.gguf' --prompt ab --max-tokens 5 --seed 1 2>/dev/null | grep -q '^ab'" "sample on a .gguf"
# sample --dump-logits: the prompt's ids, its logits from the KV cache and from the full forward (equal
# to float rounding), and the greedy ids (the first is the argmax of the last prompt position)
"$MOH" sample --checkpoint "$T/dense.gguf" --prompt abc --max-tokens 4 --temperature 0 --dump-logits "$T/dl.st" > /dev/null 2>&1 || bad "sample --dump-logits"
check "python3 - '$T/dl.st' <<'PY'
import json, struct, sys, array
f = open(sys.argv[1], 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n)); d = f.read()
def t(k):
    x = array.array('f'); x.frombytes(d[h[k]['data_offsets'][0]:h[k]['data_offsets'][1]]); return h[k]['shape'], list(x)
(st, tok), (sl, kv), (sf, fw), (sg, gen) = t('tokens'), t('logits'), t('logits_forward'), t('generated')
assert st == [1, 3] and tok == [97, 98, 99] and sl == sf == [1, 3, 256] and sg == [1, 4], (st, tok, sl, sf, sg)
assert max(abs(a - b) for a, b in zip(kv, fw)) <= 1e-5 * max(abs(a) for a in fw)
last = kv[2 * 256:]
assert gen[0] == last.index(max(last)), (gen, last.index(max(last)))
PY" "sample --dump-logits: wrong contents"
out=$("$MOH" convert --model "$T/moh" --out "$T/moh.gguf" 2>&1); rc=$?
check "[ $rc -eq 1 ] && grep -q 'llama.cpp runs dense multi-head attention only' <<<\"\$out\" && [ ! -e '$T/moh.gguf' ]" "MoH export: rc $rc: $out"
out=$("$MOH" convert --model "$T/a" --out "$T/a.gguf" 2>&1); rc=$?
check "[ $rc -eq 1 ] && grep -q 'already exists: give a new --out' <<<\"\$out\"" "convert over an existing .gguf: rc $rc: $out"
# a tokenizer-only GGUF tokenizes (special tokens first, digits one by one under the smollm pre-tokenizer)
BPE=$(cd "$(dirname "$0")" && pwd)/fixtures/bpe/smollm.gguf
check "[ \"\$('$MOH' tokenize --model '$BPE' --text '<|im_start|>12')\" = '1 19 20' ]" "tokenize with a tokenizer-only gguf: $("$MOH" tokenize --model "$BPE" --text '<|im_start|>12' 2>&1)"
out=$("$MOH" convert --model "$T/a" --out "$T/b" 2>&1); rc=$?
check "[ $rc -eq 1 ] && grep -q 'already holds a model' <<<\"\$out\"" "convert over a model: rc $rc: $out"
out=$("$MOH" convert --model "$T/nope.gguf" --out "$T/x" 2>&1); rc=$?
check "[ $rc -eq 1 ] && grep -q 'nope.gguf' <<<\"\$out\"" "missing input: rc $rc: $out"
# moh chat on a tiny ChatML model (tools/ref/bpe_gguf_fixture.py; replies are noise): one reply line
# per message, /reset, a turn past the context of 64 tokens refused with a message, the same
# replies for the same seed, and a model without ChatML tokens refused in one line
CHAT=$FIX/tiny-chat.gguf
printf 'hi there\nhello again\n/reset\nbye\n' | "$MOH" chat --model "$CHAT" --max-tokens 5 --seed 3 > "$T/c1.out" 2> "$T/c1.err"; rc=$?
check "[ $rc -eq 0 ] && [ \$(wc -l < '$T/c1.out') -eq 3 ] && grep -q 'new conversation' '$T/c1.err'" "chat: rc $rc, $(wc -l < "$T/c1.out") reply lines: $(cat "$T/c1.err")"
printf 'hi there\nhello again\n/reset\nbye\n' | "$MOH" chat --model "$CHAT" --max-tokens 5 --seed 3 > "$T/c2.out" 2>/dev/null
check "cmp -s '$T/c1.out' '$T/c2.out'" "chat: the same seed gave other replies"
printf 'hi there\nbye\n' | "$MOH" chat --model "$CHAT" --max-tokens 5 --seed 3 --precision bf16 > "$T/c9.out" 2> "$T/c9.err"; rc=$?
check "[ $rc -eq 0 ] && [ \$(wc -l < '$T/c9.out') -eq 2 ] && grep -Eq 'bf16 weights and KV cache|decoding runs fp32' '$T/c9.err'" "chat --precision bf16: rc $rc, $(wc -l < "$T/c9.out") reply lines: $(cat "$T/c9.err")"
long=$(printf 'word %.0s' $(seq 60))
printf '%s\nhi\n' "$long" | "$MOH" chat --model "$CHAT" --max-tokens 3 > "$T/c3.out" 2> "$T/c3.err"; rc=$?
# refused: an empty line in its place (the replies stay one line per message) and exit status 1
check "[ $rc -eq 1 ] && grep -q 'would pass the context of 64 tokens' '$T/c3.err' && [ \$(wc -l < '$T/c3.out') -eq 2 ] && [ -z \"\$(head -1 '$T/c3.out')\" ] && [ -n \"\$(sed -n 2p '$T/c3.out')\" ] && grep -q '1 message refused' '$T/c3.err'" "chat past the context: rc $rc: $(cat "$T/c3.err")"
# a line longer than 64 KiB is one message (one refusal, two lines), and a long --system is kept whole:
# the refused turn's token count is that of the whole ChatML text
python3 -c "print('word ' * 14000); print('hi')" | "$MOH" chat --model "$CHAT" --max-tokens 3 > "$T/c7.out" 2> "$T/c7.err"; rc=$?
check "[ $rc -eq 1 ] && [ \$(grep -c 'would pass the context' '$T/c7.err') -eq 1 ] && [ \$(wc -l < '$T/c7.out') -eq 2 ]" "chat: a 70 kB line: rc $rc, $(grep -c 'would pass' "$T/c7.err") refusals, $(wc -l < "$T/c7.out") lines"
sys=$(python3 -c "print('ab ' * 1400, end='')")
echo hi | "$MOH" chat --model "$CHAT" --system "$sys" --max-tokens 3 > /dev/null 2> "$T/c8.err"
printf '<|im_start|>system\n%s<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n' "$sys" > "$T/turn.txt"
want=$("$MOH" tokenize --model "$CHAT" --file "$T/turn.txt" | wc -w)
check "grep -q \"this message ($want tokens\" '$T/c8.err'" "chat --system of 4200 bytes cut: want $want tokens: $(cat "$T/c8.err")"
out=$(echo hi | "$MOH" chat --model "$T/dense.gguf" 2>&1); rc=$?
check "[ $rc -eq 1 ] && grep -q 'is not a ChatML chat model' <<<\"\$out\"" "chat on a model without ChatML: rc $rc: $out"
out=$(echo hi | "$MOH" chat --model "$FIX/tiny-llama.gguf" 2>&1); rc=$?
check "[ $rc -eq 1 ] && [ \$(wc -l <<<\"\$out\") -eq 1 ] && grep -q 'vocab_size 260 needs a tokenizer' <<<\"\$out\"" "chat on a model of 260 tokens without tokenizer: rc $rc: $out"
# rope_scaling (tests/fixtures/lm_rope): a folder written back keeps it; GGUF export refuses it in one
# line; a type moh does not implement is a one-line error naming config.json and the field
ROPE=$(cd "$(dirname "$0")" && pwd)/fixtures/lm_rope/llama3
"$MOH" convert --model "$ROPE" --out "$T/rope" > /dev/null || bad "rope_scaling folder -> folder"
check "python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))[\"rope_scaling\"]; sys.exit(r != {\"rope_type\": \"llama3\", \"factor\": 4, \"low_freq_factor\": 1, \"high_freq_factor\": 4, \"original_max_position_embeddings\": 32})' '$T/rope/config.json'" "the written config.json lost rope_scaling: $(grep -A6 rope_scaling "$T/rope/config.json")"
out=$("$MOH" convert --model "$T/rope" --out "$T/rope.gguf" 2>&1); rc=$?
check "[ $rc -eq 1 ] && [ \$(wc -l <<<\"\$out\") -eq 1 ] && grep -q 'rope_scaling is \"llama3\"' <<<\"\$out\" && [ ! -e '$T/rope.gguf' ]" "rope_scaling export to GGUF: rc $rc: $out"
mkdir -p "$T/yarn"
cp "$ROPE/model.safetensors" "$T/yarn/"
sed 's/"llama3"/"yarn"/' "$ROPE/config.json" > "$T/yarn/config.json"
out=$("$MOH" convert --model "$T/yarn" --out "$T/yarn2" 2>&1); rc=$?
check "[ $rc -eq 1 ] && [ \$(wc -l <<<\"\$out\") -eq 1 ] && grep -q \"config.json: field 'rope_scaling.rope_type': expected \\\"default\\\", \\\"linear\\\" or \\\"llama3\\\".*got \\\"yarn\\\"\" <<<\"\$out\"" "yarn rope_scaling: rc $rc: $out"

# A BPE model's folder keeps its tokenizer: convert writes tokenizer.json + tokenizer_config.json,
# the folder tokenizes and chats as the .gguf does (the template's default system prompt kept)
"$MOH" convert --model "$CHAT" --out "$T/chatdir" > /dev/null || bad "tiny-chat gguf -> folder"
check "[ -s '$T/chatdir/tokenizer.json' ] && grep -q '\"eos_token\":.*<|im_end|>' '$T/chatdir/tokenizer_config.json' && grep -q 'You are a tiny test model' '$T/chatdir/tokenizer_config.json'" "convert: no tokenizer.json / tokenizer_config.json with eos and template"
STRESS=$(cd "$(dirname "$0")" && pwd)/fixtures/bpe/case_stress.txt
check "[ \"\$('$MOH' tokenize --model '$T/chatdir' --file '$STRESS')\" = \"\$('$MOH' tokenize --model '$CHAT' --file '$STRESS')\" ]" "tokenize: the folder's tokenizer gives other ids than the gguf's"
printf 'hi there\nhello again\n/reset\nbye\n' | "$MOH" chat --model "$T/chatdir" --max-tokens 5 --seed 3 > "$T/c4.out" 2>/dev/null
check "cmp -s '$T/c1.out' '$T/c4.out'" "chat on the converted folder differs from the gguf"
# continue-tuning: moh train --init on the .gguf runs, saves the tokenizer, resumes to the same
# weights as an uninterrupted run, and its checkpoint reloads with the same tokenizer; the final
# validation equals moh eval --split val on the saved model; --init excludes --config and --resume
for i in $(seq 40); do printf 'In the beginning %d God created ½ café 😀 the heaven and the earth.\n' "$i"; done > "$T/ft.txt"
TR="--data $T/ft.txt --steps 4 --batch-size 2 --seq-len 16 --lr 1e-3 --eval-every 2 --quiet"
"$MOH" train --init "$CHAT" $TR --out "$T/ft" --stop-at-step 2 || bad "train --init (stopped at 2)"
check "[ -s '$T/ft/tokenizer.json' ] && [ -s '$T/ft/optimizer.safetensors' ]" "train --init: checkpoint without tokenizer.json"
"$MOH" train --resume --out "$T/ft" $TR || bad "train --resume of an --init run"
"$MOH" train --init "$CHAT" $TR --out "$T/ft2" || bad "train --init (uninterrupted)"
check "cmp -s '$T/ft/model.safetensors' '$T/ft2/model.safetensors'" "train --init: resume gave other weights than the uninterrupted run"
check "! cmp -s '$T/ft2/model.safetensors' '$T/chatdir/model.safetensors'" "train --init: the weights did not change"
check "[ \"\$('$MOH' tokenize --model '$T/ft2' --file '$STRESS')\" = \"\$('$MOH' tokenize --model '$CHAT' --file '$STRESS')\" ]" "the tuned checkpoint's tokenizer gives other ids"
"$MOH" eval --checkpoint "$T/ft2" --data "$T/ft.txt" --split val --seq-len 16 --json > "$T/ft.json" || bad "eval --split val of the tuned model"
check "python3 - '$T/ft.json' '$T/ft2/metrics.jsonl' <<'PY'
import json, sys
e = json.load(open(sys.argv[1])); last = [json.loads(l) for l in open(sys.argv[2])][-1]
assert e['vocab'] == 'bpe' and e['split'] == 'val' and e['bytes'] > 2 * e['tokens'], e
assert e['tokens'] == last['val_tokens'] and e['bytes'] == last['val_bytes'], (e, last)
assert abs(e['bits_per_byte'] - last['val_bpb']) < 1e-5, (e['bits_per_byte'], last['val_bpb'])
assert len(e['layer_head_share']) == len(e['head_share']) == 1
PY" "eval --split val differs from the trainer's final validation: $(cat "$T/ft.json")"
# without its tokenizer.json the BPE checkpoint is not a byte model: resume refuses it in one line
cp -r "$T/ft" "$T/ftnotok" && rm "$T/ftnotok/tokenizer.json"
out=$("$MOH" train --resume --out "$T/ftnotok" $TR --steps 6 2>&1); rc=$?
check "[ $rc -eq 1 ] && [ \$(wc -l <<<\"\$out\") -eq 1 ] && grep -q 'ftnotok/tokenizer.json is missing: .*ftnotok/checkpoint.json lists it' <<<\"\$out\"" "train --resume without tokenizer.json: rc $rc: $out"
# a byte model saved into a folder that held a BPE model's tokenizer files: they go
mkdir -p "$T/stale" && cp "$T/ft/tokenizer.json" "$T/ft/tokenizer_config.json" "$T/stale/"
"$MOH" convert --model "$T/dense" --out "$T/stale" > /dev/null 2>&1 || bad "convert a byte model into a folder with tokenizer files"
check "[ ! -e '$T/stale/tokenizer.json' ] && [ ! -e '$T/stale/tokenizer_config.json' ] && [ \"\$('$MOH' tokenize --model '$T/stale' --text 'ab')\" = '97 98' ]" "stale tokenizer files kept in a byte model's checkpoint"
out=$("$MOH" train --init "$CHAT" --config "$T/d.json" $TR --out "$T/ft3" 2>&1); rc=$?
check "[ $rc -eq 2 ] && grep -q 'it excludes --config' <<<\"\$out\" && [ ! -e '$T/ft3' ]" "train --init --config: rc $rc: $out"
out=$("$MOH" train --init "$CHAT" --resume $TR --out "$T/ft" 2>&1); rc=$?
check "[ $rc -eq 2 ] && grep -q 'excludes --resume' <<<\"\$out\"" "train --init --resume: rc $rc: $out"
out=$("$MOH" train --init "$CHAT" $TR --out "$T/ft4" --seq-len 65 2>&1); rc=$?
check "[ $rc -eq 1 ] && grep -q 'more than the context' <<<\"\$out\"" "train --init past the context: rc $rc: $out"
# GGUF -> GGUF of a BPE model: the tokenizer goes along (tokens, merges, types, pre-tokenizer, special
# ids, chat template), so the exported file tokenizes, computes and chats as the original does
"$MOH" convert --model "$CHAT" --out "$T/chat2.gguf" > /dev/null || bad "bpe gguf -> gguf"
for text in '<|im_start|>user hi there 123<|im_end|>' 'hello again, the world' ''; do
  check "[ \"\$('$MOH' tokenize --model '$T/chat2.gguf' --text '$text' --json)\" = \"\$('$MOH' tokenize --model '$CHAT' --text '$text' --json)\" ]" "exported bpe gguf tokenizes '$text' otherwise"
done
"$MOH" sample --checkpoint "$CHAT" --prompt '<|im_start|>user hi there<|im_end|>' --max-tokens 0 --dump-logits "$T/l1.st" > /dev/null 2>&1 || bad "sample --dump-logits"
"$MOH" sample --checkpoint "$T/chat2.gguf" --prompt '<|im_start|>user hi there<|im_end|>' --max-tokens 0 --dump-logits "$T/l2.st" > /dev/null 2>&1 || bad "sample --dump-logits on the export"
check "[ -s '$T/l1.st' ] && cmp -s '$T/l1.st' '$T/l2.st'" "exported bpe gguf: other tokens or logits"
cat > "$T/kvs.py" <<'PY'
import struct, sys
def kvs(p):  # the metadata of a GGUF v3 file (gguf.h layout), values as Python objects
    f = open(p, 'rb'); assert f.read(4) == b'GGUF'; f.read(4)
    _, nkv = struct.unpack('<QQ', f.read(16))
    S = {0: 'B', 1: 'b', 2: 'H', 3: 'h', 4: 'I', 5: 'i', 6: 'f', 7: '?', 10: 'Q', 11: 'q', 12: 'd'}
    def s(): return f.read(struct.unpack('<Q', f.read(8))[0]).decode()
    def val(t):
        if t == 8: return s()
        if t == 9:
            et, n = struct.unpack('<IQ', f.read(12)); return [val(et) for _ in range(n)]
        c = S[t]; return struct.unpack('<' + c, f.read(struct.calcsize(c)))[0]
    out = {}
    for _ in range(nkv):
        k = s(); out[k] = (struct.unpack('<I', f.read(4))[0], None); out[k] = (out[k][0], val(out[k][0]))
    return out
# argv: original, export[, KEY=JSON ...]: the export's tokenizer.* keys (types and values) are the
# original's plus the given ones
a, b = kvs(sys.argv[1]), kvs(sys.argv[2])
ta = {k: v for k, v in a.items() if k.startswith('tokenizer.')}
tb = {k: v for k, v in b.items() if k.startswith('tokenizer.')}
import json
for kv in sys.argv[3:]:
    k, v = kv.split('=', 1); ta[k] = (7 if isinstance(json.loads(v), bool) else 4, json.loads(v))
assert ta == tb, sorted(k for k in set(ta) | set(tb) if ta.get(k) != tb.get(k))
PY
check "python3 '$T/kvs.py' '$CHAT' '$T/chat2.gguf'" "exported bpe gguf: tokenizer metadata differs from the original's"
printf 'hi there\nhello again\n' | "$MOH" chat --model "$T/chat2.gguf" --max-tokens 5 --seed 3 > "$T/c4.out" 2>/dev/null
printf 'hi there\nhello again\n' | "$MOH" chat --model "$CHAT" --max-tokens 5 --seed 3 > "$T/c5.out" 2>/dev/null
check "[ -s '$T/c4.out' ] && cmp -s '$T/c4.out' '$T/c5.out'" "exported bpe gguf chats otherwise"
# tokenize --json: valid JSON whose pieces are the vocabulary's byte-level spelling (HF's
# convert_ids_to_tokens; a byte model's bytes spelled the same way): undone, they give the text
for m in "$CHAT" "$T/chatdir" "$T/dense"; do
  check "'$MOH' tokenize --model '$m' --text 'héllo 😀 <|im_end|> ok' --json | python3 -c '
import json, sys
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256)); cs = bs[:]; n = 0
for b in range(256):
    if b not in bs: bs.append(b); cs.append(256 + n); n += 1
dec = {chr(c): b for b, c in zip(bs, cs)}
j = json.load(sys.stdin); p = j[\"pieces\"]; assert len(p) == len(j[\"ids\"]) and any(len(x) > 1 for x in p[:-1]) or \"dense\" in sys.argv[1], p
out = b\"\".join(x.encode() if x == \"<|im_end|>\" else bytes(dec[c] for c in x) for x in p)
assert out == \"héllo 😀 <|im_end|> ok\".encode(), (out, p)
' '$m'" "tokenize --json on $m: invalid JSON or pieces"
done
# --save-tokenizer never writes over a tokenizer.json
out=$("$MOH" tokenize --model "$CHAT" --save-tokenizer "$T/chatdir" 2>&1); rc=$?
check "[ $rc -eq 1 ] && [ \$(wc -l <<<\"\$out\") -eq 1 ] && grep -q 'chatdir holds a model (.*model.safetensors): a tokenizer written there would change how it reads text' <<<\"\$out\"" "save-tokenizer into a model's folder: rc $rc: $out"
mkdir -p "$T/tokonly" && cp "$T/chatdir/tokenizer.json" "$T/tokonly/"
out=$("$MOH" tokenize --model "$CHAT" --save-tokenizer "$T/tokonly" 2>&1); rc=$?
check "[ $rc -eq 1 ] && [ \$(wc -l <<<\"\$out\") -eq 1 ] && grep -q 'tokonly already holds a tokenizer (tokenizer.json)' <<<\"\$out\"" "save-tokenizer over a tokenizer.json: rc $rc: $out"
# GGUF -> folder -> GGUF: the folder's tokenizer.json (Digits + ByteLevel) is llama.cpp's "smollm",
# eos and chat template come from its tokenizer_config.json; the same ids, logits, chat and
# tokenizer metadata (add_bos_token / add_eos_token false added: the folder's post_processor adds neither)
"$MOH" convert --model "$T/chatdir" --out "$T/chat3.gguf" > /dev/null 2> "$T/c3.err" || bad "bpe folder -> gguf: $(cat "$T/c3.err")"
for text in '<|im_start|>user hi there 123<|im_end|>' 'héllo 😀 again, the world'; do
  check "[ \"\$('$MOH' tokenize --model '$T/chat3.gguf' --text '$text' --json)\" = \"\$('$MOH' tokenize --model '$CHAT' --text '$text' --json)\" ]" "folder -> gguf tokenizes '$text' otherwise"
done
"$MOH" sample --checkpoint "$T/chat3.gguf" --prompt '<|im_start|>user hi there<|im_end|>' --max-tokens 0 --dump-logits "$T/l3.st" > /dev/null 2>&1 || bad "sample --dump-logits on the folder export"
check "cmp -s '$T/l1.st' '$T/l3.st'" "folder -> gguf: other tokens or logits"
check "python3 '$T/kvs.py' '$CHAT' '$T/chat3.gguf' tokenizer.ggml.add_bos_token=false tokenizer.ggml.add_eos_token=false" "folder -> gguf: tokenizer metadata differs from the original's"
printf 'hi there\nhello again\n' | "$MOH" chat --model "$T/chat3.gguf" --max-tokens 5 --seed 3 > "$T/c6.out" 2>/dev/null
check "[ -s '$T/c6.out' ] && cmp -s '$T/c6.out' '$T/c5.out'" "folder -> gguf chats otherwise"
# a pre_tokenizer that is no named one (a Split regex of its own) is refused, naming the file
cp -r "$T/chatdir" "$T/customdir"
python3 - "$T/customdir/tokenizer.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
j['pre_tokenizer'] = {'type': 'Sequence', 'pretokenizers': [
    {'type': 'Split', 'pattern': {'Regex': '\\s+'}, 'behavior': 'Isolated', 'invert': False},
    {'type': 'ByteLevel', 'add_prefix_space': False, 'trim_offsets': True, 'use_regex': False}]}
json.dump(j, open(sys.argv[1], 'w'))
PY
rm "$T/customdir/checkpoint.json" # (edited by hand: the folder taken as it is)
out=$("$MOH" convert --model "$T/customdir" --out "$T/custom.gguf" 2>&1); rc=$?
check "[ $rc -eq 1 ] && [ \$(wc -l <<<\"\$out\") -eq 1 ] && grep -q 'customdir/tokenizer.json: the pre_tokenizer is a regex list of its own' <<<\"\$out\" && [ ! -e '$T/custom.gguf' ]" "custom pre-tokenizer export: rc $rc: $out"
# moh bench decode --model: two loaded models interleaved, prompts cut to the context, JSON rows
"$MOH" bench decode --model "$CHAT" --model "$T/chat2.gguf" --context 16,100 --tokens 4 --repeats 2 --threads 1 \
  --json > "$T/bd.json" 2> "$T/bd.err"; rc=$?
check "[ $rc -eq 0 ] && grep -q 'context 100 + 4 new tokens passes max_position_embeddings 64: prompt of 60 tokens' '$T/bd.err' && python3 - '$T/bd.json' <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert [(x['context'], x['prompt']) for x in r] == [(16, 16), (16, 16), (100, 60), (100, 60)], r
assert all(x['prefill_tokens_per_s'] > 0 and x['decode_tokens_per_s'] > 0 and x['heads_active'] == 1.0 and
           x['threads'] == 1 and x['new_tokens'] == 4 for x in r), r
assert r[0]['prefill_ratio'] == 1.0 and r[0]['decode_ratio'] == 1.0, r
for k in ('prefill', 'decode'):  # each ratio is the model's tokens/s over the first model's
    assert abs(r[1][k + '_ratio'] - r[1][k + '_tokens_per_s'] / r[0][k + '_tokens_per_s']) < 2e-3 * r[1][k + '_ratio'], r
assert r[0]['prompt_hash'] == r[1]['prompt_hash'] != r[2]['prompt_hash'] == r[3]['prompt_hash'], r
PY" "bench decode --model: rc $rc: $(cat "$T/bd.err")"
"$MOH" bench decode --model "$CHAT" --context 8 --tokens 2 --repeats 1 --text "$T/t.txt" --profile > "$T/bd.txt" 2>/dev/null
check "grep -q 'tokens of $T/t.txt, repeated' '$T/bd.txt' && grep -q '^  lm_head' '$T/bd.txt'" "bench decode --text --profile: $(cat "$T/bd.txt")"
# synthetic models: CPU time per token and, with --profile, phase times that account for the step
"$MOH" bench decode --model small --context 40 --tokens 4 --repeats 1 --threads 1 --profile --json > "$T/bds.json" 2>/dev/null; rc=$?
check "[ $rc -eq 0 ] && python3 - '$T/bds.json' <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert [x['top_k'] for x in r] == [0, 4, 2], r
for x in r:
    ph = x['phases_ms_per_token']
    assert set(ph) == {'qkv', 'attention', 'wo', 'mlp', 'lm_head', 'other'} and min(ph.values()) > 0, x
    assert x['cpu_ms_per_token'] > 0 and 0.5 * x['ms_per_token'] < sum(ph.values()) < 1.5 * x['ms_per_token'], x
PY" "bench decode --model small --profile --json: rc $rc: $(cat "$T/bds.json")"

finish
