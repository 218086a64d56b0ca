#!/usr/bin/env python3
# Run on the GPU machine (its PyTorch): python3 scripts/device-read-bandwidth.py
# Read-only bandwidth vs copy on the H200, and torch's (cuBLAS) one-row products at the 8B
# decode shapes, to bound what a weight-streaming GEMV can reach.
import torch
dev = 'cuda'
def timeit(fn, reps=20):
    fn(); torch.cuda.synchronize()
    e0 = torch.cuda.Event(enable_timing=True); e1 = torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps): fn()
    e1.record(); torch.cuda.synchronize()
    return e0.elapsed_time(e1) / reps / 1e3
n = 8 * 1024**3 // 2  # 8 GiB of bf16
a = torch.randn(n // 1024, 1024, device=dev, dtype=torch.bfloat16)
b = torch.empty_like(a)
gb = a.numel() * 2 / 1e9
t = timeit(lambda: b.copy_(a), 10); print(f"copy 8 GiB: {t*1e3:.2f} ms = {2*gb/t:.0f} GB/s counting read+write, {gb/t:.0f} GB/s one way")
t = timeit(lambda: a.sum(dtype=torch.float32), 10); print(f"sum (read only) 8 GiB: {t*1e3:.2f} ms = {gb/t:.0f} GB/s")
t = timeit(lambda: torch.amax(a), 10); print(f"amax (read only) 8 GiB: {t*1e3:.2f} ms = {gb/t:.0f} GB/s")
del a, b
torch.cuda.empty_cache()
# One-row products at the Llama-3.1-8B shapes, 32 layers' worth of distinct weights (no L2 reuse).
shapes = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336), "lm_head": (128256, 4096)}
tot_t = tot_b = 0
for name, (m, k) in shapes.items():
    L = 1 if name == "lm_head" else 32
    ws = [torch.randn(m, k, device=dev, dtype=torch.bfloat16) for _ in range(L)]
    x = torch.randn(k, 1, device=dev, dtype=torch.bfloat16)
    t = timeit(lambda: [w @ x for w in ws], 10)
    by = L * m * k * 2
    tot_t += t; tot_b += by
    print(f"torch {name} [{m}x{k}] x{L}: {t*1e6/L:.1f} us each = {by/t/1e9:.0f} GB/s")
    del ws
    torch.cuda.empty_cache()
print(f"torch one-row products, a step's weights: {tot_t*1e3:.3f} ms for {tot_b/1e9:.2f} GB = {tot_b/tot_t/1e9:.0f} GB/s")
