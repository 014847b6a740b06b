#!/usr/bin/env python3
"""Draws the plots of an ablate report with matplotlib.

Called by `ablate report` / `ablate sweep` with one argument: a JSON file describing what to draw:
  {"out_dir": DIR, "title": str,
   "smooth": float in [0, 1) (EMA weight for training loss; 0: raw), "log_y": bool,
   "factors": [name, ...]            (a sweep's axes, e.g. "batching.name"; [] for a run),
   "color_by": name or null, "style_by": name or null,
   "runs": [{"label": str, "group": str, "metrics": path to metrics.jsonl,
             "factors": {name: value, ...}}, ...],
   "throughput": [{"group": str, "tokens_per_s": [...], "real_tokens_per_s": [...]}, ...],
   "t975": {"N": q, ...}             (the two-sided 95% quantile of Student's t with N - 1 degrees of
                                      freedom, for every group size N >= 2 among the runs)}
Writes DIR/loss_vs_step.png, loss_vs_time.png, loss_vs_real_tokens.png, throughput.png and
padding.png. Runs of one group (an arm's repeats) are drawn together: the mean of their curves
with a band for its 95% interval, bars at the mean with whiskers for that interval. Exits 3 when
matplotlib is missing, 2 on a bad description.

The drawing is split into functions that return matplotlib figures (figures(spec) gives them all)
so that what is drawn can be checked without reading images back.
"""
import json
import math
import sys

PLOT_FILES = ("loss_vs_step.png", "loss_vs_time.png", "loss_vs_real_tokens.png", "throughput.png", "padding.png")

# Line styles for the style factor: the four named ones, then dash patterns.
LINE_STYLES = ["-", "--", ":", "-.", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 3)), (0, (8, 3, 2, 3))]
# Markers for the factors beyond colour and style (filled on training curves; hollow circles are validation).
MARKERS = ["s", "^", "v", "D", "P", "X", "*", "<", ">", "h"]
NEUTRAL = "0.35"
BAND_ALPHA = 0.18  # the fill of a group's 95% interval band


class SpecError(Exception):
    """The description is not one this script can draw (exit 2)."""


def load_metrics(path):
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise SpecError(f"{path}:{n}: not a JSON line ({e})")
            number = (int, float)
            if isinstance(row, dict) and isinstance(row.get("step"), number) and isinstance(row.get("loss"), number):
                rows.append(row)
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


REAL_TOKENS_FROM_COUNT = "running sum of each step's real_tokens"
REAL_TOKENS_FROM_RATE = "running sum of real_tokens_per_s x step_ms"


def real_tokens_seen(rows):
    """Real (non-padding) target tokens the job had trained on by each logged row, and how that was
    computed, or (None, None) when the rows hold neither count nor rate.

    Each step's count is the row's real_tokens, else real_tokens_per_s * step_ms. With logging.every > 1
    the logged step's count stands for the unlogged steps before it. A step logged twice (a resumed
    run repeats the steps after its checkpoint) counts once.
    """
    if not rows:
        return [], REAL_TOKENS_FROM_COUNT
    if all(isinstance(r.get("real_tokens"), (int, float)) for r in rows):
        per_step, how = (lambda r: float(r["real_tokens"])), REAL_TOKENS_FROM_COUNT
    elif all(isinstance(r.get("real_tokens_per_s"), (int, float)) and isinstance(r.get("step_ms"), (int, float))
             for r in rows):
        per_step, how = (lambda r: r["real_tokens_per_s"] * r["step_ms"] / 1e3), REAL_TOKENS_FROM_RATE
    else:
        return None, None
    count = {}
    for r in rows:
        count[int(r["step"])] = per_step(r)
    seen, total, prev = {}, 0.0, 0
    for step in sorted(count):
        total += count[step] * max(1, step - prev)
        prev = step
        seen[step] = total
    return [seen[int(r["step"])] for r in rows], how


def ema(values, weight):
    """Exponential moving average with bias correction (the first point is the first value): each
    point is weight * the previous average + (1 - weight) * the value; weight 0 returns the values."""
    if weight <= 0:
        return list(values)
    out, avg, norm = [], 0.0, 0.0
    for v in values:
        avg = weight * avg + (1 - weight) * v
        norm = weight * norm + (1 - weight)
        out.append(avg / norm)
    return out


