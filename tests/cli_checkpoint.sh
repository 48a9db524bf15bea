#!/usr/bin/env bash
# Issue 32: nothing lost, nothing silently accepted, end to end.
#  1. no output may overwrite an input: sample --out / --out-idx / --dump-logits, eval
#     --dump-logits, train --dump-grads, tokenize --save-tokenizer onto a checkpoint's files
#     (directly or through a link) are refused, the checkpoint unchanged
#  2. --save-every and --precision are saved and restored by a resume with no flags
#  3. a resume is tied to its data (CRC-32; a resume without --data takes the recorded path)
#  4. a foreign optimizer.safetensors (or model.safetensors) is refused, nothing changed
#  5. checkpoint.json makes a save one unit: kill -9 loops during saves (LM, ViT, DiT, MPI) never
#     leave files that disagree (checked on disk before any moh command runs, then through moh)
#  6. moh chat renders the chat template (a Jinja-built system prompt, escaped literals) and
#     refuses a template that is not ChatML
#  7. mismatches read silently before: a tied model's lm_head.weight that differs from its
#     embeddings, an F16 export that would overflow to inf
#   tests/cli_checkpoint.sh path/to/moh
set -uo pipefail
. "$(dirname "$0")/lib.sh"
cleanup() { pkill -9 -f -- "--out $T/" 2>/dev/null; true; }

verses 1500 > "$T/corpus.txt"
cat > "$T/tiny.json" <<J
{"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
 "vocab_size": 256, "max_position_embeddings": 32, "rms_norm_eps": 1e-5, "rope_theta": 10000,
 "router": "learned", "shared_heads": 1, "top_k": 2, "load_balance_coef": 0.01}
J
common=(--config "$T/tiny.json" --data "$T/corpus.txt" --batch-size 4 --seq-len 32 --eval-every 8 --eval-tokens 2000 --quiet)
"$MOH" train "${common[@]}" --steps 16 --seed 3 --out "$T/a" || fail "train exited $?"
"$MOH" train "${common[@]}" --steps 8 --seed 4 --out "$T/b" || fail "second train exited $?"
sums() { (cd "$1" && md5sum -- *); }
expect() { local msg=$1; shift; if one_line_error "$@"; then ok; else bad "$msg: $why"; fi; }

# checkpoint.json's invariant straight on disk: every file it lists is there with its size and
# CRC-32, under its name or staged (NAME.next.PID, a save cut after its commit); "settled": under its
# name, and model.safetensors, optimizer.safetensors and the manifest name the same step
cat > "$T/invariant.py" <<'PY'
import json, os, re, struct, sys, zlib
d, mode = sys.argv[1], sys.argv[2]
m = json.load(open(os.path.join(d, 'checkpoint.json')))
def sum_of(p):
    c = 0
    with open(p, 'rb') as f:
        for b in iter(lambda: f.read(1 << 20), b''):
            c = zlib.crc32(b, c)
    return os.path.getsize(p), c
for name, want in m['files'].items():
    w = (want['bytes'], int(want['crc32'], 16))
    paths = [os.path.join(d, name)]
    if mode != 'settled':
        paths += [os.path.join(d, f) for f in os.listdir(d) if re.fullmatch(re.escape(name) + r'\.next\.\d+', f)]
    assert any(os.path.exists(p) and sum_of(p) == w for p in paths), '%s: no copy matches checkpoint.json' % name
if mode == 'settled':
    def step(p):
        b = open(p, 'rb').read(8 + 100000); n = struct.unpack('<Q', b[:8])[0]
        return json.loads(b[8:8 + n]).get('__metadata__', {}).get('step')
    s = str(m['step'])
    assert step(os.path.join(d, 'model.safetensors')) == s, 'model.safetensors step %s, manifest %s' % (step(os.path.join(d, 'model.safetensors')), s)
    assert step(os.path.join(d, 'optimizer.safetensors')) == s, 'optimizer.safetensors step differs from the manifest'
PY
check "python3 '$T/invariant.py' '$T/a' settled" "a finished run's checkpoint breaks the invariant"

