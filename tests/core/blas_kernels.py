#!/usr/bin/env python3
"""OpenBLAS runs the widest kernels the processor has: with OPENBLAS_CORETYPE unset, the CPU layers'
OpenBLAS reports SkylakeX kernels on a processor with AVX-512 (F, BW, VL, DQ, CD), Haswell (Zen on
AMD) with AVX2 and FMA only, and its own choice otherwise, read from /proc/cpuinfo here, apart from
the code under test; a kernel set the user names in OPENBLAS_CORETYPE is kept as it is.

usage: blas_kernels.py ABLATE
"""
import os
import re
import subprocess
import sys


def cpu():
    flags, vendor = set(), ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() == "flags" and not flags:
                flags = set(value.split())
            if key.strip() == "vendor_id" and not vendor:
                vendor = value.strip()
    return flags, vendor


def kernels(ablate, env):
    r = subprocess.run([ablate, "-v", "plugins", "list"], capture_output=True, text=True, env=env, timeout=120)
    if r.returncode != 0:
        sys.exit(f"FAIL ablate -v plugins list: exit {r.returncode}\n{r.stderr[-2000:]}")
    m = re.search(r"cpu_layers: OpenBLAS .*\((\w+) kernels\)", r.stderr)
    if m is None:
        sys.exit("FAIL no 'cpu_layers: OpenBLAS ... kernels' line in the debug log:\n" + r.stderr[-2000:])
    return m.group(1), r.stderr


def main():
    ablate = sys.argv[1]
    flags, vendor = cpu()
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    got, log = kernels(ablate, env)
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"} <= flags:
        want = "SkylakeX"
    elif {"avx2", "fma"} <= flags:
        want = "Zen" if vendor == "AuthenticAMD" else "Haswell"
    else:
        want = None  # OpenBLAS's own choice: only the log line is checked
    failures = []
    print(f"processor {vendor}, AVX-512: {'avx512f' in flags}, AVX2: {'avx2' in flags}; OpenBLAS runs {got} kernels")
    if want is not None and got.lower() != want.lower():
        failures.append(f"OpenBLAS runs {got} kernels where the processor runs {want}'s")
    if want is None and "OpenBLAS's own choice" not in log:
        failures.append("no AVX2: the log should say OpenBLAS chose its own kernels")
    # The user's choice stands: SSE3's Prescott kernels run on every x86-64 processor.
    got, log = kernels(ablate, {**env, "OPENBLAS_CORETYPE": "Prescott"})
    if got.lower() != "prescott" or "Prescott (OPENBLAS_CORETYPE, as set)" not in log:
        failures.append(f"OPENBLAS_CORETYPE=Prescott gave {got} kernels")
    for f in failures:
        print("FAIL " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
