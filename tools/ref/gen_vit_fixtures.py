"""Generates tests/fixtures/vit/<case>/ for tests/test_vit_interop.c.

Each case is a moh checkpoint dir written from PyTorch plus the expected outputs:
  config.json        moh ViT config (model_type "vit")
  model.safetensors  F32 weights under timm VisionTransformer state_dict names, unchanged
  io.safetensors     images [B, 1, 28, 28] (the model input), labels [B] (as F32), and, computed in
                     float64: logits [B, 10], loss [1] (CE with label smoothing + beta * mean layer
                     load-balance loss over the whole batch), ce [1], lb [1], grad.<name> for every
                     weight (gradient of loss)
Cases:
  dense_token  timm VisionTransformer(img_size=28, patch_size=4, in_chans=1, embed_dim=16, depth=2,
               num_heads=4, mlp_ratio=2, class_token=True, global_pool='token'): timm's own forward
  dense_avg    the same with class_token=False, global_pool='avg' (fc_norm after the mean pool)
  moh_token    MoH attention (tools/ref/moh_layer_ref.py) in every block: 4 heads, 2 shared + top-1
               of 2 routed (wg, wg_0, wg_1), beta 0.1
  moh_avg      mean pooling, 1 shared head (constant gate, no wg_1) + top-2 of 3, beta 0.1
Weights are random (not timm's init) so that every tensor matters; routing is checked to be far
from top-k ties (moh_layer_ref.routing_margin) so float32 and float64 choose the same heads.

  python3 tools/ref/gen_vit_fixtures.py [--out tests/fixtures/vit]
"""

import argparse
import json
import math
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moh_layer_ref  # noqa: E402
import vit_ref  # noqa: E402

BASE = {"model_type": "vit", "img_size": 28, "patch_size": 4, "in_chans": 1, "num_classes": 10,
        "embed_dim": 16, "depth": 2, "num_heads": 4, "mlp_ratio": 2.0, "label_smoothing": 0.1}
CASES = {
    "dense_token": dict(BASE, class_token=True, global_pool="token", router="none", shared_heads=0,
                        top_k=0, load_balance_coef=0.01),
    "dense_avg": dict(BASE, class_token=False, global_pool="avg", router="none", shared_heads=0,
                      top_k=0, load_balance_coef=0.01),
    "moh_token": dict(BASE, class_token=True, global_pool="token", router="learned", shared_heads=2,
                      top_k=1, load_balance_coef=0.1),
    "moh_avg": dict(BASE, class_token=False, global_pool="avg", router="learned", shared_heads=1,
                    top_k=2, load_balance_coef=0.1),
}
BATCH = 4


def randomize(model, gen, D):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm1.weight") or name.endswith("norm2.weight") or \
                    name in ("norm.weight", "fc_norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            elif ".wg" in name:
                p.copy_(1.5 / math.sqrt(D) * torch.randn(p.shape, generator=gen))
            elif name in ("pos_embed", "cls_token"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            else:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))


def min_margin(model, x):
    """Smallest top-k ranking margin over every MoH layer's input tokens (inf for dense)."""
    inputs = []
    hooks = [b.norm1.register_forward_hook(lambda m, i, o: inputs.append(o.detach()))
             for b in model.blocks]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    m = math.inf
    for blk, xin in zip(model.blocks, inputs):
        if isinstance(blk.attn, vit_ref.MoHAttention):
            W = {n: p.detach() for n, p in blk.attn.named_parameters()}
            m = min(m, moh_layer_ref.routing_margin(blk.attn.layer_cfg, W, xin))
    return m


def make_case(name, cfg, out_dir, seed):
    for attempt in range(50):
        gen = torch.Generator().manual_seed(seed + 1000 * attempt)
        model = vit_ref.build(cfg)
        randomize(model, gen, cfg["embed_dim"])
        x32 = torch.randn((BATCH, 1, 28, 28), generator=gen)
        y = torch.randint(0, 10, (BATCH,), generator=gen)
        model64 = model.double()
        if min_margin(model64, x32.double()) > 1e-3:
            break
    else:
        raise RuntimeError(f"{name}: no seed with routing far from ties")
    state32 = {k: v.detach().float().contiguous() for k, v in model64.state_dict().items()}
    # reload the float32-rounded weights in float64 so both sides use the same values
    model64.load_state_dict({k: v.double() for k, v in state32.items()})
    model64.zero_grad()
    loss, ce, lb, logits = vit_ref.loss_fn(model64, cfg, x32.double(), y)
    loss.backward()
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(dict(cfg, _comment=f"fixture {name}: see tools/ref/gen_vit_fixtures.py"), f, indent=2)
    save_file(state32, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    io = {"images": x32.contiguous(), "labels": y.float(), "logits": logits.detach().float(),
          "loss": loss.detach().reshape(1).float(), "ce": ce.detach().reshape(1).float(),
          "lb": lb.detach().reshape(1).float()}
    for n, p in model64.named_parameters():
        io["grad." + n] = p.grad.detach().float().contiguous()
    save_file(io, os.path.join(d, "io.safetensors"))
    print(f"{name}: loss {loss.item():.6f} (ce {ce.item():.6f}, lb {lb.item():.4f}), "
          f"{sum(v.numel() for v in state32.values())} weights, seed attempt {attempt}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests",
                                                  "fixtures", "vit"))
    a = ap.parse_args()
    torch.manual_seed(0)
    for i, (name, cfg) in enumerate(CASES.items()):
        make_case(name, cfg, a.out, 17 + i)


if __name__ == "__main__":
    main()