# 1. outputs that would overwrite inputs
before=$(sums "$T/a")
for target in model.safetensors config.json optimizer.safetensors checkpoint.json; do
  expect "sample --dump-logits onto $target" 2 "would overwrite .*a/$target, an input of this command" "$MOH" sample --checkpoint "$T/a" --prompt x --max-tokens 0 --dump-logits "$T/a/$target"
done
ln -s "$T/a/model.safetensors" "$T/link.safetensors"
expect "sample --dump-logits through a link" 2 'would overwrite' "$MOH" sample --checkpoint "$T/a" --prompt x --max-tokens 0 --dump-logits "$T/link.safetensors"
expect "eval --dump-logits onto its data" 2 'would overwrite .*corpus.txt' "$MOH" eval --checkpoint "$T/a" --data "$T/corpus.txt" --dump-logits "$T/corpus.txt"
expect "eval --dump-logits empty" 2 '^moh eval: --dump-logits: an empty path' "$MOH" eval --checkpoint "$T/a" --data "$T/corpus.txt" --dump-logits ""
mkfifo "$T/fifo"
expect "eval --dump-logits onto a FIFO" 2 'is a device, FIFO or socket' "$MOH" eval --checkpoint "$T/a" --data "$T/corpus.txt" --dump-logits "$T/fifo"
check 'test -p "$T/fifo"' "the FIFO was replaced"
expect "eval --dump-logits onto a folder" 2 'names a folder' "$MOH" eval --checkpoint "$T/a" --data "$T/corpus.txt" --dump-logits "$T"
long=$(head -c 5000 /dev/zero | tr '\0' x)
sout=$("$MOH" sample --checkpoint "$T/a" --prompt "$long" --max-tokens 1 --context-full stop 2>/dev/null || true)
check '[ -z "$sout" ]' "sample printed the prompt before refusing it (--context-full stop): ${#sout} bytes on stdout"
expect "eval --dump-logits onto the model" 2 'would overwrite .*model.safetensors' "$MOH" eval --checkpoint "$T/a" --data "$T/corpus.txt" --dump-logits "$T/a/model.safetensors"
expect "train --dump-grads onto the optimizer" 2 'would overwrite .*optimizer.safetensors' "$MOH" train --resume --out "$T/a" --steps 17 --dump-grads "$T/a/optimizer.safetensors"
expect "tokenize --save-tokenizer into a checkpoint" any 'holds a model' "$MOH" tokenize --model "$(dirname "$0")/fixtures/gguf_llama/tiny-chat.gguf" --text hi --save-tokenizer "$T/a"
check '[ "$(sums "$T/a")" = "$before" ]' "a refused output changed the checkpoint"
# an output beside the checkpoint's files is fine
"$MOH" sample --checkpoint "$T/a" --prompt x --max-tokens 2 --dump-logits "$T/a/logits.safetensors" >/dev/null 2>&1
check "[ -s '$T/a/logits.safetensors' ]" "sample --dump-logits to a new file in the checkpoint folder was refused"
rm -f "$T/a/logits.safetensors"

