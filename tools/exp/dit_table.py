#!/usr/bin/env python3
"""Markdown table of tools/exp/dit_compare.sh results: one row per config (mean over seeds when
several), FLOP-ideal and measured speed ratios to the dense config.

    python3 tools/exp/dit_table.py runs/dit-compare
"""
import json
import statistics
import sys
from collections import defaultdict


def active_share(cfg):
    H, L = cfg["num_heads"], cfg["depth"]
    sh, tk = cfg.get("shared_heads", H), cfg.get("top_k", 0)
    sh = sh if isinstance(sh, list) else [sh] * L
    tk = tk if isinstance(tk, list) else [tk] * L
    if cfg.get("router", "none") == "none":
        return 1.0
    return sum(H if tk[l] == 0 else sh[l] + tk[l] for l in range(L)) / (H * L)


def ideal_macs(cfg):
    """Multiply-adds per image of a DiT forward on the head-sparse path: K/V of every head, Q,
    attention and W_O of the active heads only, MLP, adaLN per image (docs/results-dit.md)."""
    D, H, L = cfg["hidden_size"], cfg["num_heads"], cfg["depth"]
    N = (cfg["input_size"] // cfg["patch_size"]) ** 2
    dh, mlp = D // H, int(D * cfg["mlp_ratio"])
    sh, tk = cfg.get("shared_heads", H), cfg.get("top_k", 0)
    sh = sh if isinstance(sh, list) else [sh] * L
    tk = tk if isinstance(tk, list) else [tk] * L
    total = 0
    for l in range(L):
        act = H if cfg.get("router", "none") == "none" or tk[l] == 0 else sh[l] + tk[l]
        per_tok = 2 * D * D + act * (D * dh + 2 * N * dh + dh * D) + 2 * D * mlp
        total += N * per_tok + 6 * D * D
    return total


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "runs/dit-compare"
    rows = defaultdict(list)
    for line in open(f"{out}/results.jsonl"):
        r = json.loads(line)
        rows[r["config"]].append(r)
    cfgs = {c: json.load(open(f"{out}/{c}-s{rows[c][0]['seed']}/config.json")) for c in rows}
    speed = defaultdict(list)
    try:
        for line in open(f"{out}/speed.jsonl"):
            r = json.loads(line)
            speed[r["config"]].append(r["images"] / r["seconds"])
    except FileNotFoundError:
        pass
    base = next(iter(rows))
    m = lambda xs: statistics.mean(xs)
    print("| config | active heads | seeds | val eps MSE | class acc. (cfg 4) | FID (cfg 4) | class acc. (cfg 1) | FID (cfg 1) | FLOP-ideal speedup | sampling speedup |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c, rs in rows.items():
        ideal = ideal_macs(cfgs[base]) / ideal_macs(cfgs[c])
        sp = f"{statistics.median(speed[c]) / statistics.median(speed[base]):.3f}" if speed[c] and speed[base] else "-"
        acc1 = [r["class_accuracy_cfg1"] for r in rs if r["class_accuracy_cfg1"] is not None]
        fid1 = [r["fid_cfg1"] for r in rs if r["fid_cfg1"] is not None]
        print(f"| {c} | {active_share(cfgs[c]):.3f} | {len(rs)} | {m([r['val_mse'] for r in rs]):.4f} | {m([r['class_accuracy'] for r in rs]):.3f} | "
              f"{m([r['fid'] for r in rs]):.2f} | {m(acc1):.3f} | {m(fid1):.2f} | {ideal:.3f} | {sp} |"
              if acc1 else
              f"| {c} | {active_share(cfgs[c]):.3f} | {len(rs)} | {m([r['val_mse'] for r in rs]):.4f} | {m([r['class_accuracy'] for r in rs]):.3f} | "
              f"{m([r['fid'] for r in rs]):.2f} | - | - | {ideal:.3f} | {sp} |")


if __name__ == "__main__":
    main()
