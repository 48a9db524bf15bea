#!/usr/bin/env python3
"""Differential checker: the C engine's `moh layer` against the float64 PyTorch reference.

  python3 tools/ref/check_layer.py --moh build/moh --n 50 --seed 1 [--tol 1e-4]
        [--extra-args "--path reference"] [--keep DIR] [--case I] [--forward-only]
        [--explicit-config]
  python3 tools/ref/check_layer.py --self-test [--n 40] [--seed 1]

For each of n random configurations (router none/learned/query_norm, shared heads, top-k, GQA,
fused or split weights, biases, causal, RoPE, head_dim != C/h, B 1-3, N 1-40, beta in
{0, 0.01, 0.3}) it writes config.json, weights.safetensors, input.safetensors (x) and
grad_output.safetensors (dy) to a temporary folder, runs

  moh layer --config config.json --weights weights.safetensors --input input.safetensors
            --grad-output grad_output.safetensors --output out.safetensors <extra args>

and compares y, gates, lb_loss, grad.x and grad.<name> of every weight with the reference
(tools/ref/moh_layer_ref.py, float64 from the float32 inputs) by max|a-b| / max|b|. A gradient that
is zero in exact arithmetic (its reference max is below 1e-9 of the largest reference gradient; e.g.
grad.k bias without RoPE, grad.k for N = 1) is measured against that largest gradient instead.
An all-zero forward tensor (lb_loss of a router without a loss) is compared absolutely.

Some gradients are ill-conditioned in float32 whatever the implementation: with K = 1 the
renormalised routed gate is p/p = 1, so grad.wg gets only the small beta*lb_loss term plus the
rounding noise of an exactly cancelling y-path term (PyTorch float32 itself is off by up to ~1e-2
there). So the same case is also run through the reference in float32, and a tensor passes when its
error is <= max(tol, f32_slack * PyTorch-float32 error on that tensor) (--f32-slack, default 10;
0 makes it the plain tol test). The line then shows the float32 error and the allowance.

Inputs are resampled until no token is within 1e-3 (relative) of a top-k tie, so a float32
engine cannot legitimately choose different heads. Case i uses seed (seed, i) only: `--case i`
reruns it alone. Exit status: 0 all passed, 1 any failure, 2 usage/binary missing.

--self-test needs no binary: it checks the reference against a second, independently written
formulation in the style of the official code (torch.topk + one_hot, einsum gating, complex-number
RoPE, F.scaled_dot_product_attention, repeat_kv by expand), checks gradients by central finite
differences, checks the top-k tie rule, then runs the whole file/subprocess path against a float32
run of the reference (`--emulate-cli`, a stand-in for the binary used only by the self-test).
"""

import argparse
import contextlib
import io
import json
import math
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.numpy import load_file as np_load
from safetensors.torch import save_file as torch_save

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moh_layer_ref as R  # noqa: E402

MARGIN = 1e-3          # minimum relative routing-score gap at the top-k boundary
ZERO_GRAD_REL = 1e-9   # reference max below this fraction of the largest gradient: "exact zero"


# ------------------------------------------------------------------------------------------------
# Random configurations
# ------------------------------------------------------------------------------------------------
def random_config(rng, explicit=False):
    """(cfg dict as written to LAYER.json, weight style, B, N) from random.Random rng."""
    router = rng.choice(["none", "learned", "query_norm"])
    h = rng.randint(3 if router == "query_norm" else 1, 8)
    h_kv = rng.choice([k for k in range(1, h + 1) if h % k == 0])
    rope = rng.choice([None, None, 10000.0, 500000.0])
    d = rng.choice([2, 4, 6, 8, 12, 16] if rope else [1, 2, 3, 4, 5, 6, 8, 12, 16])
    if rng.random() < 0.35:
        C = h * d
    else:
        C = rng.randint(4, 48)
    if router == "none":
        h_s, K = h, 0
    elif router == "learned":
        if rng.random() < 0.15:
            h_s, K = h, 0
        else:
            h_s = rng.randint(0, h - 1)
            K = rng.randint(1, h - h_s)
    else:
        h_s = rng.randint(0, h - 2)
        K = rng.randint(1, h - h_s)
    cfg = {
        "hidden_size": C,
        "num_attention_heads": h,
        "num_key_value_heads": h_kv,
        "head_dim": d,
        "shared_heads": h_s,
        "top_k": K,
        "router": router,
        "causal": rng.random() < 0.5,
        "qkv_bias": rng.random() < 0.5,
        "proj_bias": rng.random() < 0.5,
        "rope_theta": rope,
        "load_balance_coef": rng.choice([0.0, 0.01, 0.3]),
    }
    if not explicit:  # exercise the documented defaults now and then
        if h_kv == h and rng.random() < 0.3:
            del cfg["num_key_value_heads"]
        if C == h * d and rng.random() < 0.3:
            del cfg["head_dim"]
        if rope is None and rng.random() < 0.5:
            del cfg["rope_theta"]
        if cfg["load_balance_coef"] == 0.0 and rng.random() < 0.3:
            del cfg["load_balance_coef"]
    style = rng.choice(["fused", "split"])
    B = rng.randint(1, 3)
    N = rng.choice([1, 2, rng.randint(1, 40), rng.randint(1, 40), rng.randint(1, 40)])
    return cfg, style, B, N


