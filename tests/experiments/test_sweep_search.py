#!/usr/bin/env python3
"""Random search, early stopping and live progress of `ablate sweep`, run for real on tiny models.

- random search: the draws equal an independent reference (a 64-bit Mersenne Twister written here
  from its definition, u = (bits >> 11) / 2^53 per key in key order, values to 6 significant
  digits), are the same for the same seed and differ for another, stay in their ranges, and are
  recorded in arms.json / arm.json;
- early stopping: a planted hopeless arm (learning rate 1e-7) is stopped at the first rung, the
  best arm completes, the report and results say so, and a re-run skips the stopped arm; bad rules
  are exit 2 naming the key;
- progress: on a terminal (a pty) the sweep draws a live block (one line per running arm with step,
  loss and ETA, and a line of totals) with cursor movements; into a pipe it writes one line per
  event and no escape sequence.

Run: python3 tests/experiments/test_sweep_search.py path/to/ablate
"""
import json
import math
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

ABLATE = None

BASE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support", "tiny_sweep_base.toml")


class MT19937_64:
    """The 64-bit Mersenne Twister as its authors define it (the C++ standard's mt19937_64)."""

    def __init__(self, seed):
        self.mt = [0] * 312
        self.mt[0] = seed & 0xFFFFFFFFFFFFFFFF
        for i in range(1, 312):
            self.mt[i] = (6364136223846793005 * (self.mt[i - 1] ^ (self.mt[i - 1] >> 62)) + i) & 0xFFFFFFFFFFFFFFFF
        self.index = 312

    def __call__(self):
        if self.index >= 312:
            for i in range(312):
                x = (self.mt[i] & 0xFFFFFFFF80000000) | (self.mt[(i + 1) % 312] & 0x7FFFFFFF)
                xa = x >> 1
                if x & 1:
                    xa ^= 0xB5026F5AA96619E9
                self.mt[i] = self.mt[(i + 156) % 312] ^ xa
            self.index = 0
        y = self.mt[self.index]
        self.index += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y & 0xFFFFFFFFFFFFFFFF


def reference_draws(ranges, samples, seed):
    """ranges: [(key, kind, spec)] in key order; returns [{key: text}] as `--set` would take them."""
    bits = MT19937_64(seed)
    out = []
    for _ in range(samples):
        draw = {}
        for key, kind, spec in ranges:
            u = (bits() >> 11) * 2.0**-53
            if kind == "choice":
                draw[key] = spec[min(len(spec) - 1, int(u * len(spec)))]
            elif kind == "int_uniform":
                lo, hi = spec
                draw[key] = str(lo + min(hi - lo, int(u * (hi - lo + 1))))
            else:
                lo, hi = spec
                x = lo + u * (hi - lo) if kind == "uniform" else math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))
                x = min(max(float("%.6g" % x), lo), hi)
                text = "%.6g" % x
                if not any(c in text for c in ".eEn"):
                    text += ".0"
                draw[key] = text
        out.append(draw)
    return out


def run(args, cwd, **kw):
    return subprocess.run([ABLATE] + args, cwd=cwd, capture_output=True, text=True, timeout=600, **kw)


def dry_run_sets(output):
    """{arm: {key: value}} from `ablate sweep --dry-run`'s listing."""
    arms = {}
    for line in output.splitlines():
        m = re.match(r"^  (\S+): (.*)$", line)
        if m:
            arms[m.group(1)] = dict(x.split("=", 1) for x in m.group(2).split())
    return arms


class Base(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        shutil.copy(BASE, os.path.join(self.dir, "base.toml"))

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, name, text):
        with open(os.path.join(self.dir, name), "w") as f:
            f.write(text)


RANDOM = """
base = "base.toml"
[sweep]
search = "random"
samples = 12
seed = {seed}
[sweep.random]
"optimizer.lr" = {{ log_uniform = [1e-4, 1e-2] }}
"optimizer.adamw.weight_decay" = {{ uniform = [0.0, 0.2] }}
"batching.name" = ["padded", "packed"]
"model.n_layers" = {{ int_uniform = [1, 3] }}
"""

RANGES = [  # in key order, as the sweep file's table is walked
    ("batching.name", "choice", ["'padded'", "'packed'"]),
    ("model.n_layers", "int_uniform", (1, 3)),
    ("optimizer.adamw.weight_decay", "uniform", (0.0, 0.2)),
    ("optimizer.lr", "log_uniform", (1e-4, 1e-2)),
]


