"""PyTorch timings at the shapes tests/gpu/bench_cuda_ops uses, for the side-by-side
ratios in bench/RESULTS.md (run in the same invocation, same GPU). Eager PyTorch,
bf16, CUDA-event timing, mean of `reps` calls after 3 warm-ups."""
import sys

import torch
import torch.nn.functional as F

reps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
dev = "cuda"
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
bf = torch.bfloat16
N, C, H, D, V, B, T = 8192, 768, 12, 64, 50304, 8, 1024


def timeit(fn):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / reps


def row(name, ms):
    print(f"torch  {name:<44s} {ms:9.3f} ms", flush=True)


print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}, {reps} reps")
x = torch.randn(N, C, device=dev, dtype=bf)
for name, out, dt, bias in [("linear_fwd qkv bf16 +bias", 3 * C, bf, True),
                            ("linear_fwd fc bf16 +bias", 4 * C, bf, True),
                            ("linear_fwd fc f32 (exact)", 4 * C, torch.float32, True),
                            ("linear_fwd lm_head bf16", V, bf, False)]:
    xi = x.to(dt)
    w = torch.randn(out, C, device=dev, dtype=dt) * 0.05
    b = torch.randn(out, device=dev, dtype=dt) if bias else None
    row(name, timeit(lambda: F.linear(xi, w, b)))
w = torch.ones(C, device=dev, dtype=bf)
b = torch.zeros(C, device=dev, dtype=bf)
row("layernorm_fwd bf16", timeit(lambda: F.layer_norm(x, (C,), w, b, 1e-5)))
h = torch.randn(N, 4 * C, device=dev, dtype=bf)
row("gelu_fwd bf16 (tanh)", timeit(lambda: F.gelu(h, approximate="tanh")))
qkv = torch.randn(B, T, 3, H, D, device=dev, dtype=bf, requires_grad=True)


def attn():
    q, k, v = qkv.unbind(2)
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)


fwd = timeit(attn)
row("attention_fwd bf16 causal (SDPA)", fwd)
go = torch.randn(B, H, T, D, device=dev, dtype=bf)
both = timeit(lambda: attn().backward(go))
row("attention_bwd bf16 (fwd+bwd minus fwd)", both - fwd)
logits = torch.randn(N, V, device=dev, dtype=bf, requires_grad=True)
tgt = torch.randint(0, 50257, (N,), device=dev)
row("xent fwd + bwd bf16 (F.cross_entropy)", timeit(lambda: F.cross_entropy(logits, tgt).backward()))
P = 124439808
p = torch.nn.Parameter(torch.randn(P, device=dev) * 0.02)
p.grad = torch.randn(P, device=dev) * 1e-3
opt = torch.optim.AdamW([p], lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
row("adamw 124M f32 (fused=True, no bf16 copy)", timeit(opt.step))
g = p.grad
row("sumsq 124M f32 (torch.linalg.vector_norm)", timeit(lambda: torch.linalg.vector_norm(g)))
row("copy 124M f32 -> bf16", timeit(lambda: g.to(bf)))
