#!/usr/bin/env python3
"""Trains lmserve's demo model: a small Llama with GQA and a byte-level BPE tokenizer.

Runs on the GPU machine (PyTorch, transformers, tokenizers); reads the corpus
written by prepare_corpus.py and writes a Hugging Face model folder:
config.json, model.safetensors (bf16), tokenizer.json, tokenizer_config.json
(ChatML chat_template), generation_config.json, README.md (the model card,
filled with this run's numbers).

Reproducible: a fixed seed, deterministic kernels, one GPU.

  python3 tools/train_demo/train.py --corpus .device/corpus \
      --heldout tests/fixtures/demo_heldout.txt --out models/demo
"""
import argparse
import json
import math
import os
import time
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

HERE = Path(__file__).resolve().parent
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# The pre-tokenizer split used by Qwen2 / Qwen2.5 (letters, single digits, punctuation runs, whitespace).
SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def render_chat(messages, add_generation_prompt=False):
    """The ChatML layout of chatml.jinja, for training data (the template itself is what ships)."""
    s = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return s + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def load_corpus(path):
    docs = []
    for ln in open(path, encoding="utf-8"):
        d = json.loads(ln)
        docs.append(d["text"] if d["kind"] == "text" else render_chat(d["messages"]))
    return docs


def train_tokenizer(docs, vocab_size):
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer=trainer)
    return tok


def model_config(vocab_size, eos_id, args):
    # Written by hand in the layout of Hugging Face hub checkpoints (rope_theta, torch_dtype),
    # which is what users' model folders look like and what lmserve must read.
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": args.hidden,
        "intermediate_size": args.intermediate,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "head_dim": args.hidden // args.heads,
        "hidden_act": "silu",
        "max_position_embeddings": args.max_positions,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": True,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "bfloat16",
    }


def build_model(cfg_dict, workdir):
    from transformers import AutoConfig, AutoModelForCausalLM
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.json").write_text(json.dumps(cfg_dict, indent=2) + "\n")
    cfg = AutoConfig.from_pretrained(workdir)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")


def batches(stream, seq_len, batch, steps, seed, device):
    n = (len(stream) - 1) // seq_len
    data = torch.tensor(stream[: n * seq_len + 1], dtype=torch.long)
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=g)
    pos = 0
    for _ in range(steps):
        if pos + batch > n:
            order, pos = torch.randperm(n, generator=g), 0
        idx = order[pos: pos + batch]
        pos += batch
        x = torch.stack([data[i * seq_len: i * seq_len + seq_len + 1] for i in idx.tolist()])
        yield x.to(device, non_blocking=True)


