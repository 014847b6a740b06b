#!/usr/bin/env python3
"""Reads the tensorboard logger's event files with the tensorboard package.

Scalars: every scalar against metrics.jsonl, which the jsonl logger wrote from the same steps (a
run of steps 1..4, then a run resumed at step 2 that logged steps 3..4 again with other losses:
TensorBoard must show the resumed values).

HParams: a tiny `ablate train` and a two-arm `ablate sweep` over batching.name, read through
TensorBoard's own multiplexer, data provider and HParams plugin: the runs are named after the run
directory and the arms; each session holds the arm's factor (marked as differing) and the default
config keys with the values of the run's config.toml, the metric columns, and a success status
when it completed (none for a run stopped early); the plugin's session-group listing filtered on
the factor finds exactly the matching arm.

Fails (exit 1) where the tensorboard package is missing (scripts/setup.sh installs it).

Usage: check_tensorboard.py <loggers_sample_run> <libablate_loggers.so> <ablate> <configs/quickstart.toml>
"""
import json
import os
import struct
import subprocess
import sys
import tempfile
import tomllib

from tiny_runs import ARMS, sweep, train

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing import plugin_event_multiplexer
    from tensorboard.backend.event_processing import data_provider
    from tensorboard import context
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.hparams import api_pb2, hparams_plugin, metadata
    from werkzeug import test as werkzeug_test
    from werkzeug.wrappers import Response
except ImportError as e:
    sys.exit(f"FAIL: the tensorboard Python package is not installed ({e}): scripts/setup.sh installs it")

DEFAULT_HPARAMS = ["model.d_model", "model.n_layers", "model.n_heads", "batching.name", "batching.batch_size", "batching.seq_len",
                   "optimizer.name", "optimizer.lr", "schedule.name", "run.steps", "run.seed"]
METRICS = ["train/loss", "val/loss", "train/tokens_per_s", "train/real_tokens_per_s", "train/mfu", "train/effective_mfu",
           "train/padding_fraction"]


def as_float32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def tag_for(name):
    return "val/" + name[4:] if name.startswith("val_") else "train/" + name


def event_files(directory):
    return sorted(f for f in os.listdir(directory) if f.startswith("events.out.tfevents."))


def check_scalars(writer, plugin):
    with tempfile.TemporaryDirectory(prefix="ablate-tb-") as run_dir:
        subprocess.run([writer, plugin, run_dir], check=True)
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f]
        assert [r["step"] for r in rows] == [1, 2, 3, 4], rows

        expected = {}
        for row in rows:
            for name, value in row.items():
                if name != "step":
                    expected.setdefault(tag_for(name), []).append((row["step"], as_float32(value)))

        files = event_files(run_dir)  # the event files are in the run directory itself by default
        assert len(files) == 2, files
        acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
        acc.Reload()
        tags = sorted(acc.Tags()["scalars"])
        assert tags == sorted(expected), (tags, sorted(expected))
        for tag, want in expected.items():
            got = [(e.step, e.value) for e in acc.Scalars(tag)]
            assert got == want, (tag, got, want)
        print(f"ok: {len(tags)} tags, {sum(len(v) for v in expected.values())} scalars match metrics.jsonl")


def hparams_of(logdir):
    """{run: {tag: parsed HParamsPluginData field}} as TensorBoard's data provider lists them."""
    mux = plugin_event_multiplexer.EventMultiplexer()
    mux.AddRunsFromDirectory(logdir)
    mux.Reload()
    provider = data_provider.MultiplexerDataProvider(mux, logdir)
    listed = provider.list_tensors(context.RequestContext(), experiment_id="", plugin_name=metadata.PLUGIN_NAME)
    parse = {metadata.EXPERIMENT_TAG: metadata.parse_experiment_plugin_data,
             metadata.SESSION_START_INFO_TAG: metadata.parse_session_start_info_plugin_data,
             metadata.SESSION_END_INFO_TAG: metadata.parse_session_end_info_plugin_data}
    out = {run: {tag: parse[tag](series.plugin_content) for tag, series in tags.items()} for run, tags in listed.items()}
    return sorted(mux.Runs()), out, mux, provider


def value_of(v):
    kind = v.WhichOneof("kind")
    return {"number_value": v.number_value, "string_value": v.string_value, "bool_value": v.bool_value}[kind]


def expected_hparams(run_dir, keys):
    with open(os.path.join(run_dir, "config.toml"), "rb") as f:
        config = tomllib.load(f)
    out = {}
    for key in keys:
        section, name = key.split(".", 1)
        value = config[section][name]
        out[key] = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value
    return out


