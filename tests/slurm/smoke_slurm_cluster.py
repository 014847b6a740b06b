#!/usr/bin/env python3
"""Smoke test of tests/slurm/slurm_cluster.py: starts the one-node cluster and checks for real
  (a) a job array of 4 one-CPU tasks runs, each task writing $SLURM_ARRAY_TASK_ID to its own file,
      two of them at the same time (the node has 2 CPUs, select/cons_tres with CR_Core);
  (b) a failed array task is seen as failed: without slurmdbd `sacct` refuses ("accounting storage
      is disabled"), but slurmctld keeps finished jobs for MinJobAge (300 s), so
      `squeue -t all -r -j <job> -o "%K %T %r"` (SlurmCluster.array_states) and
      `scontrol show job <job>` report each task's state and exit code;
  (c) `srun --mpi=pmix` inside an sbatch allocation of 2 tasks runs a 2-rank Open MPI program
      (compiled here with mpicc) whose ranks both see a world of 2 and an all-reduced rank sum of 1,
      without any OMPI_ALLOW_RUN_AS_ROOT* in the environment;
and that on exit no daemon or other process of the cluster is left. Prints the start-up time.
With --probe-mpi it also reports what the other srun --mpi values do (informational).

Exit status: 0 passed, 1 failed (Slurm/munge not installed included), 77 skipped (not root).
"""
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from slurm_cluster import MPI_SRUN_OPTION, SlurmCluster, missing_reason, skip_reason  # noqa: E402

JOB_TIMEOUT_S = 90

HELLO_C = r"""
#include <mpi.h>
#include <stdio.h>
int main(int argc, char **argv) {
  int rank = -1, size = -1, sum = -1;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  printf("rank %d size %d sum %d\n", rank, size, sum);
  MPI_Finalize();
  return 0;
}
"""


