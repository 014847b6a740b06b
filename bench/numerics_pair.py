#!/usr/bin/env python3
"""Two training runs of one experiment in two precisions, compared as a numerics check: the mean
training loss of the last N steps (default 100) and the last validation loss of a candidate run
(say run.dtype = "bf16", or FP8 later) against a reference run (run.dtype = "fp32").

  numerics_pair.py --reference RUN_DIR --candidate RUN_DIR [--last 100] [--max-loss-gap 0.02]
                   [--max-val-rel 0.01] [--json OUT.json] [--plot OUT.png]

A pass needs |mean_c - mean_r| <= max-loss-gap nats and |val_c - val_r| / val_r <= max-val-rel,
over the same steps (the runs must have the same number). The JSON holds both curves (step,
loss), the means, the validation losses, the gaps and the verdict; the plot (when matplotlib is
there) draws both curves and the window. Exit 0 on a pass, 1 on a fail, 2 on bad input (a run
directory without metrics.jsonl, runs of different lengths, a window longer than the runs)."""
import argparse
import json
import sys
from pathlib import Path


def fail_input(message):
    print(f"numerics_pair: {message}", file=sys.stderr)
    sys.exit(2)


def read_run(path):
    """(steps, losses, last validation loss or None) from RUN_DIR/metrics.jsonl."""
    metrics = Path(path) / "metrics.jsonl"
    if not metrics.is_file():
        fail_input(f"{metrics}: no such file (expected a run directory written by ablate train)")
    steps, losses, val = [], [], None
    for number, line in enumerate(metrics.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            step, loss = int(row["step"]), float(row["loss"])
        except (ValueError, KeyError, TypeError) as e:
            fail_input(f"{metrics}:{number}: expected a JSON object with step and loss ({e})")
        steps.append(step)
        losses.append(loss)
        if "val_loss" in row:
            val = float(row["val_loss"])
    if not steps:
        fail_input(f"{metrics}: no steps")
    return steps, losses, val


def compare(reference, candidate, last, max_loss_gap, max_val_rel):
    rs, rl, rv = reference
    cs, cl, cv = candidate
    if rs != cs:
        fail_input(f"the runs have different steps ({len(rs)} and {len(cs)}, last {rs[-1]} and {cs[-1]}): "
                   "train both for the same steps")
    if last > len(rs):
        fail_input(f"--last {last} is more than the runs' {len(rs)} steps")
    mean_r, mean_c = sum(rl[-last:]) / last, sum(cl[-last:]) / last
    out = {
        "steps": len(rs),
        "last": last,
        "reference_mean_loss": mean_r,
        "candidate_mean_loss": mean_c,
        "mean_loss_gap": mean_c - mean_r,
        "max_loss_gap": max_loss_gap,
        "reference_val_loss": rv,
        "candidate_val_loss": cv,
        "max_val_rel": max_val_rel,
    }
    loss_ok = abs(mean_c - mean_r) <= max_loss_gap
    if rv is not None and cv is not None:
        out["val_rel_gap"] = (cv - rv) / rv
        val_ok = abs(cv - rv) <= max_val_rel * abs(rv)
    else:
        out["val_rel_gap"] = None
        val_ok = False  # a check without its validation loss is not a pass
        out["note"] = "a run has no validation loss (run.eval_every = 0?)"
    out["loss_ok"], out["val_ok"] = loss_ok, val_ok
    out["verdict"] = "pass" if loss_ok and val_ok else "fail"
    return out


def plot(path, reference, candidate, names, last):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("numerics_pair: matplotlib is not installed; no plot", file=sys.stderr)
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    for (steps, losses, _), name in zip((reference, candidate), names):
        ax.plot(steps, losses, label=name, linewidth=1)
    ax.axvspan(reference[0][-last], reference[0][-1], color="0.9", label=f"last {last} steps")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reference", required=True)
    p.add_argument("--candidate", required=True)
    p.add_argument("--last", type=int, default=100)
    p.add_argument("--max-loss-gap", type=float, default=0.02)
    p.add_argument("--max-val-rel", type=float, default=0.01)
    p.add_argument("--json")
    p.add_argument("--plot")
    a = p.parse_args()
    if a.last < 1:
        fail_input(f"--last {a.last}: expected a number of steps >= 1")
    reference, candidate = read_run(a.reference), read_run(a.candidate)
    out = compare(reference, candidate, a.last, a.max_loss_gap, a.max_val_rel)
    out["reference"], out["candidate"] = str(a.reference), str(a.candidate)
    out["curves"] = {"reference": [[s, l] for s, l in zip(reference[0], reference[1])],
                     "candidate": [[s, l] for s, l in zip(candidate[0], candidate[1])]}
    if a.plot:
        out["plot"] = a.plot if plot(a.plot, reference, candidate, (Path(a.reference).name, Path(a.candidate).name), a.last) else None
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    val = f"{out['val_rel_gap']:+.2%}" if out["val_rel_gap"] is not None else "none"
    print(f"numerics_pair: last {a.last} of {out['steps']} steps: mean loss {out['reference_mean_loss']:.4f} (reference) "
          f"vs {out['candidate_mean_loss']:.4f} (candidate), gap {out['mean_loss_gap']:+.4f} nats (bound {a.max_loss_gap}); "
          f"validation loss gap {val} (bound {a.max_val_rel:.0%}): {out['verdict']}")
    return 0 if out["verdict"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
