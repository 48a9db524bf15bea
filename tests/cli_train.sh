#!/usr/bin/env bash
# The one trainer, for every model family (LM and ViT alike):
#  1. gradient accumulation 2 x batch 8 gives the gradient of batch 16 in 2 shards (each shard, like
#     each micro-batch, has its own load-balance statistics) to <= 1e-6 relative, and with
#     load_balance_coef 0 the gradient of batch 16 in one shard;
#  2. a resume that repeats no flag reproduces the uninterrupted run bitwise (weights and losses),
#     with AdamW and with --optimizer muon;
#  3. a resume with a changed --lr prints a note and trains at the new lr from the next step; a
#     changed --batch-size is refused and leaves the checkpoint untouched;
#  4. an injected NaN gradient is skipped (weights unchanged, counted in metrics.jsonl) and never
#     reaches a checkpoint; 3 in a row stop the run with the last good checkpoint intact;
#  5. checkpoints of moh 0.1 (tests/fixtures/ckpt_v1) still resume, to the same losses.
#   tests/cli_train.sh path/to/moh
set -uo pipefail
. "$(dirname "$0")/lib.sh"
FIX=$(cd "$(dirname "$0")" && pwd)/fixtures/ckpt_v1
export OMP_NUM_THREADS=2

# data: the corpus of the v1 fixture, and the v1 fixture's tiny IDX set (4 classes of 8x8 images)
verses 400 > "$T/corpus.txt"
IDX=$FIX/vit_data
cat > "$T/lm.json" <<'J'
{"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 32,
 "vocab_size": 256, "max_position_embeddings": 16, "rms_norm_eps": 1e-5, "rope_theta": 10000,
 "router": "learned", "shared_heads": 1, "top_k": 2, "load_balance_coef": 0.01}
J
sed 's/"load_balance_coef": 0.01/"load_balance_coef": 0/' "$T/lm.json" > "$T/lm0.json"
cat > "$T/vit.json" <<'J'
{"model_type": "vit", "img_size": 8, "patch_size": 4, "num_classes": 4, "embed_dim": 16, "depth": 2,
 "num_heads": 4, "mlp_ratio": 2, "router": "learned", "shared_heads": 1, "top_k": 2}
J
sed 's/"top_k": 2}/"top_k": 2, "load_balance_coef": 0}/' "$T/vit.json" > "$T/vit0.json"
lm=(--data "$T/corpus.txt" --seq-len 16 --eval-every 4 --eval-tokens 300 --seed 3 --quiet)
vit=(--data "$IDX" --eval-every 4 --eval-limit 16 --seed 3 --quiet)

# relative difference of two gradient dumps (grad.* tensors): max |a - b| / max |b| over all values
graddiff() {
  python3 - "$1" "$2" <<'EOF'
import array, json, struct, sys
def read(p):
    f = open(p, 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n)); d = f.read()
    out = {}
    for k, v in h.items():
        if k.startswith('grad.'):
            a = array.array('f'); a.frombytes(d[v['data_offsets'][0]:v['data_offsets'][1]]); out[k] = a
    return out
a, b = read(sys.argv[1]), read(sys.argv[2])
assert a.keys() == b.keys() and a, 'tensor names differ'
num = max(abs(x - y) for k in a for x, y in zip(a[k], b[k]))
den = max(abs(y) for k in b for y in b[k])
print('%.3g' % (num / den))
EOF
}

