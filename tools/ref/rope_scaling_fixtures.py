#!/usr/bin/env python3
"""Writes tests/fixtures/lm_rope/<name>/: tiny Hugging Face LLaMA folders whose config.json has a
`rope_scaling`, with the logits transformers computes for them (read by tests/test_lm_rope.c).

  llama3  rope_scaling {"rope_type": "llama3", factor 4, low_freq_factor 1, high_freq_factor 4,
          original_max_position_embeddings 32}, tied embeddings. head_dim 16, rope_theta 10000:
          wavelengths 6.3, 19.9, 62.8, ... so pair 0 is in the high-frequency band (< 32 / 4),
          pair 1 in the smooth band, pairs 2..7 in the low band (> 32 / 1); 64 positions.
  linear  rope_scaling {"type": "linear", factor 2.5} (the older key), untied output.

Each folder: config.json (HF LlamaConfig keys, plus moh's "router": "none", which transformers
keeps as an unused attribute), model.safetensors (BF16, HF names; random init, seeded),
expected.safetensors: tokens [B, T] (F32 integers) and logits [B, T, V] (F32) from
LlamaForCausalLM.from_pretrained(<folder>) in float32. The script also checks that removing
rope_scaling changes the logits by more than 1e-2 relative (the C test checks this in moh too).

  python3 tools/ref/rope_scaling_fixtures.py [OUT_DIR]   (needs torch, transformers, safetensors)
"""
import copy
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                        "../../tests/fixtures/lm_rope")
B, T = 2, 64
BASE = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "intermediate_size": 96, "vocab_size": 97, "max_position_embeddings": 128,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "attention_bias": False, "mlp_bias": False,
    "torch_dtype": "bfloat16", "router": "none",
}
FIXTURES = {
    "llama3": ({"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32}, True, 1),
    "linear": ({"type": "linear", "factor": 2.5}, False, 2),
}


def hf_model(cfg):  # LlamaConfig edits the rope_scaling dict it is given: a deep copy
    keys = {k: copy.deepcopy(v) for k, v in cfg.items() if k not in ("architectures", "model_type", "router", "torch_dtype")}
    return LlamaForCausalLM(LlamaConfig(**keys)).float().eval()


def write(name, scaling, tied, seed):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    cfg = dict(BASE, rope_scaling=scaling, tie_word_embeddings=tied)
    torch.manual_seed(seed)
    model = hf_model(cfg)
    with torch.no_grad():  # weights large enough that attention is far from uniform; BF16-exact
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif "embed" in n:
                p.copy_(torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * (0.6 if ("q_proj" in n or "k_proj" in n) else 0.15))
            p.copy_(p.to(torch.bfloat16).float())
    sd = {k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()
          if not (tied and k == "lm_head.weight")}
    save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
        f.write("\n")
    g = torch.Generator().manual_seed(seed + 100)
    tokens = torch.randint(0, cfg["vocab_size"], (B, T), generator=g)
    loaded = LlamaForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    for k, v in model.state_dict().items():  # the folder loads into transformers as written
        assert torch.equal(loaded.state_dict()[k], v), k
    with torch.no_grad():
        logits = loaded(tokens).logits.float()
        unscaled_cfg = dict(cfg, rope_scaling=None)
        plain = hf_model(unscaled_cfg)
        plain.load_state_dict(model.state_dict())
        logits_plain = plain(tokens).logits.float()
    rel = ((logits - logits_plain).abs().max() / logits.abs().max()).item()
    inv = loaded.model.rotary_emb.inv_freq
    print(f"{name}: logits {tuple(logits.shape)}, max|logit| {logits.abs().max().item():.3f}, "
          f"rope_scaling changes them by {rel:.3g} (max|diff| / max|logit|); inv_freq {inv.tolist()}")
    assert rel > 1e-2, "the scaling must matter in this fixture"
    save_file({"tokens": tokens.float().contiguous(), "logits": logits.contiguous()},
              os.path.join(d, "expected.safetensors"), metadata={"format": "pt"})


def main():
    for name, (scaling, tied, seed) in FIXTURES.items():
        write(name, scaling, tied, seed)
        for f in os.listdir(os.path.join(OUT, name)):
            os.chmod(os.path.join(OUT, name, f), 0o644)


if __name__ == "__main__":
    main()
