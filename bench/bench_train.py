#!/usr/bin/env python3
"""CPU training throughput: ablate against PyTorch eager on the same model, batch shape and threads.

For each model below, ablate trains `--steps` steps of configs/quickstart.toml (with `--set`
overrides for the model shape) and its median tokens/s is read from the run's summary.json (the
trainer leaves the first step out of the median). Then the same architecture, written here in plain
eager PyTorch (float32), trains the same number of steps on random token batches of the same shape
after `--warmup` untimed steps; its median step time gives tokens/s. Both count every one of the
B*T positions of a step.

The model family (ablate's GPT-2 style defaults): token embedding + learned positions, pre-LayerNorm
blocks with biases, separate q/k/v/o projections, causal attention, GELU (tanh) MLP of 4*d, final
LayerNorm, LM head tied to the token embedding, cross-entropy; AdamW (betas 0.9/0.95, weight decay
0.1 on matrices and embeddings), gradient norm clipped at 1.0 on both sides.

Differences that favour PyTorch: it sees dense rows (one causal mask per row via
scaled_dot_product_attention(is_causal=True)), while ablate trains on the quickstart's packed rows
with block-diagonal causal attention over several documents per row; and PyTorch's batches are made
before timing, while ablate's step includes taking a batch from its prefetcher (whose worker thread
shares the same cores).

Each side is measured `--rounds` times per model (default 2), alternating which goes first, and the
faster round of each is kept: on a shared machine, the least disturbed measurement. MFU for both
sides is against one reference: the best fp32 256x512x512 matrix-product rate seen in the run.

With `--baseline PATH` (another build's `ablate`, e.g. of the commit before a refactor) the peer is
that build instead of PyTorch: both builds train the same runs in alternating order and the result
is the ratio of their tokens/s (bench/results/bench_train_builds.json by default).

Usage: python3 bench/bench_train.py [--steps 20] [--rounds 2] [--threads N] [--note TEXT]
                                    [--out bench/results/bench_train.json] [--baseline OTHER_ABLATE]
       bench/run_bench_train.sh [same arguments]   (also keeps the console in bench/results/bench_train.log)
"""
import argparse
import datetime
import inspect
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import tomllib
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
from benchlib import REPO, cpu_model, git_commit, loadavg, read_run, run_checked, write_result

# name -> (description, --set overrides on top of configs/quickstart.toml)
MODELS = {
    "quickstart": ("configs/quickstart.toml as is: d=128 L=4 H=4 T=256 B=8", []),
    "gpt2-like-d256": ("d=256 L=4 H=4 T=256 B=8", ["model.d_model=256"]),
}


# ----------------------------------------------------------------------------------------------- ablate

def run_ablate(args, overrides, threads):
    with tempfile.TemporaryDirectory(prefix="bench_train_") as tmp:
        run_dir = os.path.join(tmp, "run")
        cmd = [args.ablate, "train", args.config, "--run-dir", run_dir,
               "--set", f"run.steps={args.steps}",
               "--set", "run.eval_batches=0",
               "--set", "run.eval_every=0",
               "--set", "checkpoint.every=0",
               "--set", f"run.threads={threads}"]
        for o in overrides:
            cmd += ["--set", o]
        t0 = time.perf_counter()
        p = run_checked(cmd)
        wall = time.perf_counter() - t0
        summary, run, step_ms = read_run(run_dir)
        with open(os.path.join(run_dir, "config.toml"), "rb") as f:
            resolved = tomllib.load(f)
    log = p.stdout + p.stderr
    m = re.search(r"model: (\d+) parameters", log)
    logged_params = int(m.group(1)) if m else None
    mv = re.search(r"vocab=(\d+)\((\d+)\)", run.get("model", ""))
    return {
        "command": " ".join([os.path.relpath(cmd[0], REPO)] + cmd[1:]),
        "model": run.get("model", ""),
        "parameters": int(summary["parameters"]),
        "parameters_logged": logged_params,
        "vocab_size": int(mv.group(1)),
        "vocab_padded": int(mv.group(2)),
        "d_model": int(resolved["model"]["d_model"]),
        "n_layers": int(resolved["model"]["n_layers"]),
        "n_heads": int(resolved["model"]["n_heads"]),
        "max_seq_len": int(resolved["model"]["max_seq_len"]),
        "batch_size": int(resolved["batching"]["batch_size"]),
        "seq_len": int(resolved["batching"]["seq_len"]),
        "tokens_per_s": summary["tokens_per_s"],
        "real_tokens_per_s": summary["real_tokens_per_s"],
        "median_step_ms": statistics.median(step_ms) if step_ms else None,
        "tflops": summary["tflops"],
        "mfu_vs_own_peak": summary["mfu"],
        "measured_peak_tflops": summary["peak_tflops"],
        "data_wait_pct": summary["data_wait_pct"],
        "first_loss": summary["first_loss"],
        "final_loss": summary["final_loss"],
        "wall_s": wall,
    }


