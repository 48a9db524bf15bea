#!/usr/bin/env python3
"""moh LM training vs PyTorch (transformers LlamaForCausalLM), in the same run: tokens/s ratios.

The models: moh's LM configs (default mha and moh-75 from configs/) and, in torch, a
transformers LlamaConfig with the same parameters (hidden, layers, heads, kv heads, intermediate,
rms_norm_eps, rope_theta, vocab, positions, untied head; no biases; SDPA attention) and
  llama      LlamaForCausalLM (dense: the peer of every moh config);
  llama-moh  the same model with the official MoH attention module in every layer
             (torch_peers.moh_llama: learned router with the config's shared_heads / top_k, every
             head computed through causal SDPA, then gated; loss + load_balance_coef * l_aux),
             built when a config has a learned router;
each in fp32 and under torch.autocast("cpu", torch.bfloat16) (fp32 master weights).
One training step, the same in both engines: forward + backward on a random batch of B x T
tokens (moh: random bytes; torch: random ids < vocab), gradient clipping to norm 1, AdamW
(betas 0.9/0.95, eps 1e-8, weight decay 0.1, lr 1e-4).
Per round and wait policy (rounds alternate which engine goes first; each engine in its own process):
  moh:   `moh bench train --configs C1,C2 --path sparse --batch B --seq T --steps S --repeats 1 --json`
         (OMP_NUM_THREADS = --threads; head-sparse attention, moh train's default path; it checks
         the step against its reference path and warms up before timing);
  torch: this script's --worker: torch.set_num_threads(--threads), eager, one warm-up step, then S
         steps per model and precision, timed as one.
--wait-policy (bench_common): own (each engine's default), passive, active. --moh-precision bf16 or
both: moh also (or only) with its bf16 compute (fp32 master weights), one row per precision.
Prints tokens/s medians over rounds per policy, then the headline: ratio = moh tokens/s / torch
tokens/s (> 1: moh faster), each engine at its best policy.
"""
import argparse
import json
import os
import sys
import time

import bench_common as bc

torch = tp = None  # imported in the worker only (bench_common.start_torch)


def load_config(name):
    path = name if os.path.exists(name) else os.path.join("configs", name + ".json")
    with open(path) as f:
        return json.load(f)


def llama_config(c):
    from transformers import LlamaConfig
    return LlamaConfig(hidden_size=c["hidden_size"], num_hidden_layers=c["num_hidden_layers"],
                       num_attention_heads=c["num_attention_heads"],
                       num_key_value_heads=c.get("num_key_value_heads", c["num_attention_heads"]),
                       intermediate_size=c["intermediate_size"], rms_norm_eps=c["rms_norm_eps"],
                       rope_theta=c["rope_theta"], vocab_size=c["vocab_size"],
                       max_position_embeddings=c["max_position_embeddings"],
                       tie_word_embeddings=c.get("tie_word_embeddings", False), attention_bias=False,
                       mlp_bias=False, attn_implementation="sdpa", use_cache=False)


class TorchRun:
    def __init__(self, name, model, loss_fn, bf16, B, T, V):
        self.name, self.model, self.loss_fn, self.bf16 = name, model, loss_fn, bf16
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
        g = torch.Generator().manual_seed(99)
        self.ids = torch.randint(0, V, (B, T + 1), generator=g)
        self.t = []
        model.train()

    def steps(self, n):
        t0 = time.perf_counter()
        for _ in range(n):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
                logits = self.model(input_ids=self.ids[:, :-1]).logits
                loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                         self.ids[:, 1:].reshape(-1))
                if self.loss_fn:
                    loss = self.loss_fn(loss)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        return (time.perf_counter() - t0) / n


