#!/usr/bin/env python3
"""Bad and pathological inputs for every command, by class; one verdict a line, then a tally.

    python3 tests/probes/probe_inputs.py build/bin/ablate [--only REGEX] [--jobs N] [--keep]

Each case runs one `ablate` command under a time limit and an address-space limit (a hang or a
memory blow-up is a failure, never a stuck suite) and checks its exit code, what its message
names, and that files already saved are byte for byte what they were. The classes:

  c1  only regular files are read as files (FIFOs, directories, devices, dangling symlinks)
  c2  every number has a range (command-line options and config keys)
  c3  checkpoints are validated (state.json fields, latest, non-finite weights, run.steps)
  c4  run directories are never clobbered (no latest, no summary, .lock, export --out, sweep arms)
  c5  typed reads of run.json, summary.json, metrics.jsonl, arms.json (report, doctor, sweep)
  c6  a token shard truncated while a run maps it ends the run with exit 1, the checkpoint intact
  c7  paths that are not UTF-8
  c8  pathological but valid inputs stay fast; messages echo a bounded prefix of a huge value
  c9  malformed tokenizer files are refused
  c10 runs are self-contained: eval, sample and export from another working directory
  c11 eval shows progress and takes --threads; flags in --help
  c12 data cursors hold positions, never text: a 50 MB one-line corpus checkpoints and resumes
  c13 every JSON ablate reads is depth-bounded before it is parsed (200,000 levels)
  c14 a tokenizer that cannot be read is exit 2 naming its file (sample --prompt, export)
  c15 an output path that cannot be written is exit 2 naming it, decided before training
  c16 the memory plan counts every parameter table (learned positions) against the process's limit
  c17 a non-finite evaluation loss is an error naming the first non-finite logit (--allow-nonfinite reports it)
  c18 a cursor's draw number is checked against the data

Exit status: 0 when every case passes, 1 otherwise.
"""
import argparse
import base64
import concurrent.futures
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.toml"
TINY = ["--set", "model.d_model=32", "--set", "model.n_layers=1", "--set", "model.n_heads=2", "--set", "batching.seq_len=32",
        "--set", "model.max_seq_len=32", "--set", "run.eval_batches=1", "--set", "run.threads=1", "--set", "data.workers=0"]
TIME_LIMIT_S = 60
ABLATE = None  # the binary under test (main sets it; a prepare step that trains uses it)
ADDRESS_SPACE = 16 << 30  # bytes: far above what a tiny run needs, far below what an unbounded read takes
MAX_MESSAGE = 6000        # bytes of output a refused input may produce


# ---------------------------------------------------------------------------------------------
# Fixtures: one tiny trained run, a token-shard corpus with a small byte-level BPE tokenizer, a
# sweep. Cases that change files work on a copy.

def byte_table():
    """GPT-2's byte -> printable code point table: printable bytes stand for themselves, the other
    68 take 256, 257, ... in byte order."""
    printable = set(range(33, 127)) | set(range(161, 173)) | set(range(174, 256))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def write_tokenizer(d: Path):
    """256 byte tokens, a few merges, <|endoftext|>: vocabulary of 262."""
    t = byte_table()
    enc = {t[b]: b for b in range(256)}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("a", "n")]
    for a, b in merges:
        enc[a + b] = len(enc)
    enc["<|endoftext|>"] = len(enc)
    d.mkdir(parents=True, exist_ok=True)
    (d / "encoder.json").write_text(json.dumps(enc, ensure_ascii=False), encoding="utf-8")
    (d / "vocab.bpe").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
    return len(enc)


def write_shard(path: Path, tokens):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


