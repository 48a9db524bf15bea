#!/usr/bin/env python3
"""Table of tools/exp/continue_tuning.sh results (docs/continue-tuning.md).

  python3 tools/exp/ct_table.py runs/continue-tuning/results.jsonl

One row per (arm, tokens): bits/byte on the held-out KJV books and on fortunes, the share of heads
computed, and the recovery of a MoH arm at N tokens: the share of its converted model's gap to the
dense model tuned on the same N tokens that tuning closed,
(bpb(MoH, 0) - bpb(MoH, N)) / (bpb(MoH, 0) - bpb(dense, N)). Later lines of a (arm, tokens) win.
"""
import json
import sys

rows = {}
for line in open(sys.argv[1]):
    if line.strip():
        r = json.loads(line)
        rows[(r["arm"], r["tokens"])] = r


def recovery(arm, tok, key):
    conv, tuned, dense = rows.get((arm, 0)), rows.get((arm, tok)), rows.get(("dense", tok))
    if arm == "dense" or tok == 0 or not (conv and tuned and dense):
        return "–"
    gap = conv[key] - dense[key]
    return f"{100 * (conv[key] - tuned[key]) / gap:.0f} %" if abs(gap) > 1e-9 else "–"


print("| arm | tokens tuned | heads computed | KJV held-out bits/byte | fortunes bits/byte | recovery KJV | recovery fortunes | tuning time |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for (arm, tok) in sorted(rows, key=lambda k: (k[1], ["dense", "moh75", "moh75-learned", "moh50"].index(k[0])
                                               if k[0] in ("dense", "moh75", "moh75-learned", "moh50") else 9)):
    r = rows[(arm, tok)]
    print(f"| {arm} | {tok:,} | {100 * r['head_share']:.1f} % | {r['kjv_bpb']:.4f} | {r['fortunes_bpb']:.4f} | "
          f"{recovery(arm, tok, 'kjv_bpb')} | {recovery(arm, tok, 'fortunes_bpb')} | {r['train_s']} s |")