def worker(a, names, cfgs, B, T, V, precs):
    """The torch side of one round: builds, warms up and times every torch model; prints JSON."""
    global torch, tp
    torch, tp = bc.start_torch(a)
    from transformers import LlamaForCausalLM
    import transformers
    runs = []
    for p in precs:
        torch.manual_seed(7)
        runs.append(TorchRun(f"llama {p}", LlamaForCausalLM(llama_config(cfgs[names[0]])), None, p == "bf16", B, T, V))
    for n in names:
        c = cfgs[n]
        if c.get("router", "none") != "learned" or not c.get("top_k"):
            continue
        for p in precs:
            torch.manual_seed(7)
            m, lf = tp.moh_llama(llama_config(c), c["shared_heads"], c["top_k"], c.get("load_balance_coef", 0.0))
            runs.append(TorchRun(f"llama-moh {n} {p}", m, lf, p == "bf16", B, T, V))
    for r in runs:  # warm-up
        r.steps(1)
    tps = {r.name: B * T / r.steps(a.steps) for r in runs}
    json.dump({"tokens_per_s": tps, "torch": torch.__version__, "transformers": transformers.__version__,
               "params": sum(x.numel() for x in runs[0].model.parameters())}, sys.stdout)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="mha,moh-75", help="moh LM configs (default mha,moh-75)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=0, help="tokens per sequence (default: the config's max_position_embeddings)")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per model, precision and round")
    ap.add_argument("--moh-precision", default="fp32", choices=["fp32", "bf16", "both"],
                    help="moh bench train --precision (bf16: moh's bf16 compute, fp32 master weights)")
    bc.add_torch_peer_args(ap, "train")
    a = ap.parse_args()
    names = [n for n in a.configs.split(",") if n]
    cfgs = {n: load_config(n) for n in names}
    c0 = cfgs[names[0]]
    T = a.seq or c0["max_position_embeddings"]
    B, V = a.batch, c0["vocab_size"]
    precs = [p for p in a.precisions.split(",") if p]
    if a.worker:
        return worker(a, names, cfgs, B, T, V, precs)
    pols = bc.policies(a)
    cmd = [a.moh, "bench", "train", "--configs", ",".join(names), "--path", "sparse", "--batch", str(B), "--seq",
           str(T), "--steps", str(a.steps), "--repeats", "1", "--precision", a.moh_precision, "--json"] + a.moh_args.split()
    mprecs = ["fp32", "bf16"] if a.moh_precision == "both" else [a.moh_precision]
    moh = {(n, mp): {p: [] for p in pols} for n in names for mp in mprecs}
    tor, info = {}, {}
    for rnd in range(a.rounds):
        for pol in pols:
            for engine in (("moh", "torch") if rnd % 2 == 0 else ("torch", "moh")):
                print(f"[round {rnd + 1}/{a.rounds}, {pol}] {engine}", file=sys.stderr, flush=True)
                if engine == "moh":
                    for row in bc.run_moh(cmd, a.threads, pol):
                        if "config" in row:
                            moh[(row["config"], row.get("precision", "fp32"))][pol].append(row["tokens_per_s"])
                else:
                    info = bc.run_worker(a, pol)
                    for name, v in info["tokens_per_s"].items():
                        tor.setdefault(name, {p: [] for p in pols})[pol].append(v)
    print(bc.conditions(a) + f" x {a.steps} steps")
    print(f"torch {info['torch']}, transformers {info['transformers']} (eager, SDPA attention); "
          f"LlamaForCausalLM {info['params'] / 1e6:.2f}M parameters; B={B} T={T} ({B * T} tokens/step); AdamW + clip 1.0")
    print(f"moh: {' '.join(cmd)}")
    print("tokens/s: median over rounds (min-max), per wait policy")
    print(f"  {'engine run':<30} " + " ".join(f"{p:>24}" for p in pols))
    for name, per in tor.items():
        print(f"  torch {name:<24} " + " ".join(f"{bc.cell(per[p], 0):>24}" for p in pols))
    for (n, mp), per in moh.items():
        print(f"  moh   {n + ' ' + mp:<24} " + " ".join(f"{bc.cell(per[p], 0):>24}" for p in pols))
    print("headline: each engine at its best policy (ratio = moh tokens/s / torch tokens/s of the medians)")
    rows = []
    for (n, mp), per in moh.items():
        mpol, mv = bc.best_policy(per)
        row = {"config": n, "moh_precision": mp, "moh_policy": mpol, "moh_tokens_per_s": per}
        parts = []
        for p in precs:
            for peer in (f"llama {p}", f"llama-moh {n} {p}"):
                if peer not in tor:
                    continue
                tpol, tv = bc.best_policy(tor[peer])
                ratio = bc.med(mv) / bc.med(tv)
                row[f"ratio_vs_{peer.split()[0]}_{p}"] = ratio
                row[f"torch_policy_{peer.split()[0]}_{p}"] = tpol
                parts.append(f"x {peer.split()[0]} {p} ({tpol}) {ratio:.3f}")
        print(f"  moh {n} {mp} ({mpol}): " + "; ".join(parts))
        rows.append(row)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cpu": bc.cpu_model(), "threads": a.threads, "load": bc.load_average(), "batch": B, "seq": T,
                       "steps": a.steps, "rounds": a.rounds, "policies": pols, "torch": info.get("torch"),
                       "moh_cmd": cmd, "torch_tokens_per_s": tor, "rows": rows}, f, indent=1)
    return 0

if __name__ == "__main__":
    sys.exit(main())
