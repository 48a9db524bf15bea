#!/usr/bin/env python3
"""moh decoding a quantised GGUF from its own blocks vs llama.cpp on the same file (issue 29).

For each prompt (the README's, a ChatML turn, prose, code), both engines encode the same ids and
decode --tokens greedy tokens:
  moh        `moh sample --model M --prompt P --max-tokens N --temperature 0 --context-full stop
             --dump-logits F` (default precision: the file's own quantised blocks, every type of a Q4_K_M file; the dump holds
             the prompt ids, the KV-cache logits after each prompt token and the generated ids);
  llama.cpp  llama-cpp-python: eval(prompt ids), then N steps of argmax(last logits) -> eval([t]),
             stopping at the end-of-text token as moh does.
Checks per prompt: the prompt ids are equal; the logits after the last prompt token are within --tol
of llama.cpp's, as max|diff| / max|logit|; the generated ids agree up to the first place where
llama.cpp's top-1/top-2 logit gap is below --gap (reported: how many agree, the gap at the first
difference). Why not bit-level agreement: both engines quantise every product's input to 8 bits,
a rounding step that turns the last-bit differences of another fp32 summation order into whole
steps, layer after layer. moh against itself (its portable kernels vs its VNNI kernels: the same
integer sums, only the order of the fp32 scale sums differs) differs by 1.6-7.7 % of the largest
logit per position on SmolLM2 Q4_1, moh vs llama.cpp with an fp32 KV cache in both by 2.8 %, and
llama.cpp against itself by 3.2 % (F16 vs F32 KV cache) and 5.3 % (flash attention on): --tol 0.1.
Exit status 1 if any check fails.
llama.cpp's extra buffer types (AMX) are off with --extra-bufts off (on a VM where they crash).

  python3 tools/ref/greedy_llamacpp.py [--moh build/moh] [--model models/SmolLM2-135M-Instruct.Q4_1.gguf]
      [--tokens 64] [--tol 0.1] [--gap 1.0] [--extra-bufts on|off]     (needs numpy, safetensors, llama-cpp-python)
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

PROMPTS = [
    "The capital of France is",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "In the beginning God created the heaven and the earth.\n\nAnd the earth was without form",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) +",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--moh", default="build/moh")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--tol", type=float, default=0.1)
    ap.add_argument("--gap", type=float, default=1.0, help="a top-1/top-2 logit gap rounding may not flip")
    ap.add_argument("--extra-bufts", default="on", choices=("on", "off"))
    a = ap.parse_args()
    from safetensors.numpy import load_file
    import llama_cpp
    if a.extra_bufts == "off":
        default_params = llama_cpp.llama_model_default_params

        def no_extra():
            p = default_params()
            p.use_extra_bufts = False
            return p
        llama_cpp.llama.llama_cpp.llama_model_default_params = no_extra
    llm = llama_cpp.Llama(model_path=a.model, n_ctx=1024, n_batch=512, verbose=False)
    V, eos = llm.n_vocab(), llm.token_eos()
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, prompt in enumerate(PROMPTS):
            dump = os.path.join(tmp, f"p{i}.safetensors")
            r = subprocess.run([a.moh, "sample", "--model", a.model, "--prompt", prompt, "--max-tokens", str(a.tokens),
                                "--temperature", "0", "--context-full", "stop", "--dump-logits", dump],
                               capture_output=True, text=True)
            if r.returncode:
                sys.exit(f"moh sample failed: {r.stderr.strip()}")
            d = load_file(dump)
            ids = d["tokens"][0].astype(np.int64).tolist()
            mgen = d["generated"][0].astype(np.int64).tolist() if "generated" in d else []
            lids = llm.tokenize(prompt.encode(), add_bos=False, special=True)
            llm.reset()
            llm.eval(ids)
            last = np.array(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(V,)), dtype=np.float64)
            mlast = d["logits"][0][-1].astype(np.float64)
            err = np.abs(mlast - last).max() / np.abs(last).max()
            lgen, gaps = [], []
            logits = last
            for _ in range(a.tokens):
                top2 = np.sort(logits)[-2:]
                gaps.append(top2[1] - top2[0])
                t = int(logits.argmax())
                lgen.append(t)
                if t == eos:
                    break
                llm.eval([t])
                logits = np.array(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(V,)), dtype=np.float64)
            agree = next((k for k, (x, y) in enumerate(zip(mgen, lgen)) if x != y), min(len(mgen), len(lgen)))
            close = next((k for k, g in enumerate(gaps) if g < a.gap), len(gaps))  # first near tie
            ok = ids == lids and err <= a.tol and (mgen == lgen or agree >= close)
            failed += not ok
            where = "" if mgen == lgen else f"; first difference at token {agree} (llama.cpp top-1/top-2 gap there {gaps[agree] if agree < len(gaps) else float('nan'):.3f})"
            print(f"{'PASS' if ok else 'FAIL'} prompt {i}: {len(ids)} prompt ids {'equal' if ids == lids else 'DIFFER'}; "
                  f"{len(mgen)} generated ids, {agree} agree{where}; last-prompt-token logits rel err {err:.2e} "
                  f"(tol {a.tol:g}); first gap under {a.gap:g} at token {close}")
            print(f"    moh:       {llm.detokenize(mgen).decode(errors='replace')!r}")
            if mgen != lgen:
                print(f"    llama.cpp: {llm.detokenize(lgen).decode(errors='replace')!r}")
    print(f"{len(PROMPTS) - failed} of {len(PROMPTS)} prompts passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
