"""Per-layer tables of one `moh analyze` output (the tables in docs/analysis.md).

    python3 tools/exp/analysis_layers.py DIR"""
import json, os, statistics, sys

a = json.load(open(os.path.join(sys.argv[1], "analysis.json")))
cats = a["categories"]
cmp = a.get("compare", {}).get("layers", [])
f = lambda v: "-" if v is None else f"{v:.3f}"

print("| layer | CV shared (gate) | CV routed (gate when selected) | CV routed (router p) | load CV (routed heads) |")
print("|---|---|---|---|---|")
for L in a["layers"]:
    cv = L["score_cv"]
    loads = [statistics.pstdev(r) / statistics.mean(r) for r in L["density"] if min(r) < 1.0]
    print(f"| {L['layer']} | {f(cv['shared'])} | {f(cv['routed'])} | {f(cv['routed_p'])} | {f(statistics.mean(loads) if loads else None)} |")
print()
print("| layer | att. sim MoH (both selected) | MoH (all tokens) | MHA twin | out. cos MoH (both selected) | MoH (all tokens) | MHA twin |")
print("|---|---|---|---|---|---|---|")
for i, L in enumerate(a["layers"]):
    c = cmp[i] if i < len(cmp) else {}
    print(f"| {L['layer']} | {f(L['attention_similarity'])} | {f(L['attention_similarity_all_tokens']['all'])} | "
          f"{f(c.get('attention_similarity'))} | {f(L['output_similarity'])} | {f(L['output_similarity_all_tokens']['all'])} | "
          f"{f(c.get('output_similarity'))} |")
print()
print("| layer | rank shared | routed | MHA twin | centred: shared | routed | MHA |")
print("|---|---|---|---|---|---|---|")
for i, L in enumerate(a["layers"]):
    c = cmp[i] if i < len(cmp) else {}
    r, rc = L["effective_rank_mean"], L["effective_rank_centred_mean"]
    g = lambda v: "-" if v is None else f"{v:.2f}"
    print(f"| {L['layer']} | {g(r['shared'])} | {g(r['routed'])} | {g(c.get('effective_rank_mean'))} | "
          f"{g(rc['shared'])} | {g(rc['routed'])} | {g(c.get('effective_rank_centred_mean'))} |")
print()
last = a["layers"][-1]
print("final layer, routed heads: min load (category), max load (category), CV over categories")
for h, row in enumerate(last["density"]):
    if min(row) < 1.0:
        lo, hi = min(range(len(row)), key=row.__getitem__), max(range(len(row)), key=row.__getitem__)
        print(f"| {h} | {row[lo]:.2f} ({cats[lo]}) | {row[hi]:.2f} ({cats[hi]}) | {statistics.pstdev(row) / statistics.mean(row):.3f} |")
