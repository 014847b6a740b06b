#!/usr/bin/env python3
"""The mlflow logger against a real MLflow tracking server, read back with MLflow's own client.

Starts `mlflow server` on a free local port (sqlite backend store, proxied artifacts in a temporary
directory), and while it starts checks the refusals: no server address (exit 2 naming the key and
saying why there is no local store), an https address (exit 2), a server that is not listening
(exit 1 naming it, before any step is trained), an HTTP server that is not MLflow's (exit 1). Then trains a tiny run (address from the key), a
two-arm sweep over batching.name (address from MLFLOW_TRACKING_URI) and a run stopped at step 2
and resumed, and reads them through mlflow.tracking.MlflowClient:
  - search_runs finds the run by name and each arm by its factor, as a tag and as a param;
  - every param is a key of the run's config.toml with its value, and every config key is a param;
  - each metric's history equals metrics.jsonl step by step, and the metric names are jsonl's;
  - the run's tags (name, status, sweep, arm, factor) and status (FINISHED; KILLED when stopped);
  - the artifacts hold config.toml, run.json and summary.json, the latter equal to the run's;
  - the resumed run continues the same MLflow run, its history each step once.
The server is stopped at the end, also when a check fails. Fails (exit 1) where Python has no
mlflow (scripts/setup-tests.sh installs it).

Usage: check_mlflow.py <ablate> <configs/quickstart.toml>
"""
import ctypes
import http.server
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.request

from tiny_runs import ARMS, sweep, train

try:
    import mlflow  # noqa: F401
    from mlflow.tracking import MlflowClient
except ImportError as e:
    sys.exit(f"FAIL: the mlflow Python package is not installed ({e}): scripts/setup-tests.sh installs it")

