#!/usr/bin/env python3
"""Variants of real tokenizer.json files that exercise pipeline components the shipped models
do not use (Metaspace pre-tokenizer and decoder, Digits, every Split behaviour and invert,
NFKC/Lowercase/Strip/regex Replace normalizers, added-token lstrip/rstrip/single_word/
normalized, TemplateProcessing with BOS and EOS), each with the ids and decodings Hugging Face
`tokenizers` gives on a slice of the corpus.

  python3 tools/make_fixtures/make_synthetic_tokenizers.py --shared ../shared --out tests/fixtures/text
"""
import argparse
import copy
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXTRA = ["Hello 2026 world, x marks... the spot", "ab  cd\t\tef\n\ngh", "<tag> word words sword word.",
         "ABC abc Abc", "  <tag>  spaced  </tag> ", "ＦＵＬＬ① ｶﾀｶﾅ", "1234567 12345", "x,y.z,,..x",
         " leading", "trailing ", "", " ", "▁already▁marked", "<|im_start|>ABC<|im_end|>"]


LLAMA2 = "../shared/data/tokenizers/Llama-2-7b-chat-hf/tokenizer.json"
DEMO = "models/demo/tokenizer.json"
OVERRIDDEN = ("normalizer", "pre_tokenizer", "decoder", "post_processor", "added_tokens")


def variants(shared):
    llama2 = json.loads((shared / "data/tokenizers/Llama-2-7b-chat-hf/tokenizer.json").read_text())
    llama2["_base"] = LLAMA2
    demo = json.loads((ROOT / "models/demo/tokenizer.json").read_text())
    demo["_base"] = DEMO
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}

    v = copy.deepcopy(llama2)  # the newer SentencePiece layout (Mistral v0.3, TinyLlama)
    v["normalizer"] = None
    v["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
    yield "spm-metaspace-first", v

    v = copy.deepcopy(llama2)
    v["normalizer"] = None
    v["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}
    v["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True},
        {"type": "ByteFallback"}, {"type": "Fuse"}]}
    yield "spm-metaspace-always-split", v

    v = copy.deepcopy(llama2)
    v["normalizer"] = None
    v["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "never", "split": True}
    v["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "never", "split": True},
        {"type": "ByteFallback"}, {"type": "Fuse"}]}
    yield "spm-metaspace-never", v

    v = copy.deepcopy(demo)
    v["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "NFKC"}, {"type": "Lowercase"}, {"type": "Strip", "strip_left": True, "strip_right": True},
        {"type": "Replace", "pattern": {"Regex": "\\d{4}"}, "content": "#"}]}
    v["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "MergedWithNext", "invert": False}, byte_level]}
    yield "demo-normalizers-digits", v

    v = copy.deepcopy(demo)
    v["normalizer"] = None
    v["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False},
        {"type": "Split", "pattern": {"Regex": "[,.]"}, "behavior": "Contiguous", "invert": False},
        {"type": "Split", "pattern": {"String": "x"}, "behavior": "Removed", "invert": False},
        {"type": "Digits", "individual_digits": False},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}]}
    yield "demo-split-behaviors", v

    v = copy.deepcopy(demo)
    v["normalizer"] = None
    v["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "[a-z]+"}, "behavior": "Isolated", "invert": True},
        {"type": "Split", "pattern": {"Regex": "\\p{P}"}, "behavior": "MergedWithNext", "invert": True}, byte_level]}
    yield "demo-split-invert", v

    v = copy.deepcopy(demo)
    v["normalizer"] = {"type": "Lowercase"}
    next_id = max(t["id"] for t in v["added_tokens"]) + 1
    next_id = max(next_id, len(v["model"]["vocab"]))
    for content, flags in [("<tag>", dict(lstrip=True, rstrip=True, special=True)),
                           ("</tag>", dict(lstrip=False, rstrip=True, special=True)),
                           ("word", dict(single_word=True, special=False)),
                           ("ABC", dict(normalized=True, special=False))]:
        t = {"id": next_id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": False}
        t.update(flags)
        v["added_tokens"].append(t)
        next_id += 1
    ids = {t["content"]: t["id"] for t in v["added_tokens"]}
    v["post_processor"] = {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}},
                                      {"SpecialToken": {"id": "<|im_end|>", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {n: {"id": n, "ids": [ids[n]], "tokens": [n]} for n in ("<|im_start|>", "<|im_end|>")}}
    yield "demo-added-token-flags", v


def main():
    from tokenizers import Tokenizer
    import tokenizers
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", default=str(ROOT.parent / "shared"))
    ap.add_argument("--out", default=str(ROOT / "tests/fixtures/text"))
    args = ap.parse_args()
    out = Path(args.out) / "synthetic"
    out.mkdir(parents=True, exist_ok=True)
    corpus = json.loads((Path(args.out) / "corpus.json").read_text())
    texts = EXTRA + corpus[::4]
    for name, tj in variants(Path(args.shared)):
        base = tj.pop("_base")
        tok = Tokenizer.from_str(json.dumps(tj))
        cases = []
        for text in texts:
            ids = tok.encode(text).ids
            cases.append({"text": text, "ids": ids, "ids_no_special": tok.encode(text, add_special_tokens=False).ids,
                          "decoded": tok.decode(ids, skip_special_tokens=False),
                          "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)})
        # The variant is stored as its base file plus the replaced parts (not the vocabulary again).
        (out / f"{name}.json").write_text(json.dumps(
            {"base": base, "override": {k: tj[k] for k in OVERRIDDEN}, "tokenizers": tokenizers.__version__,
             "cases": cases}, ensure_ascii=False) + "\n")
        print(f"{name}: {len(cases)} strings", flush=True)


if __name__ == "__main__":
    main()
