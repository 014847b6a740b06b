#!/usr/bin/env python3
"""A run killed (SIGKILL or SIGTERM) at any moment, checkpoint writes included, then resumed with
--resume until it completes, logs the same losses bit for bit as the run never interrupted.

    python3 tests/probes/kill_resume.py build/bin/ablate

Each interruption is aimed at a moment: while a checkpoint is being written (its hidden temporary
directory exists), right after one was named latest, and at a fixed delay. Which moment a kill
really hits depends on the machine; the result may not: every step's loss in metrics.jsonl must
equal the uninterrupted run's (the JSON numbers are the doubles' shortest round-trip spelling).
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.toml"
FLAGS = ["--set", "model.d_model=48", "--set", "model.n_layers=2", "--set", "model.n_heads=2", "--set", "batching.seq_len=64",
         "--set", "model.max_seq_len=64", "--set", "run.eval_batches=1", "--set", "run.eval_every=0", "--set", "run.threads=1",
         "--set", "run.steps=160", "--set", "checkpoint.every=8", "--set", "checkpoint.keep=2", "--set", "data.workers=0",
         "--set", "model.dropout=0.1"]
LIMIT_S = 300


def losses(run: Path):
    out = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        j = json.loads(line)
        out[j["step"]] = j["loss"]
    return out


def train(ablate, run, resume):
    return subprocess.Popen([str(ablate), "train", str(QUICKSTART), *FLAGS, "--run-dir", str(run)] + (["--resume"] if resume else []),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


def wait_for(predicate, p, deadline):
    while time.monotonic() < deadline and p.poll() is None:
        if predicate():
            return True
        time.sleep(0.002)
    return False


def interrupted_run(ablate, run: Path, moments, sig):
    """Kills the run at each moment in turn (resuming after each), then lets it finish."""
    ck = run / "checkpoints"
    kills = 0
    for i, moment in enumerate(moments + [None]):
        resume = i > 0 and ck.is_dir() and any(ck.glob("step_*/state.json"))
        p = train(ablate, run, resume)
        deadline = time.monotonic() + LIMIT_S
        if moment == "writing":
            hit = wait_for(lambda: any(ck.glob(".step_*.tmp")) if ck.is_dir() else False, p, deadline)
        elif moment == "named":
            start = (ck / "latest").stat().st_mtime_ns if (ck / "latest").exists() else 0
            hit = wait_for(lambda: (ck / "latest").exists() and (ck / "latest").stat().st_mtime_ns != start, p, deadline)
        elif moment is not None:
            time.sleep(moment)
            hit = p.poll() is None
        else:
            hit = False
        if hit:
            os.killpg(p.pid, sig)
            kills += 1
        _, err = p.communicate(timeout=LIMIT_S)
        if moment is None and p.returncode != 0:
            raise SystemExit(f"the final resume failed ({p.returncode}):\n{err.decode(errors='replace')[-2000:]}")
    return kills


def main():
    ablate = Path(sys.argv[1]).resolve()
    failures = 0
    with tempfile.TemporaryDirectory(prefix="ablate-kill-") as tmp:
        tmp = Path(tmp)
        p = train(ablate, tmp / "whole", False)
        _, err = p.communicate(timeout=LIMIT_S)
        if p.returncode != 0:
            raise SystemExit(f"the uninterrupted run failed:\n{err.decode(errors='replace')[-2000:]}")
        want = losses(tmp / "whole")
        for sig in (signal.SIGKILL, signal.SIGTERM):
            run = tmp / f"run-{sig.name}"
            kills = interrupted_run(ablate, run, ["writing", "named", 0.6, "writing", 0.3], sig)
            got = losses(run)
            status = json.loads((run / "summary.json").read_text())["status"]
            diff = [s for s in want if got.get(s) != want[s]]
            ok = not diff and set(got) == set(want) and status == "completed"
            failures += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {sig.name}: {kills} interruptions, {len(got)} steps logged, status {status}"
                  + (f"; steps differing from the uninterrupted run: {diff[:10]}" if diff else ""))
    print(f"{2 - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
