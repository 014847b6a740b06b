#!/usr/bin/env python3
"""The doctor stays quiet on clean runs: 50 tiny quickstart runs (seeds 1-50 over the three
batchers and micro-batches of 4, 8 and 16, evaluated every 25 steps) train at the quickstart's
learning rate, and `ablate doctor --json` must name no finding about the loss on any of them:
no diverged, above_uniform, warmup_blowup or eval_plateau, and no loss_spike the run does not come
back from (high). A tiny model at this rate has a few real two-step spikes it recovers from (1.10x
and 1.24x its level in two of these 50 on one machine, low; another CPU's arithmetic may put one
over the 1.25x of medium): they are listed, not failed. The closest a clean run came to the new
findings' thresholds here: a validation loss 0.3% over its best two evaluations on (1% needed)
while the training loss fell 2.8% (3% needed); no warm-up loss over 1.005x the first (1.15x); no
loss after the first step over 4.403 (1.05 ln 80 = 4.60). Then the run the findings were made for:
the quickstart's model at optimizer.lr = 0.3 must get above_uniform and warmup_blowup.

usage: doctor_clean_runs.py ABLATE QUICKSTART_CONFIG [--runs N] [--jobs N]
"""
import argparse
import concurrent.futures
import json
import subprocess
import sys
import tempfile
from pathlib import Path

LOSS_FINDINGS = {"loss_spike", "diverged", "above_uniform", "warmup_blowup", "eval_plateau"}
TINY = ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "batching.seq_len=32", "model.max_seq_len=32",
        "run.eval_batches=1", "run.threads=1", "data.workers=0"]


def train_and_diagnose(ablate, config, run_dir, sets):
    argv = [ablate, "train", config, "--run-dir", str(run_dir)]
    for s in sets:
        argv += ["--set", s]
    t = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if t.returncode != 0:
        return None, f"training failed: {t.stdout[-500:]}{t.stderr[-500:]}"
    d = subprocess.run([ablate, "doctor", str(run_dir), "--json"], capture_output=True, text=True, timeout=120)
    if d.returncode != 0:
        return None, f"doctor failed: {d.stdout[-500:]}{d.stderr[-500:]}"
    return json.loads(d.stdout), ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ablate")
    ap.add_argument("config")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    batchers, micro = ["packed", "padded", "bucketed"], [4, 8, 16]
    failures = []
    with tempfile.TemporaryDirectory(prefix="doctor-clean-") as tmp:
        jobs = {}
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            for i in range(args.runs):
                sets = TINY + [f"run.seed={i + 1}", f"batching.name={batchers[i % 3]}", f"batching.batch_size={micro[(i // 3) % 3]}",
                               "run.steps=300", "run.eval_every=25"]
                jobs[pool.submit(train_and_diagnose, args.ablate, args.config, Path(tmp) / f"clean{i + 1}", sets)] = (i + 1, sets)
            for f in concurrent.futures.as_completed(jobs):
                seed, sets = jobs[f]
                findings, error = f.result()
                if findings is None:
                    failures.append(f"seed {seed}: {error}")
                    continue
                for x in findings:
                    if x["id"] not in LOSS_FINDINGS:
                        continue
                    line = f"seed {seed} ({' '.join(sets[len(TINY):])}): {x['id']} ({x['severity']}): {x['message']}"
                    if x["id"] == "loss_spike" and x["severity"] != "high":
                        print("info " + line)
                    else:
                        failures.append(line)
        print(f"{args.runs} clean runs: {len(failures)} loss finding(s) (recovered spikes listed, not counted)")
        # The quickstart's model, its learning rate a hundred times too large: up through the warm-up.
        findings, error = train_and_diagnose(args.ablate, args.config, Path(tmp) / "lr0.3",
                                             ["optimizer.lr=0.3", "run.steps=60", "run.eval_every=0", "run.threads=2"])
        if findings is None:
            failures.append(f"lr 0.3: {error}")
        else:
            ids = {x["id"]: x for x in findings}
            for want in ("above_uniform", "warmup_blowup"):
                if want not in ids:
                    failures.append(f"lr 0.3: no {want} finding (found {sorted(ids)})")
                else:
                    print(f"lr 0.3: {want}: {ids[want]['message']}")
    for line in failures:
        print("FAIL " + line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
