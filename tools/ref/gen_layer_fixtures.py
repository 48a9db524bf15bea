#!/usr/bin/env python3
"""Writes the MoH layer fixtures tests/fixtures/layer/<name>/ from the PyTorch reference.

Regenerate (from the repository root; needs torch, numpy, safetensors):
    python3 tools/ref/gen_layer_fixtures.py                  # all fixtures + README.md
    python3 tools/ref/gen_layer_fixtures.py --only qnorm_llama
    python3 tools/ref/gen_layer_fixtures.py --verify         # recompute expected from the stored
                                                             # inputs and compare, write nothing
Each folder holds
    config.json               the LAYER.json
    weights.safetensors       F32, official names (fused qkv/proj or split q/k/v/o_proj, wg*)
    input.safetensors         x  [B, N, C] F32
    grad_output.safetensors   dy [B, N, C] F32
    expected.safetensors      F32: y [B,N,C], gates [B,N,h], lb_loss [1], grad.x, grad.<weight>
Expected values are computed in float64 (tools/ref/moh_layer_ref.py) from the float32 inputs and
weights, then rounded to F32. Gradients are those of L = sum(y * dy) + load_balance_coef * lb_loss.
A gradient that is zero in exact arithmetic (float64 result below 1e-9 of the largest gradient,
e.g. grad of the k bias without RoPE, grad of k for N = 1) is stored as exact zeros.

Data come from fixed seeds (torch.Generator, CPU); the same torch version rewrites identical
files. The data of a fixture are redrawn (next seed) until every token's top-k choice is at least
1e-3 (relative) away from a tie, so a float32 engine must select exactly the same heads.
"""

import argparse
import json
import os
import sys

import numpy as np
import torch
from safetensors.numpy import load_file as np_load
from safetensors.torch import save_file as torch_save

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moh_layer_ref as R  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT_DIR = os.path.join(ROOT, "tests", "fixtures", "layer")
MARGIN = 1e-3
ZERO_GRAD_REL = 1e-9


def layer(C, h, router, hs=None, K=None, h_kv=None, d=None, causal=False, qkv_bias=False,
          proj_bias=False, rope=None, beta=0.0, omit=()):
    cfg = {
        "hidden_size": C, "num_attention_heads": h,
        "num_key_value_heads": h if h_kv is None else h_kv,
        "head_dim": C // h if d is None else d,
        "shared_heads": h if hs is None else hs, "top_k": 0 if K is None else K,
        "router": router, "causal": causal, "qkv_bias": qkv_bias, "proj_bias": proj_bias,
        "rope_theta": rope, "load_balance_coef": beta,
    }
    for k in omit:  # keys left to their documented defaults
        del cfg[k]
    return cfg


