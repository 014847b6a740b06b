#!/usr/bin/env python3
"""`ablate sweep --launcher slurm` on a real one-node Slurm cluster started here (slurm_cluster.py):
a 4-arm sweep submitted as job arrays (one of its arms on 2 ranks under srun with the mpi
communicator), one arm made to fail, `--status` while it runs and after, a re-run that resubmits
the failed arm alone, and `ablate report` on the gathered directories.

Run: python3 tests/slurm/test_slurm_sweep.py path/to/ablate
Fails without slurm-wlm/munge (scripts/setup-tests.sh installs them); exits 77 (skipped) when not root.
"""
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from slurm_cluster import SlurmCluster, missing_reason, skip_reason  # noqa: E402

BASE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support", "tiny_sweep_base.toml")

SWEEP = """
base = "base.toml"
[sweep]
name = "cluster"
launcher = "slurm"
[slurm]
partition = "debug"
time = "00:10:00"
cpus_per_task = 1
extra = ["echo array task $SLURM_ARRAY_TASK_ID on $(hostname)"]
[sweep.set]
"run.steps" = 30
"checkpoint.every" = 10
[[sweep.arms]]
name = "fast"
"optimizer.lr" = 3e-3
[[sweep.arms]]
name = "slow"
"optimizer.lr" = 1e-3
[[sweep.arms]]
name = "planted"
"optimizer.lr" = 2e-3
[[sweep.arms]]
name = "two-ranks"
"optimizer.lr" = 3e-3
"slurm.tasks_per_node" = 2
"""

# Early stopping under Slurm is asynchronous, as ASHA's (docs/experiments.md): an arm is compared at a
# rung with the arms that reached it before it, so the decisions depend on the order the array's
# tasks run in, which Slurm does not promise. The test forces each order in turn: a task waits (a
# line of the job script) until the other arm's arm.json says it finished, then trains. The arm
# that may be stopped (hopeless) trains 3000 steps, a few seconds: `sweep-arm` reads its metrics
# every 500 ms, and a run of 300 steps (about a second) could end before the read that sees its
# first rung, on a loaded machine, and so complete before it could be stopped.
EARLY = """
base = "base.toml"
[sweep]
name = "{name}"
launcher = "slurm"
[sweep.set]
"run.steps" = 300
[sweep.early_stop]
rungs = [10, 20]
[slurm]
extra = [{wait}]
[[sweep.arms]]
name = "best"
"optimizer.lr" = 3e-3
[[sweep.arms]]
name = "hopeless"
"optimizer.lr" = 1e-7
"run.steps" = 3000
"""

# Array task `waiter` waits (at most 200 s) until the arm `first` has a finished arm.json.
WAIT = ('if [ "$SLURM_ARRAY_TASK_ID" = {waiter} ]; then for i in $(seq 1000); do '
        'grep -Eqs \'"status": *"(completed|stopped|failed)"\' {arm_json} && break; sleep 0.2; done; fi')

# Preemption: Slurm's warning (SIGUSR1 to the job script, as #SBATCH --signal=B:USR1@N sends it) is
# sent by hand twice; each time the arm checkpoints after its step, the task requeues itself and
# resumes from the checkpoint.
PREEMPT = """
base = "base.toml"
[sweep]
name = "preempt"
launcher = "slurm"
[sweep.set]
"run.steps" = 1500
"run.eval_every" = 500
"checkpoint.every" = 0
[[sweep.arms]]
name = "long"
"optimizer.lr" = 3e-3
"""

failures = []
passes = []


def check(cond, what, detail=""):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if cond:
        passes.append(what)
    else:
        failures.append(what)
        if detail:
            print(detail)


