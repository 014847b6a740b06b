#!/usr/bin/env python3
"""The PyTorch peer of ablate's GPU training benchmark: the model of an ablate config, trained as a
PyTorch user would make it fast on one GPU, timed per step.

The architecture comes from the config's [model] (torch_gpt.py: the same family, parameter count and
initialisation as ablate's; GPT-2's family or the Llama one of configs/llama-1b.toml), the batch from
[batching] (or --batch / --seq-len). On CUDA it uses
bf16 autocast (fp32 master weights and optimizer state, fp32 loss), scaled_dot_product_attention
(flash attention on Hopper), AdamW(fused=True) with gradient-norm clipping at [optimizer] grad_clip,
and torch.compile. Batches are random tokens made before timing. Each timed step is synchronised
(torch.cuda.synchronize) and the median of the timed steps after --warmup untimed ones (which
include compilation) is reported: tokens/s, step time, MFU, peak memory.

  FLOPs per token = 6 N + 6 L d T (N = all parameters; llm.c's convention, causal attention counted
  once), as ablate's metrics define it; MFU against the device's dense bf16 peak from the same kind of
  table ablate uses (H100 SXM 989 TFLOP/s, H100 PCIe 756, H200 989, A100 312), or --peak-tflops.

--float8 converts every linear layer of the blocks (q, k, v, o and the MLP's; not the LM head, which
ablate's run.dtype = "fp8" keeps in bf16 too) to torchao's float8 training with tensorwise dynamic
scaling (E4M3 forward, E5M2 gradients, as run.dtype = "fp8" with fp8_scaling = "current"); exit 77
when torchao is not importable or the device has no FP8 products.

--batch auto tries micro-batches from --max-batch down (halving) and keeps the largest whose step
runs without running out of memory.

Usage (on a GPU machine; python3 there has torch):
  python3 bench/peers/pytorch_gpt.py --config configs/gpt2-124m.toml --batch auto --json OUT.json
and on a CPU, to check the script itself:
  python3 bench/peers/pytorch_gpt.py --config configs/quickstart.toml --vocab 80 --device cpu --dtype fp32 \\
      --no-compile --batch 2 --steps 3 --warmup 1
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import time
import tomllib

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from torch_gpt import GPT, Llama  # noqa: E402
from benchlib import REPO, git_commit, write_result  # noqa: E402

# Dense bf16 tensor-core peaks, TFLOP/s (vendor figures, without sparsity); fp32 has no entry.
PEAKS_BF16 = [("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0), ("H200", 989.0), ("GH200", 989.0),
              ("B200", 2250.0), ("A100", 312.0), ("L40S", 362.0), ("L4", 121.0), ("A10", 125.0)]


def peak_tflops(device_name, dtype, override):
    if override > 0:
        return override
    if dtype != "bf16":
        return None
    for key, value in PEAKS_BF16:
        if key in device_name:
            return value
    return None


GPT2_FAMILY = {"norm": "layernorm", "mlp": "gelu_mlp", "position": "learned", "bias": True, "tie_embeddings": True,
               "qk_norm": False, "mlp_hidden": 0, "dropout": 0.0}
LLAMA_FAMILY = {"norm": "rmsnorm", "mlp": "swiglu_mlp", "position": "rope", "bias": False, "tie_embeddings": False,
                "qk_norm": False, "dropout": 0.0}


def family_of(cfg):
    """"gpt2" or "llama": the family the config's [model] is; the peer implements those two alone
    (anything else would compare different models). A key the config leaves out has ablate's
    default, GPT-2's."""
    m = cfg.get("model", {})

    def matches(family):
        return all(m.get(k, GPT2_FAMILY[k]) == v for k, v in family.items())

    if matches(GPT2_FAMILY) and m.get("n_kv_heads", 0) in (0, m.get("n_heads")):
        return "gpt2"
    if matches(LLAMA_FAMILY):
        return "llama"
    diff = {k: m[k] for k in GPT2_FAMILY if k in m and m[k] != GPT2_FAMILY[k]}
    raise SystemExit(f"[model] {diff}: the PyTorch peer implements GPT-2's family ({GPT2_FAMILY}) "
                     f"and the Llama one ({LLAMA_FAMILY}) alone")


