#!/usr/bin/env python3
"""PyTorch peers of `moh bench attention --device cuda` on the same GPU, same shapes, bf16.

Per shape (the table of bench/attention_cuda.c: vit-b-4096, vit-b-197, dit-xl-256, llama-4096):
  sdpa_cudnn    F.scaled_dot_product_attention under sdpa_kernel(CUDNN_ATTENTION): q, k, v
                [B, h, N, d] -> o (core_fwd), and o.backward(do) after it (core_fwdbwd);
  sdpa_flash    the same under sdpa_kernel(FLASH_ATTENTION) (PyTorch's FlashAttention-2);
  dense_layer   the dense layer: timm-style qkv Linear, SDPA (PyTorch's default choice of
                backend), proj (LLaMA: q/k/v/o projections, RoPE, causal GQA SDPA): layer_fwd,
                layer_fwdbwd (y.backward(dy), every parameter's gradient);
  official      the official MoH module at the same MoH splits as moh (h_s = h/4, top_k for the
                share): ViT / DiT: torch_peers.OfficialMoHAttention (router, every head through SDPA,
                then gated); LLaMA: MoH-LLaMA3's attention (query-norm router: ||q|| of the routed
                heads / std, softmax, top-k, binary mask; every head through SDPA, then masked).
Modules hold bf16 parameters and take bf16 inputs (no autocast casts: the peer's fastest eager
form); --compile adds torch.compile'd rows of the layers (config "... compiled"). Timing as moh's:
CUDA events around each call, median of R after W warm-ups, rows interleaved repeat by repeat.
FLOPs of the core rows: 4 d V forward, 14 d V forward + backward, V = B h N^2 (causal: B h N (N+1) / 2),
the convention of FlashAttention's benchmarks. Writes JSON lines (one per row) to --json.
"""
import argparse
import json
import math
import os
import statistics
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_peers as tp  # noqa: E402

SHAPES = {  # name: B, C, h, hkv, d, N, causal, rope
    "vit-b-4096": (8, 768, 12, 12, 64, 4096, False, 0.0),
    "vit-b-197": (256, 768, 12, 12, 64, 197, False, 0.0),
    "dit-xl-256": (256, 1152, 16, 16, 72, 256, False, 0.0),
    "llama-4096": (4, 4096, 32, 8, 128, 4096, True, 500000.0),
}


def split(h, share):
    """h_s = h / 4 and top_k nearest the share (ties toward more heads), as moh's benchmark."""
    hs = h // 4
    best = 1
    for k in range(1, h - hs + 1):
        if abs(hs + k - share * h) <= abs(hs + best - share * h):
            best = k
    return hs, best


def rope_tables(N, d, theta, dev):
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=dev) / d)
    ang = torch.arange(N, dtype=torch.float32, device=dev)[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)


