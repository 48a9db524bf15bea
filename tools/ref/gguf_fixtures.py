#!/usr/bin/env python3
"""Writes the GGUF reader's committed fixtures (tests/test_gguf.c, tests/fuzz/fuzz_gguf.c).

  python3 -m venv /tmp/ggvenv && /tmp/ggvenv/bin/pip install gguf numpy
  /tmp/ggvenv/bin/python tools/ref/gguf_fixtures.py

tests/fixtures/gguf/types.gguf (GGUF v3, general.alignment 64):
  - one tensor per type moh dequantises, named after the type ("q4_k", ...), shape ne = [256, 2]
    (ggml order, ne[0] fastest), random blocks: random bytes with the block's float16 (float32 for
    Q8_K) scales replaced by random finite values, F16/BF16 including signed zeros, subnormals,
    infinities and quiet NaNs;
  - "<name>.ref": the same values as F32, from gguf.quants.dequantize (gguf 0.19) on the bytes read
    back with gguf.GGUFReader; Q8_K, which gguf-py does not dequantise, from ggml's definition
    (float32 d times int8 q, ggml-quants.c dequantize_row_q8_K);
  - "iq2_xxs": a type moh does not dequantise (one block);
  - metadata "test.<type>" of every value type and "test.arr.<type>" arrays of each (strings too),
    values listed in tests/test_gguf.c.
tests/fuzz/corpus/gguf/small.gguf: one block of each type and a few keys (fuzz seed), and
  v2_no_tensors.gguf: a v2 file with one string array and no tensors.
"""
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q, GGUFValueType as V
from gguf.constants import GGML_QUANT_SIZES

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q8_K"]
# byte offsets of the float16 scales in each block (Q8_K: a float32 at 0)
F16_FIELDS = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2],
              "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


def random_blocks(rng, name, n_el):
    qt = Q[name]
    bs, ts = GGML_QUANT_SIZES[qt]
    nb = n_el // bs
    if name == "F32":
        return (rng.standard_normal(n_el) * 3).astype(np.float32).view(np.uint8)
    if name in ("F16", "BF16"):
        bits = rng.integers(0, 1 << 16, n_el, dtype=np.uint32).astype(np.uint16)
        # no signalling NaNs (hardware F16 conversion quiets them); specials kept
        exp_all = (bits & (0x7C00 if name == "F16" else 0x7F80)) == (0x7C00 if name == "F16" else 0x7F80)
        qbit = 0x0200 if name == "F16" else 0x0040
        bits = np.where(exp_all & ((bits & (qbit * 2 - 1)) != 0), bits | qbit, bits).astype(np.uint16)
        special = [0x0000, 0x8000, 0x0001, 0x83FF, 0x7C00, 0xFC00, 0x7E00, 0xFE01] if name == "F16" \
            else [0x0000, 0x8000, 0x0001, 0x807F, 0x7F80, 0xFF80, 0x7FC0, 0xFFC1]
        bits[:len(special)] = special
        return bits.view(np.uint8)
    b = rng.integers(0, 256, (nb, ts), dtype=np.uint16).astype(np.uint8)
    if name == "Q8_K":
        d = (rng.uniform(0.01, 0.5, nb) * rng.choice([-1, 1], nb)).astype(np.float32)
        b[:, 0:4] = d.view(np.uint8).reshape(nb, 4)
    for off in F16_FIELDS.get(name, []):
        d = (rng.uniform(0.001, 2.0, nb) * rng.choice([-1, 1], nb)).astype(np.float16)
        b[:, off:off + 2] = d.view(np.uint8).reshape(nb, 2)
    return b.reshape(-1)


def reference(name, raw):
    qt = Q[name]
    if name == "Q8_K":  # not in gguf-py: ggml's dequantize_row_q8_K
        b = raw.reshape(-1, 292)
        d = b[:, 0:4].copy().view(np.float32)
        q = b[:, 4:260].copy().view(np.int8).astype(np.float32)
        return (d * q).reshape(-1).astype(np.float32)
    return gguf.quants.dequantize(raw, qt).reshape(-1).astype(np.float32)


