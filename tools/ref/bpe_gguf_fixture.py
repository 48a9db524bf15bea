#!/usr/bin/env python3
"""Writes tests/fixtures/bpe/smollm.gguf: the tokenizer of tests/fixtures/bpe/smollm.json as GGUF
metadata the way llama.cpp's converter stores a byte-level BPE (tokenizer.ggml.model "gpt2", pre
"smollm", tokens in id order, merges "A B", token_type 3 for the added special tokens), no
tensors. tests/test_lm_gguf.c checks that moh's tokenizer from it equals the one from the json.
  python3 tools/ref/bpe_gguf_fixture.py   (needs: pip install gguf)"""
import json, os
import gguf

d = os.path.join(os.path.dirname(__file__), "../../tests/fixtures/bpe")
t = json.load(open(os.path.join(d, "smollm.json"), encoding="utf-8"))
vocab = t["model"]["vocab"]
tokens = [None] * len(vocab)
for s, i in vocab.items():
    tokens[i] = s
types = [1] * len(tokens)
for a in t["added_tokens"]:
    types[a["id"]] = 3
merges = [" ".join(m) if isinstance(m, list) else m for m in t["model"]["merges"]]
w = gguf.GGUFWriter(os.path.join(d, "smollm.gguf"), "llama")
w.add_tokenizer_model("gpt2")
w.add_tokenizer_pre("smollm")
w.add_token_list(tokens)
w.add_token_types(types)
w.add_token_merges(merges)
w.add_eos_token_id(2)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print("wrote", os.path.join(d, "smollm.gguf"))
