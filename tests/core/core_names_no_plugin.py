#!/usr/bin/env python3
"""Core names no plugin: outside core/include/ablate/runtime/defaults.hpp (the components an
experiment gets when it names none, and those core falls back on), no source of core/src or
core/include/ablate holds a string literal that is a plugin's registration name. The SDK headers
that are a plugin family's shared face (adamw_keys.hpp: the AdamW family's keys) name their family
and are left out, provided no source of core includes them. Core knows plugins
through the registry and the experiment's keys; a layer answers its own defaults and checks
(LayerBase::default_epsilon, default_hidden, unsupported), so a new plugin never needs a line of
core.

The names come from the built `ablate plugins list --json` (every registration, aliases included).
Device registrations are left out: the list is open (run.device is checked against the loaded
device registrations, and a plugin's device gets its DeviceType from its name), but DeviceType keeps
constants for the two built-in devices, which name them. Comments are skipped, and so are layer-role names where
core spells a role (`case LayerRole::linear: return "linear";`), the same word as a plugin's.

Usage: core_names_no_plugin.py ABLATE_BINARY [SOURCE_DIR]"""
import json
import re
import subprocess
import sys
from pathlib import Path

ablate = sys.argv[1]
root = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(__file__).resolve().parents[2]
listing = json.loads(subprocess.run([ablate, "plugins", "list", "--json"], check=True, capture_output=True, text=True).stdout)
names = {c["name"] for c in listing["components"] if c["kind"] != "device"}
assert {"naive_cpu", "swiglu_mlp", "rmsnorm", "single", "adamw"} <= names, f"the plugin listing looks wrong: {sorted(names)}"

ALLOWED = {"core/include/ablate/runtime/defaults.hpp"}
# SDK headers that are a plugin family's shared face, for the plugins of that family alone: they
# may name the family, and no source of core includes them (checked below).
PLUGIN_FACES = {"core/include/ablate/adamw_keys.hpp"}
LITERAL = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
ROLE_CASE = re.compile(r'case\s+LayerRole::(\w+)\s*:\s*return\s+"(\w+)"')


def code_of(text: str) -> str:
    """The text with comments blanked (string literals kept; a // inside a literal is not a comment)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            out.append("\n" * text.count("\n", i, n if j < 0 else j))
            i = n if j < 0 else j + 2
        elif c == "'":  # a character literal: '"' must not open a string
            j = i + 1
            while j < n and text[j] != "'":
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


failures = []
files = sorted(p for d in ("core/src", "core/include/ablate") for p in (root / d).rglob("*")
               if p.suffix in {".hpp", ".cpp", ".cuh", ".cu", ".h"})
assert files, f"no sources under {root}/core"
for path in files:
    rel = str(path.relative_to(root))
    if rel in ALLOWED or rel in PLUGIN_FACES:
        continue
    text = path.read_text(encoding="utf-8", errors="replace")
    for face in PLUGIN_FACES:
        if re.search(r'#\s*include\s*"ablate/' + re.escape(Path(face).name) + '"', text):
            failures.append(f"{rel} includes {face}, a plugin family's face that core must not use")
    for lineno, line in enumerate(code_of(path.read_text(encoding="utf-8", errors="replace")).splitlines(), 1):
        roles = {m.group(2) for m in ROLE_CASE.finditer(line) if m.group(1) == m.group(2)}
        for m in LITERAL.finditer(line):
            if m.group(1) in names and m.group(1) not in roles:
                failures.append(f"{rel}:{lineno}: names the plugin \"{m.group(1)}\": {line.strip()}")

for f in failures:
    print("FAIL " + f)
print(f"core: {len(failures)} plugin name(s) outside defaults.hpp ({len(files)} files, {len(names)} plugin names)")
sys.exit(1 if failures else 0)
