#!/usr/bin/env python3
"""[[eval]] during training, in every output, on checkpoints, on bad files and in sweeps.

On tiny quickstart runs (synthetic probe logs, CPU):
- the probe-grammar multiple-choice eval (configs/evals/probe-rows.jsonl) is turned on with
  --set; its accuracy at the last step is well above its accuracy after the first steps;
- the run's training losses are the same bits with and without the evaluations;
- metrics.jsonl, metrics.csv and summary.json carry eval/<label>/<metric> (with time_s);
- `ablate eval --eval probe_rows` on the final checkpoint gives summary.json's accuracy, and a
  planted label file (labels made from its own per-item choices, k of n right) gives exactly k/n;
- heldout_loss on two planted shards equals `ablate eval --tokens` on each, and its bits per byte
  equal the loss over the bytes of the probe text the targets stand for (counted here);
- generate_match's generations equal `ablate sample --temperature 0` from the same prompts;
- bad task files are exit 2 naming the file, line and field, before anything trains;
- a sweep of two arms x two repeats ranks its arms by the eval with intervals in report.md and
  results.json.

usage: test_evals.py ABLATE_BINARY QUICKSTART_CONFIG
"""
import csv
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

ABLATE, CONFIG = sys.argv[1], sys.argv[2]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(CONFIG)))
ROWS = os.path.join(ROOT, "configs", "evals", "probe-rows.jsonl")
TINY = ["model.d_model=64", "model.n_layers=2", "model.n_heads=2", "model.max_seq_len=128", "batching.batch_size=8",
        "batching.seq_len=128", "run.threads=2", "run.steps=150", "run.eval_every=50", "run.eval_batches=2",
        "schedule.warmup_steps=10", "data.synthetic_probes.documents=4000", "checkpoint.every=0", "logging.sinks=jsonl,csv"]
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run(cmd, expect=0):
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if r.returncode != expect:
        print(" ".join(cmd), "\nexit", r.returncode, "\n", r.stdout[-3000:], r.stderr[-3000:])
        sys.exit(1)
    return r


def sets(items):
    return sum((["--set", s] for s in items), [])


def train(rd, extra):
    return run([ABLATE, "train", CONFIG, "--run-dir", rd, *sets(TINY + extra)])


def jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# Probe text form (plugins/synthetic_probes): the bytes a token stands for.
def probe_bytes(token):
    if token < 15:
        return 1
    if token == 15:
        return len("<eot>")
    return len("h" + str(token - 16))


def write_shard(path, tokens):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def training_and_outputs(tmp):
    on = ["eval.probe_rows.enabled=true", "eval.probe_rows.every=10", "eval.probe_coordinates.enabled=true"]
    rd_eval, rd_plain = os.path.join(tmp, "with-evals"), os.path.join(tmp, "without")
    log = train(rd_eval, on).stderr
    train(rd_plain, [])
    m_eval, m_plain = jsonl(os.path.join(rd_eval, "metrics.jsonl")), jsonl(os.path.join(rd_plain, "metrics.jsonl"))
    losses = lambda m: [(x["step"], x["loss"]) for x in m]  # noqa: E731
    check(losses(m_eval) == losses(m_plain) and len(m_plain) == 150,
          "training losses are the same bits with and without evaluations (150 steps)")
    acc = [(x["step"], x["eval/probe_rows/acc"]) for x in m_eval if "eval/probe_rows/acc" in x]
    check([s for s, _ in acc] == list(range(10, 151, 10)), f"probe_rows evaluated every 10 steps: {[s for s, _ in acc]}")
    last = acc[-1][1]
    early, late = sum(a for _, a in acc[:2]) / 2, sum(a for _, a in acc[-3:]) / 3  # chance is 0.25
    print(f"     probe_rows accuracy: {' '.join(f'{s}:{a:.3f}' for s, a in acc)}")
    check(late >= early + 0.2 and late >= 0.55,
          f"the accuracy rises over training: {early:.3f} over steps 10-20 -> {late:.3f} over steps 130-150")
    rows_last = next(x for x in reversed(m_eval) if "eval/probe_rows/acc" in x)
    check(rows_last["eval/probe_rows/acc_low"] < last < rows_last["eval/probe_rows/acc_high"]
          and rows_last["eval/probe_rows/items"] == 200, "the accuracy comes with its interval and item count")
    coords = [x["step"] for x in m_eval if "eval/probe_coordinates/match" in x]
    check(coords == [50, 100, 150], f"probe_coordinates evaluated with the validation loss: {coords}")
    check("eval probe_rows at step 150: acc" in log, "the log names each evaluation")
    with open(os.path.join(rd_eval, "metrics.csv")) as f:
        table = list(csv.DictReader(f))
    header = list(table[0].keys())
    check("eval/probe_rows/acc" in header and "eval/probe_rows/time_s" in header and "eval/probe_coordinates/match" in header,
          "metrics.csv has a column per evaluation metric")
    row150 = next(r for r in table if r["step"] == "150")
    check(float(row150["eval/probe_rows/acc"]) == last, "metrics.csv holds the same accuracy as metrics.jsonl")
    summary = json.load(open(os.path.join(rd_eval, "summary.json")))
    ev = summary.get("evals", {}).get("probe_rows", {})
    check(ev.get("metrics", {}).get("acc") == last and ev.get("primary") == "acc" and ev.get("higher_is_better") is True
          and ev.get("evaluations") == 15 and ev.get("time_s", 0) > 0, "summary.json's evals hold the last accuracy and the time")
    check("evals" not in json.load(open(os.path.join(rd_plain, "summary.json"))), "a run without evaluations has no evals")
    return rd_eval, last


