"""moh -> timm interop of the ViT classifier, end to end through the CLI.

For a tiny dense config with a class token, the same with mean pooling (class_token false), and a
tiny MoH config, in a temp dir:
  (a) train   `moh train --config CFG --data DIR --out CK --steps 40 --batch-size 16 --shards 2
              --train-limit 512 --dump-grads G`; the checkpoint must load with load_state_dict
              (strict) into timm's VisionTransformer built from config.json, unchanged (dense), or
              into tools/ref/vit_ref.py's MoH-ViT (timm with the attention swapped; MoH), with no
              missing, unexpected or mismatched keys.
  (b) logits  `moh eval --checkpoint CK --data DIR --dump-logits L --json --limit N` writes the
              model input images, labels and logits of the first 64 test images: timm (float64) on
              the same images gives the same logits (relative error <= tol); and timm's top-1
              accuracy over the first N test images, normalised with config.json's mean/std, equals
              moh eval's (at most one disagreement allowed for float32 near-ties).
  (c) grads   G holds the first step's batch, initial weights (init.*) and gradient (grad.*) of the
              training loss (label-smoothed CE + beta * mean layer load-balance loss, per shard as
              data-parallel GPUs): PyTorch autograd from init.* reproduces every gradient <= tol.
  --checkpoint DIR (repeatable) also runs (a) and (b) on an existing checkpoint, e.g. one written
  by a full `moh train` run, over --limit test images (0 = all 10,000).
Prints PASS/FAIL per check and exits 1 if any failed.

  python3 tools/ref/interop_vit.py [--moh build/moh] [--data /usr/share/datasets/fashion-mnist]
                                   [--keep] [--tol 1e-4] [--limit 2000] [--checkpoint DIR ...]
"""

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vit_ref  # noqa: E402
from timm.models.vision_transformer import Attention, VisionTransformer  # noqa: E402

BASE = {"model_type": "vit", "img_size": 28, "patch_size": 4, "in_chans": 1, "num_classes": 10,
        "embed_dim": 32, "depth": 2, "num_heads": 4, "mlp_ratio": 2.0, "label_smoothing": 0.1}
CASES = {
    "dense_token": dict(BASE, class_token=True, router="none", load_balance_coef=0.01),
    "dense_avg": dict(BASE, class_token=False, router="none", load_balance_coef=0.01),
    "moh_token": dict(BASE, class_token=True, router="learned", shared_heads=2, top_k=1,
                      load_balance_coef=0.1),
}


class Checks:
    def __init__(self):
        self.results = []

    def record(self, name, ok, detail):
        self.results.append((name, ok))
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)


def rel_err(a, b):
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def read_idx(path_base):
    for p in (path_base, path_base + ".gz"):
        if os.path.exists(p):
            raw = open(p, "rb").read()
            return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    raise FileNotFoundError(path_base)


def test_images(data, n):
    img = np.frombuffer(read_idx(os.path.join(data, "t10k-images-idx3-ubyte")), np.uint8, offset=16)
    lab = np.frombuffer(read_idx(os.path.join(data, "t10k-labels-idx1-ubyte")), np.uint8, offset=8)
    img = img.reshape(-1, 1, 28, 28)[:n].astype(np.float64) / 255.0
    return torch.from_numpy(img), torch.from_numpy(lab[:n].astype(np.int64))


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()}")
    return r.stdout