def main():
    ablate = os.path.abspath(sys.argv[1])
    if missing := missing_reason():
        print("FAIL: " + missing)
        return 1
    reason = skip_reason()
    if reason:
        print("skipped: " + reason)
        return 77
    work = pathlib.Path(tempfile.mkdtemp(prefix="slurm.", dir="/tmp"))  # short: munge's socket path
    try:
        # A requeued job waits the job credential's lifetime (AuthInfo's cred_expire, 120 s by
        # default) before it may start again; the preemption part requeues twice, so 10 s here.
        munge = work / "c" / "munge" / "munge.socket"
        with SlurmCluster(work / "c", cpus=2, extra_conf=f"AuthInfo=socket={munge},cred_expire=10") as cluster:
            print(f"cluster up in {cluster.startup_s:.1f} s", flush=True)
            if os.environ.get("ABLATE_SLURM_ONLY") == "preemption":  # one part, while working on it
                shutil.copy(BASE, work / "base.toml")
                preemption_under_slurm(ablate, work, cluster)
                return 1 if failures else 0
            return run_sweep(ablate, work, cluster)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def ablate_run(ablate, cluster, work, *args):
    r = subprocess.run([ablate, *args], cwd=work, env=cluster.env, capture_output=True, text=True, timeout=300)
    print(f"$ ablate {' '.join(args)}  -> exit {r.returncode}\n{r.stdout}{r.stderr}", flush=True)
    return r


def states(status_output):
    out = {}
    for line in status_output.splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 2 and not line.startswith("arms:"):
            out[parts[0]] = parts[1]
    return out


def run_sweep(ablate, work, cluster):
    shutil.copy(BASE, work / "base.toml")
    (work / "cluster.toml").write_text(SWEEP)
    out = work / "out"
    # The planted failure: a directory where the arm's metrics log goes, so its training exits 2.
    (out / "planted" / "metrics.jsonl").mkdir(parents=True)

    r = ablate_run(ablate, cluster, work, "sweep", "cluster.toml", "--out", "out")
    check(r.returncode == 0, "the sweep is submitted")
    jobs = json.loads((out / "slurm" / "jobs.json").read_text())["submissions"]
    check(len(jobs) == 2, "two arrays: one per allocation shape (1 task, 2 tasks)", json.dumps(jobs))
    by_shape = {j["resources"]["tasks_per_node"]: j for j in jobs}
    check(by_shape.get(1, {}).get("indices") == [0, 1, 2] and by_shape.get(2, {}).get("indices") == [3],
          "arms 0-2 in the one-task array, arm 3 in the two-task one", json.dumps(jobs))
    script = (out / "slurm" / "sweep.sbatch").read_text()
    for line in ("#SBATCH --partition=debug", "#SBATCH --time=00:10:00", "#SBATCH --job-name=ablate-cluster",
                 "echo array task $SLURM_ARRAY_TASK_ID", " sweep-arm "):
        check(line in script, f"the job script has {line!r}", script)

    running = ablate_run(ablate, cluster, work, "sweep", "--status", "out")
    check(running.returncode == 0 and any(s in ("pending", "running", "configuring", "completing")
                                          for s in states(running.stdout).values()),
          "--status right after submission shows queued or running arms", running.stdout)

    for j in jobs:
        cluster.wait_jobs(j["job_id"], timeout=240)
    slurm_states = {}
    for j in jobs:
        for task, (state, _) in cluster.array_states(j["job_id"]).items():
            slurm_states[task] = state
    check(slurm_states == {0: "COMPLETED", 1: "COMPLETED", 2: "FAILED", 3: "COMPLETED"},
          "Slurm saw arms 0, 1, 3 complete and the planted arm fail", str(slurm_states))
    first = ablate_run(ablate, cluster, work, "sweep", "--status", "out")
    check(states(first.stdout) == {"fast": "completed", "slow": "completed", "planted": "failed", "two-ranks": "completed"},
          "--status after the jobs: three completed, the planted arm failed", first.stdout)
    planted = json.loads((out / "planted" / "arm.json").read_text())
    check(planted["status"] == "failed" and planted["exit_code"] == 2 and "metrics.jsonl" in planted.get("error", ""),
          "the planted arm's arm.json says why it failed", json.dumps(planted))

    two = json.loads((out / "two-ranks" / "run.json").read_text())
    check(two.get("communicator") == "mpi" and two.get("world") == 2,
          "the two-task arm trained on 2 ranks under srun with the mpi communicator",
          json.dumps({k: two.get(k) for k in ("communicator", "world")}))
    for name in ("fast", "slow"):
        one = json.loads((out / name / "run.json").read_text())
        check(one.get("world") == 1 and one.get("communicator") == "single", f"arm {name} trained on one rank")

    # The fix, then the same command again: only the failed arm is submitted.
    shutil.rmtree(out / "planted" / "metrics.jsonl")
    again = ablate_run(ablate, cluster, work, "sweep", "cluster.toml", "--out", "out")
    check(again.returncode == 0, "the re-run submits")
    check(re.search(r"submitted job array \d+: 1 arm\(s\)", again.stdout) is not None
          and again.stdout.count("finished, skipped") == 3,
          "the re-run resubmits the failed arm alone and skips the three finished ones", again.stdout)
    jobs2 = json.loads((out / "slurm" / "jobs.json").read_text())["submissions"]
    check(len(jobs2) == 3 and jobs2[-1]["indices"] == [2] and jobs2[-1]["arms"] == ["planted"],
          "jobs.json records the resubmission of arm 2 only", json.dumps(jobs2))
    cluster.wait_jobs(jobs2[-1]["job_id"], timeout=240)
    final = ablate_run(ablate, cluster, work, "sweep", "--status", "out")
    check(set(states(final.stdout).values()) == {"completed"}, "every arm completed after the resubmission", final.stdout)
    check("arms: 4 completed" in final.stdout, "--status counts them", final.stdout)

    report = ablate_run(ablate, cluster, work, "report", "out")
    check(report.returncode == 0, "ablate report reads the gathered directories")
    rows = {r["arm"]: r for r in json.loads((out / "results.json").read_text())["arms"]}
    check(sorted(rows) == ["fast", "planted", "slow", "two-ranks"] and all(r["status"] == "completed" for r in rows.values()),
          "results.json has the four arms, completed", json.dumps({k: v["status"] for k, v in rows.items()}))
    text = (out / "report.md").read_text()
    check(all(f"| {a} |" in text for a in rows), "report.md lists every arm")

    # Nothing to do the third time: every arm finished.
    third = ablate_run(ablate, cluster, work, "sweep", "cluster.toml", "--out", "out")
    check(third.returncode == 0 and "nothing to submit" in third.stdout, "a third run submits nothing", third.stdout)

    early_stopping_under_slurm(ablate, work, cluster)
    preemption_under_slurm(ablate, work, cluster)
    print(f"{len(passes)} passed, {len(failures)} failed")
    if failures:
        print("failed: " + "; ".join(failures))
        return 1
    return 0


