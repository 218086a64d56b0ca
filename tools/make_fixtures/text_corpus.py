#!/usr/bin/env python3
"""Writes tests/fixtures/text/corpus.json: the strings every tokenizer is checked on.

Deterministic (fixed seed, standard library only). Categories: English and Chinese prose
(from the demo model's held-out text), Japanese, other scripts, code, emoji and ZWJ
sequences, whitespace runs, numbers of every length, contractions, mixed scripts,
special-token strings, escape-looking text, Unicode normalisation edge cases, and random
mixtures of all of these.
"""
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

JAPANESE = ["こんにちは、世界。", "東京は日本の首都です。", "カタカナとひらがなと漢字", "吾輩は猫である。名前はまだ無い。",
            "ｶﾀｶﾅ（半角）とカタカナ（全角）", "今日は良い天気ですね！", "ラーメンを食べたい", "「引用」と『二重引用』",
            "令和六年十二月一日", "きゃりーぱみゅぱみゅ", "ヴァイオリン", "日本語の文章を、トークン化します。"]
OTHER_SCRIPTS = ["안녕하세요 세계", "Привет, мир! Как дела?", "Γειά σου Κόσμε", "مرحبا بالعالم", "שלום עולם",
                 "नमस्ते दुनिया", "สวัสดีชาวโลก", "Xin chào thế giới", "Selam dünya, nasılsın?", "Witaj świecie, zażółć gęślą jaźń",
                 "ইউনিকোড", "ქართული ენა", "Հայերեն", "ᚠᛇᚻ᛫ᛒᛦᚦ", "𐌰𐌱𐌲 gothic", "ꦗꦮ javanese"]
CODE = [
    "def f(x):\n    return x ** 2\n", "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "#include <vector>\nint main() { return 0; }", '{"key": [1, 2.5, null, true], "nested": {"a": "b"}}',
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;", "ls -la /usr/bin | grep -E '^-rwx' > out.txt 2>&1",
    "const re = /^[a-z0-9_.-]+@[a-z]+\\.[a-z]{2,}$/i;", "<div class=\"x\"><span>&amp;&lt;&gt;</span></div>",
    "fn main() { println!(\"{:?}\", vec![1, 2, 3]); }", "x = lambda *args, **kw: (args, kw)",
    "\tif (a && b || !c) {\n\t\treturn;\n\t}", "std::unordered_map<std::string, std::vector<int>> m;",
    "    def __init__(self):\n        self._private = None", "print(f'{name!r:>10}')", "a<<=2; b>>=3; c^=~d;",
    "// comment\n/* block */\n# hash", "```python\nimport os\n```", "$ echo $HOME && cd ~/../tmp",
    "if x == 1:\r\n    pass\r\n", "0x1F 0b1010 0o777 1e-10 3.14159f", "C:\\Users\\name\\file.txt",
    "https://example.com/path?q=1&r=%20x#frag", "user@example.org", "[[1,2],[3,4]]", "=SUM(A1:B10)",
]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇨🇳🇺🇸🇯🇵", "❤️", "🧑🏿‍💻", "👩‍❤️‍💋‍👨", "Hello 🌍!", "🙂🙃🙂",
         "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "1️⃣2️⃣3️⃣", "☕ and 🍰", "🤷‍♂️", "👁️‍🗨️", "🐈‍⬛", "emoji😀in😀text", "🔥🔥🔥🔥🔥🔥🔥🔥",
         "✅ done ❌ failed", "🫠🫡🫶"]
WHITESPACE = [" ", "  ", "   ", "    ", " " * 17, "\t", "\t\t", "\n", "\n\n", "\n\n\n", " \n", "\n ", " \n \n ",
              "\r\n", "\r\n\r\n", "\t \t \n", "a  b", "a   b   c", "  leading", "trailing  ", " both ",
              "line1\nline2\n\nline4", "\u00a0nbsp\u00a0", "\u3000全角空格\u3000", "\u2028sep\u2029", "\u200bzero\u200bwidth",
              "a\tb\tc", " " * 64 + "x", "\n" * 12, "x" + " " * 3 + "\n" + " " * 3 + "y", "\v\f"]
