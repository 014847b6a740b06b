#!/usr/bin/env python3
"""rewrite.py on the CUDA constructs it must take (and refuse): each case's output compiles in
spirit as the interpreter expects, keeps every line where it was, and never rewrites inside a
comment or a string. Usage: test_rewrite.py (run by CTest, label emu)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rewrite  # noqa: E402

failures = []


def check(name, ok, detail=""):
    if not ok:
        failures.append(f"{name}: {detail}")


def rewritten(src):
    out = rewrite.rewrite(src)
    check("lines kept", out.count("\n") == src.count("\n"), repr(out))
    return out


# A launch with template arguments, split over lines, with a comment inside.
out = rewritten("void f(float* x, int n) {\n  k<float, 4><<<blocks(n),\n      256, 0, s>>>(x, // the data\n      n);\n  g();\n}\n")
check("template launch", 'launch(ABLATE_EMU_WHERE, "k<float,4>"' in out and "[](const auto&... ablate_emu_a) { k<float, 4>(ablate_emu_a...); }, x, n)" in out, out)
check("comment dropped", "// the data" not in out, out)
check("next line in place", out.split("\n")[4] == "  g();", out)

# A launch inside a macro continued by backslashes stays inside the macro.
out = rewritten("#define RUN(n) \\\n  k<<<1, \\\n     n>>>(p); \\\n  done()\n")
check("macro continuation", all(l.endswith("\\") for l in out.split("\n")[0:3]), out)

# Shared declarations: several declarators, qualifiers, alignment, a 2-D array.
out = rewritten("__global__ void k() {\n  __shared__ int a[8], b[4][2];\n  static __shared__ float c;\n"
                "  volatile __shared__ float d[3];\n  __shared__ __align__(16) char e[5];\n  extern __shared__ double dyn[];\n}\n")
check("declarators", "ABLATE_EMU_SHARED(int, a, [8]); ABLATE_EMU_SHARED(int, b, [4][2]);" in out, out)
check("static dropped", "ABLATE_EMU_SHARED(float, c, )" in out and "static ABLATE" not in out, out)
check("volatile kept", "ABLATE_EMU_SHARED(volatile float, d, [3])" in out, out)
check("alignment", "ABLATE_EMU_SHARED_ALIGNED(char, e, [5], 16)" in out, out)
check("extern", "ABLATE_EMU_EXTERN_SHARED(double, dyn)" in out, out)

# Not rewritten: comments, strings, and what follows a digit separator stays visible.
out = rewritten('void f() {\n  // k<<<1, 1>>>(x);\n  const char* s = "__shared__ <<<";\n  int n = 1\'000;\n  k<<<1, n>>>();\n}\n')
check("comment untouched", "// k<<<1, 1>>>(x);" in out, out)
check("string untouched", '"__shared__ <<<"' in out, out)
check("after a digit separator", 'launch(ABLATE_EMU_WHERE, "k"' in out and "ablate_emu_a...); })" in out, out)

# Refused: a __shared__ array at namespace scope (the interpreter's arrays live in a block).
for src in ("__shared__ float s[4];\n", "namespace a {\nextern __shared__ float s[];\n}\n"):
    try:
        rewrite.rewrite(src)
        check("namespace scope refused", False, src)
    except rewrite.RewriteError as e:
        check("namespace scope named", "namespace scope" in str(e), str(e))
# ...but not inside a function in a namespace.
out = rewritten("namespace a {\nnamespace {\n__device__ void f() { __shared__ float s[4]; }\n}\n}\n")
check("function in namespace", "ABLATE_EMU_SHARED(float, s, [4])" in out, out)

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("rewrite.py: every case holds")
