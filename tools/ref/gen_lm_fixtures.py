"""Writes the decoder-LM interop fixtures tests/fixtures/lm/<name>/ (read by tests/test_lm_interop.c).

Each fixture folder is a moh checkpoint directory plus the expected results of one training step:
  config.json          HF LlamaConfig fields + router, shared_heads, top_k, load_balance_coef
                       (the fields and order of src/models/lm_config.c's writer)
  model.safetensors    random F32 weights, names and order of src/models/lm.c lm_tensors
  batch.safetensors    tokens, targets [B, T] (F32 integers; a target -1 is ignored)
  expected.safetensors logits [B, T, V], ce [1], lb [1], loss [1] (= ce + beta * lb) and
                       grad.<name> for every parameter: the gradient of loss, float64 autograd
                       (tools/ref/lm_ref.py)

Dense fixtures (router "none") take their expected logits from transformers' LlamaForCausalLM
loaded with from_pretrained(<fixture dir>), i.e. the checkpoint loads into HF unchanged; lm_ref's
logits and gradients must agree with HF's (gradients: cross-entropy of the HF logits, autograd).
Every fixture's attention layers are also cross-checked against the independent single-layer
reference tools/ref/moh_layer_ref.py. Fixtures with a router are drawn until every top-k choice
is clear of ties (a float32 engine must make the same choices).

  python3 tools/ref/gen_lm_fixtures.py [--out tests/fixtures/lm] [--no-hf]
"""

import argparse
import json
import math
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lm_ref  # noqa: E402

try:
    import moh_layer_ref  # noqa: E402
except ImportError:  # the layer reference is optional for this script
    moh_layer_ref = None

B, T = 2, 16
MIN_MARGIN = 2e-3  # relative gap between the K-th and (K+1)-th router logit, every token/layer


def base_config(**kw):
    """A config.json dict with exactly the keys, in the order, of moh_lm_config_to_json."""
    c = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 8,
        "head_dim": 4, "intermediate_size": 64, "vocab_size": 256, "max_position_embeddings": 64,
        "rms_norm_eps": 1e-5, "rope_theta": 10000, "tie_word_embeddings": False,
        "attention_bias": False, "mlp_bias": False, "torch_dtype": "float32",
        "router": "learned", "shared_heads": 0, "top_k": 0, "load_balance_coef": 0.01,
    }
    for k, v in kw.items():
        if k not in c and k != "straight_through":  # written only for router query_norm
            raise KeyError(k)
        c[k] = v
    return c


FIXTURES = {
    # dense LLaMA, untied head, MHA
    "dense": dict(config=base_config(num_attention_heads=4, num_key_value_heads=4, head_dim=8,
                                     router="none", rope_theta=10000, rms_norm_eps=1e-5),
                  seed=11, hf=True),
    # dense, tied head, GQA (4 query heads on 2 KV heads), LLaMA-3 rope base
    "dense_tied_gqa": dict(config=base_config(num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                              router="none", rope_theta=500000, rms_norm_eps=1e-6,
                                              tie_word_embeddings=True),
                           seed=12, hf=True),
    # MoH: 2 shared + top-4 of 6 routed heads = 75 % of the heads per token
    "moh_75": dict(config=base_config(num_attention_heads=8, num_key_value_heads=8, head_dim=4,
                                      router="learned", shared_heads=2, top_k=4, load_balance_coef=0.01),
                   seed=13, hf=False),
    # MoH with one shared head (constant shared gate, no wg_1), GQA 8 on 2, tied, heavy lb weight
    # converted-model recipe (issue 11): query-norm router with the straight-through estimator,
    # SmolLM2's head layout in small: 9 query heads on 3 KV heads, 3 shared + top-4 of 6 (7/9)
    "qnorm_ste_gqa": dict(config=base_config(num_attention_heads=9, num_key_value_heads=3, head_dim=4,
                                             router="query_norm", shared_heads=3, top_k=4,
                                             load_balance_coef=0.01, tie_word_embeddings=True,
                                             straight_through=True),
                          seed=15, hf=False),
    "moh_hs1_gqa": dict(config=base_config(num_attention_heads=8, num_key_value_heads=2, head_dim=4,
                                           router="learned", shared_heads=1, top_k=3,
                                           load_balance_coef=0.5, tie_word_embeddings=True),
                        seed=14, hf=False),
}