CONTRACTIONS = ["I'm", "don't", "can't", "won't", "they'll", "we've", "she'd", "it's", "I'M", "DON'T", "They'Ll",
                "WE'VE", "He'S", "y'all", "'s", "'tis", "rock 'n' roll", "O'Reilly's", "isn't it?", "you're right",
                "I’m curly", "don’t"]
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>", "<s>", "</s>", "<unk>",
           "<|im_start|>user\nhi<|im_end|>", "Hello<|im_end|>world", "<s>[INST] hi [/INST]", " <s> spaced </s> ",
           "a<|endoftext|>b<|endoftext|>c", "<|im_start", "im_end|>", "<|im_end|><|im_end|>", "<<s>>", "</s></s>",
           "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>", "<|reserved_special_token_5|>",
           "<tool_call>\n{\"name\": \"f\"}\n</tool_call>", "<|fim_prefix|>def<|fim_suffix|><|fim_middle|>",
           "text <|im_end|> text", "<|IM_END|>", "< |im_end| >", "<|im_end|>\n", "\n<|im_start|>",
           "[INST]", "<<SYS>>\nsys\n<</SYS>>", "<think>\nreasoning\n</think>"]
ESCAPES = ["\\x80\\xff", "\\u00e9", "\\U0001F600", "%E4%B8%AD%ZZ", "&#xD800;", "&#128512;", "\\n\\t\\r", "\\\\",
           "\\", "\\0", "\"quoted\"", "'single'", "`backtick`", "\\u{1F600}", "\x7f\x01\x02", "NUL\x00byte",
           "\x1b[31mred\x1b[0m", "�", "\ufffd\ufffd", "\ufeffBOM"]
UNICODE_EDGE = ["e\u0301", "\u00e9", "n\u0303", "A\u030a", "\u212b", "ﬁ ligature", "Ⅻ roman", "①②③", "x²+y³",
                "½ ¼ ¾", "ｆｕｌｌｗｉｄｔｈ", "\u1100\u1161\u11a8", "각", "한\u0300", "café naïve résumé", "Ångström",
                "Straße STRASSE", "İstanbul ıi", "ǅ digraph", "\U0001D400\U0001D401 math", "a\u0308\u0301",
                "ᾍ", "ゞ゛", "\u0915\u094d\u0937", "ﷺ", "Ꙛ", "\U00010000\U0010fffd", "\u00ad soft", "\u2060joiner"]
NUMBERS = [str(10 ** k + 7 * k) for k in range(0, 40)] + ["0", "00", "007", "3.14159265358979", "-42", "+1",
           "1,234,567", "1.234.567,89", "12:30:45", "2026-11-30", "1e100", "0.000001", "٣٤٥", "१२३", "一二三",
           "１２３", "99%", "$1,000.00", "€5", "10^6", "1/3"]
MIXED = ["Hello世界", "Python是一种编程语言", "I love 北京 and 東京", "price: ¥100 / $15", "GPT-4o 与 Qwen2.5 的比较",
         "日本語 English 한국어 mixed", "the 猫 sat on the マット", "Ελληνικά and English", "abcабв", "math: ∑∫∂∇",
         "→ ← ↑ ↓ ⇒", "«quotes» „German“ “curly”", "tab\t中文\tend", "混合123numbers456数字", "ML模型 training 训练"]


def prose(heldout, rng, want_cjk, n):
    docs = [d for d in heldout.split("\n\n") if d.strip()]
    pick = [d for d in docs if (sum(ord(c) > 0x2E80 for c in d) > len(d) // 3) == want_cjk]
    rng.shuffle(pick)
    return [d[:400] for d in pick[:n]]


def main():
    rng = random.Random(20261130)
    heldout = (ROOT / "tests/fixtures/demo_heldout.txt").read_text(encoding="utf-8")
    fixed = (prose(heldout, rng, False, 70) + prose(heldout, rng, True, 50) + JAPANESE + OTHER_SCRIPTS + CODE +
             EMOJI + WHITESPACE + CONTRACTIONS + SPECIAL + ESCAPES + UNICODE_EDGE + NUMBERS + MIXED)
    pools = [JAPANESE, OTHER_SCRIPTS, CODE, EMOJI, WHITESPACE, CONTRACTIONS, SPECIAL, ESCAPES, UNICODE_EDGE, NUMBERS, MIXED]
    mixtures = []
    for _ in range(180):
        parts = [rng.choice(rng.choice(pools)) for _ in range(rng.randint(2, 5))]
        mixtures.append(rng.choice(["", " ", "\n", ""]).join(parts))
    # Long words and runs, to expose quadratic merging.
    long = ["a" * 1000, "ab" * 300, "的" * 200, "supercalifragilisticexpialidocious" * 10, "1" * 300,
            " ".join(["word"] * 200), "x" * 5000]
    corpus = list(dict.fromkeys(fixed + mixtures + long))  # unique, order kept
    out = ROOT / "tests/fixtures/text/corpus.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(corpus, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    print(f"{len(corpus)} strings -> {out}")


if __name__ == "__main__":
    main()