def early_stopping_under_slurm(ablate, work, cluster):
    """Each order of the two array tasks, forced: the decisions are ASHA's for that order.
    best first: best reaches each rung alone (fewer than min_arms = 2 arms there) and goes on;
    hopeless then ranks below it at rung 10 and is stopped. hopeless first: it passes both rungs
    alone and completes; best then ranks above it at each rung and completes too."""
    for first, second, expect in (("best", "hopeless", {"best": "completed", "hopeless": "stopped"}),
                                  ("hopeless", "best", {"best": "completed", "hopeless": "completed"})):
        name = f"early-{first}-first"
        out = work / name
        index = {"best": 0, "hopeless": 1}
        wait = WAIT.format(waiter=index[second], arm_json=out / first / "arm.json")
        (work / f"{name}.toml").write_text(EARLY.format(name=name, wait=json.dumps(wait)))
        r = ablate_run(ablate, cluster, work, "sweep", f"{name}.toml", "--out", name)
        check(r.returncode == 0, f"{first} first: the early-stopping sweep is submitted")
        job = json.loads((out / "slurm" / "jobs.json").read_text())["submissions"][0]["job_id"]
        cluster.wait_jobs(job, timeout=300)
        arms = {n: json.loads((out / n / "arm.json").read_text()) for n in ("best", "hopeless")}
        got = {n: a["status"] for n, a in arms.items()}
        check(got == expect, f"{first} first: the arms end {expect}",
              json.dumps({n: (a["status"], a.get("error", ""), a.get("rungs")) for n, a in arms.items()}))
        # The rung values say who was there first: the second arm saw the first arm's value.
        check(arms[first].get("rungs", {}).keys() >= {"10", "20"}, f"{first} first: {first} passed both rungs",
              json.dumps(arms[first]))
        if expect["hopeless"] == "stopped":
            check("early stopping at rung 10" in arms["hopeless"].get("error", ""),
                  f"{first} first: hopeless is stopped at the first rung", json.dumps(arms["hopeless"]))
        states = {t: s for t, (s, _) in cluster.array_states(job).items()}
        check(states == {0: "COMPLETED", 1: "COMPLETED"}, f"{first} first: both tasks end as completed for Slurm (a stopped arm's too)",
              str(states))
        status = ablate_run(ablate, cluster, work, "sweep", "--status", name)
        counts = "arms: 1 completed, 1 stopped" if expect["hopeless"] == "stopped" else "arms: 2 completed"
        check(counts in status.stdout, f"{first} first: --status counts {counts[6:]}", status.stdout)


