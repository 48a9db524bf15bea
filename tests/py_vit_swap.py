"""The swapped-module training check of tools/ref/vit_swap_train.py, short: a small MoH-ViT trained
100 steps on synthetic images (2 blocks, 48 wide, batch 16) with the official module and with moh.torch.MoHAttention from the same
weights; the loss curves must agree (20-step means within 5%, the first loss within 1e-4) and fall.
Exit 77 without torch."""
import os
import runpy
import sys

try:
    import torch  # noqa: F401
except ImportError:
    print("skipped: this Python has no torch (Debian: python3-torch)")
    sys.exit(77)

here = os.path.dirname(os.path.abspath(__file__))
# small enough for Debian's torch (generic BLAS, one thread: ~5 GFLOP/s)
sys.argv = ["vit_swap_train.py", "--steps", "100", "--data", "synthetic", "--print", "20", "--dim", "48", "--depth", "2",
            "--batch", "16"]
try:
    runpy.run_path(os.path.join(here, "..", "tools", "ref", "vit_swap_train.py"), run_name="__main__")
except SystemExit as e:
    sys.exit(e.code)
