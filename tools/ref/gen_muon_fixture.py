#!/usr/bin/env python3
"""Writes tests/fixtures/muon.safetensors: random matrices and PyTorch float32 results of Muon,
read by tests/test_muon.c.

The reference is Muon as published: Newton-Schulz quintic of K. Jordan's
`zeropower_via_newtonschulz5` (github.com/KellerJordan/Muon; run here in float32, not bf16, the
precision of moh's fp32 path), and the update of J. Liu et al. 2025 ("Muon is Scalable for LLM
Training", Algorithm 1 / Moonlight's Muon.step): buf = mu buf + g, u = g + mu buf (Nesterov),
w = w (1 - lr wd) - lr 0.2 sqrt(max(rows, cols)) NS(u).

Regenerate from the repository root (needs torch and safetensors; CPU only, fixed seed):

    python3 tools/ref/gen_muon_fixture.py

Tensors (F32), for s in {wide [6, 10], tall [10, 6]}:
  {s}.x, {s}.ns                  input and zeropower_via_newtonschulz5(x, 5)
  {s}.w0, {s}.g1, {s}.g2         weights and the gradients of two steps
  {s}.w2, {s}.buf2               weights and momentum after two Muon steps (buf starts at 0)
Constants (repeated in tests/test_muon.c): mu 0.95, lr 0.02, wd 0.1, 5 Newton-Schulz steps.
"""
import math
import os

import torch
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures",
                   "muon.safetensors")
MU, LR, WD, STEPS = 0.95, 0.02, 0.1, 5


def zeropower_via_newtonschulz5(G, steps):
    """K. Jordan's iteration (float32 here)."""
    a, b, c = (3.4445, -4.7750, 2.0315)
    X = G.float()
    if G.size(-2) > G.size(-1):
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        A = X @ X.mT
        B = b * A + c * A @ A
        X = a * X + B @ X
    if G.size(-2) > G.size(-1):
        X = X.mT
    return X


def muon_step(w, g, buf):
    """Liu et al. 2025, Algorithm 1 (Moonlight's Muon.step), Nesterov momentum."""
    buf.mul_(MU).add_(g)
    u = g.add(buf, alpha=MU)
    o = zeropower_via_newtonschulz5(u, STEPS)
    w.mul_(1 - LR * WD)
    w.add_(o, alpha=-LR * 0.2 * math.sqrt(max(w.shape)))


def main():
    torch.manual_seed(20261201)
    out = {}
    for name, shape in (("wide", (6, 10)), ("tall", (10, 6))):
        x = torch.randn(shape)
        out[f"{name}.x"] = x
        out[f"{name}.ns"] = zeropower_via_newtonschulz5(x, STEPS)
        w = torch.randn(shape) * 0.1
        g1, g2 = torch.randn(shape), torch.randn(shape)
        out[f"{name}.w0"], out[f"{name}.g1"], out[f"{name}.g2"] = w.clone(), g1, g2
        buf = torch.zeros(shape)
        muon_step(w, g1, buf)
        muon_step(w, g2, buf)
        out[f"{name}.w2"], out[f"{name}.buf2"] = w, buf
    save_file({k: v.contiguous() for k, v in out.items()}, OUT)
    print("wrote", os.path.normpath(OUT))


if __name__ == "__main__":
    main()