class Fixture:
    def __init__(self, ablate: Path, work: Path):
        self.ablate = ablate
        self.work = work
        self.vocab = write_tokenizer(work / "data" / "tokenizer")
        self.eot = self.vocab - 1
        text = "the cat sat on the mat and then the hen ran in the sun. " * 4
        doc = [b for b in text.encode()]
        tokens = []
        for i in range(300):
            tokens += doc[: 40 + (i * 7) % 150] + [self.eot]
        write_shard(work / "data" / "shard_000.bin", tokens)
        # Tokens of the quickstart's vocabulary (80), for evaluating its run.
        write_shard(work / "data" / "small.bin", [(i * 37) % 80 for i in range(3000)])
        self.shard_args = ["--set", "data.name=token_shards", "--set", f'data.token_shards.paths=["{work}/data/shard_*.bin"]',
                           "--set", f"data.token_shards.vocab_size={self.vocab}", "--set", f"data.token_shards.eot={self.eot}",
                           "--set", "data.token_shards.validation_fraction=0.1"]
        # A finished run of the quickstart (synthetic data), and one of the shards (with a tokenizer).
        self.train(work / "run", ["--set", "run.steps=4", "--set", "checkpoint.every=2"])
        self.train(work / "shard_run", ["--set", "run.steps=4", "--set", "checkpoint.every=2"] + self.shard_args)
        sets = "".join(f'"{kv.split("=")[0]}" = {kv.split("=")[1]}\n' for kv in TINY[1::2])
        (work / "sweep.toml").write_text(f'base = "{QUICKSTART}"\n[sweep]\nname = "s"\n[sweep.set]\n{sets}"run.steps" = 2\n'
                                         '[sweep.grid]\n"run.seed" = [1, 2]\n', encoding="utf-8")

    def train(self, run_dir: Path, extra):
        r = subprocess.run([str(self.ablate), "train", str(QUICKSTART), *TINY, *extra, "--run-dir", str(run_dir)],
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            sys.exit(f"fixture: training {run_dir} failed:\n{r.stdout}{r.stderr}")


# ---------------------------------------------------------------------------------------------
# Cases

class Case:
    """One command. `argv` may hold "DIR" (the case's copy of the fixture); `prepare(dir)` changes
    the copy first; `expect` is the exit code; `says` regexes the output must match; `keep` files
    (relative to the copy) that must be unchanged afterwards; `check(dir, result)` returns None or
    what is wrong."""

    def __init__(self, klass, name, argv, expect, says=(), prepare=None, keep=(), check=None, cwd=None, limit=None,
                 env=None, address_space=None):
        self.klass, self.name, self.argv, self.expect = klass, name, argv, expect
        self.says, self.prepare, self.keep, self.check = list(says), prepare, list(keep), check
        self.cwd, self.limit, self.env = cwd, limit or TIME_LIMIT_S, env
        self.address_space = address_space or ADDRESS_SPACE


def digest(p: Path):
    if p.is_symlink() or not p.exists():
        return None
    if p.is_dir():
        return {str(q.relative_to(p)): digest(q) for q in sorted(p.rglob("*")) if q.is_file() and not q.is_symlink()}
    return hashlib.sha256(p.read_bytes()).hexdigest()


def limit_resources(address_space=ADDRESS_SPACE):
    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    os.setsid()


def run_case(case: Case, fixture: Fixture, scratch: Path):
    d = Path(tempfile.mkdtemp(prefix="case-", dir=scratch))
    for name in ("run", "shard_run", "data", "sweep.toml"):
        src = fixture.work / name
        if src.is_dir():
            shutil.copytree(src, d / name, symlinks=True)
        else:
            shutil.copy2(src, d / name)
    # The copies' resolved configs name the fixture's data; point them at the copy's.
    for cfg in list(d.glob("*/config.toml")) + list(d.glob("*/checkpoints/*/config.toml")):
        cfg.write_text(cfg.read_text(encoding="utf-8").replace(str(fixture.work), str(d)), encoding="utf-8")
    try:
        if case.prepare:
            case.prepare(d)
        before = {k: digest(d / k) for k in case.keep}
        argv = [str(fixture.ablate)] + [a.replace("DIR", str(d)) if isinstance(a, str) else a for a in case.argv]
        env = dict(os.environ)
        env.update(case.env or {})
        t0 = time.monotonic()
        try:
            r = subprocess.run(argv, capture_output=True, timeout=case.limit,
                               preexec_fn=lambda: limit_resources(case.address_space),
                               cwd=str(case.cwd(d)) if case.cwd else str(d), env=env)
            code, out = r.returncode, (r.stdout + r.stderr).decode("utf-8", "replace")
        except subprocess.TimeoutExpired as e:
            code, out = "timeout", ((e.stdout or b"") + (e.stderr or b"")).decode("utf-8", "replace")
        took = time.monotonic() - t0
        problems = []
        if code != case.expect:
            problems.append(f"exit {code}, expected {case.expect}")
        for pattern in case.says:
            if not re.search(pattern.replace("DIR", re.escape(str(d))), out):
                problems.append(f"output lacks /{pattern}/")
        if case.expect != 0 and len(out.encode()) > MAX_MESSAGE:
            problems.append(f"{len(out.encode())} bytes of output for a refused input")
        for k, v in before.items():
            if digest(d / k) != v:
                problems.append(f"{k} changed")
        if case.check and not problems:
            try:
                why = case.check(d, out)
            except Exception as e:  # a file the check reads is missing or damaged
                why = f"{type(e).__name__}: {e}"
            if why:
                problems.append(why)
        last = out.strip().splitlines()[-1] if out.strip() else ""
        return problems, took, last
    finally:
        shutil.rmtree(d, ignore_errors=True)


# --- helpers for prepare steps ----------------------------------------------------------------

def replace_with(kind):
    def prep(path: Path):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "directory":
            path.mkdir()
        elif kind == "dev-zero":
            path.symlink_to("/dev/zero")
        elif kind == "dangling":
            path.symlink_to(path.parent / "no-such-target")
    return prep


def edit_json(rel, fn):
    def prep(d: Path):
        p = d / rel
        j = json.loads(p.read_text())
        fn(j)
        p.write_text(json.dumps(j))
    return prep


def write_text(rel, text):
    def prep(d: Path):
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            p.write_bytes(text)
        else:
            p.write_text(text, encoding="utf-8")
    return prep


def chain(*steps):
    def prep(d: Path):
        for s in steps:
            s(d)
    return prep


CKPT = "run/checkpoints/step_00000004"


def nan_weights(d: Path):
    """The first float of the first tensor of the checkpoint's model.safetensors set to NaN."""
    p = d / CKPT / "model.safetensors"
    b = bytearray(p.read_bytes())
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    first = min(v["data_offsets"][0] for k, v in header.items() if k != "__metadata__")
    b[8 + n + first: 8 + n + first + 4] = struct.pack("<f", float("nan"))
    p.write_bytes(bytes(b))


# --- the classes ------------------------------------------------------------------------------

def c1_regular_files():
    """Every file ablate reads, replaced by a FIFO, a directory, a symlink to /dev/zero, a dangling symlink."""
    eval_run = ["eval", "--checkpoint", "DIR/run", "--tokens", "DIR/data/small.bin"]
    sites = [
        ("experiment", "sweep.toml", ["config", "show", "DIR/sweep.toml"]),
        ("sweep file", "sweep.toml", ["sweep", "DIR/sweep.toml", "--out", "DIR/sw", "--dry-run"]),
        ("run config", "run/config.toml", ["doctor", "DIR/run"]),
        ("checkpoint config", CKPT + "/config.toml", eval_run),
        ("state.json", CKPT + "/state.json", eval_run),
        ("latest", "run/checkpoints/latest", eval_run),
        ("model.safetensors", CKPT + "/model.safetensors", eval_run),
        ("optimizer.safetensors", CKPT + "/optimizer.safetensors",
         ["train", "DIR/run/config.toml", "--run-dir", "DIR/run", "--resume", "--set", "run.steps=6"]),
        ("token shard", "data/small.bin", eval_run),
        ("training shard", "data/shard_000.bin", ["train", str(QUICKSTART), *TINY, "--set", "run.steps=2", "--run-dir", "DIR/new",
                                                  "--set", "data.name=token_shards", "--set",
                                                  'data.token_shards.paths=["DIR/data/shard_000.bin"]', "--set",
                                                  "data.token_shards.vocab_size=262", "--set", "data.token_shards.eot=261"]),
        ("encoder.json", "data/tokenizer/encoder.json", ["sample", "--checkpoint", "DIR/shard_run", "--prompt", "the", "--tokens", "2"]),
        ("run.json", "run/run.json", ["doctor", "DIR/run"]),
        ("summary.json", "run/summary.json", ["report", "DIR/run"]),
        ("metrics.jsonl", "run/metrics.jsonl", ["doctor", "DIR/run"]),
    ]
    out = []
    for label, rel, argv in sites:
        for kind in ("fifo", "directory", "dev-zero", "dangling"):
            if kind == "directory" and rel.endswith("latest"):
                continue  # a directory named latest is a checkpoint name's job, covered in c3
            out.append(Case("c1", f"{label} is a {kind}", argv, 2, [re.escape(Path(rel).name)],
                            prepare=lambda d, rel=rel, kind=kind: replace_with(kind)(d / rel)))
    # Writes too: a metrics log or lock file that is a FIFO is refused, not waited on.
    resume = ["train", "DIR/run/config.toml", "--run-dir", "DIR/run", "--resume", "--set", "run.steps=6"]
    out.append(Case("c1", "metrics.jsonl to append to is a FIFO", resume, 2, ["metrics.jsonl", "FIFO"],
                    prepare=lambda d: replace_with("fifo")(d / "run/metrics.jsonl")))
    out.append(Case("c1", ".lock is a FIFO", resume, 2, [r"\.lock"], prepare=lambda d: replace_with("fifo")(d / "run/.lock")))
    return out


def c2_numbers():
    """Command-line numbers and config keys out of range or not numbers at all."""
    sample = ["sample", "--checkpoint", "DIR/run", "--tokens", "2"]
    evaluate = ["eval", "--checkpoint", "DIR/run", "--tokens", "DIR/data/small.bin"]
    options = [(sample, "--tokens"), (sample, "--top-k"), (sample, "--temperature"), (sample, "--seed"), (evaluate, "--batch"),
               (evaluate, "--seq-len"), (evaluate, "--threads"), (["train", str(QUICKSTART), *TINY, "--run-dir", "DIR/new"], "--stop-at"),
               (["data", "analyze", str(QUICKSTART)], "--documents")]
    bad = ["-5", "nan", "inf", "-inf", "1e400", "abc", "", "99999999999999999999", "0x10", "1.5e"]
    out = []
    for argv, opt in options:
        for v in bad:
            if opt == "--temperature" and v in ("inf",):
                pass
            out.append(Case("c2", f"{argv[0]} {opt}={v!r}", argv + [f"{opt}={v}"], 2, [re.escape(opt)],
                            keep=SAVED))
    keys = [("run.steps", ["0", "-1"]), ("data.workers", ["-1", "100000"]), ("batching.batch_size", ["0", "-3", "1000000000"]),
            ("batching.seq_len", ["0", "100000000"]), ("model.d_model", ["0", "-8"]), ("model.n_layers", ["0", "100000"]),
            ("run.eval_batches", ["-1"]), ("data.prefetch", ["-1"]), ("optimizer.lr", ["nan", "inf", "-1"]),
            ("run.seed", ["-1"]), ("checkpoint.every", ["-1"]), ("checkpoint.keep", ["0"]), ("run.threads", ["-1"]),
            ("data.synthetic_probes.documents", ["-1", "0"])]
    for key, values in keys:
        for v in values:
            out.append(Case("c2", f"--set {key}={v}", ["config", "show", str(QUICKSTART), "--set", f"{key}={v}"], 2,
                            [re.escape(key)]))
    for key, v in [("data.token_shards.eot", str(2**31)), ("data.token_shards.eot", "65536"),
                   ("data.token_shards.vocab_size", "0")]:
        out.append(Case("c2", f"--set {key}={v}", ["config", "show", str(QUICKSTART), "--set", "data.name=token_shards",
                                                    "--set", f"{key}={v}"], 2, [re.escape(key)]))
    out.append(Case("c2", "batch_size x seq_len beyond 2^31", ["config", "show", str(QUICKSTART), "--set",
                                                                "batching.batch_size=65536", "--set", "batching.seq_len=65536"],
                    2, ["batch_size"]))
    return out


def c3_checkpoints():
    evaluate = ["eval", "--checkpoint", "DIR/run", "--tokens", "DIR/data/small.bin"]
    resume = ["train", "DIR/run/config.toml", "--run-dir", "DIR/run", "--resume", "--set", "run.steps=6"]
    st = CKPT + "/state.json"
    mutations = [
        ("step negative", lambda j: j.update(step=-1), "step"),
        ("step a string", lambda j: j.update(step="4"), "step"),
        ("step past int64", lambda j: j.update(step=1e30), "step"),
        ("seed negative", lambda j: j.update(seed=-1), "seed"),
        ("world 0", lambda j: j.update(world=0), "world"),
        ("optimizer file leaves the checkpoint", lambda j: j.update(optimizer_files=["../../x"]), "optimizer"),
        ("data cursor not an object", lambda j: j.update(data_cursor=7), "data_cursor"),
        ("loss a string", lambda j: j.update(loss="low"), "loss"),
        ("vocab_size 0", lambda j: j.update(vocab_size=0), "vocab_size"),
        ("parameters a list", lambda j: j.update(parameters=[1]), "parameters"),
    ]
    out = []
    for name, fn, field in mutations:
        for argv in (evaluate, resume):
            out.append(Case("c3", f"state.json {name} ({argv[0]})", argv, 2, ["state.json", field], prepare=edit_json(st, fn),
                            keep=[CKPT]))
    for name, text in [("leaves the run", "../../etc\n"), ("absolute", "/etc\n"), ("names nothing", "step_00000099\n"),
                       ("empty", ""), ("1 MB", "x" * (1 << 20))]:
        out.append(Case("c3", f"latest {name}", evaluate, 2, ["latest"], prepare=write_text("run/checkpoints/latest", text)))
    out.append(Case("c3", "NaN weight (eval)", evaluate, 2, ["model.safetensors", "NaN|non-finite|nan"], prepare=nan_weights))
    out.append(Case("c3", "NaN weight (resume)", resume, 2, ["model.safetensors"], prepare=nan_weights, keep=[CKPT]))
    out.append(Case("c3", "NaN weight allowed for forensics", evaluate + ["--allow-nonfinite"], 0, [], prepare=nan_weights))
    out.append(Case("c3", "run.steps below the checkpoint", ["train", "DIR/run/config.toml", "--run-dir", "DIR/run", "--resume",
                                                             "--set", "run.steps=3"], 2, ["step 4", "3"], keep=SAVED))
    return out


SAVED = ["run/checkpoints", "run/summary.json", "run/metrics.jsonl", "run/run.json", "run/config.toml"]


def no_summary_done(d: Path, _out):
    s = json.loads((d / "run" / "summary.json").read_text())
    if s.get("status") != "completed" or s.get("steps") != 4 or not isinstance(s.get("final_loss"), float):
        return f"summary not completed from the checkpoint: {s}"
    if s.get("tokens_per_s") not in (None,):
        return f"tokens_per_s {s.get('tokens_per_s')} recorded for a process that trained no step"
    return None


def resumed_from_newest(d: Path, out):
    s = json.loads((d / "run" / "summary.json").read_text())
    if s.get("resumed_from") != 4 or s.get("steps") != 6:
        return f"expected a resume from step 4 to 6, summary says {s.get('resumed_from')} -> {s.get('steps')}"
    return None


def c4_run_dirs():
    train_new = ["train", str(QUICKSTART), *TINY, "--set", "run.steps=6", "--set", "checkpoint.every=2", "--run-dir", "DIR/run"]
    no_latest = lambda d: (d / "run/checkpoints/latest").unlink()
    out = [
        Case("c4", "checkpoints without latest, no --resume", train_new, 2, ["--resume"],
             prepare=chain(no_latest, lambda d: (d / "run/summary.json").unlink()), keep=SAVED),
        Case("c4", "checkpoints without latest, --resume takes the newest", train_new + ["--resume"], 0, ["step_00000004"],
             prepare=chain(no_latest, lambda d: (d / "run/summary.json").unlink()), check=resumed_from_newest),
        Case("c4", "killed before summary.json: --resume completes it", ["train", "DIR/run/config.toml", "--run-dir", "DIR/run",
                                                                         "--resume"], 0, ["summary"],
             prepare=lambda d: (d / "run/summary.json").unlink(), keep=["run/checkpoints"], check=no_summary_done),
        Case("c4", "finished run, no --resume", train_new, 2, ["--resume"], keep=SAVED),
        Case("c4", ".lock is a symlink", train_new + ["--resume"], 2, [r"\.lock", "symlink"],
             prepare=chain(lambda d: (d / "run/.lock").unlink(missing_ok=True),
                           lambda d: (d / "run/.lock").symlink_to(d / "data/shard_000.bin")), keep=["data/shard_000.bin"]),
        Case("c4", "--run-dir is an existing file", ["train", str(QUICKSTART), *TINY, "--run-dir", "DIR/data/shard_000.bin"], 2,
             ["shard_000.bin", "not a directory"], keep=["data/shard_000.bin"]),
        Case("c4", "export --out is the checkpoint", ["export", "--checkpoint", "DIR/run", "--out", "DIR/" + CKPT], 2, ["--out"],
             keep=SAVED),
        Case("c4", "export --out inside the checkpoints", ["export", "--checkpoint", "DIR/run", "--out", "DIR/run/checkpoints/hf"],
             2, ["--out"], keep=SAVED),
        Case("c4", "export --out is an existing file", ["export", "--checkpoint", "DIR/run", "--out", "DIR/run/summary.json"], 2,
             ["summary.json"], keep=SAVED),
        Case("c4", "sweep --out is an existing file", ["sweep", "DIR/sweep.toml", "--out", "DIR/run/summary.json"], 2,
             ["summary.json"], keep=SAVED),
    ]
    for arm in (".lock", "arms.json", "results.json", "report.md", "padding.png", "x" * 300):
        text = f'base = "{QUICKSTART}"\n[sweep]\nname = "s"\n[[sweep.arms]]\nname = {json.dumps(arm)}\n"run.steps" = 2\n'
        out.append(Case("c4", f"sweep arm named {arm[:20]!r}", ["sweep", "DIR/arms.toml", "--out", "DIR/sw", "--dry-run"], 2,
                        ["name"], prepare=write_text("arms.toml", text)))
    return out


def c5_typed_reads():
    damages = [
        ("not JSON", "{nope"), ("truncated", None), ("a list", "[1, 2]"), ("nested 10000 deep", "[" * 10000 + "]" * 10000),
        ("a 1 MB string field", None),
    ]
    # The file and the commands that read it (report reads a run's summary and metrics, not run.json).
    files = {"run.json": ({"world": "two"}, [["doctor", "DIR/run"]]),
             "summary.json": ({"mfu": "high", "status": 7}, [["report", "DIR/run"], ["doctor", "DIR/run"]])}
    out = []
    for f, (wrong, commands) in files.items():
        for cmd in commands:
            for name, text in damages:
                def prep(d, f=f, name=name, text=text):
                    p = d / "run" / f
                    if name == "truncated":
                        p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2])
                    elif name == "a 1 MB string field":
                        j = json.loads(p.read_text())
                        j["mfu" if f == "summary.json" else "device"] = "y" * (1 << 20)
                        j["world"] = "z" * (1 << 20)
                        p.write_text(json.dumps(j))
                    else:
                        p.write_text(text)
                out.append(Case("c5", f"{f} {name} ({cmd[0]})", cmd, 2, [re.escape(f)], prepare=prep, keep=SAVED))
            out.append(Case("c5", f"{f} wrong field types ({cmd[0]})", cmd, 2, [re.escape(f)],
                            prepare=edit_json(f"run/{f}", lambda j, wrong=wrong: j.update(wrong)), keep=SAVED))
    for cmd in (["report", "DIR/run"], ["doctor", "DIR/run"]):
        for name, line in [("not JSON", "{oops"), ("step a string", '{"step": "3", "loss": 1.0}'),
                           ("loss an object", '{"step": 3, "loss": {"a": 1}}'), ("deep", "[" * 5000 + "]" * 5000)]:
            def prep(d, line=line):
                p = d / "run" / "metrics.jsonl"
                lines = p.read_text().splitlines()
                lines.insert(1, line)
                p.write_text("\n".join(lines) + "\n")
            out.append(Case("c5", f"metrics.jsonl line 2 {name} ({cmd[0]})", cmd, 2, [r"metrics\.jsonl:2"], prepare=prep,
                            keep=SAVED))
    # A resume keeps the log's lines up to its checkpoint: a damaged complete line stops it before
    # the log is rewritten.
    def damaged_line(d):
        p = d / "run" / "metrics.jsonl"
        lines = p.read_text().splitlines()
        lines.insert(1, "not a metrics line")
        p.write_text("\n".join(lines) + "\n")
    out.append(Case("c5", "metrics.jsonl damaged line at --resume", ["train", "DIR/run/config.toml", "--run-dir", "DIR/run",
                                                                    "--resume", "--set", "run.steps=6"], 2,
                    [r"metrics\.jsonl:2"], prepare=damaged_line, keep=SAVED))
    return out