# ---------------------------------------------------------------------------------------------- PyTorch

def run_torch(shape, steps, warmup, threads, seed):
    """Trains the model ablate resolved (`shape`: run_ablate's answer) in eager PyTorch."""
    import torch
    from torch_gpt import GPT
    if shape["vocab_padded"] != shape["vocab_size"]:
        raise SystemExit("a padded vocabulary (model.vocab_multiple > 1) is not mirrored on the PyTorch side")
    vocab, d, n_layers, n_heads = shape["vocab_size"], shape["d_model"], shape["n_layers"], shape["n_heads"]
    max_seq_len, B, T = shape["max_seq_len"], shape["batch_size"], shape["seq_len"]
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    model = GPT(vocab, d, n_layers, n_heads, max_seq_len)
    params = sum(p.numel() for p in model.parameters())
    # The single-tensor loop, as ablate's adamw (torch before 2.0 has no `fused` argument and no other loop).
    unfused = {"fused": False} if "fused" in inspect.signature(torch.optim.AdamW).parameters else {}
    opt = torch.optim.AdamW(model.param_groups(0.1), lr=3e-3, betas=(0.9, 0.95), eps=1e-8, **unfused)
    gen = torch.Generator().manual_seed(seed)
    batches = [torch.randint(0, vocab, (B, T + 1), generator=gen) for _ in range(warmup + steps)]
    times, losses = [], []
    for i, batch in enumerate(batches):
        tokens, targets = batch[:, :-1].contiguous(), batch[:, 1:].contiguous()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        losses.append(loss.item())
        if i >= warmup:
            times.append(dt)
    step_s = statistics.median(times)
    return {
        "parameters": params,
        "tokens_per_s": B * T / step_s,
        "median_step_ms": 1e3 * step_s,
        "first_loss": losses[0],
        "final_loss": losses[-1],
    }


def torch_matmul_tflops(threads, n=512, rows=256, repeats=10):
    """Best-of-ten rate of the same 256 x 512 x 512 product ablate measures for its peak."""
    import torch
    torch.set_num_threads(threads)
    x, w = torch.randn(rows, n), torch.randn(n, n)
    for _ in range(3):
        x @ w
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(20):
            x @ w
        best = min(best, (time.perf_counter() - t0) / 20)
    return 2.0 * rows * n * n / best / 1e12


# ------------------------------------------------------------------------------------- build vs build

def cpu_seconds(ablate, overrides, steps):
    """User + system CPU seconds of one single-threaded training process of `steps` steps. On a
    shared machine wall time varies with what else runs; the process's own CPU time much less."""
    import resource
    with tempfile.TemporaryDirectory(prefix="bench_train_cpu_") as tmp:
        cmd = [ablate, "train", "configs/quickstart.toml", "--run-dir", os.path.join(tmp, "run"),
               "--set", f"run.steps={steps}", "--set", "run.threads=1", "--set", "run.eval_batches=0",
               "--set", "checkpoint.every=0", "--set", "metrics.peak_tflops=1", "--set", 'logging.sinks=["jsonl"]']
        for o in overrides:
            cmd += ["--set", o]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        run_checked(cmd)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def cpu_seconds_per_step(ablate, overrides, short=3, long=13, repeats=3):
    """The CPU time of (long - short) steps, start-up cancelled, median of `repeats` pairs."""
    per_step = [(cpu_seconds(ablate, overrides, long) - cpu_seconds(ablate, overrides, short)) / (long - short)
                for _ in range(repeats)]
    return statistics.median(per_step), per_step


