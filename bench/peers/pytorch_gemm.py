#!/usr/bin/env python3
"""The matrix-product ceiling under ablate's GPT-2 step: PyTorch's products (cuBLAS) at GPT-2 124M's
five forward shapes, rows = micro-batch x T, in bf16 with a bf16 output, in bf16 with a float32
output (what cuda_layers' products write), and in tf32. FLOPs 2 * M * K * N; CUDA events, the median
of --iters after two untimed calls; fresh normal inputs (never zeros). Beside ablate's op profile,
it says how much of a step's time the products' ceiling explains.

Usage (GPU machine): python3 bench/peers/pytorch_gemm.py --rows 65536 --json OUT.json
On a CPU (checks the script): python3 bench/peers/pytorch_gemm.py --device cpu --rows 64 --iters 1
"""
import argparse
import json
import sys

from torch_timing import median_ms, torch_or_skip

# GPT-2 124M: d_model 768, 4 x 768 MLP, vocabulary 50257 padded to 50304 as ablate's configs pad it
# (vocab_multiple = 128); the unpadded classifier too, to show what the padding is worth (name, K, N).
SHAPES = [("qkv", 768, 2304), ("attn proj", 768, 768), ("fc", 768, 3072), ("mlp proj", 3072, 768),
          ("classifier", 768, 50304), ("classifier unpadded", 768, 50257)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=65536)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json")
    args = ap.parse_args()
    torch = torch_or_skip("pytorch_gemm", args.device)
    if torch is None:
        return 77
    dev = torch.device(args.device)
    cuda = args.device == "cuda"

    def timed(fn):
        return median_ms(torch, fn, args.iters, cuda)

    # A float32 output from bf16 operands: torch.mm's out_dtype where this PyTorch has it.
    def mm_f32_out(a, b):
        return torch.mm(a, b, out_dtype=torch.float32)

    modes = [("bf16->bf16", torch.bfloat16, torch.mm), ("bf16->f32", torch.bfloat16, mm_f32_out),
             ("tf32", torch.float32, torch.mm)]
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    rows = []
    gen = torch.Generator(device=dev).manual_seed(7)
    print(f"pytorch_gemm: {torch.cuda.get_device_name() if cuda else 'cpu'}, torch {torch.__version__}, rows {args.rows}")
    print(f"{'product':<20} {'M':>7} {'K':>6} {'N':>6}  {'mode':<11} {'ms':>8} {'TFLOP/s':>8}")
    for name, k, n in SHAPES:
        for mode, dtype, fn in modes:
            a = torch.randn(args.rows, k, device=dev, generator=gen).to(dtype)
            b = torch.randn(k, n, device=dev, generator=gen).to(dtype)
            try:
                ms = timed(lambda: fn(a, b))
            except (TypeError, RuntimeError) as e:
                print(f"{name:<20} {args.rows:>7} {k:>6} {n:>6}  {mode:<11} not run: {str(e).splitlines()[0][:60]}")
                rows.append({"product": name, "M": args.rows, "K": k, "N": n, "mode": mode, "ms": None, "error": str(e)[:200]})
                continue
            tflops = 2.0 * args.rows * k * n / (ms * 1e-3) / 1e12
            print(f"{name:<20} {args.rows:>7} {k:>6} {n:>6}  {mode:<11} {ms:>8.3f} {tflops:>8.1f}")
            rows.append({"product": name, "M": args.rows, "K": k, "N": n, "mode": mode, "ms": ms, "tflops": tflops})
            del a, b
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
                       "rows": args.rows, "iters": args.iters, "products": rows}, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