class RandomSearch(Base):
    def draws(self, seed):
        self.write("rs.toml", RANDOM.format(seed=seed))
        r = run(["sweep", "rs.toml", "--dry-run"], self.dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("random search, seed %d" % seed, r.stdout)
        sets = dry_run_sets(r.stdout)
        for s in sets.values():
            s.pop("metrics.peak_tflops", None)
        return sets

    def test_draws_equal_the_reference_and_follow_the_seed(self):
        got = self.draws(7)
        self.assertEqual(list(got), ["sample-%02d" % (i + 1) for i in range(12)])
        want = reference_draws(RANGES, 12, 7)
        self.assertEqual([got["sample-%02d" % (i + 1)] for i in range(12)], want)
        self.assertEqual(self.draws(7), got)  # reproducible
        self.assertNotEqual(self.draws(8), got)  # another seed, other draws
        for s in got.values():
            self.assertTrue(1e-4 <= float(s["optimizer.lr"]) <= 1e-2)
            self.assertTrue(0.0 <= float(s["optimizer.adamw.weight_decay"]) <= 0.2)
            self.assertIn(s["model.n_layers"], {"1", "2", "3"})
        # Over 12 draws of a log-uniform range both decades are visited.
        self.assertTrue(any(float(s["optimizer.lr"]) < 1e-3 for s in got.values()))
        self.assertTrue(any(float(s["optimizer.lr"]) > 1e-3 for s in got.values()))

    def test_a_random_sweep_runs_and_records_its_draws(self):
        self.write("rs.toml", RANDOM.format(seed=3).replace("samples = 12", "samples = 2") + '[sweep.set]\n"run.steps" = 6\n')
        r = run(["sweep", "rs.toml", "--out", "out"], self.dir)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(os.path.join(self.dir, "out", "arms.json")) as f:
            arms = json.load(f)
        self.assertEqual(arms["search"], {"method": "random", "seed": 3, "samples": 2})
        self.assertEqual(sorted(arms["axes"]), [k for k, _, _ in RANGES])
        want = reference_draws(RANGES, 2, 3)
        for i, name in enumerate(arms["arms"]):
            with open(os.path.join(self.dir, "out", name, "arm.json")) as f:
                arm = json.load(f)
            self.assertEqual(arm["status"], "completed")
            self.assertEqual(arm["overrides"]["optimizer.lr"], want[i]["optimizer.lr"])

    def test_bad_search_keys_are_input_errors(self):
        cases = {
            'search = "random"\nsamples = 2\n[sweep.random]\n"optimizer.lr" = { log_uniform = [0.0, 1e-2] }\n': "0 < lo <= hi",
            'search = "random"\nsamples = 2\n[sweep.random]\n"optimizer.lr" = { normal = [0.0, 1.0] }\n': "unknown distribution 'normal'",
            'search = "random"\n[sweep.random]\n"optimizer.lr" = [1e-3]\n': "samples = N",
            'search = "random"\nsamples = 2\n': "[sweep.random]",
            'search = "randm"\n': 'did you mean \'random\'',
            'samples = 3\n': 'belong to search = "random"',
            'search = "random"\nsamples = 2\n[sweep.random]\n"optimizer.lr" = { uniform = [2.0, 1.0] }\n': "lo <= hi",
        }
        for body, message in cases.items():
            self.write("bad.toml", 'base = "base.toml"\n[sweep]\n' + body)
            r = run(["sweep", "bad.toml", "--dry-run"], self.dir)
            self.assertEqual(r.returncode, 2, body + r.stdout + r.stderr)
            self.assertIn(message, r.stderr, body)
            self.assertIn("bad.toml", r.stderr)


class SlurmInputs(Base):
    """The [slurm] table, per-arm resources and the sweep's --set, checked before anything runs."""

    def test_bad_slurm_keys_and_sets_are_input_errors(self):
        self.write("s.toml", 'base = "base.toml"\n[slurm]\npartition = "debug"\n[[sweep.arms]]\n"optimizer.lr" = 1e-3\n'
                             '"slurm.tasks_per_node" = 2\n')
        cases = [
            ([], "the local launcher trains one process per arm"),
            (["--set", "run.steps=3"], "an experiment key goes in the sweep file's [sweep.set]"),
            (["--launcher", "slrum"], "expected local or slurm"),
            (["--set", "slurm.partiton=x"], "did you mean 'partition'"),
            (["--set", "slurm.time=soon"], "a time limit such as"),
            (["--set", "slurm.extra=3"], "expected a list of script lines"),
            (["--set", "slurm.partition=a b"], "a partition name"),
            (["--set", "slurm.nodes=0", "--launcher", "slurm"], "slurm.nodes: expected an integer in [1, 10000]"),
            (["--set", "sweep.launcher=cloud"], "sweep.launcher: expected \"local\" or \"slurm\""),
        ]
        for args, message in cases:
            r = run(["sweep", "s.toml", "--dry-run", *args], self.dir)
            self.assertEqual(r.returncode, 2, str(args) + r.stdout + r.stderr)
            self.assertIn(message, r.stderr, args)
        # The same file is fine for the slurm launcher (no cluster is asked: --dry-run).
        r = run(["sweep", "s.toml", "--dry-run", "--launcher", "slurm"], self.dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("[slurm: 1 node(s) x 2 task(s)]", r.stdout)
        self.write("t.toml", 'base = "base.toml"\n[[sweep.arms]]\n"slurm.memory" = 3\n')
        r = run(["sweep", "t.toml", "--dry-run", "--launcher", "slurm"], self.dir)
        self.assertEqual(r.returncode, 2)
        self.assertIn("an arm may set slurm.nodes", r.stderr)

    def test_status_of_a_local_sweep_and_bad_sweep_arm_calls(self):
        self.write("l.toml", 'base = "base.toml"\n[sweep.set]\n"run.steps" = 4\n[sweep.grid]\n"optimizer.lr" = [1e-3, 2e-3]\n')
        self.assertEqual(run(["sweep", "l.toml", "--out", "out"], self.dir).returncode, 0)
        r = run(["sweep", "--status", "out"], self.dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stdout, r"0\.001 +completed +0 +4 ")
        self.assertIn("arms: 2 completed", r.stdout)
        self.assertEqual(run(["sweep", "l.toml", "--status", "--out", "out"], self.dir).stdout, r.stdout)
        bad = run(["sweep-arm", "out", "7"], self.dir)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("has 2 arm(s)", bad.stderr)
        with open(os.path.join(self.dir, "out", "plan.json"), "w") as f:
            f.write('{"base": 3}')
        bad = run(["sweep-arm", "out", "0"], self.dir)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("plan.json", bad.stderr)


EARLY = """
base = "base.toml"
[sweep]
name = "es"
[sweep.set]                # long enough that the stop lands well before the end, on a loaded machine too
"run.steps" = 300
[sweep.early_stop]
rungs = [10, 20]
fraction = 0.5
[[sweep.arms]]
name = "best"
"optimizer.lr" = 3e-3
[[sweep.arms]]
name = "hopeless"
"optimizer.lr" = 1e-7
[[sweep.arms]]
name = "second"
"optimizer.lr" = 1.5e-3
"""


class EarlyStopping(Base):
    def test_a_hopeless_arm_is_stopped_and_the_best_survives(self):
        self.write("es.toml", EARLY)
        r = run(["sweep", "es.toml", "--out", "out"], self.dir)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("hopeless: early stopping at rung 10", r.stdout)
        out = os.path.join(self.dir, "out")
        arms = {}
        for name in ("best", "hopeless", "second"):
            with open(os.path.join(out, name, "arm.json")) as f:
                arms[name] = json.load(f)
        self.assertEqual(arms["best"]["status"], "completed")
        self.assertEqual(arms["hopeless"]["status"], "stopped")
        self.assertGreaterEqual(arms["hopeless"]["stopped_at"], 10)
        self.assertLess(arms["hopeless"]["stopped_at"], 300)
        # The rung's value is the hopeless arm's validation loss at step 10, as its log has it.
        with open(os.path.join(out, "hopeless", "metrics.jsonl")) as f:
            val10 = [json.loads(l)["val_loss"] for l in f if '"val_loss"' in l and json.loads(l)["step"] == 10][0]
        self.assertEqual(arms["hopeless"]["rungs"]["10"], val10)
        self.assertGreater(val10, arms["best"]["rungs"]["10"])
        # The first arm is compared with nobody: it always passes; the best keeps every rung.
        self.assertEqual(sorted(arms["best"]["rungs"]), ["10", "20"])
        with open(os.path.join(out, "results.json")) as f:
            rows = {r["arm"]: r for r in json.load(f)["arms"]}
        self.assertEqual(rows["hopeless"]["status"], "stopped")
        self.assertEqual(rows["best"]["status"], "completed")
        with open(os.path.join(out, "report.md")) as f:
            report = f.read()
        self.assertIn("Arms stopped early", report)
        self.assertIn("- hopeless: early stopping at rung 10", report)
        # Started again: the stopped arm is finished, not retrained.
        again = run(["sweep", "es.toml", "--out", "out"], self.dir)
        self.assertEqual(again.returncode, 0, again.stderr)
        self.assertIn("hopeless: already stopped early, skipped", again.stdout)
        self.assertNotIn("training", again.stdout)

    def test_bad_rules_are_input_errors(self):
        cases = {
            "rungs = [10, 40]\n": "not before the arm's last step",
            "rungs = [20, 10]\n": "increasing",
            "rungs = [10]\nfraction = 1.5\n": "sweep.early_stop.fraction",
            "rungs = [10]\nmin_arms = 1\n": "sweep.early_stop.min_arms",
            "fraction = 0.5\n": "missing `rungs",
            "rungs = [10]\nfractoin = 0.5\n": "did you mean 'fraction'",
        }
        for body, message in cases.items():
            self.write("bad.toml", 'base = "base.toml"\n[sweep.early_stop]\n' + body)
            r = run(["sweep", "bad.toml", "--dry-run"], self.dir)
            self.assertEqual(r.returncode, 2, body + r.stderr)
            self.assertIn(message, r.stderr, body)
        self.write("bad.toml", 'base = "base.toml"\n[sweep.set]\n"run.eval_every" = 0\n[sweep.early_stop]\nrungs = [10]\n')
        r = run(["sweep", "bad.toml", "--dry-run"], self.dir)
        self.assertEqual(r.returncode, 2)
        self.assertIn("never evaluates", r.stderr)


# Long enough for the live block to be redrawn while an arm trains on a fast machine (an arm of 400
# steps took 0.8 s, finishing before a progress line was drawn).
PROGRESS = """
base = "base.toml"
[sweep]
name = "progress"
[sweep.set]
"run.steps" = 2000
"run.eval_every" = 500
[sweep.grid]
"optimizer.lr" = [3e-3, 1e-3]
"""


def run_in_pty(argv, cwd, timeout=300):
    """Runs argv with a pseudo-terminal as stdout/stderr; returns (exit code, everything it wrote)."""
    master, slave = pty.openpty()
    p = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    chunks = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the other side closed
                break
            if not data:
                break
            chunks.append(data)
        elif p.poll() is not None:
            break
    os.close(master)
    return p.wait(timeout=30), b"".join(chunks).decode("utf-8", "replace")


class Progress(Base):
    def test_live_block_on_a_terminal(self):
        self.write("p.toml", PROGRESS)
        code, text = run_in_pty([ABLATE, "sweep", "p.toml", "--out", "out"], self.dir)
        self.assertEqual(code, 0, text)
        self.assertIn("\x1b[", text)  # the block is redrawn in place
        self.assertRegex(text, r"step \d+/2000  loss \d+\.\d{4}  ETA \d+:\d\d")
        self.assertRegex(text, r"arms: 0/2 done, 0 failed, 0 stopped, 1 running, 1 waiting")
        self.assertIn("[2/2] 0.001: done", text)
        # The block is gone at the end: the last line printed is the results line.
        tail = text.rstrip().splitlines()[-1]
        self.assertIn("results:", tail)

    def test_a_line_per_event_in_a_log(self):
        self.write("p.toml", PROGRESS.replace('"run.steps" = 2000', '"run.steps" = 30').replace('"run.eval_every" = 500', '"run.eval_every" = 10'))
        r = run(["sweep", "p.toml", "--out", "out"], self.dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("\x1b", r.stdout)
        lines = r.stdout.splitlines()
        self.assertEqual(sum(1 for l in lines if ": training, log " in l), 2)
        self.assertEqual(sum(1 for l in lines if re.match(r"^\[\d/2\] .*: done, loss ", l)), 2)
        self.assertNotIn("ETA", r.stdout)


if __name__ == "__main__":
    ABLATE = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