# name, config, weight style, B, N, seed, what it covers
FIXTURES = [
    ("learned_dit_fused",
     layer(32, 8, "learned", hs=2, K=2, qkv_bias=True, proj_bias=True, beta=0.01),
     "fused", 2, 7, 101,
     "learned router, DiT/ViT layout: h=8, h_s=2, K=2 of E=6, fused qkv/proj with biases, "
     "bidirectional, beta=0.01"),
    ("learned_hs0_k1_causal",
     layer(16, 4, "learned", hs=0, K=1, causal=True, beta=0.5),
     "fused", 1, 13, 102,
     "h_s=0 (gates = r alone, no wg_0/wg_1), K=1, causal, no biases, beta=0.5"),
    ("learned_hs1_const_shared",
     layer(24, 6, "learned", hs=1, K=2, proj_bias=True, beta=0.01),
     "fused", 3, 7, 103,
     "h_s=1: constant shared gate s=1 (wg_0 present, no wg_1), K=2 of E=5, B=3, "
     "proj bias only"),
    ("learned_hs3_k1_split_rope",
     layer(32, 8, "learned", hs=3, K=1, causal=True, qkv_bias=True, rope=10000.0, beta=0.5),
     "split", 2, 13, 104,
     "h_s=3, K=1 of E=5, split q/k/v/o_proj with q/k/v biases, causal, RoPE theta 1e4, beta=0.5"),
    ("learned_all_routed_on",
     layer(24, 6, "learned", hs=2, K=4, qkv_bias=True, proj_bias=True, beta=0.5),
     "fused", 2, 7, 105,
     "K=E=4: every routed head on (mask all 1, r = K*p), lb_loss = E exactly, beta=0.5"),
    ("learned_k0_soft",
     layer(16, 4, "learned", hs=4, K=0, proj_bias=True, beta=0.5),
     "fused", 2, 7, 106,
     "K=0, h_s=h=4: all heads shared, soft reweighting gates h*softmax(W_s x) (wg_1 only), "
     "lb_loss 0 although beta=0.5"),
    ("learned_k0_h1",
     layer(8, 1, "learned", hs=1, K=0, causal=True, omit=("num_key_value_heads", "head_dim")),
     "split", 3, 7, 107,
     "h=1, K=0: gate constant 1, no router weights; num_key_value_heads and head_dim absent "
     "(defaults h and C/h)"),
    ("learned_gqa_rope500k",
     layer(24, 6, "learned", hs=2, K=2, h_kv=2, causal=True, qkv_bias=True, proj_bias=True,
           rope=500000.0, beta=0.01),
     "split", 2, 13, 108,
     "GQA h=6, h_kv=2 (query head i -> KV head i//3), h_s=2, K=2, split with all biases, causal, "
     "RoPE theta 5e5"),
    ("learned_headdim_ne",
     layer(24, 4, "learned", hs=1, K=2, d=8, qkv_bias=True, proj_bias=True),
     "fused", 1, 7, 109,
     "head_dim 8 != C/h = 6 (h*d = 32 != C = 24), h_s=1, K=2 of E=3, fused with biases, beta=0"),
    ("learned_n1_gqa_b3",
     layer(16, 4, "learned", hs=1, K=2, h_kv=1, causal=True, rope=10000.0, beta=0.01),
     "fused", 3, 1, 110,
     "N=1, B=3: one key per sequence (grad of k is exactly 0), GQA h=4, h_kv=1, fused GQA qkv "
     "layout [(h+2h_kv)d, C], RoPE at position 0 only"),
    ("qnorm_llama",
     layer(32, 8, "query_norm", hs=4, K=2, causal=True, rope=10000.0),
     "split", 2, 13, 111,
     "query-norm router (MoH-LLaMA3 style): h=8, h_s=4, K=2, split, no biases, causal, RoPE 1e4, "
     "beta=0 (binary gates, constants in backward)"),
    ("qnorm_gqa_beta",
     layer(32, 8, "query_norm", hs=4, K=2, h_kv=2, causal=True, qkv_bias=True, rope=500000.0,
           beta=0.5),
     "split", 1, 13, 112,
     "query-norm router with GQA h=8, h_kv=2, q/k/v biases (norms include q bias), RoPE 5e5, "
     "beta=0.5: lb_loss gradient reaches q_proj through the norms and the std"),
    ("qnorm_fused_headdim",
     layer(20, 6, "query_norm", hs=2, K=3, d=4, qkv_bias=True, proj_bias=True, beta=0.01,
           omit=("rope_theta",)),
     "fused", 2, 7, 113,
     "query-norm router on the fused layout, h=6, h_s=2, K=3 of E=4, head_dim 4 != C/h, "
     "bidirectional, rope_theta absent, beta=0.01"),
    ("none_dense_fused",
     layer(16, 4, "none", qkv_bias=True, proj_bias=True, omit=("load_balance_coef",)),
     "fused", 2, 7, 114,
     "router none: dense MHA, every gate 1, no router weights, lb_loss 0; fused with biases, "
     "bidirectional, load_balance_coef absent"),
    ("none_dense_gqa_rope",
     layer(16, 4, "none", h_kv=1, causal=True, rope=10000.0),
     "split", 1, 13, 115,
     "router none, GQA h=4, h_kv=1 (multi-query), split, causal, RoPE 1e4"),
]


