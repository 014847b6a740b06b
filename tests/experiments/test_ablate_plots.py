#!/usr/bin/env python3
"""Checks of tools/ablate_plots.py on crafted descriptions: the helpers' arithmetic (real tokens
seen, smoothing, the mean and 95% interval of repeats, mean curves, padding), what is drawn (no
whiskers for single repeats, one band per group of repeats, colour and line style from two factors,
a validation legend entry, no label outside its figure) and the script's files and exit codes.

Run: python3 tests/experiments/test_ablate_plots.py [path/to/ablate_plots.py]
Fails (exit 1) when matplotlib is missing (scripts/setup.sh installs it).
"""
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import unittest

sys.dont_write_bytecode = True  # importing the script must leave nothing beside it

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "tools", "ablate_plots.py")

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.container import ErrorbarContainer
except ImportError:
    plt = None


def load_module(path):
    spec = importlib.util.spec_from_file_location("ablate_plots", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# The two-sided 95% quantiles of Student's t from their closed forms: with one degree of freedom
# (Cauchy) tan(pi (0.975 - 1/2)), with two (2p - 1) / sqrt(2 p (1 - p)) at p = 0.975.
T975 = {"2": math.tan(0.475 * math.pi), "3": 0.95 / math.sqrt(2 * 0.975 * 0.025)}


def legend_texts(fig):
    """The texts of the figure's legends (drawn below the axes) and of any on its axes."""
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    return [t.get_text() for legend in legends for t in legend.get_texts()]


def metrics_rows(steps, padding, every=1, val_every=0, loss0=4.0):
    """Rows as the jsonl logger writes them: 64 positions a step, `padding` of them padding."""
    rows = []
    for s in range(every, steps + 1, every):
        real = 64 - padding
        r = {"step": s, "loss": loss0 / (1 + 0.1 * s), "step_ms": 10.0, "tokens": 64, "real_tokens": real,
             "padding_fraction": padding / 64, "tokens_per_s": 6400.0, "real_tokens_per_s": real * 100.0,
             "elapsed_s": 0.01 * s}
        if val_every and s % val_every == 0:
            r["val_loss"] = r["loss"] + 0.05
        rows.append(r)
    return rows


class Plots(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.mod = load_module(SCRIPT)

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        plt.close("all")
        self.tmp.cleanup()

    def write_metrics(self, name, rows):
        path = os.path.join(self.dir, name + ".jsonl")
        with open(path, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        return path

    def sweep_spec(self, repeats=1, factors=("batching.name", "optimizer.name"), **extra):
        """A 2x2 grid; padded arms have 16 of 64 positions padding, packed ones none."""
        runs, bars = [], []
        for batching in ("padded", "packed"):
            for opt in ("adamw", "adamw8bit"):
                group = f"{batching}-{opt}"
                tps = []
                for r in range(repeats):
                    label = group if repeats == 1 else f"{group}-r{r + 1}"
                    rows = metrics_rows(30, 16 if batching == "padded" else 0, val_every=10, loss0=4.0 + 0.1 * r)
                    values = {"batching.name": batching, "optimizer.name": opt}
                    runs.append({"label": label, "group": group, "metrics": self.write_metrics(label, rows),
                                 "factors": {f: values[f] for f in factors}})
                    tps.append(6400.0 + 100 * r)
                bars.append({"group": group, "tokens_per_s": tps, "real_tokens_per_s": [t * 0.75 for t in tps]})
        spec = {"out_dir": self.dir, "title": "sweep t", "factors": list(factors),
                "color_by": factors[0] if factors else None, "style_by": factors[1] if len(factors) > 1 else None,
                "smooth": 0, "log_y": False, "runs": runs, "throughput": bars, "t975": dict(T975)}
        spec.update(extra)
        return spec

    # The helpers' arithmetic.

    def test_real_tokens_seen_sums_each_steps_count_and_covers_unlogged_steps(self):
        x, how = self.mod.real_tokens_seen(metrics_rows(12, 16, every=4))
        self.assertEqual(x, [4 * 48, 8 * 48, 12 * 48])  # logged every 4th step: each row stands for 4 steps
        self.assertIn("real_tokens", how)
        rows = [{k: v for k, v in r.items() if k != "real_tokens"} for r in metrics_rows(3, 16)]
        x, how = self.mod.real_tokens_seen(rows)  # no count: the rate times the step time
        self.assertEqual([round(v, 6) for v in x], [48.0, 96.0, 144.0])
        self.assertIn("real_tokens_per_s", how)
        self.assertEqual(self.mod.real_tokens_seen([{"step": 1, "loss": 1.0}]), (None, None))

    def test_real_tokens_seen_counts_a_step_logged_twice_once(self):
        rows = metrics_rows(4, 0)
        resumed = rows + metrics_rows(6, 0)[2:]  # the run resumed from step 2 and logged 3 and 4 again
        x, _ = self.mod.real_tokens_seen(resumed)
        self.assertEqual(x[-1], 6 * 64)
        self.assertEqual(x[2], x[4])

    def test_ema(self):
        self.assertEqual(self.mod.ema([1.0, 2.0, 3.0], 0), [1.0, 2.0, 3.0])
        out = self.mod.ema([2.0, 2.0, 2.0], 0.9)
        self.assertTrue(all(abs(v - 2.0) < 1e-12 for v in out))  # bias-corrected: a constant stays put
        out = self.mod.ema([0.0, 10.0], 0.5)
        self.assertAlmostEqual(out[1], (0.5 * 0 * 0.5 + 0.5 * 10) / (1 - 0.25))

    def test_mean_interval_and_padding(self):
        self.assertEqual(self.mod.mean_interval([5.0], T975), (5.0, 0.0, 1))
        values = [3.0, 1.0, 2.5]
        mean, half, n = self.mod.mean_interval([3.0, None, 1.0, 2.5], T975)
        self.assertEqual(n, 3)
        self.assertAlmostEqual(mean, statistics.mean(values))
        self.assertAlmostEqual(half, T975["3"] * statistics.stdev(values) / math.sqrt(3))
        self.assertIsNone(self.mod.mean_interval([None], T975))
        with self.assertRaises(self.mod.SpecError):  # no quantile for that many runs
            self.mod.mean_interval([1.0, 2.0, 3.0, 4.0], T975)
        self.assertAlmostEqual(self.mod.padding_of(metrics_rows(5, 16)), 0.25)
        self.assertIsNone(self.mod.padding_of([{"step": 1, "loss": 1.0}]))

    def test_mean_curve_interpolates_onto_the_common_range(self):
        # Two runs logged at different x: the mean is taken on the first one's x within both ranges.
        x, mean, half = self.mod.mean_curve([([0, 2, 4, 6], [4.0, 3.0, 2.0, 1.0]), ([1, 3, 5], [5.0, 3.0, 1.0])], T975)
        self.assertEqual(list(x), [2, 4])
        # At x = 2 the second run is halfway between (1, 5) and (3, 3): 4; at x = 4, 2.
        for xi, first, second in ((0, 3.0, 4.0), (1, 2.0, 2.0)):
            self.assertAlmostEqual(mean[xi], statistics.mean([first, second]))
            self.assertAlmostEqual(half[xi], T975["2"] * statistics.stdev([first, second]) / math.sqrt(2))

    # What is drawn.

    def test_single_repeats_draw_no_whiskers_and_repeats_draw_them(self):
        figs = self.mod.figures(self.sweep_spec(repeats=1), plt)
        for name in ("throughput.png", "padding.png"):
            ax = figs[name].axes[0]
            self.assertFalse([c for c in ax.containers if isinstance(c, ErrorbarContainer)], name)
            self.assertTrue(ax.patches, name)  # the bars themselves are there
        figs = self.mod.figures(self.sweep_spec(repeats=3), plt)
        ax = figs["throughput.png"].axes[0]
        whiskers = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
        self.assertEqual(len(whiskers), 2)  # tokens/s and real tokens/s
        self.assertIn("95% interval", ax.get_title())
        # Each whisker spans the 95% interval of the mean of the group's three values.
        tps = [6400.0, 6500.0, 6600.0]
        want = T975["3"] * statistics.stdev(tps) / math.sqrt(3)
        segments = whiskers[0].lines[2][0].get_segments()
        self.assertEqual(len(segments), 4)
        for seg in segments:
            self.assertAlmostEqual(seg[1][1] - seg[0][1], 2 * want, places=6)
            self.assertAlmostEqual((seg[1][1] + seg[0][1]) / 2, statistics.mean(tps), places=6)

    def test_repeats_draw_one_mean_curve_and_band_per_group(self):
        from matplotlib.collections import PolyCollection

        figs = self.mod.figures(self.sweep_spec(repeats=3), plt)
        for name in ("loss_vs_step.png", "loss_vs_time.png", "loss_vs_real_tokens.png"):
            ax = figs[name].axes[0]
            train = [l for l in ax.get_lines() if l.get_linewidth() == 1.4]
            self.assertEqual(len(train), 4, name)  # one per group, not one per run
            bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
            self.assertEqual(len(bands), 4, name)
            self.assertIn("95% interval of the repeats' mean", legend_texts(figs[name]))
        # The training line of the first group is the mean of its three runs (loss0 4.0, 4.1, 4.2).
        ax = figs["loss_vs_step.png"].axes[0]
        line = [l for l in ax.get_lines() if l.get_linewidth() == 1.4][0]
        steps, loss = line.get_data()
        for step, value in zip(steps, loss):
            self.assertAlmostEqual(value, statistics.mean(l0 / (1 + 0.1 * step) for l0 in (4.0, 4.1, 4.2)))
        # Without repeats: no band.
        figs = self.mod.figures(self.sweep_spec(repeats=1), plt)
        self.assertFalse([c for c in figs["loss_vs_step.png"].axes[0].collections if isinstance(c, PolyCollection)])

    def test_no_label_leaves_its_figure(self):
        spec = self.sweep_spec(repeats=3, smooth=0.8)
        for r in spec["throughput"]:
            r["group"] = r["group"] + "-with-a-rather-long-arm-name"
        for r in spec["runs"]:
            r["group"] = r["group"] + "-with-a-rather-long-arm-name"
        for name, fig in self.mod.figures(spec, plt).items():
            fig.canvas.draw()
            renderer = fig.canvas.get_renderer()
            box = fig.bbox
            ax = fig.axes[0]
            (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
            ticks = [t for t in ax.get_xticklabels() if x0 <= t.get_position()[0] <= x1]  # those drawn
            ticks += [t for t in ax.get_yticklabels() if y0 <= t.get_position()[1] <= y1]
            texts = [ax.xaxis.label, ax.yaxis.label, ax.title] + ticks
            artists = [t for t in texts if t.get_text()] + list(fig.legends)
            for a in artists:
                ext = a.get_window_extent(renderer)
                label = a.get_text() if hasattr(a, "get_text") else "legend"
                self.assertGreaterEqual(ext.x0, box.x0 - 1, f"{name}: {label}")
                self.assertGreaterEqual(ext.y0, box.y0 - 1, f"{name}: {label}")
                self.assertLessEqual(ext.x1, box.x1 + 1, f"{name}: {label}")
                self.assertLessEqual(ext.y1, box.y1 + 1, f"{name}: {label}")

    def test_colour_by_one_factor_style_by_the_other_and_a_validation_entry(self):
        spec = self.sweep_spec()
        figs = self.mod.figures(spec, plt)
        ax = figs["loss_vs_step.png"].axes[0]
        labels = legend_texts(figs["loss_vs_step.png"])
        for want in ("batching.name = padded", "batching.name = packed", "optimizer.name = adamw",
                     "optimizer.name = adamw8bit", "training", "validation"):
            self.assertIn(want, labels)
        # Training curves are the solid-width lines; arms of one batching share a colour, of one optimizer a style.
        train = [l for l in ax.get_lines() if l.get_linewidth() == 1.4]
        self.assertEqual(len(train), 4)
        colours = [l.get_color() for l in train]
        styles = [l.get_linestyle() for l in train]
        self.assertEqual(colours[0], colours[1])
        self.assertNotEqual(colours[0], colours[2])
        self.assertEqual(styles[0], styles[2])
        self.assertNotEqual(styles[0], styles[1])

    def test_one_factor_colours_only_and_a_third_factor_gets_markers(self):
        enc = self.mod.Encoding(self.sweep_spec(factors=("batching.name",)), plt)
        self.assertEqual(enc.styles, {})
        self.assertEqual(len(enc.colours), 2)
        spec = self.sweep_spec()
        for r in spec["runs"]:
            r["factors"]["schedule.name"] = "cosine" if r["label"].endswith("w") else "constant"
        spec["factors"].append("schedule.name")
        enc = self.mod.Encoding(spec, plt)
        self.assertEqual(enc.marker_by, ["schedule.name"])
        self.assertEqual(len(set(enc.markers.values())), 2)

    def test_smoothing_keeps_the_raw_curve_faint_and_log_y(self):
        figs = self.mod.figures(self.sweep_spec(smooth=0.9, log_y=True), plt)
        ax = figs["loss_vs_real_tokens.png"].axes[0]
        self.assertEqual(ax.get_yscale(), "log")
        faint = [l for l in ax.get_lines() if l.get_alpha() is not None and l.get_alpha() < 0.5]
        self.assertEqual(len(faint), 4)
        self.assertIn("real (non-padding) tokens", ax.get_xlabel())
        self.assertIn("EMA 0.9", " ".join(legend_texts(figs["loss_vs_real_tokens.png"])))

    def test_bad_descriptions_are_refused(self):
        for bad in ({"smooth": 1.0}, {"smooth": -0.5}, {"smooth": "x"}, {"color_by": "nope"}, {"log_y": "yes"},
                    {"style_by": "batching.name"}, {"t975": {"3": -1.0}}, {"t975": [4.3]}):
            with self.assertRaises(self.mod.SpecError, msg=str(bad)):
                self.mod.check_spec(self.sweep_spec(**bad))

    # The script as `ablate report` runs it.

    def run_script(self, spec):
        path = os.path.join(self.dir, "spec.json")
        with open(path, "w") as f:
            json.dump(spec, f)
        return subprocess.run([sys.executable, SCRIPT, path], capture_output=True, text=True)

    def test_script_writes_every_png_and_exits_2_on_a_bad_description(self):
        r = self.run_script(self.sweep_spec(smooth=0.5))
        self.assertEqual(r.returncode, 0, r.stderr)
        for name in self.mod.PLOT_FILES:
            with open(os.path.join(self.dir, name), "rb") as f:
                self.assertEqual(f.read(4), b"\x89PNG", name)
        r = self.run_script(self.sweep_spec(smooth=1.5))
        self.assertEqual(r.returncode, 2)
        self.assertIn("smooth", r.stderr)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        SCRIPT = sys.argv.pop(1)
    if plt is None:
        sys.exit("FAIL: matplotlib is missing (scripts/setup.sh installs it)")
    sys.exit(0 if unittest.main(exit=False, verbosity=1).result.wasSuccessful() else 1)