def c6_truncated_shard():
    """Training on the shards; the shard cut short once the first checkpoint is written (run_truncation_case)."""
    return [Case("c6", "shard truncated during training", [], 1)]


def c7_non_utf8():
    bad = "DIR/r\udcff\udcfeun"  # surrogateescape: the bytes 0xFF 0xFE in the name
    return [
        Case("c7", "run directory with bytes 0xFF 0xFE trains", ["train", str(QUICKSTART), *TINY, "--set", "run.steps=2",
                                                               "--run-dir", bad], 0, ["done"]),
        Case("c7", "report of such a run", ["report", bad], 0, [],
             prepare=lambda d: shutil.copytree(d / "run", d / "r\udcff\udcfeun", symlinks=True),
             check=lambda d, _o: None if (d / "r\udcff\udcfeun" / "report.md").is_file() else "no report.md"),
        Case("c7", "sweep into a directory named with 0xFF writes valid JSON", ["sweep", "DIR/sweep.toml", "--out", "DIR/sw\udcff"],
             0, [], check=lambda d, _o: None if isinstance(json.loads((d / "sw\udcff" / "results.json").read_bytes()), (dict, list))
             else "results.json is not JSON"),
        Case("c7", "eval --json of such a run prints valid JSON", ["eval", "--checkpoint", bad, "--tokens", "DIR/data/small.bin",
                                                                   "--json"], 0, [],
             prepare=lambda d: shutil.copytree(d / "run", d / "r\udcff\udcfeun", symlinks=True),
             check=lambda d, out: None if json.loads(out[out.index("{"):out.rindex("}") + 1])["tokens"] > 0 else "no tokens"),
        Case("c7", "missing experiment file named with 0xFF", ["config", "show", "DIR/x\udcff.toml"], 2, [r"x.*\.toml"]),
        Case("c7", "eval of a missing checkpoint named with 0xFF", ["eval", "--checkpoint", bad, "--tokens",
                                                                    "DIR/data/shard_000.bin"], 2, ["r"]),
        Case("c7", "--set value with 0xFF", ["config", "show", str(QUICKSTART), "--set", "attention.name=na\udcffive"], 2,
             ["attention.name"]),
    ]


