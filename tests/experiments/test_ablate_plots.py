#!/usr/bin/env python3
"""Checks of tools/ablate_plots.py on crafted descriptions: the helpers' arithmetic (real tokens
seen, smoothing, bar statistics, padding), what is drawn (no whiskers for single repeats, colour and
line style from two factors, a validation legend entry) and the script's files and exit codes.

Run: python3 tests/experiments/test_ablate_plots.py [path/to/ablate_plots.py]
Exits 77 (skipped) when matplotlib is missing.
"""
import importlib.util
import json
import os
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
                "smooth": 0, "log_y": False, "runs": runs, "throughput": bars}
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

    def test_bar_stats_and_padding(self):
        self.assertEqual(self.mod.bar_stats([5.0]), (5.0, 0.0, 0.0, 1))
        self.assertEqual(self.mod.bar_stats([3.0, None, 1.0, 2.0]), (2.0, 1.0, 1.0, 3))
        self.assertIsNone(self.mod.bar_stats([None]))
        self.assertAlmostEqual(self.mod.padding_of(metrics_rows(5, 16)), 0.25)
        self.assertIsNone(self.mod.padding_of([{"step": 1, "loss": 1.0}]))

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
        self.assertIn("whiskers", ax.get_ylabel())

    def test_colour_by_one_factor_style_by_the_other_and_a_validation_entry(self):
        spec = self.sweep_spec()
        figs = self.mod.figures(spec, plt)
        ax = figs["loss_vs_step.png"].axes[0]
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
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
        self.assertIn("EMA 0.9", " ".join(t.get_text() for t in ax.get_legend().get_texts()))

    def test_bad_descriptions_are_refused(self):
        for bad in ({"smooth": 1.0}, {"smooth": -0.5}, {"smooth": "x"}, {"color_by": "nope"}, {"log_y": "yes"},
                    {"style_by": "batching.name"}):
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
        print("matplotlib is missing: skipped")
        sys.exit(77)
    sys.exit(0 if unittest.main(exit=False, verbosity=1).result.wasSuccessful() else 1)