def describe(cfg, style, B, N):
    c = R.normalize_config(cfg)
    s = f"{c['router']:<10} h={c['num_attention_heads']} kv={c['num_key_value_heads']}"
    if c["router"] != "none":
        s += f" hs={c['shared_heads']} K={c['top_k']}"
    s += f" d={c['head_dim']} C={c['hidden_size']} B={B} N={N} {style}"
    s += f" bias={int(c['qkv_bias'])}{int(c['proj_bias'])}"
    s += " causal" if c["causal"] else " bidir"
    if c["rope_theta"] is not None:
        s += f" rope={c['rope_theta']:g}"
    s += f" beta={c['load_balance_coef']:g}"
    return s


def make_case(seed, i, explicit=False, max_tries=50):
    """Configuration and data of case i; resamples the data until routing has a safe margin."""
    rng = random.Random(seed * 1_000_003 + i)
    cfg, style, B, N = random_config(rng, explicit)
    for attempt in range(max_tries):
        gen = torch.Generator().manual_seed((seed * 1_000_003 + i) * 131 + attempt)
        W, x, dy = R.make_case(cfg, style, B, N, gen)
        margin = R.routing_margin(cfg, W, x)
        if margin >= MARGIN:
            return cfg, style, B, N, W, x, dy, margin
    return cfg, style, B, N, W, x, dy, margin


# ------------------------------------------------------------------------------------------------
# Files and comparison
# ------------------------------------------------------------------------------------------------
def write_case(folder, cfg, W, x, dy):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    torch_save({n: w.contiguous() for n, w in W.items()}, os.path.join(folder, "weights.safetensors"))
    torch_save({"x": x.contiguous()}, os.path.join(folder, "input.safetensors"))
    torch_save({"dy": dy.contiguous()}, os.path.join(folder, "grad_output.safetensors"))


def save_expected(path, ref):
    torch_save({n: t.to(torch.float32).contiguous() for n, t in ref.items()}, path)


def rel_errors(got, ref, require_f32=True):
    """{name: error} for every reference tensor (inf when missing / wrong shape / non-finite)
    plus a list of problems in words."""
    errs, problems = {}, []
    grad_scale = max([float(t.abs().max()) for n, t in ref.items()
                      if n.startswith("grad.") and t.numel()] + [0.0])
    for name, t in ref.items():
        b = t.numpy()
        if name not in got:
            errs[name] = math.inf
            problems.append(f"{name} missing")
            continue
        a = got[name]
        if require_f32 and a.dtype != np.float32:
            problems.append(f"{name} dtype {a.dtype}, expected float32")
            errs[name] = math.inf
            continue
        if tuple(a.shape) != tuple(b.shape):
            problems.append(f"{name} shape {tuple(a.shape)}, expected {tuple(b.shape)}")
            errs[name] = math.inf
            continue
        a = a.astype(np.float64)
        if not np.all(np.isfinite(a)):
            problems.append(f"{name} has non-finite values")
            errs[name] = math.inf
            continue
        if a.size == 0:
            errs[name] = 0.0
            continue
        diff = float(np.max(np.abs(a - b)))
        den = float(np.max(np.abs(b)))
        if name.startswith("grad.") and den < ZERO_GRAD_REL * grad_scale:
            den = grad_scale
        if den == 0.0:
            den = 1.0
        errs[name] = diff / den
    return errs, problems


