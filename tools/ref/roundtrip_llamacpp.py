#!/usr/bin/env python3
"""SmolLM2 (or any llama GGUF with a byte-level BPE) round trip through moh, checked in llama.cpp.

  X.gguf (e.g. Q4_1) --moh convert--> DIR (moh / HF folder, F32)
                     --moh convert--> Y.gguf (F32, with the tokenizer)
When DIR holds no tokenizer (tokenizer.json), Y comes from X directly (GGUF -> moh model in memory
-> GGUF), and the script says so. Then, on several prompts:
  - tokenization: llama.cpp on Y == llama.cpp on X == `moh tokenize` on X (ids, special tokens
    parsed);
  - logits: llama.cpp on Y (F32 weights = X's dequantised weights, float32 arithmetic, F32 KV cache)
    against moh on
    X (`moh sample --precision fp32 --dump-logits`: the same dequantised weights in float32): max |difference| /
    max |logit| per prompt <= --tol (default 1e-4; llama.cpp on X itself runs Q4_1 x Q8_1 dot products, so its
    logits differ by ~5e-2: printed for reference, not checked);
  - greedy continuation (--greedy tokens): llama.cpp on Y vs `moh sample --temperature 0` on X.
Exit status 0 when every check passes. Needs numpy and llama-cpp-python (`make interop-llamacpp`).
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

PROMPTS = [
    "The capital of France is Paris. The capital of Germany is",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is 12345 + 678?<|im_end|>\n<|im_start|>assistant\n",
    "In the beginning God created the heaven and the earth.\n\nAnd the earth was without form",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) +",
    "Grüße aus Zürich! 日本語のテキスト, emoji 🙂 and   spaces\t\ttabs 3.14159",
]


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr.strip()}")
    return r.stdout


def load_st(path):
    """tokens [1, T] and logits [1, T, V] of a moh --dump-logits file (float32 safetensors)."""
    import json
    import struct
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(data[a:b], dtype=np.float32).reshape(v["shape"])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--moh", default="build/moh")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--work", default=None, help="folder for DIR and Y.gguf, kept (default: a temporary one, removed)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--greedy", type=int, default=32, help="greedy tokens compared (0: skip)")
    ap.add_argument("--tol", type=float, default=1e-4, help="logits tolerance (issue 10 asks <= 1e-3)")
    a = ap.parse_args()
    if a.work:
        return check(a, a.work)
    with tempfile.TemporaryDirectory(prefix="moh-roundtrip-") as work:  # ~1.1 GB for SmolLM2
        return check(a, work)


def check(a, work):
    from llama_cpp import Llama, __version__ as llama_version

    folder, y = os.path.join(work, "moh"), os.path.join(work, "roundtrip-f32.gguf")
    if os.path.exists(y):
        os.remove(y)
    if not os.path.exists(os.path.join(folder, "model.safetensors")):
        run([a.moh, "convert", "--model", a.model, "--out", folder])
    if os.path.exists(os.path.join(folder, "tokenizer.json")):
        route = f"{a.model} -> {folder} -> {y}"
        run([a.moh, "convert", "--model", folder, "--out", y])
    else:
        route = f"{a.model} -> (moh model) -> {y}  [{folder} has no tokenizer.json: GGUF -> GGUF]"
        run([a.moh, "convert", "--model", a.model, "--out", y])
    print(f"llama-cpp-python {llama_version}; round trip: {route}")
    # KV cache in F32 (llama.cpp's default F16 cache alone rounds K and V to ~1e-3)
    kw = dict(n_ctx=512, n_threads=a.threads, n_threads_batch=a.threads, logits_all=True, verbose=False,
              type_k=0, type_v=0)  # GGML_TYPE_F32
    lx, ly = Llama(model_path=a.model, **kw), Llama(model_path=y, **kw)
    ok = True
    worst = worst_x = 0.0
    for i, text in enumerate(PROMPTS):
        raw = text.encode()
        tx = lx.tokenize(raw, add_bos=False, special=True)
        ty = ly.tokenize(raw, add_bos=False, special=True)
        tm = [int(t) for t in run([a.moh, "tokenize", "--model", a.model, "--text", text]).split()]
        dump = os.path.join(work, f"moh_logits_{i}.safetensors")
        run([a.moh, "sample", "--checkpoint", a.model, "--prompt", text, "--max-tokens", "0", "--precision", "fp32",
             "--dump-logits", dump])
        d = load_st(dump)
        ids = [int(t) for t in d["tokens"][0]]
        lm = d["logits"][0].astype(np.float64)
        same_tok = tx == ty == tm == ids
        ly.reset()
        ly.eval(ids)
        gy = np.array(ly.scores[: len(ids)], dtype=np.float64)
        lx.reset()
        lx.eval(ids)
        gx = np.array(lx.scores[: len(ids)], dtype=np.float64)
        e = float(np.abs(gy - lm).max() / np.abs(lm).max())
        ex = float(np.abs(gx - lm).max() / np.abs(lm).max())
        am = int((gy.argmax(1) == lm.argmax(1)).sum())
        worst, worst_x = max(worst, e), max(worst_x, ex)
        good = same_tok and e <= a.tol
        ok &= good
        print(f"prompt {i}: {len(ids):3d} tokens; tokenization Y == X == moh: {same_tok}; "
              f"logits llama.cpp(Y) vs moh(X): {e:.2e} (argmax {am}/{len(ids)}); "
              f"llama.cpp(X, Q4_1) vs moh(X): {ex:.2e}  {'ok' if good else 'FAIL'}")
    if a.greedy:
        text = PROMPTS[0]
        out = run([a.moh, "sample", "--checkpoint", a.model, "--prompt", text, "--max-tokens", str(a.greedy),
                   "--temperature", "0", "--precision", "fp32"])
        moh_cont = out[len(text):].rstrip("\n")
        ids = ly.tokenize(text.encode(), add_bos=False, special=True)
        ly.reset()
        ly.eval(ids)
        gen = []
        for _ in range(a.greedy):
            t = int(np.argmax(ly.scores[ly.n_tokens - 1]))
            if t == ly.token_eos():
                break
            gen.append(t)
            ly.eval([t])
        llama_cont = ly.detokenize(gen).decode("utf-8", errors="replace")
        same = llama_cont == moh_cont
        ok &= same
        print(f"greedy {a.greedy} tokens after prompt 0, llama.cpp(Y) vs moh(X): {'identical' if same else 'DIFFER'}")
        print(f"  moh:       {moh_cont!r}")
        if not same:
            print(f"  llama.cpp: {llama_cont!r}")
    print(f"worst logits difference llama.cpp(Y) vs moh(X): {worst:.2e} (tolerance {a.tol:g}); "
          f"llama.cpp(X) vs moh(X): {worst_x:.2e}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
