"""Summarises runs of tools/exp/vit_compare.sh as a markdown table (stdout).

Accuracy is `moh eval --json` of the final checkpoint on all t10k images (no model selection);
CPU s is the trainer's process CPU time (all threads), from the last line of metrics.jsonl."""
import json, os, statistics, sys

root = sys.argv[1]
rows = {}
for d in sorted(os.listdir(root)):
    p = os.path.join(root, d)
    if not os.path.exists(os.path.join(p, "eval.json")):
        continue
    cfg, seed = d.rsplit("-s", 1)
    ev = json.load(open(os.path.join(p, "eval.json")))
    conf = json.load(open(os.path.join(p, "config.json")))
    last = [json.loads(l) for l in open(os.path.join(p, "metrics.jsonl"))][-1]
    h = conf["num_heads"]
    active = h if conf["router"] == "none" else conf["shared_heads"] + conf["top_k"]
    rows.setdefault(cfg, []).append(dict(seed=int(seed), acc=ev["accuracy"], epochs=last["epoch"],
                                         cpu=last["cpu_s"], active=f"{active}/{h}"))
order = ["vit-mha", "vit-moh-90", "vit-moh-75", "vit-moh-50"]
print("| config | heads active | epochs | seeds | test accuracy (mean ± sd) | per seed | CPU s per run (mean) |")
print("|---|---|---|---|---|---|---|")
for cfg in order + sorted(c for c in rows if c not in order):
    if cfg not in rows:
        continue
    r = sorted(rows[cfg], key=lambda x: x["seed"])
    a = [100 * x["acc"] for x in r]
    sd = f"{statistics.stdev(a):.2f}" if len(a) > 1 else "-"
    print(f"| {cfg} | {r[0]['active']} | {r[0]['epochs']:g} | {len(r)} | {statistics.mean(a):.2f} ± {sd} % | "
          + ", ".join(f"{x:.2f}" for x in a) + f" | {statistics.mean(x['cpu'] for x in r):.0f} |")