# 1. accumulation == shards (and == one batch without the load-balance term)
for fam in lm vit; do
  if [ $fam = lm ]; then base=("${lm[@]}"); cfg=$T/lm.json; cfg0=$T/lm0.json; else base=("${vit[@]}"); cfg=$T/vit.json; cfg0=$T/vit0.json; fi
  extra=(); [ $fam = vit ] && extra=(--no-augment)
  "$MOH" train --config "$cfg" "${base[@]}" "${extra[@]}" --out "$T/$fam-acc" --steps 1 --batch-size 8 --grad-accum 2 --shards 1 --dump-grads "$T/$fam-acc.st" || bad "$fam accum run"
  "$MOH" train --config "$cfg" "${base[@]}" "${extra[@]}" --out "$T/$fam-sh" --steps 1 --batch-size 16 --shards 2 --dump-grads "$T/$fam-sh.st" || bad "$fam shards run"
  d=$(graddiff "$T/$fam-acc.st" "$T/$fam-sh.st"); echo "  $fam accum vs shards: $d"
  check "python3 -c 'assert $d <= 1e-6'" "$fam: accum 2 x 8 vs batch 16 in 2 shards: relative gradient difference $d"
  "$MOH" train --config "$cfg0" "${base[@]}" "${extra[@]}" --out "$T/$fam-acc0" --steps 1 --batch-size 8 --grad-accum 2 --shards 1 --dump-grads "$T/$fam-acc0.st" || bad "$fam accum run, beta 0"
  "$MOH" train --config "$cfg0" "${base[@]}" "${extra[@]}" --out "$T/$fam-one0" --steps 1 --batch-size 16 --shards 1 --dump-grads "$T/$fam-one0.st" || bad "$fam one-batch run, beta 0"
  d=$(graddiff "$T/$fam-acc0.st" "$T/$fam-one0.st"); echo "  $fam beta 0 accum vs one batch: $d"
  check "python3 -c 'assert $d <= 1e-6'" "$fam: beta 0: accum 2 x 8 vs batch 16: relative gradient difference $d"
  # the premise: with the load-balance term the two differ (per-shard statistics are not global)
  "$MOH" train --config "$cfg" "${base[@]}" "${extra[@]}" --out "$T/$fam-one" --steps 1 --batch-size 16 --shards 1 --dump-grads "$T/$fam-one.st" || bad "$fam one-batch run"
  d=$(graddiff "$T/$fam-acc.st" "$T/$fam-one.st"); echo "  $fam accum vs one batch (premise, differ): $d"
  check "python3 -c 'assert $d > 1e-5'" "$fam: premise: accum with the load-balance term should differ from one batch ($d)"
done

losses() { grep -o '"loss": [0-9.e+-]*' "$1" | tr '\n' ' '; }
field_at() { sed -n "${2}p" "$1" | grep -o "\"$3\": [0-9.e+-]*" | cut -d' ' -f2; }

# 2. resume repeating no flag == uninterrupted, bitwise; 3. a changed --lr / --batch-size
for fam in lm vit; do
  if [ $fam = lm ]; then run=(--config "$T/lm.json" "${lm[@]}" --batch-size 4 --grad-accum 2 --lr 3e-3 --warmup 2);
  else run=(--config "$T/vit.json" "${vit[@]}" --batch-size 16 --grad-accum 2 --shards 2 --lr 3e-3 --warmup 2 --crop-pad 2); fi
  data=$([ $fam = lm ] && echo "$T/corpus.txt" || echo "$IDX")
  "$MOH" train "${run[@]}" --out "$T/$fam-full" --steps 12 || bad "$fam full run"
  "$MOH" train "${run[@]}" --out "$T/$fam-half" --steps 12 --stop-at-step 5 || bad "$fam first half"
  "$MOH" train --resume --data "$data" --out "$T/$fam-half" --quiet || bad "$fam resume"
  check "cmp -s '$T/$fam-full/model.safetensors' '$T/$fam-half/model.safetensors'" "$fam: resumed weights differ from the uninterrupted run"
  check "[ \"\$(losses '$T/$fam-full/metrics.jsonl')\" = \"\$(losses '$T/$fam-half/metrics.jsonl')\" ]" "$fam: resumed losses differ"
  # a changed --lr: a note, then the schedule's peak is the new lr from step 6 on
  "$MOH" train "${run[@]}" --out "$T/$fam-lr" --steps 12 --stop-at-step 5 || bad "$fam lr first half"
  out=$("$MOH" train --resume --data "$data" --out "$T/$fam-lr" --lr 1e-3 --stop-at-step 6 2>&1) || bad "$fam lr resume exited"
  check "grep -q 'note: --lr 0.001 replaces the checkpoint.s lr 0.003 from step 6 on' <<<\"\$out\"" "$fam: no --lr note: $out"
  want=$(python3 -c 'import math; s, w, T = 5, 2, 12; p = (s - w) / (T - w); print("%.6g" % (1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))))' 2>/dev/null)
  got=$(field_at "$T/$fam-lr/metrics.jsonl" 6 lr)
  full=$(field_at "$T/$fam-full/metrics.jsonl" 6 lr)
  check "python3 -c 'assert abs($got / $full - 1 / 3) < 1e-4, ($got, $full)'" "$fam: lr at step 6 after --lr 1e-3 is $got, expected a third of the original $full"
  # the new lr is saved: a further resume without --lr keeps it
  "$MOH" train --resume --data "$data" --out "$T/$fam-lr" --stop-at-step 7 --quiet || bad "$fam resume after lr change"
  got7=$(field_at "$T/$fam-lr/metrics.jsonl" 7 lr); full7=$(field_at "$T/$fam-full/metrics.jsonl" 7 lr)
  check "python3 -c 'assert abs($got7 / $full7 - 1 / 3) < 1e-4, ($got7, $full7)'" "$fam: the changed lr was not kept on the next resume ($got7 vs $full7)"
  # a changed --batch-size is refused, and nothing changes
  before=$(md5sum < "$T/$fam-lr/optimizer.safetensors")
  out=$("$MOH" train --resume --data "$data" --out "$T/$fam-lr" --batch-size 3 2>&1); rc=$?
  check "[ $rc -eq 1 ] && grep -q -- '--batch-size 3 contradicts the checkpoint in .* (batch_size' <<<\"\$out\"" "$fam: changed --batch-size on resume: rc $rc: $out"
  check "[ \"$before\" = \"\$(md5sum < '$T/$fam-lr/optimizer.safetensors')\" ]" "$fam: a refused resume changed the checkpoint"
