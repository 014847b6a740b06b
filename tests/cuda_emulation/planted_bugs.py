#!/usr/bin/env python3
"""The kernel interpreter's proof of power: plants one bug at a time in a real kernel source,
rebuilds that kernel's emu test, runs it, and records whether it failed the way the bug should
make it fail (each bug names a text its failure must contain). Each test first runs on the
unmodified source and must pass. The source is restored after each bug (and on any exit). Prints
a Markdown table; docs/kernel-interpreter.md holds its last output.

usage: planted_bugs.py [BUILD_DIR]     (default: build; the tree must be built there already)
"""
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.join(ROOT, "build")

# (bug, file, exact text, replacement, emu test program, a text the failure must contain)
BUGS = [
    ("a bound off by one: the norm's row guard lets row == rows through",
     "plugins/layers/norm/norm_kernels.cu",
     "  if (row >= rows) return;\n  const In* xr = x + row * in;",
     "  if (row > rows) return;\n  const In* xr = x + row * in;",
     "test_norm_kernels_emu", "(fs).count == 0"),
    ("a grid rounded down: the norms' row blocks",
     "plugins/layers/norm/norm_kernels.cu",
     "return unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock);",
     "return unsigned(rows / kRowsPerBlock);",
     "test_norm_kernels_emu", "an empty grid is an invalid configuration"),
    ("a missing __syncthreads (1): the scatter's chunk loaded to shared memory",
     "plugins/layers/cuda/layer_kernels.cu",
     "    s_row[k] = sorted_row[lo + k];\n  }\n  __syncthreads();",
     "    s_row[k] = sorted_row[lo + k];\n  }",
     "test_layer_kernels_emu", "scatter_add_rows rows"),
    ("a missing __syncthreads (2): the norm's stage-2 lane sums",
     "plugins/layers/norm/norm_kernels.cu",
     "  lane_sums[threadIdx.y][threadIdx.x] = s;\n  __syncthreads();",
     "  lane_sums[threadIdx.y][threadIdx.x] = s;",
     "test_norm_kernels_emu", "rows 257"),
    ("a missing __syncthreads (3): adamw8bit's code maps loaded to shared memory",
     "plugins/adamw8bit/adamw8bit_kernel.cu",
     "    v_bucket[i] = a.v_map.bucket_first[i];\n  }\n  __syncthreads();",
     "    v_bucket[i] = a.v_map.bucket_first[i];\n  }",
     "test_optimizer_kernels_emu", "wrong, the first at"),
    ("a full-mask shuffle in a block that is not a multiple of 32: the norms launched with 255 threads",
     "plugins/layers/norm/norm_kernels.cu",
     "norm_forward_kernel<<<row_blocks(rows), kRowsPerBlock * kWarp, 0, stream>>>",
     "norm_forward_kernel<<<row_blocks(rows), kRowsPerBlock * kWarp - 1, 0, stream>>>",
     "test_norm_kernels_emu", "names lanes 31 that do not exist"),
    ("a shared array one element short: the scatter's chunk indices",
     "plugins/layers/cuda/layer_kernels.cu",
     "__shared__ int32_t s_index[kScatterChunk], s_row[kScatterChunk];",
     "__shared__ int32_t s_index[kScatterChunk - 1], s_row[kScatterChunk];",
     "test_layer_kernels_emu", "a write past the end of __shared__ 's_index'"),
    ("a barrier after an early return: softmax threads with no key of the row leave",
     "plugins/naive/attention_kernels.cu",
     "  const KeyRange r = key_range(seg_start[b * T + i], i);\n  float mx = -FLT_MAX;",
     "  const KeyRange r = key_range(seg_start[b * T + i], i);\n  if (int64_t(threadIdx.x) > r.hi) return;\n  float mx = -FLT_MAX;",
     "test_attention_kernels_emu", "threads wait at __syncthreads"),
]


def cmake():
    """PyPI's cmake where python3 has it (as scripts/cmake-bin.sh picks), else the system's."""
    try:
        import cmake as pypi_cmake
        return os.path.join(pypi_cmake.CMAKE_BIN_DIR, "cmake")
    except ImportError:
        return "cmake"


def build(target):
    return subprocess.run([cmake(), "--build", BUILD, "--target", target, "-j2"], cwd=ROOT,
                          capture_output=True, text=True)


def run_test(target):
    """(return code, output, seconds) of an emu test program; a hang past 600 s is a failure."""
    t0 = time.time()
    try:
        r = subprocess.run([os.path.join(BUILD, "bin", target)], capture_output=True, text=True, timeout=600)
        return r.returncode, r.stdout + r.stderr, time.time() - t0
    except subprocess.TimeoutExpired:
        return -1, "timed out after 600 s", time.time() - t0


def first_failure(output):
    """The interpreter's error, or else the first failed check, shortened to one line."""
    lines = [l.strip() for l in output.splitlines()]
    for i, l in enumerate(lines):
        if "kernel '" in l and ("block" in l or "launch" in l):
            return l[:300]
    for i, l in enumerate(lines):
        if l.startswith("ERROR:") or "ERROR:" in l:
            tail = " ".join(x for x in lines[i:i + 4] if x)
            return tail[:300]
    return (lines[-1] if lines else "")[:300]


def main():
    for target in sorted({b[4] for b in BUGS}):  # the baseline: each test passes unmodified
        built = build(target)
        rc, out, _ = run_test(target) if built.returncode == 0 else (1, built.stdout[-300:], 0)
        if rc != 0:
            sys.exit(f"{target} fails on the unmodified sources: {first_failure(out)}")
    rows = []
    for bug, rel, old, new, target, expect in BUGS:
        path = os.path.join(ROOT, rel)
        with open(path, encoding="utf-8") as f:
            original = f.read()
        if original.count(old) != 1:
            rows.append((bug, rel, target, "NOT PLANTED", f"the text to change occurs {original.count(old)} times"))
            continue
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(original.replace(old, new))
            b = build(target)
            if b.returncode != 0:
                rows.append((bug, rel, target, "NOT BUILT", b.stdout[-300:]))
                continue
            rc, out, seconds = run_test(target)
            caught = rc != 0 and expect in out
            result = f"caught ({seconds:.1f} s)" if caught else ("FAILED OTHERWISE" if rc != 0 else "MISSED")
            rows.append((bug, rel, target, result, first_failure(out) if rc != 0 else ""))
        finally:
            with open(path, "w", encoding="utf-8") as f:
                f.write(original)
    rebuilt = {b[4] for b in BUGS}
    for t in sorted(rebuilt):
        build(t)
    print("| planted bug | file | emu test | result | what it reported |")
    print("|---|---|---|---|---|")
    for bug, rel, target, result, how in rows:
        how = how.replace("|", "\\|").replace("\n", " ")
        print(f"| {bug} | `{rel}` | `{target}` | {result} | {how} |")
    missed = [r for r in rows if not r[3].startswith("caught")]
    print(f"\n{len(rows) - len(missed)} of {len(rows)} planted bugs caught")
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