def rot(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class LlamaAttn(nn.Module):
    """LLaMA attention (q/k/v/o, RoPE, causal GQA SDPA); with top_k, MoH-LLaMA3's query-norm router
    (modeling_llama.py of the official code): every head computed, then the binary mask."""

    def __init__(self, C, h, hkv, d, N, theta, hs=0, top_k=0):
        super().__init__()
        self.h, self.hkv, self.d, self.hs, self.top_k = h, hkv, d, hs, top_k
        self.q_proj = nn.Linear(C, h * d, bias=False)
        self.k_proj = nn.Linear(C, hkv * d, bias=False)
        self.v_proj = nn.Linear(C, hkv * d, bias=False)
        self.o_proj = nn.Linear(h * d, C, bias=False)
        self.N, self.theta = N, theta
        self.cos = self.sin = None

    def forward(self, x):
        B, N, C = x.shape
        if self.cos is None:
            self.cos, self.sin = rope_tables(N, self.d, self.theta, x.device)
        q = self.q_proj(x).view(B, N, self.h, self.d)
        k = self.k_proj(x).view(B, N, self.hkv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(B, N, self.hkv, self.d).transpose(1, 2)
        mask = None
        if self.top_k:
            n = q[:, :, self.hs:].float().norm(dim=-1)  # [B, N, E], before RoPE
            p = F.softmax(n / n.std(dim=-1, keepdim=True), dim=-1)
            idx = p.topk(self.top_k, dim=-1).indices
            routed = torch.zeros_like(p).scatter_(-1, idx, 1.0)
            mask = torch.cat([torch.ones_like(routed[..., : self.hs]), routed], dim=-1).to(x.dtype)
        q = rot(q.transpose(1, 2), self.cos, self.sin)
        k = rot(k, self.cos, self.sin)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2)
        if mask is not None:
            o = o * mask[..., None]
        return self.o_proj(o.reshape(B, N, -1))


def timer(fn, reps, warm):
    """Median ms of fn over reps CUDA-event-timed calls after warm untimed ones."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return ts


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="all")
    ap.add_argument("--active", default="0.75,0.5")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compile", action="store_true", help="also torch.compile'd layers (compile time not timed)")
    ap.add_argument("--round", type=int, default=1)
    ap.add_argument("--json", required=True, help="JSON lines appended here")
    a = ap.parse_args()
    dev = "cuda"
    torch.manual_seed(0)
    shares = [float(s) for s in a.active.split(",") if s]
    out = open(a.json, "a")
    bf = torch.bfloat16
    for name, (B, C, h, hkv, d, N, causal, theta) in SHAPES.items():
        if a.shapes != "all" and name not in a.shapes.split(","):
            continue
        V = B * h * (N * (N + 1) / 2 if causal else N * N)
        rows = {}  # (config, what) -> (fn, flops)
        q = torch.randn(B, h, N, d, device=dev, dtype=bf, requires_grad=True)
        k = torch.randn(B, hkv, N, d, device=dev, dtype=bf, requires_grad=True)
        v = torch.randn(B, hkv, N, d, device=dev, dtype=bf, requires_grad=True)
        do = torch.randn(B, h, N, d, device=dev, dtype=bf)
        for label, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
            def fwd(backend=backend):
                with sdpa_kernel(backend), torch.no_grad():
                    F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hkv != h)

            def fwdbwd(backend=backend):
                q.grad = k.grad = v.grad = None
                with sdpa_kernel(backend):
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hkv != h)
                    o.backward(do)
            rows[(label, "core_fwd")] = (fwd, 4 * d * V)
            rows[(label, "core_fwdbwd")] = (fwdbwd, 14 * d * V)
        x = torch.randn(B, N, C, device=dev, dtype=bf, requires_grad=True)
        dy = torch.randn(B, N, C, device=dev, dtype=bf)

        def layer_rows(label, m):
            m = m.to(device=dev, dtype=bf)
            with torch.no_grad():
                for p in m.parameters():
                    p.normal_(0.0, 0.02)

            def fwd(m=m):
                with torch.no_grad():
                    m(x)

            def fwdbwd(m=m):
                m.zero_grad(set_to_none=True)
                x.grad = None
                y = m(x)
                y.backward(dy)
            rows[(label, "layer_fwd")] = (fwd, 0.0)
            rows[(label, "layer_fwdbwd")] = (fwdbwd, 0.0)
            if a.compile:
                mc = torch.compile(m)

                def cfwd(mc=mc):
                    with torch.no_grad():
                        mc(x)

                def cfwdbwd(mc=mc, m=m):
                    m.zero_grad(set_to_none=True)
                    x.grad = None
                    y = mc(x)
                    y.backward(dy)
                rows[(label + " compiled", "layer_fwd")] = (cfwd, 0.0)
                rows[(label + " compiled", "layer_fwdbwd")] = (cfwdbwd, 0.0)

        if theta > 0:
            layer_rows("dense_layer", LlamaAttn(C, h, hkv, d, N, theta))
        else:
            layer_rows("dense_layer", tp.dense_attention(C, h))
        for s in shares:
            hs, kk = split(h, s)
            lab = "official moh-%d (%d+%d)" % (round(100 * (hs + kk) / h), hs, kk)
            if theta > 0:
                layer_rows(lab, LlamaAttn(C, h, hkv, d, N, theta, hs, kk))
            else:
                layer_rows(lab, tp.OfficialMoHAttention(C, h, hs, kk))
        keys = list(rows)
        times = {key: [] for key in keys}
        print("[%s] warm-up (%d rows)" % (name, len(keys)), file=sys.stderr, flush=True)
        for key in keys:
            timer(rows[key][0], 1, a.warmup)
        for rep in range(a.repeats):
            for i in range(len(keys)):
                key = keys[(i + rep) % len(keys)]
                times[key] += timer(rows[key][0], 1, 0)
        for key in keys:
            ms = statistics.median(times[key])
            fl = rows[key][1]
            rec = {"engine": "torch", "round": a.round, "shape": name, "config": key[0], "what": key[1], "ms": ms,
                   "ms_min": min(times[key]), "ms_max": max(times[key]), "tflops": fl / (ms * 1e-3) * 1e-12 if fl else 0.0,
                   "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                   "gpu": torch.cuda.get_device_name()}
            out.write(json.dumps(rec) + "\n")
            print("%-11s %-28s %-13s %9.4f ms %7.1f TFLOP/s" % (name, key[0], key[1], ms, rec["tflops"]), file=sys.stderr)
        out.flush()
        del rows, q, k, v, do, x, dy
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