def c8_pathological():
    long_word = "a" * 100_000
    out = [
        Case("c8", "100k-character one-word prompt", ["sample", "--checkpoint", "DIR/shard_run", "--prompt", long_word,
                                                      "--tokens", "1", "--temperature", "0"], 0, [], limit=60),
        # One argument may be at most 128 KiB (MAX_ARG_STRLEN): 100 kB ones; 1 MB values come in files.
        Case("c8", "100 kB --set value is echoed bounded", ["config", "show", str(QUICKSTART), "--set",
                                                            "attention.name=" + "q" * 100_000], 2, ["attention.name"]),
        Case("c8", "100 kB key is echoed bounded", ["config", "show", str(QUICKSTART), "--set", "run." + "k" * 100_000 + "=1"], 2,
             ["run"]),
        Case("c8", "1 MB string in the experiment file", ["config", "show", "DIR/big.toml"], 2, ["big.toml"],
             prepare=write_text("big.toml", f'base = "{QUICKSTART}"\n[attention]\nname = "{"w" * (1 << 20)}"\n')),
    ]
    return out


def c9_tokenizers():
    def twice(d: Path):
        p = d / "data/tokenizer/encoder.json"
        enc = json.loads(p.read_text(encoding="utf-8"))
        enc["he"] = enc["h"]  # a second token with the id of the byte 'h'
        p.write_text(json.dumps(enc, ensure_ascii=False), encoding="utf-8")

    def same_bytes(d: Path):
        p = d / "data/tokenizer/encoder.json"
        enc = json.loads(p.read_text(encoding="utf-8"))
        t = byte_table()
        del enc[t[ord("q")]]
        enc[t[ord("q")]] = 0  # the byte 'q' given the id of byte 0: a byte mapped twice... and one byte without a token
        p.write_text(json.dumps(enc, ensure_ascii=False), encoding="utf-8")

    def truncate(rel, keep):
        def prep(d: Path):
            p = d / rel
            p.write_bytes(p.read_bytes()[:keep])
        return prep
    export = ["export", "--checkpoint", "DIR/shard_run", "--out", "DIR/hf"]
    sample = ["sample", "--checkpoint", "DIR/shard_run", "--prompt", "the", "--tokens", "2"]
    out = []
    for name, prep in [("an id given twice", twice), ("a byte's id reused", same_bytes),
                       ("encoder.json truncated", truncate("data/tokenizer/encoder.json", 300))]:
        for argv in (export, sample):
            out.append(Case("c9", f"{name} ({argv[0]})", argv, 2, ["encoder.json"], prepare=prep))
    for name, prep in [("vocab.bpe truncated mid-line", truncate("data/tokenizer/vocab.bpe", 30)),
                       ("vocab.bpe lacks its last merges", truncate("data/tokenizer/vocab.bpe", 22)),
                       ("vocab.bpe merges into unknown tokens", write_text("data/tokenizer/vocab.bpe", "#version: 0.2\nq z\n"))]:
        out.append(Case("c9", name, export, 2, ["vocab.bpe"], prepare=prep, check=lambda d, _o: "export written" if
                        (d / "hf" / "merges.txt").exists() else None))
    return out


