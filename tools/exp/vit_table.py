"""Summarises runs of tools/exp/vit_compare.sh as a markdown table (stdout).

Accuracy is `moh eval --json` of the final checkpoint on all t10k images (no model selection);
Run times are left out: they depend on what else the machine ran (see docs/results-vit.md)."""
import statistics, sys
from runs import iter_runs

root = sys.argv[1]
rows = {}
for cfg, seed, conf, ev, metrics in iter_runs(root):
    last = metrics[-1]
    h = conf["num_heads"]
    active = h if conf["router"] == "none" else conf["shared_heads"] + conf["top_k"]
    rows.setdefault(cfg, []).append(dict(seed=seed, acc=ev["accuracy"], epochs=last["epoch"],
                                         active=f"{active}/{h}"))
order = ["vit-mha", "vit-moh-90", "vit-moh-75", "vit-moh-50"]
print("| config | heads active | epochs | seeds | test accuracy (mean ± sd) | per seed |")
print("|---|---|---|---|---|---|")
for cfg in order + sorted(c for c in rows if c not in order):
    if cfg not in rows:
        continue
    r = sorted(rows[cfg], key=lambda x: x["seed"])
    a = [100 * x["acc"] for x in r]
    sd = f"{statistics.stdev(a):.2f}" if len(a) > 1 else "-"
    print(f"| {cfg} | {r[0]['active']} | {r[0]['epochs']:g} | {len(r)} | {statistics.mean(a):.2f} ± {sd} % | "
          + ", ".join(f"{x:.2f}" for x in a) + " |")