# 2. --save-every and --precision come back with a resume that repeats no flag
"$MOH" train "${common[@]}" --steps 400 --save-every 1 --precision bf16 --stop-at-step 3 --out "$T/s" || bad "train to step 3"
"$MOH" train --resume --out "$T/s" --quiet &
pid=$!
for _ in $(seq 1 300); do [ "$(grep -c . "$T/s/metrics.jsonl" 2>/dev/null)" -ge 12 ] && break; sleep 0.05; done
{ kill -9 $pid; wait $pid; } 2>/dev/null
last=$(tail -1 "$T/s/metrics.jsonl" | python3 -c "import json,sys; print(json.loads(sys.stdin.readline())['step'])")
saved=$(python3 -c "import json; print(json.load(open('$T/s/checkpoint.json'))['step'])")
check "[ \$((last - saved)) -le 1 ] && [ $saved -ge 11 ]" "--save-every 1 not restored: metrics at step $last, checkpoint at step $saved"
meta=$(python3 -c "
import json,struct; b=open('$T/s/optimizer.safetensors','rb').read(); n=struct.unpack('<Q',b[:8])[0]
m=json.loads(b[8:8+n])['__metadata__']; print(m['save_every'], m['precision'])")
want_prec=$("$MOH" train "${common[@]}" --steps 1 --precision bf16 --out "$T/p0" 2>&1 | grep -q 'runs fp32' && echo 0 || echo 1)
check "[ '$meta' = '1 $want_prec' ]" "optimizer.safetensors records save_every/precision '$meta', want '1 $want_prec'"
# a bf16 run stopped and resumed without flags: the same losses as the uninterrupted run
"$MOH" train "${common[@]}" --steps 12 --precision bf16 --out "$T/pu" || bad "uninterrupted bf16 run"
"$MOH" train "${common[@]}" --steps 12 --precision bf16 --stop-at-step 5 --out "$T/pr" || bad "bf16 run to step 5"
"$MOH" train --resume --out "$T/pr" --quiet || bad "bf16 resume"
check "cmp -s '$T/pu/model.safetensors' '$T/pr/model.safetensors'" "a bf16 run resumed without flags is not the uninterrupted run"
out=$("$MOH" train --resume --out "$T/pr" --steps 13 --precision fp32 2>&1) || bad "resume with --precision fp32: $out"
check "grep -q 'note: --precision fp32 replaces the checkpoint.s precision' <<<\"\$out\" || [ $want_prec = 0 ]" "no note for --precision: $out"

# 3. a resume is tied to its data
sed 's/people/nations/' "$T/corpus.txt" > "$T/other.txt"
expect "resume on other data" any 'is not the data of the run in .*--init' "$MOH" train --resume --data "$T/other.txt" --out "$T/b"
cp "$T/corpus.txt" "$T/moved.txt"
out=$("$MOH" train --resume --data "$T/moved.txt" --out "$T/b" --steps 9 2>&1); rc=$?
check "[ $rc -eq 0 ]" "resume on the same data at another path: rc $rc: $out"
out=$("$MOH" train --resume --out "$T/b" --steps 10 2>&1); rc=$?
check "[ $rc -eq 0 ] && grep -q \"data: .*moved.txt (the checkpoint's)\" <<<\"\$out\"" "resume without --data: rc $rc: $out"

# 4. a foreign optimizer.safetensors or model.safetensors: refused, nothing changed
for f in optimizer.safetensors model.safetensors; do
  rm -rf "$T/r" && cp -r "$T/a" "$T/r" && cp "$T/b/$f" "$T/r/$f"
  before=$(sums "$T/r")
  expect "resume with a foreign $f" any "r/$f does not match .*checkpoint.json" "$MOH" train --resume --out "$T/r"
  check '[ "$(sums "$T/r")" = "$before" ]' "resume with a foreign $f changed the checkpoint"
done
expect "eval of a foreign model.safetensors" any 'r/model.safetensors does not match' "$MOH" eval --checkpoint "$T/r" --data "$T/corpus.txt"
rm -rf "$T/r" && cp -r "$T/a" "$T/r" && cp "$T/b/optimizer.safetensors" "$T/b/checkpoint.json" "$T/r/"
expect "another run's optimizer and manifest" any 'does not match' "$MOH" train --resume --out "$T/r"
expect "a fresh run into a checkpoint" any 'already holds a checkpoint' "$MOH" train "${common[@]}" --steps 2 --out "$T/a"

# 5. kill -9 during saves: the files never disagree
kill_loop() { # name, kills, delays-seed, moh train args... (the run saves every step)
  local name=$1 n=$2 seed=$3; shift 3
  local dir=$T/k_$name cut=0
  for i in $(seq 1 "$n"); do
    "$@" --out "$dir" --resume --quiet >/dev/null 2>&1 &
    local pid=$!
    sleep "$(python3 -c "import random; r=random.Random($seed*100+$i); print(0.25 + r.random()*0.6)")"
    { kill -9 $pid; pkill -9 -f -- "--out $dir( |$)"; wait $pid; } 2>/dev/null
    ls "$dir" | grep -Eq '\.(next|tmp)\.' && cut=$((cut + 1))
    python3 "$T/invariant.py" "$dir" raw 2>"$T/inv.err" || { bad "$name: kill $i left files that disagree: $(tail -1 "$T/inv.err")"; return; }
    "$MOH" eval --checkpoint "$dir" --data "$EVAL_DATA" --limit 50 >/dev/null 2>"$T/err" || { bad "$name: kill $i: eval: $(cat "$T/err")"; return; }
    python3 "$T/invariant.py" "$dir" settled 2>"$T/inv.err" || { bad "$name: kill $i: after eval: $(tail -1 "$T/inv.err")"; return; }
  done
  ok
  echo "kill loop $name: $n kills, $cut during a save"
}
cat > "$T/mid.json" <<J
{"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 256,
 "vocab_size": 256, "max_position_embeddings": 32, "rope_theta": 10000,
 "router": "learned", "shared_heads": 1, "top_k": 2, "load_balance_coef": 0.01}
J
"$MOH" train --config "$T/mid.json" --data "$T/corpus.txt" --batch-size 4 --seq-len 32 --steps 100000 --save-every 1 \
  --eval-every 0 --stop-at-step 1 --out "$T/k_lm" --quiet || bad "lm kill-loop start"
EVAL_DATA=$T/corpus.txt kill_loop lm 16 1 "$MOH" train

column_idx "$T/img" 512 64 7
cat > "$T/vit.json" <<'J'
{"model_type": "vit", "img_size": 8, "patch_size": 4, "num_classes": 4, "embed_dim": 96, "depth": 2,
 "num_heads": 4, "mlp_ratio": 2, "router": "learned", "shared_heads": 1, "top_k": 2}
J
cat > "$T/dit.json" <<'J'
{"model_type": "dit", "input_size": 8, "patch_size": 2, "num_classes": 4, "hidden_size": 96, "depth": 2,
 "num_heads": 4, "mlp_ratio": 2, "router": "learned", "shared_heads": 1, "top_k": 2}
J
for fam in vit dit; do
  "$MOH" train --config "$T/$fam.json" --data "$T/img" --batch-size 16 --epochs 1000 --save-every 1 --eval-every 100000 \
    --stop-at-step 1 --out "$T/k_$fam" --quiet || bad "$fam kill-loop start"
  EVAL_DATA=$T/img kill_loop $fam 8 2 "$MOH" train
done

# under mpirun (when this moh has MPI): rank 0 writes, a kill of the job leaves one save or the other
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
MPI=(mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS=1 -x ASAN_OPTIONS)
if command -v mpirun >/dev/null && OMP_NUM_THREADS=1 "${MPI[@]}" "$MOH" train --config "$T/mid.json" --data "$T/corpus.txt" \
     --batch-size 4 --shards 2 --seq-len 32 --steps 100000 --save-every 1 --eval-every 0 --stop-at-step 1 --out "$T/k_mpi" --quiet \
     >/dev/null 2>&1; then
  EVAL_DATA=$T/corpus.txt kill_loop mpi 5 3 "${MPI[@]}" "$MOH" train
else
  echo "cli_checkpoint: MPI kill loop skipped (no mpirun, or moh without MPI)"
fi

# 6. chat renders the template: a system prompt built in Jinja with escaped quotes
CHAT=$(dirname "$0")/fixtures/gguf_llama/tiny-chat.gguf
"$MOH" convert --model "$CHAT" --out "$T/chat" >/dev/null 2>&1 || bad "convert the chat fixture"
rm -f "$T/chat/checkpoint.json" # (the template is edited below, as a user would)
set_template() {
  python3 - "$T/chat/tokenizer_config.json" "$1" <<'PY'
import json, sys
p = sys.argv[1]; c = json.load(open(p)); c['chat_template'] = sys.argv[2]; json.dump(c, open(p, 'w'))
PY
}
set_template "{%- set greeting = \"You are \" ~ 'a \\\"tiny\\\" model' -%}{%- if messages[0].role != 'system' %}{{ '<|im_start|>system\\n' + greeting + '<|im_end|>\\n' }}{%- endif %}{%- for m in messages %}{{ '<|im_start|>' ~ m.role ~ '\\n' ~ m.content ~ '<|im_end|>\\n' }}{%- endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
printf '<|im_start|>system\nYou are a "tiny" model<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n' > "$T/turn.txt"
want=$("$MOH" tokenize --model "$T/chat" --file "$T/turn.txt" --json | python3 -c "import json,sys; print(len(json.load(sys.stdin)['ids']))")
out=$(echo hi | "$MOH" chat --model "$T/chat" --max-tokens 2 2>&1 >/dev/null); rc=$?
check "[ $rc -eq 0 ] && grep -q \"prompt $want tokens\" <<<\"\$out\"" "chat with a Jinja-built system prompt: rc $rc, want $want prompt tokens: $out"
set_template "{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}{% endfor %}"
expect "a non-ChatML template" 1 'not as ChatML' sh -c "echo hi | '$MOH' chat --model '$T/chat' --max-tokens 2"
set_template "{{ messages | tojson }}"
expect "a template moh cannot render" 1 "filter 'tojson' on a list is not rendered by moh" sh -c "echo hi | '$MOH' chat --model '$T/chat' --max-tokens 2"
# 7. tie_word_embeddings with an lm_head.weight: the same values load, others are refused
sed 's/"load_balance_coef": 0.01}/"load_balance_coef": 0.01, "tie_word_embeddings": true}/' "$T/tiny.json" > "$T/tied.json"
"$MOH" train --config "$T/tied.json" --data "$T/corpus.txt" --batch-size 4 --seq-len 32 --steps 2 --out "$T/tied" --quiet || bad "tied run"
rm -f "$T/tied/checkpoint.json" # (edited by hand below)
head_as() { # DIR how: a copy of the tied model with lm_head.weight = the embeddings (same) or changed (other)
  python3 - "$T/tied/model.safetensors" "$1/model.safetensors" "$2" <<'PY'
import json, struct, sys
b = open(sys.argv[1], 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n]); d = bytearray(b[8 + n:])
e = h['model.embed_tokens.weight']; s0, e0 = e['data_offsets']; extra = bytearray(d[s0:e0])
if sys.argv[3] == 'other': extra[0:4] = struct.pack('<f', 0.125)
h['lm_head.weight'] = {'dtype': 'F32', 'shape': e['shape'], 'data_offsets': [len(d), len(d) + len(extra)]}
hb = json.dumps(h).encode(); hb += b' ' * (-len(hb) % 8)
open(sys.argv[2], 'wb').write(struct.pack('<Q', len(hb)) + hb + d + extra)
PY
}
for how in same other; do rm -rf "$T/t_$how" && cp -r "$T/tied" "$T/t_$how" && head_as "$T/t_$how" $how; done
out=$("$MOH" eval --checkpoint "$T/t_same" --data "$T/corpus.txt" --limit 100 2>&1); rc=$?
check "[ $rc -eq 0 ]" "a tied model with an equal lm_head.weight: rc $rc: $out"
expect "a tied model with another lm_head.weight" any "t_other/model.safetensors: tensor 'lm_head.weight' differs from 'model.embed_tokens.weight', but config.json ties them" \
  "$MOH" eval --checkpoint "$T/t_other" --data "$T/corpus.txt" --limit 100
# an F16 export of a weight past float16's range is refused, nothing written
sed 's/"router": "learned", "shared_heads": 1, "top_k": 2, //' "$T/tiny.json" > "$T/dense.json"
"$MOH" train --config "$T/dense.json" --data "$T/corpus.txt" --batch-size 4 --seq-len 32 --steps 2 --out "$T/big" --quiet || bad "dense run"
rm -f "$T/big/checkpoint.json" "$T/big/optimizer.safetensors" # (edited by hand below)
python3 - "$T/big/model.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])
s0 = h['model.layers.0.mlp.up_proj.weight']['data_offsets'][0]; struct.pack_into('<f', b, 8 + n + s0 + 4, 1e5)
open(p, 'wb').write(b)
PY
expect "an F16 export that overflows" any "tensor 'blk.0.ffn_up.weight' holds 100000 at element 1, beyond float16's range" \
  "$MOH" convert --model "$T/big" --out "$T/big.gguf" --outtype f16
check "[ ! -e '$T/big.gguf' ]" "a refused F16 export left a file"
"$MOH" convert --model "$T/big" --out "$T/big32.gguf" >/dev/null 2>&1 || bad "the F32 export of the same model failed"
finish