done

# 2b. --optimizer muon (Muon on the hidden matrices, AdamW on the rest): trains (losses differ from
# AdamW's and fall), resumes bitwise (the momentum is in optimizer.safetensors), refuses a switch on
# resume and an unknown optimizer with one line
for fam in lm vit; do
  if [ $fam = lm ]; then run=(--config "$T/lm.json" "${lm[@]}" --batch-size 4 --lr 3e-3 --warmup 2);
  else run=(--config "$T/vit.json" "${vit[@]}" --batch-size 16 --shards 2 --lr 3e-3 --warmup 2); fi
  data=$([ $fam = lm ] && echo "$T/corpus.txt" || echo "$IDX")
  "$MOH" train "${run[@]}" --out "$T/$fam-mu-full" --steps 12 --optimizer muon || bad "$fam muon run"
  "$MOH" train "${run[@]}" --out "$T/$fam-mu-adamw" --steps 12 || bad "$fam adamw twin"
  check "[ \"\$(losses '$T/$fam-mu-full/metrics.jsonl')\" != \"\$(losses '$T/$fam-mu-adamw/metrics.jsonl')\" ]" "$fam: --optimizer muon gave AdamW's losses"
  first=$(field_at "$T/$fam-mu-full/metrics.jsonl" 1 loss); last=$(field_at "$T/$fam-mu-full/metrics.jsonl" 12 loss)
  check "python3 -c 'assert $last < $first, ($first, $last)'" "$fam: muon loss did not fall ($first -> $last)"
  "$MOH" train "${run[@]}" --out "$T/$fam-mu-half" --steps 12 --optimizer muon --stop-at-step 5 || bad "$fam muon first half"
  "$MOH" train --resume --data "$data" --out "$T/$fam-mu-half" --quiet || bad "$fam muon resume"
  check "cmp -s '$T/$fam-mu-full/model.safetensors' '$T/$fam-mu-half/model.safetensors'" "$fam: resumed muon weights differ from the uninterrupted run"
  before=$(md5sum < "$T/$fam-mu-half/optimizer.safetensors")
  out=$("$MOH" train --resume --data "$data" --out "$T/$fam-mu-half" --optimizer adamw --steps 14 2>&1); rc=$?
  check "[ $rc -eq 1 ] && grep -q -- '--optimizer adamw contradicts the checkpoint in .* (optimizer muon)' <<<\"\$out\"" "$fam: optimizer switch on resume: rc $rc: $out"
  check "[ \"$before\" = \"\$(md5sum < '$T/$fam-mu-half/optimizer.safetensors')\" ]" "$fam: a refused optimizer switch changed the checkpoint"
