#!/usr/bin/env python3
"""bench/numerics_pair.py, the bundle's numerics check (two precisions of one experiment), on real
runs of the quickstart on the CPU: a run against its own repeat passes with no gap (the CPU run is
deterministic); against a run with a tenth of the learning rate it fails on both bounds; the means
and the validation gap it reports are the ones computed here from the runs' metrics.jsonl; bad
input (no metrics, runs of different lengths, a window longer than the runs) exits 2.
Usage: test_numerics_pair.py ABLATE SOURCE_DIR"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ablate, source = sys.argv[1], Path(sys.argv[2])
script = source / "bench" / "numerics_pair.py"
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


def train(run_dir, *sets, steps=20):
    argv = [ablate, "train", str(source / "configs" / "quickstart.toml"), "--run-dir", str(run_dir),
            "--set", f"run.steps={steps}", "--set", "run.eval_every=10", "--set", "run.eval_batches=2",
            "--set", "run.threads=2", "--set", "checkpoint.every=1000"]
    for s in sets:
        argv += ["--set", s]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        sys.exit(f"FAIL: ablate train {' '.join(sets)} exited {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")


def pair(reference, candidate, *extra):
    out = Path(tempfile.mkstemp(suffix=".json")[1])
    r = subprocess.run([sys.executable, str(script), "--reference", str(reference), "--candidate", str(candidate),
                        "--json", str(out), *extra], capture_output=True, text=True, timeout=120)
    data = json.loads(out.read_text()) if out.stat().st_size > 0 else None
    return r, data


def losses(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r["loss"] for r in rows], [r["val_loss"] for r in rows if "val_loss" in r]


with tempfile.TemporaryDirectory() as tmp:
    tmp = Path(tmp)
    train(tmp / "a")
    train(tmp / "b")
    train(tmp / "slow", "optimizer.lr=0.0003")
    train(tmp / "short", steps=10)

    r, d = pair(tmp / "a", tmp / "b", "--last", "10")
    check(r.returncode == 0, f"a run against its repeat: exit {r.returncode}: {r.stdout} {r.stderr}")
    check(d is not None and d["verdict"] == "pass" and d["mean_loss_gap"] == 0.0 and d["val_rel_gap"] == 0.0,
          f"a run against its repeat: {d and {k: d[k] for k in ('verdict', 'mean_loss_gap', 'val_rel_gap')}}")

    r, d = pair(tmp / "a", tmp / "slow", "--last", "10")
    la, va = losses(tmp / "a")
    ls, vs = losses(tmp / "slow")
    want_gap = sum(ls[-10:]) / 10 - sum(la[-10:]) / 10
    check(r.returncode == 1, f"a tenth of the learning rate: exit {r.returncode} (expected 1, a fail)")
    check(d is not None and d["verdict"] == "fail" and not d["loss_ok"] and not d["val_ok"],
          f"a tenth of the learning rate: {d and {k: d[k] for k in ('verdict', 'loss_ok', 'val_ok')}}")
    check(d is not None and abs(d["mean_loss_gap"] - want_gap) <= 1e-12 * max(1.0, abs(want_gap)) and want_gap > 0.02,
          f"the gap of the last 10 means: {d and d['mean_loss_gap']} against {want_gap} computed here")
    check(d is not None and abs(d["val_rel_gap"] - (vs[-1] - va[-1]) / va[-1]) <= 1e-12,
          f"the validation gap: {d and d['val_rel_gap']} against {(vs[-1] - va[-1]) / va[-1]}")
    check(d is not None and len(d["curves"]["reference"]) == 20 and d["curves"]["candidate"][-1][1] == ls[-1],
          "the curves hold every step of both runs")

    for what, args in (("no metrics.jsonl", (tmp / "a", tmp / "nothing", "--last", "10")),
                       ("runs of 20 and 10 steps", (tmp / "a", tmp / "short", "--last", "5")),
                       ("a window longer than the runs", (tmp / "a", tmp / "b", "--last", "21"))):
        r, _ = pair(*args)
        check(r.returncode == 2 and "numerics_pair:" in r.stderr, f"{what}: exit {r.returncode}, {r.stderr.strip()}")

if failures:
    print("FAIL:\n  " + "\n  ".join(failures))
    sys.exit(1)
print("numerics_pair: repeat passes, a tenth of the learning rate fails, gaps as computed here, bad input exit 2")
