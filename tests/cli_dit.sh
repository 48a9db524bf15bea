#!/usr/bin/env bash
# CLI test of the DiT job: `moh train` / `moh eval` / `moh sample` dispatch on a tiny MoH-DiT
# config (model_type "dit", per-layer heads) with a small 8x8 IDX data set written here; the
# checkpoint layout with the EMA (optimizer.safetensors ema.*, model.safetensors = the EMA weights);
# resume after --stop-at-step giving the same files as an uninterrupted run; eval text and JSON;
# sampling to PNG and IDX (seeded, independent of the batch size, DDPM and DDIM); one-line errors
# with nothing written (class out of range, cfg < 0, steps 0, wrong image size, crop).
#   tests/cli_dit.sh path/to/moh
set -euo pipefail
. "$(dirname "$0")/lib.sh"

# 256 train / 64 test images of 8x8: class k (0..3) is a bright column at x = 2 k
column_idx "$T/data" 256 64 7
cat >"$T/dit.json" <<'EOF'
{"model_type": "dit", "input_size": 8, "patch_size": 2, "num_classes": 4, "hidden_size": 16, "depth": 2,
 "num_heads": 4, "mlp_ratio": 2, "router": "learned", "shared_heads": [2, 4], "top_k": [1, 0],
 "_comment": "cli test"}
EOF
common=(--config "$T/dit.json" --data "$T/data" --batch-size 16 --shards 2 --lr 2e-3 --ema-decay 0.9 --quiet)

"$MOH" train "${common[@]}" --out "$T/a" --steps 12 || fail "train"
for f in config.json model.safetensors optimizer.safetensors metrics.jsonl; do
  [ -s "$T/a/$f" ] || fail "missing $f"
done
grep -Eq '"model_type":[[:space:]]*"dit"' "$T/a/config.json" || fail "config.json model_type"
grep -q '"val_mse"' "$T/a/metrics.jsonl" || fail "val_mse in metrics"
[ "$(wc -l <"$T/a/metrics.jsonl")" -eq 12 ] || fail "metrics.jsonl lines"

# resume after a stop at step 5 reproduces the uninterrupted run: weights, moments, EMA
"$MOH" train "${common[@]}" --out "$T/b" --steps 12 --stop-at-step 5 || fail "train --stop-at-step"
"$MOH" train --data "$T/data" --out "$T/b" --resume --quiet || fail "resume"
cmp -s "$T/a/model.safetensors" "$T/b/model.safetensors" || fail "resumed model.safetensors differs"
# the EMA turned off at a resume: the checkpoint's model.safetensors (the EMA) still checks out
"$MOH" train "${common[@]}" --out "$T/e0" --steps 8 --stop-at-step 4 || fail "train to step 4"
"$MOH" train --data "$T/data" --out "$T/e0" --resume --ema-decay 0 --quiet 2>"$T/e0.err" || fail "resume --ema-decay 0: $(cat "$T/e0.err")"

# model.safetensors holds the EMA (ema.* of optimizer.safetensors), not the raw weights (param.*)
python3 - "$T/a" "$T/b" <<'EOF' || fail "EMA layout, or the resumed moments / EMA differ"
import json, struct, sys
def load(p):
    b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])
    h.pop('__metadata__', None); return {k: b[8 + n + v['data_offsets'][0]:8 + n + v['data_offsets'][1]] for k, v in h.items()}
m = load(sys.argv[1] + '/model.safetensors'); o = load(sys.argv[1] + '/optimizer.safetensors')
assert set(m) == {k[4:] for k in o if k.startswith('ema.')}, "ema.* tensors"
assert all(m[k] == o['ema.' + k] for k in m), "model.safetensors is not the EMA"
name = 'blocks.0.mlp.fc1.weight'
assert m[name] != o['param.' + name], "EMA equals the raw weights"
assert 'blocks.0.attn.wg.weight' in m and 'blocks.1.attn.wg.weight' not in m and 'blocks.1.attn.wg_1.weight' in m
assert load(sys.argv[2] + '/optimizer.safetensors') == o, "resumed param / m / v / ema tensors differ"
EOF

# eval, text and JSON
"$MOH" eval --checkpoint "$T/a" --data "$T/data" >"$T/eval.txt" 2>/dev/null || fail "eval"
grep -q "noise-prediction MSE" "$T/eval.txt" || fail "eval text"
"$MOH" eval --checkpoint "$T/a" --data "$T/data" --json 2>/dev/null >"$T/eval.json" || fail "eval --json"
python3 - "$T/eval.json" <<'EOF' || fail "eval json contents"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["n"] == 64 and 0 < r["val_mse"] < 2, r
assert len(r["head_share"]) == 2 and abs(sum(r["head_share"][0]) - 3.0) < 1e-6  # 2 shared + top-1
assert r["head_share"][1] == [1.0] * 4  # all heads shared (soft reweighting)
EOF
rc=0; "$MOH" eval --checkpoint "$T/a" --data "$T/data" --dump-logits "$T/d.st" >/dev/null 2>"$T/d.err" || rc=$?
[ "$rc" -eq 2 ] && [ "$(wc -l < "$T/d.err")" -eq 1 ] && grep -q 'a DiT has no logits to dump' "$T/d.err" && [ ! -e "$T/d.st" ] ||
  fail "eval --dump-logits on a DiT: rc $rc, $(cat "$T/d.err")"

# sampling: PNG grid (4 rows of 3, each image x4 with 8-pixel gaps, labelled rows) and IDX (+ labels),
# seeded and batch-independent
"$MOH" sample --checkpoint "$T/a" --n 3 --steps 20 --cfg 2 --out "$T/g.png" \
  --out-idx "$T/s-images-idx3-ubyte" 2>"$T/s.err" || fail "sample: $(cat "$T/s.err")"
