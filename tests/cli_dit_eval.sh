#!/usr/bin/env bash
# CLI test of DiT sample quality and analysis on a tiny 8x8 data set written here: `moh eval
# --classifier` (class accuracy and FID under a tiny ViT trained here; JSON fields; seeded; --real
# floor whose class accuracy equals `moh eval` of the classifier on the same test images, and
# whose FID is far below that of an untrained DiT's samples), `moh analyze` per class and per
# timestep range (outputs written, head loads of the per-layer configs), and one-line errors.
#   tests/cli_dit_eval.sh path/to/moh
set -euo pipefail
. "$(dirname "$0")/lib.sh"

# 512 train / 96 test images of 8x8: class k (0..3) is a bright column at x = 2 k on a background of
# brightness 40 k (a tiny classifier learns it in a few steps)
column_idx "$T/data" 512 96 11 40
cat >"$T/dit.json" <<'EOF'
{"model_type": "dit", "input_size": 8, "patch_size": 2, "num_classes": 4, "hidden_size": 16, "depth": 3,
 "num_heads": 4, "mlp_ratio": 2, "router": "learned", "shared_heads": [1, 2, 4], "top_k": [2, 1, 0]}
EOF
cat >"$T/vit.json" <<'EOF'
{"model_type": "vit", "img_size": 8, "patch_size": 2, "num_classes": 4, "embed_dim": 16, "depth": 1,
 "num_heads": 2, "mlp_ratio": 2, "router": "none"}
EOF
"$MOH" train --config "$T/dit.json" --data "$T/data" --out "$T/dit" --steps 4 --batch-size 16 --quiet || fail "train dit"
"$MOH" train --config "$T/vit.json" --data "$T/data" --out "$T/vit" --steps 60 --batch-size 32 --lr 1e-2 \
  --no-augment --quiet || fail "train vit"

# sample quality: JSON fields, seeded (same seed, same numbers; another seed differs)
q=(eval --checkpoint "$T/dit" --data "$T/data" --classifier "$T/vit" --samples 24 --steps 4 --sampler ddim --json)
"$MOH" "${q[@]}" --cfg 2 >"$T/q1.json" 2>/dev/null || fail "eval --classifier"
"$MOH" "${q[@]}" --cfg 2 --batch 5 >"$T/q2.json" 2>/dev/null || fail "eval --classifier --batch 5"
"$MOH" "${q[@]}" --cfg 2 --seed 3 >"$T/q3.json" 2>/dev/null || fail "eval --classifier --seed 3"
"$MOH" eval --checkpoint "$T/dit" --data "$T/data" --classifier "$T/vit" --samples 40 --real --json \
  >"$T/real.json" 2>/dev/null || fail "eval --real"
"$MOH" eval --checkpoint "$T/vit" --data "$T/data" --json --limit 40 >"$T/vit.json.out" 2>/dev/null || fail "eval vit"
"$MOH" eval --checkpoint "$T/dit" --data "$T/data" --classifier "$T/vit" --samples 24 --steps 4 >"$T/q.txt" \
  2>/dev/null || fail "eval text"
grep -q "^class accuracy" "$T/q.txt" && grep -q "^FID" "$T/q.txt" || fail "eval text: $(cat "$T/q.txt")"
python3 - "$T" <<'EOF' || fail "sample-quality JSON"
import json, sys
t = sys.argv[1]
q1, q2, q3 = (json.load(open(f'{t}/q{i}.json')) for i in (1, 2, 3))
real, vit = json.load(open(f'{t}/real.json')), json.load(open(f'{t}/vit.json.out'))
for k in ('class_accuracy', 'fid', 'samples', 'steps', 'cfg', 'per_class_accuracy', 'feature_dim'):
    assert k in q1, k
assert q1['samples'] == 24 and q1['steps'] == 4 and q1['cfg'] == 2 and q1['feature_dim'] == 16, q1
assert 0 <= q1['class_accuracy'] <= 1 and q1['fid'] > 0 and len(q1['per_class_accuracy']) == 4, q1
assert q1['reference'] == 't10k' and q1['reference_images'] == 96, q1
assert (q1['fid'], q1['class_accuracy']) == (q2['fid'], q2['class_accuracy']), (q1, q2)  # batch-independent
assert q3['fid'] != q1['fid'], (q1, q3)  # another seed, other samples
# the floor: the first 40 real test images (their own labels) against the training split
assert real['real'] and real['samples'] == 40 and real['steps'] is None and real['reference'] == 'train', real
assert vit['n'] == 40 and abs(real['class_accuracy'] - vit['accuracy']) < 1e-9, (real, vit)
assert real['class_accuracy'] > 0.9, real  # the bars are easy
assert 0 <= real['fid'] < q1['fid'] / 4, (real, q1)  # an untrained DiT's samples are far from the data
EOF