def resolve_moh(moh):
    """The binary as an argv prefix: a path to an existing file, or else a shell-like command."""
    if os.path.isfile(moh):
        return [os.path.abspath(moh)]
    return shlex.split(moh)


def run_cases(args, moh_cmd, extra, indices, quiet_pass=False):
    passed = failed = 0
    worst_overall = None
    with_grad = not args.forward_only
    tmp_root = tempfile.mkdtemp(prefix="moh_check_layer_")
    try:
        for i in indices:
            cfg, style, B, N, W, x, dy, margin = make_case(args.seed, i, args.explicit_config)
            desc = describe(cfg, style, B, N)
            folder = os.path.join(tmp_root, f"case_{i:03d}")
            write_case(folder, cfg, W, x, dy)
            ref = R.reference(cfg, W, x, dy if with_grad else None)
            ref32 = R.reference(cfg, W, x, dy if with_grad else None, dtype=torch.float32)
            errs32, _ = rel_errors({n: t.numpy() for n, t in ref32.items()}, ref)
            out_path = os.path.join(folder, "out.safetensors")
            cmd = moh_cmd + ["layer", "--config", os.path.join(folder, "config.json"),
                             "--weights", os.path.join(folder, "weights.safetensors"),
                             "--input", os.path.join(folder, "input.safetensors")]
            if with_grad:
                cmd += ["--grad-output", os.path.join(folder, "grad_output.safetensors")]
            cmd += ["--output", out_path] + extra
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
                rc, so, se = proc.returncode, proc.stdout, proc.stderr
            except OSError as e:  # not executable, vanished while being rebuilt, ...
                rc, so, se = "oserror", "", str(e)
            except subprocess.TimeoutExpired as e:
                rc, so, se = "timeout", e.stdout or "", e.stderr or ""
                so = so if isinstance(so, str) else so.decode(errors="replace")
                se = se if isinstance(se, str) else se.decode(errors="replace")
            note = "" if margin >= MARGIN else f" (routing margin only {margin:.1e})"
            if rc != 0:
                msg = (se.strip().splitlines() or so.strip().splitlines() or [""])[-1]
                ok, verdict = False, f"exit {rc}: {msg[:200]}"
            elif not os.path.exists(out_path):
                ok, verdict = False, "no output file"
            else:
                try:
                    got = np_load(out_path)
                    errs, problems = rel_errors(got, ref)
                except Exception as e:  # unreadable output
                    errs, problems = {"output": math.inf}, [f"cannot read output: {e}"]
                # allowance: tol, or slack x what PyTorch float32 itself reaches on this tensor
                allowed = {n: max(args.tol, args.f32_slack * errs32.get(n, 0.0)) for n in errs}
                wname = max(errs, key=lambda n: errs[n] / allowed[n])
                werr = errs[wname]
                ok = not problems and all(errs[n] <= allowed[n] for n in errs)
                worst_overall = werr if worst_overall is None else max(worst_overall, werr)
                verdict = f"worst {wname} {werr:.2e}"
                if allowed[wname] > args.tol:
                    verdict += f" (torch f32 {errs32[wname]:.1e}, allowed {allowed[wname]:.1e})"
                if problems:
                    verdict += "; " + "; ".join(problems[:3])
            if ok:
                passed += 1
                if not quiet_pass:
                    print(f"[{i:3d}] PASS  {desc}  {verdict}{note}", flush=True)
            else:
                failed += 1
                print(f"[{i:3d}] FAIL  {desc}  {verdict}{note}", flush=True)
                if args.keep:
                    dst = os.path.join(args.keep, f"case_{i:03d}")
                    shutil.rmtree(dst, ignore_errors=True)
                    shutil.copytree(folder, dst)
                    save_expected(os.path.join(dst, "expected.safetensors"), ref)
                    with open(os.path.join(dst, "command.txt"), "w") as f:
                        f.write(" ".join(shlex.quote(a) for a in cmd) + "\n")
                        f.write(f"# seed {args.seed} case {i}: {desc}\n")
                        f.write(f"# exit {rc}\n# verdict: {verdict}\n")
                    with open(os.path.join(dst, "stdout.txt"), "w") as f:
                        f.write(so)
                    with open(os.path.join(dst, "stderr.txt"), "w") as f:
                        f.write(se)
            shutil.rmtree(folder, ignore_errors=True)
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)
    return passed, failed, worst_overall


