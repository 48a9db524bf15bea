"""Test accuracy per epoch of the runs of tools/exp/vit_compare.sh (needs matplotlib).

    python3 tools/exp/vit_curves.py RUN_ROOT OUT.png"""
import json, os, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

root, out = sys.argv[1], sys.argv[2]
colors = {"vit-mha": "tab:orange", "vit-moh-90": "tab:green", "vit-moh-75": "tab:blue", "vit-moh-50": "tab:purple"}
fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
seen = set()
for d in sorted(os.listdir(root)):
    p = os.path.join(root, d, "metrics.jsonl")
    if not os.path.exists(p):
        continue
    cfg = d.rsplit("-s", 1)[0]
    if cfg not in colors:  # the patch-7 comparison only
        continue
    pts = [json.loads(l) for l in open(p)]
    pts = [(m["epoch"], 100 * m["test_acc"]) for m in pts if "test_acc" in m]
    for ax in axes:
        ax.plot(*zip(*pts), color=colors.get(cfg, "gray"), lw=1.4, alpha=0.85,
                label=None if cfg in seen else cfg)
    seen.add(cfg)
axes[0].set_ylim(70, 92)
axes[1].set_xlim(10, 25.3)
axes[1].set_ylim(87, 91.2)
for ax, t in zip(axes, ["all epochs", "epochs 10-25 (zoom)"]):
    ax.set_xlabel("epoch")
    ax.set_ylabel("t10k test accuracy (%)")
    ax.set_title(t)
    ax.grid(alpha=0.3)
axes[1].axhline(90, color="k", lw=0.8, ls="--")
axes[0].legend(title="one line per seed", loc="lower right")
fig.suptitle("MoH-ViT vs MHA on Fashion-MNIST (same recipe, 25 epochs)")
fig.tight_layout()
fig.savefig(out, dpi=110)
