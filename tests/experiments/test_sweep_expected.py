#!/usr/bin/env python3
"""[[sweep.arms]] expected: a claimed speed-up set beside the measured one, and the GPU sweeps.

- A CPU sweep of three batchers x 2 repeats whose arms carry `expected`: results.json keeps the
  claims; report.md's "Expected against measured" gives each arm's claim, the measured ratio of
  real tokens/s over the arm before it with the interval this script computes from the arms'
  summaries (Welch's t on the logs), a verdict, and both multiplied up from the first arm.
- A bad `expected` (not a number, not > 0, on the first arm) is exit 2 naming the file and line.
- configs/sweep-optimisations-gpu.toml and configs/sweep-packing-gpu.toml validate arm by arm
  (`ablate sweep --dry-run`, with the cuda plugins of the emulated device where no GPU is here).

usage: test_sweep_expected.py ABLATE_BINARY QUICKSTART_CONFIG
"""
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile

ABLATE, CONFIG = sys.argv[1], sys.argv[2]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(CONFIG)))
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run(cmd, expect=0, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    if r.returncode != expect:
        print(" ".join(cmd), "\nexit", r.returncode, "\n", r.stdout[-3000:], r.stderr[-3000:])
        sys.exit(1)
    return r


SWEEP = f'''base = "{os.path.abspath(CONFIG)}"
[sweep]
name = "expected"
repeats = 2
[sweep.set]
"run.steps" = 12
"run.eval_every" = 0
"run.threads" = 1
"checkpoint.every" = 0
"model.d_model" = 32
"model.n_layers" = 1
"model.n_heads" = 2
"model.max_seq_len" = 256
"logging.sinks" = ["jsonl"]
[[sweep.arms]]
name = "padded"
"batching.name" = "padded"
[[sweep.arms]]
name = "bucketed"
expected = 2.5
"batching.name" = "bucketed"
[[sweep.arms]]
name = "packed"
expected = 1.25
"batching.name" = "packed"
'''


def incomplete_beta(x, a, b):
    """I_x(a, b), the regularized incomplete beta function (continued fraction, Numerical Recipes'
    betacf, on the side of x where it converges fast)."""
    if x <= 0 or x >= 1:
        return 0.0 if x <= 0 else 1.0
    if x > (a + 1) / (a + b + 2):
        return 1 - incomplete_beta(1 - x, b, a)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(1 - x)) / a
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / d
    h = d
    for m in range(1, 500):
        for aa in (m * (b - m) * x / ((a - 1 + 2 * m) * (a + 2 * m)), -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 1 + 2 * m))):
            d, c = 1 / (1 + aa * d), 1 + aa / c
            h *= d * c
    return front * h


def t975(df):
    """Student's t 0.975 quantile (bisection on its CDF: P(|T| > t) = I_{df/(df+t^2)}(df/2, 1/2))."""
    lo, hi = 0.0, 1000.0
    for _ in range(200):
        mid = (lo + hi) / 2
        cdf = 1 - 0.5 * incomplete_beta(df / (df + mid * mid), df / 2, 0.5)
        lo, hi = (mid, hi) if cdf < 0.975 else (lo, mid)
    return (lo + hi) / 2


def welch_ratio(a, b):
    la, lb = [math.log(x) for x in a], [math.log(x) for x in b]
    va, vb = statistics.variance(la) / len(la), statistics.variance(lb) / len(lb)
    d = statistics.mean(la) - statistics.mean(lb)
    df = (va + vb) ** 2 / (va * va / (len(la) - 1) + vb * vb / (len(lb) - 1))
    half = t975(df) * math.sqrt(va + vb)
    return math.exp(d), math.exp(d - half), math.exp(d + half)


def fmt(v, near):
    return f"{v:.3f}" if abs(near - 1) < 0.1 else f"{v:.2f}"


