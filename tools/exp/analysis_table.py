"""One markdown row per `moh analyze` output folder: the paper's claims, averaged over layers.

    python3 tools/exp/analysis_table.py LABEL=DIR [LABEL=DIR ...]

Columns: attention-pattern similarity (MoH over tokens selecting both heads, MoH over all tokens,
the --compare twin), head-output cosine (MoH, twin), effective rank (MoH shared, MoH routed, twin),
score CV (shared, routed), and the load CV: per routed head, std/mean over categories of its
density, averaged over the routed heads of the final layer."""
import json, os, statistics, sys

print("| checkpoint | att. sim MoH | MoH (all tokens) | MHA twin | out. cos MoH | MHA twin "
      "| rank shared | rank routed | rank MHA | score CV shared | score CV routed | load CV, final layer |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for arg in sys.argv[1:]:
    label, d = arg.split("=", 1)
    a = json.load(open(os.path.join(d, "analysis.json")))
    m = a["summary"]["mean_over_layers"]
    c = a.get("compare", {}).get("summary", {}).get("mean_over_layers", {})
    last = a["layers"][-1]
    cvs = []
    for row in last["density"]:
        if min(row) < 1.0:  # routed head (shared heads have load 1 everywhere)
            cvs.append(statistics.pstdev(row) / statistics.mean(row))
    f = lambda v: "-" if v is None else f"{v:.3f}"
    print(f"| {label} | {f(m['attention_similarity'])} | {f(m['attention_similarity_all_tokens'])} | "
          f"{f(c.get('attention_similarity'))} | {f(m['output_similarity'])} | {f(c.get('output_similarity'))} | "
          f"{m['effective_rank_shared']:.2f} | {m['effective_rank_routed']:.2f} | "
          + ("-" if c.get("effective_rank") is None else f"{c['effective_rank']:.2f}")
          + f" | {f(m['score_cv_shared'])} | {f(m['score_cv_routed'])} | {f(statistics.mean(cvs) if cvs else None)} |")
