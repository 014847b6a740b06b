#!/usr/bin/env python3
"""The quickstart trained by two builds of ablate, alternated (A B A B ...), on the same machine.

Prints each run's throughput and wall time, the medians and the ratio B/A, whether every logged
loss, validation loss and gradient norm is the same in both, and writes the table as JSON.
A refactoring is checked with it: the same numbers bit for bit, and throughput within noise.

Usage: quickstart_ab.py A_ABLATE B_ABLATE [--repeats 3] [--config configs/quickstart.toml]
                        [--work DIR] [--json out.json]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile


def run(binary, config, run_dir):
    shutil.rmtree(run_dir, ignore_errors=True)
    with open(run_dir + ".log", "w") as log:
        subprocess.run([binary, "train", config, "--run-dir", run_dir], stdout=log, stderr=subprocess.STDOUT, check=True)
    summary = json.load(open(os.path.join(run_dir, "summary.json")))
    curve = []
    for line in open(os.path.join(run_dir, "metrics.jsonl")):
        d = json.loads(line)
        curve.append((d.get("step"), d.get("loss"), d.get("val_loss"), d.get("grad_norm")))
    return summary, curve


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--config", default=os.path.join(os.path.dirname(__file__), "..", "configs", "quickstart.toml"))
    ap.add_argument("--work", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="quickstart_ab_")
    os.makedirs(work, exist_ok=True)
    rows, curves = [], {"a": [], "b": []}
    for i in range(args.repeats):
        for side, binary in (("a", args.a), ("b", args.b)):
            summary, curve = run(binary, args.config, os.path.join(work, f"{side}{i}"))
            curves[side].append(curve)
            rows.append({"side": side, "repeat": i, "tokens_per_s": summary["tokens_per_s"], "wall_s": summary["wall_s"],
                         "final_loss": summary["final_loss"], "config_hash": summary["config_hash"]})
            print(f"{side} {i}: {summary['tokens_per_s']:10.0f} tok/s  {summary['wall_s']:7.1f} s  final loss {summary['final_loss']!r}",
                  flush=True)
    same = all(c == curves["a"][0] for c in curves["a"] + curves["b"])
    med = {s: statistics.median(r["tokens_per_s"] for r in rows if r["side"] == s) for s in "ab"}
    wall = {s: sum(r["wall_s"] for r in rows if r["side"] == s) for s in "ab"}
    print(f"median tok/s: a {med['a']:.0f}, b {med['b']:.0f}, b/a {med['b'] / med['a']:.3f}; "
          f"total wall: a {wall['a']:.1f} s, b {wall['b']:.1f} s, a/b {wall['a'] / wall['b']:.3f}")
    print("every logged loss, val loss and grad norm: " + ("identical in every run" if same else "DIFFERENT"))
    result = {"a": args.a, "b": args.b, "config": args.config, "runs": rows, "median_tokens_per_s": med,
              "total_wall_s": wall, "ratio_b_over_a": med["b"] / med["a"], "curves_identical": same}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
