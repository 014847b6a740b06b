#!/usr/bin/env python3
"""multiple_choice's scores equal Hugging Face transformers' on the exported model.

For a GPT-2-shaped and a Llama-shaped tiny model trained a few steps on the probe logs: export it
(`ablate export --format hf`), score the first 60 items of configs/evals/probe-rows.jsonl with
`ablate eval --eval probe_rows --details`, then in transformers (float64) compute every ending's
summed and mean log-likelihood given its context from token ids this script makes from the item's
text with its own probe-log tokenizer; each must match ablate's within 1e-5, and so must the
choices and the accuracy.
Fails (exit 1) where torch or transformers are missing: scripts/setup-tests.sh installs them.

usage: check_eval_transformers.py ABLATE_BINARY QUICKSTART_CONFIG
"""
import json
import os
import re
import sys
import tempfile

from hf_tiny import SHAPES, TINY, load, run  # first: it says what is missing

import torch

ITEMS = 60
MAX_SEQ_LEN = int(next(x for x in TINY if x.startswith("model.max_seq_len=")).split("=")[1])
TOL = 1e-5


def probe_tokens(text):
    """The probe logs' text form (plugins/synthetic_probes): digits 0-9, ' ' 10, newline 11, '.' 12,
    '-' 13, '#' 14, <eot> 15, host h<N> 16 + N."""
    out = []
    for m in re.finditer(r"h(\d+)|<eot>|(.)", text, re.S):
        if m.group(1) is not None:
            out.append(16 + int(m.group(1)))
        elif m.group(0) == "<eot>":
            out.append(15)
        else:
            out.append({" ": 10, "\n": 11, ".": 12, "-": 13, "#": 14}.get(m.group(0), None) if not m.group(0).isdigit()
                       else int(m.group(0)))
    assert None not in out, text
    return out


def load_double(directory):
    return load(directory).double().eval()


def loglik(model, context, ending, max_seq_len):
    """Summed log-probability of `ending`'s tokens given `context`'s, in float64; the context cut
    from the left so that context and ending minus the last token fit max_seq_len positions (as
    docs/experiments.md says multiple_choice does)."""
    context = context[-(max_seq_len + 1 - len(ending)):]
    ids = torch.tensor([context + ending])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids[:, :-1]).logits[0].double(), dim=-1)
    return sum(logp[len(context) - 1 + j, t].item() for j, t in enumerate(ending))


def main():
    ablate, config = sys.argv[1], sys.argv[2]
    root = os.path.dirname(os.path.dirname(os.path.abspath(config)))
    with open(os.path.join(root, "configs", "evals", "probe-rows.jsonl")) as f:
        items = [json.loads(line) for line in f][:ITEMS]
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("gpt2", "llama"):
            extra = SHAPES[name]
            rd, out, det = os.path.join(tmp, name), os.path.join(tmp, name + "-hf"), os.path.join(tmp, name + ".jsonl")
            sets = sum((["--set", s] for s in TINY + extra + ["run.steps=40"]), [])
            run([ablate, "train", config, "--run-dir", rd, *sets])
            run([ablate, "export", "--checkpoint", rd, "--format", "hf", "--out", out])
            ours = json.loads(run([ablate, "eval", "--checkpoint", rd, "--eval", "probe_rows", "--json", "--details", det,
                                   "--set", f"eval.probe_rows.limit={ITEMS}",
                                   "--set", f"eval.probe_rows.path={os.path.join(root, 'configs', 'evals', 'probe-rows.jsonl')}"]))
            with open(det) as f:
                details = [json.loads(line) for line in f]
            model = load_double(out)
            worst, bad_tokens, right_sum, right_mean = 0.0, 0, 0, 0
            for item, d in zip(items, details):
                context = probe_tokens(item["context"])
                endings = [probe_tokens(e) for e in item["endings"]]
                bad_tokens += context != d["context_tokens"] or endings != d["ending_tokens"]
                sums = [loglik(model, context, e, MAX_SEQ_LEN) for e in endings]
                means = [s / len(e) for s, e in zip(sums, endings)]
                worst = max([worst] + [abs(a - b) for a, b in zip(sums, d["loglik_sum"])] +
                            [abs(a - b) for a, b in zip(means, d["loglik_mean"])])
                right_sum += max(range(len(sums)), key=lambda e: sums[e]) == item["label"]
                right_mean += max(range(len(means)), key=lambda e: means[e]) == item["label"]
            acc = right_mean / len(details)
            ok = (len(details) == ITEMS and bad_tokens == 0 and worst <= TOL and abs(acc - ours["metrics"]["acc"]) < 1e-12
                  and abs(right_sum / len(details) - ours["metrics"]["acc_sum"]) < 1e-12)
            print(f"{name}: {len(details)} items x 4 endings: largest log-likelihood difference {worst:.2e} (tolerance {TOL}), "
                  f"token mismatches {bad_tokens}, accuracy transformers {acc:.4f} / ablate {ours['metrics']['acc']:.4f}, "
                  f"by sum {right_sum / len(details):.4f} / {ours['metrics']['acc_sum']:.4f}: {'ok' if ok else 'MISMATCH'}")
            failures += not ok
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
