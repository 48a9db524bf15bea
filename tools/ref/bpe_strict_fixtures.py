#!/usr/bin/env python3
"""Fixtures for moh's strict tokenizer.json reader (src/text/bpe.c, tests/test_bpe.c test_strict).

Each case is a tokenizer.json and a text. Hugging Face `tokenizers` (0.23) reads the JSON
(Tokenizer.from_str) and, when it accepts it, encodes the text with and without special tokens.
moh must refuse what tokenizers refuses, give its ids where it accepts, or refuse with a message
naming the field where a case lists one (a field tokenizers applies and moh does not).

Writes tests/fixtures/bpe_strict/cases.tsv, one case a line, tab-separated:
  name, tokenizers' verdict (ok / err), moh's word ("-": moh accepts; else a word of its message),
  text as hex, ids of encode(text, add_special_tokens=False), ids of encode(text) (comma-separated,
  "-" when refused), the JSON.
The unicode_* cases use letters and digits of Unicode 15-17 on which tokenizers' classes (Oniguruma
Unicode 16; Digits: Rust's is_numeric, Unicode 17) and PCRE2 10.42's (Unicode 14) differ; bpe.c's
ONIG_L_MORE / ONIG_N_MORE / RUST_N_MORE / ONIG_S list those code points (found by splitting every
code point with tokenizers' Split(\\p{L}) etc. and matching it with PCRE2).

Usage (repository root): /tmp/tenv/bin/python tools/ref/bpe_strict_fixtures.py
"""
import copy
import json
import sys

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

OUT = "tests/fixtures/bpe_strict/cases.tsv"

BL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
BL_NOREGEX = dict(BL, use_regex=False)
DEC = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
VOCAB = {"a": 0, "b": 1, "ab": 2, "\u0120": 3, "x": 4, "1": 5, "2": 6, "<": 7, ">": 8, "12": 9,
         "\u0120a": 10, "\u0120ab": 11}
MERGES = ["a b", "1 2", "\u0120 a", "\u0120a b"]


def added(content, id, **kw):
    d = {"id": id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
    d.update(kw)
    return d


def base(**top):
    d = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
         "normalizer": None, "pre_tokenizer": copy.deepcopy(BL), "post_processor": None,
         "decoder": copy.deepcopy(DEC),
         "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                   "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                   "ignore_merges": False, "vocab": dict(VOCAB), "merges": list(MERGES)}}
    for k, v in top.items():
        if k.startswith("m_"):
            if v is DEL:
                del d["model"][k[2:]]
            else:
                d["model"][k[2:]] = v
        elif v is DEL:
            del d[k]
        else:
            d[k] = v
    return d


DEL = object()


def seq(*pts):
    return {"type": "Sequence", "pretokenizers": list(pts)}


def split(pat, kind="Regex", behavior="Isolated", invert=False):
    return {"type": "Split", "pattern": {kind: pat}, "behavior": behavior, "invert": invert}


TP = {"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": ">", "type_id": 0}}],
      "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
      "special_tokens": {"<": {"id": "<", "ids": [7], "tokens": ["<"]},
                         ">": {"id": ">", "ids": [8], "tokens": [">"]}}}


