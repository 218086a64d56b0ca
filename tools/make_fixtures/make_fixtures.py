#!/usr/bin/env python3
"""Makes the reference fixtures that lmserve's engine is checked against.

Runs on the GPU machine (PyTorch + transformers; a CPU also works). For
models/demo and for tiny random-initialised models of each supported
architecture it stores the model files and, per prompt, what Hugging Face
transformers computes in float32 from the stored weights: the logits of the
last position, the top-5 of every position and a 32-token greedy
continuation. The format is documented in tests/fixtures/README.md.

  python3 tools/make_fixtures/make_fixtures.py --demo models/demo --out tests/fixtures
"""
import argparse
import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

GREEDY_TOKENS = 32
STORAGE = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

BASE = {
    "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "hidden_act": "silu",
    "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "initializer_range": 0.02,
    "attention_dropout": 0.0, "use_cache": True, "bos_token_id": 1, "eos_token_id": 2,
}

# Hand-written in the layout of Hugging Face hub checkpoints, which is what lmserve must read.
TINY = {
    "tiny-llama3": {**BASE, "architectures": ["LlamaForCausalLM"], "model_type": "llama",
                    "rope_theta": 10000.0, "attention_bias": False, "mlp_bias": False,
                    "rope_scaling": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                    "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
    "tiny-llama-linear": {**BASE, "architectures": ["LlamaForCausalLM"], "model_type": "llama",
                          "rope_theta": 10000.0, "attention_bias": False, "mlp_bias": False,
                          "rope_scaling": {"rope_type": "linear", "factor": 2.0},
                          "tie_word_embeddings": False, "torch_dtype": "float32"},
    "tiny-qwen2": {**BASE, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                   "rope_theta": 1000000.0, "rope_scaling": None, "use_sliding_window": False,
                   "sliding_window": None, "max_window_layers": 2, "tie_word_embeddings": True,
                   "torch_dtype": "float32"},
    "tiny-qwen3": {**BASE, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 32,
                   "rope_theta": 1000000.0, "rope_scaling": None, "attention_bias": False,
                   "use_sliding_window": False, "sliding_window": None, "max_window_layers": 2,
                   "tie_word_embeddings": True, "torch_dtype": "float16"},
    "tiny-mistral": {**BASE, "architectures": ["MistralForCausalLM"], "model_type": "mistral",
                     "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False,
                     "torch_dtype": "bfloat16"},
}
TINY_PROMPT_LENGTHS = [1, 6, 17, 70]

DEMO_PROMPTS = [
    {"name": "en_plain", "text": "The hacker"},
    {"name": "zh_plain", "text": "床前明月光，"},
    {"name": "gloss", "text": "computer (noun):"},
    {"name": "mixed_utf8", "text": "Hello 世界 🌍 — naïve café 123"},
    {"name": "chat_en", "messages": [{"role": "user", "content": 'What does "kernel" mean?'}]},
    {"name": "chat_zh_system", "messages": [{"role": "system", "content": "You are a helpful assistant."},
                                           {"role": "user", "content": "背诵《静夜思》。"}]},
]


def f32(values):
    """Shortest decimal that reads back as the same float32."""
    return [float(str(np.float32(v))) for v in values]


def randomise(model, gen):
    """Weights with real spread, so that greedy choices are not near-ties."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)


def load_fp32(folder):
    from transformers import AutoModelForCausalLM
    model, info = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager",
                                                       output_loading_info=True)
    tied = json.loads((Path(folder) / "config.json").read_text()).get("tie_word_embeddings", False)
    missing = [k for k in info.get("missing_keys", []) if not (tied and k == "lm_head.weight")]
    unexpected = list(info.get("unexpected_keys", []))
    if missing or unexpected or info.get("mismatched_keys"):
        raise SystemExit(f"{folder}: transformers did not load every tensor: {info}")
    return model.eval()


@torch.no_grad()
def reference(model, prompt_ids):
    x = torch.tensor([prompt_ids])
    logits = model(input_ids=x).logits[0].float()
    top = torch.topk(logits, 5, dim=-1)
    ids, greedy, margins = list(prompt_ids), [], []
    for _ in range(GREEDY_TOKENS):
        last = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
        t2 = torch.topk(last, 2)
        greedy.append(int(t2.indices[0]))
        margins.append(float(t2.values[0] - t2.values[1]))
        ids.append(greedy[-1])
    return {
        "prompt_ids": list(prompt_ids),
        "last_logits": f32(logits[-1].tolist()),
        "top5_ids": top.indices.tolist(),
        "top5_logits": [f32(r) for r in top.values.tolist()],
        "greedy_ids": greedy,
        "greedy_margins": f32(margins),
    }


def write_reference(path, model_dir, config, cases):
    import transformers
    path.write_text(json.dumps({
        "model": model_dir, "architecture": config["architectures"][0],
        "stored_dtype": config["torch_dtype"], "computed_dtype": "float32",
        "vocab_size": config["vocab_size"], "greedy_tokens": GREEDY_TOKENS,
        "transformers": transformers.__version__, "torch": torch.__version__,
        "cases": cases}, ensure_ascii=False) + "\n")


def make_tiny(name, config, out, seed):
    from transformers import AutoConfig, AutoModelForCausalLM
    folder = out / "models" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    gen = torch.Generator().manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), attn_implementation="eager")
    randomise(model, gen)
    dtype = STORAGE[config["torch_dtype"]]
    state = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()
             if not (config["tie_word_embeddings"] and k == "lm_head.weight")}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}, indent=2) + "\n")

    ref = load_fp32(folder)
    for k, v in ref.state_dict().items():  # the stored weights, exactly, upcast
        if k in state and not torch.equal(v, state[k].float()):
            raise SystemExit(f"{name}: {k} differs after reload")
    cases = []
    for i, n in enumerate(TINY_PROMPT_LENGTHS):
        ids = torch.randint(0, config["vocab_size"], (n,), generator=gen).tolist()
        cases.append({"name": f"random_{n}", **reference(ref, ids)})
    write_reference(out / "reference" / f"{name}.json", f"tests/fixtures/models/{name}", config, cases)
    size = (folder / "model.safetensors").stat().st_size
    print(f"{name}: {size} bytes of weights, {len(cases)} cases", flush=True)
    assert size < 1_000_000, f"{name} is over 1 MB"


def make_demo(demo, out):
    import jinja2
    from tokenizers import Tokenizer
    config = json.loads((demo / "config.json").read_text())
    tok = Tokenizer.from_file(str(demo / "tokenizer.json"))
    template = json.loads((demo / "tokenizer_config.json").read_text())["chat_template"]
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    try:  # transformers' own loader and template renderer, when this version offers them
        from transformers import AutoTokenizer
        hf_tok = AutoTokenizer.from_pretrained(demo)
    except Exception as e:  # noqa: BLE001 - report and fall back to jinja2 alone
        print(f"AutoTokenizer could not load {demo}: {e}", flush=True)
        hf_tok = None
    model = load_fp32(demo)
    cases = []
    for p in DEMO_PROMPTS:
        case = {"name": p["name"]}
        if "messages" in p:
            text = env.from_string(template).render(messages=p["messages"], add_generation_prompt=True)
            if hf_tok is not None:
                hf_text = hf_tok.apply_chat_template(p["messages"], tokenize=False, add_generation_prompt=True)
                if hf_text != text:
                    raise SystemExit(f"chat template: transformers {hf_text!r} != jinja2 {text!r}")
            case.update(messages=p["messages"], add_generation_prompt=True)
        else:
            text = p["text"]
        case["text"] = text
        ids = tok.encode(text, add_special_tokens=False).ids
        if hf_tok is not None and hf_tok.encode(text, add_special_tokens=False) != ids:
            raise SystemExit(f"tokenizer: transformers and tokenizers disagree on {text!r}")
        case.update(reference(model, ids))
        case["greedy_text"] = tok.decode(case["greedy_ids"], skip_special_tokens=False)
        cases.append(case)
        print(f"demo {p['name']}: {text!r} -> {case['greedy_text']!r}", flush=True)
    write_reference(out / "reference" / "demo.json", "models/demo", config, cases)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--demo", default="models/demo")
    ap.add_argument("--out", default="tests/fixtures")
    ap.add_argument("--seed", type=int, default=20261130)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    out = Path(args.out)
    (out / "reference").mkdir(parents=True, exist_ok=True)
    for i, (name, config) in enumerate(TINY.items()):
        make_tiny(name, config, out, args.seed + i)
    make_demo(Path(args.demo), out)


if __name__ == "__main__":
    main()