def elsewhere(d: Path):
    p = d / "elsewhere"
    p.mkdir(exist_ok=True)
    return p


def c10_self_contained():
    def exported_tokenizer(d: Path, _o):
        missing = [f for f in ("vocab.json", "merges.txt", "config.json", "model.safetensors") if not (d / "hf" / f).exists()]
        return f"export lacks {missing}" if missing else None
    return [
        Case("c10", "sample from another directory", ["sample", "--checkpoint", "../shard_run", "--prompt", "the", "--tokens",
                                                       "3", "--temperature", "0"], 0, ["the"], cwd=elsewhere),
        Case("c10", "export from another directory writes the tokenizer", ["export", "--checkpoint", "../shard_run", "--out",
                                                                           "../hf"], 0, [], cwd=elsewhere,
             check=exported_tokenizer),
        Case("c10", "eval from another directory", ["eval", "--checkpoint", "../shard_run", "--tokens", "../data/shard_000.bin"],
             0, ["loss"], cwd=elsewhere),
        Case("c10", "export with the data gone is refused, not silently without tokenizer",
             ["export", "--checkpoint", "DIR/shard_run", "--out", "DIR/hf"], 2, ["--no-tokenizer"],
             prepare=lambda d: (d / "data/shard_000.bin").rename(d / "data/moved.bin"),
             check=lambda d, _o: "export written" if (d / "hf").exists() else None),
        Case("c10", "export --no-tokenizer with the data gone", ["export", "--checkpoint", "DIR/shard_run", "--out", "DIR/hf",
                                                                 "--no-tokenizer"], 0, [],
             prepare=lambda d: (d / "data/shard_000.bin").rename(d / "data/moved.bin")),
    ]


