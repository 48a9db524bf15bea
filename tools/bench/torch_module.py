#!/usr/bin/env python3
"""The official MoH attention module vs moh.torch.MoHAttention, in one PyTorch process, as a user
who swaps the module sees it: the module alone and inside a ViT-B block (pre-norm: x + attn(LN x),
x + MLP(LN x), MLP 768 -> 3072 -> 768 with GELU) or in ViT-B's 12 blocks, forward (torch.no_grad)
and forward + backward.

ViT-B attention: 768 wide, 12 heads x 64, qkv and proj biases, B = 1 (--batch), N tokens (--n);
MoH-75 = 3 shared + top-6 of 9 routed heads (--share 0.5: 3 + 3; 1.0: dense, router none).
The official module is tools/ref/official_moh.py (every head through F.scaled_dot_product_attention,
then gated), at torch's own settings (its default thread count, its OpenMP runtime's default wait
policy), eager and, with --compile, torch.compile'd (the headline takes its faster one). Both modules
hold the same weights. Rounds alternate which goes first; each cell is the median over rounds of
per-round medians of --repeats calls after a warm-up. Prints a table and the speedup
official ms / moh ms (> 1: moh faster).

  PYTHONPATH=python MOH_LIB=build/libmoh.so python3 tools/bench/torch_module.py --n 4096
  (--device cuda: bfloat16 on the GPU, CUDA kernels on both sides; torch.cuda.synchronize timing)
"""
import argparse
import copy
import os
import statistics
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from official_moh import OfficialMoHAttention, ViTBlock  # noqa: E402

import bench_common as bc  # noqa: E402

from moh.torch import MoHAttention  # noqa: E402

C, H = 768, 12
SPLITS = {1.0: (0, 0), 0.75: (3, 6), 0.5: (3, 3)}


class Stack(nn.Module):
    """ViT-B/16's 12 blocks on its tokens ([B, 197, 768] at 224 px), the part a swap changes."""

    def __init__(self, attn):
        super().__init__()
        self.blocks = nn.ModuleList([ViTBlock(copy.deepcopy(attn), C) for _ in range(12)])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def timed(fn, repeats, sync):
    fn()  # warm-up (twice: a compiled engine's second call may still compile)
    fn()
    sync()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=4096, help="tokens per image (default 4096)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--share", type=float, default=0.75, choices=sorted(SPLITS), help="active head share")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--compile", action="store_true", help="also time the official module torch.compile'd")
    ap.add_argument("--what", default="module,block", help="comma list of module (the attention module alone), "
                    "block (one ViT-B block), vit (ViT-B's 12 blocks: with --n 197 --batch 256 the issue's "
                    "ViT-B/16 training step, less the patch embedding and head)")
    ap.add_argument("--dtype", default=None, help="float32 and/or bfloat16, comma list (default: float32 on the "
                    "CPU, bfloat16 on CUDA); both engines hold weights and inputs in it")
    a = ap.parse_args()
    dev = torch.device(a.device)
    dtypes = (a.dtype or ("bfloat16" if a.device == "cuda" else "float32")).split(",")
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    hs, k = SPLITS[a.share]
    torch.manual_seed(0)
    off = OfficialMoHAttention(C, H, qkv_bias=True, shared_head=hs, routed_head=k)
    with torch.no_grad():
        for p in off.parameters():
            p.normal_(0.0, 0.02)
    ours = MoHAttention(C, H, qkv_bias=True, shared_head=hs, routed_head=k)
    ours.load_state_dict(off.state_dict())
    if a.compile:  # one compiled graph per (module copy, dtype, grad mode): more than dynamo's default 8
        from torch import _dynamo

        _dynamo.config.cache_size_limit = 64
        if hasattr(_dynamo.config, "recompile_limit"):
            _dynamo.config.recompile_limit = 64
    engines, inputs = {}, {}
    for dn in dtypes:
        dt = getattr(torch, dn)
        inputs[dn] = (torch.randn(a.batch, a.n, C, device=dev).to(dt), torch.randn(a.batch, a.n, C, device=dev).to(dt))
        for what in a.what.split(","):
            mk = {"module": lambda m: m, "block": lambda m: ViTBlock(m, C), "vit": Stack}[what]
            o = mk(copy.deepcopy(off)).to(dev, dt).train()
            m = mk(copy.deepcopy(ours)).to(dev, dt).train()
            if what != "module":
                m.load_state_dict(o.state_dict())
            engines[(dn, what, "official")] = o
            engines[(dn, what, "moh")] = m
            if a.compile:
                engines[(dn, what, "official compiled")] = torch.compile(o)

    def fwd(m, x, dy):
        with torch.no_grad():
            m(x)
        OfficialMoHAttention.LOAD_BALANCING_LOSSES.clear()  # (training mode appends even under no_grad)
        MoHAttention.LOAD_BALANCING_LOSSES.clear()

    def train(m, x, dy):
        xi = x.detach().requires_grad_()
        OfficialMoHAttention.LOAD_BALANCING_LOSSES.clear()
        MoHAttention.LOAD_BALANCING_LOSSES.clear()
        m(xi).backward(dy)

    res = {}
    names = list(engines)
    for r in range(a.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for key in order:
            for pas, fn in (("forward", fwd), ("forward+backward", train)):
                res.setdefault(key + (pas,), []).append(
                    timed(lambda: fn(engines[key], *inputs[key[0]]), a.repeats, sync))
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)

    dev_name = torch.cuda.get_device_name() if a.device == "cuda" else bc.cpu_model()
    print(f"# {dev_name}; torch {torch.__version__}, {torch.get_num_threads()} threads; load {bc.load_average()}")
    print(f"# ViT-B attention, B={a.batch} N={a.n}, share {a.share} (h_s={hs}, top_k={k}); "
          f"median of {a.rounds} rounds x {a.repeats}")
    print("| dtype | what | pass | official ms | moh ms | official / moh |")
    print("|---|---|---|---:|---:|---:|")
    for dn in dtypes:
        for what in a.what.split(","):
            for pas in ("forward", "forward+backward"):
                offs = {e: statistics.median(res[(dn, what, e, pas)]) for e in ("official", "official compiled")
                        if (dn, what, e, pas) in res}
                best = min(offs, key=offs.get)
                mo = statistics.median(res[(dn, what, "moh", pas)])
                label = "eager" if best == "official" else "compiled"
                extra = "".join(f"; {e} {v:.1f}" for e, v in offs.items() if e != best)
                print(f"| {dn} | {what} | {pas} | {offs[best]:.1f} ({label}{extra}) | {mo:.1f} | "
                      f"{offs[best] / mo:.2f}x |")



if __name__ == "__main__":
    main()