def check_checkpoint(name, ck, a, tmp, checks):
    """(a) strict load into timm / vit_ref, (b) logits and accuracy against moh eval. Returns the
    float64 model and the saved config."""
    logits_path = os.path.join(tmp, "logits-%d.st" % len(checks.results))
    saved = json.load(open(os.path.join(ck, "config.json")))
    # (a) strict load into timm / the MoH reference
    model = vit_ref.build(saved)
    sd = load_file(os.path.join(ck, "model.safetensors"))
    try:
        res = model.load_state_dict(sd, strict=True)
        ok = not res.missing_keys and not res.unexpected_keys
        detail = f"{len(sd)} tensors, missing {res.missing_keys}, unexpected {res.unexpected_keys}"
    except RuntimeError as e:
        ok, detail = False, str(e).splitlines()[0]
    if saved["router"] == "none":
        plain = type(model) is VisionTransformer and all(type(b.attn) is Attention for b in model.blocks)
        ok = ok and plain
        detail += ", timm VisionTransformer with timm Attention (unchanged)" if plain else ", NOT plain timm"
    checks.record(f"{name}: checkpoint loads with load_state_dict(strict=True)", ok, detail)
    model = model.double().eval()
    # (b) logits of the dumped batch and accuracy over the first --limit test images
    limit = ["--limit", str(a.limit)] if a.limit > 0 else []
    out = json.loads(run([a.moh, "eval", "--checkpoint", ck, "--data", a.data, "--dump-logits",
                          logits_path, "--batch-size", "64", "--json"] + limit))
    L = load_file(logits_path)
    with torch.no_grad():
        ref = model(L["images"].double())
    e = rel_err(L["logits"], ref)
    checks.record(f"{name}: moh eval logits vs {'timm' if saved['router'] == 'none' else 'vit_ref'}",
                  e <= a.tol, f"relative error {e:.2e} on {L['logits'].shape[0]} images")
    x, y = test_images(a.data, a.limit if a.limit > 0 else 10**9)
    x = (x - saved["mean"][0]) / saved["std"][0]
    with torch.no_grad():
        pred = torch.cat([model(x[i:i + 256]).argmax(-1) for i in range(0, len(x), 256)])
    acc = float((pred == y).double().mean())
    diff = abs(acc - out["accuracy"]) * len(x)
    checks.record(f"{name}: accuracy on {len(x)} test images", diff <= 1.0 + 1e-9,
                  f"moh eval {out['accuracy']:.4f}, PyTorch {acc:.4f}")
    return model, saved


def check_case(name, cfg, a, tmp, checks):
    cfg_path = os.path.join(tmp, f"{name}.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    ck, grads = (os.path.join(tmp, f"{name}-{s}") for s in ("ckpt", "grads.st"))
    run([a.moh, "train", "--config", cfg_path, "--data", a.data, "--out", ck, "--steps", "40",
         "--batch-size", "16", "--shards", "2", "--train-limit", "512", "--eval-limit", "64",
         "--seed", "3", "--dump-grads", grads, "--quiet"])
    model, saved = check_checkpoint(name, ck, a, tmp, checks)
    # (c) first-step gradient
    G = load_file(grads)
    with safe_open(os.path.join(ck, "optimizer.safetensors"), "pt") as f:
        shards = int(f.metadata()["shards"])
    model.load_state_dict({k[5:]: v.double() for k, v in G.items() if k.startswith("init.")})
    model.zero_grad()
    loss = vit_ref.sharded_loss(model, saved, G["images"].double(), G["labels"].long(), shards)
    loss.backward()
    worst, wname = 0.0, ""
    for n, p in model.named_parameters():
        e = rel_err(G["grad." + n], p.grad)
        if e > worst:
            worst, wname = e, n
    checks.record(f"{name}: first-step gradient ({shards} shards) vs PyTorch autograd", worst <= a.tol,
                  f"worst relative error {worst:.2e} ({wname}), loss {loss.item():.5f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--moh", default=os.path.join(here, "..", "..", "build", "moh"))
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--limit", type=int, default=2000)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--checkpoint", action="append", default=[], help="also check this checkpoint dir")
    a = ap.parse_args()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    checks = Checks()
    tmp = tempfile.mkdtemp(prefix="moh_interop_vit_")
    try:
        for name, cfg in CASES.items():
            try:
                check_case(name, cfg, a, tmp, checks)
            except Exception as e:  # noqa: BLE001 - report and continue with the next case
                checks.record(f"{name}: ran", False, f"{type(e).__name__}: {e}")
        for i, ck in enumerate(a.checkpoint):
            try:
                check_checkpoint(f"checkpoint {ck}", ck, a, tmp, checks)
            except Exception as e:  # noqa: BLE001
                checks.record(f"checkpoint {ck}: ran", False, f"{type(e).__name__}: {e}")
    finally:
        if a.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    failed = [n for n, ok in checks.results if not ok]
    print(f"{len(checks.results) - len(failed)}/{len(checks.results)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
