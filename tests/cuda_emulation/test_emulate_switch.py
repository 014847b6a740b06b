#!/usr/bin/env python3
"""ABLATE_EMULATE_CUDA as the `ablate` program reads it: 1 takes the CUDA plugins built for the
emulated device (bin/plugins/emulated/) instead of the GPU builds and leaves out the GPU-only ones
with their reason; another value, or 1 without the emulated builds, is exit 2 saying what to do.
Usage: test_emulate_switch.py ABLATE_BINARY"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

ablate = sys.argv[1]
failures = []


def run(args, env_value, binary=ablate):
    env = dict(os.environ)
    env.pop("ABLATE_PLUGIN_PATH", None)
    if env_value is None:
        env.pop("ABLATE_EMULATE_CUDA", None)
    else:
        env["ABLATE_EMULATE_CUDA"] = env_value
    return subprocess.run([binary] + args, env=env, capture_output=True, text=True, timeout=120)


def check(ok, what, detail=""):
    if not ok:
        failures.append(what + (": " + detail if detail else ""))


for bad in ["2", "yes", "true"]:
    r = run(["plugins", "list"], bad)
    check(r.returncode == 2, f"ABLATE_EMULATE_CUDA={bad} exits 2", f"rc {r.returncode}")
    check("ABLATE_EMULATE_CUDA" in r.stderr and "expected 1" in r.stderr and f'"{bad}"' in r.stderr,
          f"ABLATE_EMULATE_CUDA={bad} is named with what was expected", r.stderr)

r = run(["plugins", "list", "--json"], "1")
check(r.returncode == 0, "plugins list under emulation", r.stderr)
listed = json.loads(r.stdout) if r.returncode == 0 else {}
entries = listed if isinstance(listed, list) else listed.get("components", [])
device = [e for e in entries if e.get("kind") == "device" and e.get("name") == "cuda"]
check(len(device) == 1 and "/emulated/" in device[0].get("library", ""), "the cuda device comes from emulated/", str(device))
for name in ["cuda_layers", "naive_cuda", "adamw_fused", "adamw8bit"]:
    libs = {e.get("library", "") for e in entries if e.get("library", "").endswith(f"libablate_{name}.so")}
    check(len(libs) == 1 and all("/emulated/" in l for l in libs), f"{name} comes from emulated/ only", str(libs))

r = run(["plugins", "list", "--json"], None)
entries = json.loads(r.stdout) if r.returncode == 0 else []
entries = entries if isinstance(entries, list) else entries.get("components", [])
check(all("/emulated/" not in e.get("library", "") for e in entries), "without the switch no emulated build is loaded")

# The program alone in a directory (no plugins/emulated/ beside it): 1 is refused, naming the build command.
with tempfile.TemporaryDirectory() as tmp:
    lone = os.path.join(tmp, "ablate")
    shutil.copy(ablate, lone)
    r = run(["plugins", "list"], "1", binary=lone)
    check(r.returncode == 2, "1 without the emulated builds exits 2", f"rc {r.returncode} {r.stderr}")
    check("ablate_emulated_cuda" in r.stderr, "the message names the build target", r.stderr)

for f in failures:
    print("FAIL:", f)
print(f"{'ok' if not failures else 'FAILED'}: {len(failures)} failure(s)")
sys.exit(1 if failures else 0)
