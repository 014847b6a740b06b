#!/usr/bin/env python3
"""The device bundle's dense rows (scripts/bundle/run.sh's GPT2_DENSE and LLAMA_DENSE settings, read
from the script itself) are what the PyTorch peer trains: every row one document of the config's
full length (1024 tokens for gpt2-124m, 2048 for llama-1b), no padding, one segment, so dense causal
attention; the packed probe rows the other GPT-2 runs train hold several short documents a row.
Checked with `ablate data analyze` on each config as run.sh runs it (data.name = synthetic_probes).
Usage: test_gpt2_dense_rows.py ABLATE SOURCE_DIR"""
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

ablate, source = sys.argv[1], Path(sys.argv[2])
script = (source / "scripts" / "bundle" / "run.sh").read_text()


def dense_sets(array):
    m = re.search(r"^" + array + r"=\((.*?)\)", script, re.S | re.M)
    if not m:
        sys.exit(f"FAIL: run.sh has no {array}=( ... ) array")
    words = shlex.split(m.group(1))
    sets = [words[i + 1] for i in range(len(words) - 1) if words[i] == "--set"]
    if not sets or len(sets) * 2 != len(words):
        sys.exit(f"FAIL: {array} is not a list of --set KEY=VALUE: {words}")
    return sets


def packed(extra, config="gpt2-124m.toml"):
    argv = [ablate, "data", "analyze", str(source / "configs" / config), "--set", "data.name=synthetic_probes",
            "--documents", "2000", "--json"]
    for s in extra:
        argv += ["--set", s]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        sys.exit(f"FAIL: {' '.join(argv)}: exit {r.returncode}\n{r.stdout}{r.stderr}")
    j = json.loads(r.stdout[r.stdout.index("{"):])
    return j["seq_len"], j["packed"]


failures = []
for array, config, length in (("GPT2_DENSE", "gpt2-124m.toml", 1024), ("LLAMA_DENSE", "llama-1b.toml", 2048)):
    T, dense = packed(dense_sets(array), config)
    if T != length:
        failures.append(f"{array}: seq_len {T}, expected {length}")
    if not (dense["segments_per_row"] == 1.0 and dense["padding_fraction"] == 0.0 and dense["real_fraction"] == 1.0):
        failures.append(f"{array}: dense rows are not one whole document each: {dense}")
    print(f"{array} on {config}: {dense['segments_per_row']:.2f} documents a row of {T}, "
          f"padding {dense['padding_fraction']:.3f}")
_, probes = packed([])
if not probes["segments_per_row"] > 2.0:
    failures.append(f"the packed probe rows hold {probes['segments_per_row']:.2f} documents a row, expected several")
print(f"packed probe rows: {probes['segments_per_row']:.2f} documents a row")
for f in failures:
    print("FAIL " + f)
sys.exit(1 if failures else 0)
