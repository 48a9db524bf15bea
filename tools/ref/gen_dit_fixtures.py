"""Generates tests/fixtures/dit/<case>/ for tests/test_dit_interop.c.

Each case is a moh checkpoint dir written from PyTorch (tools/ref/dit_ref.py, the official
DiT / MoH-DiT forward) plus the expected outputs:
  config.json        moh DiT config (model_type "dit")
  model.safetensors  F32 weights under the official DiT state_dict names (pos_embed included)
  io.safetensors     x0 [B, C, H, W] (clean images), noise [B, C, H, W], t [B], y [B] (F32; y = 3 is
                     the null class), x_t [B, C, H, W] (q_sample, float64 schedule), and computed in
                     float64 from x_t: out [B, C, H, W] (eps prediction), loss [1] (eps MSE + beta *
                     mean load-balance loss of the routing layers), mse [1], lb [1], grad.<name> of
                     every trained weight (the first training step's gradient)
Cases (input 8x8, 2 channels so that the (ky, kx, c) order of unpatchify matters, patch 2 = 16
tokens, hidden 8, 3 blocks of 4 heads, mlp_ratio 2, 3 classes + null):
  dense  router "none": timm's Attention
  moh    official MoHAttention per layer: 2 shared + top-1 of 2; 0 shared + top-2 of 4 (no wg_0);
         4 shared + 0 routed (soft reweighting h softmax(wg_1 x)); beta 0.1
Weights are random (not DiT's zero init) so that every tensor matters; routing is checked to be far
from top-k ties so float32 and float64 choose the same heads.

  python3 tools/ref/gen_dit_fixtures.py [--out tests/fixtures/dit]
"""

import argparse
import json
import math
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dit_ref  # noqa: E402

BASE = {"model_type": "dit", "input_size": 8, "patch_size": 2, "in_channels": 2, "num_classes": 3,
        "hidden_size": 8, "depth": 3, "num_heads": 4, "mlp_ratio": 2.0, "class_dropout_prob": 0.1,
        "learn_sigma": False, "diffusion_steps": 1000, "beta_start": 1e-4, "beta_end": 0.02}
CASES = {
    "dense": dict(BASE, router="none", shared_heads=0, top_k=0, load_balance_coef=0.01),
    "moh": dict(BASE, router="learned", shared_heads=[2, 0, 4], top_k=[1, 2, 0], load_balance_coef=0.1),
}
BATCH = 4


def randomize(model, gen, D):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "pos_embed":
                continue
            if name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            elif ".wg" in name:
                p.copy_(2.0 / math.sqrt(D) * torch.randn(p.shape, generator=gen))
            else:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))


def make_case(name, cfg, out_dir, seed):
    C, H = cfg["in_channels"], cfg["input_size"]
    for attempt in range(50):
        gen = torch.Generator().manual_seed(seed + 1000 * attempt)
        model = dit_ref.build(cfg)
        randomize(model, gen, cfg["hidden_size"])
        x0 = torch.rand((BATCH, C, H, H), generator=gen) * 2 - 1
        noise = torch.randn((BATCH, C, H, H), generator=gen)
        t = torch.randint(0, 1000, (BATCH,), generator=gen)
        y = torch.tensor([0, 2, 3, 1])
        xt = dit_ref.q_sample(x0.double(), t, noise.double(), cfg).float()
        model64 = model.double().eval()
        with torch.no_grad():
            model64(xt.double(), t, y)
        margin = min([b.attn.margin for b in model64.blocks if isinstance(b.attn, dit_ref.MoHAttention)],
                     default=math.inf)
        if margin > 1e-3:
            break
    else:
        raise RuntimeError(f"{name}: no seed with routing far from ties")
    state32 = {k: v.detach().float().contiguous() for k, v in model64.state_dict().items()}
    model64.load_state_dict({k: v.double() for k, v in state32.items()})
    model64.zero_grad()
    loss, mse, lb, out = dit_ref.loss_fn(model64, cfg, xt.double(), t, y, noise.double())
    loss.backward()
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(dict(cfg, _comment=f"fixture {name}: see tools/ref/gen_dit_fixtures.py"), f, indent=2)
    save_file(state32, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    io = {"x0": x0.contiguous(), "noise": noise.contiguous(), "t": t.float(), "y": y.float(), "x_t": xt.contiguous(),
          "out": out.detach().float().contiguous(), "loss": loss.detach().reshape(1).float(),
          "mse": mse.detach().reshape(1).float(), "lb": lb.detach().reshape(1).float()}
    for n, p in model64.named_parameters():
        if p.grad is not None:
            io["grad." + n] = p.grad.detach().float().contiguous()
    save_file(io, os.path.join(d, "io.safetensors"))
    print(f"{name}: loss {loss.item():.6f} (mse {mse.item():.6f}, lb {lb.item():.4f}), "
          f"{sum(v.numel() for v in state32.values())} weights, routing margin {margin:.3g}, seed attempt {attempt}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "dit"))
    a = ap.parse_args()
    for i, (name, cfg) in enumerate(CASES.items()):
        make_case(name, cfg, a.out, 31 + i)


if __name__ == "__main__":
    main()
