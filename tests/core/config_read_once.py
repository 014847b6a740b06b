#!/usr/bin/env python3
"""The config is read in one place: RunSpec::from (core/src/run_spec.cpp) turns a Config into typed
fields, and every other module of core/, apps/ and bench/ takes the RunSpec.

Fails, naming file:line, where a source outside core/src/config.cpp and core/src/run_spec.cpp
- calls one of Config's section accessors (section, implementation, implementations, selected,
  selected_list, has_section, has_implementation), or
- takes a `const Config&` parameter, except the two entry points that read a Config into a RunSpec
  before anything else (ablate::train; load_model's checkpoint, which parses its config.toml).

Usage: config_read_once.py [SOURCE_DIR]   (default: the repository this script is in)
"""
import os
import re
import sys

DIRS = ("core", "apps", "bench")
READERS = {os.path.join("core", "src", "config.cpp"), os.path.join("core", "src", "run_spec.cpp")}
ACCESSOR = re.compile(r"(\.|->)(section|implementations?|selected|selected_list|has_section|has_implementation)\(")
CONFIG_PARAM = re.compile(r"\bconst\s+(ablate::)?Config\s*&")
# Declarations and definitions allowed to take a Config: the builder's front door.
ENTRY_POINTS = (
    re.compile(r"TrainResult\s+train\(const\s+Config&"),
    re.compile(r"static\s+RunSpec\s+from\(const\s+Config&"),
    re.compile(r"RunSpec\s+RunSpec::from\(const\s+Config&"),
)
SUFFIXES = (".cpp", ".hpp", ".cu", ".cuh", ".h")


def strip_comment(line):
    i = line.find("//")
    return line if i < 0 else line[:i]


def scan(root):
    problems = []
    for d in DIRS:
        for base, _, files in os.walk(os.path.join(root, d)):
            for name in sorted(files):
                if not name.endswith(SUFFIXES):
                    continue
                path = os.path.join(base, name)
                rel = os.path.relpath(path, root)
                if rel in READERS:
                    continue
                with open(path, encoding="utf-8", errors="replace") as f:
                    for n, raw in enumerate(f, 1):
                        line = strip_comment(raw)
                        m = ACCESSOR.search(line)
                        if m:
                            problems.append(f"{rel}:{n}: reads the config's sections ({m.group(2)}): take the RunSpec's field instead")
                        if CONFIG_PARAM.search(line) and not any(e.search(line) for e in ENTRY_POINTS):
                            problems.append(f"{rel}:{n}: takes a const Config&: take a const RunSpec& (RunSpec::from reads it once)")
    return problems


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    problems = scan(root)
    for p in problems:
        print(p)
    if problems:
        print(f"config_read_once: {len(problems)} place(s) read the config outside RunSpec::from")
        return 1
    print("config_read_once: the config is read only by core/src/config.cpp and core/src/run_spec.cpp")
    return 0


if __name__ == "__main__":
    sys.exit(main())
