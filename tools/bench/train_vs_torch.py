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
Per round (rounds alternate which engine goes first):
  moh:   `moh bench train --configs C1,C2 --path sparse --batch B --seq T --steps S --repeats 1 --json`
         (OMP_NUM_THREADS = --threads; head-sparse attention, moh train's default path; it checks
         the step against its reference path and warms up before timing);
  torch: torch.set_num_threads(--threads), eager, S steps per model and precision, timed as one.
Both run with the same OMP_WAIT_POLICY (default passive, what moh picks). --moh-precision bf16 or
both: moh also (or only) with its bf16 compute (fp32 master weights), one row per precision.
Prints tokens/s medians over rounds and ratio = moh tokens/s / torch tokens/s (> 1: moh faster).
"""
import argparse
import json
import os
import sys
import time

import bench_common as bc

torch = tp = None  # imported in main (bench_common.start_torch), after OMP_WAIT_POLICY is set


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
    global torch, tp
    torch, tp = bc.start_torch(a)
    names = [n for n in a.configs.split(",") if n]
    cfgs = {n: load_config(n) for n in names}
    c0 = cfgs[names[0]]
    T = a.seq or c0["max_position_embeddings"]
    B, V = a.batch, c0["vocab_size"]
    precs = [p for p in a.precisions.split(",") if p]
    from transformers import LlamaForCausalLM
    lc = llama_config(c0)
    runs = []
    for p in precs:
        torch.manual_seed(7)
        runs.append(TorchRun(f"llama {p}", LlamaForCausalLM(lc), None, p == "bf16", B, T, V))
    moh_peer = {}
    for n in names:
        c = cfgs[n]
        if c.get("router", "none") != "learned" or not c.get("top_k"):
            continue
        for p in precs:
            torch.manual_seed(7)
            m, lf = tp.moh_llama(llama_config(c), c["shared_heads"], c["top_k"], c.get("load_balance_coef", 0.0))
            r = TorchRun(f"llama-moh {c['shared_heads']}+{c['top_k']} {p}", m, lf, p == "bf16", B, T, V)
            runs.append(r)
            moh_peer[(n, p)] = r
    nparams = sum(x.numel() for x in runs[0].model.parameters())
    for r in runs:  # warm-up
        r.steps(1)
    cmd = [a.moh, "bench", "train", "--configs", ",".join(names), "--path", "sparse", "--batch", str(B), "--seq",
           str(T), "--steps", str(a.steps), "--repeats", "1", "--precision", a.moh_precision, "--json"] + a.moh_args.split()
    mprecs = ["fp32", "bf16"] if a.moh_precision == "both" else [a.moh_precision]
    moh = {(n, mp): [] for n in names for mp in mprecs}
    for rnd in range(a.rounds):
        for engine in (("moh", "torch") if rnd % 2 == 0 else ("torch", "moh")):
            print(f"[round {rnd + 1}/{a.rounds}] {engine}", file=sys.stderr, flush=True)
            if engine == "moh":
                for row in bc.run_moh(cmd, a.threads):
                    if "config" in row:
                        moh[(row["config"], row.get("precision", "fp32"))].append(row["tokens_per_s"])
            else:
                for r in runs:
                    r.t.append(B * T / r.steps(a.steps))
    dense = {p: runs[i] for i, p in enumerate(precs)}
    print(f"{bc.cpu_model()}; {a.threads} threads (moh OMP_NUM_THREADS, torch.set_num_threads); "
          f"OMP_WAIT_POLICY={a.wait_policy}; load average {bc.load_average()}; {a.rounds} rounds x {a.steps} steps, "
          "engines alternated")
    import transformers
    print(f"torch {torch.__version__}, transformers {transformers.__version__} (eager, SDPA attention); "
          f"LlamaForCausalLM {nparams / 1e6:.2f}M parameters; B={B} T={T} ({B * T} tokens/step); AdamW + clip 1.0")
    print(f"moh: {' '.join(cmd)}")
    print("tokens/s: median over rounds (min-max)")
    for r in runs:
        print(f"  torch {r.name:<22} {bc.cell(r.t, 0):>24}")
    for n, mp in moh:
        print(f"  moh   {n + ' ' + mp:<22} {bc.cell(moh[(n, mp)], 0):>24}")
    print(f"{'moh config':<17} " + " ".join(f"{'x llama ' + p:>14}" for p in precs) + " "
          + " ".join(f"{'x llama-moh ' + p:>16}" for p in precs))
    rows = []
    for n, mp in moh:
        mm = bc.med(moh[(n, mp)])
        vs_dense = [mm / bc.med(dense[p].t) for p in precs]
        vs_moh = [mm / bc.med(moh_peer[(n, p)].t) if (n, p) in moh_peer else None for p in precs]
        print(f"{n + ' ' + mp:<17} " + " ".join(f"{v:>14.3f}" for v in vs_dense) + " "
              + " ".join(f"{v:>16.3f}" if v else f"{'-':>16}" for v in vs_moh))
        rows.append({"config": n, "moh_precision": mp, "moh_tokens_per_s": moh[(n, mp)], "ratio_vs_llama": dict(zip(precs, vs_dense)),
                     "ratio_vs_llama_moh": dict(zip(precs, vs_moh))})
    print("(ratio = moh tokens/s / torch tokens/s of the medians)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cpu": bc.cpu_model(), "threads": a.threads, "load": bc.load_average(), "batch": B, "seq": T,
                       "steps": a.steps, "rounds": a.rounds, "torch": torch.__version__, "moh_cmd": cmd,
                       "torch_tokens_per_s": {r.name: r.t for r in runs}, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
