#!/usr/bin/env python3
"""Writes the safetensors fixtures read by tests/test_safetensors.c, using the reference
implementation (Python safetensors + torch). Re-run from the repository root:

    python3 tools/ref/gen_st_fixtures.py

Every value is exactly representable in its dtype, so the C test checks exact float32 results
(the expected values are spelled out in tests/test_safetensors.c).
"""
import math
import os

import torch
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "st")


def main():
    os.makedirs(OUT, exist_ok=True)
    inf, nan = math.inf, math.nan

    mixed = {
        # F32 [2, 3]: smallest float32 subnormal 2^-149 and -inf included
        "f32": torch.tensor([[0.0, -1.5, 3.25], [65504.0, 2.0**-149, -inf]], dtype=torch.float32),
        # F64 [4]: 1/3 rounds to float32; 1e300 overflows to inf; 2^-130 is a float32 subnormal
        "f64": torch.tensor([1.0 / 3.0, -2.5, 1e300, 2.0**-130], dtype=torch.float64),
        # BF16 [2, 2]: 2^-130 is a bfloat16 subnormal (min normal is 2^-126)
        "bf16": torch.tensor([[1.0, -2.0], [2.0**-130, inf]], dtype=torch.bfloat16),
        # F16 [8]: -0, max 65504, min subnormal 2^-24, min normal 2^-14, 1/3 rounded, NaN, -inf
        "f16": torch.tensor([1.0, -0.0, 65504.0, 2.0**-24, 2.0**-14, 0.333251953125, nan, -inf],
                            dtype=torch.float16),
        "scalar": torch.tensor(7.0, dtype=torch.float32),
        "empty": torch.zeros((0, 3), dtype=torch.float32),
        "layers.0.attn.i64": torch.tensor([1, 2, 3], dtype=torch.int64),
    }
    save_file(mixed, os.path.join(OUT, "mixed.safetensors"),
              metadata={"format": "pt", "note": "moh fixture"})

    # Two F32 tensors, no metadata: moh_st_write must produce these exact bytes when given the same
    # tensors in the reference order (reference sorts by dtype alignment, then name).
    ref = {
        "a": torch.arange(6, dtype=torch.float32).reshape(2, 3) * 0.5 - 1.0,
        "b.weight": torch.tensor([1.0, -2.0, 0.125, 1e-3], dtype=torch.float32),
    }
    save_file(ref, os.path.join(OUT, "f32_ref.safetensors"))


if __name__ == "__main__":
    main()
