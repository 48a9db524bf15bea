#!/usr/bin/env python3
"""moh's training speed beside an idle PyTorch thread pool in the calling process
(docs/benchmarks.md, Wait policy): `moh bench train --configs mha` tokens/s run from this process
before torch has started its OpenMP threads, right after a 512x512 matmul, and 2 s later. Under
OMP_WAIT_POLICY=active torch's idle threads spin on the cores moh needs; that is why the peer
scripts run every engine in a process of its own.
  python tools/bench/spinning_neighbour.py active|passive [--moh build/moh]   (from the repo root)"""
import argparse
import json
import os
import subprocess
import sys
import time

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("policy", choices=["active", "passive"])
ap.add_argument("--moh", default="build/moh")
a = ap.parse_args()
os.environ["OMP_WAIT_POLICY"] = a.policy  # before torch's libgomp loads
import torch  # noqa: E402

torch.set_num_threads(os.cpu_count() or 2)
cmd = [a.moh, "bench", "train", "--configs", "mha", "--path", "sparse", "--steps", "2", "--repeats", "1", "--json"]


def moh():
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return [r["tokens_per_s"] for r in json.loads(out.stdout) if "config" in r][0]


before = moh()
x = torch.randn(512, 512)
for _ in range(20):
    x @ x  # torch's OpenMP pool exists from here on
after = moh()
time.sleep(2)
later = moh()
print(f"OMP_WAIT_POLICY={a.policy}: moh tokens/s before torch ran {before:.0f}, right after {after:.0f}, 2 s later {later:.0f}")
sys.exit(0)
