#!/usr/bin/env python3
"""moh vs llama.cpp on the same GGUF file, in the same run: prefill and decode tokens/s.

Rounds alternate the two engines (moh, llama.cpp, then llama.cpp, moh, ...), so a slow period of a
shared machine hits both alike; each engine runs in a process of its own. Per round, wait policy
and prompt length:
  moh:       `moh bench decode --model M --precision P --context C --tokens N --repeats 1 --threads T --seed S
             --json` (prefill: the prompt in one batched forward on the head-sparse path, filling the KV
             cache; decode: N greedy KV-cache steps; --precision gguf (default): decoding from the file's
             own Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q4_K / Q5_K / Q6_K blocks on the integer units, as llama.cpp; bf16 / fp32 also);
  llama.cpp: this script's --worker: llama-cpp-python on the same file (its own quantised kernels), n_threads and
             n_threads_batch T, n_batch >= the longest prompt, flash attention on, the same prompt
             ids (splitmix64(S) % vocab, checked against moh's prompt hash), eval(prompt) timed,
             then N greedy steps (argmax of the last logits, eval([token])) timed, after a warm-up.
             --extra-bufts auto (default): llama.cpp's extra buffer types (its AMX kernels on a CPU
             with AMX) as llama.cpp defaults, unless a probe process crashes with them (seen on a VM
             exposing AMX: SIGSEGV in ggml_backend_amx_mul_mat), then off, and the table says so.
--wait-policy: own (each engine's default: OMP_WAIT_POLICY and GOMP_SPINCOUNT unset), passive,
active (llama.cpp's CPU backend here is built on libgomp too); the headline takes each engine's
best. Prints medians over rounds per policy and the ratios moh / llama.cpp.
Needs numpy and llama-cpp-python.
"""
import argparse
import json
import statistics
import subprocess
import sys
import time

import bench_common as bc
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


