#!/usr/bin/env python3
"""moh's attention layer vs its PyTorch peers, in the same run: ratios of medians.

One attention layer at the ViT-B shape (768 wide, 12 heads x 64, bidirectional, qkv and proj biases),
B = 1, N tokens. Per round and wait policy (rounds alternate which engine goes first; each engine in its own process):
  moh:   `moh bench attention --model vit-b --n N,... --active 0.75,0.5 --pass P --repeats R --json`
         (OMP_NUM_THREADS = --threads): dense MHA (router none) and MoH with h_s = 3 shared heads
         and top_k routed (MoH-75: 3 + 6, MoH-50: 3 + 3), head-sparse path; its median of R;
         with --moh-args, extra options for it (e.g. "--precision bf16" where moh has it);
  torch: this script's --worker: torch.set_num_threads(--threads), eager mode, fp32 and
         torch.autocast("cpu", bfloat16), after one warm-up call each:
         sdpa      dense timm-style layer: qkv Linear, F.scaled_dot_product_attention, proj;
         official  the official MoH module (torch_peers.OfficialMoHAttention: every head computed
                   through SDPA, then gated), same shares; --official-explicit: its non-fused
                   path (q k^T, softmax, @ v) instead;
         median of R calls. Forward: under torch.no_grad(). Train: forward + y.backward(dy).
--wait-policy (bench_common): own (each engine's default), passive, active; the headline takes each
engine's best. Prints medians over rounds (of per-round medians) per policy and the headline speedup
= torch ms / moh ms (> 1: moh faster).
"""
import argparse
import json
import sys
import time

import bench_common as bc

torch = tp = None  # imported in the worker only (bench_common.start_torch)

C, H = 768, 12
SPLITS = {1.0: (0, 0), 0.75: (3, 6), 0.5: (3, 3)}  # share -> (h_s, top_k), as moh bench attention


def build_torch(share, explicit, seed):
    torch.manual_seed(seed)
    hs, k = SPLITS[share]
    m = tp.dense_attention(C, H) if share == 1.0 else tp.OfficialMoHAttention(C, H, hs, k, fused=not explicit)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 0.02)
    return m


def time_torch(m, x, dy, train, bf16, reps):
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            if train:
                y = m(x)
                y.backward(dy)
            else:
                with torch.no_grad():
                    m(x)
        ts.append(time.perf_counter() - t0)
        if train:
            m.zero_grad(set_to_none=True)
            x.grad = None
    return bc.med(ts) * 1e3