# ------------------------------------------------------------------------------------------------
# Self-test: a second formulation, finite differences, the tie rule, the file path
# ------------------------------------------------------------------------------------------------
def official_style_layer(cfg, W, x):
    """The layer again, written after the official MoH-DiT / MoH-LLaMA3 code: flattened tokens,
    torch.topk + one_hot masks, einsum gating, l_aux = mean(me*ce)*E*E, per-head torch.norm
    logits, SDPA attention, repeat_kv by expand, and RoPE as a complex rotation of the pairs
    (j, j + d/2). Random data only: torch.topk's tie order is unspecified."""
    c = R.normalize_config(cfg)
    B, N, C = x.shape
    h, h_kv, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    h_s, K = c["shared_heads"], c["top_k"]
    E = h - h_s
    dt = x.dtype
    if "qkv.weight" in W:
        qkv = F.linear(x, W["qkv.weight"], W.get("qkv.bias"))
        q, k, v = torch.split(qkv, [h * d, h_kv * d, h_kv * d], dim=-1)
        w_o, b_o = W["proj.weight"], W.get("proj.bias")
    else:
        q = F.linear(x, W["q_proj.weight"], W.get("q_proj.bias"))
        k = F.linear(x, W["k_proj.weight"], W.get("k_proj.bias"))
        v = F.linear(x, W["v_proj.weight"], W.get("v_proj.bias"))
        w_o, b_o = W["o_proj.weight"], W.get("o_proj.bias")

    _x = x.reshape(B * N, C)
    l_aux = torch.zeros((), dtype=dt)
    if c["router"] == "none":
        masked_gates = torch.ones(B, N, h, dtype=dt)
    elif c["router"] == "learned" and K > 0:
        gates = F.softmax(F.linear(_x, W["wg.weight"]), dim=1)
        _, indices = torch.topk(gates, k=K, dim=1)
        mask = F.one_hot(indices, num_classes=E).sum(dim=1)
        me = gates.mean(dim=0)
        ce = mask.to(dt).mean(dim=0)
        l_aux = torch.mean(me * ce) * E * E
        rg = gates * mask
        rg = rg / torch.clamp(rg.sum(dim=1, keepdim=True), min=torch.finfo(torch.float32).eps)
        rg = rg.reshape(B, N, -1) * K
        if h_s > 0:
            if h_s > 1:
                sg = F.softmax(F.linear(_x, W["wg_1.weight"]), dim=1).reshape(B, N, -1) * h_s
            else:
                sg = torch.ones(B, N, 1, dtype=dt)
            w0 = F.softmax(F.linear(_x, W["wg_0.weight"]), dim=1).reshape(B, N, 2) * 2
            sg = torch.einsum("bn,bne->bne", w0[:, :, 0], sg)
            rg = torch.einsum("bn,bne->bne", w0[:, :, 1], rg)
            masked_gates = torch.cat([sg, rg], dim=2)
        else:
            masked_gates = rg
    elif c["router"] == "learned":  # K == 0, all shared
        if h > 1:
            masked_gates = F.softmax(F.linear(_x, W["wg_1.weight"]), dim=1).reshape(B, N, -1) * h
        else:
            masked_gates = torch.ones(B, N, 1, dtype=dt)
    else:  # query_norm
        g = q.reshape(-1, h, d)
        logits = torch.stack([torch.norm(g[:, i, :], p=2, dim=1) for i in range(h_s, h)], dim=1)
        logits = logits / logits.std(dim=1, keepdim=True)
        gates = F.softmax(logits, dim=1)
        _, indices = torch.topk(gates, k=K, dim=1)
        mask = F.one_hot(indices, num_classes=E).sum(dim=1)
        me = gates.mean(dim=0)
        ce = mask.to(dt).mean(dim=0)
        l_aux = torch.mean(me * ce) * E * E
        mask = mask.reshape(B, N, -1).to(dt)
        masked_gates = torch.cat([torch.ones(B, N, h_s, dtype=dt), mask], dim=-1)

    q = q.view(B, N, h, d).transpose(1, 2)
    k = k.view(B, N, h_kv, d).transpose(1, 2)
    v = v.view(B, N, h_kv, d).transpose(1, 2)
    if c["rope_theta"] is not None:
        half = d // 2
        inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2).float() / d))
        ang = (torch.arange(N).float()[:, None] * inv_freq[None, :]).to(dt)  # [N, d/2]
        rot = torch.polar(torch.ones_like(ang), ang)

        def rope(t):
            z = torch.complex(t[..., :half], t[..., half:]) * rot
            return torch.cat([z.real, z.imag], dim=-1)
        q, k = rope(q), rope(k)
    rep = h // h_kv
    if rep > 1:
        k = k[:, :, None].expand(B, h_kv, rep, N, d).reshape(B, h, N, d)
        v = v[:, :, None].expand(B, h_kv, rep, N, d).reshape(B, h, N, d)
    mask = torch.ones(N, N, dtype=torch.bool).tril() if c["causal"] else None
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    o = torch.einsum("bne,bned->bned", masked_gates, o.transpose(1, 2))
    y = F.linear(o.reshape(B, N, h * d), w_o, b_o)
    return {"y": y, "gates": masked_gates, "lb_loss": l_aux}


