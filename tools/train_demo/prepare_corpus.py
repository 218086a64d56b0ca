#!/usr/bin/env python3
"""Builds the demo model's training corpus from text shipped in Debian packages.

Runs on the build machine (standard library only) after
`scripts/install-deps.sh --train`; train.py runs on the GPU machine and reads
what this writes. Deterministic: the same package versions and seed give the
same files.

Sources (licences in models/demo/README.md):
  fortunes-zh   /usr/share/games/fortunes/{tang300,song100,chinese}   GPL-3.0+
  jargon-text   /usr/share/doc/jargon-text/jargon.txt.gz               public domain
  wordnet-base  /usr/share/wordnet/data.{noun,verb,adj,adv} (glosses)  WordNet 3.0 licence

Outputs:
  OUT/train.jsonl        {"kind": "text"|"chat", "source", "text" | "messages"} per line
  OUT/sources.json       package versions and document counts
  HELDOUT                held-out documents (5%), separated by blank lines
"""
import argparse
import gzip
import json
import random
import re
import subprocess
from pathlib import Path

FORTUNES = Path("/usr/share/games/fortunes")
JARGON = Path("/usr/share/doc/jargon-text/jargon.txt.gz")
WORDNET = Path("/usr/share/wordnet")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
POS_NAMES = {"n": "noun", "v": "verb", "a": "adjective", "s": "adjective", "r": "adverb"}


def clean(text: str) -> str:
    """Strips colour codes, trailing spaces and blank-line runs (docs are blank-line separated)."""
    text = ANSI.sub("", text).replace("\r", "")
    lines = [ln.rstrip() for ln in text.split("\n")]
    return "\n".join(ln for ln in lines if ln.strip()).strip()


def read_fortunes(name: str):
    raw = (FORTUNES / name).read_text(encoding="utf-8", errors="strict")
    for entry in raw.split("\n%\n"):
        text = clean(entry)
        if 8 <= len(text) <= 1500:
            yield text


def poems():
    """Tang and Song poems: '《title》', '作者：name', then the body."""
    for name in ("tang300", "song100"):
        for text in read_fortunes(name):
            lines = text.split("\n")
            title = author = None
            if lines and lines[0].startswith("《"):
                title = lines[0]
            if len(lines) > 1 and lines[1].startswith("作者："):
                author = lines[1][len("作者："):]
            yield {"source": name, "text": text, "title": title, "author": author,
                   "body": "\n".join(lines[2:]) if title and author else None}


def jargon_entries():
    """Glossary entries of the Jargon File, paragraphs re-flowed to single lines."""
    lines = gzip.open(JARGON, "rt", encoding="utf-8").read().split("\n")
    head = re.compile(r"^   :(.+?):\s*(.*)$")
    entries, cur = [], None
    for ln in lines:
        m = head.match(ln)
        if m:
            if cur:
                entries.append(cur)
            cur = {"word": m.group(1), "lines": [m.group(1) + (": " + m.group(2) if m.group(2) else "")]}
        elif cur is not None:
            if any(ch in ln for ch in "│├└┌─"):
                continue
            cur["lines"].append(ln.strip())
    if cur:
        entries.append(cur)
    for e in entries:
        paras, buf = [], []
        for ln in e["lines"]:
            if ln:
                buf.append(ln)
            elif buf:
                paras.append(" ".join(buf))
                buf = []
        if buf:
            paras.append(" ".join(buf))
        text = "\n".join(paras)
        if 20 <= len(text) <= 3000:
            yield {"source": "jargon", "word": e["word"], "text": text, "paras": paras}