class Failed(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failed(what)
    print(f"ok: {what}")


def submit(cluster, *args, env=None):
    r = subprocess.run(["sbatch", "--parsable", *args], env=env or cluster.env,
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise Failed(f"sbatch {' '.join(args)} failed: {r.stderr.strip()}")
    return r.stdout.strip().split(";")[0]


def check_array(cluster, w):
    out = w / "array"
    out.mkdir()
    # Each task: its id into task_<id>, and its start and end times (1 s apart) into times_<id>.
    script = (f'echo "$SLURM_ARRAY_TASK_ID" > {out}/task_$SLURM_ARRAY_TASK_ID; '
              f't0=$(date +%s.%N); sleep 1; echo "$t0 $(date +%s.%N)" > {out}/times_$SLURM_ARRAY_TASK_ID')
    t0 = time.monotonic()
    job = submit(cluster, "--array=0-3", f"--output={out}/slurm-%A_%a.out", f"--wrap={script}")
    cluster.wait_jobs(job, JOB_TIMEOUT_S)
    print(f"    array of 4 finished {time.monotonic() - t0:.1f} s after sbatch")
    for i in range(4):
        f = out / f"task_{i}"
        check(f.exists() and f.read_text().strip() == str(i), f"array task {i} wrote {f.name} = {i}")
    spans = [tuple(map(float, (out / f"times_{i}").read_text().split())) for i in range(4)]
    overlap = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
    check(overlap == 2, f"two one-CPU array tasks ran at once on the 2-CPU node (at most {overlap})")
    states = cluster.array_states(job)
    check(states == {i: ("COMPLETED", "None") for i in range(4)}, f"squeue -t all: all 4 COMPLETED ({states})")


def check_failed_task(cluster, w):
    out = w / "failing"
    out.mkdir()
    job = submit(cluster, "--array=0-2", f"--output={out}/slurm-%A_%a.out",
                 '--wrap=test "$SLURM_ARRAY_TASK_ID" != 1')
    cluster.wait_jobs(job, JOB_TIMEOUT_S)
    states = cluster.array_states(job)
    check(states == {0: ("COMPLETED", "None"), 1: ("FAILED", "NonZeroExitCode"), 2: ("COMPLETED", "None")},
          f"squeue -t all -r: task 1 FAILED, 0 and 2 COMPLETED ({states})")
    r = cluster.run("scontrol", "-o", "show", "job", job)
    fields = [dict(f.split("=", 1) for f in line.split() if "=" in f) for line in r.stdout.splitlines()]
    by_task = {int(f["ArrayTaskId"]): (f["JobState"], f["ExitCode"]) for f in fields}
    check(by_task == {0: ("COMPLETED", "0:0"), 1: ("FAILED", "1:0"), 2: ("COMPLETED", "0:0")},
          f"scontrol show job: task 1 FAILED with ExitCode 1:0 ({by_task})")
    r = cluster.run("sacct", "-n", "-j", job, check=False)
    print(f"    sacct without slurmdbd: exit {r.returncode}, {(r.stderr or r.stdout).strip()!r}")


def mpi_env(cluster):
    return {k: v for k, v in cluster.env.items() if not k.startswith("OMPI_ALLOW_RUN_AS_ROOT")}


def check_mpi(cluster, w, hello):
    out = w / "mpi.out"
    t0 = time.monotonic()
    job = submit(cluster, "--ntasks=2", f"--output={out}", f"--wrap=srun {MPI_SRUN_OPTION} {hello}",
                 env=mpi_env(cluster))
    cluster.wait_jobs(job, JOB_TIMEOUT_S)
    text = out.read_text() if out.exists() else "(no output)"
    lines = sorted(l for l in text.splitlines() if l.startswith("rank "))
    check(lines == ["rank 0 size 2 sum 1", "rank 1 size 2 sum 1"],
          f"srun {MPI_SRUN_OPTION} in sbatch --ntasks=2: both ranks see size 2, sum 1 "
          f"({time.monotonic() - t0:.1f} s)" + ("" if lines else f"; output:\n{text}"))
    r = cluster.run("squeue", "-h", "-t", "all", "-j", job, "-o", "%T")
    check(r.stdout.strip() == "COMPLETED", f"the MPI job COMPLETED ({r.stdout.strip()})")


def probe_mpi(cluster, w, hello):
    r = cluster.run("srun", "--mpi=list", check=False)
    print("    srun --mpi=list:", " ".join((r.stdout + r.stderr).split()))
    for value in ("pmix", "pmix_v4", "pmi2", "none"):
        r = subprocess.run(["srun", "--ntasks=2", f"--mpi={value}", str(hello)], env=mpi_env(cluster),
                           capture_output=True, text=True, timeout=120)
        ranks = sorted(l for l in r.stdout.splitlines() if l.startswith("rank "))
        why = next((l.strip() for l in r.stdout.splitlines() + r.stderr.splitlines()
                    if "not built with SLURM's PMI" in l or "error" in l.lower()), "")
        print(f"    srun --mpi={value}: exit {r.returncode}, {ranks or why}")


def leftovers(cluster, pids):
    alive = [f"{n}={p}" for n, p in pids.items() if pathlib.Path(f"/proc/{p}").exists()
             and "(zombie)" not in _status(p)]
    alive += [str(p) for p in map(int, filter(str.isdigit, os.listdir("/proc")))
              if p != os.getpid() and cluster._mine(p)]
    return alive


def _status(pid):
    try:
        return pathlib.Path(f"/proc/{pid}/status").read_text().split("\n")[2]
    except (OSError, IndexError):
        return "(zombie)"


def main():
    if missing := missing_reason():
        print("FAIL: " + missing)
        return 1
    reason = skip_reason()
    if reason:
        print(f"skipped: {reason}")
        return 77
    if shutil.which("mpicc") is None:
        print("FAILED: mpicc not found (Debian package libopenmpi-dev)")
        return 1
    # Short: Unix socket paths (munge's, slurmd's step sockets) are limited to 107 bytes.
    w = pathlib.Path(tempfile.mkdtemp(prefix="slurm.", dir="/tmp" if os.path.isdir("/tmp") else None))
    ok = False
    try:
        hello = w / "mpi_hello"
        (w / "mpi_hello.c").write_text(HELLO_C)
        subprocess.run(["mpicc", "-O1", "-o", str(hello), str(w / "mpi_hello.c")], check=True)
        cluster = SlurmCluster(w / "cluster", cpus=2)
        try:
            with cluster:
                print(f"ok: cluster up in {cluster.startup_s:.2f} s (node {cluster.node}, "
                      f"{cluster.cpus} CPUs, partition {cluster.partition}, conf {cluster.conf})")
                pids = cluster.pids()
                check_array(cluster, w)
                check_failed_task(cluster, w)
                check_mpi(cluster, w, hello)
                if "--probe-mpi" in sys.argv[1:]:
                    probe_mpi(cluster, w, hello)
                t_stop = time.monotonic()
            print(f"    cluster stopped in {time.monotonic() - t_stop:.2f} s")
            left = leftovers(cluster, pids)
            check(not left, f"no process of the cluster left after exit ({left})")
            ok = True
        except Failed as e:
            print(f"FAILED: {e}")
        except Exception as e:  # noqa: BLE001 (the fixture's errors carry the daemons' log tails)
            print(f"FAILED: {type(e).__name__}: {e}")
    finally:
        if ok:
            shutil.rmtree(w, ignore_errors=True)
        else:
            print(f"files kept in {w}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
