"""Tiny real runs for the logger checks that read what `ablate` wrote back with another tool
(check_tensorboard.py, check_mlflow.py): `ablate train` of configs/quickstart.toml shrunk to a
32-wide one-layer model, and a two-arm `ablate sweep` of it over batching.name."""
import os
import subprocess

TINY = ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "batching.seq_len=32", "model.max_seq_len=32",
        "run.eval_batches=1", "run.threads=1", "data.workers=0"]
ARMS = ["padded", "packed"]  # the sweep's arms: its factor batching.name


def run_ablate(argv, cwd, env=None, expect=0):
    """Runs ablate and returns its output; a failed check when it exits other than `expect`."""
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == expect, f"{' '.join(argv)} exited {r.returncode}, expected {expect}:\n{r.stdout}{r.stderr}"
    return r.stdout + r.stderr


def train(ablate, quickstart, cwd, run_dir, sets, extra=(), env=None, expect=0):
    """`ablate train` of the tiny model with `sets` ("key=value") and `extra` arguments."""
    argv = [ablate, "train", quickstart, *[a for kv in TINY + list(sets) for a in ("--set", kv)], *extra, "--run-dir", run_dir]
    return run_ablate(argv, cwd, env, expect)


def sweep(ablate, quickstart, cwd, name, sinks, env=None):
    """A sweep of the tiny model over ARMS, 3 steps an arm, logging to `sinks`; returns its directory."""
    path = os.path.join(cwd, name + ".toml")
    sets = "".join(f'"{kv.split("=")[0]}" = {kv.split("=")[1]}\n' for kv in TINY)
    sink_list = ", ".join(f'"{s}"' for s in sinks)
    arms = ", ".join(f'"{a}"' for a in ARMS)
    with open(path, "w") as f:
        f.write(f'base = "{quickstart}"\n[sweep]\nname = "{name}"\n[sweep.set]\n{sets}"run.steps" = 3\n'
                f'"logging.sinks" = [{sink_list}]\n[sweep.grid]\n"batching.name" = [{arms}]\n')
    out = os.path.join(cwd, "sweeps", name)
    run_ablate([ablate, "sweep", path, "--out", out], cwd, env)
    return out