def worker(a, Ns, shares, precs, train):
    """The torch side of one round: every layer, N and precision timed; prints JSON."""
    global torch, tp
    torch, tp = bc.start_torch(a)
    mods = {s: build_torch(s, a.official_explicit, 1) for s in shares}
    g = torch.Generator().manual_seed(2)
    xs = {n: torch.rand(1, n, C, generator=g) * 3.4641 - 1.7320 for n in Ns}  # uniform, unit variance
    dys = {n: torch.randn(1, n, C, generator=g) for n in Ns}
    if train:
        for x in xs.values():
            x.requires_grad_(True)
    ms = {}
    for n in Ns:
        for s in shares:
            for p in precs:
                time_torch(mods[s], xs[n], dys[n], train, p == "bf16", 1)  # warm-up
                ms[f"{n} {s} {p}"] = time_torch(mods[s], xs[n], dys[n], train, p == "bf16", a.repeats)
    json.dump({"ms": ms, "torch": torch.__version__}, sys.stdout)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", default="4096", help="sequence lengths (default 4096)")
    ap.add_argument("--pass", dest="pas", choices=["forward", "train"], default="forward")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per configuration and round")
    ap.add_argument("--official-explicit", action="store_true", help="official module's non-fused attention path")
    bc.add_torch_peer_args(ap, "attention")
    a = ap.parse_args()
    Ns = [int(v) for v in a.n.split(",")]
    precs = [p for p in a.precisions.split(",") if p]
    train = a.pas == "train"
    shares = [1.0, 0.75, 0.5]
    if a.worker:
        return worker(a, Ns, shares, precs, train)
    pols = bc.policies(a)
    cmd = [a.moh, "bench", "attention", "--model", "vit-b", "--n", a.n, "--active", "0.75,0.5", "--pass", a.pas,
           "--repeats", str(a.repeats), "--json"] + a.moh_args.split()
    moh = {(n, s): {p: [] for p in pols} for n in Ns for s in shares}
    tor = {(n, s, q): {p: [] for p in pols} for n in Ns for s in shares for q in precs}
    info = {}
    for rnd in range(a.rounds):
        for pol in pols:
            for engine in (("moh", "torch") if rnd % 2 == 0 else ("torch", "moh")):
                print(f"[round {rnd + 1}/{a.rounds}, {pol}] {engine}", file=sys.stderr, flush=True)
                if engine == "moh":
                    for r in bc.run_moh(cmd, a.threads, pol):
                        s = round(r["active_target"], 2)
                        if r.get("path", "sparse") == "sparse" and (r["n"], s) in moh:
                            moh[(r["n"], s)][pol].append(r["ms"])
                else:
                    info = bc.run_worker(a, pol)
                    for n in Ns:
                        for s in shares:
                            for q in precs:
                                tor[(n, s, q)][pol].append(info["ms"][f"{n} {s} {q}"])
    print(bc.conditions(a) + f" x {a.repeats} calls")
    print(f"torch {info.get('torch')} (eager; {'forward under no_grad' if not train else 'forward + backward'}); "
          f"official module attention: {'explicit softmax path' if a.official_explicit else 'SDPA (timm fused path)'}")
    print(f"moh: {' '.join(cmd)}")
    print(f"ViT-B attention layer (C {C}, {H} x 64), B = 1, pass {a.pas}; ms = median over rounds (min-max)")
    print(f"{'N':>5} {'config':<8} {'engine':<11} " + " ".join(f"{p:>22}" for p in pols))
    for n in Ns:
        for s in shares:
            name = "dense" if s == 1.0 else f"MoH-{int(round(s * 100))}"
            print(f"{n:>5} {name:<8} {'moh':<11} " + " ".join(f"{bc.cell(moh[(n, s)][p]):>22}" for p in pols))
            for q in precs:
                print(f"{'':>5} {'':<8} {'torch ' + q:<11} " + " ".join(f"{bc.cell(tor[(n, s, q)][p]):>22}" for p in pols))
    print("headline, each engine at its best policy: 'x P' = torch ms (the same layer: SDPA for dense, the "
          "official module for MoH) / moh ms; 'x sdpa P' = torch dense SDPA ms / moh ms")
    rows = []
    for n in Ns:
        for s in shares:
            name = "dense" if s == 1.0 else f"MoH-{int(round(s * 100))}"
            if not any(moh[(n, s)].values()):
                continue
            mpol, mm = bc.best_policy(moh[(n, s)], higher=False)
            row = {"n": n, "config": name, "moh_policy": mpol, "moh_ms": moh[(n, s)], "torch_ms": {}}
            parts = []
            for q in precs:
                tpol, tv = bc.best_policy(tor[(n, s, q)], higher=False)
                dpol, dv = bc.best_policy(tor[(n, 1.0, q)], higher=False)
                row["torch_ms"][q] = tor[(n, s, q)]
                row[f"speedup_vs_same_{q}"] = bc.med(tv) / bc.med(mm)
                row[f"speedup_vs_sdpa_dense_{q}"] = bc.med(dv) / bc.med(mm)
                parts.append(f"x {q} ({tpol}) {bc.med(tv) / bc.med(mm):.3f}; x sdpa {q} ({dpol}) {bc.med(dv) / bc.med(mm):.3f}")
            print(f"{n:>5} {name:<8} moh {bc.med(mm):.2f} ms ({mpol}): " + "; ".join(parts))
            rows.append(row)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cpu": bc.cpu_model(), "threads": a.threads, "load": bc.load_average(), "pass": a.pas,
                       "rounds": a.rounds, "repeats": a.repeats, "policies": pols, "torch": info.get("torch"),
                       "moh_cmd": cmd, "official_explicit": a.official_explicit, "rows": rows}, f, indent=1)
    return 0

if __name__ == "__main__":
    sys.exit(main())