def add_meta(w):
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_float32("test.f32", 0.15625)
    w.add_bool("test.bool", True)
    w.add_string("test.str", "h\u00e9llo \u2603 gguf")
    w.add_uint64("test.u64", 18000000000000000000)
    w.add_int64("test.i64", -9000000000000000000)
    w.add_float64("test.f64", -2.5e-300)
    w.add_key_value("test.arr.u8", [1, 2, 255], V.ARRAY, V.UINT8)
    w.add_key_value("test.arr.i8", [-1, 2, -128], V.ARRAY, V.INT8)
    w.add_key_value("test.arr.u16", [1, 65535], V.ARRAY, V.UINT16)
    w.add_key_value("test.arr.i16", [-32768, 7], V.ARRAY, V.INT16)
    w.add_key_value("test.arr.u32", [7, 4294967295], V.ARRAY, V.UINT32)
    w.add_key_value("test.arr.i32", [-5, 6, -7, 8], V.ARRAY, V.INT32)
    w.add_key_value("test.arr.f32", [0.5, -1.25, 3.0], V.ARRAY, V.FLOAT32)
    w.add_key_value("test.arr.bool", [True, False, True], V.ARRAY, V.BOOL)
    w.add_key_value("test.arr.str", ["a", "", "<|im_end|>", "\u0120the"], V.ARRAY, V.STRING)
    w.add_key_value("test.arr.u64", [1, 18446744073709551615], V.ARRAY, V.UINT64)
    w.add_key_value("test.arr.i64", [-9223372036854775808, 3], V.ARRAY, V.INT64)
    w.add_key_value("test.arr.f64", [1e300, -0.0], V.ARRAY, V.FLOAT64)


def write(path, n_el, with_ref, seed):
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, "moh-test")
    w.add_custom_alignment(64)
    add_meta(w)
    raws = {}
    for name in TYPES:
        qt = Q[name]
        raw = random_blocks(rng, name, n_el)
        raws[name] = raw
        bs, ts = GGML_QUANT_SIZES[qt]
        rows = 2 if n_el >= 2 * bs else 1
        w.add_tensor(name.lower(), raw.reshape(rows, -1), raw_dtype=qt)
    w.add_tensor("iq2_xxs", rng.integers(0, 256, (1, 66), dtype=np.uint16).astype(np.uint8),
                 raw_dtype=Q.IQ2_XXS)
    if with_ref:  # the reference computed on the bytes as written (read back below)
        for name in TYPES:
            rows = 2 if n_el >= 2 * GGML_QUANT_SIZES[Q[name]][0] else 1
            w.add_tensor(name.lower() + ".ref", reference(name, raws[name]).reshape(rows, -1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    # check: the reference from the bytes gguf-py reads back equals what was stored
    r = gguf.GGUFReader(path)
    by = {t.name: t for t in r.tensors}
    for name in TYPES:
        got = np.asarray(by[name.lower()].data).view(np.uint8).reshape(-1)
        assert np.array_equal(got, raws[name]), name
        if with_ref:
            ref = np.asarray(by[name.lower() + ".ref"].data).reshape(-1)
            assert np.array_equal(ref.view(np.uint32), reference(name, got).view(np.uint32)), name
    print(path, os.path.getsize(path), "bytes")


def main():
    fix = os.path.join(ROOT, "tests", "fixtures", "gguf")
    corp = os.path.join(ROOT, "tests", "fuzz", "corpus", "gguf")
    os.makedirs(fix, exist_ok=True)
    os.makedirs(corp, exist_ok=True)
    write(os.path.join(fix, "types.gguf"), 512, True, 20261201)
    write(os.path.join(corp, "small.gguf"), 256, False, 7)
    # v2, one string array key, no tensors (no data section padding)
    import struct
    kv = struct.pack("<Q", 8) + b"tok.list" + struct.pack("<IIQ", 9, 8, 2) + \
        struct.pack("<Q", 1) + b"a" + struct.pack("<Q", 2) + b"bc"
    with open(os.path.join(corp, "v2_no_tensors.gguf"), "wb") as f:
        f.write(b"GGUF" + struct.pack("<Iqq", 2, 0, 1) + kv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