def checkpoint_evals(tmp, rd, last):
    out = json.loads(run([ABLATE, "eval", "--checkpoint", rd, "--eval", "probe_rows", "--json",
                          "--details", os.path.join(tmp, "details.jsonl")]).stdout)
    check(out["metrics"]["acc"] == last and out["step"] == 150, f"ablate eval --eval gives the run's last accuracy ({out['metrics']['acc']})")
    details = jsonl(os.path.join(tmp, "details.jsonl"))
    items = jsonl(ROWS)
    check(len(details) == 200 and all(d["choice_mean"] == max(range(4), key=lambda e: d["loglik_mean"][e]) for d in details),
          "--details holds every item's scores and choices")
    # Planted labels: the first k items labelled with the model's own choice, the rest with another.
    k = 37
    planted = os.path.join(tmp, "planted.jsonl")
    with open(planted, "w") as f:
        for i, (item, d) in enumerate(zip(items, details)):
            item = dict(item, label=d["choice_mean"] if i < k else (d["choice_mean"] + 1) % 4)
            f.write(json.dumps(item) + "\n")
    out = json.loads(run([ABLATE, "eval", "--checkpoint", rd, "--eval", "probe_rows", "--json",
                          "--set", f"eval.probe_rows.path={planted}"]).stdout)
    check(out["metrics"]["acc"] == k / 200, f"a planted label file gives its accuracy: {out['metrics']['acc']} == {k}/200")
    r = run([ABLATE, "eval", "--checkpoint", rd, "--eval", "probe_rows", "--set", "model.d_model=32"], expect=2)
    check("--set" in r.stderr and "eval." in r.stderr, "ablate eval --set refuses keys outside [[eval]]")
    r = run([ABLATE, "eval", "--checkpoint", rd, "--eval", "nope"], expect=2)
    check("probe_rows" in r.stderr, "an unknown --eval label is exit 2 listing the labels")