SINKS = 'logging.sinks=["console","jsonl","mlflow"]'
SERVER_START_S = 300


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def die_with_parent():
    """In the server's process: SIGTERM when this test's process ends, however it ends."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Server:
    def __init__(self, tmp):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = os.path.join(tmp, "server.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
             "--backend-store-uri", f"sqlite:///{tmp}/mlflow.db", "--artifacts-destination", os.path.join(tmp, "artifacts")],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent,
            env=dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"))  # no job runner: a lighter server

    def wait_ready(self):
        t0 = time.time()
        while time.time() - t0 < SERVER_START_S:
            if self.proc.poll() is not None:
                sys.exit(f"mlflow server exited with {self.proc.returncode}:\n{open(self.log_path).read()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return time.time() - t0
            except OSError:
                pass
            time.sleep(0.5)
        sys.exit(f"mlflow server not ready after {SERVER_START_S} s:\n{open(self.log_path).read()}")

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def environment(tracking_uri=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    if tracking_uri:
        env["MLFLOW_TRACKING_URI"] = tracking_uri
    return env


def train_mlflow(ablate, quickstart, cwd, run_dir, sets, env, extra=(), expect=0):
    return train(ablate, quickstart, cwd, run_dir, [SINKS, *sets], extra, env, expect)


def check_refusals(ablate, quickstart, tmp):
    out = train_mlflow(ablate, quickstart, tmp, os.path.join(tmp, "no-uri"), [], environment(), expect=2)
    assert "logging.mlflow.tracking_uri" in out and "MLFLOW_TRACKING_URI" in out and "MLFLOW_ALLOW_FILE_STORE" in out, out
    out = train_mlflow(ablate, quickstart, tmp, os.path.join(tmp, "https"), ["logging.mlflow.tracking_uri=https://127.0.0.1:1"],
                       environment(), expect=2)
    assert "https is not supported" in out, out
    closed = f"http://127.0.0.1:{free_port()}"
    run_dir = os.path.join(tmp, "unreachable")
    out = train_mlflow(ablate, quickstart, tmp, run_dir, [], environment(closed), expect=1)
    assert closed in out and "cannot reach the MLflow tracking server" in out and "MLFLOW_TRACKING_URI" in out, out
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        assert f.read() == "", "a step was trained before the server was found unreachable"
    # An HTTP server that is not MLflow's: it answers every request with an error page.
    class NotMlflow(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotMlflow)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        address = f"http://127.0.0.1:{other.server_address[1]}"
        out = train_mlflow(ablate, quickstart, tmp, os.path.join(tmp, "not-mlflow"), [], environment(address), expect=1)
        assert address in out and "is this an MLflow tracking server?" in out, out
    finally:
        other.shutdown()
        other.server_close()
    print("ok: no address (2), https (2), an unreachable server and one that is not MLflow's (1, before training) are refused")


def config_entries(run_dir):
    """config.toml flattened to {"section.key": value}."""
    with open(os.path.join(run_dir, "config.toml"), "rb") as f:
        config = tomllib.load(f)
    out = {}

    def walk(table, prefix):
        for k, v in table.items():
            key = f"{prefix}.{k}" if prefix else k
            if isinstance(v, dict):
                walk(v, key)
            elif isinstance(v, list) and v and all(isinstance(t, dict) for t in v):  # [[eval]]: by label
                for i, t in enumerate(v):
                    walk(t, f"{key}.{t.get('label', i)}")
            else:
                out[key] = v
    walk(config, "")
    return out


def check_params(run, run_dir):
    entries = config_entries(run_dir)
    params = run.data.params
    assert sorted(params) == sorted(entries), sorted(set(params) ^ set(entries))
    for key, want in entries.items():
        got = tomllib.loads(f"x = {params[key]}")["x"] if not isinstance(want, str) else params[key]
        assert got == want and type(got) is type(want), (key, params[key], want)
    assert params["model.d_model"] == "32", params["model.d_model"]


def check_metrics(client, run, run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    names = {k for row in rows for k in row if k != "step"}
    assert set(run.data.metrics) == names, (sorted(run.data.metrics), sorted(names))
    for name in sorted(names):
        want = [(row["step"], row[name]) for row in rows if name in row]
        got = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, name))
        assert [s for s, _ in got] == [s for s, _ in want], (name, got, want)
        for (step, g), (_, w) in zip(got, want):
            if w is None:  # NaN or an infinity, which metrics.jsonl writes as null
                assert math.isnan(g) or abs(g) >= 1.7e308, (name, step, g)
            else:
                assert math.isclose(g, w, rel_tol=1e-12, abs_tol=1e-300), (name, step, g, w)
    return len(rows)


def check_artifacts(client, run, run_dir, tmp):
    paths = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.toml", "run.json", "summary.json"} <= paths, paths
    local = client.download_artifacts(run.info.run_id, "summary.json", tempfile.mkdtemp(dir=tmp))
    with open(local) as a, open(os.path.join(run_dir, "summary.json")) as b:
        assert json.load(a) == json.load(b)


def check_run(client, run, run_dir, tmp, status="FINISHED"):
    with open(os.path.join(run_dir, "mlflow.json")) as f:
        assert json.load(f)["run_id"] == run.info.run_id
    assert run.info.status == status, run.info.status
    check_params(run, run_dir)
    steps = check_metrics(client, run, run_dir)
    check_artifacts(client, run, run_dir, tmp)
    return steps


def only(runs, what):
    assert len(runs) == 1, (what, [r.info.run_name for r in runs])
    return runs[0]


def main():
    ablate, quickstart = (os.path.abspath(a) for a in sys.argv[1:3])
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="ablate-mlflow-") as tmp:
        server = Server(tmp)
        try:
            check_refusals(ablate, quickstart, tmp)
            ready_s = server.wait_ready()
            client = MlflowClient(tracking_uri=server.url)

            # A run, the server named by the key.
            single = os.path.join(tmp, "runs", "single")
            # With an evaluation: its metrics eval/probe_rows/<metric> go to the server like the others.
            rows = os.path.join(os.path.dirname(os.path.dirname(quickstart)), "configs", "evals", "probe-rows.jsonl")
            train_mlflow(ablate, quickstart, tmp, single, ["run.steps=4", "run.eval_every=2", f"logging.mlflow.tracking_uri={server.url}",
                                                           "eval.probe_rows.enabled=true", "eval.probe_rows.limit=8",
                                                           f"eval.probe_rows.path={rows}"],
                         environment())
            exp = client.get_experiment_by_name("quickstart")  # the experiment file's name
            run = only(client.search_runs([exp.experiment_id], "attributes.run_name = 'single'"), "single")
            steps = check_run(client, run, single, tmp)
            t_single = time.time() - t0
            assert steps == 4 and "val_loss" in run.data.metrics and "eval/probe_rows/acc" in run.data.metrics, sorted(run.data.metrics)
            assert run.data.tags["ablate.status"] == "completed" and run.data.tags["mlflow.runName"] == "single", run.data.tags

            # A sweep, the server named by MLFLOW_TRACKING_URI: one experiment, a run per arm.
            out = sweep(ablate, quickstart, tmp, "mlflow-check", ["console", "jsonl", "mlflow"], environment(server.url))
            exp = client.get_experiment_by_name("mlflow-check")
            t_sweep = time.time() - t0
            assert len(client.search_runs([exp.experiment_id])) == 2
            for arm in ARMS:
                by_tag = only(client.search_runs([exp.experiment_id], f"tags.`factor.batching.name` = '{arm}'"), arm)
                by_param = only(client.search_runs([exp.experiment_id], f"params.`batching.name` = '{arm}'"), arm)
                assert by_tag.info.run_id == by_param.info.run_id and by_tag.info.run_name == arm
                tags = by_tag.data.tags
                assert tags["ablate.sweep"] == "mlflow-check" and tags["ablate.arm"] == arm and tags["ablate.group"] == arm, tags
                assert check_run(client, by_tag, os.path.join(out, arm), tmp) == 3

            # Stopped at step 2, then resumed: the same MLflow run continues.
            resumed = os.path.join(tmp, "runs", "resumed")
            uri = ["run.steps=4", "checkpoint.every=2", f"logging.mlflow.tracking_uri={server.url}"]
            train_mlflow(ablate, quickstart, tmp, resumed, uri, environment(), ["--stop-at", "2"])
            exp = client.get_experiment_by_name("quickstart")
            stopped = only(client.search_runs([exp.experiment_id], "attributes.run_name = 'resumed'"), "resumed")
            assert stopped.info.status == "KILLED" and stopped.data.tags["ablate.status"] == "stopped", stopped.info
            train_mlflow(ablate, quickstart, tmp, resumed, uri, environment(), ["--resume"])
            run = only(client.search_runs([exp.experiment_id], "attributes.run_name = 'resumed'"), "resumed")
            assert run.info.run_id == stopped.info.run_id
            assert check_run(client, run, resumed, tmp) == 4
            print(f"ok: a run, 2 sweep arms and a resumed run read back through MlflowClient "
                  f"(server ready after {ready_s:.0f} s, the run checked at {t_single:.0f} s, the sweep run at {t_sweep:.0f} s, "
                  f"{time.time() - t0:.0f} s in all)")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
