#!/usr/bin/env python3
"""Writes tests/fixtures/ops.safetensors: random inputs and PyTorch float32 outputs of the core ops,
read by tests/test_ops_torch.c (which checks moh's _f32 forwards to <= 1e-5 relative).

Regenerate from the repository root (needs torch and safetensors; CPU only, deterministic seed):

    python3 tools/ref/gen_op_fixtures.py

Tensors (all F32; integer targets are stored as float32 values). The constants below (eps, theta,
label smoothing, shapes) are repeated in tests/test_ops_torch.c and must change together:
  layernorm.{x,w,b,out}      nn.functional.layer_norm, eps 1e-5, x [33, 48]
  rmsnorm.{x,w,out}          HF LlamaRMSNorm written out, eps 1e-6, x [33, 48]
  gelu_erf.{x,out}           nn.GELU(), x [500]
  gelu_tanh.{x,out}          nn.GELU(approximate="tanh"), x [500]
  silu.{x,out}               nn.SiLU(), x [500]
  softmax.{x,out}            torch.softmax(dim=-1), x [33, 50]
  cross_entropy.{logits,targets,loss}
                             F.cross_entropy(label_smoothing=0.1), logits [33, 50], targets [33]
                             (-100 = ignored), loss [1] (mean over non-ignored rows)
  rope.{x,out}               HF LlamaRotaryEmbedding + apply_rotary_pos_emb in float32, stored in
                             moh's layout [N, heads, head_dim] = [300, 2, 16], positions 0..N-1,
                             theta 10000
"""
import os

import torch
import torch.nn.functional as Fn
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures",
                   "ops.safetensors")

M, C, V, NEL = 33, 48, 50, 500
LN_EPS, RMS_EPS, SMOOTH = 1e-5, 1e-6, 0.1
ROPE_N, ROPE_H, ROPE_D, ROPE_THETA = 300, 2, 16, 10000.0


def rms_norm_hf(x, w, eps):
    """transformers LlamaRMSNorm.forward, float32 input."""
    hs = x.to(torch.float32)
    variance = hs.pow(2).mean(-1, keepdim=True)
    hs = hs * torch.rsqrt(variance + eps)
    return w * hs.to(x.dtype)


def rope_hf(q, position_ids, dim, base):
    """transformers LlamaRotaryEmbedding (default rope, attention_scaling 1.0) followed by
    apply_rotary_pos_emb, for q [B, H, N, D] and position_ids [B, N], all float32."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))
    inv_freq_expanded = inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
    position_ids_expanded = position_ids[:, None, :].float()
    freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = (emb.cos() * 1.0).to(q.dtype).unsqueeze(1)
    sin = (emb.sin() * 1.0).to(q.dtype).unsqueeze(1)

    def rotate_half(x):
        x1 = x[..., : x.shape[-1] // 2]
        x2 = x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    return (q * cos) + (rotate_half(q) * sin)


def main():
    torch.manual_seed(0)
    f32 = torch.float32
    t = {}

    x = torch.randn(M, C, dtype=f32) * 1.5 + 0.3
    w = torch.randn(C, dtype=f32)
    b = torch.randn(C, dtype=f32)
    t["layernorm.x"], t["layernorm.w"], t["layernorm.b"] = x, w, b
    t["layernorm.out"] = Fn.layer_norm(x, (C,), w, b, LN_EPS)

    x = torch.randn(M, C, dtype=f32)
    w = torch.randn(C, dtype=f32)
    t["rmsnorm.x"], t["rmsnorm.w"] = x, w
    t["rmsnorm.out"] = rms_norm_hf(x, w, RMS_EPS)

    x = torch.randn(NEL, dtype=f32) * 3.0
    t["gelu_erf.x"], t["gelu_erf.out"] = x, torch.nn.GELU()(x)
    x = torch.randn(NEL, dtype=f32) * 3.0
    t["gelu_tanh.x"], t["gelu_tanh.out"] = x, torch.nn.GELU(approximate="tanh")(x)
    x = torch.randn(NEL, dtype=f32) * 3.0
    t["silu.x"], t["silu.out"] = x, torch.nn.SiLU()(x)

    x = torch.randn(M, V, dtype=f32) * 3.0
    t["softmax.x"], t["softmax.out"] = x, torch.softmax(x, dim=-1)

    logits = torch.randn(M, V, dtype=f32) * 3.0
    targets = torch.randint(0, V, (M,), dtype=torch.int64)
    targets[::5] = -100  # ignored rows
    loss = Fn.cross_entropy(logits, targets, ignore_index=-100, label_smoothing=SMOOTH)
    t["cross_entropy.logits"] = logits
    t["cross_entropy.targets"] = targets.to(f32)
    t["cross_entropy.loss"] = loss.reshape(1)

    q = torch.randn(1, ROPE_H, ROPE_N, ROPE_D, dtype=f32)
    pos = torch.arange(ROPE_N, dtype=torch.int64)[None, :]
    out = rope_hf(q, pos, ROPE_D, ROPE_THETA)
    t["rope.x"] = q[0].transpose(0, 1).contiguous()      # [N, H, D]
    t["rope.out"] = out[0].transpose(0, 1).contiguous()

    t = {k: v.contiguous() for k, v in t.items()}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    save_file(t, OUT, metadata={"generator": "tools/ref/gen_op_fixtures.py",
                                "torch": torch.__version__})
    print(f"wrote {os.path.normpath(OUT)} ({os.path.getsize(OUT)} bytes, {len(t)} tensors)")


if __name__ == "__main__":
    main()
