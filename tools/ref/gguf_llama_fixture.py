#!/usr/bin/env python3
"""Writes tests/fixtures/gguf_llama: a tiny LLaMA-architecture model as llama.cpp's converter
(convert_hf_to_gguf.py, LlamaModel) writes it -- llama.* metadata, llama.cpp tensor names, the
attn_q / attn_k rows permuted for ggml's RoPE layout, tied output (no output.weight) -- and the
same weights in Hugging Face layout as a moh checkpoint (config.json + model.safetensors), which
tests/test_lm_gguf.c compares with what moh loads from the GGUF. Weights F32, except ffn_down of
layer 0 in Q8_0 (its expected values are the dequantised ones: gguf.quants).
  python3 tools/ref/gguf_llama_fixture.py   (needs: pip install gguf numpy safetensors)"""
import json, os, sys
import numpy as np
import gguf
from gguf import quants

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../../tests/fixtures/gguf_llama")
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(20261201)
C, L, H, HKV, D, I, V, CTX = 32, 2, 4, 2, 8, 64, 260, 64

def w(*shape, s=0.05):
    return (rng.standard_normal(shape) * s).astype(np.float32)

def permute(x, n_head, n_head_kv):  # convert_hf_to_gguf.py LlamaModel.permute
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return x.reshape(n_head, 2, x.shape[0] // n_head // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)

hf = {"model.embed_tokens.weight": w(V, C)}
for l in range(L):
    p = f"model.layers.{l}."
    hf[p + "input_layernorm.weight"] = (1 + w(C, s=0.1)).astype(np.float32)
    hf[p + "self_attn.q_proj.weight"] = w(H * D, C)
    hf[p + "self_attn.k_proj.weight"] = w(HKV * D, C)
    hf[p + "self_attn.v_proj.weight"] = w(HKV * D, C)
    hf[p + "self_attn.o_proj.weight"] = w(C, H * D)
    hf[p + "post_attention_layernorm.weight"] = (1 + w(C, s=0.1)).astype(np.float32)
    hf[p + "mlp.gate_proj.weight"] = w(I, C)
    hf[p + "mlp.up_proj.weight"] = w(I, C)
    hf[p + "mlp.down_proj.weight"] = w(C, I)
hf["model.norm.weight"] = (1 + w(C, s=0.1)).astype(np.float32)

g = gguf.GGUFWriter(os.path.join(out, "tiny-llama.gguf"), "llama")
g.add_name("tiny-llama")
g.add_context_length(CTX)
g.add_embedding_length(C)
g.add_block_count(L)
g.add_feed_forward_length(I)
g.add_head_count(H)
g.add_head_count_kv(HKV)
g.add_rope_freq_base(100000.0)
g.add_layer_norm_rms_eps(1e-5)
g.add_key_length(D)
g.add_value_length(D)
g.add_vocab_size(V)
names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
per = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
       "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
       "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
expect = {}
for k, x in hf.items():
    if k in names:
        n = names[k]
    else:
        l = int(k.split(".")[2]); part = ".".join(k.split(".")[3:-1])
        n = f"blk.{l}.{per[part]}.weight"
    y = x
    if n.endswith("attn_q.weight"):
        y = permute(x, H, H)
    elif n.endswith("attn_k.weight"):
        y = permute(x, H, HKV)
    if n == "blk.0.ffn_down.weight":  # one quantised tensor: the expectation is its dequantisation
        q = quants.quantize(y, gguf.GGMLQuantizationType.Q8_0)
        g.add_tensor(n, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        expect[k] = quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0).reshape(x.shape).astype(np.float32)
    else:
        g.add_tensor(n, y)
        expect[k] = x
g.write_header_to_file()
g.write_kv_data_to_file()
g.write_tensors_to_file()
g.close()

# the HF-layout expectation as a moh checkpoint (dense LLaMA config, tied head)
cfg = {"model_type": "llama", "hidden_size": C, "num_hidden_layers": L, "num_attention_heads": H,
       "num_key_value_heads": HKV, "head_dim": D, "intermediate_size": I, "vocab_size": V,
       "max_position_embeddings": CTX, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
       "tie_word_embeddings": True, "router": "none"}
json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=1)
from safetensors.numpy import save_file
save_file(expect, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
print("wrote", out)