grep -q "12 images (4 classes x 3)" "$T/s.err" || fail "sample summary: $(cat "$T/s.err")"
"$MOH" sample --checkpoint "$T/a" --n 3 --steps 20 --cfg 2 --batch 5 --out-idx "$T/t-images-idx3-ubyte" 2>/dev/null || fail "sample --batch 5"
cmp -s "$T/s-images-idx3-ubyte" "$T/t-images-idx3-ubyte" || fail "samples depend on the batch size"
printf 'zero\none\ntwo\nthree\n' > "$T/names.txt"
"$MOH" sample --checkpoint "$T/a" --n 3 --steps 2 --scale 2 --class-names "$T/names.txt" --out "$T/g2.png" 2>/dev/null || fail "sample --scale 2 --class-names FILE"
"$MOH" sample --checkpoint "$T/a" --class 2 --n 2 --sampler ddim --steps 10 --seed 9 --out-idx "$T/d.idx" 2>/dev/null || fail "ddim"
python3 - "$T" <<'EOF' || fail "sample files"
import struct, sys
t = sys.argv[1]
p = open(t + '/g.png', 'rb').read()
w, h = struct.unpack('>II', p[16:24])
# rows: 4 x (8 px x 4 + 8) + 8; columns the same after a margin holding the labels "class k"
assert p[:8] == b'\x89PNG\r\n\x1a\n' and h == 4 * 40 + 8 and w > 3 * 40 + 8 + 16 + 20, (w, h)
w2, h2 = struct.unpack('>II', open(t + '/g2.png', 'rb').read()[16:24])
assert h2 == 4 * 20 + 4 and w2 > 3 * 20 + 4 + 16 + 20, (w2, h2)  # --scale 2, names from a file
i = open(t + '/s-images-idx3-ubyte', 'rb').read(); l = open(t + '/s-labels-idx1-ubyte', 'rb').read()
assert struct.unpack('>IIII', i[:16]) == (0x803, 12, 8, 8) and len(i) == 16 + 12 * 64
assert struct.unpack('>II', l[:8]) == (0x801, 12) and list(l[8:]) == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3
assert len(set(i[16:])) > 20, "samples are not images"
d = open(t + '/d.idx', 'rb').read(); dl = open(t + '/d.idx.labels', 'rb').read()
assert struct.unpack('>IIII', d[:16]) == (0x803, 2, 8, 8) and list(dl[8:]) == [2, 2]
EOF

# sampling progress counts the sampler's steps of every batch and says so (the line appears once a
# run takes 2 s: more images until one does)
for nimg in 8 32 128; do
  "$MOH" sample --checkpoint "$T/a" --class 0 --n $nimg --batch 2 --steps 1000 --out-idx "$T/p.idx" 2>"$T/p.err" >/dev/null \
    || fail "sample for progress: $(cat "$T/p.err")"
  grep -q "100% ($((nimg / 2 * 1000)) steps: 1000 sampler steps x $((nimg / 2)) batches of up to 2 images)" "$T/p.err" && break
  [ $nimg -eq 128 ] && fail "no sampling progress line counting steps x batches: $(cat "$T/p.err")"
done

# one-line errors; nothing written
expect_err() { one_line_error any "$@" || fail "$why"; } # expected-text, then the command
s=(sample --checkpoint "$T/a" --n 1 --steps 2 --out "$T/x.png" --out-idx "$T/x.idx")
expect_err "expected 0..3 or all" "$MOH" "${s[@]}" --class 4
python3 -c "open('$T/cjk.txt', 'w').write(('\u65e5' * 40 + '\n') * 4)"   # 120 bytes a name: cut at a character
"$MOH" sample --checkpoint "$T/a" --n 1 --steps 2 --out "$T/cjk.png" --class-names "$T/cjk.txt" 2>"$T/cjk.err" >/dev/null \
  || fail "names of 40 CJK characters: $(cat "$T/cjk.err")"
printf 'zero\non\xffe\ntwo\nthree\n' > "$T/bad8.txt"
expect_err "bad8.txt: line 2: byte 0xff at column 3: expected UTF-8 text" "$MOH" "${s[@]}" --class-names "$T/bad8.txt"
expect_err "a grid of 32768 x 48 pixels (--n 819, --scale 4): expected at most 31767" "$MOH" sample --checkpoint "$T/a" --n 819 --class 0 --steps 2 --out "$T/x.png"
head -3 "$T/names.txt" > "$T/names3.txt"
expect_err "names3.txt: --class-names file has 3 lines, expected 4" "$MOH" "${s[@]}" --class-names "$T/names3.txt"
expect_err "expected 0..3 or all" "$MOH" "${s[@]}" --class -1
expect_err "cfg" "$MOH" "${s[@]}" --cfg -1
expect_err "steps" "$MOH" "${s[@]}" --steps 0
expect_err "expected 1..1000" "$MOH" "${s[@]}" --steps 1001
expect_err "folder does not exist" "$MOH" sample --checkpoint "$T/a" --out "$T/nodir/x.png"
expect_err "give --out" "$MOH" sample --checkpoint "$T/a"
[ ! -e "$T/x.png" ] && [ ! -e "$T/x.idx" ] || fail "a failed sample wrote a file"
sed 's/"input_size": 8/"input_size": 12/' "$T/dit.json" >"$T/dit12.json"
expect_err "images are 8x8, config input_size is 12" "$MOH" train --config "$T/dit12.json" --data "$T/data" --out "$T/c" --steps 2 --quiet
expect_err "crop-pad" "$MOH" train "${common[@]}" --out "$T/c" --steps 2 --crop-pad 1
[ ! -e "$T/c" ] || fail "a failed train created its --out"
echo "cli_dit: ok"
