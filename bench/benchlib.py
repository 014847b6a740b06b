"""What the Python benchmarks record about the machine and the tree they ran on."""
import json
import os
import platform
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_commit():
    def git(*args):
        return subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True).stdout.strip()
    commit = git("rev-parse", "HEAD") or "unknown"
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    return commit + ("-dirty" if dirty else "")


def write_result(path, result):
    """Writes a benchmark's JSON and says where."""
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(f"wrote {os.path.relpath(path, REPO)}")


def run_checked(cmd, env=None):
    """Runs a command from the repository root; on failure prints its output's tail and exits."""
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-4000:] + p.stderr[-4000:])
        raise SystemExit(f"failed (exit {p.returncode}): {' '.join(cmd)}")
    return p


def read_run(run_dir):
    """summary.json, run.json and the step times after the first step of an ablate run directory."""
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(run_dir, "run.json")) as f:
        run = json.load(f)
    step_ms = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            m = json.loads(line)
            if m.get("step", 0) > 1:
                step_ms.append(m["step_ms"])
    return summary, run, step_ms
