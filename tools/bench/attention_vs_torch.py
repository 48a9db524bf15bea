#!/usr/bin/env python3
"""moh's attention layer vs its PyTorch peers, in the same run: ratios of medians.

One attention layer at the ViT-B shape (768 wide, 12 heads x 64, bidirectional, qkv and proj biases),
B = 1, N tokens. Per round (rounds alternate which engine goes first):
  moh:   `moh bench attention --model vit-b --n N,... --active 0.75,0.5 --pass P --repeats R --json`
         (OMP_NUM_THREADS = --threads): dense MHA (router none) and MoH with h_s = 3 shared heads
         and top_k routed (MoH-75: 3 + 6, MoH-50: 3 + 3), head-sparse path; its median of R;
         with --moh-args, extra options for it (e.g. "--precision bf16" where moh has it);
  torch: torch.set_num_threads(--threads), eager mode, fp32 and torch.autocast("cpu", bfloat16):
         sdpa      dense timm-style layer: qkv Linear, F.scaled_dot_product_attention, proj;
         official  the official MoH module (torch_peers.OfficialMoHAttention: every head computed
                   through SDPA, then gated), same shares; --official-explicit: its non-fused
                   path (q k^T, softmax, @ v) instead;
         median of R calls. Forward: under torch.no_grad(). Train: forward + y.backward(dy).
Both run with the same OMP_WAIT_POLICY (default passive, what moh picks; torch's CPU build uses libgomp).
Prints medians over rounds (of per-round medians) and speedup = torch ms / moh ms (> 1: moh faster).
"""
import argparse
import json
import sys
import time

import bench_common as bc

torch = tp = None  # imported in main (bench_common.start_torch), after OMP_WAIT_POLICY is set

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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", default="4096", help="sequence lengths (default 4096)")
    ap.add_argument("--pass", dest="pas", choices=["forward", "train"], default="forward")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per configuration and round")
    ap.add_argument("--official-explicit", action="store_true", help="official module's non-fused attention path")
    bc.add_torch_peer_args(ap, "attention")
    a = ap.parse_args()
    global torch, tp
    torch, tp = bc.start_torch(a)
    Ns = [int(v) for v in a.n.split(",")]
    precs = [p for p in a.precisions.split(",") if p]
    train = a.pas == "train"
    shares = [1.0, 0.75, 0.5]
    cmd = [a.moh, "bench", "attention", "--model", "vit-b", "--n", a.n, "--active", "0.75,0.5", "--pass", a.pas,
           "--repeats", str(a.repeats), "--json"] + a.moh_args.split()
    mods = {s: build_torch(s, a.official_explicit, 1) for s in shares}
    g = torch.Generator().manual_seed(2)
    xs = {n: torch.rand(1, n, C, generator=g) * 3.4641 - 1.7320 for n in Ns}  # uniform, unit variance
    dys = {n: torch.randn(1, n, C, generator=g) for n in Ns}
    if train:
        for x in xs.values():
            x.requires_grad_(True)
    for n in Ns:  # warm-up (moh warms up inside its run)
        for s in shares:
            for p in precs:
                time_torch(mods[s], xs[n], dys[n], train, p == "bf16", 1)
    moh = {(n, s): [] for n in Ns for s in shares}
    tor = {(n, s, p): [] for n in Ns for s in shares for p in precs}
    for rnd in range(a.rounds):
        for engine in (("moh", "torch") if rnd % 2 == 0 else ("torch", "moh")):
            print(f"[round {rnd + 1}/{a.rounds}] {engine}", file=sys.stderr, flush=True)
            if engine == "moh":
                for r in bc.run_moh(cmd, a.threads):
                    s = round(r["active_target"], 2)
                    if r.get("path", "sparse") == "sparse" and (r["n"], s) in moh:
                        moh[(r["n"], s)].append(r["ms"])
            else:
                for n in Ns:
                    for s in shares:
                        for p in precs:
                            tor[(n, s, p)].append(time_torch(mods[s], xs[n], dys[n], train, p == "bf16", a.repeats))
    print(f"{bc.cpu_model()}; {a.threads} threads (moh OMP_NUM_THREADS, torch.set_num_threads); "
          f"OMP_WAIT_POLICY={a.wait_policy}; load average "
          f"{bc.load_average()}; {a.rounds} rounds x {a.repeats} calls, engines alternated")
    print(f"torch {torch.__version__} (eager; {'forward under no_grad' if not train else 'forward + backward'}); "
          f"official module attention: {'explicit softmax path' if a.official_explicit else 'SDPA (timm fused path)'}")
    print(f"moh: {' '.join(cmd)}")
    print(f"ViT-B attention layer (C {C}, {H} x 64), B = 1, pass {a.pas}; ms = median over rounds (min-max)")
    print(f"{'N':>5} {'config':<8} {'moh ms':>22} " + " ".join(f"{'torch ' + p + ' ms':>22}" for p in precs)
          + "   " + " ".join(f"{'x vs ' + p:>9}" for p in precs) + "   "
          + " ".join(f"{'x vs sdpa ' + p:>14}" for p in precs))
    rows = []
    for n in Ns:
        for s in shares:
            name = "dense" if s == 1.0 else f"MoH-{int(round(s * 100))}"
            mm = moh[(n, s)]
            if not mm:
                continue
            same = [bc.med(tor[(n, s, p)]) / bc.med(mm) for p in precs]  # vs the same layer in torch
            vs_sdpa = [bc.med(tor[(n, 1.0, p)]) / bc.med(mm) for p in precs]  # vs torch dense SDPA
            print(f"{n:>5} {name:<8} {bc.cell(mm):>22} " + " ".join(f"{bc.cell(tor[(n, s, p)]):>22}" for p in precs)
                  + "   " + " ".join(f"{v:>9.3f}" for v in same) + "   " + " ".join(f"{v:>14.3f}" for v in vs_sdpa))
            rows.append({"n": n, "config": name, "moh_ms": mm, "torch_ms": {p: tor[(n, s, p)] for p in precs},
                         "speedup_vs_same": dict(zip(precs, same)), "speedup_vs_sdpa_dense": dict(zip(precs, vs_sdpa))})
    print("(torch columns: the same layer in torch: sdpa for dense, the official module for MoH; "
          "'x vs P' = torch P ms / moh ms; 'x vs sdpa P' = torch dense SDPA ms in P / moh ms)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cpu": bc.cpu_model(), "threads": a.threads, "load": bc.load_average(), "pass": a.pas,
                       "rounds": a.rounds, "repeats": a.repeats, "torch": torch.__version__, "moh_cmd": cmd,
                       "official_explicit": a.official_explicit, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
