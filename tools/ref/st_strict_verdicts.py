#!/usr/bin/env python3
"""Verdicts of the reference safetensors reader (the Rust crate, through the Python package's
safetensors.deserialize) on the malformed and edge-case files that tests/test_safetensors.c checks
moh against. Prints one line per case: name, ACCEPT or REJECT, and the reference's message.
Usage: python3 tools/ref/st_strict_verdicts.py [DIR]   (needs: pip install safetensors)
With DIR, also writes each case there as NN.safetensors (to compare another reader)."""
import json
import os
import struct
import sys

from safetensors import __version__, deserialize


def t(dtype, shape, begin, end, **extra):
    d = {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}
    d.update(extra)
    return d


def img(header, data_len, hlen=None):
    h = header if isinstance(header, bytes) else header.encode()
    return struct.pack("<Q", len(h) if hlen is None else hlen) + h + bytes(range(7, 7 + data_len)) \
        if data_len < 200 else struct.pack("<Q", len(h) if hlen is None else hlen) + h + b"\x01" * data_len


def js(obj):
    return json.dumps(obj, separators=(",", ":"))


F = '"dtype":"F32","shape":[1]'
CASES = [
    ("ok", js({"a": t("F32", [1], 0, 4)}), 4),
    ("trailing byte", js({"a": t("F32", [1], 0, 4)}), 5),
    ("gap", js({"a": t("F32", [1], 0, 4), "b": t("F32", [1], 8, 12)}), 12),
    ("not starting at 0", js({"a": t("F32", [1], 4, 8)}), 8),
    ("empty, trailing byte", "{}", 1),
    ("zero-size in the middle of a tensor", js({"a": t("F32", [2], 0, 8), "z": t("F32", [0], 4, 4)}), 8),
    ("zero-size at a boundary", js({"a": t("F32", [1], 0, 4), "z": t("F32", [0], 4, 4), "b": t("F32", [1], 4, 8)}), 8),
    ("zero-size at end", js({"a": t("F32", [1], 0, 4), "z": t("F32", [0], 4, 4)}), 4),
    ("zero-size at 0 alone", js({"z": t("F32", [0], 0, 0)}), 0),
    ("zero-size beyond end", js({"z": t("F32", [0], 8, 8)}), 0),
    ("unknown dtype", js({"a": t("Q7", [1], 0, 1)}), 1),
    ("dtype lower case", js({"a": t("f32", [1], 0, 4)}), 4),
    ("dtype F8_E4M3FNUZ", js({"a": t("F8_E4M3FNUZ", [1], 0, 1)}), 1),
    ("dtype F8_E5M2FNUZ", js({"a": t("F8_E5M2FNUZ", [1], 0, 1)}), 1),
    ("dtype C64", js({"a": t("C64", [1], 0, 8)}), 8),
    ("leading whitespace", " \t\n\r" + js({"a": t("F32", [1], 0, 4)}), 4),
    ("trailing whitespace", js({"a": t("F32", [1], 0, 4)}) + " \t\n\r", 4),
    ("trailing NUL padding", js({"a": t("F32", [1], 0, 4)}).encode() + b"\0\0", 4),
    ("leading form feed", "\f{}", 0),
    ("header is an array", "[]", 0),
    ("header is an array of one", "[{}]", 0),
    ("header is null", "null", 0),
    ("metadata null", '{"__metadata__":null}', 0),
    ("metadata number value", '{"__metadata__":{"k":1}}', 0),
    ("metadata null value", '{"__metadata__":{"k":null}}', 0),
    ("metadata array", '{"__metadata__":["x"]}', 0),
    ("metadata duplicate key", '{"__metadata__":{"k":"a","k":"b"}}', 0),
    ("metadata twice", '{"__metadata__":{},"__metadata__":{}}', 0),
    ("duplicate tensor name", '{"a":{%s,"data_offsets":[0,4]},"a":{%s,"data_offsets":[4,8]}}' % (F, F), 8),
    ("duplicate tensor name same range", '{"a":{%s,"data_offsets":[0,4]},"a":{%s,"data_offsets":[0,4]}}' % (F, F), 4),
    ("field twice", '{"a":{%s,"data_offsets":[0,4],"dtype":"F32"}}' % F, 4),
    ("unknown field", '{"a":{%s,"data_offsets":[0,4],"x":[1,{"y":null}]}}' % F, 4),
    ("shape 1.0", '{"a":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}}', 4),
    ("shape 1e0", '{"a":{"dtype":"F32","shape":[1e0],"data_offsets":[0,4]}}', 4),
    ("shape -0", '{"a":{"dtype":"F32","shape":[-0],"data_offsets":[0,4]}}', 0),
    ("shape -0 one", '{"a":{"dtype":"F32","shape":[1,-0],"data_offsets":[0,0]}}', 0),
    ("offsets 4.0", '{"a":{%s,"data_offsets":[0,4.0]}}' % F, 4),
    ("offsets -0", '{"a":{%s,"data_offsets":[-0,4]}}' % F, 4),
    ("shape 2^53+1 with 0", '{"a":{"dtype":"F32","shape":[0,9007199254740993],"data_offsets":[0,0]}}', 0),
    ("shape 2^63 with 0", '{"a":{"dtype":"F32","shape":[0,9223372036854775808],"data_offsets":[0,0]}}', 0),
    ("shape u64 max with 0", '{"a":{"dtype":"F32","shape":[0,18446744073709551615],"data_offsets":[0,0]}}', 0),
    ("shape 2^64 with 0", '{"a":{"dtype":"F32","shape":[0,18446744073709551616],"data_offsets":[0,0]}}', 0),
    ("overflow before zero", '{"a":{"dtype":"F32","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}}', 0),
    ("nine dims", js({"a": t("F32", [1] * 9, 0, 4)}), 4),
    ("nine dims zero", js({"a": t("F32", [1] * 8 + [0], 0, 0)}), 0),
    ("bits overflow", js({"a": t("F64", [2 ** 61], 0, 4)}), 4),
    ("F4 odd", js({"a": t("F4", [3], 0, 2)}), 2),
    ("size mismatch", js({"a": t("F32", [2], 0, 4)}), 4),
    ("begin > end", js({"a": t("F32", [1], 4, 0)}), 4),
    ("end beyond file", js({"a": t("F32", [4], 0, 16)}), 12),
    ("overlap", js({"a": t("F32", [4], 0, 16), "b": t("F32", [4], 8, 24)}), 24),
    ("offsets three", '{"a":{%s,"data_offsets":[0,4,8]}}' % F, 8),
    ("NUL escape in name", '{"a\\u0000b":{%s,"data_offsets":[0,4]}}' % F, 4),
    ("NUL escape in metadata", '{"__metadata__":{"k":"a\\u0000"}}', 0),
    ("lone surrogate escape", '{"__metadata__":{"k":"\\ud800"}}', 0),
    ("deep nesting in unknown field", '{"a":{%s,"data_offsets":[0,4],"x":%s}}' % (F, "[" * 200 + "]" * 200), 4),
    ("nesting 126 in unknown field", '{"a":{%s,"data_offsets":[0,4],"x":%s}}' % (F, "[" * 125 + "]" * 125), 4),
    ("nesting 127 in unknown field", '{"a":{%s,"data_offsets":[0,4],"x":%s}}' % (F, "[" * 126 + "]" * 126), 4),
    ("nesting 128 in unknown field", '{"a":{%s,"data_offsets":[0,4],"x":%s}}' % (F, "[" * 127 + "]" * 127), 4),
    ("header length past file", ("{}", 0, 3)),
    ("header length over cap", ("{}", 0, 100000001)),
    ("header length u64 max", ("{}", 0, 2 ** 64 - 1)),
    ("header shorter than text", ("{}  xx", 0, 4)),
    ("file shorter than 8", None),
    ("empty header", "", 0),
    ("entry not object", '{"a":[1]}', 0),
    ("tensor as 3-element array", '{"a":["F32",[1],[0,4]]}', 4),
    ("tensor as 4-element array", '{"a":["F32",[1],[0,4],5]}', 4),
    ("dtype as map", '{"a":{"dtype":{"F32":null},"shape":[1],"data_offsets":[0,4]}}', 4),
    ("dtype as map with value", '{"a":{"dtype":{"F32":1},"shape":[1],"data_offsets":[0,4]}}', 4),
    ("duplicate name, first has bad dtype", '{"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,4]},"a":{%s,"data_offsets":[0,4]}}' % F, 4),
    ("duplicate name, first has bad offsets", '{"a":{%s,"data_offsets":[9,4]},"a":{%s,"data_offsets":[0,4]}}' % (F, F), 4),
    ("metadata duplicate key, first not a string", '{"__metadata__":{"k":1,"k":"w"}}', 0),
    ("number out of range in unknown field", '{"a":{%s,"data_offsets":[0,4],"x":1e400}}' % F, 4),
    ("huge negative in unknown field", '{"a":{%s,"data_offsets":[0,4],"x":-99999999999999999999999}}' % F, 4),
    ("leading zero number", '{"a":{"dtype":"F32","shape":[01],"data_offsets":[0,4]}}', 4),
    ("escaped field name", '{"a":{"dt\\u0079pe":"F32","shape":[1],"data_offsets":[0,4]}}', 4),
    ("escaped __metadata__", '{"__meta\\u0064ata__":{"k":"v"}}', 0),
    ("tensor value null", '{"a":null}', 0),
    ("empty tensor name", '{"":{%s,"data_offsets":[0,4]}}' % F, 4),
    ("UTF-8 BOM", '\ufeff{}', 0),
    ("tensor named __metadata__ like", '{"__metadata__":{"k":"v"},"__Metadata__":{%s,"data_offsets":[0,4]}}' % F, 4),
]


def image(case):
    name, *rest = case
    if rest == [None]:
        return b"\x02\0\0"
    if isinstance(rest[0], tuple):
        h, dl, hl = rest[0]
        return img(h, dl, hl)
    return img(rest[0], rest[1])


def main():
    print(f"# safetensors {__version__}")
    out = sys.argv[1] if len(sys.argv) > 1 else None
    for i, case in enumerate(CASES):
        if out:
            with open(os.path.join(out, f"{i:02d}.safetensors"), "wb") as f:
                f.write(image(case))
        try:
            deserialize(image(case))
            print(f"{case[0]}: ACCEPT")
        except Exception as e:  # SafetensorError
            print(f"{case[0]}: REJECT {e}")


if __name__ == "__main__":
    main()
