#!/usr/bin/env python3
"""The device bundle's dense GPT-2 rows (scripts/bundle/run.sh's GPT2_DENSE settings, read from the
script itself) are what the PyTorch peer trains: every row one 1024-token document, no padding, one
segment, so dense causal attention; the packed probe rows the other runs train hold several short
documents a row. Checked with `ablate data analyze` on the gpt2-124m config as run.sh runs it
(data.name = synthetic_probes). Usage: test_gpt2_dense_rows.py ABLATE SOURCE_DIR"""
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

ablate, source = sys.argv[1], Path(sys.argv[2])
script = (source / "scripts" / "bundle" / "run.sh").read_text()
m = re.search(r"^GPT2_DENSE=\((.*?)\)", script, re.S | re.M)
if not m:
    sys.exit("FAIL: run.sh has no GPT2_DENSE=( ... ) array")
words = shlex.split(m.group(1))
sets = [words[i + 1] for i in range(len(words) - 1) if words[i] == "--set"]
if not sets or len(sets) * 2 != len(words):
    sys.exit(f"FAIL: GPT2_DENSE is not a list of --set KEY=VALUE: {words}")


def packed(extra):
    argv = [ablate, "data", "analyze", str(source / "configs" / "gpt2-124m.toml"), "--set", "data.name=synthetic_probes",
            "--documents", "2000", "--json"]
    for s in extra:
        argv += ["--set", s]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        sys.exit(f"FAIL: {' '.join(argv)}: exit {r.returncode}\n{r.stdout}{r.stderr}")
    j = json.loads(r.stdout[r.stdout.index("{"):])
    return j["seq_len"], j["packed"]


failures = []
T, dense = packed(sets)
if T != 1024:
    failures.append(f"seq_len {T}, expected 1024")
if not (dense["segments_per_row"] == 1.0 and dense["padding_fraction"] == 0.0 and dense["real_fraction"] == 1.0):
    failures.append(f"dense rows are not one whole document each: {dense}")
_, probes = packed([])
if not probes["segments_per_row"] > 2.0:
    failures.append(f"the packed probe rows hold {probes['segments_per_row']:.2f} documents a row, expected several")
print(f"dense: {dense['segments_per_row']:.2f} documents a row, padding {dense['padding_fraction']:.3f}; "
      f"packed probe rows: {probes['segments_per_row']:.2f} documents a row")
for f in failures:
    print("FAIL " + f)
sys.exit(1 if failures else 0)
