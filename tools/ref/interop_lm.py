"""moh -> PyTorch interop of the decoder LM, through the CLI (`make interop`).

For a tiny dense config (router "none") and a tiny MoH config (learned router), in a temp dir:
  (a) train    `moh train --config CFG --data TXT --out DIR --steps 3 --batch-size 2 --seq-len 32
               --seed 1`; the checkpoint it writes must load unchanged: into tools/ref/lm_ref.py
               (exact tensor names and shapes) and, dense, into transformers' LlamaForCausalLM
               (no missing, unexpected or mismatched keys).
  (b) eval     `moh eval --checkpoint DIR --data TXT --seq-len 32 --dump-logits OUT` writes tokens
               [1, T] and logits [1, T, V] of the first eval chunk: they must match transformers
               (dense) / lm_ref (MoH) on the same tokens, relative error <= 1e-4.
  (c) grads    `moh train ... --steps 1 --dump-grads G` writes tokens, targets [B, T], init.<name>
               (the initial weights) and grad.<name> (the first step's gradient of ce + beta * lb,
               before clipping): lm_ref (float64 autograd) from init.* must reproduce every
               gradient <= 1e-4 (dense: transformers' cross-entropy gradient too).
Prints PASS/FAIL per check and exits 1 if any failed.

  python3 tools/ref/interop_lm.py [--moh build/moh] [--keep] [--tol 1e-4]
"""

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import traceback

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lm_ref  # noqa: E402

SEQ, BATCH = 32, 2

BASE = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 8, "intermediate_size": 64, "vocab_size": 256, "max_position_embeddings": SEQ,
    "rms_norm_eps": 1e-5, "rope_theta": 10000, "tie_word_embeddings": False,
    "attention_bias": False, "mlp_bias": False, "torch_dtype": "float32",
}
CONFIGS = {
    # dense LLaMA twin: GQA 4 on 2, untied head
    "dense": dict(BASE, router="none", shared_heads=0, top_k=0, load_balance_coef=0.01),
    # MoH: 2 shared + top-3 of 6 routed heads, GQA 8 on 4, tied head, visible load-balance term
    "moh": dict(BASE, num_attention_heads=8, num_key_value_heads=4, head_dim=4, tie_word_embeddings=True,
                router="learned", shared_heads=2, top_k=3, load_balance_coef=0.1),
}


class Checks:
    def __init__(self):
        self.results = []

    def record(self, name, ok, detail):
        self.results.append((name, ok))
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)

    def run(self, name, fn):
        """fn() -> (ok, detail); an exception is a failure with its message."""
        try:
            ok, detail = fn()
        except Exception as e:  # noqa: BLE001 - every error is a reported failure
            ok, detail = False, f"{type(e).__name__}: {e}"
            if os.environ.get("INTEROP_DEBUG"):
                traceback.print_exc()
        self.record(name, ok, detail)
        return ok


def rel_err(a, b):
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).abs().max()) / max(float(b.abs().max()), 1e-30)


def write_text(path, n_bytes=65536, seed=7):
    """Deterministic English-like text (bytes are the tokens)."""
    rnd = random.Random(seed)
    words = ("the of and to in a is that for it as was with be by on not he this are or his from at "
             "which but have an they you were her she there been one all we their has would when if "
             "so no will more can out up into do any your what some these them than time could "
             "mixture heads attention router token layer shared routed gate softmax").split()
    out, size = [], 0
    while size < n_bytes:
        sent = " ".join(rnd.choice(words) for _ in range(rnd.randint(5, 14)))
        sent = sent[0].upper() + sent[1:] + rnd.choice([".", ".", ".", "?", "!"]) + ("\n" if rnd.random() < 0.2 else " ")
        out.append(sent)
        size += len(sent)
    with open(path, "w") as f:
        f.write("".join(out))


