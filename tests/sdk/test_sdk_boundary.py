#!/usr/bin/env python3
"""The plugin SDK and the runtime stay apart.

core/include/ablate/ is the plugin SDK (the interfaces plugins implement and the helpers they may
use); core/include/ablate/runtime/ holds the runtime's own headers (trainer, model, config, ...),
for core, apps, tests and benchmarks only. Fails, naming file and line, when
  - a file under plugins/ or docs/examples/ includes a runtime header,
  - an SDK header includes a runtime header,
  - the installed headers (core's install rules run into a temporary prefix) hold runtime/, miss an
    SDK header, or include an ablate header the install does not hold.

Usage: test_sdk_boundary.py SOURCE_DIR [BUILD_DIR CMAKE]
Without BUILD_DIR and CMAKE, the install check reads the rule in core/CMakeLists.txt instead.
"""
import os
import re
import subprocess
import sys
import tempfile

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')
SOURCE_EXT = (".c", ".cc", ".cpp", ".cxx", ".h", ".hh", ".hpp", ".cu", ".cuh", ".inl", ".ipp")


def includes(path):
    """(line number, included path) of every #include of a text file."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except (UnicodeDecodeError, OSError):
        return []
    found = []
    for n, line in enumerate(lines, 1):
        m = INCLUDE.match(line)
        if m:
            found.append((n, m.group(1)))
    return found


def is_runtime(included, in_sdk=False):
    """Whether an include names a runtime header (in an SDK header, also relative: runtime/x.hpp)."""
    path = os.path.normpath(included).replace(os.sep, "/")
    return "ablate/runtime/" in path or (in_sdk and path.startswith("runtime/"))


def files_under(root, top, extensions=None):
    base = os.path.join(root, top)
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "build")
        for name in sorted(filenames):
            if extensions is None or name.endswith(extensions):
                yield os.path.join(dirpath, name)


def sdk_headers(root):
    """Paths of the SDK headers, relative to core/include (ablate/x.hpp)."""
    inc = os.path.join(root, "core", "include")
    out = []
    for path in files_under(root, os.path.join("core", "include", "ablate"), SOURCE_EXT):
        rel = os.path.relpath(path, inc)
        if not rel.startswith(os.path.join("ablate", "runtime") + os.sep):
            out.append(rel)
    return out


def check_includes(root):
    failures = []
    for top in ("plugins", os.path.join("docs", "examples")):
        for path in files_under(root, top):
            for n, inc in includes(path):
                if is_runtime(inc):
                    failures.append(f"{os.path.relpath(path, root)}:{n}: a plugin includes the runtime header {inc}")
    inc_dir = os.path.join(root, "core", "include")
    for rel in sdk_headers(root):
        for n, inc in includes(os.path.join(inc_dir, rel)):
            if is_runtime(inc, in_sdk=True):
                failures.append(f"core/include/{rel}:{n}: an SDK header includes the runtime header {inc}")
    return failures


def check_install(root, build_dir, cmake):
    """Runs core's install rules into a temporary prefix and looks at the headers it holds."""
    script = os.path.join(build_dir, "core", "cmake_install.cmake")
    if not os.path.isfile(script):
        return [f"{script}: missing (configure the build first)"]
    failures = []
    with tempfile.TemporaryDirectory() as prefix:
        run = subprocess.run([cmake, f"-DCMAKE_INSTALL_PREFIX={prefix}", "-P", script],
                             capture_output=True, text=True)
        if run.returncode != 0:
            return [f"installing core failed ({run.returncode}): {run.stderr.strip()}"]
        inc = os.path.join(prefix, "include")
        installed = set()
        for dirpath, _, filenames in os.walk(inc):
            for name in filenames:
                installed.add(os.path.relpath(os.path.join(dirpath, name), inc))
        for rel in sorted(installed):
            if os.path.join("ablate", "runtime") + os.sep in rel:
                failures.append(f"install: include/{rel} is a runtime header")
        for rel in sdk_headers(root):
            if rel not in installed:
                failures.append(f"install: the SDK header include/{rel} is not installed")
        for rel in sorted(installed):
            for n, included in includes(os.path.join(inc, rel)):
                if included.startswith("ablate/") and included not in installed:
                    failures.append(f"install: include/{rel}:{n} includes {included}, which is not installed")
        print(f"install: {len(installed)} headers under include/")
    return failures


def check_install_rule(root):
    """Without a build: core/CMakeLists.txt installs include/ablate with runtime excluded."""
    text = open(os.path.join(root, "core", "CMakeLists.txt"), encoding="utf-8").read()
    rules = re.findall(r"install\s*\(\s*DIRECTORY\s+include/ablate\b[^)]*\)", text)
    if not rules:
        return ["core/CMakeLists.txt: no install(DIRECTORY include/ablate ...) rule"]
    return [f"core/CMakeLists.txt: {rule!r} does not exclude runtime" for rule in rules
            if not re.search(r"PATTERN\s+\"?runtime\"?\s+EXCLUDE", rule)]


def main():
    if len(sys.argv) not in (2, 4):
        sys.exit(__doc__)
    root = os.path.abspath(sys.argv[1])
    failures = check_includes(root)
    if len(sys.argv) == 4:
        failures += check_install(root, os.path.abspath(sys.argv[2]), sys.argv[3])
    else:
        failures += check_install_rule(root)
    for f in failures:
        print(f)
    if failures:
        print(f"FAIL: {len(failures)} crossings of the SDK/runtime boundary")
        return 1
    print(f"PASS: {len(sdk_headers(root))} SDK headers; no plugin, example or SDK header includes ablate/runtime/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