done
# a checkpoint from before Muon (no optimizer / muon_lr keys) resumes as AdamW, bitwise, and refuses
# a switch to Muon
"$MOH" train --config "$T/lm.json" "${lm[@]}" --batch-size 4 --out "$T/pre" --steps 8 --stop-at-step 3 || bad "pre-Muon run"
python3 - "$T/pre/optimizer.safetensors" <<'PY' || bad "could not strip the Muon keys"
import json, struct, sys
p = sys.argv[1]; b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])
for k in ('optimizer', 'muon_lr'): del h['__metadata__'][k]
hs = json.dumps(h).encode(); hs += b' ' * ((8 - len(hs) % 8) % 8)
open(p, 'wb').write(struct.pack('<Q', len(hs)) + hs + b[8 + n:])
PY
rm -f "$T/pre/checkpoint.json" # a checkpoint from before Muon is also one from before checkpoint.json
cp -r "$T/pre" "$T/pre2"
out=$("$MOH" train --resume --data "$T/corpus.txt" --out "$T/pre2" --optimizer muon 2>&1); rc=$?
check "[ $rc -eq 1 ] && grep -q -- '--optimizer muon contradicts the checkpoint in .* (optimizer adamw)' <<<\"\$out\"" "pre-Muon checkpoint + --optimizer muon: rc $rc: $out"
"$MOH" train --resume --data "$T/corpus.txt" --out "$T/pre" --quiet || bad "pre-Muon checkpoint does not resume"
"$MOH" train --config "$T/lm.json" "${lm[@]}" --batch-size 4 --out "$T/pre-full" --steps 8 || bad "pre-Muon twin"
check "cmp -s '$T/pre/model.safetensors' '$T/pre-full/model.safetensors'" "pre-Muon checkpoint: resumed weights differ from the uninterrupted AdamW run"
# hand-edited training state: muon_lr on an AdamW checkpoint, a muon_lr that underflows a double
for bad_lr in 0.01 1e-400; do
  rm -rf "$T/pre3" && cp -r "$T/pre-full" "$T/pre3"
  python3 - "$T/pre3/optimizer.safetensors" "$bad_lr" <<'PY' || bad "could not edit muon_lr"
import json, struct, sys
p = sys.argv[1]; b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])
h['__metadata__']['muon_lr'] = sys.argv[2]
hs = json.dumps(h).encode(); hs += b' ' * ((8 - len(hs) % 8) % 8)
open(p, 'wb').write(struct.pack('<Q', len(hs)) + hs + b[8 + n:])
PY
  rm -f "$T/pre3/checkpoint.json" # edited by hand: read without its checkpoint.json, as a folder of an older moh
  case $bad_lr in
    0.01) want="field 'muon_lr' is 0.01 with optimizer 0 (AdamW), expected 0" ;;
    *) want="field 'muon_lr' is 1e-400, expected a finite number in" ;;
  esac
  if one_line_error 1 "$want" "$MOH" train --resume --data "$T/corpus.txt" --out "$T/pre3" --steps 9; then ok; else bad "muon_lr $bad_lr in the metadata: $why"; fi
done
if one_line_error 1 "muon-lr 0.01 applies to --optimizer muon" "$MOH" train --config "$T/lm.json" "${lm[@]}" --out "$T/mlr" --steps 2 --muon-lr 0.01; then ok; else bad "--muon-lr with adamw: $why"; fi
if one_line_error 2 "optimizer 'sgd' is not one of adamw|muon" "$MOH" train --config "$T/lm.json" "${lm[@]}" --out "$T/sgd" --steps 2 --optimizer sgd; then ok; else bad "--optimizer sgd: $why"; fi
check "[ ! -e '$T/sgd/optimizer.safetensors' ]" "--optimizer sgd wrote a checkpoint"