def run_cli(cmd, timeout=600):
    print("  $ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        tail = (p.stderr.strip() or p.stdout.strip()).splitlines()[-3:]
        raise RuntimeError(f"exit {p.returncode}: {' | '.join(tail)}")
    return p


def find_checkpoint(out):
    """The checkpoint directory the trainer wrote: out itself, or its newest subdirectory holding
    config.json and model.safetensors."""
    def is_ckpt(d):
        return os.path.isfile(os.path.join(d, "config.json")) and os.path.isfile(os.path.join(d, "model.safetensors"))

    if is_ckpt(out):
        return out
    cands = []
    for root, dirs, _ in os.walk(out):
        for d in dirs:
            p = os.path.join(root, d)
            if is_ckpt(p):
                cands.append(p)
    if not cands:
        raise FileNotFoundError(f"no checkpoint (config.json + model.safetensors) under {out}")
    return max(cands, key=lambda p: os.path.getmtime(os.path.join(p, "model.safetensors")))


def load_hf(path, dtype=torch.float64):
    """transformers' LlamaForCausalLM from a checkpoint dir; raises unless every key matched."""
    import transformers
    from transformers import LlamaForCausalLM

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    model, info = LlamaForCausalLM.from_pretrained(path, dtype=dtype, output_loading_info=True)
    bad = {k: sorted(v) for k, v in info.items() if v}
    if bad:
        raise RuntimeError(f"transformers loaded {path} with {bad}")
    return model.eval()


def margin_note(model, tokens):
    m = lm_ref.routing_margin(model, tokens)
    return "" if math.isinf(m) else f", routing margin {m:.1e}" + (
        " (near-tie: a float32 engine may pick another head)" if m < 1e-5 else "")


# ------------------------------------------------------------------------------------------------
def check_train(ck, moh, name, cfg_path, data, work):
    out = os.path.join(work, f"{name}_train")
    state = {}

    def train():
        run_cli([moh, "train", "--config", cfg_path, "--data", data, "--out", out, "--steps", "3",
                 "--batch-size", str(BATCH), "--seq-len", str(SEQ), "--seed", "1"])
        state["ckpt"] = find_checkpoint(out)
        with open(os.path.join(state["ckpt"], "config.json")) as f:
            written = json.load(f)
        with open(cfg_path) as f:
            asked = json.load(f)
        diff = {k: (asked[k], written.get(k)) for k in asked
                if k not in ("torch_dtype", "architectures") and written.get(k) != asked[k]}
        if diff:
            return False, f"config.json differs from the training config: {diff}"
        model = lm_ref.load_moh_checkpoint(state["ckpt"])  # strict: exact names and shapes
        state["model"] = model
        n = len(lm_ref.tensor_shapes(model.c))
        return True, f"{os.path.relpath(state['ckpt'], work)}: {n} tensors load into lm_ref unchanged"

    if not ck.run(f"{name}: (a) train 3 steps, checkpoint loads in lm_ref", train):
        return None
    if CONFIGS[name]["router"] == "none":
        def hf_load():
            hf = load_hf(state["ckpt"])
            tok = torch.arange(SEQ).reshape(1, SEQ) % 256
            with torch.no_grad():
                e = rel_err(hf(input_ids=tok).logits, state["model"](tok)[0])
            return e <= 1e-5, f"LlamaForCausalLM.from_pretrained: no missing/unexpected keys; logits vs lm_ref {e:.2e}"
        ck.run(f"{name}: (a) checkpoint loads in transformers unchanged", hf_load)
    return state.get("ckpt")


def check_eval(ck, moh, name, ckpt, data, work, tol):
    dump = os.path.join(work, f"{name}_logits.safetensors")

    def ev():
        run_cli([moh, "eval", "--checkpoint", ckpt, "--data", data, "--seq-len", str(SEQ),
                 "--dump-logits", dump])
        d = load_file(dump)
        tokens = d["tokens"]
        ids = tokens.long()
        if tokens.dim() != 2 or tokens.shape[0] != 1 or not torch.equal(ids.to(tokens.dtype), tokens):
            return False, f"tokens: shape {tuple(tokens.shape)}, expected [1, T] integer ids"
        logits = d["logits"]
        V = CONFIGS[name]["vocab_size"]
        if tuple(logits.shape) != (1, ids.shape[1], V):
            return False, f"logits: shape {tuple(logits.shape)}, expected [1, {ids.shape[1]}, {V}]"
        model = lm_ref.load_moh_checkpoint(ckpt)
        with torch.no_grad():
            ref_lm = model(ids)[0]
        if CONFIGS[name]["router"] == "none":
            with torch.no_grad():
                ref = load_hf(ckpt)(input_ids=ids).logits
            e, e2 = rel_err(logits, ref), rel_err(ref_lm, ref)
            return e <= tol, f"T={ids.shape[1]}: moh vs transformers {e:.2e} (lm_ref vs transformers {e2:.2e})"
        e = rel_err(logits, ref_lm)
        return e <= tol, f"T={ids.shape[1]}: moh vs lm_ref {e:.2e}{margin_note(model, ids)}"

    ref_name = "transformers" if CONFIGS[name]["router"] == "none" else "lm_ref"
    ck.run(f"{name}: (b) eval --dump-logits vs {ref_name}", ev)


def check_grads(ck, moh, name, cfg_path, data, work, tol):
    out = os.path.join(work, f"{name}_grads_run")
    dump = os.path.join(work, f"{name}_grads.safetensors")
    cfg = CONFIGS[name]

    def grads():
        run_cli([moh, "train", "--config", cfg_path, "--data", data, "--out", out, "--steps", "1",
                 "--batch-size", str(BATCH), "--seq-len", str(SEQ), "--seed", "1", "--dump-grads", dump])
        d = load_file(dump)
        tokens, targets = d["tokens"], d["targets"]
        if tokens.dim() != 2 or tokens.shape != targets.shape:
            return False, f"tokens {tuple(tokens.shape)}, targets {tuple(targets.shape)}: expected [B, T] each"
        shapes = lm_ref.tensor_shapes(cfg)
        for pre in ("init.", "grad."):
            have = {k[len(pre):] for k in d if k.startswith(pre)}
            if have != set(shapes):
                return False, (f"{pre}*: missing {sorted(set(shapes) - have)}, "
                               f"unexpected {sorted(have - set(shapes))}")
        model = lm_ref.load_state(lm_ref.MohLM(cfg).double(), {n: d["init." + n] for n in shapes})
        ids, tg = tokens.long(), targets.long()
        _, ce, lb, total = model.loss(ids, tg)
        named = model.named_tensors()
        g = dict(zip(named, torch.autograd.grad(total, list(named.values()))))
        worst, wname = 0.0, ""
        for n in shapes:
            e = rel_err(d["grad." + n], g[n])
            if e > worst:
                worst, wname = e, n
        detail = (f"B={ids.shape[0]} T={ids.shape[1]} ce {ce.item():.4f} lb {lb.item():.4f}: "
                  f"{len(shapes)} gradients, worst rel err {worst:.2e} ({wname}){margin_note(model, ids)}")
        ok = worst <= tol
        if cfg["router"] == "none":  # the same gradients from transformers
            ref_dir = os.path.join(work, f"{name}_init_ckpt")
            os.makedirs(ref_dir, exist_ok=True)
            with open(os.path.join(ref_dir, "config.json"), "w") as f:
                json.dump(cfg, f, indent="\t")
            save_file({n: d["init." + n].contiguous() for n in shapes}, os.path.join(ref_dir, "model.safetensors"))
            hf = load_hf(ref_dir)
            logits = hf(input_ids=ids).logits
            V = logits.shape[-1]
            torch.nn.functional.cross_entropy(logits.reshape(-1, V), tg.reshape(-1), ignore_index=-1).backward()
            hp = dict(hf.named_parameters())
            hw = max(rel_err(d["grad." + n], hp[n].grad) for n in shapes)
            ok = ok and hw <= tol
            detail += f"; vs transformers {hw:.2e}"
        return ok, detail

    ck.run(f"{name}: (c) train --dump-grads vs lm_ref autograd", grads)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    root = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    ap.add_argument("--moh", default=os.path.join(root, "build", "moh"), help="moh binary")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    ap.add_argument("--only", nargs="*", choices=list(CONFIGS))
    args = ap.parse_args()
    torch.set_grad_enabled(True)
    ck = Checks()
    if not os.access(args.moh, os.X_OK):
        ck.record("moh binary", False, f"{args.moh} not found or not executable (run make first)")
        return 1
    work = tempfile.mkdtemp(prefix="moh_interop_")
    try:
        data = os.path.join(work, "data.txt")
        write_text(data)
        for name, cfg in CONFIGS.items():
            if args.only and name not in args.only:
                continue
            cfg_path = os.path.join(work, f"{name}.json")
            with open(cfg_path, "w") as f:
                json.dump(cfg, f, indent="\t")
            ckpt = check_train(ck, args.moh, name, cfg_path, data, work)
            if ckpt:
                check_eval(ck, args.moh, name, ckpt, data, work, args.tol)
            else:
                ck.record(f"{name}: (b) eval --dump-logits", False, "no checkpoint from (a)")
            check_grads(ck, args.moh, name, cfg_path, data, work, args.tol)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    failed = [n for n, ok in ck.results if not ok]
    print(f"interop: {len(ck.results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
