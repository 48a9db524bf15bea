#!/usr/bin/env python3
"""GGUF fixtures with the byte-level BPE of tests/fixtures/bpe/smollm.json (1024 tokens, ChatML
specials), stored as llama.cpp's converter stores one (tokenizer.ggml.model "gpt2", pre "smollm",
tokens in id order, merges "A B", token_type 3 for the added special tokens):
  tests/fixtures/bpe/smollm.gguf            the tokenizer alone, no tensors: tests/test_lm_gguf.c
                                            checks that moh's tokenizer from it equals the json's
  tests/fixtures/gguf_llama/tiny-chat.gguf  a tiny random LLaMA (1 layer, hidden 32, context 64,
                                            tied) with that tokenizer and a SmolLM2-style chat
                                            template with a default system prompt, for the
                                            mechanics of `moh chat` (tests/cli_convert.sh)
  python3 tools/ref/bpe_gguf_fixture.py   (needs: pip install gguf numpy)"""
import json, os
import numpy as np
import gguf

root = os.path.join(os.path.dirname(__file__), "../../tests/fixtures")
t = json.load(open(os.path.join(root, "bpe/smollm.json"), encoding="utf-8"))
vocab = t["model"]["vocab"]
tokens = [None] * len(vocab)
for s, i in vocab.items():
    tokens[i] = s
types = [1] * len(tokens)
for a in t["added_tokens"]:
    types[a["id"]] = 3
merges = [" ".join(m) if isinstance(m, list) else m for m in t["model"]["merges"]]


def add_tokenizer(w):
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(2)


def close(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


w = gguf.GGUFWriter(os.path.join(root, "bpe/smollm.gguf"), "llama")
add_tokenizer(w)
close(w)

C, I, H, V, CTX = 32, 64, 4, len(tokens), 64
rng = np.random.default_rng(7)
r = lambda *s: (rng.standard_normal(s) * 0.3).astype(np.float32)
g = gguf.GGUFWriter(os.path.join(root, "gguf_llama/tiny-chat.gguf"), "llama")
for k, v in [("context_length", CTX), ("embedding_length", C), ("block_count", 1), ("feed_forward_length", I)]:
    getattr(g, "add_" + k)(v)
g.add_head_count(H); g.add_head_count_kv(H); g.add_rope_freq_base(10000.0); g.add_layer_norm_rms_eps(1e-5)
add_tokenizer(g)
g.add_chat_template("{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a tiny test model<|im_end|>\n' }}{% endif %}"
                    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}")
g.add_tensor("token_embd.weight", r(V, C))
g.add_tensor("blk.0.attn_norm.weight", np.ones(C, np.float32))
for n, s in [("attn_q", (C, C)), ("attn_k", (C, C)), ("attn_v", (C, C)), ("attn_output", (C, C))]:
    g.add_tensor(f"blk.0.{n}.weight", r(*s))
g.add_tensor("blk.0.ffn_norm.weight", np.ones(C, np.float32))
g.add_tensor("blk.0.ffn_gate.weight", r(I, C)); g.add_tensor("blk.0.ffn_up.weight", r(I, C)); g.add_tensor("blk.0.ffn_down.weight", r(C, I))
g.add_tensor("output_norm.weight", np.ones(C, np.float32))
close(g)
print("wrote smollm.gguf, tiny-chat.gguf")