def swiglu_hidden(d):
    """ablate's SwiGLU width when [model] mlp_hidden is 0 (layer_params::swiglu_hidden): 8 d / 3,
    rounded up to a multiple of 64."""
    return ((8 * d + 2) // 3 + 63) // 64 * 64


def model_shape(cfg, args):
    m = cfg.get("model", {})
    vocab = args.vocab or m.get("vocab_size", 0)
    if not vocab:
        raise SystemExit(f"{args.config}: [model] vocab_size is 0 (the data source's); pass --vocab")
    heads = m.get("n_heads", 4)
    return {"family": family_of(cfg), "vocab": vocab, "vocab_multiple": m.get("vocab_multiple", 1),
            "d": m.get("d_model", 128), "layers": m.get("n_layers", 4), "heads": heads,
            "kv_heads": m.get("n_kv_heads", 0) or heads, "mlp_hidden": m.get("mlp_hidden", 0),
            "max_seq_len": m.get("max_seq_len", 1024), "rope_theta": m.get("rope", {}).get("theta", 10000.0)}


def build_model(shape):
    if shape["family"] == "llama":
        return Llama(shape["vocab"], shape["d"], shape["layers"], shape["heads"], shape["kv_heads"],
                     shape["mlp_hidden"] or swiglu_hidden(shape["d"]), shape["vocab_multiple"], shape["rope_theta"])
    return GPT(shape["vocab"], shape["d"], shape["layers"], shape["heads"], shape["max_seq_len"], shape["vocab_multiple"])


def to_float8(model):
    """torchao's float8 training on the blocks' linear layers (tensorwise, dynamic scaling); None
    where torchao is missing, else a description of the recipe."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        import torchao
    except ImportError as e:
        return None, f"torchao is not importable ({e})"
    config = Float8LinearConfig.from_recipe_name("tensorwise")
    convert_to_float8_training(model, config=config,
                               module_filter_fn=lambda mod, fqn: fqn.startswith("blocks.") and mod.in_features % 16 == 0
                               and mod.out_features % 16 == 0)
    converted = sum(type(mod).__name__ == "Float8Linear" for mod in model.modules())
    return f"torchao {torchao.__version__} float8 tensorwise, {converted} linear layers", None


def make_step(model, opt, dtype, device, clip):
    def step(tokens, targets):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
            loss = model(tokens, targets)
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        return loss
    return step


# torch's out-of-memory error (torch.cuda's before torch 2.1 named it at the top level).
OUT_OF_MEMORY = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError


class Float8Unavailable(Exception):
    pass


def run(args, cfg, shape, B, T, device):
    torch.manual_seed(args.seed)
    model = build_model(shape).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    float8 = None
    if args.float8:
        float8, why = to_float8(model)
        if float8 is None:
            raise Float8Unavailable(why)
    opt_cfg = dict(cfg.get("optimizer", {}))
    # The AdamW family's keys live in [optimizer.adamw] (older experiments wrote them in [optimizer]).
    family = opt_cfg.get("adamw", {})
    opt_cfg.update({k: v for k, v in family.items() if k in ("weight_decay", "beta1", "beta2", "eps")})
    fused = device.type == "cuda"
    opt = torch.optim.AdamW(model.param_groups(opt_cfg.get("weight_decay", 0.1)), lr=opt_cfg.get("lr", 6e-4),
                            betas=(opt_cfg.get("beta1", 0.9), opt_cfg.get("beta2", 0.95)),
                            eps=opt_cfg.get("eps", 1e-8), **({"fused": True} if fused else {}))
    fwd = torch.compile(model) if args.compile else model
    step = make_step(fwd, opt, args.dtype, device, opt_cfg.get("grad_clip", 1.0))
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    batches = [torch.randint(0, shape["vocab"], (B, T + 1), generator=gen).to(device)
               for _ in range(min(args.warmup + args.steps, 8))]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, losses = [], []
    for i in range(args.warmup + args.steps):
        batch = batches[i % len(batches)]
        tokens, targets = batch[:, :-1], batch[:, 1:]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        loss = step(tokens, targets)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dt = time.perf_counter() - t0
        losses.append(float(loss.item()))
        if i >= args.warmup:
            times.append(dt)
    step_s = statistics.median(times)
    flops_per_token = 6.0 * n_params + 6.0 * shape["layers"] * shape["d"] * T
    tflops = flops_per_token * B * T / step_s / 1e12
    out = {"parameters": n_params, "batch_size": B, "seq_len": T, "tokens_per_step": B * T,
           "median_step_ms": 1e3 * step_s, "min_step_ms": 1e3 * min(times), "tokens_per_s": B * T / step_s,
           "flops_per_token": flops_per_token, "tflops": tflops, "first_loss": losses[0], "final_loss": losses[-1],
           "fused_adamw": fused, "compiled": bool(args.compile), "float8": float8}
    if device.type == "cuda":
        out["peak_memory_bytes"] = torch.cuda.max_memory_allocated(device)
        out["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=os.path.join(REPO, "configs", "gpt2-124m.toml"))
    ap.add_argument("--vocab", type=int, default=0, help="vocabulary when the config leaves it to the data source")
    ap.add_argument("--batch", default="auto", help="micro-batch rows, or auto (largest that fits)")
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=0, help="default: [batching] seq_len")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation happens in them)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--compile", dest="compile", action="store_true", default=None)
    ap.add_argument("--no-compile", dest="compile", action="store_false")
    ap.add_argument("--float8", action="store_true", help="the blocks' linear layers in torchao's float8 (tensorwise)")
    ap.add_argument("--params-only", action="store_true", help="print the model's parameter count and exit")
    ap.add_argument("--peak-tflops", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    device = torch.device(args.device)
    if args.compile is None:
        args.compile = device.type == "cuda"
    with open(args.config, "rb") as f:
        cfg = tomllib.load(f)
    shape = model_shape(cfg, args)
    if args.params_only:
        print(sum(p.numel() for p in build_model(shape).parameters()))
        return
    T = args.seq_len or cfg.get("batching", {}).get("seq_len", 1024)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    if args.float8 and device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        print(f"pytorch_gpt: --float8: {name} has no FP8 products (compute capability 8.9 or later): skipped")
        sys.exit(77)
    print(f"pytorch_gpt: {os.path.relpath(args.config, REPO)} ({shape['family']}) on {name}, torch {torch.__version__}, "
          f"{args.dtype}{' + float8' if args.float8 else ''}, "
          f"compile {args.compile}, T {T}")

    if args.batch == "auto":
        candidates, b = [], args.max_batch
        while b >= 1:
            candidates.append(b)
            b //= 2
    else:
        candidates = [int(args.batch)]
    result, tried = None, []
    for B in candidates:
        try:
            result = run(args, cfg, shape, B, T, device)
            tried.append({"batch_size": B, "fits": True})
            break
        except Float8Unavailable as e:
            print(f"pytorch_gpt: --float8: {e}: skipped")
            sys.exit(77)
        except OUT_OF_MEMORY:
            tried.append({"batch_size": B, "fits": False})
            print(f"  batch {B}: out of memory")
            torch._dynamo.reset()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if result is None:
        raise SystemExit("no micro-batch fits")
    peak = peak_tflops(name, args.dtype, args.peak_tflops)
    result["mfu"] = result["tflops"] / peak if peak else None
    print(f"{'batch':>6} {'T':>6} {'step ms':>9} {'tokens/s':>11} {'TFLOP/s':>8} {'MFU':>7} {'peak mem':>10} {'loss':>13}")
    mem = result.get("peak_memory_bytes")
    mfu_text = "" if result["mfu"] is None else "%.1f%%" % (100 * result["mfu"])
    mem_text = "" if mem is None else "%.1f GiB" % (mem / 2**30)
    print(f"{result['batch_size']:6d} {T:6d} {result['median_step_ms']:9.2f} {result['tokens_per_s']:11.0f} "
          f"{result['tflops']:8.1f} {mfu_text:>7} {mem_text:>10} {result['first_loss']:6.3f}->{result['final_loss']:6.3f}")
    if args.json:
        write_result(args.json, {
            "benchmark": "pytorch_gpt", "device": name, "torch_version": torch.__version__, "dtype": args.dtype,
            "config": os.path.relpath(os.path.abspath(args.config), REPO), "model": shape, "peak_tflops": peak,
            "float8": bool(args.float8), "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "git_commit": git_commit(), "steps": args.steps, "warmup": args.warmup, "batches_tried": tried,
            "result": result})


if __name__ == "__main__":
    main()
