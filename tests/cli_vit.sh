#!/usr/bin/env bash
# CLI test of the ViT job: `moh train` / `moh eval` dispatch on a tiny ViT config (model_type
# "vit") with a small IDX data set written here (plain and gzip files), the checkpoint layout,
# eval text and --json output, resume after --stop-at-step giving the same weights as an
# uninterrupted run, Ctrl-C (SIGINT) saving a checkpoint (exit 130), and one-line errors.
#   tests/cli_vit.sh path/to/moh
set -euo pipefail
. "$(dirname "$0")/lib.sh"

# 600 train / 200 test images of 28x28: class k is a bright horizontal band at row 1 + 2.6 k
band_idx "$T/data" 600 200 gz
cat >"$T/vit.json" <<'EOF'
{"model_type": "vit", "embed_dim": 16, "depth": 2, "num_heads": 4, "mlp_ratio": 2,
 "router": "learned", "shared_heads": 1, "top_k": 2, "_comment": "cli test"}
EOF
common=(--config "$T/vit.json" --data "$T/data" --batch-size 32 --shards 2 --lr 3e-3 --quiet)

# full run: 40 steps (2 epochs of 18 steps + 4), no augmentation (learns the bands quickly)
"$MOH" train "${common[@]}" --out "$T/a" --steps 40 --no-augment || fail "train"
for f in config.json model.safetensors optimizer.safetensors metrics.jsonl; do
  [ -s "$T/a/$f" ] || fail "missing $f"
done
grep -Eq '"model_type":[[:space:]]*"vit"' "$T/a/config.json" || fail "config.json model_type"
grep -q '"mean"' "$T/a/config.json" || fail "config.json mean/std"
[ "$(wc -l <"$T/a/metrics.jsonl")" -eq 40 ] || fail "metrics.jsonl lines"
grep -q '"test_acc"' "$T/a/metrics.jsonl" || fail "test_acc in metrics"

# eval, text and JSON
"$MOH" eval --checkpoint "$T/a" --data "$T/data" >"$T/eval.txt" || fail "eval"
grep -q "top-1 accuracy" "$T/eval.txt" || fail "eval text"
grep -q "confusion matrix" "$T/eval.txt" || fail "eval confusion"
"$MOH" eval --checkpoint "$T/a" --data "$T/data" --json --batch-size 48 >"$T/eval.json" || fail "eval --json"
python3 - "$T/eval.json" <<'EOF' || fail "eval json contents"
import json, sys
r = json.load(open(sys.argv[1]))
assert 0 <= r["accuracy"] <= 1 and r["n"] == 200, r
assert len(r["per_class"]) == 10 and len(r["confusion"]) == 10
assert sum(map(sum, r["confusion"])) == 200
assert sum(r["confusion"][k][k] for k in range(10)) == r["correct"]
assert r["accuracy"] > 0.2, f"accuracy {r['accuracy']} on an easy synthetic task (chance 0.1)"
assert len(r["head_share"]) == 2 and abs(sum(r["head_share"][0]) - 3.0) < 1e-6  # 1 shared + top-2
EOF