def finite_difference_check(cfg, W, x, dy, ref, rng, n_entries=6, eps=1e-6):
    """Central differences of L = sum(y*dy) + beta*lb_loss at random entries of x and every weight."""
    beta = R.normalize_config(cfg)["load_balance_coef"]
    x64 = x.double()
    W64 = {n: w.double() for n, w in W.items()}
    dy64 = dy.double()

    def loss(xx, WW):
        with torch.no_grad():
            out = R.moh_layer(cfg, WW, xx)
        return float((out["y"] * dy64).sum() + beta * out["lb_loss"])

    worst = 0.0
    scale = max(float(t.abs().max()) for n, t in ref.items() if n.startswith("grad."))
    for name in ["x"] + list(W64):
        t = x64 if name == "x" else W64[name]
        g = ref["grad." + name]
        for _ in range(n_entries):
            idx = tuple(rng.randrange(s) for s in t.shape)
            old = float(t[idx])
            t[idx] = old + eps
            lp = loss(x64, W64)
            t[idx] = old - eps
            lm = loss(x64, W64)
            t[idx] = old
            fd = (lp - lm) / (2 * eps)
            worst = max(worst, abs(fd - float(g[idx])) / max(scale, 1e-12))
    return worst


def self_test(args):
    failures = 0
    # 1. tie rule
    m = R.topk_mask(torch.tensor([[1.0, 2.0, 2.0, 0.0, 2.0], [3.0, 3.0, 3.0, 3.0, 3.0]]), 2)
    want = torch.tensor([[0.0, 1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0, 0.0]])
    ok = torch.equal(m, want)
    failures += not ok
    print(f"tie rule (lower index wins): {'PASS' if ok else 'FAIL'}")

    # 2. second formulation and finite differences, float64
    worst_alt = worst_fd = 0.0
    n = args.n
    for i in range(n):
        cfg, style, B, N, W, x, dy, margin = make_case(args.seed, i, args.explicit_config)
        ref = R.reference(cfg, W, x, dy)
        alt = R.reference(cfg, W, x, dy, layer_fn=official_style_layer)
        errs, problems = rel_errors({k: v.numpy() for k, v in alt.items()}, ref, require_f32=False)
        e_alt = max(errs.values())
        e_fd = finite_difference_check(cfg, W, x, dy, ref, random.Random(i)) if i < 20 else 0.0
        ok = e_alt <= 1e-9 and e_fd <= 1e-5 and not problems and margin >= MARGIN
        failures += not ok
        worst_alt, worst_fd = max(worst_alt, e_alt), max(worst_fd, e_fd)
        if not ok or args.verbose:
            print(f"[{i:3d}] {'PASS' if ok else 'FAIL'}  {describe(cfg, style, B, N)}  "
                  f"alt {e_alt:.1e} fd {e_fd:.1e} margin {margin:.1e}")
    print(f"second formulation: {n} configs, worst rel error {worst_alt:.2e} (limit 1e-9)")
    print(f"finite differences: {min(n, 20)} configs, worst error {worst_fd:.2e} "
          f"(limit 1e-5, relative to the largest gradient)")

    # 3. the whole file/subprocess path against a float32 run of the reference
    moh_cmd = [sys.executable, os.path.abspath(__file__), "--emulate-cli"]
    n_cli = min(n, 30)
    passed, failed, worst = run_cases(args, moh_cmd, [], range(n_cli), quiet_pass=not args.verbose)
    print(f"file path vs float32 reference: {passed} passed, {failed} failed, "
          f"worst rel error {worst or 0.0:.2e} (tol {args.tol:g})")
    failures += failed

    # 4. the checker must notice a wrong tensor and a crashing binary
    for bug in (["--inject-bug", "gates"], ["--inject-bug", "grad.x"], ["--crash"]):
        cmd = moh_cmd + bug[:1] if bug == ["--crash"] else moh_cmd
        extra = [] if bug == ["--crash"] else bug
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            p_, f_, _ = run_cases(args, cmd, extra, [0])
        ok = f_ == 1 and "FAIL" in buf.getvalue()
        failures += not ok
        print(f"detects {' '.join(bug)}: {'PASS' if ok else 'FAIL'}  ({buf.getvalue().strip()[:150]})")
    print("self-test " + ("PASSED" if failures == 0 else f"FAILED ({failures})"))
    return 0 if failures == 0 else 1


