#!/usr/bin/env python3
"""Code shape: no function in core/ or apps/ over 100 lines, no class or struct in core/ over 300
with its methods.

Measured with Universal Ctags (start line and end line of each definition; length = end - start),
over the C++ sources (.cpp, .hpp, .cu, .cuh). Namespaces and prototypes are not counted. A class's
length is its body's plus that of each of its methods defined outside the body (in any file: a
class whose methods are moved out of the body is no shorter to read). Each definition over its
limit is named as file:line with its length. Fails where Universal
Ctags is absent (scripts/setup-tests.sh installs universal-ctags).

Usage: code_shape.py [SOURCE_DIR]   (default: the repository this script is in)
"""
import os
import shutil
import subprocess
import sys

FUNCTION_LIMIT = 100  # lines, core/ and apps/
CLASS_LIMIT = 300  # lines of the body and of every method defined outside it, core/
FUNCTION_DIRS = ("core", "apps")
CLASS_DIRS = ("core",)


def find_ctags():
    ctags = shutil.which("ctags")
    if ctags is None:
        return None
    try:
        version = subprocess.run([ctags, "--version"], capture_output=True, text=True).stdout
    except OSError:
        return None
    return ctags if "Universal Ctags" in version else None


def definitions(ctags, root, dirs):
    """(kind, name, file, start, end, scope) of every function, class and struct under root/dirs."""
    dirs = [d for d in dirs if os.path.isdir(os.path.join(root, d))]
    if not dirs:
        return []
    cmd = [ctags, "--options=NONE", "-R", "--languages=C++", "--map-C++=+.cu", "--map-C++=+.cuh",
           "--kinds-C++=+p-d", "--fields=+neKZ", "-x", "--_xformat=%K\t%F\t%n\t%{end}\t%N\t%{scope}"] + dirs
    run = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"code_shape: ctags failed ({run.returncode}): {run.stderr.strip()}")
    found = []
    for line in run.stdout.splitlines():
        fields = line.split("\t", 5)
        if len(fields) == 5:
            fields.append("")
        if len(fields) != 6 or fields[0] not in ("function", "class", "struct"):
            continue
        kind, path, start, end, name, scope = fields
        if not start.isdigit() or not end.isdigit():
            continue  # no end line: nothing to measure
        found.append((kind, name, path, int(start), int(end), scope.replace("scope:", "", 1).split(":", 1)[-1] if scope.startswith("scope:") else scope))
    return found


def out_of_body(defs):
    """Per qualified class name, the lines of its methods defined outside its body."""
    bodies = {}
    for kind, name, path, start, end, scope in defs:
        if kind in ("class", "struct"):
            bodies.setdefault(f"{scope}::{name}" if scope else name, []).append((path, start, end))
    extra = {}
    for kind, name, path, start, end, scope in defs:
        if kind != "function" or scope not in bodies:
            continue
        if any(p == path and s <= start <= e for p, s, e in bodies[scope]):
            continue  # defined in the body: already counted
        extra[scope] = extra.get(scope, 0) + end - start + 1
    return extra


def violations(defs):
    out = []
    extra = out_of_body(defs)
    for kind, name, path, start, end, scope in defs:
        top = path.split("/", 1)[0]
        length = end - start
        if kind in ("class", "struct"):
            length += extra.get(f"{scope}::{name}" if scope else name, 0)
        if kind == "function" and top in FUNCTION_DIRS and length > FUNCTION_LIMIT:
            out.append((path, start, f"function {name} is {length} lines (limit {FUNCTION_LIMIT})"))
        elif kind in ("class", "struct") and top in CLASS_DIRS and length > CLASS_LIMIT:
            out.append((path, start, f"{kind} {name} is {length} lines (limit {CLASS_LIMIT})"))
    return sorted(out)


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    ctags = find_ctags()
    if ctags is None:
        print("FAIL: Universal Ctags (ctags) not found: scripts/setup-tests.sh installs universal-ctags")
        return 1
    defs = definitions(ctags, root, FUNCTION_DIRS)
    found = violations(defs)
    for path, line, what in found:
        print(f"{path}:{line}: {what}")
    if found:
        print(f"FAIL: {len(found)} definitions over their limit")
        return 1
    print(f"PASS: {len(defs)} functions, classes and structs in {', '.join(FUNCTION_DIRS)} within limits")
    return 0


if __name__ == "__main__":
    sys.exit(main())