def t_quantile(t975, n):
    """The description's 95% t quantile for a group of n values (n - 1 degrees of freedom)."""
    q = (t975 or {}).get(str(n))
    if not isinstance(q, (int, float)) or isinstance(q, bool) or not q > 0:
        raise SpecError(f"t975: no quantile for a group of {n} runs")
    return float(q)


def mean_interval(values, t975):
    """(mean, half-width of its 95% interval, count) of the finite values: the half-width is
    t * sd / sqrt(n) with the sample standard deviation, 0 for a single value; None when there are none."""
    v = [float(x) for x in values if isinstance(x, (int, float)) and math.isfinite(x)]
    if not v:
        return None
    n = len(v)
    mean = sum(v) / n
    if n == 1:
        return mean, 0.0, 1
    sd = math.sqrt(sum((x - mean) ** 2 for x in v) / (n - 1))
    return mean, t_quantile(t975, n) * sd / math.sqrt(n), n


def padding_of(rows):
    """Share of the run's batch positions that were padding: 1 - sum(real_tokens) / sum(tokens) over
    the logged steps, else the mean of their padding_fraction; None when the rows hold neither."""
    tok = [r.get("tokens") for r in rows]
    real = [r.get("real_tokens") for r in rows]
    if rows and all(isinstance(x, (int, float)) for x in tok + real) and sum(tok) > 0:
        return 1.0 - sum(real) / sum(tok)
    pf = [r.get("padding_fraction") for r in rows]
    if rows and all(isinstance(x, (int, float)) for x in pf):
        return sum(pf) / len(pf)
    return None


def check_spec(spec):
    """Raises SpecError naming the field when the description is not one this script draws."""
    if not isinstance(spec, dict):
        raise SpecError("the description is not a JSON object")
    for key in ("out_dir", "runs"):
        if key not in spec:
            raise SpecError(f"field '{key}' is missing")
    smooth = spec.get("smooth", 0)
    if isinstance(smooth, bool) or not isinstance(smooth, (int, float)) or not (0 <= smooth < 1):
        raise SpecError(f"smooth: {smooth!r} is not a number in [0, 1)")
    if not isinstance(spec.get("log_y", False), bool):
        raise SpecError("log_y: expected true or false")
    factors = spec.get("factors", [])
    if not isinstance(factors, list) or not all(isinstance(f, str) for f in factors):
        raise SpecError("factors: expected a list of names")
    for key in ("color_by", "style_by"):
        name = spec.get(key)
        if name is not None and name not in factors:
            raise SpecError(f"{key}: unknown factor {name!r} (factors: {', '.join(factors) if factors else 'none'})")
    if spec.get("color_by") is not None and spec.get("color_by") == spec.get("style_by"):
        raise SpecError("color_by and style_by name the same factor")
    t975 = spec.get("t975", {})
    if not isinstance(t975, dict) or not all(isinstance(q, (int, float)) and not isinstance(q, bool) and q > 0
                                             for q in t975.values()):
        raise SpecError("t975: expected an object of numbers > 0")
    if not isinstance(spec["runs"], list):
        raise SpecError("runs: expected a list")
    for i, r in enumerate(spec["runs"]):
        if not isinstance(r, dict) or not isinstance(r.get("label"), str) or not isinstance(r.get("metrics"), str):
            raise SpecError(f"runs[{i}]: expected an object with a label and a metrics path")


