"""Reads the run folders of the tools/exp/*_compare.sh scripts: ROOT/<config>-s<seed>/ holding
config.json, metrics.jsonl and eval.json (runs without eval.json are skipped)."""
import json, os


def iter_runs(root):
    """Yields (config name, seed, config.json, eval.json, metrics.jsonl lines), sorted by folder."""
    for d in sorted(os.listdir(root)):
        p = os.path.join(root, d)
        if not os.path.exists(os.path.join(p, "eval.json")):
            continue
        cfg, seed = d.rsplit("-s", 1)
        metrics = [json.loads(l) for l in open(os.path.join(p, "metrics.jsonl"))]
        yield (cfg, int(seed), json.load(open(os.path.join(p, "config.json"))),
               json.load(open(os.path.join(p, "eval.json"))), metrics)
