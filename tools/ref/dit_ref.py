"""PyTorch reference of moh's DiT family (src/models/dit.h): the official DiT / MoH-DiT forward,
ported from SkyworkAI/MoH MoH-DiT/models.py (commit 2cefd57; itself facebookresearch/DiT
models.py) without timm: PatchEmbed is its Conv2d `x_embedder.proj`, timm's Mlp is fc1 ->
GELU(tanh) -> fc2, timm's Attention is `qkv`/`proj` with the non-fused path. MoHAttention is the
official module line by line (the load-balance losses kept on the module instead of the
class-level list). learn_sigma is False (moh predicts eps only).

  build(cfg)                     -> DiT module (float32), state_dict names as moh's checkpoints
  loss_fn(model, cfg, x, t, y, eps) -> (loss, mse, lb, out): mean (out - eps)^2 + beta * mean of
                                    the routing layers' load-balance losses (MoH-DiT train.py:219)
  q_sample(x0, t, eps, cfg)      -> x_t of the linear-beta Gaussian diffusion (float64 schedule)
  respace(T, S)                  -> space_timesteps(T, [S]) as a sorted list

Config keys (moh config.json): input_size, patch_size, in_channels, num_classes, hidden_size,
depth, num_heads, mlp_ratio, class_dropout_prob, router, shared_heads, top_k (numbers or per-layer
lists), load_balance_coef, diffusion_steps, beta_start, beta_end.
"""

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def modulate(x, shift, scale):
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class Attention(nn.Module):
    """timm Attention (qkv_bias=True, no q/k norm, no dropout), non-fused path."""

    def __init__(self, dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = (q * self.scale) @ k.transpose(-2, -1)
        x = attn.softmax(dim=-1) @ v
        return self.proj(x.transpose(1, 2).reshape(B, N, C))


class MoHAttention(nn.Module):
    """MoH-DiT/models.py MoHAttention (qkv_bias=True, head_dim = dim / heads, non-fused path)."""

    def __init__(self, dim, num_heads, shared_head, routed_head):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, (self.head_dim * self.num_heads) * 3, bias=True)
        self.proj = nn.Linear(self.head_dim * self.num_heads, dim)
        self.shared_head = shared_head
        self.routed_head = routed_head
        if self.routed_head > 0:
            self.wg = torch.nn.Linear(dim, num_heads - shared_head, bias=False)
            if self.shared_head > 0:
                self.wg_0 = torch.nn.Linear(dim, 2, bias=False)
        if self.shared_head > 1:
            self.wg_1 = torch.nn.Linear(dim, shared_head, bias=False)
        self.losses = []
        self.margin = math.inf  # smallest gap between the k-th and (k+1)-th router score (ties)

    def forward(self, x):
        B, N, C = x.shape
        _x = x.reshape(B * N, C)
        if self.routed_head > 0:
            logits = self.wg(_x)
            gates = F.softmax(logits, dim=1)
            num_tokens, num_experts = gates.shape
            _, indices = torch.topk(gates, k=self.routed_head, dim=1)
            mask = F.one_hot(indices, num_classes=num_experts).sum(dim=1)
            if self.routed_head < num_experts:
                srt = torch.sort(gates.detach(), dim=1, descending=True).values
                gap = srt[:, self.routed_head - 1] - srt[:, self.routed_head]
                self.margin = min(self.margin, gap.min().item())
            if self.training:
                me = gates.mean(dim=0)
                ce = mask.to(me.dtype).mean(dim=0)
                l_aux = torch.mean(me * ce) * num_experts * num_experts
                self.losses.append(l_aux)
            routed_head_gates = gates * mask
            denom_s = torch.sum(routed_head_gates, dim=1, keepdim=True)
            denom_s = torch.clamp(denom_s, min=torch.finfo(torch.float32).eps)  # the fp32 code's eps
            routed_head_gates = routed_head_gates / denom_s
            routed_head_gates = routed_head_gates.reshape(B, N, -1) * self.routed_head
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q = q * self.scale
        attn = (q @ k.transpose(-2, -1)).softmax(dim=-1)
        x = attn @ v
        x = x.transpose(1, 2)
        if self.routed_head > 0:
            if self.shared_head > 0:
                shared_head_weight = self.wg_1(_x)
                shared_head_gates = F.softmax(shared_head_weight, dim=1).reshape(B, N, -1) * self.shared_head
                weight_0 = F.softmax(self.wg_0(_x), dim=1).reshape(B, N, 2) * 2
                shared_head_gates = torch.einsum("bn,bne->bne", weight_0[:, :, 0], shared_head_gates)
                routed_head_gates = torch.einsum("bn,bne->bne", weight_0[:, :, 1], routed_head_gates)
                masked_gates = torch.cat([shared_head_gates, routed_head_gates], dim=2)
            else:
                masked_gates = routed_head_gates
        else:
            masked_gates = F.softmax(self.wg_1(_x), dim=1).reshape(B, N, -1) * self.shared_head
        x = torch.einsum("bne,bned->bned", masked_gates, x)
        x = x.reshape(B, N, self.head_dim * self.num_heads)
        return self.proj(x)


