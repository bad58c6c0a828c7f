#!/usr/bin/env python3
"""PyTorch + transformers MoE training-step reference for bench/gpu_moe.sh
(issue #23).

What a Hugging Face user trains for a Mixtral-style model: transformers'
MixtralForCausalLM of the shape a bench config gives (bench/configs/*.yaml:
model.*, moe.experts / top_k / ffn / aux_coef, train.micro_batch,
train.seq_len -- the file colossal-moe reads), randomly initialised
(transformers' init, --seed), SDPA attention, output_router_logits with
router_aux_loss_coef = moe.aux_coef so that its loss is the cross-entropy
plus the load-balancing loss (one over every layer's router logits together,
where colossal adds one per layer: the same work, another weight;
transformers has no z-loss, so the config says moe.z_coef 0), fused AdamW
(betas 0.9/0.95, eps 1e-8, weight decay 0.1 on matrices: every parameter of
two or more dimensions) and global-norm clipping at 1.0 -- the step
colossal-moe takes.

Precision (--precision):
  amp (default): f32 parameters under bf16 autocast, as
      bench/torch_gpu_train.py runs and as colossal's `precision: bf16`
      trains (bf16 compute, f32 masters). torch._grouped_mm is not an
      autocast op (pytorch/pytorch#174763), so transformers' grouped_mm
      experts would multiply the f32 expert weights in f32; with --experts
      auto the experts' forward is replaced by grouped_experts_forward
      below: the same grouped GEMMs (torch._grouped_mm, or
      torch.nn.functional.grouped_mm where it exists) on the weights and
      rows cast to bf16, which is what autocast does for every nn.Linear.
      The router, attention, norms and loss stay transformers' own.
  bf16: the model in bf16 (parameters, gradients and AdamW state), no
      autocast, transformers' experts as they are (grouped_mm by default in
      transformers 5): transformers' code unchanged, but less work per step
      than colossal's f32 masters.
  f32: no autocast (checking the script on a CPU).

--mode compile wraps the model in torch.compile (compilation happens in the
warm-up steps). Loss: the model's own (labels = input ids, shifted inside
transformers: T - 1 predicted tokens per row, the logits computed for all T).

Data: random token ids on the device (a few fixed batches, cycled). Every step
ends with loss.item() (a device synchronisation), as colossal's step does;
tokens/s = batch x seq / median step time over the timed steps.

Parameters: params_total counts every expert, params_active the top-k of
them (the others' share subtracted); flops_per_token = 6 x (active
parameters except the token embedding table) + 12 L T d, so the MFU counts
the work a token does (colossal-moe's own MFU counts every expert).

    python3 bench/torch_moe_train.py --config bench/configs/mixtral-0.6b.yaml --mode compile
    python3 bench/torch_moe_train.py --tiny --device cpu --precision f32 --steps 2 --warmup 1

The last line is machine-readable:
  RESULT {"impl": "torch-compile", "tokens_per_s": ..., "step_ms": ..., "params_total": ..., ...}
"""
import argparse
import inspect
import json
import os
import resource
import statistics
import sys
import time
import types

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpu_train import read_yaml  # noqa: E402


def fail(msg):
    sys.exit("torch_moe_train.py: " + msg)


