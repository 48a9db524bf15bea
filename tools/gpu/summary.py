#!/usr/bin/env python3
"""The table of a GPU run (tools/gpu/run.sh): moh's rows (`moh bench attention --device cuda --json`,
as JSON lines with a round and an engine: "moh", or "moh-wgmma" / "moh-wgmma1" for the other forward
kernels) and the PyTorch peers' (tools/bench/cuda_peers.py, JSON lines with a round),
each row's median over rounds of its per-round medians; ratios are peer ms / moh ms (> 1: moh
faster). Then the kernels issue's targets, each MET or MISSED with the figures behind it.
usage: summary.py MOH.jsonl TORCH.jsonl"""
import json
import statistics
import sys


def load(paths):
    rows = {}  # (engine, shape, config, what) -> [ms per round]
    tfl = {}
    for path in paths:
        text = open(path).read().strip()
        if not text:
            continue
        recs = json.loads(text) if text.startswith("[") else [json.loads(l) for l in text.splitlines() if l.strip()]
        for r in recs:
            key = (r["engine"], r["shape"], r["config"], r["what"])
            rows.setdefault(key, []).append(r["ms"])
            tfl.setdefault(key, []).append(r.get("tflops", 0.0))
    return {k: statistics.median(v) for k, v in rows.items()}, {k: statistics.median(v) for k, v in tfl.items()}


def main():
    ms, tf = load(sys.argv[1:])
    shapes = []
    for (_, s, _, _) in ms:
        if s not in shapes:
            shapes.append(s)

    def get(engine, shape, prefix, what):
        for (e, s, c, w), v in ms.items():
            if e == engine and s == shape and w == what and c.startswith(prefix):
                return v, tf[(e, s, c, w)], c
        return None, None, None

    targets = []
    print("%-11s %-12s %15s %15s %22s %22s %22s" % ("shape", "what", "cuDNN ms", "FA2 ms", "moh dense (x cuDNN)",
                                                     "moh-75 (x cuDNN)", "moh-50 (x cuDNN)"))
    for s in shapes:
        for what in ("core_fwd", "core_fwdbwd"):
            cd, cdt, _ = get("torch", s, "sdpa_cudnn", what)
            fa, fat, _ = get("torch", s, "sdpa_flash", what)
            cells = []
            for cfg in ("dense", "moh-75", "moh-50"):
                m, mt, _ = get("moh", s, cfg, what)
                cells.append("-" if m is None else "%.3f (%.2fx)" % (m, cd / m if cd else float("nan")))
                if m is not None and cd:
                    targets.append((s, what, cfg, cd / m))
            print("%-11s %-12s %15s %15s %22s %22s %22s" % (
                s, what, "-" if cd is None else "%.3f (%.0f TF)" % (cd, cdt), "-" if fa is None else "%.3f (%.0f TF)" % (fa, fat),
                *cells))
    print()
    print("%-11s %-13s %10s %10s %10s %20s %28s %28s" % ("shape", "what", "torch dense", "official75", "official50",
                                                         "moh dense (x dense)", "moh-75 (x dense, x official)",
                                                         "moh-50 (x dense, x official)"))
    layer_t = []
    for s in shapes:
        for what in ("layer_fwd", "layer_fwdbwd"):
            td, _, _ = get("torch", s, "dense_layer", what)
            o75, _, _ = get("torch", s, "official moh-75", what)
            o50, _, _ = get("torch", s, "official moh-50", what)
            md, _, _ = get("moh", s, "dense", what)
            m75, _, _ = get("moh", s, "moh-75", what)
            m50, _, _ = get("moh", s, "moh-50", what)

            def f(v):
                return "-" if v is None else "%.3f" % v

            def r(m, a, b=None):
                if m is None or a is None:
                    return "-"
                return "%.3f (%.2fx%s)" % (m, a / m, "" if b is None else ", %.2fx" % (b / m))
            print("%-11s %-13s %10s %10s %10s %20s %28s %28s" % (s, what, f(td), f(o75), f(o50), r(md, td), r(m75, td, o75),
                                                                  r(m50, td, o50)))
            layer_t.append((s, what, td, o75, m75))
    mm = [(e, s, c, w) for (e, s, c, w) in ms if e.startswith("moh-") and w in ("core_fwd", "layer_fwd")]
    if mm:
        print("\nmoh's other forward kernels (same configs): their ms, and default (mma.sync) ms / theirs")
        for e, s, c, w in sorted(mm):
            a = ms.get(("moh", s, c, w))
            b = ms[(e, s, c, w)]
            if a:
                print("  %-11s %-11s %-14s %-10s %.3f ms (default %.3f: %.2fx)" % (e[4:], s, c, w, b, a, a / b))
    print("\ntargets (kernels issue; ratios over cuDNN SDPA in the same run):")
    want = {("moh-75", "core_fwd"): 1.2, ("moh-75", "core_fwdbwd"): 1.15, ("moh-50", "core_fwd"): 1.7,
            ("moh-50", "core_fwdbwd"): 1.6, ("dense", "core_fwd"): 0.9, ("dense", "core_fwdbwd"): 0.9}
    for s, what, cfg, ratio in targets:
        w = want.get((cfg, what))
        if w:
            print("  %-11s %-7s %-12s %.2fx (target >= %.2fx): %s" % (s, cfg, what, ratio, w, "MET" if ratio >= w else "MISSED"))
    for s, what, td, o75, m75 in layer_t:
        if m75 and td and o75:
            print("  %-11s moh-75 %-12s vs dense torch layer %.2fx (> 1), vs official %.2fx (>= 1.5): %s" % (
                s, what, td / m75, o75 / m75, "MET" if td / m75 > 1 and o75 / m75 >= 1.5 else "MISSED"))


if __name__ == "__main__":
    main()
