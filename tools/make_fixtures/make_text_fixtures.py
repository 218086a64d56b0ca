#!/usr/bin/env python3
"""Makes the text-layer conformance fixtures with Hugging Face tokenizers and transformers.

Runs where `tokenizers`, `transformers` and `jinja2` are installed (the GPU machine). For
every tokenizer folder in SHARED/data/tokenizers that has tokenizer.json (or vocab.json +
merges.txt, converted as transformers converts them) and for models/demo it encodes each
string of tests/fixtures/text/corpus.json with and without special tokens and decodes the
ids back. For every chat template (SHARED/data/chat_templates, the tokenizer folders' own,
models/demo) it renders a fixed list of conversations as transformers.apply_chat_template
does. Formats: tests/fixtures/README.md.

  python3 tools/make_fixtures/make_text_fixtures.py --shared ../shared --out tests/fixtures/text
"""
import argparse
import datetime
import json
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}]
TOOL_CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]}
TOOL_RESULT = {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temperature\": 21, \"sky\": \"clear\"}"}

CONVERSATIONS = [
    ("user_only", [{"role": "user", "content": "What is the capital of France?"}], {}),
    ("system_user", [{"role": "system", "content": "You are a terse assistant."},
                     {"role": "user", "content": "Name three primes."}], {}),
    ("multi_turn", [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello! How can I help?"},
                    {"role": "user", "content": "Tell me a joke about compilers."}], {}),
    ("assistant_last", [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "2+2?"},
                        {"role": "assistant", "content": "4"}], {}),
    ("unicode_and_specials", [{"role": "user", "content": "  你好 🌍 <|im_end|> <s> [INST] padded  \n"}], {}),
    ("long_history", [{"role": "system", "content": "System prompt\nwith two lines."}] +
     [m for i in range(3) for m in ({"role": "user", "content": f"Question {i}?"},
                                    {"role": "assistant", "content": f"Answer {i}."})] +
     [{"role": "user", "content": "Last question."}], {}),
    ("tools_offered", [{"role": "user", "content": "Weather in Paris?"}], {"tools": TOOLS}),
    ("tool_call_and_result", [{"role": "user", "content": "Weather in Paris?"}, TOOL_CALL, TOOL_RESULT], {"tools": TOOLS}),
    ("text_parts", [{"role": "user", "content": [{"type": "text", "text": "Part one. "}, {"type": "text", "text": "Part two."}]}], {}),
    ("thinking_off", [{"role": "user", "content": "Quick answer: 7*6?"}], {"enable_thinking": False}),
]