def moe_config(a):
    """The shape, the router losses and the batch: --tiny, else the YAML
    file, else the mixtral-0.6b shape; refuses what transformers' Mixtral
    cannot express."""
    c = {"n_layers": 12, "d_model": 1024, "n_heads": 16, "n_kv_heads": 8, "ffn_hidden": 0, "vocab_size": 32000,
         "rope_theta": 10000.0, "norm_eps": 1e-5, "experts": 8, "top_k": 2, "ffn": 2048, "aux_coef": 0.01,
         "z_coef": 0.0, "batch": 8, "seq": 1024, "tie": False}
    y = read_yaml(a.config) if a.config else {}
    keys = {"model.n_layers": ("n_layers", int), "model.d_model": ("d_model", int), "model.n_heads": ("n_heads", int),
            "model.n_kv_heads": ("n_kv_heads", int), "model.ffn_hidden": ("ffn_hidden", int),
            "model.vocab_size": ("vocab_size", int), "model.rope_theta": ("rope_theta", float),
            "model.norm_eps": ("norm_eps", float), "moe.experts": ("experts", int), "moe.top_k": ("top_k", int),
            "moe.ffn": ("ffn", int), "moe.aux_coef": ("aux_coef", float), "moe.z_coef": ("z_coef", float),
            "train.micro_batch": ("batch", int), "train.seq_len": ("seq", int)}
    for k, (name, typ) in keys.items():
        if k in y:
            c[name] = typ(y[k])
    c["tie"] = y.get("model.tie_embeddings", "false") == "true"
    # transformers' Mixtral: softmax router renormalised over the top k,
    # dropless, every block MoE, no shared experts (docs/moe.md).
    for key, want in (("moe.router", "softmax"), ("moe.routing", "dropless"), ("moe.every", "1"),
                      ("moe.shared", "0"), ("moe.norm_topk", "1")):
        if key in y and y[key] != want:
            fail("%s: %s=%s, but transformers' Mixtral has only %s" % (a.config, key, y[key], want))
    if a.tiny:
        c.update(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, ffn=128, batch=4, seq=64)
    for name, v in (("n_layers", a.n_layers), ("d_model", a.d_model), ("batch", a.batch), ("seq", a.seq),
                    ("experts", a.n_experts), ("top_k", a.top_k)):
        if v is not None:
            c[name] = v
    if not c["ffn"]:
        c["ffn"] = c["ffn_hidden"]
    if not c["ffn"]:
        fail("no expert hidden size: set moe.ffn (or model.ffn_hidden)")
    if not c["n_kv_heads"]:
        c["n_kv_heads"] = c["n_heads"]
    if not c["rope_theta"]:
        c["rope_theta"] = 10000.0
    if not c["norm_eps"]:
        c["norm_eps"] = 1e-5
    if c["z_coef"]:
        print("warning: moe.z_coef=%g in %s: transformers' Mixtral has no z-loss, so this side trains without it"
              % (c["z_coef"], a.config), flush=True)
    return c


# ----------------------------------------------------------------- experts

def _grouped_mm(x, w, offs):
    """Rows of x grouped by expert (offs: cumulative ends) times w[e]: the
    fused kernel on a GPU, a loop over the groups elsewhere."""
    if x.is_cuda and hasattr(F, "grouped_mm"):
        return F.grouped_mm(x, w, offs=offs)
    if x.is_cuda and hasattr(torch, "_grouped_mm"):
        return torch._grouped_mm(x, w, offs=offs)
    out, start = [], 0
    for e, end in enumerate(offs.tolist()):
        out.append(x[start:end] @ w[e])
        start = end
    return torch.cat(out)


