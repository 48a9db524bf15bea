#!/usr/bin/env python3
"""Reference fixtures for the byte-level BPE tokenizer (src/text/bpe.c), from Hugging Face `tokenizers`.

  python3 tools/ref/bpe_fixtures.py fixtures --kjv data/kjv/all.txt [--out tests/fixtures/bpe]
      Trains three small byte-level BPEs (vocab 1024) on the KJV (+ the stress text), each with
      its pre-tokenizer (smollm, gpt2, llama3 with ignore_merges), writes their tokenizer.json,
      the case texts case_NAME.txt (case_stress.txt is written here: mixed scripts, emoji,
      combining marks, digit and whitespace runs, special tokens; case_kjv6000.txt the KJV's
      first 6000 characters) and expected.txt: one line per (variant, case):
      `VARIANT CASE id id ...`, the ids of `Tokenizer.encode(text).ids`.
  python3 tools/ref/bpe_fixtures.py smollm2 --gguf SmolLM2-135M-Instruct.Q4_1.gguf --out DIR
      Builds SmolLM2's tokenizer.json from the GGUF's tokenizer.ggml.* metadata (the structure of
      the Hub's HuggingFaceTB/SmolLM2-135M-Instruct tokenizer.json: Digits(individual) +
      ByteLevel, control tokens special) into DIR/tokenizer.json. Never commit it (2 MB).
  python3 tools/ref/bpe_fixtures.py encode --tokenizer T.json FILE... > ids.txt
      One line per file: the reference ids (for the whole-corpus comparison with moh).
  python3 tools/ref/bpe_fixtures.py written --moh build/moh --dir DIR FILE...
      The tokenizer.json moh writes (a checkpoint folder DIR, e.g. from `moh convert --model
      X.gguf --out DIR` or `moh tokenize --model T.json --save-tokenizer DIR`): Hugging Face
      `tokenizers` loads it and encodes every FILE as `moh tokenize --model DIR` does, id for id,
      and decodes back to the text; with `transformers` installed, AutoTokenizer loads DIR too
      (tokenizer_config.json: eos_token, chat_template) and gives the same ids.
Invalid UTF-8 is not in the fixtures: `tokenizers` takes only str, so the reference has no answer
for it; moh's choice (invalid bytes form pieces of their own, encoded byte by byte) is checked by
the C tests as decode(encode(x)) == x.
Needs: pip install tokenizers gguf.
"""
import argparse
import json
import os
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers, Regex

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

STRESS = (
    "In the beginning God created the heaven and the earth.\n"
    "<|im_start|>user\nHow's it going? I'm fine, you'll see, they've said we'd.<|im_end|>\n"
    "<|im_start|>assistant\nDigits: 0 12 345 6789 1234567890 3.14159 -42 1e10 ١٢٣ ½ Ⅻ<|im_end|><|endoftext|>\n"
    "Whitespace:    four  two\t\ttabs \r\n crlf\n\n\n   trailing   \n"
    "Ελληνικά Русский язык עברית العربية हिन्दी 日本語のテキスト 中文字符 한국어 ไทย\n"
    "Emoji: 😀👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ flags 🏳️‍🌈\n"
    "Combining: e\u0301 a\u0308 n\u0303 Z\u0351\u0334\u0322a\u0358\u0321l\u0335g\u0361o cafe\u0301 re\u0301sume\u0301\n"
    "Punctuation!!! ??? ... --- *** (brackets) [x] {y} <z> «quotes» “curly” ‘single’ 'APOSTROPHE'S' DON'T\n"
    "Specials glued:<|im_end|>x<|endoftext|><|endoftext|> <|im_start|> <|im_end |> <|im_start\n"
    "Controls: \x01\x02\x7f \u00a0nbsp \u2003emsp \u200bzwsp \ufeffbom \u2028ls\n"
    "Long: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa " + "!" * 40 + " " * 70 + "end"
)


def byte_level_tokenizer(vocab, merges, pre, ignore_merges=False):
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges))
    if pre == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    elif pre == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif pre == "llama3":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        raise ValueError(pre)
    tok.decoder = decoders.ByteLevel()
    return tok