# bos/eos as each model's tokenizer_config.json names them (None: the model has none).
SPECIALS = {
    "HuggingFaceTB-SmolLM3-3B": (None, "<|im_end|>"),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": ("<|begin_of_text|>", "<|im_end|>"),
    "Qwen-Qwen2.5-7B-Instruct": (None, "<|im_end|>"),
    "Qwen-Qwen3-0.6B": (None, "<|im_end|>"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "google-gemma-2-2b-it": ("<bos>", "<eos>"),
    "ibm-granite-granite-3.3-2B-Instruct": ("<|end_of_text|>", "<|end_of_text|>"),
    "meta-llama-Llama-3.1-8B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.2-3B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "microsoft-Phi-3.5-mini-instruct": ("<s>", "<|endoftext|>"),
    "mistralai-Mistral-Nemo-Instruct-2407": ("<s>", "</s>"),
}
DATE = "26 Jul 2024"  # passed as date_string so renderings do not depend on today


def token_text(t):
    return t.get("content") if isinstance(t, dict) else t


def jinja_render(template, messages, tools, agp, variables):
    """jinja2 configured as transformers configures it for chat templates."""
    import datetime
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env.from_string(template).render(messages=messages, tools=tools, documents=None,
                                            add_generation_prompt=agp, **variables)


def make_renderer():
    """transformers' own renderer when this version exposes it (checked against jinja_render)."""
    try:
        from transformers.utils.chat_template_utils import render_jinja_template
    except ImportError:
        return jinja_render, "jinja2 (configured as transformers does)"

    def render(template, messages, tools, agp, variables):
        try:
            out, _ = render_jinja_template(conversations=[messages], tools=tools, chat_template=template,
                                           add_generation_prompt=agp, **variables)
        except TypeError as e:  # another signature in this version
            print(f"render_jinja_template: {e}; using jinja2 as transformers configures it", flush=True)
            return jinja_render(template, messages, tools, agp, variables)
        mine = jinja_render(template, messages, tools, agp, variables)
        if mine != out[0]:
            print(f"WARNING transformers and jinja2 renderings differ:\n{out[0]!r}\n{mine!r}", flush=True)
        return out[0]
    return render, "transformers.utils.chat_template_utils.render_jinja_template"


def template_sources(shared):
    for f in sorted((shared / "data/chat_templates").glob("*.jinja")):
        bos, eos = SPECIALS.get(f.stem, (None, None))
        yield f.stem, f"../shared/data/chat_templates/{f.name}", f.read_text(encoding="utf-8"), bos, eos
    for d in sorted((shared / "data/tokenizers").iterdir()):
        cfg_path = d / "tokenizer_config.json"
        if not cfg_path.exists():
            continue
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        tmpl = cfg.get("chat_template")
        source = f"../shared/data/tokenizers/{d.name}/tokenizer_config.json"
        if (d / "chat_template.jinja").exists():
            tmpl, source = (d / "chat_template.jinja").read_text(encoding="utf-8"), f"../shared/data/tokenizers/{d.name}/chat_template.jinja"
        if isinstance(tmpl, str):
            yield f"tokenizers-{d.name}", source, tmpl, token_text(cfg.get("bos_token")), token_text(cfg.get("eos_token"))
    cfg = json.loads((ROOT / "models/demo/tokenizer_config.json").read_text(encoding="utf-8"))
    yield "demo", "models/demo/tokenizer_config.json", cfg["chat_template"], cfg.get("bos_token"), cfg.get("eos_token")


def make_templates(shared, out):
    render, renderer = make_renderer()
    # The clock strftime_now reads (local time, as datetime.now()): the test renders at it, so
    # that templates printing today's date match their fixture on any later day.
    now = datetime.datetime.now().isoformat(timespec="seconds")
    (out / "chat_templates").mkdir(parents=True, exist_ok=True)
    for name, source, template, bos, eos in template_sources(shared):
        variables = {"date_string": DATE}
        if bos is not None:
            variables["bos_token"] = bos
        if eos is not None:
            variables["eos_token"] = eos
        cases = []
        for cname, messages, extra in CONVERSATIONS:
            extra = dict(extra)
            tools = extra.pop("tools", None)
            for agp in (True, False):
                case = {"name": f"{cname}/{'gen' if agp else 'nogen'}", "messages": messages,
                        "add_generation_prompt": agp, "variables": {**variables, **extra}}
                if tools is not None:
                    case["tools"] = tools
                try:
                    case["rendered"] = render(template, messages, tools, agp, {**variables, **extra})
                except Exception as e:  # noqa: BLE001 - the template's own raise_exception, or a jinja error
                    case["error"] = f"{type(e).__name__}: {e}"
                cases.append(case)
        (out / "chat_templates" / f"{name}.json").write_text(json.dumps(
            {"template_source": source, "renderer": renderer, "now": now, "cases": cases}, ensure_ascii=False, indent=1) + "\n")
        ok = sum("rendered" in c for c in cases)
        print(f"template {name}: {ok} rendered, {len(cases) - ok} raised", flush=True)


def tokenizer_sources(shared):
    from tokenizers import Tokenizer
    for d in sorted((shared / "data/tokenizers").iterdir()):
        if (d / "tokenizer.json").exists():
            yield d.name, f"../shared/data/tokenizers/{d.name}", Tokenizer.from_file(str(d / "tokenizer.json"))
        elif (d / "vocab.json").exists() and (d / "merges.txt").exists():
            from transformers import AutoTokenizer
            fast = AutoTokenizer.from_pretrained(str(d))
            yield d.name, f"../shared/data/tokenizers/{d.name}", Tokenizer.from_str(fast.backend_tokenizer.to_str())
    yield "demo", "models/demo", Tokenizer.from_file(str(ROOT / "models/demo/tokenizer.json"))


def make_tokenizers(shared, out, corpus):
    import tokenizers
    (out / "tokenizers").mkdir(parents=True, exist_ok=True)
    for name, folder, tok in tokenizer_sources(shared):
        cases = []
        for text in corpus:
            with_special = tok.encode(text).ids
            plain = tok.encode(text, add_special_tokens=False).ids
            cases.append({"ids": with_special, "ids_no_special": plain,
                          "decoded": tok.decode(with_special, skip_special_tokens=False),
                          "decoded_skip_special": tok.decode(with_special, skip_special_tokens=True),
                          "roundtrip": tok.decode(plain, skip_special_tokens=False) == text})
        (out / "tokenizers" / f"{name}.json").write_text(json.dumps(
            {"folder": folder, "tokenizers": tokenizers.__version__, "cases": cases}, ensure_ascii=False) + "\n")
        print(f"tokenizer {name}: {len(cases)} strings, {sum(c['roundtrip'] for c in cases)} round-trip", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shared", default=str(ROOT.parent / "shared"))
    ap.add_argument("--out", default=str(ROOT / "tests/fixtures/text"))
    args = ap.parse_args()
    shared, out = Path(args.shared), Path(args.out)
    corpus = json.loads((out / "corpus.json").read_text(encoding="utf-8"))
    try:
        make_tokenizers(shared, out, corpus)
    except Exception:  # noqa: BLE001 - still make the template fixtures
        traceback.print_exc()
    make_templates(shared, out)


if __name__ == "__main__":
    main()