def heldout_and_generation(tmp, rd):
    # Two domains of probe-like token streams (any ids < 80 are valid probe tokens).
    web = [(i * 7 + i // 5) % 80 for i in range(129 * 6)]
    code = [(i * 13 + 3) % 80 for i in range(129 * 4 + 50)]
    write_shard(os.path.join(tmp, "web.bin"), web)
    write_shard(os.path.join(tmp, "code.bin"), code)
    cfg = os.path.join(tmp, "heldout.toml")
    with open(CONFIG) as f:
        text = f.read()
    with open(cfg, "w") as f:
        f.write(text + f'\n[[eval]]\nname = "heldout_loss"\nlabel = "domains"\nnames = ["web", "code"]\n'
                       f'paths = ["{tmp}/web.bin", "{tmp}/code.bin"]\nseq_len = 128\n')
    rd2 = os.path.join(tmp, "heldout-run")
    run([ABLATE, "train", cfg, "--run-dir", rd2, *sets(TINY + ["run.steps=20", "eval.probe_coordinates.enabled=true"])])
    m = jsonl(os.path.join(rd2, "metrics.jsonl"))[-1]
    for name, tokens in (("web", web), ("code", code)):
        ref = json.loads(run([ABLATE, "eval", "--checkpoint", rd2, "--tokens", os.path.join(tmp, name + ".bin"), "--seq-len", "128",
                              "--json"]).stdout)
        loss = m[f"eval/domains/{name}_loss"]
        check(abs(loss - ref["loss"]) <= 1e-6 * abs(ref["loss"]) and m[f"eval/domains/{name}_tokens"] == ref["tokens"],
              f"heldout_loss {name}: {loss:.6f} == ablate eval --tokens {ref['loss']:.6f} over {ref['tokens']} tokens")
        windows = len(tokens) // 129
        nbytes = sum(probe_bytes(t) for w in range(windows) for t in tokens[w * 129 + 1:(w + 1) * 129])
        bpb = loss * ref["tokens"] / math.log(2) / nbytes
        check(abs(m[f"eval/domains/{name}_bpb"] - bpb) <= 1e-9 * bpb, f"heldout_loss {name}: bits per byte over {nbytes} bytes")
    total = (m["eval/domains/web_loss"] * m["eval/domains/web_tokens"] + m["eval/domains/code_loss"] * m["eval/domains/code_tokens"]) / (
        m["eval/domains/web_tokens"] + m["eval/domains/code_tokens"])
    check(abs(m["eval/domains/loss"] - total) <= 1e-9, "heldout_loss's loss weighs the domains by their tokens")
    # generate_match against greedy sampling from the same checkpoint.
    details = os.path.join(tmp, "gen.jsonl")
    run([ABLATE, "eval", "--checkpoint", rd, "--eval", "probe_coordinates", "--details", details])
    same = 0
    gens = jsonl(details)
    for g in gens[:6]:
        r = run([ABLATE, "sample", "--checkpoint", rd, "--prompt", g["prompt"], "--temperature", "0", "--tokens",
                 str(len(g["generated_tokens"]))])
        same += r.stdout.startswith(g["prompt"] + g["generated"]) or r.stdout.rstrip("\n") == (g["prompt"] + g["generated"]).rstrip("\n")
    check(same == 6 and len(gens) == 64, f"generate_match's generations are greedy sampling's ({same} of 6)")


BAD = [
    ("not-json.jsonl", '{"context": "#h1 2 3\\n", "endings": ["h2 1 1.0\\n", "h3 1 1.0\\n"], "label": 0}\n{oops\n', ":2", "JSON"),
    ("no-endings.jsonl", '{"context": "#h1 2 3\\n", "label": 0}\n', ":1", "endings"),
    ("label.jsonl", '{"context": "#h1 2 3\\n", "endings": ["h2 1 1.0\\n", "h3 1 1.0\\n"], "label": 0}\n'
                    '{"context": "#h1 2 3\\n", "endings": ["h2 1 1.0\\n", "h3 1 1.0\\n"], "label": 2}\n', ":2", "label"),
    ("alphabet.jsonl", '{"context": "#h1 2 3\\n", "endings": ["h2 1 1.0\\n", "x"], "label": 0}\n', ":1", "endings[1]"),
    ("empty-line.jsonl", '{"context": "#h1 2 3\\n", "endings": ["h2 1 1.0\\n", "h3 1 1.0\\n"], "label": 0}\n\n', ":2", "empty"),
    ("host.jsonl", '{"context": "#h99 2 3\\n", "endings": ["h2 1 1.0\\n", "h3 1 1.0\\n"], "label": 0}\n', ":1", "context"),
]


def bad_files(tmp):
    for name, text, line, field in BAD:
        path = os.path.join(tmp, name)
        with open(path, "w") as f:
            f.write(text)
        rd = os.path.join(tmp, "bad-" + name)
        r = run([ABLATE, "train", CONFIG, "--run-dir", rd, *sets(TINY + ["eval.probe_rows.enabled=true", f"eval.probe_rows.path={path}"])],
                expect=2)
        trained = os.path.exists(os.path.join(rd, "metrics.jsonl")) and os.path.getsize(os.path.join(rd, "metrics.jsonl")) > 0
        check(path + line in r.stderr and field in r.stderr and not trained, f"{name}: exit 2 naming {name}{line} and '{field}'")
    # An evaluator's keys are checked where it runs: a disabled table with an empty path trains.
    run([ABLATE, "train", CONFIG, "--run-dir", os.path.join(tmp, "disabled"), *sets(TINY + ["run.steps=2", "eval.probe_rows.path="])])
    r = run([ABLATE, "train", CONFIG, "--run-dir", os.path.join(tmp, "empty-path"),
             *sets(TINY + ["eval.probe_rows.path=", "eval.probe_rows.enabled=true"])], expect=2)
    check("eval.probe_rows.path" in r.stderr, "an enabled table with an empty path is exit 2 naming the key")
    r = run([ABLATE, "train", CONFIG, "--run-dir", os.path.join(tmp, "bad-key"), *sets(TINY + ["eval.probe_rows.normalisation=sum"])],
            expect=2)
    check("normalization" in r.stderr, "a misspelled evaluator key is exit 2 with a suggestion")
    cfg = os.path.join(tmp, "dup.toml")
    with open(CONFIG) as f:
        text = f.read()
    with open(cfg, "w") as f:
        f.write(text + '\n[[eval]]\nname = "multiple_choice"\nlabel = "probe_rows"\npath = "x.jsonl"\n')
    r = run([ABLATE, "train", cfg, "--run-dir", os.path.join(tmp, "dup")], expect=2)
    check("dup.toml:" in r.stderr and "label" in r.stderr, "two [[eval]] of one label are exit 2 naming the file and line")


def sweep(tmp):
    spec = os.path.join(tmp, "sweep.toml")
    settings = TINY + ["run.steps=60", "run.eval_every=30", "eval.probe_rows.enabled=true"]
    with open(spec, "w") as f:
        f.write(f'base = "{os.path.abspath(CONFIG)}"\n[sweep]\nname = "evals"\nrepeats = 2\n[sweep.set]\n')
        for key, value in dict(s.split("=", 1) for s in settings).items():  # later settings win
            f.write(f'"{key}" = {value if value[0].isdigit() or value in ("true", "false") else json.dumps(value.split(","))}\n')
        f.write('[sweep.grid]\n"optimizer.lr" = [3e-3, 1e-5]\n')
    out = os.path.join(tmp, "sweep-out")
    run([ABLATE, "sweep", spec, "--out", out, "--parallel", "2"])
    results = json.load(open(os.path.join(out, "results.json")))
    groups = {g["group"]: g for g in results["groups"]}
    fast = next(g for name, g in groups.items() if "0.003" in name or "3e-03" in name or "3e-3" in name)
    slow = next(g for g in groups.values() if g is not fast)
    key = "eval/probe_rows/acc"
    check(fast.get(key + "_n") == 2 and fast.get(key + "_ci_low") is not None and key + "_verdict" in slow,
          "results.json's groups carry the eval's mean, interval and verdict")
    report = open(os.path.join(out, "report.md")).read()
    check("Highest probe_rows acc" in report and "probe_rows acc" in report, "report.md ranks the arms by the eval")
    with open(os.path.join(out, "results.csv")) as f:
        check(key + "_mean" in f.readline(), "results.csv has the eval's columns")
    check(os.path.getsize(os.path.join(out, "evals.png")) > 10000 and "![Evaluations against step](evals.png)" in report,
          "the report draws each evaluation against step (evals.png)")


def main():
    if os.environ.get("ONLY_SWEEP"):
        tmp = os.environ["ONLY_SWEEP"]
        os.makedirs(tmp, exist_ok=True)
        sweep(tmp)
        return 1 if failures else 0
    with tempfile.TemporaryDirectory() as tmp:
        rd, last = training_and_outputs(tmp)
        checkpoint_evals(tmp, rd, last)
        heldout_and_generation(tmp, rd)
        bad_files(tmp)
        sweep(tmp)
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