def snap_zero_grads(ref):
    scale = max(float(t.abs().max()) for n, t in ref.items() if n.startswith("grad.") and t.numel())
    zero = []
    for n, t in ref.items():
        if n.startswith("grad.") and t.numel() and float(t.abs().max()) < ZERO_GRAD_REL * scale:
            ref[n] = torch.zeros_like(t)
            zero.append(n)
    return zero


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.size == 0:
        return 0.0
    den = float(np.abs(b).max())
    return float(np.abs(a - b).max()) / (den if den > 0 else 1.0)


def build(name, cfg, style, B, N, seed):
    for attempt in range(100):
        gen = torch.Generator().manual_seed(seed * 1000 + attempt)
        W, x, dy = R.make_case(cfg, style, B, N, gen)
        margin = R.routing_margin(cfg, W, x)
        if margin >= MARGIN:
            break
    else:
        raise RuntimeError(f"{name}: no draw with routing margin >= {MARGIN}")
    ref = R.reference(cfg, W, x, dy)
    zero = snap_zero_grads(ref)
    # How close PyTorch itself gets in float32 (the attainable accuracy of a float32 engine).
    r32 = R.reference(cfg, W, x, dy, dtype=torch.float32)
    f32 = {n: (rel_err(r32[n].numpy(), ref[n].numpy()) if n not in zero else
               float(r32[n].abs().max()) / max(float(ref[k].abs().max()) for k in ref
                                                if k.startswith("grad.")))
           for n in ref}
    return W, x, dy, ref, margin, attempt, zero, f32


def write(folder, name, cfg, W, x, dy, ref):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    meta = {"fixture": f"{name} (tools/ref/gen_layer_fixtures.py)"}  # one key: stable header
    torch_save({n: w.contiguous() for n, w in W.items()},
               os.path.join(folder, "weights.safetensors"), metadata=meta)
    torch_save({"x": x.contiguous()}, os.path.join(folder, "input.safetensors"), metadata=meta)
    torch_save({"dy": dy.contiguous()}, os.path.join(folder, "grad_output.safetensors"),
               metadata=meta)
    torch_save({n: t.to(torch.float32).contiguous() for n, t in ref.items()},
               os.path.join(folder, "expected.safetensors"), metadata=meta)


def verify(out_dir):
    """Recomputes every fixture's expected values from its stored inputs; returns failures."""
    bad = 0
    for name, *_ in FIXTURES:
        folder = os.path.join(out_dir, name)
        with open(os.path.join(folder, "config.json")) as f:
            cfg = json.load(f)
        W = {n: torch.from_numpy(v) for n, v in np_load(os.path.join(folder, "weights.safetensors")).items()}
        x = torch.from_numpy(np_load(os.path.join(folder, "input.safetensors"))["x"])
        dy = torch.from_numpy(np_load(os.path.join(folder, "grad_output.safetensors"))["dy"])
        exp = np_load(os.path.join(folder, "expected.safetensors"))
        ref = R.reference(cfg, W, x, dy)
        snap_zero_grads(ref)
        errs = {n: rel_err(exp[n], ref[n].to(torch.float32).numpy()) if n in exp else float("inf")
                for n in ref}
        worst = max(errs, key=errs.get)
        ok = errs[worst] == 0.0 and set(exp) == set(ref)
        bad += not ok
        print(f"{'OK  ' if ok else 'DIFF'} {name}: worst {worst} {errs[worst]:.1e}")
    return bad