def c11_small_things():
    return [
        Case("c11", "eval shows progress in a log", ["eval", "--checkpoint", "DIR/run", "--tokens", "DIR/data/small.bin",
                                                     "--batch", "1", "--threads", "1"], 0, [r"eval: \d+/\d+ \(100%\)"]),
        Case("c11", "train --help names --resume", ["train", "--help"], 0, [r"--resume"]),
        Case("c11", "sample --help names --stop-at-eot as a flag", ["sample", "--help"], 0, [r"--stop-at-eot \[="]),
        Case("c11", "eval --help names --threads", ["eval", "--help"], 0, [r"--threads"]),
        Case("c11", "sample --stop-at-eot=off", ["sample", "--checkpoint", "DIR/run", "--tokens", "3", "--stop-at-eot=off"], 0),
    ]


def c12_cursor_positions():
    """A text corpus of one 50 MB line, cut into 32-token rows: 1.6 million pending pieces of one
    document, which a cursor of pieces wrote as 86 MB of state.json (over its 16 MiB cap)."""
    def big_text(d: Path):
        line = (b"the quick brown fox jumps over the lazy dog " * 1200000)[: 50 << 20]
        (d / "big.txt").write_bytes(line + b"\n")
    text = ["train", str(QUICKSTART), *TINY, "--set", "data.name=text_files", "--set", 'data.text_files.paths=["DIR/big.txt"]',
            "--set", "checkpoint.every=2", "--run-dir", "DIR/text"]

    def small_state(d: Path, _o):
        size = (d / "text/checkpoints/step_00000002/state.json").stat().st_size
        return None if size < (64 << 10) else f"state.json is {size} bytes for one pending document"

    def resumed(d: Path, _o):
        s = json.loads((d / "text" / "summary.json").read_text())
        return None if s.get("resumed_from") == 2 and s.get("steps") == 4 else f"summary: {s}"
    return [
        Case("c12", "50 MB one-line text: the checkpoint's cursor is small", text + ["--set", "run.steps=2"], 0, ["done"],
             prepare=big_text, check=small_state, limit=120),
        Case("c12", "50 MB one-line text: resumes from its cursor", text + ["--set", "run.steps=4", "--resume"], 0, ["resuming"],
             prepare=lambda d: (big_text(d), subprocess.run([str(ABLATE), *[a.replace("DIR", str(d)) for a in text],
                                                            "--set", "run.steps=2"], capture_output=True, timeout=120)),
             check=resumed, limit=120),
    ]


DEEP = "[" * 200000 + "]" * 200000


def deep_safetensors(rel):
    def prep(d: Path):
        header = ('{"a": ' + DEEP + "}").encode()
        (d / rel).write_bytes(struct.pack("<Q", len(header)) + header)
    return prep