def wordnet_glosses():
    for pos in ("noun", "verb", "adj", "adv"):
        for ln in (WORDNET / f"data.{pos}").read_text(encoding="utf-8").split("\n"):
            if not ln or ln.startswith("  ") or "|" not in ln:
                continue
            fields, gloss = ln.split("|", 1)
            parts = fields.split()
            ss_type, n_words = parts[2], int(parts[3], 16)
            words = [parts[4 + 2 * i].replace("_", " ") for i in range(n_words)]
            words = [re.sub(r"\(.*\)$", "", w) for w in words]
            gloss = gloss.strip()
            yield {"source": "wordnet", "word": words[0], "synonyms": words[1:],
                   "pos": POS_NAMES[ss_type], "gloss": gloss,
                   "text": f"{words[0]} ({POS_NAMES[ss_type]}): {gloss}"}


def chat_examples(doc, rng):
    """Turns a training document into a ChatML conversation, so the demo answers in chat form."""
    system = [] if rng.random() < 0.7 else [{"role": "system", "content": "You are a helpful assistant."}]
    src = doc["source"]
    if src in ("tang300", "song100") and doc.get("body"):
        q = rng.choice([f"背诵{doc['title']}。", f"请写出{doc['author']}的{doc['title']}。",
                        f"Recite the poem {doc['title']} by {doc['author']}."])
        a = f"{doc['title']}\n作者：{doc['author']}\n{doc['body']}"
    elif src == "wordnet":
        w = doc["word"]
        q = rng.choice([f'What does "{w}" mean?', f"Define {w}.", f'"{w}" 是什么意思？'])
        a = f'"{w}" ({doc["pos"]}): {doc["gloss"]}'
        if doc["synonyms"]:
            a += " Synonyms: " + ", ".join(doc["synonyms"]) + "."
    elif src == "jargon":
        q = rng.choice([f'What is "{doc["word"]}" in hacker jargon?', f"Explain the jargon term {doc['word']}."])
        a = doc["paras"][0] if len(doc["paras"]) == 1 else "\n".join(doc["paras"][: 2 + rng.randrange(2)])
    else:
        return None
    return system + [{"role": "user", "content": q}, {"role": "assistant", "content": a}]


def package_version(pkg):
    try:
        return subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True,
                              text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for train.jsonl and sources.json")
    ap.add_argument("--heldout", required=True, help="held-out text file to write")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--wordnet-docs", type=int, default=0, help="glosses sampled from WordNet (0: all)")
    ap.add_argument("--heldout-frac", type=float, default=0.05)
    args = ap.parse_args()
    rng = random.Random(args.seed)

    docs = list(poems())
    docs += [{"source": "chinese", "text": t} for t in read_fortunes("chinese")]
    docs += list(jargon_entries())
    wn = list(wordnet_glosses())
    rng.shuffle(wn)
    docs += wn[: args.wordnet_docs] if args.wordnet_docs > 0 else wn

    rng.shuffle(docs)
    n_held = int(len(docs) * args.heldout_frac)
    held, train = docs[:n_held], docs[n_held:]

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    with open(out / "train.jsonl", "w", encoding="utf-8") as f:
        for d in train:
            f.write(json.dumps({"kind": "text", "source": d["source"], "text": d["text"]}, ensure_ascii=False) + "\n")
            counts[d["source"]] = counts.get(d["source"], 0) + 1
            # Chat data: every poem and jargon entry, a quarter of the glosses.
            if d["source"] == "chinese" or (d["source"] == "wordnet" and rng.random() > 0.25):
                continue
            msgs = chat_examples(d, rng)
            if msgs:
                f.write(json.dumps({"kind": "chat", "source": d["source"], "messages": msgs}, ensure_ascii=False) + "\n")
                counts["chat"] = counts.get("chat", 0) + 1
    Path(args.heldout).parent.mkdir(parents=True, exist_ok=True)
    Path(args.heldout).write_text("\n\n".join(d["text"] for d in held) + "\n", encoding="utf-8")
    info = {"seed": args.seed, "train_docs": counts, "heldout_docs": len(held),
            "packages": {p: package_version(p) for p in ("fortunes-zh", "jargon-text", "wordnet-base")}}
    (out / "sources.json").write_text(json.dumps(info, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps(info, ensure_ascii=False))


if __name__ == "__main__":
    main()
