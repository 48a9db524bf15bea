#!/usr/bin/env python3
"""Writes tests/fixtures/quant/ggml_quants.gguf: rows quantised by ggml itself, for tests/test_quant.c
to check moh's quantisers (src/ops/quant.c quant_row) byte for byte.

  python3 -m venv /tmp/tv && /tmp/tv/bin/pip install numpy gguf llama-cpp-python
  /tmp/tv/bin/python tools/ref/quant_fixtures.py

Tensors: "x" F32 [4, 512] (rows: uniform in [-1, 1]; normal(0, 0.02) with every 97th value 40x; normal
(0, 1) with a zero and a constant sub-block; uniform in [0.1, 2], all positive) and one tensor per
type named after it (q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K): ggml_quantize_chunk's blocks
of x (libggml-base from llama-cpp-python; no importance matrix, as llama-quantize without one).
"""
import ctypes
import glob
import os

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TYPES = [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K]
NAMES = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_K", "q5_K", "q6_K"]


def ggml():
    import llama_cpp
    libdir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    lib = ctypes.CDLL(glob.glob(os.path.join(libdir, "libggml-base.so"))[0])
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.ggml_row_size.restype = ctypes.c_size_t
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    return lib


def main():
    lib = ggml()
    rng = np.random.default_rng(1)
    R, K = 4, 512
    x = np.empty((R, K), np.float32)
    x[0] = rng.uniform(-1, 1, K)
    x[1] = rng.normal(0, 0.02, K)
    x[1][::97] *= 40
    x[2] = rng.normal(0, 1, K)
    x[2][32:64] = 0
    x[2][64:96] = 0.25
    x[3] = rng.uniform(0.1, 2, K)
    path = os.path.join(ROOT, "tests", "fixtures", "quant", "ggml_quants.gguf")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    w = gguf.GGUFWriter(path, "moh-test")
    w.add_tensor("x", x)
    for t, name in zip(TYPES, NAMES):
        rb = lib.ggml_row_size(int(t), K)
        out = np.zeros(R * rb, np.uint8)
        lib.ggml_quantize_chunk(int(t), x.ctypes.data, out.ctypes.data, 0, R, K, None)
        w.add_tensor(name, out.reshape(R, rb), raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(path, os.path.getsize(path), "bytes")


if __name__ == "__main__":
    main()
