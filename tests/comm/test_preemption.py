#!/usr/bin/env python3
"""SIGUSR1 (a scheduler's warning before it preempts a job) stops `ablate train` after the step
under way with a checkpoint, exit 75 and summary.json status "preempted"; `--resume` then ends
with the uninterrupted run's losses, bit for bit. Preempted twice, one process; and under mpiexec
with 2 ranks, where the signal reaches one rank only and both stop after the same step.
With ABLATE_PREEMPTION_ON=cuda the same on the cuda device over `nccl` (on the emulated device,
ABLATE_EMULATE_CUDA=1, fewer steps: its kernels run interpreted).

usage: test_preemption.py ABLATE_BINARY QUICKSTART_CONFIG MPIEXEC [MPIEXEC_FLAGS...]
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

ABLATE, CONFIG, MPIEXEC, *MPI_FLAGS = sys.argv[1:]
ON_CUDA = os.environ.get("ABLATE_PREEMPTION_ON") == "cuda"
STEPS = 30 if ON_CUDA else 300
# On the cpu, 16 rows a step: a step of a few milliseconds at 4 rows let a loaded machine finish
# the 2-rank run (under a second) before a signal sent after step 20 had made its way through
# mpiexec; at 16 rows the 280 steps left take seconds.
TINY = ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.max_seq_len=64", "batching.seq_len=64",
        f"batching.batch_size={4 if ON_CUDA else 16}", f"run.steps={STEPS}", f"run.eval_every={STEPS // 3}", "run.eval_batches=1",
        "checkpoint.every=0", "logging.sinks=jsonl", "data.synthetic_probes.documents=2000"]
if ON_CUDA:
    TINY += ["run.device=cuda", "attention.name=naive_cuda", "optimizer.name=adamw_fused"]
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1",
           "OMPI_MCA_btl_vader_single_copy_mechanism": "none"}
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def argv(run_dir, ranks, extra=()):
    comm = ["run.communicator=nccl"] if ON_CUDA and ranks > 1 else []
    sets = sum((["--set", s] for s in TINY + comm + [f"run.threads={1 if ranks > 1 else 2}"]), [])
    cmd = [ABLATE, "train", CONFIG, *sets, "--run-dir", run_dir, *extra]
    return [MPIEXEC, "-n", str(ranks), *MPI_FLAGS, *cmd] if ranks > 1 else cmd


def logged_steps(run_dir):
    try:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            return [json.loads(line)["step"] for line in f if line.endswith("\n")]
    except (OSError, ValueError):
        return []


def signal_until_exit(proc, ranks):
    """SIGUSR1 to one training process (rank 0's, the first `ablate train` child of mpiexec), again
    every 50 ms until the run exits: a scheduler's warning may come more than once, and the trainer
    takes a repeat as the same request. Once is what the product needs; the repeats keep a loaded
    machine from finishing a tiny run while the first signal is still on its way through mpiexec.
    Under mpiexec only a rank is signalled: once rank 0 has exited, mpiexec (whose default action
    for SIGUSR1 is to die) is left alone while it ends the job."""
    while proc.poll() is None:
        target = proc.pid
        if ranks > 1:
            out = subprocess.run(["pgrep", "-P", str(proc.pid), "-f", "ablate"], capture_output=True, text=True).stdout.split()
            if not out:  # rank 0 has exited and mpiexec is ending the job: never signal mpiexec itself
                time.sleep(0.05)
                continue
            target = int(out[0])
        try:
            os.kill(target, signal.SIGUSR1)
        except ProcessLookupError:
            pass  # exited between the poll and the signal
        time.sleep(0.05)


def train_until_signal(run_dir, ranks, after_step, extra=()):
    """Starts the run and, once it has logged `after_step`, signals it (signal_until_exit);
    returns (exit code, output)."""
    env = dict(os.environ, **MPI_ENV)
    proc = subprocess.Popen(argv(run_dir, ranks, extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if any(s >= after_step for s in logged_steps(run_dir)):
            signal_until_exit(proc, ranks)
            break
        time.sleep(0.05)
    output, _ = proc.communicate(timeout=300)
    return proc.returncode, output


def losses(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [(m["step"], m["loss"], m.get("val_loss")) for m in map(json.loads, f)]


def preempted_then_resumed(tmp, ranks, signals):
    tag = f"{ranks} rank(s)"
    ref, run = os.path.join(tmp, f"ref{ranks}"), os.path.join(tmp, f"pre{ranks}")
    r = subprocess.run(argv(ref, ranks), capture_output=True, text=True, env=dict(os.environ, **MPI_ENV))
    check(r.returncode == 0, f"{tag}: the uninterrupted run ({r.stdout[-300:]}{r.stderr[-300:]})")
    stops = []
    for i, after in enumerate(signals):
        code, output = train_until_signal(run, ranks, after, ["--resume"] if i > 0 else [])
        summary = json.load(open(os.path.join(run, "summary.json")))
        stops.append(summary["steps"])
        check(code == 75 and summary["status"] == "preempted" and "preempted: SIGUSR1" in output,
              f"{tag}: SIGUSR1 after step {after}: exit {code}, status {summary['status']}, stopped after step {summary['steps']}")
        check(os.path.isdir(os.path.join(run, "checkpoints", f"step_{summary['steps']:08d}")) and
              logged_steps(run)[-1] == summary["steps"], f"{tag}: the checkpoint of the step it stopped after")
    r = subprocess.run(argv(run, ranks, ["--resume"]), capture_output=True, text=True, env=dict(os.environ, **MPI_ENV))
    check(r.returncode == 0 and json.load(open(os.path.join(run, "summary.json")))["status"] == "completed",
          f"{tag}: --resume completes")
    check(losses(run) == losses(ref) and len(losses(ref)) == STEPS and all(a < b for a, b in zip(stops, stops[1:])),
          f"{tag}: preempted after steps {stops}, the {STEPS} losses are the uninterrupted run's, bit for bit")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        if ON_CUDA:
            preempted_then_resumed(tmp, 1, [4, 16])
            preempted_then_resumed(tmp, 2, [6])
        else:
            preempted_then_resumed(tmp, 1, [40, 160])
            preempted_then_resumed(tmp, 2, [20])
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
