"""Summarises runs of tools/exp/lm_compare.sh as a markdown table (stdout)."""
import statistics, sys
from runs import iter_runs

root = sys.argv[1]
rows = {}
for cfg, seed, conf, ev, metrics in iter_runs(root):
    last = metrics[-1]
    h = conf["num_attention_heads"]
    active = h if conf["router"] == "none" else conf["shared_heads"] + conf["top_k"]
    rows.setdefault(cfg, []).append(dict(seed=seed, bpb=ev["bits_per_byte"], tokens=last["tokens"],
                                         tps=last["tokens"] / last["elapsed_s"], active=active / h,
                                         train_loss=last["ce"]))
print("| model | active heads | seeds | val bits/byte (mean ± sd) | per seed | train tokens | final train loss (nats, mean) |")
print("|---|---|---|---|---|---|---|")
for cfg in ["mha", "moh-90", "moh-75", "moh-50"] + [c for c in rows if c not in ("mha", "moh-90", "moh-75", "moh-50")]:
    if cfg not in rows:
        continue
    r = sorted(rows[cfg], key=lambda x: x["seed"])
    b = [x["bpb"] for x in r]
    sd = statistics.stdev(b) if len(b) > 1 else float("nan")
    print(f"| {cfg} | {r[0]['active']:.1%} | {len(r)} | {statistics.mean(b):.4f} ± {sd:.4f} | "
          + ", ".join(f"{x['bpb']:.4f}" for x in r)
          + f" | {r[0]['tokens']:.0f} | {statistics.mean(x['train_loss'] for x in r):.4f} |")