class Encoding:
    """How each run is told apart: colour from one factor, line style from another, markers from the
    rest (or one colour per group when there are no factors), and the legend entries saying so."""

    def __init__(self, spec, plt):
        runs = spec["runs"]
        factors = spec.get("factors", [])
        self.color_by = spec.get("color_by")
        self.style_by = spec.get("style_by")
        self.marker_by = [f for f in factors if f not in (self.color_by, self.style_by)
                          and len(self._values(runs, f)) > 1]
        colour_keys = self._values(runs, self.color_by) if self.color_by else self._groups(runs)
        self.colours = {k: self._colour(plt, i, len(colour_keys)) for i, k in enumerate(colour_keys)}
        self.styles = {v: LINE_STYLES[i % len(LINE_STYLES)]
                       for i, v in enumerate(self._values(runs, self.style_by))} if self.style_by else {}
        marker_keys = []
        for r in runs:
            k = self._marker_key(r)
            if self.marker_by and k not in marker_keys:
                marker_keys.append(k)
        self.markers = {k: MARKERS[i % len(MARKERS)] for i, k in enumerate(marker_keys)}

    @staticmethod
    def _value(run, factor):
        v = run.get("factors", {}).get(factor)
        return "(base)" if v is None else str(v)

    @classmethod
    def _values(cls, runs, factor):
        out = []
        for r in runs:
            v = cls._value(r, factor)
            if v not in out:
                out.append(v)
        return out

    @staticmethod
    def _groups(runs):
        out = []
        for r in runs:
            g = r.get("group", r["label"])
            if g not in out:
                out.append(g)
        return out

    @staticmethod
    def _colour(plt, i, n):
        if n <= 10:
            return plt.cm.tab10(i)
        if n <= 20:
            return plt.cm.tab20(i)
        return plt.cm.turbo(i / max(1, n - 1))

    def _marker_key(self, run):
        return tuple(self._value(run, f) for f in self.marker_by)

    def colour(self, run):
        key = self._value(run, self.color_by) if self.color_by else run.get("group", run["label"])
        return self.colours[key]

    def style(self, run):
        return self.styles[self._value(run, self.style_by)] if self.style_by else "-"

    def marker(self, run):
        return self.markers.get(self._marker_key(run)) if self.marker_by else None

    def legend_handles(self, with_validation, smooth, with_band=False):
        """Legend entries: one per colour, style and marker value, then what training and validation
        look like, and the band of a group's repeats when one is drawn."""
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch

        handles = []
        for key, c in self.colours.items():
            name = f"{self.color_by} = {key}" if self.color_by else key
            handles.append(Line2D([], [], color=c, lw=2, label=name))
        for key, ls in self.styles.items():
            handles.append(Line2D([], [], color=NEUTRAL, ls=ls, lw=1.4, label=f"{self.style_by} = {key}"))
        for key, m in self.markers.items():
            text = ", ".join(f"{f} = {v}" for f, v in zip(self.marker_by, key))
            handles.append(Line2D([], [], color=NEUTRAL, lw=0, marker=m, ms=6, label=text))
        training = "training" + (", mean of the repeats" if with_band else "")
        training += f" (EMA {smooth:g}; raw faint)" if smooth > 0 else ""
        handles.append(Line2D([], [], color=NEUTRAL, lw=1.4, label=training))
        if with_validation:
            handles.append(Line2D([], [], color=NEUTRAL, lw=0.8, marker="o", ms=6, mfc="none", mew=1.3,
                                  label="validation"))
        if with_band:
            handles.append(Patch(facecolor=NEUTRAL, alpha=BAND_ALPHA, label="95% interval of the repeats' mean"))
        return handles


def legend_below(fig, handles):
    """The figure's legend in rows under the axes (constrained layout makes room for it)."""
    return fig.legend(handles=handles, loc="outside lower center", ncols=min(4, max(1, len(handles))), fontsize=8,
                      frameon=False)


def x_values(rows, kind):
    """Each row's x for 'step', 'time' or 'real_tokens', and how real tokens were counted (None for
    the others); (None, None) when the rows cannot give real tokens."""
    if kind == "step":
        return [r["step"] for r in rows], None
    if kind == "time":
        return elapsed(rows), None
    return real_tokens_seen(rows)


def groups_of(runs):
    """The runs by group (an arm's repeats), in the order of each group's first run: [(group, [(run, rows)])]."""
    out = {}
    for run, rows in runs:
        out.setdefault(run.get("group", run["label"]), []).append((run, rows))
    return list(out.items())


def mean_curve(curves, t975):
    """The mean of several (x, y) curves, on the first one's x values inside the range that every
    curve covers (each interpolated linearly there), with the half-width of the 95% interval of that
    mean at each point: (x, mean, half) as numpy arrays."""
    import numpy as np

    sorted_curves = []
    for x, y in curves:
        x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
        order = np.argsort(x, kind="stable")
        sorted_curves.append((x[order], y[order]))
    lo = max(x[0] for x, _ in sorted_curves)
    hi = min(x[-1] for x, _ in sorted_curves)
    grid = sorted_curves[0][0]
    grid = grid[(grid >= lo) & (grid <= hi)]
    ys = np.array([np.interp(grid, x, y) for x, y in sorted_curves])
    n = len(sorted_curves)
    half = t_quantile(t975, n) * ys.std(axis=0, ddof=1) / math.sqrt(n)
    return grid, ys.mean(axis=0), half


