#!/usr/bin/env python3
"""Draws the plots of an ablate report with matplotlib.

Called by `ablate report` / `ablate sweep` with one argument: a JSON file describing what to draw:
  {"out_dir": DIR, "title": str,
   "runs": [{"label": str, "group": str, "metrics": path to metrics.jsonl}, ...],
   "throughput": [{"group": str, "tokens_per_s": [...], "real_tokens_per_s": [...]}, ...]}
Writes DIR/loss_vs_step.png, DIR/loss_vs_time.png and DIR/throughput.png. Exits 3 when matplotlib
is missing, 2 on a bad description.
"""
import json
import sys


def load_metrics(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    return rows


def elapsed(rows):
    """Wall-clock seconds at each logged step: the trainer's elapsed_s, else the summed step times."""
    if rows and all("elapsed_s" in r for r in rows):
        return [r["elapsed_s"] for r in rows]
    out, t, prev = [], 0.0, 0
    for r in rows:
        t += r["step_ms"] / 1e3 * max(1, r["step"] - prev)
        prev = r["step"]
        out.append(t)
    return out


def main():
    if len(sys.argv) != 2:
        print("usage: ablate_plots.py SPEC.json", file=sys.stderr)
        return 2
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (python3 -m pip install matplotlib)", file=sys.stderr)
        return 3
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    out = spec["out_dir"]
    title = spec.get("title", "")
    runs = [(r["label"], r.get("group", r["label"]), load_metrics(r["metrics"])) for r in spec["runs"]]

    # One colour per group, so the repeats of an arm share it.
    groups = []
    for _, g, _ in runs:
        if g not in groups:
            groups.append(g)
    colours = {g: plt.cm.tab10(i % 10) for i, g in enumerate(groups)}

    for kind in ("step", "time"):
        fig, ax = plt.subplots(figsize=(8, 5))
        labelled = set()
        for label, group, rows in runs:
            if not rows:
                continue
            x = [r["step"] for r in rows] if kind == "step" else elapsed(rows)
            lab = group if group not in labelled else None
            labelled.add(group)
            ax.plot(x, [r["loss"] for r in rows], color=colours[group], lw=1.2, alpha=0.9, label=lab)
            val = [(xi, r["val_loss"]) for xi, r in zip(x, rows) if "val_loss" in r]
            if val:
                ax.plot([v[0] for v in val], [v[1] for v in val], color=colours[group], ls="--", marker="o", ms=3, lw=1)
        ax.set_xlabel("step" if kind == "step" else "wall-clock time (s)")
        ax.set_ylabel("loss (solid: training, dashed: validation)")
        ax.set_title(f"{title}: loss against {'step' if kind == 'step' else 'time'}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(f"{out}/loss_vs_{kind}.png", dpi=110)
        plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 5))
    if spec.get("throughput"):
        bars = spec["throughput"]
        xs = range(len(bars))
        w = 0.38
        for off, key, name in ((-w / 2, "tokens_per_s", "tokens/s"), (w / 2, "real_tokens_per_s", "real tokens/s")):
            med, lo, hi = [], [], []
            for b in bars:
                v = sorted(x for x in b[key] if x is not None)
                m = v[len(v) // 2] if len(v) % 2 else 0.5 * (v[len(v) // 2 - 1] + v[len(v) // 2]) if v else 0
                med.append(m)
                lo.append(m - (v[0] if v else 0))
                hi.append((v[-1] if v else 0) - m)
            ax.bar([x + off for x in xs], med, w, yerr=[lo, hi], capsize=4, label=name)
        ax.set_xticks(list(xs))
        ax.set_xticklabels([b["group"] for b in bars], rotation=20, ha="right", fontsize=8)
        ax.set_ylabel("tokens per second")
        ax.legend(fontsize=8)
    else:
        for label, group, rows in runs:
            ax.plot([r["step"] for r in rows], [r["tokens_per_s"] for r in rows], color=colours[group], label="tokens/s")
            ax.plot([r["step"] for r in rows], [r["real_tokens_per_s"] for r in rows], color=colours[group], ls="--",
                    label="real tokens/s")
        ax.set_xlabel("step")
        ax.set_ylabel("tokens per second")
        ax.legend(fontsize=8)
    ax.set_title(f"{title}: throughput")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(f"{out}/throughput.png", dpi=110)
    plt.close(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