class Mlp(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class TimestepEmbedder(nn.Module):
    def __init__(self, hidden_size, frequency_embedding_size=256):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(frequency_embedding_size, hidden_size, bias=True), nn.SiLU(),
                                 nn.Linear(hidden_size, hidden_size, bias=True))
        self.frequency_embedding_size = frequency_embedding_size

    @staticmethod
    def timestep_embedding(t, dim, max_period=10000):
        half = dim // 2
        freqs = torch.exp(-math.log(max_period) * torch.arange(start=0, end=half, dtype=torch.float32) / half)
        args = t[:, None].float() * freqs[None]
        return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)

    def forward(self, t):
        t_freq = self.timestep_embedding(t, self.frequency_embedding_size)
        return self.mlp(t_freq.to(self.mlp[0].weight.dtype))


class LabelEmbedder(nn.Module):
    """Labels arrive already dropped (num_classes = null) from moh's batch source: no dropout here."""

    def __init__(self, num_classes, hidden_size):
        super().__init__()
        self.embedding_table = nn.Embedding(num_classes + 1, hidden_size)

    def forward(self, labels):
        return self.embedding_table(labels)


class DiTBlock(nn.Module):
    def __init__(self, hidden_size, num_heads, mlp_ratio, router, shared_head, routed_head):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        if router == "learned":
            self.attn = MoHAttention(hidden_size, num_heads, shared_head, routed_head)
        else:
            self.attn = Attention(hidden_size, num_heads)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(hidden_size, int(hidden_size * mlp_ratio))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size, bias=True))

    def forward(self, x, c):
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaLN_modulation(c).chunk(6, dim=1)
        x = x + gate_msa.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift_msa, scale_msa))
        x = x + gate_mlp.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))
        return x


class FinalLayer(nn.Module):
    def __init__(self, hidden_size, patch_size, out_channels):
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden_size, patch_size * patch_size * out_channels, bias=True)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 2 * hidden_size, bias=True))

    def forward(self, x, c):
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class PatchEmbed(nn.Module):
    def __init__(self, patch_size, in_chans, dim):
        super().__init__()
        self.proj = nn.Conv2d(in_chans, dim, kernel_size=patch_size, stride=patch_size, bias=True)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


def per_layer(v, depth):
    return list(v) if isinstance(v, (list, tuple)) else [int(v or 0)] * depth