def compare_builds(args):
    """This build against `args.baseline` on the same runs, alternating which goes first each round;
    the best round of each is kept and the result is their ratio."""
    import copy
    baseline = copy.copy(args)
    baseline.ablate = args.baseline
    if not os.path.exists(baseline.ablate):
        raise SystemExit(f"{baseline.ablate} not found")
    machine = {"nproc": os.cpu_count(), "cpu_model": cpu_model(), "threads": args.threads, "git_commit": git_commit(),
               "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    print(f"bench_train (build vs build): {machine['cpu_model']}, nproc {machine['nproc']}, threads {args.threads}, "
          f"commit {machine['git_commit']}, {machine['date_utc']}")
    print(f"this build: {args.ablate}\nbaseline  : {baseline.ablate}")
    if args.note:
        print(f"note: {args.note}")
    results = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        desc, overrides = MODELS[name]
        print(f"\n[{name}] {desc}")
        runs = {"this": [], "baseline": []}
        loads = []
        for rnd in range(args.rounds):
            loads.append(loadavg())
            for side in (("this", "baseline") if rnd % 2 == 0 else ("baseline", "this")):
                a = run_ablate(args if side == "this" else baseline, overrides, args.threads)
                runs[side].append(a)
                print(f"  round {rnd + 1} {side:<8}: {a['tokens_per_s']:.0f} tok/s, {a['median_step_ms']:.1f} ms/step, "
                      f"loss {a['first_loss']:.3f} -> {a['final_loss']:.3f}")
        best = {k: max(v, key=lambda r: r["tokens_per_s"]) for k, v in runs.items()}
        cpu = {}
        for side, build in (("this", args.ablate), ("baseline", baseline.ablate)):
            cpu[side] = cpu_seconds_per_step(build, overrides)
            print(f"  cpu time per step, 1 thread, {side:<8}: {1e3 * cpu[side][0]:.1f} ms "
                  f"(pairs: {', '.join(f'{1e3 * x:.1f}' for x in cpu[side][1])})")
        results.append({
            "model": name, "description": desc, "overrides": overrides, "load_averages": loads,
            "this_rounds_tokens_per_s": [r["tokens_per_s"] for r in runs["this"]],
            "baseline_rounds_tokens_per_s": [r["tokens_per_s"] for r in runs["baseline"]],
            "this": best["this"], "baseline": best["baseline"],
            "ratio_this_over_baseline": best["this"]["tokens_per_s"] / best["baseline"]["tokens_per_s"],
            "median_ratio_this_over_baseline": statistics.median(r["tokens_per_s"] for r in runs["this"]) /
                                               statistics.median(r["tokens_per_s"] for r in runs["baseline"]),
            "cpu_ms_per_step_1_thread": {k: 1e3 * v[0] for k, v in cpu.items()},
            "cpu_ms_per_step_1_thread_pairs": {k: [1e3 * x for x in v[1]] for k, v in cpu.items()},
            "cpu_time_ratio_this_over_baseline": cpu["this"][0] / cpu["baseline"][0],
        })
    print("\nmodel            this tok/s   baseline tok/s   this/baseline (best)   (median of rounds)   "
          "cpu ms/step this   baseline   this/baseline")
    for r in results:
        c = r["cpu_ms_per_step_1_thread"]
        print(f"{r['model']:<16} {r['this']['tokens_per_s']:>10.0f}   {r['baseline']['tokens_per_s']:>14.0f}   "
              f"{r['ratio_this_over_baseline']:>20.3f}   {r['median_ratio_this_over_baseline']:>18.3f}   "
              f"{c['this']:>16.1f}   {c['baseline']:>8.1f}   {r['cpu_time_ratio_this_over_baseline']:>13.3f}")
    out = args.out if args.out_given else os.path.join(REPO, "bench", "results", "bench_train_builds.json")
    write_result(out, {"benchmark": "bench_train (build vs build)",
                       "what": "training tokens/s of two builds of ablate on the same CPU runs, best of the rounds",
                       "machine": machine, "note": args.note, "steps": args.steps, "rounds": args.rounds,
                       "this_build": args.ablate, "baseline_build": baseline.ablate, "results": results})


