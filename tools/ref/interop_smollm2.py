"""SmolLM2 in moh vs transformers loading the same GGUF (`make interop`; issue 10's check).

transformers reads models/SmolLM2-135M-Instruct.Q4_1.gguf with
AutoModelForCausalLM.from_pretrained(dir, gguf_file=...), dequantising every tensor to float32, and
its tokenizer with AutoTokenizer.from_pretrained(dir, gguf_file=...). moh runs the same file. For
each prompt (English prose and facts, code, ChatML, digits, mixed scripts):
  tokens   `moh tokenize --model M --text P` equals the HF tokenizer's ids (no special tokens
           added, as moh and llama.cpp encode), and decodes back to P;
  logits   `moh sample --checkpoint M --prompt P --max-tokens 64 --temperature 0
           --context-full stop --precision fp32 --dump-logits F` (float32: the file's own blocks are
           tools/ref/greedy_llamacpp.py's comparison) writes the prompt's ids, the logits after each
           prompt token from the KV cache (what sample uses) and from the full forward pass: both
           within --tol (1e-4) of transformers' float32 logits, as max|diff| / max|logit| over the
           prompt (reported per prompt);
  greedy   the 64 tokens moh generated (stopping early only at the end-of-text token, as
           transformers' greedy loop here does) are the ids of transformers' greedy decoding, and
           moh's printed text is the prompt plus their decoding. The smallest top-1/top-2 logit
           gap transformers saw along the way is printed (how close a tie came).
Prints PASS/FAIL per check and exits 1 if any failed.

  python3 tools/ref/interop_smollm2.py [--moh build/moh] [--model models/SmolLM2-135M-Instruct.Q4_1.gguf]
      [--tokens 64] [--tol 1e-4]      (needs torch, transformers, gguf, safetensors, numpy)
"""

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors.numpy import load_file

PROMPTS = {
    "english": "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "facts": "The capital of France is Paris. The capital of Germany is",
    "code": 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n        return n\n',
    "chatml": "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
              "<|im_start|>user\nWrite a short story about a robot who learns to paint.<|im_end|>\n<|im_start|>assistant\n",
    "digits": "Pi is 3.14159265, e is 2.718281828, and 1234567 + 7654321 = 8888888. The next numbers are 10, 20, 30,",
    "mixed": "Café, naïve, Straße; Москва и 東京 are capitals 🙂. In Tokyo,",
}


def rel_err(a, b):
    return float(np.abs(a.astype(np.float64) - b).max() / np.abs(b).max())


def run(cmd):
    r = subprocess.run(cmd, capture_output=True)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd[:3])}...: rc {r.returncode}: {r.stderr.decode(errors='replace').strip()}")
    return r.stdout


def hf_greedy(model, ids, n, eos):
    """n greedy tokens after ids (stopping after eos), and the smallest top-1/top-2 logit gap."""
    out, gap = [], float("inf")
    with torch.no_grad():
        r = model(torch.tensor([ids]), use_cache=True)
        for _ in range(n):
            last = r.logits[0, -1].double()
            top = torch.topk(last, 2)
            gap = min(gap, float(top.values[0] - top.values[1]))
            t = int(top.indices[0])
            out.append(t)
            if t == eos:
                break
            r = model(torch.tensor([[t]]), cache=r.past_key_values, use_cache=True)
    return out, gap


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../..")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--moh", default=os.path.join(root, "build/moh"))
    ap.add_argument("--model", default=os.path.join(root, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    if not os.path.exists(a.model):
        sys.exit(f"{a.model}: not found (tools/data/fetch_smollm2.sh fetches it)")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    d, f = os.path.split(os.path.realpath(a.model))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    eos = tok.eos_token_id
    print(f"transformers: {type(model).__name__} from {f}, float32, eos {eos} ({tok.eos_token!r})")
    fails, worst = [], 0.0

    def check(name, ok, detail):
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)
        if not ok:
            fails.append(name)

    with tempfile.TemporaryDirectory() as tmp:
        for name, prompt in PROMPTS.items():
            ids = tok.encode(prompt, add_special_tokens=False)
            moh_ids = [int(x) for x in run([a.moh, "tokenize", "--model", a.model, "--text", prompt]).split()]
            check(f"{name} tokens", moh_ids == ids and tok.decode(ids) == prompt,
                  f"{len(ids)} ids {'equal' if moh_ids == ids else f'differ: moh {moh_ids} hf {ids}'}"
                  f"{'' if tok.decode(ids) == prompt else ', HF decode differs from the prompt'}")
            dump = os.path.join(tmp, name + ".safetensors")
            text = run([a.moh, "sample", "--checkpoint", a.model, "--prompt", prompt, "--max-tokens",
                        str(a.tokens), "--temperature", "0", "--context-full", "stop", "--precision", "fp32",
                        "--dump-logits", dump])
            got = load_file(dump)
            with torch.no_grad():
                ref = model(torch.tensor([ids])).logits[0].double().numpy()
            same = got["tokens"][0].astype(np.int64).tolist() == ids
            e_kv, e_fw = rel_err(got["logits"][0], ref), rel_err(got["logits_forward"][0], ref)
            worst = max(worst, e_kv, e_fw)
            check(f"{name} logits", same and e_kv <= a.tol and e_fw <= a.tol,
                  f"max|diff|/max|logit| over {len(ids)} positions: KV cache {e_kv:.2e}, full forward {e_fw:.2e} "
                  f"(max|logit| {np.abs(ref).max():.2f}){'' if same else '; the dumped ids differ'}")
            hf_ids, gap = hf_greedy(model, ids, a.tokens, eos)
            moh_gen = got["generated"][0].astype(np.int64).tolist()
            body = [t for t in hf_ids if t != eos]
            want = (prompt + tok.decode(body) + "\n").encode()
            n_same = next((i for i, (x, y) in enumerate(zip(moh_gen, hf_ids)) if x != y), min(len(moh_gen), len(hf_ids)))
            check(f"{name} greedy", moh_gen == hf_ids and text == want,
                  f"{len(hf_ids)} tokens{' (to eos)' if hf_ids[-1:] == [eos] else ''}, "
                  f"{'identical' if moh_gen == hf_ids else f'first difference at {n_same}'}"
                  f"{'' if text == want else ', printed text differs'}; smallest top-2 gap {gap:.3f}; "
                  f"{tok.decode(body)[:60]!r}")
    print(f"worst logits max|diff|/max|logit| {worst:.2e} (tolerance {a.tol:g}); {len(fails)} failed")
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