def c13_json_depth():
    evaluate = ["eval", "--checkpoint", "DIR/run", "--tokens", "DIR/data/small.bin"]
    resume = ["train", "DIR/run/config.toml", "--run-dir", "DIR/run", "--resume", "--set", "run.steps=6"]
    sample = ["sample", "--checkpoint", "DIR/shard_run", "--prompt", "the", "--tokens", "2"]
    deep_object = '{"a": ' + DEEP + "}"
    out = [
        Case("c13", "state.json 200,000 deep (resume)", resume, 2, ["state.json", "deeper"], prepare=write_text(CKPT + "/state.json", DEEP),
             keep=["run/checkpoints/step_00000002"]),
        Case("c13", "state.json 200,000 deep (eval)", evaluate, 2, ["state.json", "deeper"],
             prepare=write_text(CKPT + "/state.json", DEEP)),
        Case("c13", "model.safetensors header 200,000 deep (eval)", evaluate, 2, ["model.safetensors", "deeper"],
             prepare=deep_safetensors(CKPT + "/model.safetensors")),
        Case("c13", "encoder.json 200,000 deep (sample)", sample, 2, ["encoder.json", "deeper"],
             prepare=write_text("data/tokenizer/encoder.json", deep_object)),
        Case("c13", "summary.json 200,000 deep (report)", ["report", "DIR/run"], 2, ["summary.json"],
             prepare=write_text("run/summary.json", DEEP), keep=["run/checkpoints"]),
        Case("c13", "summary.json 200,000 deep (--resume: read as a damaged summary)", resume, 0, ["resuming"],
             prepare=write_text("run/summary.json", DEEP)),
        Case("c13", "metrics.jsonl line 200,000 deep (--resume)", resume, 2, ["metrics.jsonl"],
             prepare=write_text("run/metrics.jsonl", DEEP + "\n"), keep=SAVED),
        Case("c13", "Hugging Face config.json 200,000 deep (import hf)", ["import", "hf", "DIR/hfdir", "--run-dir", "DIR/imported"], 2,
             ["config.json", "deeper"], prepare=write_text("hfdir/config.json", deep_object)),
    ]
    return out


def tiktoken_byte_twice(d: Path):
    """gpt2.tiktoken instead of encoder.json, the byte 'h' under two ids and 'q' under none."""
    t = byte_table()
    spelled = {v: k for k, v in t.items()}
    enc = json.loads((d / "data/tokenizer/encoder.json").read_text(encoding="utf-8"))
    lines = []
    for token, i in sorted(enc.items(), key=lambda kv: kv[1]):
        if token == "<|endoftext|>":
            continue
        b = bytes(spelled[c] for c in token)
        lines.append(base64.b64encode(b"h" if b == b"q" else b).decode() + f" {i}")
    (d / "data/tokenizer/encoder.json").unlink()
    (d / "data/tokenizer/vocab.bpe").unlink()
    (d / "data/tokenizer/gpt2.tiktoken").write_text("\n".join(lines) + "\n")


def c14_tokenizer_reads():
    export = ["export", "--checkpoint", "DIR/shard_run", "--out", "DIR/hf"]
    sample = ["sample", "--checkpoint", "DIR/shard_run", "--prompt", "the quick", "--tokens", "2"]
    no_export = lambda d, _o: "export written" if (d / "hf").exists() else None
    return [
        Case("c14", "gpt2.tiktoken with a byte under two ids and one missing (sample --prompt)", sample, 2, ["gpt2.tiktoken"],
             prepare=tiktoken_byte_twice),
        Case("c14", "vocab.bpe truncated (export)", export, 2, ["vocab.bpe"],
             prepare=lambda d: (d / "data/tokenizer/vocab.bpe").write_bytes((d / "data/tokenizer/vocab.bpe").read_bytes()[:30]),
             check=no_export),
        Case("c14", "vocab.bpe is a FIFO (export)", export, 2, ["vocab.bpe", "FIFO"],
             prepare=lambda d: replace_with("fifo")(d / "data/tokenizer/vocab.bpe"), check=no_export),
        Case("c14", "encoder.json unreadable (export)", export, 2, ["encoder.json"],
             prepare=lambda d: replace_with("directory")(d / "data/tokenizer/encoder.json"), check=no_export),
    ]


def c15_output_paths():
    fresh = ["train", str(QUICKSTART), *TINY, "--set", "run.steps=2", "--run-dir", "DIR/fresh"]

    def nothing_trained(d: Path, _out):
        return "it trained before refusing" if (d / "fresh" / "metrics.jsonl").exists() else None
    return [
        Case("c15", "export --out below a regular file", ["export", "--checkpoint", "DIR/run", "--out", "DIR/run/summary.json/hf"], 2,
             ["summary.json", "not a directory"], keep=SAVED),
        Case("c15", "sweep re-run where an arm's directory is a regular file", ["sweep", "DIR/sweep.toml", "--out", "DIR/sw"], 2,
             [r"sw/2", "not a directory"], prepare=lambda d: ((d / "sw").mkdir(), (d / "sw" / "2").write_text("x")),
             check=lambda d, _o: "an arm ran" if (d / "sw" / "1" / "summary.json").exists() else None),
        Case("c15", "a fresh run directory whose summary.json is a directory", fresh, 2, ["summary.json", "directory"],
             prepare=lambda d: (d / "fresh" / "summary.json").mkdir(parents=True), check=nothing_trained),
        Case("c15", "a fresh run directory whose run.json is a FIFO", fresh, 2, ["run.json", "FIFO"],
             prepare=lambda d: ((d / "fresh").mkdir(), os.mkfifo(d / "fresh" / "run.json")), check=nothing_trained),
        Case("c15", "sweep --out below a regular file", ["sweep", "DIR/sweep.toml", "--out", "DIR/run/summary.json/sw"], 2,
             ["summary.json", "not a directory"], keep=SAVED),
    ]