@torch.no_grad()
def mean_nll(model, docs_ids, device, seq_len, dtype):
    """Token-weighted mean negative log-likelihood over documents (each scored on its own)."""
    total, count = 0.0, 0
    for ids in docs_ids:
        ids = ids[: seq_len]
        if len(ids) < 2:
            continue
        x = torch.tensor([ids], device=device)
        with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
            logits = model(input_ids=x).logits.float()
        loss = torch.nn.functional.cross_entropy(logits[0, :-1], x[0, 1:], reduction="sum")
        total += loss.item()
        count += len(ids) - 1
    return total / max(count, 1), count


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--heldout", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--vocab", type=int, default=6000)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--max-positions", type=int, default=2048)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=100)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    device = "cuda"
    t0 = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    docs = load_corpus(Path(args.corpus) / "train.jsonl")
    tok = train_tokenizer(docs, args.vocab)
    vocab_size = tok.get_vocab_size()
    eot, im_end = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    tok.save(str(out / "tokenizer.json"))
    print(f"tokenizer: {vocab_size} tokens, {time.time() - t0:.1f}s", flush=True)

    stream = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        stream.extend(enc.ids)
        stream.append(eot)
    held_docs = [d for d in Path(args.heldout).read_text(encoding="utf-8").split("\n\n") if d.strip()]
    held_ids = [e.ids + [eot] for e in tok.encode_batch(held_docs, add_special_tokens=False)]
    print(f"train tokens: {len(stream)}, held-out docs: {len(held_docs)}", flush=True)

    cfg = model_config(vocab_size, eot, args)
    model = build_model(cfg, out).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)

    def lr_at(step):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        p = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))

    model.train()
    log, ema = [], None
    for step, x in enumerate(batches(stream, args.seq_len, args.batch, args.steps, args.seed, device)):
        for grp in opt.param_groups:
            grp["lr"] = lr_at(step)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab_size), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        if step % 100 == 0 or step == args.steps - 1:
            log.append({"step": step, "loss": round(loss.item(), 4)})
            print(f"step {step:5d} loss {loss.item():.4f} ema {ema:.4f} lr {lr_at(step):.2e} "
                  f"{time.time() - t0:.0f}s", flush=True)
    train_secs = time.time() - t0

    # Ship bf16 weights; evaluate the shipped weights (upcast to fp32), not the fp32 master copy.
    model.eval()
    state = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in model.state_dict().items()
             if k != "lm_head.weight"}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    from transformers import LlamaForCausalLM
    shipped = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").to(device)
    shipped.eval()
    train_sample = [stream[i: i + args.seq_len] for i in range(0, min(len(stream), 400 * args.seq_len), args.seq_len)]
    train_nll, _ = mean_nll(shipped, train_sample, device, args.seq_len, torch.float32)
    held_nll, held_tokens = mean_nll(shipped, held_ids, device, args.seq_len, torch.float32)

    (out / "generation_config.json").write_text(json.dumps({
        "bos_token_id": eot, "eos_token_id": [im_end, eot], "pad_token_id": eot,
        "do_sample": True, "temperature": 0.7, "top_p": 0.9, "max_new_tokens": 256}, indent=2) + "\n")
    special = {t: tok.token_to_id(t) for t in SPECIAL}
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": True} for t, i in special.items()},
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "clean_up_tokenization_spaces": False, "model_max_length": args.max_positions,
        "add_bos_token": False, "add_eos_token": False,
        "chat_template": (HERE / "chatml.jinja").read_text().rstrip("\n"),
    }, indent=2, ensure_ascii=False) + "\n")

    info = json.loads((Path(args.corpus) / "sources.json").read_text())
    metrics = {"params": n_params, "vocab_size": vocab_size, "train_tokens": len(stream),
               "steps": args.steps, "seq_len": args.seq_len, "batch": args.batch, "seed": args.seed,
               "final_train_loss_ema": round(ema, 4), "train_loss_shipped_bf16": round(train_nll, 4),
               "heldout_loss": round(held_nll, 4), "heldout_ppl": round(math.exp(held_nll), 2),
               "heldout_tokens": held_tokens, "train_seconds": round(train_secs, 1),
               "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "log": log, "corpus": info}
    (out / "training_log.json").write_text(json.dumps(metrics, indent=1, ensure_ascii=False) + "\n")
    write_card(out, cfg, metrics, args)
    print(json.dumps({k: v for k, v in metrics.items() if k not in ("log", "corpus")}), flush=True)


def write_card(out, cfg, m, args):
    import tokenizers
    import transformers
    files = sorted(p.name for p in out.iterdir() if p.is_file())
    size = sum((out / f).stat().st_size for f in files) + 4096  # README itself, roughly
    c = m["corpus"]
    card = f"""# lmserve demo model

A {m['params'] / 1e6:.2f} M-parameter Llama-architecture model, trained from scratch by
`tools/train_demo/` for lmserve's `make serve` and end-to-end tests. It is a toy: it writes
plausible-looking dictionary glosses, hacker-jargon entries and classical Chinese verse, in
ChatML chat form or as plain text. It knows nothing reliable.

## Architecture
| | |
|---|---|
| architecture | `LlamaForCausalLM` (RoPE, RMSNorm, SwiGLU), tied embeddings |
| layers / hidden / intermediate | {cfg['num_hidden_layers']} / {cfg['hidden_size']} / {cfg['intermediate_size']} |
| heads / KV heads / head dim | {cfg['num_attention_heads']} / {cfg['num_key_value_heads']} / {cfg['head_dim']} (grouped-query attention) |
| context | {cfg['max_position_embeddings']} positions, trained on {m['seq_len']}-token windows |
| weights | bf16, `model.safetensors` |
| tokenizer | byte-level BPE, {m['vocab_size']} tokens (Qwen2-style split regex, NFC), trained by the script |
| special tokens | `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`; chat template: ChatML |

## Data
Text that ships in Debian 12 packages, prepared by `tools/train_demo/prepare_corpus.py`
(seed {c['seed']}); 5% of the documents are held out in `tests/fixtures/demo_heldout.txt`.

| package | version | files | licence | training documents |
|---|---|---|---|---|
| fortunes-zh | {c['packages']['fortunes-zh']} | `tang300`, `song100`, `chinese` | GPL-3.0+ | {c['train_docs'].get('tang300', 0)} + {c['train_docs'].get('song100', 0)} + {c['train_docs'].get('chinese', 0)} |
| jargon-text | {c['packages']['jargon-text']} | `jargon.txt.gz` (The Jargon File 4.4.7) | public domain | {c['train_docs'].get('jargon', 0)} |
| wordnet-base | {c['packages']['wordnet-base']} | `data.{{noun,verb,adj,adv}}` glosses (sampled) | WordNet 3.0 licence (permissive) | {c['train_docs'].get('wordnet', 0)} |

Besides the plain documents, {c['train_docs'].get('chat', 0)} ChatML conversations were made from
the same training documents ("Recite the poem ...", "What does X mean?", "What is X in hacker
jargon?"). Held-out documents: {c['heldout_docs']}. Because part of the training text is GPL-3.0+,
treat these weights as a derivative of it.

## Training
Exact command (GPU machine, after `python3 tools/train_demo/prepare_corpus.py --out .device/corpus
--heldout tests/fixtures/demo_heldout.txt` on the build machine):

```
python3 tools/train_demo/train.py --corpus .device/corpus --heldout tests/fixtures/demo_heldout.txt \\
    --out models/demo --seed {m['seed']} --steps {m['steps']} --batch {m['batch']} --seq-len {m['seq_len']} \\
    --lr {args.lr} --vocab {args.vocab}
```

AdamW (β 0.9/0.95, weight decay 0.1), {args.warmup} warm-up steps then cosine decay to 10%,
bf16 autocast, deterministic kernels, seed {m['seed']}, {m['steps']} steps of {m['batch']} × {m['seq_len']} tokens
over {m['train_tokens']:,} training tokens; {m['train_seconds']} s on one {m['gpu']}
(torch {m['torch']}, transformers {transformers.__version__}, tokenizers {tokenizers.__version__}).

## Results
Measured on the shipped bf16 weights, computed in float32 by transformers:

| | |
|---|---|
| final train loss (EMA of the last steps) | {m['final_train_loss_ema']} |
| train loss of the shipped weights (first {min(400, m['train_tokens'] // m['seq_len'])} windows) | {m['train_loss_shipped_bf16']} |
| held-out loss (nats/token) | {m['heldout_loss']} |
| **held-out perplexity** | **{m['heldout_ppl']}** over {m['heldout_tokens']:,} tokens |

`training_log.json` has the loss every 100 steps. Total size of this folder: about {size / 1e6:.1f} MB.
"""
    (out / "README.md").write_text(card, encoding="utf-8")


if __name__ == "__main__":
    main()