def main():
    with tempfile.TemporaryDirectory() as tmp:
        spec, out = os.path.join(tmp, "sweep.toml"), os.path.join(tmp, "out")
        with open(spec, "w") as f:
            f.write(SWEEP)
        run([ABLATE, "sweep", spec, "--out", out, "--parallel", "2"])
        results = json.load(open(os.path.join(out, "results.json")))
        check(results.get("expected") == {"bucketed": 2.5, "packed": 1.25}, f"results.json keeps the claims: {results.get('expected')}")
        rates = {}
        for r in results["arms"]:
            rates.setdefault(r["group"], []).append(r["real_tokens_per_s"])
        report = open(os.path.join(out, "report.md")).read()
        check("## Expected against measured" in report, "report.md has the expected-against-measured section")
        rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
                for line in report.split("## Expected against measured")[1].splitlines() if line.startswith("| ") and "---" not in line}
        order = ["padded", "bucketed", "packed"]
        cumulative = 1.0
        for i, name in enumerate(order[1:], 1):
            value, low, high = welch_ratio(rates[name], rates[order[i - 1]])
            total = welch_ratio(rates[name], rates["padded"])
            claim = {"bucketed": 2.5, "packed": 1.25}[name]
            cumulative *= claim
            want_measured = f"{fmt(value, value)}x [{fmt(low, value)}, {fmt(high, value)}]"
            verdict = "less than expected" if high < claim else "more than expected" if low > claim else "as expected"
            row = rows.get(name, [])
            print(f"     {name}: {row}")
            check(len(row) == 5 and row[0] == f"{fmt(claim, claim)}x" and row[1] == want_measured and row[2].startswith(verdict)
                  and row[3] == f"{fmt(cumulative, cumulative)}x" and row[4].startswith(f"{fmt(total[0], total[0])}x"),
                  f"{name}: claim, measured {want_measured}, verdict '{verdict}', cumulative claim and measured")

        for bad, what in (('expected = "fast"', "a string"), ("expected = 0", "zero"), ("expected = -2", "negative")):
            text = SWEEP.replace("expected = 2.5", bad)
            with open(spec, "w") as f:
                f.write(text)
            r = run([ABLATE, "sweep", spec, "--out", os.path.join(tmp, "bad"), "--dry-run"], expect=2)
            line = text.splitlines().index(bad) + 1
            check(f"sweep.toml:{line}:" in r.stderr and "sweep.arms.expected" in r.stderr, f"expected = {what}: exit 2 naming line {line}")
        first = SWEEP.replace('name = "padded"\n', 'name = "padded"\nexpected = 2.0\n')
        with open(spec, "w") as f:
            f.write(first)
        r = run([ABLATE, "sweep", spec, "--out", os.path.join(tmp, "bad"), "--dry-run"], expect=2)
        check("first arm" in r.stderr, "expected on the first arm is exit 2")

        # The emulated device has no cuDNN: the copies validated here name naive_cuda where the
        # files name cudnn_flash; every other key is the file's.
        env = dict(os.environ, ABLATE_EMULATE_CUDA="1")
        for name, arms in (("sweep-optimisations-gpu.toml", 6), ("sweep-packing-gpu.toml", 3)):
            with open(os.path.join(ROOT, "configs", name)) as f:
                text = f.read()
            check('base = "gpt2-124m.toml"' in text and text.count('"cudnn_flash"') >= 1, f"{name}: GPT-2 124M with cudnn_flash")
            copy = os.path.join(tmp, name)
            with open(copy, "w") as f:
                f.write(text.replace('base = "gpt2-124m.toml"', f'base = "{os.path.join(ROOT, "configs", "gpt2-124m.toml")}"')
                        .replace('"cudnn_flash"', '"naive_cuda"'))
            r = run([ABLATE, "sweep", copy, "--out", os.path.join(tmp, name + ".out"), "--dry-run"], env=env)
            listed = sum(1 for line in r.stdout.splitlines() if line.startswith("  ") and ": " in line)
            check(listed == 3 * arms, f"{name}: {listed} arm runs validated (expected {3 * arms})")
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
