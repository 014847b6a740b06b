#!/usr/bin/env python3
"""Reading one training step: the lines a newcomer reads to follow one optimizer step through core,
from the trainer's loop to the optimizer's call, stay at most 1,000.

The step's path is the list below: every function of core that one step of `ablate train` runs (the
loop's body, the engine's five phases, the model's passes and the calls they build, the metrics),
each counted from its first line to its last with Universal Ctags. Set-up, checkpoints, evaluation
and the plugins the step calls (layers, attention, optimizer, communicator, loggers) are outside
it: each is read on its own, behind its interface. A function on the list that no longer exists
fails the test, so a rename or a split is reflected here rather than silently dropped.

Usage: step_reading.py [SOURCE_DIR]   (prints the table; exit 1 past the limit or on a missing name)"""
import json
import shutil
import subprocess
import sys
from pathlib import Path

LIMIT = 1000
root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2]

# (file, scope suffix or "", name): every function one step runs, in the order it runs, and the
# two structures its passes walk.
STEP = [
    ("core/src/trainer.cpp", "", "train_steps"),
    ("core/src/trainer.cpp", "", "preempt_requested"),
    ("core/src/engine.cpp", "Engine", "step"),
    ("core/src/engine.cpp", "StepContext", "timed"),
    ("core/src/engine.cpp", "StepContext", "profiled"),
    ("core/src/engine.cpp", "", "count_targets"),
    ("core/src/engine.cpp", "", "forward_backward"),
    ("core/src/engine.cpp", "", "reduce_gradients"),
    ("core/src/engine.cpp", "", "update_params"),
    ("core/src/engine.cpp", "", "end_step"),
    ("core/src/model.cpp", "Model", "end_step"),
    ("core/src/model.cpp", "SiteScaling", "end_step"),
    ("core/src/model.cpp", "SiteScaling", "of"),
    ("core/src/model.cpp", "Model", "forward_backward"),
    ("core/src/model.cpp", "", "check_batch"),
    ("core/src/model.cpp", "Impl", "run_forward"),
    ("core/src/model.cpp", "Impl", "run_backward"),
    ("core/src/model.cpp", "Impl", "timed"),
    ("core/src/model.cpp", "Impl", "prepare"),
    ("core/src/model.cpp", "Impl", "problem"),
    ("core/src/model.cpp", "Impl", "set_dropout"),
    ("core/src/model.cpp", "Impl", "attention_site"),
    ("core/src/model.cpp", "Impl", "forward_site"),
    ("core/src/model.cpp", "Impl", "recompute_block"),
    ("core/src/model.cpp", "Impl", "call_of"),
    ("core/src/model.cpp", "Impl", "classifier_call"),
    ("core/src/model.cpp", "Impl", "adapter_call"),
    ("core/src/model_layers.cpp", "ActivationArena", "arena"),
    ("core/src/model_layers.cpp", "ActivationArena", "arena_tail"),
    ("core/src/model_layers.cpp", "ActivationArena", "heads4"),
    ("core/src/run_metrics.cpp", "RunMetrics", "record"),
    # What the passes walk: a site of the schedule (which layer, which slots) and the schedule.
    ("core/src/model_schedule.hpp", "schedule", "Site"),
    ("core/src/model_schedule.hpp", "schedule", "Schedule"),
]

ctags = shutil.which("ctags")
if ctags is None:
    print("FAIL ctags is absent (scripts/setup-tests.sh installs universal-ctags)")
    sys.exit(1)
files = sorted({f for f, _, _ in STEP})
out = subprocess.run([ctags, "--output-format=json", "--fields=+neKS", "--c++-kinds=fs", "-o", "-", *files],
                     cwd=root, check=True, capture_output=True, text=True).stdout
tags = [json.loads(line) for line in out.splitlines() if line.startswith("{")]

failures, rows, total = [], [], 0
for path, scope, name in STEP:
    found = [t for t in tags if t.get("path") == path and t.get("name") == name and t.get("kind") in ("function", "struct") and "end" in t
             and (not scope or t.get("scope", "").split("::")[-1] == scope)]
    if not found:
        failures.append(f"{path}: no function {scope + '::' if scope else ''}{name} (renamed or split? update this list)")
        continue
    lines = sum(t["end"] - t["line"] + 1 for t in found)  # overloads of one name on the path: all read
    total += lines
    rows.append((path, (scope + "::" if scope else "") + name, lines))

for path, name, lines in rows:
    print(f"{lines:5d}  {path}  {name}")
print(f"{total:5d}  lines to read one training step ({len(rows)} functions in {len(files)} files; limit {LIMIT})")
if total > LIMIT:
    failures.append(f"one step reads {total} lines, over the limit of {LIMIT}")
for f in failures:
    print("FAIL " + f)
sys.exit(1 if failures else 0)
