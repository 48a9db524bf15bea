#!/usr/bin/env python3
"""Trains one small MoH-ViT twice from the same initial weights and batches: with the official MoH
attention module (tools/ref/official_moh.py) and with moh.torch.MoHAttention swapped in, and
compares the two loss curves step by step (issue 31: the module swapped into a training script).

The model is timm's VisionTransformer layout (patch embedding, class token, learned positions,
pre-norm blocks x + attn(LN x), x + MLP(LN x), final LN, linear head) with the MoH attention module
of MoH-DiT / MoH-ViT: the architecture of the official MoH-ViT training script's blocks except for
TransNeXt's cosine attention with relative position bias, which moh's kernels do not compute. The
objective is the official one: cross-entropy + beta * sum of the appended load-balance terms.
AdamW, float32, the same seed for both runs.

Data: Fashion-MNIST from Debian's dataset-fashion-mnist (--data fashion-mnist, the default where
it is installed), or --data synthetic: images of 10 classes (a class-specific pattern plus noise),
which needs no files (what CTest's tests/py_vit_swap.py runs).

Output: the loss every --print steps for both, the largest gap |official - moh| over the steps and
over the mean of the last 20 steps; exit 1 when the windowed mean loss gap (20-step windows,
relative) exceeds --tol.
  PYTHONPATH=python MOH_LIB=build/libmoh.so python3 tools/ref/vit_swap_train.py --steps 300
"""
import argparse
import copy
import gzip
import os
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from official_moh import OfficialMoHAttention, ViTBlock  # noqa: E402

from moh.torch import MoHAttention  # noqa: E402

FMNIST = "/usr/share/datasets/fashion-mnist"


class ViT(nn.Module):
    def __init__(self, attn_cls, img=28, patch=4, dim=96, depth=4, heads=8, shared=2, routed=3, classes=10):
        super().__init__()
        n = (img // patch) ** 2
        self.patch_embed = nn.Conv2d(1, dim, patch, patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, n + 1, dim) * 0.02)
        self.blocks = nn.ModuleList([ViTBlock(attn_cls(dim, heads, qkv_bias=True, shared_head=shared, routed_head=routed),
                                              dim) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + self.pos_embed
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x)[:, 0])


def idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic = struct.unpack(">I", data[:4])[0]
    dims = [struct.unpack(">I", data[4 + 4 * i:8 + 4 * i])[0] for i in range(magic & 0xFF)]
    return torch.frombuffer(bytearray(data[4 + 4 * len(dims):]), dtype=torch.uint8).reshape(dims)


def batches(kind, batch, steps, seed):
    g = torch.Generator().manual_seed(seed)
    if kind == "fashion-mnist":
        imgs = idx(os.path.join(FMNIST, "train-images-idx3-ubyte.gz")).float().div(255).sub(0.2860).div(0.3530)
        labels = idx(os.path.join(FMNIST, "train-labels-idx1-ubyte.gz")).long()
        for _ in range(steps):
            i = torch.randint(0, imgs.shape[0], (batch,), generator=g)
            yield imgs[i].unsqueeze(1), labels[i]
    else:
        protos = torch.randn(10, 1, 28, 28, generator=g)
        for _ in range(steps):
            y = torch.randint(0, 10, (batch,), generator=g)
            yield protos[y] + 1.5 * torch.randn(batch, 1, 28, 28, generator=g), y


def train(model, cls, a):
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.05)
    losses = []
    for x, y in batches(a.data, a.batch, a.steps, a.seed + 1):
        cls.LOAD_BALANCING_LOSSES.clear()
        ce = F.cross_entropy(model(x), y)
        loss = ce + a.beta * torch.stack(cls.LOAD_BALANCING_LOSSES).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(ce.detach()))
    return losses


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--beta", type=float, default=0.01, help="load-balance loss weight")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dim", type=int, default=96)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--data", choices=["fashion-mnist", "synthetic"],
                    default="fashion-mnist" if os.path.isdir(FMNIST) else "synthetic")
    ap.add_argument("--tol", type=float, default=0.05, help="largest relative gap of 20-step mean losses")
    ap.add_argument("--print", type=int, default=50, dest="every")
    ap.add_argument("--baseline", action="store_true",
                    help="also train the official module from weights perturbed by 1e-6 (relative): how far two "
                         "official runs drift apart by rounding alone, the scale of the gap to expect")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    official = ViT(OfficialMoHAttention, dim=a.dim, depth=a.depth)
    swapped = ViT(MoHAttention, dim=a.dim, depth=a.depth)
    swapped.load_state_dict(official.state_dict())  # the official checkpoint, unchanged
    t0 = time.perf_counter()
    lo = train(copy.deepcopy(official), OfficialMoHAttention, a)
    t1 = time.perf_counter()
    lm = train(swapped, MoHAttention, a)
    t2 = time.perf_counter()
    lb = None
    if a.baseline:
        perturbed = copy.deepcopy(official)
        g = torch.Generator().manual_seed(a.seed + 7)
        with torch.no_grad():
            for p in perturbed.parameters():
                p.mul_(1 + 1e-6 * torch.randn(p.shape, generator=g))
        lb = train(perturbed, OfficialMoHAttention, a)
    print(f"# ViT {a.depth} x ({a.dim} wide, 8 heads: 2 shared + top-3 of 6), {a.data}, batch {a.batch}, {a.steps} steps, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("step  official  moh     |gap|")
    for s in range(0, a.steps, a.every):
        print(f"{s + 1:5d}  {lo[s]:.4f}    {lm[s]:.4f}  {abs(lo[s] - lm[s]):.4f}")
    w = min(20, a.steps)
    gaps = []
    for s in range(0, a.steps - w + 1, w):
        mo, mm = sum(lo[s:s + w]) / w, sum(lm[s:s + w]) / w
        gaps.append(abs(mo - mm) / mo)
    if lb is not None:
        bg = max(abs(sum(lo[s:s + w]) - sum(lb[s:s + w])) / sum(lo[s:s + w]) for s in range(0, a.steps - w + 1, w))
        print(f"baseline: official vs official from weights perturbed by 1e-6: largest relative gap of {w}-step "
              f"means {bg:.4f}; mean of the last {w} {sum(lb[-w:]) / w:.4f}")
    last_o, last_m = sum(lo[-w:]) / w, sum(lm[-w:]) / w
    print(f"first loss {lo[0]:.4f} / {lm[0]:.4f}; mean of the last {w}: official {last_o:.4f}, moh {last_m:.4f}; "
          f"largest relative gap of {w}-step means {max(gaps):.4f} (tol {a.tol}); "
          f"time official {t1 - t0:.1f} s, moh {t2 - t1:.1f} s")
    ok = max(gaps) <= a.tol and abs(lo[0] - lm[0]) <= 1e-4 * lo[0] and last_o < lo[0] * 0.8
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