# the reported loss is the plain cross-entropy of the logits (the config's label smoothing 0.1 is
# for training only): recomputed from --dump-logits of all 200 images, and text output says so
"$MOH" eval --checkpoint "$T/a" --data "$T/data" --json --batch-size 200 --dump-logits "$T/d.st" >"$T/ce.json" 2>"$T/ce.err" || fail "eval --dump-logits"
# (stderr: only the line of --precision auto's choice)
[ "$(grep -vc '^moh eval: compute .*; --precision auto chose ' "$T/ce.err")" = 0 ] || fail "short eval wrote to stderr: $(cat "$T/ce.err")"
python3 - "$T/d.st" "$T/ce.json" <<'EOF' || fail "eval ce_loss is not the plain cross-entropy"
import json, math, struct, sys
b = open(sys.argv[1], 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n]); d = b[8 + n:]
def get(k):
    s, e = h[k]['data_offsets']; return h[k]['shape'], struct.unpack('<%df' % ((e - s) // 4), d[s:e])
(m, K), lg = get('logits'); _, lab = get('labels')
ce = sm = 0.0
for i in range(m):
    row = lg[i * K:(i + 1) * K]; mx = max(row); lse = mx + math.log(sum(math.exp(x - mx) for x in row))
    ce += lse - row[int(lab[i])]
    sm += 0.9 * (lse - row[int(lab[i])]) + 0.1 * sum(lse - x for x in row) / K
r = json.load(open(sys.argv[2]))
assert m == 200 and "loss" not in r, r.keys()
assert abs(r["ce_loss"] - ce / m) < 1e-5, (r["ce_loss"], ce / m)
assert abs(r["ce_loss"] - sm / m) > 1e-3, "ce_loss equals the label-smoothed loss"
EOF
grep -q "cross-entropy [0-9.]* nats (no label smoothing)" "$T/eval.txt" || fail "eval text: cross-entropy"
# training's final test_loss (whole t10k split) is the same plain cross-entropy as moh eval's
python3 - "$T/a/metrics.jsonl" "$T/ce.json" <<'EOF' || fail "metrics test_loss is not moh eval's plain cross-entropy"
import json, sys
last = [json.loads(l) for l in open(sys.argv[1]) if '"test_loss"' in l][-1]
r = json.load(open(sys.argv[2]))
assert last["test_n"] == 200 and abs(last["test_loss"] - r["ce_loss"]) < 1e-5, (last["test_loss"], r["ce_loss"])
EOF

# resume after --stop-at-step (with augmentation): same final weights as the uninterrupted run
"$MOH" train "${common[@]}" --out "$T/a2" --steps 40 || fail "train (augmented)"
"$MOH" train "${common[@]}" --out "$T/b" --steps 40 --stop-at-step 23 || fail "train --stop-at-step"
"$MOH" train --resume --out "$T/b" --data "$T/data" --quiet || fail "resume"
cmp -s "$T/a2/model.safetensors" "$T/b/model.safetensors" || fail "resumed weights differ"
[ "$(wc -l <"$T/b/metrics.jsonl")" -eq 40 ] || fail "resumed metrics.jsonl lines"

# Ctrl-C: checkpoint saved, exit status 130, resumable
"$MOH" train "${common[@]}" --out "$T/c" --steps 100000 --eval-every 100000 &
pid=$!
for _ in $(seq 1 300); do
  [ -s "$T/c/metrics.jsonl" ] && [ "$(wc -l <"$T/c/metrics.jsonl")" -ge 3 ] && break
  sleep 0.1
done
kill -INT "$pid"
set +e; wait "$pid"; rc=$?; set -e
[ "$rc" -eq 130 ] || fail "SIGINT exit status $rc, expected 130"
[ -s "$T/c/optimizer.safetensors" ] || fail "no checkpoint after SIGINT"

# errors: one line on stderr naming the problem
set +e
"$MOH" train --config "$T/vit.json" --data "$T/nodata" --out "$T/d" --quiet 2>"$T/err1"; rc1=$?
echo '{"model_type": "vit", "embed_dim": 16, "depth": 2, "num_heads": 3}' >"$T/bad.json"
"$MOH" train --config "$T/bad.json" --data "$T/data" --out "$T/d" --quiet 2>"$T/err2"; rc2=$?
"$MOH" eval --checkpoint "$T/a" --data "$T/nodata" 2>"$T/err3"; rc3=$?
# truncated image file, and a label outside 0..num_classes-1, each named with its file
mkdir -p "$T/trunc" "$T/mislab"
cp "$T/data"/* "$T/trunc/"; cp "$T/data"/* "$T/mislab/"
head -c 5000 "$T/data/t10k-images-idx3-ubyte" >"$T/trunc/t10k-images-idx3-ubyte"
python3 -c "import sys; b=bytearray(open(sys.argv[1],'rb').read()); b[8+7]=12; open(sys.argv[1],'wb').write(b)" \
  "$T/mislab/train-labels-idx1-ubyte"
# optimizer metadata that is not a finite integer (here "nan") stops a resume with one line
cp -r "$T/b" "$T/nanmeta"
python3 - "$T/nanmeta/optimizer.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])
h['__metadata__']['step'] = 'nan'; nh = json.dumps(h).encode(); nh += b' ' * ((8 - len(nh) % 8) % 8)
open(sys.argv[1], 'wb').write(struct.pack('<Q', len(nh)) + nh + b[8 + n:])
PY
rm -f "$T/nanmeta/checkpoint.json" # edited by hand: read without its checkpoint.json, as a folder of an older moh
"$MOH" train --resume --out "$T/nanmeta" --data "$T/data" --quiet 2>"$T/err6"; rc6=$?
# text given to a ViT checkpoint: a file, and a prepared text dir (val.txt)
echo "some text, not images" >"$T/text.txt"; mkdir -p "$T/textdir"; cp "$T/text.txt" "$T/textdir/val.txt"
"$MOH" eval --checkpoint "$T/a" --data "$T/text.txt" 2>"$T/err7"; rc7=$?
"$MOH" eval --checkpoint "$T/a" --data "$T/textdir" 2>"$T/err8"; rc8=$?
"$MOH" eval --checkpoint "$T/a" --data "$T/trunc" 2>"$T/err4"; rc4=$?
"$MOH" train "${common[@]}" --data "$T/mislab" --out "$T/e" --steps 2 2>"$T/err5"; rc5=$?
set -e
[ "$rc4" -eq 1 ] && [ "$(wc -l <"$T/err4")" -eq 1 ] && grep -q "t10k-images-idx3-ubyte" "$T/err4" &&
  grep -q "truncated" "$T/err4" || fail "truncated IDX: $(cat "$T/err4")"
[ "$rc5" -eq 1 ] && [ "$(wc -l <"$T/err5")" -eq 1 ] && grep -q "train-labels-idx1-ubyte" "$T/err5" &&
  grep -q "12" "$T/err5" || fail "mislabelled IDX: $(cat "$T/err5")"
[ ! -e "$T/e/model.safetensors" ] || fail "mislabelled data still wrote a checkpoint"
for k in 7 8; do
  [ "$(eval echo \$rc$k)" -eq 1 ] && [ "$(wc -l <"$T/err$k")" -eq 1 ] && grep -q "is a ViT (image) model: it needs a directory of IDX files" "$T/err$k" ||
    fail "text data for a ViT checkpoint: $(cat "$T/err$k")"
done
[ "$rc6" -eq 1 ] && [ "$(wc -l <"$T/err6")" -eq 1 ] && grep -q "field 'step' is nan" "$T/err6" ||
  fail "nan step in optimizer metadata: $(cat "$T/err6")"
[ "$rc1" -eq 1 ] && [ "$(wc -l <"$T/err1")" -eq 1 ] && grep -q "no such file" "$T/err1" || fail "missing data: $(cat "$T/err1")"
[ "$rc2" -eq 1 ] && grep -q "num_heads" "$T/err2" || fail "bad config: $(cat "$T/err2")"
[ "$rc3" -eq 1 ] && grep -q "no such file" "$T/err3" || fail "eval missing data: $(cat "$T/err3")"
echo "  truncated: $(cat "$T/err4")"; echo "  mislabelled: $(cat "$T/err5")"
# --shards above the batch size is refused (shards set the load-balance statistics), nothing written
if "$MOH" train "${common[@]}" --out "$T/sh" --steps 1 --batch-size 4 --shards 8 2>"$T/sh.err"; then fail "--shards 8 with batch 4 accepted"; fi
grep -q -- "--shards is 8, more than --batch-size 4" "$T/sh.err" || fail "shards message: $(cat "$T/sh.err")"
[ ! -e "$T/sh" ] || fail "a refused ViT train created its --out"
echo "cli_vit: all checks passed"