def check_session(data, run_dir, group, factors, completed):
    start = data[metadata.SESSION_START_INFO_TAG]
    keys = factors + [k for k in DEFAULT_HPARAMS if k not in factors]
    got = {k: value_of(v) for k, v in start.hparams.items()}
    assert got == expected_hparams(run_dir, keys), (got, expected_hparams(run_dir, keys))
    assert start.group_name == group, start.group_name
    experiment = data[metadata.EXPERIMENT_TAG]
    infos = [(h.name, h.differs, api_pb2.DataType.Name(h.type)) for h in experiment.hparam_infos]
    assert [i[0] for i in infos] == keys, infos
    assert all(differs == (name in factors) for name, differs, _ in infos), infos
    types = {name: t for name, _, t in infos}
    assert types["batching.name"] == "DATA_TYPE_STRING" and types["model.d_model"] == "DATA_TYPE_FLOAT64", types
    assert [m.name.tag for m in experiment.metric_infos] == METRICS, experiment.metric_infos
    assert all(m.name.group == "" for m in experiment.metric_infos)
    if completed:
        assert api_pb2.Status.Name(data[metadata.SESSION_END_INFO_TAG].status) == "STATUS_SUCCESS"
    else:
        assert metadata.SESSION_END_INFO_TAG not in data, data


def session_groups(logdir, mux, provider, col_params):
    """The HParams plugin's own listing, as its dashboard asks for it."""
    plugin = hparams_plugin.HParamsPlugin(base_plugin.TBContext(logdir=logdir, multiplexer=mux, data_provider=provider))
    client = werkzeug_test.Client(plugin.get_plugin_apps()["/session_groups"], Response)
    request = {"experimentName": "", "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"],
               "colParams": col_params, "startIndex": 0, "sliceSize": 100}
    r = client.post("/session_groups", data=json.dumps(request), content_type="application/json")
    assert r.status_code == 200, r.get_data(as_text=True)
    return json.loads(r.get_data(as_text=True))["sessionGroups"]


def check_hparams(ablate, quickstart):
    sinks = ['logging.sinks=["jsonl","tensorboard"]']
    with tempfile.TemporaryDirectory(prefix="ablate-tb-hparams-") as tmp:
        runs = os.path.join(tmp, "runs")
        train(ablate, quickstart, tmp, os.path.join(runs, "plain"), [*sinks, "run.steps=3"])
        train(ablate, quickstart, tmp, os.path.join(runs, "stopped"), [*sinks, "run.steps=4"], ["--stop-at", "2"])
        names, data, _, _ = hparams_of(runs)
        assert names == ["plain", "stopped"], names  # TensorBoard's run names are the run directories'
        check_session(data["plain"], os.path.join(runs, "plain"), "plain", [], completed=True)
        check_session(data["stopped"], os.path.join(runs, "stopped"), "stopped", [], completed=False)

        out = sweep(ablate, quickstart, tmp, "tb-check", ["jsonl", "tensorboard"])
        names, data, mux, provider = hparams_of(out)
        assert names == sorted(ARMS), names  # the arms' names, not ".../tensorboard"
        for arm in names:
            check_session(data[arm], os.path.join(out, arm), arm, ["batching.name"], completed=True)
            assert data[arm][metadata.SESSION_START_INFO_TAG].hparams["batching.name"].string_value == arm

        groups = session_groups(out, mux, provider, [{"hparam": "batching.name", "filterDiscrete": ["packed"]}])
        assert [g["name"] for g in groups] == ["packed"], groups
        assert [s["name"] for s in groups[0]["sessions"]] == ["packed"], groups
        assert groups[0]["hparams"]["batching.name"] == "packed", groups
        assert groups[0]["sessions"][0]["status"] == "STATUS_SUCCESS", groups
        with open(os.path.join(out, "packed", "metrics.jsonl")) as f:
            last = [json.loads(line) for line in f][-1]
        loss = {m["name"]["tag"]: m["value"] for m in groups[0]["metricValues"]}["train/loss"]
        assert loss == as_float32(last["loss"]), (loss, last)
        print(f"ok: hparams of {len(data)} arms and 2 runs, the factor filter finds the arm")


def check_eval_tags(ablate, quickstart):
    """A run with an evaluation: TensorBoard reads its metrics under eval/<label>/<metric>, with
    metrics.jsonl's values (as float32) at its steps."""
    rows_file = os.path.join(os.path.dirname(os.path.dirname(quickstart)), "configs", "evals", "probe-rows.jsonl")
    with tempfile.TemporaryDirectory(prefix="ablate-tb-eval-") as tmp:
        run_dir = os.path.join(tmp, "run")
        train(ablate, quickstart, tmp, run_dir, ["run.steps=4", "logging.sinks=tensorboard,jsonl", "eval.probe_rows.enabled=true",
                                                 "eval.probe_rows.every=2", "eval.probe_rows.limit=8", f"eval.probe_rows.path={rows_file}"])
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f]
        acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})
        acc.Reload()
        tags = set(acc.Tags()["scalars"])
        names = sorted({k for r in rows for k in r if k.startswith("eval/")})
        assert "eval/probe_rows/acc" in names and set(names) <= tags, (names, sorted(tags))
        for name in names:
            want = [(r["step"], as_float32(r[name])) for r in rows if name in r]
            got = [(e.step, e.value) for e in acc.Scalars(name)]
            assert got == want and [s for s, _ in got] == [2, 4], (name, got, want)
        print(f"ok: {len(names)} evaluation tags (eval/probe_rows/...) match metrics.jsonl at steps 2 and 4")


def main():
    writer, plugin, ablate, quickstart = (os.path.abspath(a) for a in sys.argv[1:5])
    check_scalars(writer, plugin)
    check_hparams(ablate, quickstart)
    check_eval_tags(ablate, quickstart)


if __name__ == "__main__":
    main()