def grouped_experts_forward(self, hidden_states, top_k_index, top_k_weights, compute_dtype=None):
    """transformers 5's MixtralExperts.forward contract (hidden_states
    [N, C], top_k_index / top_k_weights [N, k] -> [N, C]) as two grouped
    GEMMs over the N k assignments sorted by expert, in compute_dtype (the
    autocast dtype) when given. Static shapes (no data-dependent size), so
    torch.compile captures it whole."""
    n, c = hidden_states.shape
    k = top_k_index.shape[-1]
    w_gu, w_down = self.gate_up_proj, self.down_proj
    E = w_gu.shape[0]
    dt = compute_dtype or hidden_states.dtype
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(E, dtype=torch.int64, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))
    offs = torch.cumsum(counts, 0).to(torch.int32)
    x = hidden_states.to(dt)[order // k]
    w_gu, w_down = w_gu.to(dt), w_down.to(dt)
    # Mixtral stores [E, 2F, C] and [E, C, F] (out x in) unless the
    # decorator says the experts are transposed.
    if not (getattr(self, "is_transposed", False) or getattr(self, "experts_are_transposed", False)):
        w_gu, w_down = w_gu.transpose(-2, -1), w_down.transpose(-2, -1)
    gate, up = _grouped_mm(x, w_gu, offs).chunk(2, dim=-1)
    h = getattr(self, "act_fn", F.silu)(gate) * up
    y = _grouped_mm(h, w_down, offs)
    y = torch.empty_like(y).index_copy_(0, order, y)  # back to (token, slot) order
    y = y * top_k_weights.reshape(-1, 1).to(dt)
    return y.view(n, k, c).sum(dim=1)


def patch_experts(model, compute_dtype):
    """Binds grouped_experts_forward to every 3-D experts module; returns
    how many (0: transformers < 5, whose per-expert nn.Linear autocasts)."""
    n = 0
    for m in model.modules():
        gu, dn = getattr(m, "gate_up_proj", None), getattr(m, "down_proj", None)
        if isinstance(gu, torch.nn.Parameter) and isinstance(dn, torch.nn.Parameter) and gu.dim() == 3:
            def fwd(self, hidden_states, top_k_index, top_k_weights):
                return grouped_experts_forward(self, hidden_states, top_k_index, top_k_weights, compute_dtype)
            m.forward = types.MethodType(fwd, m)
            n += 1
    return n


# ----------------------------------------------------------------- model

def build(c, a, dev):
    import transformers
    from transformers import MixtralConfig, MixtralForCausalLM
    kw = dict(vocab_size=c["vocab_size"], hidden_size=c["d_model"], intermediate_size=c["ffn"],
              num_hidden_layers=c["n_layers"], num_attention_heads=c["n_heads"],
              num_key_value_heads=c["n_kv_heads"], num_local_experts=c["experts"],
              num_experts_per_tok=c["top_k"], max_position_embeddings=c["seq"], rms_norm_eps=c["norm_eps"],
              router_aux_loss_coef=c["aux_coef"], output_router_logits=True, router_jitter_noise=0.0,
              tie_word_embeddings=c["tie"], sliding_window=None, attention_dropout=0.0, hidden_act="silu",
              initializer_range=0.02, use_cache=False)
    # transformers 5 takes the RoPE base in rope_parameters, 4.x as rope_theta.
    if "rope_parameters" in inspect.signature(MixtralConfig.__init__).parameters:
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": c["rope_theta"]}
    else:
        kw["rope_theta"] = c["rope_theta"]
    cfg = MixtralConfig(attn_implementation=a.attn, **kw)
    if a.experts_impl not in ("auto", "script"):
        if not hasattr(cfg, "_experts_implementation"):
            fail("--experts %s needs transformers >= 5 (this is %s)" % (a.experts_impl, transformers.__version__))
        cfg._experts_implementation = a.experts_impl
    dtype = torch.bfloat16 if a.precision == "bf16" else torch.float32
    if hasattr(torch.device, "__enter__"):  # initialise on the device (0.7B: seconds on a CPU)
        with dev:
            model = MixtralForCausalLM(cfg)
    else:
        model = MixtralForCausalLM(cfg).to(dev)
    model.to(dtype).train()
    experts = getattr(model.config, "_experts_implementation", None) or "eager"
    if a.experts_impl == "script" or (a.experts_impl == "auto" and a.precision == "amp"):
        if patch_experts(model, torch.bfloat16 if a.precision == "amp" else None):
            experts = "grouped GEMMs in %s (torch_moe_train.py)" % ("bf16" if a.precision == "amp" else a.precision)
        else:
            experts = "eager (per-expert nn.Linear)"
    elif a.precision == "amp" and experts != "eager":
        print("warning: --experts %s under autocast: torch._grouped_mm does not autocast, so the f32 expert "
              "weights are multiplied in f32" % experts, flush=True)
    # The RoPE base the model really uses (the config keys moved between
    # versions); 1% tells 1e4 from Mixtral's default 1e6 through bf16 rounding.
    hd = c["d_model"] // c["n_heads"]
    for name, buf in model.named_buffers():
        if name.endswith("inv_freq") and buf.numel() > 1:
            want = c["rope_theta"] ** (-2.0 / hd)
            if abs(buf[1].item() - want) > 1e-2 * want:
                fail("%s[1] = %g, but rope_theta %g gives %g: this transformers ignored the RoPE base"
                     % (name, buf[1].item(), c["rope_theta"], want))
            break
    return model, experts, transformers.__version__


def count_params(model, c):
    total = sum(p.numel() for p in model.parameters())
    expert = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    active = total - expert * (c["experts"] - c["top_k"]) // c["experts"]
    return total, active


# ----------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", help="bench/configs/*.yaml (model.*, moe.*, train.micro_batch, train.seq_len)")
    ap.add_argument("--tiny", action="store_true", help="2 layers, d_model 64, expert ffn 128, batch 4 x 64")
    ap.add_argument("--n-layers", dest="n_layers", type=int)
    ap.add_argument("--d-model", dest="d_model", type=int)
    ap.add_argument("--n-experts", dest="n_experts", type=int, help="experts per layer (default: moe.experts)")
    ap.add_argument("--top-k", dest="top_k", type=int)
    ap.add_argument("--batch", type=int, help="sequences per step (default: train.micro_batch)")
    ap.add_argument("--seq", type=int, help="tokens per sequence (default: train.seq_len)")
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--compile-mode", default=None, help="torch.compile mode (default: its default)")
    ap.add_argument("--precision", choices=["amp", "bf16", "f32"], default="amp",
                    help="amp: f32 parameters, bf16 autocast (default); bf16: bf16 parameters; f32")
    ap.add_argument("--experts", dest="experts_impl", default="auto",
                    choices=["auto", "script", "eager", "grouped_mm", "batched_mm"],
                    help="auto: this script's bf16 grouped GEMMs under amp, transformers' default otherwise; "
                         "script: this script's; the others: transformers' experts_implementation")
    ap.add_argument("--attn", default="sdpa", help="transformers attn_implementation (default sdpa)")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--steps", type=int, default=25, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation happens here)")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="for MFU (989: H100/H200 dense bf16)")
    ap.add_argument("--tag", default="", help="copied into the RESULT line")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    c = moe_config(a)

    cuda = a.device.startswith("cuda")
    if cuda:
        if not torch.cuda.is_available():
            fail("no CUDA device visible (use --device cpu to check the script)")
        dev = torch.device("cuda", torch.cuda.current_device())
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        dev = torch.device("cpu")
    try:
        import transformers  # noqa: F401
    except ImportError as e:
        fail("transformers is not importable (%s)" % e)
    torch.manual_seed(a.seed)
    model, experts_impl, tf_version = build(c, a, dev)
    total, active = count_params(model, c)
    L, T, d, B = c["n_layers"], c["seq"], c["d_model"], c["batch"]
    n_matmul = active - c["vocab_size"] * d  # the token embedding table is a lookup
    flops_tok = 6 * n_matmul + 12 * L * T * d

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    okw = {"fused": True} if cuda else {"foreach": True}
    opt = torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), eps=1e-8, **okw)

    run = model
    if a.mode == "compile":
        run = torch.compile(model, **({"mode": a.compile_mode} if a.compile_mode else {}))

    g = torch.Generator(device="cpu").manual_seed(a.seed * 1000)
    batches = [torch.randint(0, c["vocab_size"], (B, T), generator=g).to(dev) for _ in range(4)]
    amp = torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=a.precision == "amp")

    def step(i):
        x = batches[i % len(batches)]
        opt.zero_grad(set_to_none=True)
        with amp:
            out = run(input_ids=x, labels=x, use_cache=False)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if out.aux_loss is None:
            fail("the model returned no aux_loss: output_router_logits did not take")
        return out.loss.item(), out.aux_loss.item()

    impl = "torch-" + a.mode + ("" if a.precision == "amp" else "-" + a.precision)
    print("%s: torch %s, transformers %s, %s; MixtralForCausalLM %d layers, d_model %d, %d heads (%d kv), "
          "%d experts of ffn %d, top-%d, vocab %d, %s: %.2fM parameters, %.2fM active; aux coef %g; batch %d x %d; "
          "%s, experts: %s, attention: %s, %s AdamW"
          % (impl, torch.__version__, tf_version, torch.cuda.get_device_name(dev) if cuda else "cpu", L, d,
             c["n_heads"], c["n_kv_heads"], c["experts"], c["ffn"], c["top_k"], c["vocab_size"],
             "tied" if c["tie"] else "untied", total / 1e6, active / 1e6, c["aux_coef"], B, T,
             {"amp": "f32 parameters, bf16 autocast", "bf16": "bf16 parameters", "f32": "f32"}[a.precision],
             experts_impl, getattr(model.config, "_attn_implementation", a.attn),
             "fused" if okw.get("fused") else "foreach"), flush=True)
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    t_start = time.perf_counter()
    losses, auxes, times = [], [], []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        loss, aux = step(i)
        dt = time.perf_counter() - t0
        losses.append(loss)
        auxes.append(aux)
        if i >= a.warmup:
            times.append(dt)
        else:
            print("warm-up step %d: %.3f s, loss %.4f (aux %.4f)" % (i + 1, dt, loss, aux), flush=True)
    total_s = time.perf_counter() - t_start
    med = statistics.median(times)
    tok_step = B * T
    tps = tok_step / med
    peak = a.peak_tflops * 1e12
    res = {"impl": impl, "tag": a.tag, "model": "mixtral", "n_layers": L, "d_model": d, "n_heads": c["n_heads"],
           "n_kv_heads": c["n_kv_heads"], "experts": c["experts"], "top_k": c["top_k"], "expert_ffn": c["ffn"],
           "vocab_size": c["vocab_size"], "aux_coef": c["aux_coef"], "batch": B, "seq": T, "ranks": 1,
           "precision": a.precision, "experts_impl": experts_impl, "params": total, "params_total": total,
           "params_active": active, "flops_per_token": flops_tok, "peak_flops": peak, "steps": a.steps,
           "warmup": a.warmup, "step_s_median": med, "step_ms": 1e3 * med, "step_s_mean": sum(times) / len(times),
           "step_s_min": min(times), "tokens_per_step": tok_step, "tokens_per_s": tps,
           "tokens_per_s_mean": tok_step * len(times) / sum(times), "mfu": tps * flops_tok / peak,
           "loss_first": losses[0], "loss_last": losses[-1], "aux_first": auxes[0], "aux_last": auxes[-1],
           "wall_s": total_s, "torch": torch.__version__, "transformers": tf_version}
    if cuda:
        res["peak_alloc_mib"] = torch.cuda.max_memory_allocated(dev) / 2**20
        res["peak_reserved_mib"] = torch.cuda.max_memory_reserved(dev) / 2**20
    res["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print("%s: %d timed steps after %d warm-up: median %.1f ms/step (mean %.1f, min %.1f) -> %.0f tokens/s, "
          "MFU %.1f%% (active parameters); loss %.4f -> %.4f; peak memory %s"
          % (impl, a.steps, a.warmup, 1e3 * med, 1e3 * res["step_s_mean"], 1e3 * res["step_s_min"], tps,
             100 * res["mfu"], losses[0], losses[-1],
             "%.0f MiB allocated, %.0f MiB reserved" % (res["peak_alloc_mib"], res["peak_reserved_mib"])
             if cuda else "%.0f MiB RSS" % res["peak_rss_mib"]), flush=True)
    print("RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