# 3b. --warmup is the schedule's warmup, fresh and on resume (a note); --epochs on resume; a resume
# whose --stop-at-step is not after the checkpoint; a damaged second moment; a FIFO as text data
"$MOH" train --config "$T/lm.json" "${lm[@]}" --batch-size 4 --out "$T/wu" --steps 10 --warmup 5 --stop-at-step 4 || bad "warmup run"
check "[ \"\$(field_at '$T/wu/metrics.jsonl' 1 lr)\" = 0.0004 ] && [ \"\$(field_at '$T/wu/metrics.jsonl' 4 lr)\" = 0.0016 ]" "--warmup 5: lr should ramp 4e-4 .. 1.6e-3: $(grep -o '"lr": [0-9.e-]*' "$T/wu/metrics.jsonl" | tr '\n' ' ')"
out=$("$MOH" train --resume --data "$T/corpus.txt" --out "$T/wu" --warmup 8 --stop-at-step 5 2>&1) || bad "warmup resume: $out"
check "grep -q 'note: --warmup 8 replaces the checkpoint.s warmup 5 from step 5 on' <<<\"\$out\"" "no --warmup note: $out"
check "[ \"\$(field_at '$T/wu/metrics.jsonl' 5 lr)\" = 0.00125 ]" "lr at step 5 with warmup 8 should be 2e-3 * 5 / 8: $(field_at "$T/wu/metrics.jsonl" 5 lr)"
out=$("$MOH" train --resume --data "$T/corpus.txt" --out "$T/wu" --stop-at-step 3 2>&1); rc=$?
check "[ $rc -eq 1 ] && grep -q -- '--stop-at-step 3 is not after the checkpoint.s step 5' <<<\"\$out\"" "stop-at-step before the checkpoint: rc $rc: $out"
"$MOH" train --config "$T/vit.json" "${vit[@]}" --batch-size 16 --out "$T/ep" --epochs 1 --stop-at-step 2 || bad "vit epochs run"
out=$("$MOH" train --resume --data "$IDX" --out "$T/ep" --epochs 2 --stop-at-step 3 2>&1) || bad "epochs resume: $out"
check "grep -q 'note: --epochs gives 12 steps in place of the checkpoint.s total_steps 6' <<<\"\$out\"" "no --epochs note on resume: $out"
cp -r "$T/wu" "$T/vneg"
python3 - "$T/vneg/optimizer.safetensors" <<'EOF2'
import json, struct, sys
p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])
k = next(k for k in h if k.startswith('v.'))
o = 8 + n + h[k]['data_offsets'][0]; b[o:o + 4] = struct.pack('<f', -1.0)
open(p, 'wb').write(b)
EOF2
rm -f "$T/vneg/checkpoint.json" # edited by hand: read without its checkpoint.json, as a folder of an older moh
out=$("$MOH" train --resume --data "$T/corpus.txt" --out "$T/vneg" --quiet 2>&1); rc=$?
check "[ $rc -eq 1 ] && grep -q 'the second moments (v.\*) hold -1 at offset 0, expected >= 0' <<<\"\$out\"" "negative second moment: rc $rc: $out"
mkfifo "$T/fifo.txt"
out=$(timeout 10 "$MOH" train --config "$T/lm.json" --data "$T/fifo.txt" --out "$T/ff" --steps 1 2>&1); rc=$?
check "[ $rc -eq 1 ] && grep -q 'not a regular file' <<<\"\$out\"" "FIFO as text data: rc $rc (124 = hang): $out"

# 4. non-finite guard
for fam in lm vit; do
  if [ $fam = lm ]; then run=(--config "$T/lm.json" "${lm[@]}" --batch-size 4); else run=(--config "$T/vit.json" "${vit[@]}" --batch-size 16 --shards 2); fi
  data=$([ $fam = lm ] && echo "$T/corpus.txt" || echo "$IDX")
  "$MOH" train "${run[@]}" --out "$T/$fam-n2" --steps 8 --stop-at-step 2 || bad "$fam 2 steps"
  err=$("$MOH" train "${run[@]}" --out "$T/$fam-n3" --steps 8 --stop-at-step 3 --debug-nan-grad 3 2>&1 >/dev/null) || bad "$fam run with one NaN step exited $?"
  check "grep -q 'warning: step 3: .* not finite, step skipped (1 in a row, 1 in the run)' <<<\"\$err\"" "$fam: no skip warning: $err"
  check "same_tensors '$T/$fam-n2/model.safetensors' '$T/$fam-n3/model.safetensors'" "$fam: the NaN step changed the weights"
  check "sed -n 3p '$T/$fam-n3/metrics.jsonl' | grep -q '\"skipped\": 1, \"step_skipped\": true'" "$fam: metrics.jsonl does not count the skipped step: $(sed -n 3p "$T/$fam-n3/metrics.jsonl")"
  # the run goes on after it: a resume trains normally (no NaN anywhere in the checkpoint: load checks)
  "$MOH" train --resume --data "$data" --out "$T/$fam-n3" --quiet || bad "$fam resume after a skipped step"
  check "[ \"\$(field_at '$T/$fam-n3/metrics.jsonl' 8 skipped)\" = 1 ]" "$fam: the skip count was not kept"
  "$MOH" eval --checkpoint "$T/$fam-n3" --data "$data" --json > /dev/null || bad "$fam: eval of the checkpoint after a skipped step"
  # 3 in a row: the run stops with an error; the checkpoint of step 2 stays as it was
  "$MOH" train "${run[@]}" --out "$T/$fam-nn" --steps 8 --eval-every 2 --debug-nan-grad 3 --debug-nan-count 3 > /dev/null 2> "$T/nn.err"; rc=$?
  check "[ $rc -eq 1 ] && grep -q 'steps 3-5: loss or gradient not finite 3 times in a row; stopped (the last checkpoint in .* is intact)' '$T/nn.err'" "$fam: 3 NaN steps: rc $rc: $(cat "$T/nn.err")"
  check "same_tensors '$T/$fam-n2/model.safetensors' '$T/$fam-nn/model.safetensors'" "$fam: the checkpoint after 3 NaN steps is not the step-2 one"