def emulate_cli(argv):
    """Stand-in for `moh layer` (self-test only): the reference run in float32."""
    p = argparse.ArgumentParser(prog="check_layer.py --emulate-cli")
    p.add_argument("command", choices=["layer"])
    p.add_argument("--config", required=True)
    p.add_argument("--weights", required=True)
    p.add_argument("--input", required=True)
    p.add_argument("--grad-output")
    p.add_argument("--output", required=True)
    p.add_argument("--path", choices=["sparse", "reference"], default="reference")
    p.add_argument("--inject-bug", help="perturb this output tensor by 1e-3 of its max (self-test)")
    a = p.parse_args(argv)
    with open(a.config) as f:
        cfg = json.load(f)
    W = {n: torch.from_numpy(v) for n, v in np_load(a.weights).items()}
    x = torch.from_numpy(np_load(a.input)["x"])
    dy = torch.from_numpy(np_load(a.grad_output)["dy"]) if a.grad_output else None
    out = R.reference(cfg, W, x, dy, dtype=torch.float32)
    if a.inject_bug:
        t = out[a.inject_bug]
        t.view(-1)[0] += 1e-3 * max(float(t.abs().max()), 1.0)
    save_expected(a.output, out)
    return 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--emulate-cli":
        return emulate_cli(sys.argv[2:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--moh", default="build/moh", help="the moh binary (default build/moh)")
    p.add_argument("--n", type=int, default=50, help="number of random configurations")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tol", type=float, default=1e-4, help="max relative error (default 1e-4)")
    p.add_argument("--extra-args", default="", help='appended to each run, e.g. "--path sparse"')
    p.add_argument("--keep", metavar="DIR", help="copy failing cases (inputs, expected, output) here")
    p.add_argument("--case", type=int, action="append",
                   help="run only this case index (repeatable)")
    p.add_argument("--forward-only", action="store_true", help="no --grad-output; y, gates, lb_loss")
    p.add_argument("--explicit-config", action="store_true",
                   help="always write every LAYER.json key (no defaults exercised)")
    p.add_argument("--f32-slack", type=float, default=10.0,
                   help="also accept an error up to this many times PyTorch's own float32 error on "
                        "the same tensor (ill-conditioned gradients); 0: plain --tol (default 10)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per binary run")
    p.add_argument("--self-test", action="store_true", help="test the reference; no binary needed")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args()

    if args.self_test:
        return self_test(args)
    moh_cmd = resolve_moh(args.moh)
    if not moh_cmd or (len(moh_cmd) == 1 and not shutil.which(moh_cmd[0])
                       and not os.path.isfile(moh_cmd[0])):
        print(f"check_layer: binary {args.moh!r} not found (build it first, or use --self-test)",
              file=sys.stderr)
        return 2
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
    indices = args.case if args.case else range(args.n)
    passed, failed, worst = run_cases(args, moh_cmd, shlex.split(args.extra_args), indices)
    worst = "n/a" if worst is None else f"{worst:.2e}"
    print(f"{passed} passed, {failed} failed (worst rel error {worst}, tol {args.tol:g})")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