def last_step(path):
    try:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        return json.loads(lines[-1])["step"] if lines else 0
    except (OSError, ValueError, KeyError):
        return 0


def wait_for(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.2)
    print(f"timed out waiting for {what}", flush=True)
    return False


def preemption_under_slurm(ablate, work, cluster):
    """An arm warned twice (scancel --signal=USR1 --batch, what --signal=B:USR1@N does before a time
    limit or a preemption): each time it checkpoints after its step, exits 75 and the task requeues
    itself; the requeued task resumes from the checkpoint, --status counts the requeues, and the arm
    ends with the losses of an uninterrupted run of the same experiment."""
    (work / "preempt.toml").write_text(PREEMPT)
    out = work / "preempt"
    r = ablate_run(ablate, cluster, work, "sweep", "preempt.toml", "--out", "preempt")
    check(r.returncode == 0, "the preemption sweep is submitted")
    script = (out / "slurm" / "sweep.sbatch").read_text()
    check("#SBATCH --requeue" in script and "#SBATCH --signal=B:USR1@90" in script,
          "the job script asks for the warning signal and allows requeueing", script)
    job = json.loads((out / "slurm" / "jobs.json").read_text())["submissions"][0]["job_id"]
    metrics, arm_json = out / "long" / "metrics.jsonl", out / "long" / "arm.json"
    stops = []
    for n in (1, 2):
        start = stops[-1] if stops else 0
        ok = wait_for(lambda: last_step(metrics) >= start + 100, 120, f"step {start + 100}")
        sig = subprocess.run(["scancel", "--signal=USR1", "--batch", f"{job}_0"], env=cluster.env, capture_output=True, text=True)
        check(ok and sig.returncode == 0, f"warning {n} sent at step {last_step(metrics)} ({sig.stderr.strip()})")

        def requeued_and_running():
            try:
                a = json.loads(arm_json.read_text())
            except (OSError, ValueError):
                return False
            return a.get("status") == "running" and a.get("requeues", 0) == n
        check(wait_for(requeued_and_running, 240, f"requeue {n}"), f"the task requeued itself and runs again (requeue {n})",
              arm_json.read_text() if arm_json.exists() else "")
        summary = json.loads((out / "long" / "summary.json").read_text())
        stops.append(summary["steps"])
        check(summary["status"] == "preempted" and (out / "long" / "checkpoints" / f"step_{summary['steps']:08d}").is_dir(),
              f"preemption {n}: the checkpoint of step {summary['steps']}")
    cluster.wait_jobs(job, timeout=300)
    arm = json.loads(arm_json.read_text())
    check(arm["status"] == "completed" and arm.get("requeues") == 2, "the arm completes after two requeues", json.dumps(arm))
    status = ablate_run(ablate, cluster, work, "sweep", "--status", "preempt")
    row = next((line.split() for line in status.stdout.splitlines() if line.startswith("long ")), [])
    check(row[:3] == ["long", "completed", "2"], "--status shows the arm completed with 2 requeues", status.stdout)
    # The same experiment uninterrupted, here: the same losses, bit for bit.
    ref = work / "preempt-ref"
    sets = sum((["--set", s] for s in arm["sets"]), [])
    ablate_run(ablate, cluster, work, "train", "base.toml", *sets, "--run-dir", str(ref))
    losses = lambda d: [(m["step"], m["loss"]) for m in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())]  # noqa: E731
    check(losses(out / "long") == losses(ref) and len(losses(ref)) == 1500 and stops[0] < stops[1],
          f"preempted after steps {stops}: the 1500 losses are the uninterrupted run's")


if __name__ == "__main__":
    sys.exit(main())
