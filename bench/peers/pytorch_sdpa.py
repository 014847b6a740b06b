#!/usr/bin/env python3
"""The PyTorch peer of bench_attention: torch.nn.functional.scaled_dot_product_attention, causal,
bf16, at the same (B, H, T, D) shapes, forward and forward + backward, timed with CUDA events (the
median of --iters after two untimed calls). FLOPs as bench_attention counts them: the causal ones,
forward 2 * B * H * T^2 * D, backward 2.5x forward. PyTorch has no packed (varlen) SDPA in its
public API: its padded-probes row is the 31 padded documents run as full causal rows, which is what
a PyTorch user without packing computes.

Usage (GPU machine): python3 bench/peers/pytorch_sdpa.py --json OUT.json
On a CPU (checks the script): python3 bench/peers/pytorch_sdpa.py --device cpu --shapes small --iters 1
"""
import argparse
import json
import sys

from torch_timing import median_ms, torch_or_skip

SHAPES = {
    "all": [(16, 12, 1024, 64), (8, 16, 2048, 128), (4, 32, 4096, 128), (31, 12, 1024, 64)],
    "small": [(2, 4, 256, 64)],
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--shapes", choices=sorted(SHAPES), default="all")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    torch = torch_or_skip("pytorch_sdpa", args.device)
    if torch is None:
        return 77
    import torch.nn.functional as F
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32

    def timed(fn):
        return median_ms(torch, fn, args.iters, args.device == "cuda")

    rows = []
    print(f"{'shape':<22} {'fwd ms':>10} {'fwd TF/s':>10} {'f+b ms':>10} {'f+b TF/s':>10}")
    for B, H, T, D in SHAPES[args.shapes]:
        label = f"B{B} H{H} T{T} D{D}"
        row = {"shape": label, "B": B, "H": H, "T": T, "D": D, "backend": "torch_sdpa", "dtype": str(dtype).split(".")[-1]}
        try:
            q, k, v = (torch.randn(B, H, T, D, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
            grad = torch.randn(B, H, T, D, device=dev, dtype=dtype)

            def forward():
                with torch.no_grad():
                    F.scaled_dot_product_attention(q, k, v, is_causal=True)

            def both():
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                out.backward(grad)

            flops = 2.0 * B * H * T * T * D
            row["fwd_ms"] = timed(forward)
            row["fwd_bwd_ms"] = timed(both)
            row["fwd_tflops"] = flops / (row["fwd_ms"] * 1e-3) / 1e12
            row["fwd_bwd_tflops"] = 3.5 * flops / (row["fwd_bwd_ms"] * 1e-3) / 1e12
            row["status"] = "ok"
            print(f"{label:<22} {row['fwd_ms']:>10.3f} {row['fwd_tflops']:>10.1f} {row['fwd_bwd_ms']:>10.3f} {row['fwd_bwd_tflops']:>10.1f}")
        except RuntimeError as e:  # out of memory, an unsupported shape
            row["status"] = f"failed: {e}"
            print(f"{label:<22} failed: {e}")
        rows.append(row)
        if args.device == "cuda":
            torch.cuda.empty_cache()
    out = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "torch": torch.__version__, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
