#!/usr/bin/env python3
"""Rewrites a CUDA source (.cu/.cuh) into C++ for the kernel interpreter (ablate_emu/emu.hpp).

Two mechanical changes, nothing else:
  kernel<<<grid, block[, shared[, stream]]>>>(args...);
    -> ::ablate::emu::launch(where, "kernel", launch_config(grid, block, ...),
                             [](const auto&... a) { kernel(a...); }, args...);
  __shared__ T a[N], b[M];           -> ABLATE_EMU_SHARED(T, a, [N]); ABLATE_EMU_SHARED(T, b, [M]);
  extern __shared__ T s[];           -> ABLATE_EMU_EXTERN_SHARED(T, s);
  (static and volatile before __shared__ are taken, __align__(n) becomes the array's alignment;
  a __shared__ declaration outside a function is refused: the interpreter's arrays are per block)
The output starts with #line 1 "<the source>" and keeps every line where it was (a rewritten span
is followed by as many newlines as it held), so compiler errors and the interpreter's messages
name the .cu's own lines.

usage: rewrite.py SOURCE OUTPUT
"""
import re
import sys

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class RewriteError(Exception):
    pass


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


def skip_comments_and_strings(text, strings=True):
    """A copy of text with comments and (unless strings is False) string/char literals blanked
    (same length, newlines kept), so the scanners below never match inside them. A quote after a
    digit or letter is a digit separator (1'000) or part of a prefix, not a char literal."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            for k in range(i, j):
                out[k] = " "
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                if text[k] != "\n":
                    out[k] = " "
            i = j
        elif c in "\"'" and not (c == "'" and i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")):
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            if strings:
                for k in range(i + 1, min(j, n)):
                    if text[k] != "\n":
                        out[k] = " "
            i = j + 1
        else:
            i += 1
    return "".join(out)


def match_close(code, pos, open_ch, close_ch):
    """Index just past the bracket closing the one at code[pos]."""
    depth = 0
    for i in range(pos, len(code)):
        if code[i] == open_ch:
            depth += 1
        elif code[i] == close_ch:
            depth -= 1
            if depth == 0:
                return i + 1
    raise RewriteError(f"line {line_of(code, pos)}: unbalanced '{open_ch}'")


def split_top(code, lo, hi):
    """The comma-separated pieces of code[lo:hi] at bracket depth 0, as (start, end) spans."""
    pieces, depth, start = [], 0, lo
    for i in range(lo, hi):
        c = code[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            pieces.append((start, i))
            start = i + 1
    if code[start:hi].strip():
        pieces.append((start, hi))
    return pieces


def callee_start(code, end):
    """Start of the kernel expression ending at `end` (a name, qualified, with template arguments)."""
    i = end
    while True:
        while i > 0 and code[i - 1].isspace():
            i -= 1
        if i > 0 and code[i - 1] == ">":  # template arguments
            depth = 0
            while i > 0:
                i -= 1
                if code[i] == ">":
                    depth += 1
                elif code[i] == "<":
                    depth -= 1
                    if depth == 0:
                        break
            continue
        j = i
        while j > 0 and (code[j - 1].isalnum() or code[j - 1] == "_"):
            j -= 1
        if j == i:
            raise RewriteError(f"line {line_of(code, end)}: no kernel name before <<<")
        i = j
        k = i
        while k > 0 and code[k - 1].isspace():
            k -= 1
        if k >= 2 and code[k - 2:k] == "::":
            i = k - 2
            continue
        return i


def rewrite_launches(text, code):
    plain = skip_comments_and_strings(text, strings=False)  # comments blanked, strings kept
    out, last = [], 0
    for m in re.finditer(r"<<<", code):
        lt = m.start()
        if lt < last:
            continue
        name_lo = callee_start(code, lt)
        gt = code.find(">>>", lt)
        if gt < 0:
            raise RewriteError(f"line {line_of(code, lt)}: <<< without >>>")
        cfg = split_top(code, lt + 3, gt)
        if not 2 <= len(cfg) <= 4:
            raise RewriteError(f"line {line_of(code, lt)}: a launch takes 2 to 4 configuration arguments, not {len(cfg)}")
        p = gt + 3
        while code[p].isspace():
            p += 1
        if code[p] != "(":
            raise RewriteError(f"line {line_of(code, lt)}: no argument list after >>>")
        args_hi = match_close(code, p, "(", ")")
        args = split_top(code, p + 1, args_hi - 1)
        kernel = " ".join(plain[name_lo:lt].split())
        name = re.sub(r"\s+", "", kernel)
        piece = lambda a, b: " ".join(plain[a:b].replace("\\\n", " ").split())
        cfg_text = ", ".join(piece(a, b) for a, b in cfg)
        arg_text = "".join(", " + piece(a, b) for a, b in args)
        call = (f'::ablate::emu::launch(ABLATE_EMU_WHERE, "{name}", ::ablate::emu::launch_config({cfg_text}), '
                f"[](const auto&... ablate_emu_a) {{ {kernel}(ablate_emu_a...); }}{arg_text})")
        span = text[name_lo:args_hi]
        out.append(text[last:name_lo])
        # Inside a #define continued by backslashes, the lines the launch spanned stay continued.
        newline = " \\\n" if "\\\n" in span else "\n"
        out.append(call + newline * span.count("\n"))
        last = args_hi
    out.append(text[last:])
    return "".join(out)


SHARED = re.compile(r"((?:\b(?:static|volatile)\s+|\b__align__\s*\(\s*\d+\s*\)\s*)*)\b(extern\s+)?__shared__\b")
NAMESPACE_BRACE = re.compile(r"(\bnamespace\b[\w:\s]*|\bextern\s*\"\s*\"\s*)$")


def in_function(code, pos):
    """True when code[pos] is inside a function body: its innermost enclosing brace is not a
    namespace's or an extern "C" block's (none at all is namespace scope)."""
    stack = []
    for m in re.finditer(r"[{}]", code[:pos]):
        if m.group() == "{":
            stack.append(bool(NAMESPACE_BRACE.search(code[max(0, m.start() - 200):m.start()])))
        elif stack:
            stack.pop()
    return bool(stack) and not stack[-1]


def rewrite_shared(text, code):
    out, last = [], 0
    for m in SHARED.finditer(code):
        if not in_function(code, m.start()):
            raise RewriteError(f"line {line_of(code, m.start())}: a __shared__ declaration at namespace scope; "
                               "the interpreter takes them inside kernels and device functions")
        quals = m.group(1).split() if m.group(1) else []
        align = re.search(r"__align__\s*\(\s*(\d+)\s*\)", m.group(1) or "")
        prefix = "volatile " if "volatile" in quals else ""
        align_to = align.group(1) if align else None
        semi = code.find(";", m.end())
        if semi < 0:
            raise RewriteError(f"line {line_of(code, m.start())}: __shared__ declaration without ';'")
        decl = text[m.end():semi]
        pieces = [decl[a - m.end():b - m.end()] for a, b in split_top(code, m.end(), semi)]
        first = re.match(r"^(.*?)\b([A-Za-z_]\w*)\s*((?:\[[^\]]*\]\s*)*)$", pieces[0].strip(), re.S)
        if not first or not first.group(1).strip():
            raise RewriteError(f"line {line_of(code, m.start())}: cannot read the __shared__ declaration '{decl.strip()}'")
        type_text = prefix + " ".join(first.group(1).split())
        inner = re.search(r"__align__\s*\(\s*(\d+)\s*\)\s*", type_text)  # __shared__ __align__(n) T
        if inner:
            align_to = inner.group(1)
            type_text = (type_text[:inner.start()] + type_text[inner.end():]).strip()
        decls = [(first.group(2), first.group(3))]
        for p in pieces[1:]:
            d = re.match(r"^\s*([A-Za-z_]\w*)\s*((?:\[[^\]]*\]\s*)*)$", p, re.S)
            if not d:
                raise RewriteError(f"line {line_of(code, m.start())}: cannot read the __shared__ declarator '{p.strip()}'")
            decls.append((d.group(1), d.group(2)))
        if m.group(2):
            if len(decls) != 1 or decls[0][1].strip() != "[]":
                raise RewriteError(f"line {line_of(code, m.start())}: extern __shared__ takes one array of unknown size")
            new = f"ABLATE_EMU_EXTERN_SHARED({type_text}, {decls[0][0]})"
        else:
            macro = f"ABLATE_EMU_SHARED_ALIGNED({{}}, {{}}, {{}}, {align_to})" if align_to else "ABLATE_EMU_SHARED({}, {}, {})"
            new = "; ".join(macro.format(type_text, n, " ".join(dims.split())) for n, dims in decls)
        span = text[m.start():semi]
        out.append(text[last:m.start()])
        out.append(new + "\n" * span.count("\n"))
        last = semi
    out.append(text[last:])
    return "".join(out)


def rewrite(text):
    text = rewrite_shared(text, skip_comments_and_strings(text))
    return rewrite_launches(text, skip_comments_and_strings(text))


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, dst = sys.argv[1], sys.argv[2]
    with open(src, encoding="utf-8") as f:
        text = f.read()
    try:
        body = rewrite(text)
    except RewriteError as e:
        sys.exit(f"{src}: {e}")
    with open(dst, "w", encoding="utf-8") as f:
        f.write(f'// Generated by tests/cuda_emulation/rewrite.py from {src}: do not edit.\n#line 1 "{src}"\n' + body)


if __name__ == "__main__":
    main()