# ------------------------------------------------------------------------------------------------ main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ablate", default=os.path.join(REPO, "build", "bin", "ablate"))
    ap.add_argument("--config", default="configs/quickstart.toml")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per side (ablate: first step left out)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed PyTorch steps before the timed ones")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for both (default: nproc)")
    ap.add_argument("--rounds", type=int, default=2,
                    help="measurements per side and model, alternating which side goes first; the best of each is kept")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of " + ",".join(MODELS))
    ap.add_argument("--note", default="", help="a line about the conditions (load, other work), kept in the results")
    ap.add_argument("--out", default=None, help="the result JSON (default bench/results/bench_train.json, or "
                    "bench_train_builds.json with --baseline)")
    ap.add_argument("--baseline", default=None, help="another build's ablate: compare builds instead of PyTorch")
    args = ap.parse_args()
    args.out_given = args.out is not None
    if args.out is None:
        args.out = os.path.join(REPO, "bench", "results", "bench_train.json")
    if not os.path.exists(args.ablate):
        raise SystemExit(f"{args.ablate} not found: build the project first")
    if args.baseline:
        compare_builds(args)
        return
    import torch

    machine = {
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model(),
        "torch_version": torch.__version__,
        "torch_threads": args.threads,
        "python": platform.python_version(),
        "git_commit": git_commit(),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    print(f"bench_train: {machine['cpu_model']}, nproc {machine['nproc']}, threads {args.threads}, "
          f"torch {machine['torch_version']}, commit {machine['git_commit']}, {machine['date_utc']}")
    if args.note:
        print(f"note: {args.note}")
    print(f"steps {args.steps} per side (ablate: median of steps 2..{args.steps}; PyTorch: median of {args.steps} "
          f"after {args.warmup} warm-up); load average at start {loadavg()}")
    torch_peak = torch_matmul_tflops(args.threads)

    results, all_ablate_runs = [], []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        desc, overrides = MODELS[name]
        print(f"\n[{name}] {desc}")
        runs_a, runs_t, loads = [], [], []
        for rnd in range(args.rounds):
            loads.append(loadavg())
            if args.rounds > 1:
                print(f"  round {rnd + 1}/{args.rounds}, load average {loads[-1]}")
            # Alternate which side goes first, so a change in the machine's load hits both alike.
            for side in (("ablate", "torch") if rnd % 2 == 0 else ("torch", "ablate")):
                if side == "ablate":
                    a = run_ablate(args, overrides, args.threads)
                    runs_a.append(a)
                    all_ablate_runs.append(a)
                    print(f"  ablate : {a['parameters']:,} parameters, {a['tokens_per_s']:.0f} tok/s "
                          f"({a['real_tokens_per_s']:.0f} real), {a['median_step_ms']:.1f} ms/step, "
                          f"loss {a['first_loss']:.3f} -> {a['final_loss']:.3f}, data wait {a['data_wait_pct']:.2f}%, "
                          f"{a['wall_s']:.1f}s wall")
                else:
                    shape = runs_a[0]  # round 0 runs ablate first
                    t = run_torch(shape, args.steps, args.warmup, args.threads, seed=1337)
                    runs_t.append(t)
                    print(f"  torch  : {t['parameters']:,} parameters, {t['tokens_per_s']:.0f} tok/s, "
                          f"{t['median_step_ms']:.1f} ms/step, loss {t['first_loss']:.3f} -> {t['final_loss']:.3f}")
        loads.append(loadavg())
        a = max(runs_a, key=lambda r: r["tokens_per_s"])
        t = max(runs_t, key=lambda r: r["tokens_per_s"])
        print(f"  model  : {a['model']}")
        if t["parameters"] != a["parameters"]:
            raise SystemExit(f"parameter counts differ: ablate {a['parameters']} vs torch {t['parameters']}")
        if a["parameters_logged"] is not None and a["parameters_logged"] != a["parameters"]:
            raise SystemExit(f"ablate's log says {a['parameters_logged']} parameters, run.json {a['parameters']}")
        d, L, H, B, T = a["d_model"], a["n_layers"], a["n_heads"], a["batch_size"], a["seq_len"]
        fpt = 6.0 * a["parameters"] + 6.0 * L * d * T
        results.append({
            "model": name, "description": desc, "overrides": overrides,
            "d_model": d, "n_layers": L, "n_heads": H, "vocab_size": a["vocab_size"], "batch_size": B, "seq_len": T,
            "parameters": a["parameters"], "flops_per_token": fpt, "threads": args.threads,
            "load_averages": loads,
            "ablate": a, "torch": t,
            "ablate_rounds_tokens_per_s": [r["tokens_per_s"] for r in runs_a],
            "torch_rounds_tokens_per_s": [r["tokens_per_s"] for r in runs_t],
            "ratio_ablate_over_torch": a["tokens_per_s"] / t["tokens_per_s"],
            "ablate_tflops": fpt * a["tokens_per_s"] / 1e12,
            "torch_tflops": fpt * t["tokens_per_s"] / 1e12,
        })

    print("\nmodel            params     ablate tok/s   torch tok/s   ablate/torch   threads   ablate GFLOP/s   torch GFLOP/s")
    for r in results:
        print(f"{r['model']:<16} {r['parameters']:>9,}   {r['ablate']['tokens_per_s']:>12.0f}   "
              f"{r['torch']['tokens_per_s']:>11.0f}   {r['ratio_ablate_over_torch']:>12.2f}   {r['threads']:>7}   "
              f"{1e3 * r['ablate_tflops']:>14.1f}   {1e3 * r['torch_tflops']:>13.1f}")
    # One reference peak for both: the best fp32 rate of a 256x512x512 product seen in this run, by either
    # library (ablate measures it at the start of every training run; PyTorch here, before and after).
    torch_peak = max(torch_peak, torch_matmul_tflops(args.threads))
    ablate_peak = max(r["measured_peak_tflops"] for r in all_ablate_runs)
    peak = max(ablate_peak, torch_peak)
    for r in results:
        r["peak_tflops_for_mfu"] = peak
        r["ablate_mfu"] = r["ablate_tflops"] / peak
        r["torch_mfu"] = r["torch_tflops"] / peak
    print(f"\nFLOPs/token = 6N + 6*L*d*T. Best 256x512x512 fp32 matmul rate seen: ablate's BLAS {1e3 * ablate_peak:.1f} "
          f"GFLOP/s, torch {1e3 * torch_peak:.1f} GFLOP/s; MFU below is against {1e3 * peak:.1f} GFLOP/s")
    for r in results:
        print(f"  {r['model']}: {r['flops_per_token'] / 1e6:.2f} MFLOP/token; MFU ablate {100 * r['ablate_mfu']:.1f}%, "
              f"torch {100 * r['torch_mfu']:.1f}%")
    print(f"load average at end {loadavg()}")

    out = {
        "benchmark": "bench_train",
        "what": "training tokens/s (all B*T positions per step), ablate CPU vs PyTorch eager CPU, float32",
        "machine": machine,
        "note": args.note,
        "steps": args.steps,
        "torch_warmup_steps": args.warmup,
        "matmul_256x512x512_tflops": {"ablate_best": ablate_peak, "torch_best": torch_peak, "used_for_mfu": peak},
        "torch_side": "dense causal rows (scaled_dot_product_attention is_causal=True), random tokens, "
                      "AdamW fused=False, clip_grad_norm_ 1.0",
        "ablate_side": "configs/quickstart.toml data (synthetic_probes, packed best_fit rows, block-diagonal causal)",
        "results": results,
    }
    write_result(args.out, out)


if __name__ == "__main__":
    main()
