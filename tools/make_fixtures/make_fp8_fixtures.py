#!/usr/bin/env python3
"""FP8-weight reference fixtures (issue #34), made with transformers on the GPU machine.

For every model of tests/fixtures/reference/*.json this loads the model in float32 with
transformers and emulates lmserve's FP8 weights in PyTorch: each linear projection of the
decoder layers (q, k, v, o, gate, up, down; not the embedding or the LM head) is quantized per
output channel (scale = max|row| / 448, 1 for a row of zeros; w / scale clamped to +-448 and
cast to float8_e4m3fn, which rounds to nearest even) and used dequantized; its input is
fake-quantized per token the same way (scale = max|x| / 448 over the row). The products run
in float32 on the CPU (no TF32). For each case of the float32 fixture it stores the prompt and
the last position's logits in tests/fixtures/reference_fp8/<name>.json.

Usage: python3 tools/make_fixtures/make_fp8_fixtures.py [--fixtures tests/fixtures]
"""
import argparse
import json
from pathlib import Path

import numpy as np
import torch

E4M3_MAX = 448.0
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def f32(values):
    """Shortest decimal that reads back as the same float32."""
    return [float(str(np.float32(v))) for v in values]


def e4m3(values):
    """Round to e4m3 (nearest even, saturated at +-448), back in float32."""
    return values.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32)


def row_scales(t):
    amax = t.abs().amax(dim=-1, keepdim=True)
    return torch.where((amax > 0) & torch.isfinite(amax), amax / E4M3_MAX, torch.ones_like(amax))


class Fp8Linear(torch.nn.Module):
    """y = (e4m3(x / sx) e4m3(W / sw)^T) sx sw^T + b, in float32."""

    def __init__(self, linear):
        super().__init__()
        w = linear.weight.detach().float()
        self.w_scale = row_scales(w).squeeze(-1)
        self.wq = e4m3(w / self.w_scale[:, None])
        self.bias = None if linear.bias is None else linear.bias.detach().float()

    def forward(self, x):
        sx = row_scales(x)
        y = torch.matmul(e4m3(x / sx), self.wq.t()) * sx * self.w_scale
        return y if self.bias is None else y + self.bias


def quantize_model(model):
    count = 0
    for layer in model.model.layers:
        for block in (layer.self_attn, layer.mlp):
            for name in PROJECTIONS:
                if hasattr(block, name):
                    setattr(block, name, Fp8Linear(getattr(block, name)))
                    count += 1
    return count


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixtures", default="tests/fixtures")
    args = ap.parse_args()
    import transformers
    from transformers import AutoModelForCausalLM
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_num_threads(max(1, torch.get_num_threads()))
    fixtures = Path(args.fixtures)
    out = fixtures / "reference_fp8"
    out.mkdir(exist_ok=True)
    for ref_path in sorted((fixtures / "reference").glob("*.json")):
        ref = json.loads(ref_path.read_text())
        model = AutoModelForCausalLM.from_pretrained(ref["model"], dtype=torch.float32, attn_implementation="eager").eval()
        n = quantize_model(model)
        cases = []
        with torch.no_grad():
            for case in ref["cases"]:
                logits = model(input_ids=torch.tensor([case["prompt_ids"]])).logits[0, -1].float()
                cases.append({"name": case["name"], "prompt_ids": case["prompt_ids"], "last_logits": f32(logits.tolist())})
        (out / ref_path.name).write_text(json.dumps({
            "model": ref["model"], "projections_quantized": n,
            "emulation": "per-channel e4m3 weights, per-token e4m3 activations, float32 products on the CPU",
            "transformers": transformers.__version__, "torch": torch.__version__, "cases": cases}, ensure_ascii=False) + "\n")
        print(f"{ref_path.stem}: {n} projections, {len(cases)} cases", flush=True)


if __name__ == "__main__":
    main()
