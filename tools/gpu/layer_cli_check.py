#!/usr/bin/env python3
"""`moh layer --device cuda` against `moh layer` (CPU, float32) on the same files: the CLI's CUDA
path end to end (weights from safetensors, bf16 on the device, outputs written as F32). Random
layer (head_dim 64, GQA, learned router, causal, RoPE, biases), B 2, N 100; every output tensor
within 2e-2 of the CPU's (max |cuda - cpu| / max |cpu|; the GPU rounds inputs and weights to bf16).
usage: layer_cli_check.py MOH_BINARY [WORKDIR]; exit 0 when all pass."""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from safetensors.numpy import load_file, save_file


def main():
    moh = sys.argv[1]
    work = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp()
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(7)
    C, h, hkv, d, hs, k, B, N = 128, 4, 2, 64, 1, 2, 2, 100
    cfg = {"hidden_size": C, "num_attention_heads": h, "num_key_value_heads": hkv, "head_dim": d,
           "shared_heads": hs, "top_k": k, "router": "learned", "causal": True, "qkv_bias": True,
           "proj_bias": True, "rope_theta": 10000.0, "load_balance_coef": 0.01}
    json.dump(cfg, open(os.path.join(work, "config.json"), "w"))
    s = 2.0 / np.sqrt(C)
    qd = (h + 2 * hkv) * d
    u = lambda *shape: (rng.uniform(-1, 1, size=shape) * s).astype(np.float32)
    w = {"qkv.weight": u(qd, C), "qkv.bias": u(qd), "proj.weight": u(C, h * d), "proj.bias": u(C),
         "wg.weight": u(h - hs, C), "wg_0.weight": u(2, C)}
    save_file(w, os.path.join(work, "weights.safetensors"))
    save_file({"x": rng.uniform(-1, 1, size=(B, N, C)).astype(np.float32)}, os.path.join(work, "input.safetensors"))
    save_file({"dy": rng.uniform(-1, 1, size=(B, N, C)).astype(np.float32)}, os.path.join(work, "grad.safetensors"))
    outs = {}
    for dev in ("cpu", "cuda"):
        out = os.path.join(work, "out_%s.safetensors" % dev)
        cmd = [moh, "layer", "--config", os.path.join(work, "config.json"), "--weights",
               os.path.join(work, "weights.safetensors"), "--input", os.path.join(work, "input.safetensors"),
               "--grad-output", os.path.join(work, "grad.safetensors"), "--output", out, "--device", dev]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            print("moh layer --device %s failed (%d): %s" % (dev, r.returncode, r.stderr.strip()))
            return 1
        outs[dev] = load_file(out)
    bad = 0
    for name in sorted(outs["cpu"]):
        a, b = outs["cuda"][name].astype(np.float64), outs["cpu"][name].astype(np.float64)
        den = max(np.abs(b).max(), 1e-30)
        e = np.abs(a - b).max() / den if den > 1e-12 else np.abs(a - b).max()
        ok = e <= 2e-2 and np.isfinite(a).all()
        bad += not ok
        print("  %-22s %.2e %s" % (name, e, "ok" if ok else "FAILED"))
    print("moh layer --device cuda vs cpu: %s" % ("all within 2e-2" if not bad else "%d tensors off" % bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
