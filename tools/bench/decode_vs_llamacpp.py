#!/usr/bin/env python3
"""moh vs llama.cpp on the same GGUF file, in the same run: prefill and decode tokens/s.

Rounds alternate the two engines (moh, llama.cpp, then llama.cpp, moh, ...), so a slow period of a
shared machine hits both alike. Per round and prompt length:
  moh:       `moh bench decode --model M --context C --tokens N --repeats 1 --threads T --seed S --json`
             (prefill: the prompt in one batched forward on the head-sparse path, filling the KV
             cache; decode: N greedy KV-cache steps; float32 weights dequantised from the file);
  llama.cpp: llama-cpp-python on the same file (its own quantised kernels), n_threads and
             n_threads_batch T, n_batch >= the longest prompt, flash attention on, the same prompt
             ids (splitmix64(S) % vocab, checked against moh's prompt hash), eval(prompt) timed,
             then N greedy steps (argmax of the last logits, eval([token])) timed.
Both run with the same OMP_WAIT_POLICY (default passive, what moh picks; llama.cpp's CPU backend
here is built on libgomp too). Prints medians over rounds and the ratios moh / llama.cpp.
Needs numpy and llama-cpp-python.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from bench_common import cpu_model

M64 = (1 << 64) - 1


def splitmix_ids(seed, n, vocab):
    """The prompt ids of `moh bench decode --seed S` (bench/decode_model.c)."""
    s, out = seed, []
    for _ in range(n):
        s = (s + 0x9E3779B97F4A7C15) & M64
        z = s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        out.append((z ^ (z >> 31)) % vocab)
    return out


def fnv1a(ids):
    h = 0xCBF29CE484222325
    for t in ids:
        for k in range(4):
            h = ((h ^ ((t >> (8 * k)) & 0xFF)) * 0x100000001B3) & M64
    return f"{h:016x}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--moh", default="build/moh")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--context", default="512,2048", help="prompt lengths (default 512,2048)")
    ap.add_argument("--tokens", type=int, default=128, help="new tokens after each prompt (default 128)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="rounds (each: both engines, every prompt)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ubatch", type=int, default=512, help="llama.cpp n_ubatch (default 512, llama.cpp's)")
    ap.add_argument("--no-flash-attn", dest="flash_attn", action="store_false",
                    help="llama.cpp without flash attention (default on: faster here, and llama.cpp's own default)")
    ap.add_argument("--wait-policy", choices=["passive", "active"], default="passive",
                    help="OMP_WAIT_POLICY for both engines (default passive)")
    ap.add_argument("--json", help="also write the rows to this file")
    a = ap.parse_args()
    os.environ["OMP_WAIT_POLICY"] = a.wait_policy  # before libgomp loads with llama_cpp
    import numpy as np
    import llama_cpp
    from llama_cpp import Llama

    ctxs = [int(c) for c in a.context.split(",")]
    nmax = max(ctxs)
    llm = Llama(model_path=a.model, n_ctx=nmax + a.tokens + 16, n_batch=nmax, n_ubatch=min(a.ubatch, nmax),
                n_threads=a.threads, n_threads_batch=a.threads, flash_attn=a.flash_attn, verbose=False)
    V = llm.n_vocab()
    n_ctx = llm.n_ctx()
    prompt = splitmix_ids(a.seed, nmax, V)

    def run_llama(n):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt[:n])
        t1 = time.perf_counter()
        for _ in range(a.tokens):
            logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(V,))
            llm.eval([int(logits.argmax())])
        t2 = time.perf_counter()
        return n / (t1 - t0), a.tokens / (t2 - t1)

    def run_moh():
        out = subprocess.run([a.moh, "bench", "decode", "--model", a.model, "--context", a.context, "--tokens",
                              str(a.tokens), "--repeats", "1", "--threads", str(a.threads), "--seed", str(a.seed),
                              "--json"], capture_output=True, text=True, env=os.environ)
        if out.returncode:
            sys.exit(f"moh bench decode failed:\n{out.stderr}")
        rows = json.loads(out.stdout)
        res = {}
        for r in rows:
            n = r["prompt"]
            if r["prompt_hash"] != fnv1a(prompt[:n]):
                sys.exit(f"prompt ids differ between moh and this script at context {r['context']}")
            res[r["context"]] = (n, r["prefill_tokens_per_s"], r["decode_tokens_per_s"])
        return res

    run_llama(min(64, nmax))  # warm-up (moh warms up inside its run)
    res = {c: {"moh_p": [], "moh_d": [], "ll_p": [], "ll_d": [], "n": c} for c in ctxs}
    for rnd in range(a.repeats):
        for engine in (("moh", "llama") if rnd % 2 == 0 else ("llama", "moh")):
            print(f"[round {rnd + 1}/{a.repeats}] {engine}", file=sys.stderr, flush=True)
            if engine == "moh":
                for c, (n, p, d) in run_moh().items():
                    res[c]["n"] = n
                    res[c]["moh_p"].append(p)
                    res[c]["moh_d"].append(d)
            else:
                for c in ctxs:
                    p, d = run_llama(res[c]["n"])
                    res[c]["ll_p"].append(p)
                    res[c]["ll_d"].append(d)
    med = statistics.median
    load = open("/proc/loadavg").read().split()[0] if os.path.exists("/proc/loadavg") else "?"
    print(f"{cpu_model()}; {a.threads} threads; OMP_WAIT_POLICY={a.wait_policy}; load average {load}; "
          f"{a.repeats} rounds (median), engines alternated")
    print(f"model {a.model}: vocab {V}; prompt ids splitmix64 seed {a.seed}; {a.tokens} new tokens (greedy)")
    print(f"llama.cpp: llama-cpp-python {llama_cpp.__version__}, n_batch {nmax}, n_ubatch {min(a.ubatch, nmax)}, "
          f"flash_attn {'on' if a.flash_attn else 'off'}, KV cache F16, n_ctx {n_ctx}")
    print(f"moh: {a.moh} bench decode (float32 weights, head-sparse prefill, KV-cache decode)")
    def cell(xs, prec):  # median (min-max)
        return f"{med(xs):.{prec}f} ({min(xs):.{prec}f}-{max(xs):.{prec}f})"

    print(f"{'prompt':>6} {'moh prefill':>20} {'llama.cpp':>20} {'ratio':>6} {'moh decode':>18} {'llama.cpp':>18} {'ratio':>6}")
    rows = []
    for c in ctxs:
        r = res[c]
        mp, lp, md, ld = med(r["moh_p"]), med(r["ll_p"]), med(r["moh_d"]), med(r["ll_d"])
        print(f"{r['n']:>6} {cell(r['moh_p'], 0):>20} {cell(r['ll_p'], 0):>20} {mp / lp:>6.3f} "
              f"{cell(r['moh_d'], 1):>18} {cell(r['ll_d'], 1):>18} {md / ld:>6.3f}")
        rows.append({"context": c, "prompt": r["n"], "moh_prefill_tokens_per_s": mp, "llamacpp_prefill_tokens_per_s": lp,
                     "prefill_ratio": mp / lp, "moh_decode_tokens_per_s": md, "llamacpp_decode_tokens_per_s": ld,
                     "decode_ratio": md / ld, "all": r})
    print("(tokens/s, median (min-max) over the rounds; ratio = moh / llama.cpp of the medians)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cpu": cpu_model(), "threads": a.threads, "wait_policy": a.wait_policy, "load": load,
                       "rounds": a.repeats, "tokens": a.tokens, "llama_cpp_python": llama_cpp.__version__,
                       "ubatch": min(a.ubatch, nmax), "flash_attn": a.flash_attn, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