def c16_memory_plan():
    return [
        Case("c16", "max_seq_len 16777216 with learned positions under a 4 GB address-space limit",
             ["train", str(QUICKSTART), *TINY, "--set", "model.max_seq_len=16777216", "--set", "run.steps=1", "--run-dir", "DIR/big"],
             2, ["max_seq_len", "address-space"], address_space=4 << 30),
    ]


def overflowing_weights(d: Path):
    """Every weight of the checkpoint 3e38: finite, but the forward pass overflows."""
    p = d / CKPT / "model.safetensors"
    b = bytearray(p.read_bytes())
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    for k, v in header.items():
        if k != "__metadata__" and v["dtype"] == "F32":
            lo, hi = v["data_offsets"]
            b[8 + n + lo: 8 + n + hi] = struct.pack("<f", 3e38) * ((hi - lo) // 4)
    p.write_bytes(bytes(b))


def c17_nonfinite_eval():
    evaluate = ["eval", "--checkpoint", "DIR/run", "--tokens", "DIR/data/small.bin"]
    return [
        Case("c17", "weights all 3e38: eval refuses the non-finite loss, naming where", evaluate, 2,
             ["not finite", r"window \d+, position \d+", "--allow-nonfinite"], prepare=overflowing_weights),
        Case("c17", "weights all 3e38: eval --allow-nonfinite reports it", evaluate + ["--allow-nonfinite"], 0,
             [r"loss (nan|inf|-nan)", "window"], prepare=overflowing_weights),
    ]


def set_draw(value):
    def fn(j):
        for key in ("data_cursor",):
            j[key]["draw"] = value
        for c in j.get("data_cursors", []):
            c["draw"] = value
    return fn


def c18_cursor_draws():
    resume = ["train", "DIR/run/config.toml", "--run-dir", "DIR/run", "--resume", "--set", "run.steps=6"]
    st = CKPT + "/state.json"
    return [
        Case("c18", f"state.json draw = {name}", resume, 2, ["state.json", "draw"], prepare=edit_json(st, set_draw(value)), keep=SAVED)
        for name, value in (("2^64-1", 2**64 - 1), ("2^62", 2**62), ("10^12", 10**12))
    ]


CLASSES = [c1_regular_files, c2_numbers, c3_checkpoints, c4_run_dirs, c5_typed_reads, c6_truncated_shard, c7_non_utf8,
           c8_pathological, c9_tokenizers, c10_self_contained, c11_small_things, c12_cursor_positions, c13_json_depth,
           c14_tokenizer_reads, c15_output_paths, c16_memory_plan, c17_nonfinite_eval, c18_cursor_draws]


def run_truncation_case(case: Case, fixture: Fixture, scratch: Path):
    """c6: the shard is cut while the run maps it; exit 1 naming it, and its last checkpoint loads."""
    d = Path(tempfile.mkdtemp(prefix="case-", dir=scratch))
    try:
        shutil.copytree(fixture.work / "data", d / "data")
        argv = [str(fixture.ablate), "train", str(QUICKSTART), *TINY, *[a.replace(str(fixture.work), str(d)) for a in
                                                                        fixture.shard_args],
                "--set", "run.steps=1000000", "--set", "checkpoint.every=3", "--run-dir", str(d / "live")]
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=limit_resources, cwd=str(d))
        deadline = time.monotonic() + TIME_LIMIT_S
        while not (d / "live/checkpoints/latest").exists() and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.05)
        os.truncate(d / "data/shard_000.bin", 1024 + 64)
        try:
            out, _ = p.communicate(timeout=TIME_LIMIT_S)
            code = p.returncode
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            code = "timeout"
        text = out.decode("utf-8", "replace")
        problems = []
        if code != 1:
            problems.append(f"exit {code}, expected 1")
        if "shard_000.bin" not in text:
            problems.append("the message does not name the shard")
        # The last checkpoint is whole: its state reads and its weights load (eval on an intact shard).
        write_shard(d / "data/intact.bin", list(range(10)) * 20)
        r = subprocess.run([str(fixture.ablate), "eval", "--checkpoint", str(d / "live"), "--tokens", str(d / "data/intact.bin")],
                           capture_output=True, text=True, timeout=TIME_LIMIT_S)
        if r.returncode != 0:
            problems.append("the last checkpoint does not load: " + (r.stdout + r.stderr).strip().splitlines()[-1])
        return problems, 0.0, text.strip().splitlines()[-1] if text.strip() else ""
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ablate", type=Path)
    ap.add_argument("--only", default="", help="run the cases whose 'class: name' matches this regex")
    ap.add_argument("--jobs", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = ap.parse_args()
    ablate = args.ablate.resolve()
    global ABLATE
    ABLATE = ablate
    scratch = Path(tempfile.mkdtemp(prefix="ablate-probe-"))
    try:
        t0 = time.monotonic()
        fixture = Fixture(ablate, scratch / "fixture")
        cases = [c for make in CLASSES for c in make() if re.search(args.only, f"{c.klass}: {c.name}")]
        results = {}
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            futures = {pool.submit(run_truncation_case if c.klass == "c6" else run_case, c, fixture, scratch): i
                       for i, c in enumerate(cases)}
            for f in concurrent.futures.as_completed(futures):
                results[futures[f]] = f.result()
        failed = 0
        for i, c in enumerate(cases):
            problems, took, last = results[i]
            verdict = "FAIL" if problems else "ok  "
            failed += bool(problems)
            line = f"{verdict} {c.klass:<4} {c.name}"
            if problems:
                line += " -- " + "; ".join(problems) + f" | last line: {last[:200]}"
            print(line)
        print(f"{len(cases) - failed} passed, {failed} failed ({time.monotonic() - t0:.0f} s)")
        return 1 if failed else 0
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
