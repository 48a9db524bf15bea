"""PyTorch reference of moh's ViT classifier (src/models/vit.h): timm's VisionTransformer, with the
attention of every block replaced by the MoH layer of tools/ref/moh_layer_ref.py when the config's
router is "learned" (dense configs use timm's own Attention, unchanged).

  build(cfg)                      -> model (torch.nn.Module, float32), state_dict names as moh's
  timm_kwargs(cfg)                -> VisionTransformer(**kwargs) arguments for a moh config.json
  loss_fn(model, cfg, x, y)       -> (loss, ce, lb): label-smoothed CE + beta * mean layer lb
  sharded_loss(model, cfg, x, y, shards)
                                  -> the loss moh train optimises with S data-parallel shards
                                     (per-shard load-balance statistics, shard-size weights)

Config keys (moh config.json): img_size, patch_size, in_chans, num_classes, embed_dim, depth,
num_heads, mlp_ratio, class_token, global_pool, router, shared_heads, top_k, load_balance_coef,
label_smoothing.
"""

import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moh_layer_ref  # noqa: E402

from timm.models.vision_transformer import VisionTransformer  # noqa: E402


def pool_of(cfg):
    return cfg.get("global_pool") or ("token" if cfg.get("class_token", True) else "avg")


def timm_kwargs(cfg):
    return dict(img_size=cfg.get("img_size", 28), patch_size=cfg.get("patch_size", 4),
                in_chans=cfg.get("in_chans", 1), num_classes=cfg.get("num_classes", 10),
                embed_dim=cfg["embed_dim"], depth=cfg["depth"], num_heads=cfg["num_heads"],
                mlp_ratio=cfg.get("mlp_ratio", 4.0), qkv_bias=True,
                class_token=cfg.get("class_token", True), global_pool=pool_of(cfg))


class MoHAttention(nn.Module):
    """MoH attention with timm's module names (qkv, proj) plus the router (wg, wg_0, wg_1)."""

    def __init__(self, dim, num_heads, shared_heads, top_k, beta):
        super().__init__()
        self.layer_cfg = {"hidden_size": dim, "num_attention_heads": num_heads,
                          "shared_heads": shared_heads, "top_k": top_k, "router": "learned",
                          "qkv_bias": True, "proj_bias": True, "load_balance_coef": beta}
        E = num_heads - shared_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=True)
        self.proj = nn.Linear(dim, dim, bias=True)
        if top_k >= 1:
            self.wg = nn.Linear(dim, E, bias=False)
            if shared_heads >= 1:
                self.wg_0 = nn.Linear(dim, 2, bias=False)
        if shared_heads >= 2:
            self.wg_1 = nn.Linear(dim, shared_heads, bias=False)
        self.lb = None
        self.gates = None

    def forward(self, x, attn_mask=None, is_causal=False):
        W = {n: p for n, p in self.named_parameters()}
        out = moh_layer_ref.moh_layer(self.layer_cfg, W, x)
        self.lb = out["lb_loss"]
        self.gates = out["gates"]
        return out["y"]


def build(cfg):
    model = VisionTransformer(**timm_kwargs(cfg))
    if cfg.get("router", "learned") == "learned":
        for blk in model.blocks:
            blk.attn = MoHAttention(cfg["embed_dim"], cfg["num_heads"], cfg["shared_heads"],
                                    cfg["top_k"], cfg.get("load_balance_coef", 0.01))
    return model


def lb_mean(model):
    lbs = [b.attn.lb for b in model.blocks if isinstance(b.attn, MoHAttention) and
           b.attn.layer_cfg["top_k"] > 0]
    return torch.stack(lbs).mean() if lbs else torch.zeros((), dtype=torch.float64)


def loss_fn(model, cfg, x, y):
    logits = model(x)
    ce = F.cross_entropy(logits, y, label_smoothing=cfg.get("label_smoothing", 0.1))
    lb = lb_mean(model).to(logits.dtype)
    return ce + cfg.get("load_balance_coef", 0.01) * lb, ce, lb, logits


def sharded_loss(model, cfg, x, y, shards):
    """Shard s holds images [B s / S, B (s + 1) / S); loss = sum_s (B_s / B) (ce_s + beta lb_s)."""
    B = x.shape[0]
    total = 0
    for s in range(shards):
        a, b = B * s // shards, B * (s + 1) // shards
        if b > a:
            loss, _, _, _ = loss_fn(model, cfg, x[a:b], y[a:b])
            total = total + loss * ((b - a) / B)
    return total
