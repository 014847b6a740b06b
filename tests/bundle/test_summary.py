#!/usr/bin/env python3
"""The GPU bundle's summary.py on results of the kind a GPU run writes (made up here, shaped as the
benchmarks write them): every test and benchmark gets its line, the benchmarks' table figures come
through (a failed row is left out), a failure is counted, and summary.txt / summary.json are
written. Usage: test_summary.py SOURCE_DIR"""
import json
import os
import subprocess
import sys
import tempfile

source = sys.argv[1]
with tempfile.TemporaryDirectory() as out:
    os.makedirs(os.path.join(out, "logs"))
    rows = [("test_naive_cuda", "plain", "passed", 0, 3.2), ("test_cudnn_flash", "memcheck", "failed", 3, 80.0),
            ("bench_attention", "benchmark", "passed", 0, 40), ("pytorch_sdpa", "peer", "passed", 0, 20),
            ("bench_nccl", "benchmark", "passed", 0, 10), ("ablate_gpt2_flash", "benchmark", "passed", 0, 50),
            ("ablate_gpt2_flash_dense", "benchmark", "passed", 0, 50),
            ("ablate_gpt2_flash_bf16res_dense", "benchmark", "passed", 0, 50),
            ("pytorch_gpt", "peer", "passed", 0, 40), ("ablate_gpt2_nccl_2ranks", "needs-2-gpus", "skipped", 0, 0),
            ("pytorch_gemm", "peer", "passed", 0, 20), ("ablate_gpt2_flash_fp8_dense", "benchmark", "passed", 0, 50),
            ("pytorch_gpt_fp8", "peer", "passed", 0, 60), ("ablate_llama_dense", "benchmark", "passed", 0, 80),
            ("ablate_llama_fp8_dense", "benchmark", "passed", 0, 80), ("pytorch_llama", "peer", "passed", 0, 90),
            ("pytorch_llama_fp8", "peer", "skipped", 77, 5), ("numerics_fp8", "benchmark", "passed", 0, 45),
            ("ablate_gpt2_flash_fp8head_dense", "benchmark", "passed", 0, 50),
            ("ablate_quickstart", "benchmark", "passed", 0, 20),
            ("ablate_quickstart_dense", "benchmark", "passed", 0, 20),
            ("ablate_quickstart_dense_graph", "benchmark", "passed", 0, 20),
            ("ablate_gpt2_flash_dense_graph", "benchmark", "passed", 0, 50)]
    with open(os.path.join(out, "logs", "results.tsv"), "w") as f:
        for r in rows:
            f.write("\t".join(str(x) for x in r) + "\n")
    files = {
        "bench_attention.json": {"device": "NVIDIA H100 80GB HBM3", "flash_over_naive_t2048": 7.5, "rows": [
            {"shape": "B8 H16 T2048 D128", "backend": "cudnn_flash", "dtype": "bf16", "fwd_bwd_tflops": 350.2, "status": "ok"},
            {"shape": "B8 H16 T2048 D128", "backend": "naive_cuda", "dtype": "f32", "status": "failed: out of memory"}]},
        "pytorch_sdpa.json": {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0", "rows": [
            {"shape": "B8 H16 T2048 D128", "backend": "torch_sdpa", "dtype": "bfloat16", "fwd_bwd_tflops": 400.0, "status": "ok"}]},
        "bench_nccl.json": {"device": "NVIDIA H100 80GB HBM3", "world": 1, "elements": 124475904,
                            "rows": [{"op": "all_reduce", "dtype": "bf16", "algbw_gbs": 812.5}]},
        "ablate_gpt2_flash.json": {"status": "completed", "steps": 16, "tokens_per_s": 301234.0, "mfu": 0.251},
        "ablate_gpt2_flash_dense.json": {"status": "completed", "steps": 16, "tokens_per_s": 250000.0, "mfu": 0.3},
        "ablate_gpt2_flash_bf16res_dense.json": {"status": "completed", "steps": 16, "tokens_per_s": 262500.0},
        # The peer's JSON as bench/peers/pytorch_gpt.py writes it: the measurement under "result".
        "pytorch_gpt.json": {"benchmark": "pytorch_gpt", "device": "NVIDIA H100 80GB HBM3", "model": {"family": "gpt2"},
                             "float8": False, "result": {"batch_size": 64, "tokens_per_s": 400000.0, "median_step_ms": 163.8,
                                                         "mfu": 0.41, "peak_memory_bytes": 40 * 2**30, "float8": None}},
        "pytorch_gpt_fp8.json": {"benchmark": "pytorch_gpt", "device": "NVIDIA H100 80GB HBM3", "model": {"family": "gpt2"},
                                 "float8": True, "result": {"batch_size": 64, "tokens_per_s": 500000.0,
                                                            "float8": "torchao 0.18.0 float8 tensorwise, 72 linear layers"}},
        "ablate_gpt2_flash_fp8_dense.json": {"status": "completed", "steps": 16, "tokens_per_s": 380000.0},
        "ablate_gpt2_flash_fp8head_dense.json": {"status": "completed", "steps": 16, "tokens_per_s": 399000.0},
        "ablate_llama_dense.json": {"status": "completed", "steps": 16, "tokens_per_s": 40000.0},
        "ablate_quickstart.json": {"status": "completed", "steps": 16, "tokens_per_s": 90000.0, "host_pct": 97.5},
        "ablate_quickstart_dense.json": {"status": "completed", "steps": 40, "tokens_per_s": 100000.0, "host_pct": 98.0},
        "ablate_quickstart_dense_graph.json": {"status": "completed", "steps": 40, "tokens_per_s": 190000.0,
                                               "host_pct": 40.0, "captured_steps": 1, "replayed_steps": 38},
        "ablate_gpt2_flash_dense_graph.json": {"status": "completed", "steps": 16, "tokens_per_s": 252500.0,
                                               "captured_steps": 1, "replayed_steps": 14},
        "ablate_llama_fp8_dense.json": {"status": "completed", "steps": 16, "tokens_per_s": 52000.0},
        "numerics_fp8.json": {"verdict": "pass", "steps": 300, "last": 100, "mean_loss_gap": 0.0123, "val_rel_gap": 0.004,
                              "reference": "numerics_bf16", "curves": [[1, 2, 3]]},
        "pytorch_llama.json": {"benchmark": "pytorch_gpt", "device": "NVIDIA H100 80GB HBM3", "model": {"family": "llama"},
                               "float8": False, "result": {"batch_size": 8, "tokens_per_s": 50000.0}},
        "pytorch_gemm.json": {"device": "NVIDIA H200", "torch": "2.11.0+cu130", "rows": 65536, "products": [
            {"product": "fc", "M": 65536, "K": 768, "N": 3072, "mode": "bf16->bf16", "ms": 0.451, "tflops": 686.04},
            {"product": "fc", "M": 65536, "K": 768, "N": 3072, "mode": "bf16->f32", "ms": 0.535, "tflops": 578.12},
            {"product": "qkv", "M": 65536, "K": 768, "N": 2304, "mode": "bf16->f32", "ms": None, "error": "no out_dtype"}]},
    }
    for name, data in files.items():
        with open(os.path.join(out, name), "w") as f:
            json.dump(data, f)
    r = subprocess.run([sys.executable, os.path.join(source, "scripts", "bundle", "summary.py"), out],
                       capture_output=True, text=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    text = r.stdout
    checks = {
        "exit 0": r.returncode == 0,
        "a line per run": all(name in text for name, *_ in rows),
        "attention figure": "B8 H16 T2048 D128/cudnn_flash/bf16 f+b TF/s=350.2" in text,
        "failed row left out": "naive_cuda/f32" not in text,
        "headline ratio": "flash_over_naive_t2048=7.5" in text,
        "peer figure": "torch_sdpa/bfloat16 f+b TF/s=400" in text,
        "nccl figure": "all_reduce/bf16 algbw GB/s=812.5" in text,
        "gpt2 headline": "tokens_per_s=3.012e+05" in text and "mfu=0.251" in text,
        "counts": "23 runs: 20 passed, 1 failed, 2 skipped" in text,
        # A replayed captured step beside the same run issued call by call.
        "graph ratio": "host_pct=40, captured_steps=1, replayed_steps=38, vs_calls=1.9" in text,
        "gpt2 graph ratios": "rows=dense, vs_pytorch=0.631, captured_steps=1, replayed_steps=14, vs_calls=1.01" in text,
        # The small model's launch-bound check: the host's share of its steps, and no peer ratio.
        "launch-bound headline": "tokens_per_s=9e+04, host_pct=97.5" in text and "host_pct=97.5, vs_" not in text,
        "fp8 numerics headline": "verdict=pass, steps=300, last=100, mean_loss_gap=0.0123, val_rel_gap=0.004" in text,
        "peer headline read under result": "family=gpt2, batch_size=64, tokens_per_s=4e+05, step_ms=163.8, mfu=0.41" in text
                                            and "peak_memory_gib=40" in text,
        # FP8: beside the bf16 peer, the float8 peer and ablate's own bf16 run on the same rows.
        "fp8 ratios": "rows=dense, vs_pytorch=0.95, vs_pytorch_float8=0.76, vs_own_bf16=1.52" in text,
        # The classifier in FP8 too: beside the same, and beside the run with the classifier in bf16.
        "fp8 head ratios": "vs_pytorch=0.998, vs_pytorch_float8=0.798, vs_own_bf16=1.596, vs_own_fp8=1.05" in text,
        # The Llama runs pair with the Llama peer; its float8 run was skipped, so no float8 ratio.
        # The residual stream in bf16: beside the peer and beside the same run with an f32 stream.
        "bf16 residual ratios": "tokens_per_s=2.625e+05, rows=dense, vs_pytorch=0.656, vs_own_bf16=1.05" in text,
        "llama ratio": "tokens_per_s=4e+04, rows=dense, vs_pytorch=0.8" in text,
        "llama fp8 ratios": "tokens_per_s=5.2e+04, rows=dense, vs_pytorch=1.04, vs_own_bf16=1.3" in text,
        # The ratio to the peer: like with like on dense rows; packed probe rows marked unlike.
        "dense ratio": "rows=dense, vs_pytorch=0.625" in text,
        "packed ratio marked unlike": "rows=packed-probes, vs_pytorch_unlike=0.753" in text,
        "product ceiling": "fc bf16->f32 TFLOP/s=578.1" in text and "686" not in text and "qkv bf16" not in text,
        "skip named with its reason": "ablate_gpt2_nccl_2ranks" in text and "(needs 2 gpus)" in text,
        "files": os.path.exists(os.path.join(out, "summary.txt")) and
                 json.load(open(os.path.join(out, "summary.json")))["failed"] == 1,
    }
    bad = [k for k, ok in checks.items() if not ok]
    if bad:
        print("summary.py output:\n" + text + r.stderr)
        print("failed checks:", ", ".join(bad))
        sys.exit(1)
    print("summary.py: all", len(checks), "checks hold")