def mean_validation(per_run, t975):
    """Validation points of a group: per_run holds one {step: (x, loss)} per run. At each step every
    run logged, (mean x, mean loss, half-width of the loss mean's 95% interval)."""
    common = set(per_run[0])
    for d in per_run[1:]:
        common &= set(d)
    out = []
    for step in sorted(common):
        mean, half, _ = mean_interval([d[step][1] for d in per_run], t975)
        out.append((sum(d[step][0] for d in per_run) / len(per_run), mean, half))
    return out


def loss_figure(plt, spec, runs, enc, kind):
    """Loss against 'step', 'time' or 'real_tokens': a curve per group, the mean of its runs with a
    band for the 95% interval of that mean when it has several."""
    import numpy as np
    from matplotlib.ticker import EngFormatter

    smooth = float(spec.get("smooth", 0))
    t975 = spec.get("t975", {})
    title = spec.get("title", "")
    fig, ax = plt.subplots(figsize=(10, 6.2), layout="constrained")
    hows = []
    any_val = any_band = False
    for _, members in groups_of(runs):
        curves, vals = [], []
        for run, rows in members:
            x, how = x_values(rows, kind) if rows else (None, None)
            if x is None:
                continue
            if how and how not in hows:
                hows.append(how)
            curves.append((x, [r["loss"] for r in rows]))
            vals.append({int(r["step"]): (xi, r["val_loss"]) for xi, r in zip(x, rows)
                         if isinstance(r.get("val_loss"), (int, float))})
        if not curves:
            continue
        run = members[0][0]
        colour, ls, marker = enc.colour(run), enc.style(run), enc.marker(run)
        if len(curves) == 1:
            x, raw = curves[0]
            line, half = ema(raw, smooth), None
            points = [(xi, v, 0.0) for _, (xi, v) in sorted(vals[0].items())]
        else:
            x, raw, _ = mean_curve(curves, t975)
            _, line, half = mean_curve([(cx, ema(cy, smooth)) for cx, cy in curves], t975)
            points = mean_validation(vals, t975)
        every = max(1, len(x) // 8)
        if smooth > 0:
            ax.plot(x, raw, color=colour, ls=ls, lw=0.8, alpha=0.22)
        if half is not None:
            ax.fill_between(x, np.asarray(line) - half, np.asarray(line) + half, color=colour, alpha=BAND_ALPHA, lw=0)
            any_band = True
        ax.plot(x, line, color=colour, ls=ls, lw=1.4, alpha=0.95, marker=marker, markevery=every, ms=5)
        if points:
            any_val = True
            px, py, ph = zip(*points)
            ax.plot(px, py, color=colour, ls=ls, lw=0.8, alpha=0.8, marker=marker or "o", ms=6, mfc="none", mew=1.3)
            if any(h > 0 for h in ph):
                ax.errorbar(px, py, yerr=ph, fmt="none", ecolor=colour, elinewidth=1, capsize=3, alpha=0.8)
    if kind == "step":
        ax.set_xlabel("step")
    elif kind == "time":
        ax.set_xlabel("wall-clock time since the run started (s)")
    else:
        ax.set_xlabel("real (non-padding) tokens seen, whole job: " + ("; ".join(hows) or REAL_TOKENS_FROM_COUNT))
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    ax.set_ylabel("loss" + (" (log scale)" if spec.get("log_y") else ""))
    if spec.get("log_y"):
        from matplotlib.ticker import LogFormatter

        ax.set_yscale("log")
        # Plain numbers (2, 3, 0.7) on the ticks, the in-between ones too when the range is under a decade or two.
        ax.yaxis.set_major_formatter(LogFormatter(labelOnlyBase=False))
        ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
    what = {"step": "step", "time": "time", "real_tokens": "real tokens seen"}[kind]
    ax.set_title(f"{title}: loss against {what}")
    ax.grid(alpha=0.3, which="both" if spec.get("log_y") else "major")
    legend_below(fig, enc.legend_handles(any_val, smooth, any_band))
    return fig


def draw_bars(ax, positions, stats, width, **kwargs):
    """Bars at the means; whiskers for the 95% interval of the mean only on bars that have more than
    one value (a single run has no interval). Returns how many whiskers were drawn."""
    ax.bar(positions, [s[0] if s else 0 for s in stats], width, **kwargs)
    spread = [(p, s) for p, s in zip(positions, stats) if s and s[2] > 1]
    if spread:
        ax.errorbar([p for p, _ in spread], [s[0] for _, s in spread], yerr=[s[1] for _, s in spread],
                    fmt="none", ecolor="black", elinewidth=1, capsize=4)
    return len(spread)


def si_text(v):
    """A rate with three significant digits in k or M, as report.md writes it: 992, 1.51k, 13.0k, 2.04M."""
    scale, unit = (1e6, "M") if abs(v) >= 1e6 else (1e3, "k") if abs(v) >= 1e3 else (1.0, "")
    x = v / scale
    return f"{x:.{0 if abs(x) >= 100 else 1 if abs(x) >= 10 else 2}f}{unit}"


def group_colours(runs, enc):
    """Each group's colour: that of its first run."""
    out = {}
    for run, _ in runs:
        out.setdefault(run.get("group", run["label"]), enc.colour(run))
    return out


def colour_patches(enc, prefix=""):
    from matplotlib.patches import Patch

    return [Patch(color=c, label=prefix + (f"{enc.color_by} = {k}" if enc.color_by else k)) for k, c in enc.colours.items()]


INTERVAL_NOTE = "bars: mean of the repeats; whiskers: 95% interval of the mean"


def throughput_figure(plt, spec, runs, enc):
    """Per group, tokens/s (grey) and real tokens/s (the group's colour) as bars; for a run, per step."""
    from matplotlib.patches import Patch
    from matplotlib.ticker import EngFormatter

    title = spec.get("title", "")
    t975 = spec.get("t975", {})
    fig, ax = plt.subplots(figsize=(9, 5.8), layout="constrained")
    bars = spec.get("throughput") or []
    repeats = False
    if bars:
        xs = list(range(len(bars)))
        w = 0.38
        colours = group_colours(runs, enc)
        total = [mean_interval(b.get("tokens_per_s") or [], t975) for b in bars]
        real = [mean_interval(b.get("real_tokens_per_s") or [], t975) for b in bars]
        repeats = draw_bars(ax, [x - w / 2 for x in xs], total, w, color="0.78") > 0
        repeats = draw_bars(ax, [x + w / 2 for x in xs], real, w,
                            color=[colours.get(b["group"], NEUTRAL) for b in bars]) > 0 or repeats
        for x, s in zip(xs, real):
            if s:
                ax.annotate(si_text(s[0]), (x + w / 2, s[0] + s[1]),
                            textcoords="offset points", xytext=(0, 3), ha="center", fontsize=7)
        ax.set_xticks(xs)
        ax.set_xticklabels([b["group"] for b in bars], rotation=20, ha="right", fontsize=8)
        handles = [Patch(color="0.78", label="tokens/s (every batch position)")]
        handles += colour_patches(enc, "real tokens/s, ") if enc.color_by else [Patch(color=NEUTRAL, label="real tokens/s (coloured by arm)")]
        legend_below(fig, handles)
    else:
        for run, rows in runs:
            steps = [r["step"] for r in rows]
            ax.plot(steps, [r.get("tokens_per_s", math.nan) for r in rows], color=enc.colour(run), label="tokens/s")
            ax.plot(steps, [r.get("real_tokens_per_s", math.nan) for r in rows], color=enc.colour(run), ls="--",
                    label="real tokens/s")
        ax.set_xlabel("step")
        legend_below(fig, ax.get_legend_handles_labels()[0])
    ax.set_ylabel("tokens per second")
    ax.yaxis.set_major_formatter(EngFormatter(sep=""))
    ax.set_title(f"{title}: throughput" + (f"\n({INTERVAL_NOTE})" if repeats else ""), fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    return fig


def padding_figure(plt, spec, runs, enc):
    """Per arm (repeats together), the share of batch positions that were padding."""
    title = spec.get("title", "")
    groups, values = [], {}
    colours = group_colours(runs, enc)
    for run, rows in runs:
        g = run.get("group", run["label"])
        if g not in values:
            groups.append(g)
            values[g] = []
        p = padding_of(rows)
        if p is not None:
            values[g].append(100.0 * p)
    fig, ax = plt.subplots(figsize=(9, 5.8), layout="constrained")
    stats = [mean_interval(values[g], spec.get("t975", {})) for g in groups]
    xs = list(range(len(groups)))
    repeats = draw_bars(ax, xs, stats, 0.6, color=[colours[g] for g in groups]) > 0
    for x, s in zip(xs, stats):
        text = f"{s[0]:.1f}%" if s else "no data"
        ax.annotate(text, (x, s[0] + s[1] if s else 0), textcoords="offset points", xytext=(0, 3), ha="center",
                    fontsize=8)
    ax.set_xticks(xs)
    ax.set_xticklabels(groups, rotation=20, ha="right", fontsize=8)
    if enc.color_by:
        legend_below(fig, colour_patches(enc))
    top = max([s[0] + s[1] for s in stats if s] + [1.0])
    ax.set_ylim(0, min(100.0, top * 1.2 + 1))
    ax.set_ylabel("padding, % of batch positions")
    ax.set_title(f"{title}: padding per arm\n(1 - real tokens / tokens over the run"
                 + (f"; {INTERVAL_NOTE})" if repeats else ")"), fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    return fig


def evals_figure(plt, spec, runs, enc):
    """Each evaluation's primary metric (spec "evals": label, metric) against step: a curve per
    group, the mean of its runs with a band for the 95% interval of that mean when it has several."""
    import numpy as np

    evals = spec["evals"]
    t975 = spec.get("t975", {})
    fig, axes = plt.subplots(1, len(evals), figsize=(6.5 * len(evals), 4.6), layout="constrained", squeeze=False)
    any_band = False
    for ax, ev in zip(axes[0], evals):
        key = f"eval/{ev['label']}/{ev['metric']}"
        for _, members in groups_of(runs):
            curves = []
            for _run, rows in members:
                pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
                if pts:
                    curves.append(tuple(zip(*pts)))
            if not curves:
                continue
            run = members[0][0]
            colour, ls, marker = enc.colour(run), enc.style(run), enc.marker(run)
            if len(curves) == 1:
                x, y, half = curves[0][0], curves[0][1], None
            else:
                x, y, half = mean_curve(curves, t975)
            if half is not None:
                ax.fill_between(x, np.asarray(y) - half, np.asarray(y) + half, color=colour, alpha=BAND_ALPHA, lw=0)
                any_band = True
            ax.plot(x, y, color=colour, ls=ls, lw=1.4, marker=marker or "o", ms=4)
        ax.set_xlabel("step")
        ax.set_ylabel(f"{ev['label']} {ev['metric']}")
        ax.set_title(f"{spec.get('title', '')}: eval {ev['label']} ({ev['metric']})", fontsize=10)
        ax.grid(alpha=0.3)
    legend_below(fig, enc.legend_handles(False, 0, any_band))
    return fig


def figures(spec, plt):
    """Every plot of the report as {file name: figure}."""
    check_spec(spec)
    runs = [(r, load_metrics(r["metrics"])) for r in spec["runs"]]
    enc = Encoding(spec, plt)
    return {
        "loss_vs_step.png": loss_figure(plt, spec, runs, enc, "step"),
        "loss_vs_time.png": loss_figure(plt, spec, runs, enc, "time"),
        "loss_vs_real_tokens.png": loss_figure(plt, spec, runs, enc, "real_tokens"),
        "throughput.png": throughput_figure(plt, spec, runs, enc),
        "padding.png": padding_figure(plt, spec, runs, enc),
        **({"evals.png": evals_figure(plt, spec, runs, enc)} if spec.get("evals") else {}),
    }


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
    try:
        with open(sys.argv[1]) as f:
            spec = json.load(f)
        figs = figures(spec, plt)
    except (OSError, ValueError, KeyError, SpecError) as e:
        print(f"{sys.argv[1]}: {e}", file=sys.stderr)
        return 2
    for name, fig in figs.items():
        fig.savefig(f"{spec['out_dir']}/{name}", dpi=110)
        plt.close(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