done

# 5. moh 0.1 checkpoints (formats moh-lm-train-v1 / moh-vit-train-v1) resume to the same losses
cp -r "$FIX/lm" "$T/v1lm" && cp -r "$FIX/vit" "$T/v1vit"
out=$("$MOH" train --resume --data "$T/corpus.txt" --out "$T/v1lm" --batch-size 4 --seq-len 16 --lr 1e-3 --eval-every 3 --eval-tokens 500 2>&1) || bad "v1 LM resume: $out"
check "grep -q 'does not record every hyperparameter' <<<\"\$out\"" "v1 LM resume: no note on the missing hyperparameters: $out"
check "[ \"\$(losses '$T/v1lm/metrics.jsonl' | tr ' ' '\n' | grep -v loss | grep . | tr '\n' ' ')\" = \"\$(tr '\n' ' ' < '$FIX/lm_full_losses.txt')\" ]" "v1 LM resume losses $(losses "$T/v1lm/metrics.jsonl") differ from $(tr '\n' ' ' < "$FIX/lm_full_losses.txt")"
"$MOH" train --resume --data "$IDX" --out "$T/v1vit" --quiet || bad "v1 ViT resume"
check "[ \"\$(losses '$T/v1vit/metrics.jsonl' | tr ' ' '\n' | grep -v loss | grep . | tr '\n' ' ')\" = \"\$(tr '\n' ' ' < '$FIX/vit_full_losses.txt')\" ]" "v1 ViT resume losses $(losses "$T/v1vit/metrics.jsonl") differ from $(tr '\n' ' ' < "$FIX/vit_full_losses.txt")"
"$MOH" eval --checkpoint "$FIX/lm" --data "$T/corpus.txt" --json > /dev/null || bad "v1 LM checkpoint does not load in eval"

# 6. Ctrl-C during training with 2 shards (oneDNN GEMMs on two threads) saves and exits 130: the
# signal is taken by a thread of its own, never inside a kernel (it used to corrupt the heap in about
# 1 of 3 tries); a second Ctrl-C ends the run at once
for i in 1 2 3; do
  "$MOH" train --config moh-75 --data "$T/corpus.txt" --out "$T/int$i" --steps 100000 --seq-len 64 --batch-size 8 \
    --grad-accum 2 --shards 2 --eval-every 1000 --eval-tokens 2000 --quiet > "$T/int$i.out" 2>&1 &
  p=$!
  sleep "1.$((3 * i))"
  kill -INT $p
  wait $p; rc=$?
  check "[ $rc -eq 130 ] && [ -s '$T/int$i/optimizer.safetensors' ]" "Ctrl-C with 2 shards, try $i: exit $rc (130 expected): $(tail -2 "$T/int$i.out")"
done
# (long steps: the second Ctrl-C lands in the step the first one is waiting for)
"$MOH" train --config moh-75 --data "$T/corpus.txt" --out "$T/int2x" --steps 100000 --seq-len 256 --batch-size 64 --eval-every 100000 --quiet > "$T/int2x.out" 2>&1 &
p=$!
sleep 1.5; kill -INT $p; sleep 0.3; kill -INT $p
wait $p; rc=$?
check "[ $rc -eq 130 ] && grep -q 'interrupted twice: stopping now' '$T/int2x.out'" "a second Ctrl-C: exit $rc: $(cat "$T/int2x.out")"

finish