def cmd_fixtures(a):
    os.makedirs(a.out, exist_ok=True)
    kjv = open(a.kjv, encoding="utf-8", newline="").read()[:6000]
    cases = {"stress": STRESS, "kjv6000": kjv, "empty": "", "space": " ", "digits": "2024-12-01 1000000"}
    for cname, text in cases.items():
        with open(os.path.join(a.out, f"case_{cname}.txt"), "w", encoding="utf-8", newline="") as f:
            f.write(text)
    lines = []
    for name, im in (("smollm", False), ("gpt2", False), ("llama3", True)):
        # each variant trained with its own pre-tokenizer (and the stress text, so that its pieces
        # have merges), so that the variants' ids differ
        base = byte_level_tokenizer({}, [], name)
        tr = trainers.BpeTrainer(vocab_size=1024, special_tokens=SPECIAL, show_progress=False,
                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        base.train([a.kjv, os.path.join(a.out, "case_stress.txt")], tr)
        spec = json.loads(base.to_str())
        vocab = spec["model"]["vocab"]
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in spec["model"]["merges"]]
        tok = byte_level_tokenizer(vocab, merges, name, im)
        tok.add_special_tokens(SPECIAL)
        path = os.path.join(a.out, f"{name}.json")
        # compact: the fixture is read by the C test, not by people
        with open(path, "w", encoding="utf-8") as f:
            json.dump(json.loads(tok.to_str()), f, ensure_ascii=False, separators=(",", ":"))
        for cname, text in cases.items():
            ids = tok.encode(text).ids
            assert tok.decode(ids, skip_special_tokens=False) == text, (name, cname)
            lines.append(f"{name} {cname} " + " ".join(map(str, ids)))
        print("wrote", path, "vocab", len(vocab), "merges", len(merges))
    with open(os.path.join(a.out, "expected.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


def cmd_smollm2(a):
    from gguf import GGUFReader
    r = GGUFReader(a.gguf)

    def strings(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    pre = strings("tokenizer.ggml.pre")[0]
    assert pre == "smollm", pre
    tokens = strings("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ")) for m in strings("tokenizer.ggml.merges")]
    tt = r.fields["tokenizer.ggml.token_type"]
    types = [int(tt.parts[i][0]) for i in tt.data]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = byte_level_tokenizer(vocab, merges, "smollm")
    tok.add_special_tokens([tokens[i] for i, t in enumerate(types) if t == 3])  # 3: control
    os.makedirs(a.out, exist_ok=True)
    tok.save(os.path.join(a.out, "tokenizer.json"))
    print("wrote", os.path.join(a.out, "tokenizer.json"), len(tokens), "tokens", len(merges), "merges",
          sum(t == 3 for t in types), "special")


def cmd_encode(a):
    tok = Tokenizer.from_file(a.tokenizer)
    for path in a.files:
        text = open(path, encoding="utf-8", newline="").read()
        print(" ".join(map(str, tok.encode(text).ids)))


def cmd_written(a):
    import subprocess
    path = os.path.join(a.dir, "tokenizer.json")
    tok = Tokenizer.from_file(path)
    fast = None
    try:
        from transformers import AutoTokenizer
        fast = AutoTokenizer.from_pretrained(a.dir)
        cfg = json.load(open(os.path.join(a.dir, "tokenizer_config.json")))
        print(f"transformers: {type(fast).__name__}, eos_token {fast.eos_token!r} "
              f"(tokenizer_config {cfg.get('eos_token')!r}), chat_template {'yes' if fast.chat_template else 'no'}")
        assert fast.eos_token == cfg.get("eos_token")
    except ImportError:
        print("transformers not installed: tokenizers only")
    bad = 0
    total = 0
    for f in a.files:
        text = open(f, encoding="utf-8", newline="").read()
        ref = tok.encode(text).ids
        out = subprocess.run([a.moh, "tokenize", "--model", a.dir, "--file", f], check=True,
                             capture_output=True, text=True).stdout.split()
        ids = [int(x) for x in out]
        same = ids == ref and tok.decode(ref, skip_special_tokens=False) == text
        if fast is not None:
            same = same and fast(text, add_special_tokens=True)["input_ids"] == ref
        total += len(ref)
        if not same:
            bad += 1
            first = next((i for i, (x, y) in enumerate(zip(ids, ref)) if x != y), min(len(ids), len(ref)))
            print(f"DIFFERENT {f}: moh {len(ids)} ids, tokenizers {len(ref)}, first difference at {first}")
    print(f"{path}: {len(a.files) - bad} of {len(a.files)} files identical ({total} tokens)")
    return 1 if bad else 0


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fixtures")
    f.add_argument("--kjv", required=True)
    f.add_argument("--out", default="tests/fixtures/bpe")
    s = sub.add_parser("smollm2")
    s.add_argument("--gguf", required=True)
    s.add_argument("--out", required=True)
    e = sub.add_parser("encode")
    e.add_argument("--tokenizer", required=True)
    e.add_argument("files", nargs="+")
    w = sub.add_parser("written")
    w.add_argument("--moh", default="build/moh")
    w.add_argument("--dir", required=True)
    w.add_argument("files", nargs="+")
    a = p.parse_args()
    return {"fixtures": cmd_fixtures, "smollm2": cmd_smollm2, "encode": cmd_encode, "written": cmd_written}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