def readme(rows):
    lines = [
        "# MoH layer fixtures",
        "",
        "Written by `tools/ref/gen_layer_fixtures.py` (regenerate: "
        "`python3 tools/ref/gen_layer_fixtures.py`; check: `... --verify`) from the independent "
        "PyTorch reference `tools/ref/moh_layer_ref.py` (semantics: docs/spec.md §1-3, §10).",
        "",
        "Each folder: `config.json` (LAYER.json), `weights.safetensors` (F32, official names), "
        "`input.safetensors` (`x` [B,N,C]), `grad_output.safetensors` (`dy` [B,N,C]), "
        "`expected.safetensors` (F32: `y`, `gates` [B,N,h], `lb_loss` [1], `grad.x`, "
        "`grad.<weight>` for every weight). Expected values are float64 results from the stored "
        "float32 inputs, rounded to F32; gradients are those of L = sum(y*dy) + "
        "load_balance_coef*lb_loss. The `moh layer` CLI runs one directly:",
        "",
        "```",
        "moh layer --config F/config.json --weights F/weights.safetensors --input "
        "F/input.safetensors \\",
        "          --grad-output F/grad_output.safetensors --output out.safetensors",
        "```",
        "",
        "Comparing: max|a-b| / max|b| per tensor. A whole gradient tensor that is 0 in exact "
        "arithmetic would be stored as zeros and listed under *zero grads* (compare it against the "
        "largest gradient of the fixture instead; none of the current fixtures has one). Parts of "
        "a tensor can be exactly 0 in exact arithmetic (the k rows of the qkv gradient when N = 1, "
        "the k bias gradient without RoPE); they hold float64 rounding noise, harmless for the "
        "max-relative metric. Every token's top-k "
        "choice is at least 1e-3 (relative score gap) from a tie, so the selected heads must match "
        "exactly. *f32* is the worst error PyTorch itself reaches running the same layer in "
        "float32, i.e. what a float32 engine can be expected to attain; 1e-4 is a safe tolerance "
        "for every fixture. The largest *f32* values (K = 1) come from grad.wg: with K = 1 the "
        "renormalised routed gate p/p is exactly 1, so grad.wg holds only the beta*lb_loss term "
        "next to a y-path term that cancels exactly but leaves float32 rounding noise.",
        "",
        "| fixture | router | h / h_kv / d / C | h_s / K | B x N | style | covers | zero grads | f32 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append("| " + " | ".join(r) + " |")
    lines += ["", "Total size: see `du -sh tests/fixtures/layer` (kept under 1 MB).", ""]
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description="Write the MoH layer fixtures.")
    p.add_argument("--out", default=OUT_DIR)
    p.add_argument("--only", action="append", help="fixture name (repeatable)")
    p.add_argument("--verify", action="store_true", help="recompute and compare; write nothing")
    args = p.parse_args()
    if args.verify:
        return 1 if verify(args.out) else 0
    rows = []
    for name, cfg, style, B, N, seed, covers in FIXTURES:
        W, x, dy, ref, margin, attempt, zero, f32 = build(name, cfg, style, B, N, seed)
        if not args.only or name in args.only:
            write(os.path.join(args.out, name), name, cfg, W, x, dy, ref)
        c = R.normalize_config(cfg)
        worst = max(f32, key=f32.get)
        print(f"{name:<26} margin {margin:.1e} (draw {attempt})  lb_loss {float(ref['lb_loss']):.4f}"
              f"  f32 worst {worst} {f32[worst]:.1e}  zero {zero}")
        rows.append([
            f"`{name}`", c["router"],
            f"{c['num_attention_heads']} / {c['num_key_value_heads']} / {c['head_dim']} / "
            f"{c['hidden_size']}",
            "-" if c["router"] == "none" else f"{c['shared_heads']} / {c['top_k']}",
            f"{B} x {N}", style, covers,
            ", ".join(f"`{z[5:]}`" for z in zero) or "-",
            f"{f32[worst]:.0e}",
        ])
    if not args.only:
        with open(os.path.join(args.out, "README.md"), "w") as f:
            f.write(readme(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
