#!/usr/bin/env python3
"""docs/architecture.md's checkable claims hold for the tree it describes:

  1. every file or folder it names in backquotes exists (a header named as `runtime/x.hpp` or
     `data.hpp` under core/include/ablate/, a plugin's file as `cuda_layers/x.cpp` under plugins/,
     a test by its CTest name), except the files a run writes (state.json, ...);
  2. the plugin API version it states is version.hpp's ABLATE_API_VERSION;
  3. no file under core/ includes a CUDA header but the SDK helpers for CUDA plugins it names
     (cuda_check.hpp, cuda_launch.cuh), core's sources include neither, and core's CMakeLists
     links no CUDA library.

Usage: architecture_doc.py [SOURCE_DIR]   (default: the repository this script is in)"""
import re
import subprocess
import sys
from pathlib import Path

root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2]
doc = (root / "docs" / "architecture.md").read_text(encoding="utf-8")
tracked = subprocess.run(["git", "-C", str(root), "ls-files"], capture_output=True, text=True).stdout.split()
if not tracked:  # not a git checkout (a source tarball): every file below the root
    tracked = [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "build" not in p.parts]
files = set(tracked)
folders = {str(parent) for f in tracked for parent in Path(f).parents if str(parent) != "."}
names = {Path(f).name for f in tracked}
ctest_names = set()
for f in tracked:
    if f.endswith("CMakeLists.txt"):
        ctest_names.update(re.findall(r"add_test\(NAME\s+([^\s)]+)", (root / f).read_text(encoding="utf-8")))
RUN_FILES = {"state.json", "profile.json", "summary.json", "run.json", "metrics.jsonl", "metrics.csv", "config.toml",
             "arms.json", "arm.json", "results.json", "results.csv", "report.md", "plan.json", "jobs.json",
             "model.safetensors", "optimizer.safetensors"}
PREFIXES = ["", "core/include/ablate/", "core/src/", "plugins/", "tests/", "apps/ablate/"]
PATHLIKE = re.compile(r"[\w.<>*-]+(/[\w.<>*-]*)*")

failures = []
for token in sorted(set(re.findall(r"`([^`\s]+)`", doc))):
    t = token.split("::")[0].rstrip("/")
    looks_like_file = re.fullmatch(r"[\w./-]+\.(hpp|cpp|cuh|cu|py|sh|md|toml|txt)", t)
    looks_like_path = "/" in t and re.fullmatch(r"(core|plugins|apps|tests|bench|tools|docs|scripts|configs|third_party|runtime)"
                                                r"/[\w./-]*", t)
    if not (looks_like_file or looks_like_path) or t in RUN_FILES or t in ctest_names:
        continue
    if any(p + t in files or p + t in folders for p in PREFIXES) or ("/" not in t and t in names):
        continue
    failures.append(f"`{token}` names nothing in the tree")

m = re.search(r"API version \(`version\.hpp`, now (\d+)\)", doc)
api = re.search(r"#define ABLATE_API_VERSION (\d+)", (root / "core/include/ablate/version.hpp").read_text())
if not m:
    failures.append("the API version sentence (`version.hpp`, now N) is gone")
elif not api or m.group(1) != api.group(1):
    failures.append(f"the doc says API version {m.group(1)}, version.hpp has {api.group(1) if api else '?'}")

helpers = {"core/include/ablate/cuda_check.hpp", "core/include/ablate/cuda_launch.cuh"}
cuda_include = re.compile(r'#\s*include\s*[<"](cuda[\w_]*\.h|cublas[\w]*\.h|cudnn[\w]*\.h|nccl\.h|cuda/[^>"]+)[>"]')
for f in sorted(files):
    if not f.startswith("core/") or not f.endswith((".hpp", ".cpp", ".cuh", ".cu", ".h")):
        continue
    text = (root / f).read_text(encoding="utf-8", errors="replace")
    if cuda_include.search(text) and f not in helpers:
        failures.append(f"{f} includes a CUDA header; the doc says only {sorted(helpers)} do")
    if f.startswith("core/src/") and re.search(r'#\s*include\s*"ablate/(cuda_check\.hpp|cuda_launch\.cuh)"', text):
        failures.append(f"{f} includes a CUDA helper; the doc says core itself never does")
for h in helpers:
    if Path(h).name not in doc:
        failures.append(f"the doc does not name {Path(h).name} among the CUDA helpers")
if re.search(r"CUDA::|cudart|cublas|cudnn|nccl", (root / "core/CMakeLists.txt").read_text(), re.I):
    failures.append("core/CMakeLists.txt links a CUDA library; the doc says core links none")

for f in failures:
    print("FAIL " + f)
print(f"architecture.md: {len(failures)} claim(s) that do not hold")
sys.exit(1 if failures else 0)