class DiT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        D, depth, p = cfg["hidden_size"], cfg["depth"], cfg.get("patch_size", 4)
        self.in_channels = cfg.get("in_channels", 1)
        self.patch_size = p
        grid = cfg.get("input_size", 28) // p
        self.x_embedder = PatchEmbed(p, self.in_channels, D)
        self.t_embedder = TimestepEmbedder(D)
        self.y_embedder = LabelEmbedder(cfg.get("num_classes", 10), D)
        self.pos_embed = nn.Parameter(torch.zeros(1, grid * grid, D), requires_grad=False)
        router = cfg.get("router", "learned")
        hs, k = per_layer(cfg.get("shared_heads", 0), depth), per_layer(cfg.get("top_k", 0), depth)
        self.blocks = nn.ModuleList([DiTBlock(D, cfg["num_heads"], cfg.get("mlp_ratio", 4.0), router, hs[i], k[i])
                                     for i in range(depth)])
        self.final_layer = FinalLayer(D, p, self.in_channels)
        pe = get_2d_sincos_pos_embed(D, grid)
        self.pos_embed.data.copy_(torch.from_numpy(pe).float().unsqueeze(0))

    def unpatchify(self, x):
        c, p = self.in_channels, self.patch_size
        h = w = int(x.shape[1] ** 0.5)
        x = x.reshape(shape=(x.shape[0], h, w, p, p, c))
        x = torch.einsum("nhwpqc->nchpwq", x)
        return x.reshape(shape=(x.shape[0], c, h * p, h * p))

    def forward(self, x, t, y):
        x = self.x_embedder(x) + self.pos_embed
        c = self.t_embedder(t) + self.y_embedder(y)
        for block in self.blocks:
            x = block(x, c)
        return self.unpatchify(self.final_layer(x, c))


def get_2d_sincos_pos_embed(embed_dim, grid_size):
    grid_h = np.arange(grid_size, dtype=np.float32)
    grid_w = np.arange(grid_size, dtype=np.float32)
    grid = np.stack(np.meshgrid(grid_w, grid_h), axis=0).reshape([2, 1, grid_size, grid_size])
    emb_h = get_1d_sincos_pos_embed_from_grid(embed_dim // 2, grid[0])
    emb_w = get_1d_sincos_pos_embed_from_grid(embed_dim // 2, grid[1])
    return np.concatenate([emb_h, emb_w], axis=1)


def get_1d_sincos_pos_embed_from_grid(embed_dim, pos):
    omega = np.arange(embed_dim // 2, dtype=np.float64)
    omega /= embed_dim / 2.
    omega = 1. / 10000 ** omega
    out = np.einsum("m,d->md", pos.reshape(-1), omega)
    return np.concatenate([np.sin(out), np.cos(out)], axis=1)


def build(cfg):
    return DiT(cfg)


def loss_fn(model, cfg, x, t, y, eps):
    """Training loss of one batch: the routers record their losses (MoHAttention.training)."""
    for b in model.blocks:
        if isinstance(b.attn, MoHAttention):
            b.attn.losses = []
            b.attn.training = True
    out = model(x, t, y)
    mse = ((out - eps) ** 2).mean()
    lbs = [l for b in model.blocks if isinstance(b.attn, MoHAttention) for l in b.attn.losses]
    lb = torch.stack(lbs).mean() if lbs else torch.zeros((), dtype=out.dtype)
    return mse + cfg.get("load_balance_coef", 0.01) * lb, mse, lb, out


def schedule(cfg):
    T = cfg.get("diffusion_steps", 1000)
    betas = np.linspace(cfg.get("beta_start", 1e-4), cfg.get("beta_end", 0.02), T, dtype=np.float64)
    return betas, np.cumprod(1.0 - betas)


def q_sample(x0, t, eps, cfg):
    _, acp = schedule(cfg)
    a = torch.from_numpy(np.sqrt(acp[t.numpy()])).to(x0.dtype).reshape(-1, 1, 1, 1)
    b = torch.from_numpy(np.sqrt(1.0 - acp[t.numpy()])).to(x0.dtype).reshape(-1, 1, 1, 1)
    return a * x0 + b * eps


def respace(T, S):
    """respace.py space_timesteps(T, [S]) (one section)."""
    stride = (T - 1) / (S - 1) if S > 1 else 1
    cur, taken = 0.0, []
    for _ in range(S):
        taken.append(round(cur))
        cur += stride
    return sorted(set(taken))