# analyze: per class (default) and per timestep range; outputs written; head loads of the
# per-layer configs (layer 0: 1 shared + top-2 of 3 routed; layer 2: every head shared)
"$MOH" analyze --checkpoint "$T/dit" --data "$T/data" --out "$T/an" --max-tokens 256 >"$T/an.txt" 2>"$T/an.err" \
  || fail "analyze: $(cat "$T/an.err")"
"$MOH" analyze --checkpoint "$T/dit" --data "$T/data" --out "$T/ant" --categories timestep --max-tokens 256 \
  --no-plots >/dev/null 2>"$T/an.err" || fail "analyze timestep: $(cat "$T/an.err")"
for f in analysis.json density.csv scores.csv effective_rank.csv similarity.csv; do
  [ -s "$T/an/$f" ] && [ -s "$T/ant/$f" ] || fail "analyze: missing $f"
done
python3 - "$T" <<'EOF' || fail "analysis.json contents"
import json, sys
t = sys.argv[1]
a, b = json.load(open(f'{t}/an/analysis.json')), json.load(open(f'{t}/ant/analysis.json'))
def find(o, key):
    if isinstance(o, dict):
        if key in o: return o[key]
        for v in o.values():
            r = find(v, key)
            if r is not None: return r
    if isinstance(o, list):
        for v in o:
            r = find(v, key)
            if r is not None: return r
assert find(a, 'categories') == ['0', '1', '2', '3'], find(a, 'categories')
assert find(b, 'categories') == ['t 0-249', 't 250-499', 't 500-749', 't 750-999'], find(b, 'categories')
EOF
python3 - "$T/an/density.csv" <<'EOF' || fail "density.csv: $(head -5 "$T/an/density.csv")"
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
assert rows[0][:3] == ['layer', 'head', 'kind'] and rows[0][3:] == ['0', '1', '2', '3'], rows[0]
load = {(int(r[0]), int(r[1])): [float(v) for v in r[3:]] for r in rows[1:]}
assert load[(0, 0)] == [1.0] * 4, load[(0, 0)]                               # layer 0: head 0 shared
for c in range(4):
    assert abs(sum(load[(0, h)][c] for h in (1, 2, 3)) - 2) < 1e-5, c        # top-2 of 3 routed
    assert abs(sum(load[(1, h)][c] for h in (2, 3)) - 1) < 1e-5, c           # layer 1: top-1 of 2
assert load[(1, 1)] == [1.0] * 4 and all(load[(2, h)] == [1.0] * 4 for h in range(4))  # shared there
EOF

# one-line errors
expect_err() { one_line_error any "$@" || fail "$why"; } # expected-text, then the command
e=(eval --checkpoint "$T/dit" --data "$T/data")
expect_err "needs --classifier" "$MOH" "${e[@]}" --samples 8
expect_err "samples" "$MOH" "${e[@]}" --classifier "$T/vit" --samples 0
expect_err "at least 2" "$MOH" "${e[@]}" --classifier "$T/vit" --samples 1
expect_err "expected an image classifier" "$MOH" "${e[@]}" --classifier "$T/dit" --samples 8
# a classifier of 12x12 images (one step on 32 random images of that size)
python3 - "$T/d12" <<'EOF'
import os, random, struct, sys
d = sys.argv[1]; os.makedirs(d); rnd = random.Random(1)
for name in ('train', 't10k'):
    open(f'{d}/{name}-images-idx3-ubyte', 'wb').write(struct.pack('>IIII', 0x803, 32, 12, 12) + bytes(rnd.randrange(256) for _ in range(32 * 144)))
    open(f'{d}/{name}-labels-idx1-ubyte', 'wb').write(struct.pack('>II', 0x801, 32) + bytes(rnd.randrange(4) for _ in range(32)))
EOF
sed 's/"img_size": 8/"img_size": 12/' "$T/vit.json" >"$T/vit12.json"
"$MOH" train --config "$T/vit12.json" --data "$T/d12" --out "$T/vit12" --steps 1 --batch-size 16 --quiet || fail "train vit12"
expect_err "takes 12x12x1 images" "$MOH" "${e[@]}" --classifier "$T/vit12" --samples 8
expect_err "applies to image-generation" "$MOH" eval --checkpoint "$T/vit" --data "$T/data" --classifier "$T/vit"
expect_err "categories" "$MOH" analyze --checkpoint "$T/dit" --data "$T/data" --out "$T/an2" --categories topics
echo "cli_dit_eval: ok"