def worker(a, ctxs):
    """llama.cpp's side of one round: prefill and decode tokens/s per prompt length; prints JSON."""
    import numpy as np
    import llama_cpp
    from llama_cpp import Llama
    nmax = max(ctxs)
    if a.extra_bufts == "off":  # llama_model_params.use_extra_bufts (llama.cpp's --no-extra-bufts)
        import llama_cpp.llama as ll
        default_params = ll.llama_cpp.llama_model_default_params

        def no_extra():
            p = default_params()
            p.use_extra_bufts = False
            return p
        ll.llama_cpp.llama_model_default_params = no_extra
    llm = Llama(model_path=a.model, n_ctx=nmax + a.tokens + 16, n_batch=nmax, n_ubatch=min(a.ubatch, nmax),
                n_threads=a.threads, n_threads_batch=a.threads, flash_attn=a.flash_attn, verbose=False)
    V = llm.n_vocab()
    prompt = splitmix_ids(a.seed, nmax, V)

    def run(n):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt[:n])
        t1 = time.perf_counter()
        for _ in range(a.tokens):
            logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(V,))
            llm.eval([int(logits.argmax())])
        t2 = time.perf_counter()
        return n / (t1 - t0), a.tokens / (t2 - t1)

    run(min(64, nmax))  # warm-up (moh warms up inside its run)
    json.dump({"vocab": V, "n_ctx": llm.n_ctx(), "version": llama_cpp.__version__,
               "rates": {str(c): run(c) for c in ctxs}}, sys.stdout)
    return 0


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
    ap.add_argument("--wait-policy", default="own,passive",
                    help="OpenMP wait policies, each engine in its own processes: own (its default), passive, "
                         "active (default own,passive; the headline takes each engine's best)")
    ap.add_argument("--precision", default="gguf",
                    help="moh's decode precision (moh bench decode --precision: gguf = the file's blocks, default)")
    ap.add_argument("--extra-bufts", default="auto", choices=("auto", "on", "off"),
                    help="llama.cpp's extra buffer types (AMX); auto: on unless a probe crashes (default)")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    ctxs = [int(c) for c in a.context.split(",")]
    if a.worker:
        return worker(a, ctxs)
    pols = bc.policies(a)
    if a.extra_bufts == "auto":
        probe = subprocess.run([sys.executable, sys.argv[0], "--worker", "--model", a.model, "--context", "64",
                                "--tokens", "2", "--threads", str(a.threads), "--extra-bufts", "on"],
                               capture_output=True)
        a.extra_bufts = "on" if probe.returncode == 0 else "off"
        if probe.returncode:
            print(f"llama.cpp with its extra buffer types crashed (exit {probe.returncode}): running without them",
                  file=sys.stderr)
        sys.argv += ["--extra-bufts", a.extra_bufts]  # the workers inherit the choice
    moh_cmd = [a.moh, "bench", "decode", "--model", a.model, "--precision", a.precision, "--context", a.context,
               "--tokens", str(a.tokens),
               "--repeats", "1", "--threads", str(a.threads), "--seed", str(a.seed), "--json"]
    res = {c: {k: {p: [] for p in pols} for k in ("moh_p", "moh_d", "ll_p", "ll_d")} for c in ctxs}
    hashes, info, nprompt = {}, {}, {c: c for c in ctxs}
    for rnd in range(a.repeats):
        for pol in pols:
            for engine in (("moh", "llama") if rnd % 2 == 0 else ("llama", "moh")):
                print(f"[round {rnd + 1}/{a.repeats}, {pol}] {engine}", file=sys.stderr, flush=True)
                if engine == "moh":
                    for r in bc.run_moh(moh_cmd, a.threads, pol):
                        c = r["context"]
                        nprompt[c] = r["prompt"]
                        hashes[r["prompt"]] = r["prompt_hash"]
                        res[c]["moh_p"][pol].append(r["prefill_tokens_per_s"])
                        res[c]["moh_d"][pol].append(r["decode_tokens_per_s"])
                else:
                    info = bc.run_worker(a, pol)  # llama.cpp, in this script's --worker
                    for c in ctxs:
                        p, d = info["rates"][str(c)]
                        res[c]["ll_p"][pol].append(p)
                        res[c]["ll_d"][pol].append(d)
    V = info["vocab"]
    for n, h in hashes.items():
        if h != fnv1a(splitmix_ids(a.seed, n, V)):
            sys.exit(f"prompt ids differ between moh and llama.cpp at prompt {n}")
    med = statistics.median
    print(f"{cpu_model()}; {a.threads} thread{'s' if a.threads != 1 else ''}; wait policies {a.wait_policy} (each engine in its own process; own = "
          f"its default); load average {bc.load_average()}; {a.repeats} rounds (median), engines alternated")
    print(f"model {a.model}: vocab {V}; prompt ids splitmix64 seed {a.seed}; {a.tokens} new tokens (greedy)")
    print(f"llama.cpp: llama-cpp-python {info['version']}, n_batch {max(ctxs)}, n_ubatch {min(a.ubatch, max(ctxs))}, "
          f"flash_attn {'on' if a.flash_attn else 'off'}, KV cache F16, n_ctx {info['n_ctx']}, extra buffer types "
          f"(AMX) {a.extra_bufts}")
    print(f"moh: {' '.join(moh_cmd)}")
    print("tokens/s, median (min-max) over the rounds, per policy")
    for c in ctxs:
        for k, name in (("moh_p", "moh prefill"), ("ll_p", "llama.cpp prefill"), ("moh_d", "moh decode"),
                        ("ll_d", "llama.cpp decode")):
            print(f"{nprompt[c]:>6} {name:<18} " + " ".join(f"{p} {bc.cell(res[c][k][p], 1):>22}" for p in pols))
    print("headline, each engine at its best policy (ratio = moh / llama.cpp of the medians)")
    rows = []
    for c in ctxs:
        r = res[c]
        (mpp, mp), (lpp, lp) = bc.best_policy(r["moh_p"]), bc.best_policy(r["ll_p"])
        (mdp, md), (ldp, ld) = bc.best_policy(r["moh_d"]), bc.best_policy(r["ll_d"])
        print(f"{nprompt[c]:>6} prefill moh {med(mp):.0f} ({mpp}) / llama.cpp {med(lp):.0f} ({lpp}) = "
              f"{med(mp) / med(lp):.3f}; decode moh {med(md):.1f} ({mdp}) / llama.cpp {med(ld):.1f} ({ldp}) = "
              f"{med(md) / med(ld):.3f}")
        rows.append({"context": c, "prompt": nprompt[c], "moh_prefill_tokens_per_s": med(mp), "moh_prefill_policy": mpp,
                     "llamacpp_prefill_tokens_per_s": med(lp), "llamacpp_prefill_policy": lpp,
                     "prefill_ratio": med(mp) / med(lp), "moh_decode_tokens_per_s": med(md), "moh_decode_policy": mdp,
                     "llamacpp_decode_tokens_per_s": med(ld), "llamacpp_decode_policy": ldp,
                     "decode_ratio": med(md) / med(ld), "all": r})
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cpu": cpu_model(), "threads": a.threads, "policies": pols, "load": bc.load_average(),
                       "rounds": a.repeats, "tokens": a.tokens, "llama_cpp_python": info["version"],
                       "ubatch": min(a.ubatch, max(ctxs)), "flash_attn": a.flash_attn, "extra_bufts": a.extra_bufts,
                       "moh_precision": a.precision, "rows": rows}, f, indent=1)
    return 0

if __name__ == "__main__":
    sys.exit(main())