def all_bytes_vocab():
    """The 256 byte tokens (ids in byte order) + VOCAB's others."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    m = dict(zip(bs, cs))
    v = {chr(m[b]): b for b in range(256)}
    for k in ("ab", "12", "\u0120a", "\u0120ab"):
        v[k] = len(v)
    return v


CASES = []


def case(name, d, text="ab ab", moh="-"):
    CASES.append((name, d if isinstance(d, str) else json.dumps(d), text, moh))


def build_cases():
    case("base", base())
    # top level
    case("version_2", base(version="2.0"), moh="version")
    case("version_number", base(version=1.0), moh="version")
    case("unknown_top_field", base(foo=None), moh="foo")
    case("truncation", base(truncation={"direction": "Right", "max_length": 1, "strategy": "LongestFirst",
                                        "stride": 0}), moh="truncation")
    case("padding", base(padding={"strategy": {"Fixed": 4}, "direction": "Right", "pad_to_multiple_of": None,
                                  "pad_id": 0, "pad_type_id": 0, "pad_token": "a"}), moh="padding")
    # normalizers
    for n in ("NFC", "NFKC", "NFD", "NFKD", "Lowercase"):
        case("normalizer_" + n, base(normalizer={"type": n}), "AB ab", moh=n)
    case("normalizer_prepend", base(normalizer={"type": "Prepend", "prepend": "a"}), moh="Prepend")
    case("normalizer_replace", base(normalizer={"type": "Replace", "pattern": {"String": "b"}, "content": "a"}),
         moh="Replace")
    case("normalizer_seq_nfc", base(normalizer={"type": "Sequence", "normalizers": [{"type": "NFC"}]}), moh="NFC")
    case("normalizer_seq_empty", base(normalizer={"type": "Sequence", "normalizers": []}))
    # pre-tokenizers
    case("pre_null", base(pre_tokenizer=None), "ab \u00e9", moh="ByteLevel")
    case("pre_bl_prefix_space", base(pre_tokenizer=dict(BL, add_prefix_space=True)), "ab", moh="add_prefix_space")
    case("pre_bl_no_trim_offsets", base(pre_tokenizer={"type": "ByteLevel", "add_prefix_space": False}),
         moh="trim_offsets")
    case("pre_bl_int_flag", base(pre_tokenizer=dict(BL, add_prefix_space=0)), moh="add_prefix_space")
    case("pre_bl_use_regex_false", base(pre_tokenizer=BL_NOREGEX), "ab ab ab")
    case("pre_bl_trim_false", base(pre_tokenizer=dict(BL, trim_offsets=False)), "ab ab")
    case("pre_split_custom", base(pre_tokenizer=seq(split("b"), BL_NOREGEX)), "abab ab")
    case("pre_split_string", base(pre_tokenizer=seq(split("b.", "String"), BL_NOREGEX)), "ab.abab.")
    case("pre_split_removed", base(pre_tokenizer=seq(split("b", behavior="Removed"), BL_NOREGEX)), moh="Removed")
    case("pre_split_merged", base(pre_tokenizer=seq(split("b", behavior="MergedWithPrevious"), BL_NOREGEX)),
         moh="MergedWithPrevious")
    case("pre_split_bad_behavior", base(pre_tokenizer=seq(split("b", behavior="isolated"), BL_NOREGEX)),
         moh="isolated")
    case("pre_split_invert", base(pre_tokenizer=seq(split("b", invert=True), BL_NOREGEX)), moh="invert")
    case("pre_split_no_invert", base(pre_tokenizer=seq({"type": "Split", "pattern": {"Regex": "b"},
                                                         "behavior": "Isolated"}, BL_NOREGEX)), moh="invert")
    case("pre_split_after_bytelevel", base(pre_tokenizer=seq(BL_NOREGEX, split("\\s"))), "ab ab", moh="after ByteLevel")
    case("pre_digits_individual", base(pre_tokenizer=seq({"type": "Digits", "individual_digits": True}, BL)), "12 12")
    case("pre_digits_grouped", base(pre_tokenizer=seq({"type": "Digits", "individual_digits": False}, BL)), "12 a12")
    case("pre_digits_no_field", base(pre_tokenizer=seq({"type": "Digits"}, BL)), moh="individual_digits")
    case("pre_sequence_order", base(pre_tokenizer=seq(split("a"), {"type": "Digits", "individual_digits": True},
                                                      BL)), "ab12 ab")
    case("pre_whitespace", base(pre_tokenizer={"type": "Whitespace"}), moh="Whitespace")
    case("pre_metaspace", base(pre_tokenizer={"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                                              "split": True}), moh="Metaspace")
    # model
    case("model_wordpiece", base(m_type="WordPiece", m_unk_token="a", m_max_input_chars_per_word=100,
                                 m_continuing_subword_prefix="##"), moh="WordPiece")
    case("model_no_merges", base(m_merges=DEL), moh="merges")
    case("model_dropout", base(m_dropout=0.5), moh="dropout")
    case("model_dropout_zero", base(m_dropout=0.0))
    case("model_dropout_2", base(m_dropout=2.0), moh="dropout")
    case("model_unk_token", base(m_unk_token="a"), "ab\u00e9", moh="unk_token")
    case("model_unk_all_bytes", base(m_unk_token="a", m_vocab=all_bytes_vocab()), "ab \u00e9")
    case("model_fuse_unk_int", base(m_fuse_unk=1), moh="fuse_unk")
    case("model_byte_fallback", base(m_byte_fallback=True), "ab\u00e9", moh="byte_fallback")
    case("model_csp", base(m_continuing_subword_prefix="##"), moh="continuing_subword_prefix")
    case("model_eows", base(m_end_of_word_suffix="</w>"), moh="end_of_word_suffix")
    case("model_gpt2_empty_affixes", base(m_continuing_subword_prefix="", m_end_of_word_suffix="",
                                          added_tokens=[added("<|endoftext|>", 12, normalized=True)],
                                          post_processor=dict(BL, add_prefix_space=True, trim_offsets=False)),
         "ab<|endoftext|> ab")
    case("model_ignore_merges_int", base(m_ignore_merges=1), moh="ignore_merges")
    case("model_ignore_merges", base(m_ignore_merges=True, m_merges=["a b"]), "ab ab")
    case("model_vocab_float_id", '{"model":{"type":"BPE","vocab":{"a":0,"b":1.0,"ab":2,"\\u0120":3},'
         '"merges":["a b"]},"pre_tokenizer":' + json.dumps(BL) + '}', moh="id")
    case("model_vocab_neg_id", base(m_vocab={"a": 0, "b": -1, "ab": 2}), moh="id")
    case("model_vocab_dup_id", base(m_vocab={"a": 0, "b": 0, "ab": 2}), moh="twice")
    case("model_merge_unknown", base(m_merges=["a c"]), moh="merge 0")
    case("model_merge_three", base(m_merges=["a b x"]), moh="merge 0")
    case("model_merge_version_line", base(m_merges=["#version: 0.2", "a b"]))
    case("model_merges_mixed", base(m_merges=["a b", ["1", "2"]]), moh="mixes")
    case("model_merges_pairs", base(m_merges=[["a", "b"], ["1", "2"]]), "ab 12")
    case("model_merges_null", base(m_merges=None), moh="merges")
    # added tokens
    case("added_special", base(added_tokens=[added("<x>", 12)]), "a<x>b")
    case("added_missing_flags", base(added_tokens=[{"id": 12, "content": "<x>"}]), "a<x>b", moh="single_word")
    case("added_flag_int", base(added_tokens=[added("<x>", 12, special=1)]), "a<x>b", moh="special")
    case("added_id_ignored", base(added_tokens=[added("<x>", 20)]), "a<x>b", moh="id 12")
    case("added_id_clash", base(added_tokens=[added("<x>", 0)]), "a<x>b", moh="id 12")
    case("added_in_vocab_other_id", base(added_tokens=[added("ab", 12)]), "aab", moh="id 2")
    case("added_in_vocab", base(added_tokens=[added("ab", 2)]), "aab")
    case("added_empty", base(added_tokens=[added("", 12), added("<x>", 12)]), "a<x>")
    case("added_null", base(added_tokens=None), moh="added_tokens")
    case("added_lstrip", base(added_tokens=[added("<x>", 12, lstrip=True)]), "a <x>b", moh="lstrip")
    case("added_rstrip", base(added_tokens=[added("<x>", 12, rstrip=True)]), "a<x> b", moh="rstrip")
    case("added_single_word", base(added_tokens=[added("<x>", 12, single_word=True)]), "a<x>b", moh="single_word")
    case("added_normalized_order", base(added_tokens=[added("<x>", 12), added("a<", 13, normalized=True,
                                                                              special=False)]), "ba<x>b")
    case("added_normalized_order2", base(added_tokens=[added("a<", 12, normalized=True, special=False),
                                                       added("<x>", 13)]), "ba<x>b a<")
    case("added_id_float", base(added_tokens=[added("<x>", 12.0)]), "a<x>b", moh="id")
    # post-processor and decoder
    case("post_bytelevel", base(post_processor=dict(BL, trim_offsets=False)))
    case("post_template", base(post_processor=TP), "ab 12")
    case("post_template_seq", base(post_processor={"type": "Sequence", "processors": [dict(BL), TP]}), "ab")
    tp = copy.deepcopy(TP)
    tp["special_tokens"] = {}
    case("post_template_missing_special", base(post_processor=tp), moh="special_tokens")
    tp = copy.deepcopy(TP)
    del tp["pair"]
    case("post_template_no_pair", base(post_processor=tp), moh="pair")
    case("post_roberta", base(post_processor={"type": "RobertaProcessing", "sep": [">", 8], "cls": ["<", 7],
                                              "trim_offsets": True, "add_prefix_space": False}), moh="Roberta")
    case("decoder_null", base(decoder=None))
    case("decoder_fuse", base(decoder={"type": "Fuse"}), moh="Fuse")
    case("decoder_bytelevel_type_only", base(decoder={"type": "ByteLevel"}), moh="add_prefix_space")
    case("dup_model_key", '{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]},'
         '"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":3},"merges":["a b"]},"pre_tokenizer":'
         + json.dumps(BL) + '}', "ab", moh="twice")


# ---- Unicode: letters and digits tokenizers (Oniguruma, Unicode 16; Rust's is_numeric, 17) knows
# and PCRE2 10.42 (Unicode 14) does not ----
UNI = ("x\U00031350\U00031351 \U0001E4D0\U0001E4D1 \U00011F04\U00011F05 \U0001E030\U0001E031 "
       "\U000105C0\u1C89 9\U0001E4F0\U0001E4F1 \U00016130\U00016131 \U00011DE0\U00011DE1 a\u180eb")


def unicode_cases():
    pres = {"gpt2": BL,
            "llama3": seq(split("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?"
                                "[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"), BL_NOREGEX),
            "digits": seq({"type": "Digits", "individual_digits": False}, BL),
            "split_ps": seq(split("\\p{N}+|\\S+|\\s+"), BL_NOREGEX)}
    for name, pre in pres.items():
        j = json.loads(Tokenizer(models.BPE()).to_str())
        j["pre_tokenizer"] = pre
        tok = Tokenizer.from_str(json.dumps(j))
        tr = trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator([UNI] * 4, tr)
        d = json.loads(tok.to_str())
        d["decoder"] = DEC
        case("unicode_" + name, d, UNI)


def main():
    build_cases()
    unicode_cases()
    lines = []
    for name, js, text, moh in CASES:
        try:
            t = Tokenizer.from_str(js)
            plain = ",".join(map(str, t.encode(text, add_special_tokens=False).ids))
            full = ",".join(map(str, t.encode(text).ids))
            verdict = "ok"
        except BaseException as e:  # a refusal (some are Rust panics)
            plain = full = "-"
            verdict = "err"
            print(f"{name}: tokenizers refuses: {str(e)[:100]}", file=sys.stderr)
        assert "\t" not in js and "\n" not in js
        lines.append("\t".join([name, verdict, moh, text.encode().hex(), plain or ".", full or ".", js]))
    with open(OUT, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{OUT}: {len(lines)} cases")


if __name__ == "__main__":
    main()
