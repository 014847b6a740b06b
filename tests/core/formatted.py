#!/usr/bin/env python3
"""Every C++ and CUDA source of the project is as clang-format writes it with the project's
.clang-format (whitespace only: includes, comments and literals are left as written). The style is
tuned to clang-format 14, whose output it was applied with; the check runs that version
(clang-format-14, or clang-format when it is 14) and fails naming each file that differs, with the
command that fixes it.

usage: formatted.py ROOT
"""
import re
import shutil
import subprocess
import sys
from pathlib import Path

root = Path(sys.argv[1]).resolve()
PATTERNS = ("*.cpp", "*.hpp", "*.cu", "*.cuh", "*.h")


def clang_format_14():
    for name in ("clang-format-14", "clang-format"):
        exe = shutil.which(name)
        if exe is None:
            continue
        out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
        if re.search(r"version 14\.", out):
            return exe
    return None


exe = clang_format_14()
if exe is None:
    print("clang-format 14 not found (scripts/setup-tests.sh installs clang-format-14)")
    sys.exit(1)
listed = subprocess.run(["git", "-C", str(root), "ls-files", *PATTERNS], capture_output=True, text=True, check=True)
files = [f for f in listed.stdout.split() if not f.startswith("third_party/")]
if not files:
    print("no sources listed: not a git checkout?")
    sys.exit(1)
differ = []
for i in range(0, len(files), 64):
    chunk = files[i:i + 64]
    r = subprocess.run([exe, "--dry-run", "--Werror", *chunk], cwd=root, capture_output=True, text=True)
    if r.returncode != 0:
        differ += sorted({m.group(1) for m in re.finditer(r"^(\S+?):\d+:\d+: error", r.stderr, re.M)})
if differ:
    for f in differ:
        print(f"not formatted: {f}")
    print(f"{len(differ)} file(s) differ from .clang-format; fix with: {exe} -i " + " ".join(differ))
    sys.exit(1)
print(f"PASS: {len(files)} sources as .clang-format writes them ({exe})")