def rel_err(a, b):
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    den = float(b.abs().max()) if b.numel() else 0.0
    return float((a - b).abs().max()) / max(den, 1e-30) if b.numel() else 0.0


def write_config(path, cfg):
    with open(path, "w") as f:
        json.dump(cfg, f, indent="\t")
        f.write("\n")


def draw(cfg, seed):
    """Model (float64, float32-representable weights), tokens, targets, seed used."""
    for attempt in range(200):
        s = seed * 1000 + attempt
        gen = torch.Generator().manual_seed(s)
        model = lm_ref.random_init(lm_ref.MohLM(cfg), gen).double()
        seq = torch.randint(0, cfg["vocab_size"], (B, T + 1), generator=gen)
        tokens, targets = seq[:, :T].clone(), seq[:, 1:].clone()
        targets[1, T // 2] = -1  # one ignored target
        if lm_ref.routing_margin(model, tokens) >= MIN_MARGIN:
            return model, tokens, targets, s
    raise RuntimeError(f"no tie-free draw for seed {seed}")


def check_layers(model, tokens, cfg, report):
    """Every attention layer against moh_layer_ref.moh_layer on the same input."""
    if moh_layer_ref is None:
        report.append("moh_layer_ref absent: layer cross-check skipped")
        return 0.0
    captured = []
    hooks = [blk.self_attn.register_forward_hook(lambda m, i, o: captured.append((m, i[0], o)))
             for blk in model.model.layers]
    with torch.no_grad():
        model(tokens)
    for h in hooks:
        h.remove()
    c = model.c
    lcfg = {"hidden_size": c["hidden_size"], "num_attention_heads": c["num_attention_heads"],
            "num_key_value_heads": c["num_key_value_heads"], "head_dim": c["head_dim"],
            "router": c["router"], "causal": True, "rope_theta": c["rope_theta"],
            "load_balance_coef": c["load_balance_coef"]}
    if c["router"] != "none":
        lcfg["shared_heads"], lcfg["top_k"] = c["shared_heads"], c["top_k"]
    worst = 0.0
    for mod, x, (y, lb, _) in captured:
        W = {n: p.detach() for n, p in mod.named_parameters()}
        with torch.no_grad():
            out = moh_layer_ref.moh_layer(lcfg, W, x)
        worst = max(worst, rel_err(y, out["y"]), abs(float(lb) - float(out["lb_loss"])))
    if worst > 1e-5:
        raise AssertionError(f"lm_ref attention disagrees with moh_layer_ref: {worst:.3g}")
    return worst


def hf_check(fdir, model, tokens, targets, logits_ref, grads_ref):
    """Loads fdir in transformers' LlamaForCausalLM (float64); returns its logits and the
    errors of lm_ref against it (logits, every gradient of the HF cross-entropy)."""
    import transformers
    from transformers import LlamaForCausalLM

    transformers.logging.disable_progress_bar()
    hf = LlamaForCausalLM.from_pretrained(fdir, dtype=torch.float64)
    hf.eval()
    out = hf(input_ids=tokens)
    V = out.logits.shape[-1]
    ce = torch.nn.functional.cross_entropy(out.logits.reshape(-1, V), targets.reshape(-1), ignore_index=-1)
    ce.backward()
    hp = dict(hf.named_parameters())
    gerr = 0.0
    for n, g in grads_ref.items():
        gerr = max(gerr, rel_err(hp[n].grad, g))
    if model.c["tie_word_embeddings"]:  # one shared tensor: HF lists the embedding only
        assert "lm_head.weight" not in hp and hf.lm_head.weight is hp["model.embed_tokens.weight"]
    return out.logits.detach(), rel_err(out.logits.detach(), logits_ref), gerr


def generate(name, spec, out_root, use_hf):
    cfg = spec["config"]
    fdir = os.path.join(out_root, name)
    os.makedirs(fdir, exist_ok=True)
    model, tokens, targets, seed = draw(cfg, spec["seed"])
    report = [f"seed {seed}"]

    write_config(os.path.join(fdir, "config.json"), cfg)
    named = model.named_tensors()
    save_file({n: p.detach().float().contiguous() for n, p in named.items()},
              os.path.join(fdir, "model.safetensors"))
    save_file({"tokens": tokens.float().contiguous(), "targets": targets.float().contiguous()},
              os.path.join(fdir, "batch.safetensors"))

    logits, ce, lb, total = model.loss(tokens, targets)
    grads = torch.autograd.grad(total, list(named.values()))
    grads = {n: g.detach() for n, g in zip(named, grads)}
    report.append(f"ce {ce.item():.6f} lb {lb.item():.6f} loss {total.item():.6f}")
    report.append(f"layer-ref max err {check_layers(model, tokens, cfg, report):.2e}")
    if model.c["router"] == "query_norm" and model.c["straight_through"]:
        # the straight-through term must change the gradients, or the fixture proves nothing
        model.c["straight_through"] = False
        plain = torch.autograd.grad(model.loss(tokens, targets)[3], list(named.values()))
        model.c["straight_through"] = True
        qn = [n for n in named if n.endswith("q_proj.weight")]
        d = max(rel_err(grads[n], g) for n, g in zip(named, plain) if n in qn)
        if d < 1e-3:
            raise AssertionError(f"{name}: the STE barely changes the q_proj gradients ({d:.3g})")
        report.append(f"STE changes q_proj grads by {d:.2e} rel")
    if cfg["router"] != "none":
        report.append(f"routing margin {lm_ref.routing_margin(model, tokens):.2e}")

    exp_logits = logits.detach()
    if spec["hf"] and use_hf:
        hf_logits, lerr, gerr = hf_check(fdir, model, tokens, targets, exp_logits, grads)
        if lerr > 1e-5 or gerr > 1e-5:
            raise AssertionError(f"{name}: lm_ref vs transformers: logits {lerr:.3g}, grads {gerr:.3g}")
        exp_logits = hf_logits  # the expected logits are transformers' own
        report.append(f"transformers logits: lm_ref rel err {lerr:.2e}, grads rel err {gerr:.2e}")
        # rope_theta must matter at this size, so that the agreement proves HF read it
        alt = dict(cfg, rope_theta=10000 if cfg["rope_theta"] != 10000 else 500000)
        m2 = lm_ref.load_state(lm_ref.MohLM(alt).double(), {n: p.detach() for n, p in named.items()})
        with torch.no_grad():
            sens = rel_err(m2(tokens)[0], exp_logits)
        assert sens > 1e-3, f"{name}: rope_theta barely changes the logits ({sens:.3g})"
    elif spec["hf"]:
        report.append("transformers check skipped (--no-hf): expected logits are lm_ref's")

    exp = {"logits": exp_logits.float().contiguous(),
           "ce": ce.detach().reshape(1).float(), "lb": lb.detach().reshape(1).float(),
           "loss": total.detach().reshape(1).float()}
    for n, g in grads.items():
        exp["grad." + n] = g.float().contiguous()
    save_file(exp, os.path.join(fdir, "expected.safetensors"))
    size = sum(os.path.getsize(os.path.join(fdir, f)) for f in os.listdir(fdir))
    print(f"{name:16s} {size / 1024:6.1f} KiB  " + "; ".join(report))
    return size


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "..", "..", "tests", "fixtures", "lm"))
    ap.add_argument("--no-hf", action="store_true", help="do not use transformers (dense logits from lm_ref)")
    ap.add_argument("--only", nargs="*", help="fixture names")
    args = ap.parse_args()
    torch.set_grad_enabled(True)
    total = 0
    for name, spec in FIXTURES.items():
        if args.only and name not in args.only:
            continue
        total += generate(name, spec, os.path.normpath(args.out), not args.no_hf)
    print(f"total {total / 1024:.1f} KiB")
    if total > 1.5 * 1024 * 1024:
        print("warning: fixtures exceed 1.5 MB", file=sys.stderr)


if __name__ == "__main__":
    main()
