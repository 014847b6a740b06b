#!/usr/bin/env python3
"""tools/convert_mc.py and the quickstart's shipped probe evaluations.

- planted HellaSwag lines (with `ctx`, and with `ctx_a` + `ctx_b` only, label an integer or a
  string) and ARC lines (labels "A".."E" and "1".."5", three to five choices) convert to exactly
  the expected objects; --format auto tells the two apart per file; --limit stops after N items;
- bad lines (a missing field, an empty context, a label out of range, an answerKey that is no choice's label, a
  line that is not JSON, a JSON value that is not an object) and empty input are exit 2 naming
  FILE:LINE and the field, with no traceback and no output file;
- tools/make_probe_evals.py --check: configs/evals/probe-rows.jsonl and probe-coordinates.jsonl
  are that script's output; the rows file parses, has four endings per item, labels in range and
  each position the right one at least 20 times; the coordinates file has one item per host.

Run: python3 tests/experiments/test_convert_mc.py REPO_ROOT
"""
import json
import os
import subprocess
import sys
import tempfile

FAILURES = []


def check(condition, message):
    if not condition:
        FAILURES.append(message)
    return condition


def run(repo, args):
    script = os.path.join(repo, "tools", "convert_mc.py")
    return subprocess.run([sys.executable, script] + args, capture_output=True, text=True, timeout=120)


def write(directory, name, lines):
    path = os.path.join(directory, name)
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
    return path


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f.read().splitlines()]


HELLASWAG = [
    {"ind": 24, "activity_label": "Roof shingle removal", "ctx_a": "A man is sitting on a roof.", "ctx_b": "he",
     "ctx": "A man is sitting on a roof. he", "split": "val", "split_type": "indomain", "label": 3,
     "endings": ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
                 "is holding a rubik's cube.", "starts pulling up roofing on a roof."]},
    {"ind": 92, "activity_label": "Clean and jerk", "ctx_a": "A lady walks to a barbell.", "ctx_b": "the lady",
     "label": "0", "endings": ["swings and lands.", "pulls the barbell.", "pulls a rope.", "lifts the weight."]},
    {"ind": 106, "activity_label": "Canoeing", "ctx_a": "Two women in a canoe paddle.", "ctx_b": "",
     "label": 2, "endings": ["Caf\u00e9 one", "two", "three", "four"]},
]
HELLASWAG_EXPECTED = [
    {"context": "A man is sitting on a roof. he",
     "endings": [" is using wrap to wrap a pair of skis.", " is ripping level tiles off.",
                 " is holding a rubik's cube.", " starts pulling up roofing on a roof."], "label": 3, "id": "24"},
    {"context": "A lady walks to a barbell. The lady",
     "endings": [" swings and lands.", " pulls the barbell.", " pulls a rope.", " lifts the weight."], "label": 0,
     "id": "92"},
    {"context": "Two women in a canoe paddle.", "endings": [" Caf\u00e9 one", " two", " three", " four"], "label": 2,
     "id": "106"},
]

ARC = [
    {"id": "Mercury_7175875", "question": {"stem": "An astronomer observes that a planet rotates faster after a "
     "meteorite impact. Which is the most likely effect of this increase in rotation?", "choices": [
         {"text": "Planetary density will decrease.", "label": "A"},
         {"text": "Planetary years will become longer.", "label": "B"},
         {"text": "Planetary days will become shorter.", "label": "C"},
         {"text": "Planetary gravity will become stronger.", "label": "D"}]}, "answerKey": "C"},
    {"id": "NYSEDREGENTS_2015_4_8", "question": {"stem": "Which is a liquid?", "choices": [
        {"text": "ice", "label": "1"}, {"text": "water", "label": "2"}, {"text": "steam", "label": "3"}]},
     "answerKey": "2"},
    {"id": "Mercury_5", "question": {"stem": "Pick E.", "choices": [
        {"text": "a", "label": "A"}, {"text": "b", "label": "B"}, {"text": "c", "label": "C"},
        {"text": "d", "label": "D"}, {"text": "e", "label": "E"}]}, "answerKey": "E"},
]
ARC_EXPECTED = [
    {"context": "Question: An astronomer observes that a planet rotates faster after a meteorite impact. Which is "
                "the most likely effect of this increase in rotation?\nAnswer:",
     "endings": [" Planetary density will decrease.", " Planetary years will become longer.",
                 " Planetary days will become shorter.", " Planetary gravity will become stronger."], "label": 2,
     "id": "Mercury_7175875"},
    {"context": "Question: Which is a liquid?\nAnswer:", "endings": [" ice", " water", " steam"], "label": 1,
     "id": "NYSEDREGENTS_2015_4_8"},
    {"context": "Question: Pick E.\nAnswer:", "endings": [" a", " b", " c", " d", " e"], "label": 4,
     "id": "Mercury_5"},
]


def expect_converts(repo, tmp, name, args, expected):
    out = os.path.join(tmp, name + ".out.jsonl")
    result = run(repo, args + ["--out", out])
    if not check(result.returncode == 0, f"{name}: exit {result.returncode}, expected 0: {result.stderr.strip()}"):
        return
    got = read_jsonl(out)
    check(got == expected, f"{name}: converted to\n  {got}\nexpected\n  {expected}")
    with open(out, encoding="utf-8") as f:
        text = f.read()
    check(text.isascii() and "\n\n" not in text and text.endswith("}\n"),
          f"{name}: output is not one ASCII JSON object a line")


def expect_refused(repo, tmp, name, lines, needles, args=()):
    path = write(tmp, name + ".jsonl", lines)
    out = os.path.join(tmp, name + ".out.jsonl")
    result = run(repo, list(args) + [path, "--out", out])
    message = result.stderr.strip()
    check(result.returncode == 2, f"{name}: exit {result.returncode}, expected 2 ({message})")
    check("Traceback" not in result.stderr, f"{name}: a traceback instead of a message:\n{result.stderr}")
    for needle in needles:
        check(needle in message, f"{name}: the message does not say {needle!r}: {message}")
    check(not os.path.exists(out), f"{name}: an output file was written after an error")


def test_converter(repo, tmp):
    hellaswag = write(tmp, "hellaswag.jsonl", HELLASWAG[:1] + [""] + HELLASWAG[1:])  # a blank line is skipped
    arc = write(tmp, "arc.jsonl", ARC)
    expect_converts(repo, tmp, "hellaswag", ["--format", "hellaswag", hellaswag], HELLASWAG_EXPECTED)
    expect_converts(repo, tmp, "arc", ["--format", "arc", arc], ARC_EXPECTED)
    expect_converts(repo, tmp, "auto", [arc, hellaswag], ARC_EXPECTED + HELLASWAG_EXPECTED)
    expect_converts(repo, tmp, "limit", ["--limit", "4", arc, hellaswag], ARC_EXPECTED + HELLASWAG_EXPECTED[:1])
    expect_converts(repo, tmp, "limit0", ["--limit", "0", hellaswag], HELLASWAG_EXPECTED)

    stdout = run(repo, [arc])
    check(stdout.returncode == 0 and [json.loads(l) for l in stdout.stdout.splitlines()] == ARC_EXPECTED,
          f"without --out the items go to stdout: {stdout.returncode} {stdout.stderr.strip()}")

    good = dict(HELLASWAG[0])
    no_label = {k: v for k, v in good.items() if k != "label"}
    expect_refused(repo, tmp, "missing_label", [good, no_label], ["missing_label.jsonl:2", "'label'", "missing"])
    no_endings = {k: v for k, v in good.items() if k != "endings"}
    expect_refused(repo, tmp, "missing_endings", [no_endings, good], ["missing_endings.jsonl:1", "'endings'", "HellaSwag"])
    expect_refused(repo, tmp, "missing_endings_given", [good, no_endings], ["missing_endings_given.jsonl:2", "'endings'",
                                                                         "missing"], ["--format", "hellaswag"])
    expect_refused(repo, tmp, "label_range", [good, good, dict(good, label=4)],
                   ["label_range.jsonl:3", "field 'label' is 4, expected an integer 0..3"])
    expect_refused(repo, tmp, "label_text", [dict(good, label="x")],
                   ['label_text.jsonl:1: field \'label\' is "x", expected an integer 0..3'])
    expect_refused(repo, tmp, "label_negative", [dict(good, label=-1)], ["label_negative.jsonl:1", "'label'", "0..3"])
    expect_refused(repo, tmp, "ending_type", [dict(good, endings=["a", 3, "c", "d"])],
                   ["ending_type.jsonl:1", "'endings[1]'", "expected a string"])
    expect_refused(repo, tmp, "answer_key", [ARC[0], dict(ARC[0], answerKey="F")],
                   ["answer_key.jsonl:2", "'answerKey'", '"F"', "A, B, C, D"])
    no_stem = dict(ARC[0], question={"choices": ARC[0]["question"]["choices"]})
    expect_refused(repo, tmp, "arc_stem", [no_stem], ["arc_stem.jsonl:1", "'question.stem'", "missing"])
    bad_choice = dict(ARC[1], question={"stem": "s", "choices": [{"text": "a", "label": "1"}, {"label": "2"}]})
    expect_refused(repo, tmp, "arc_choice", [bad_choice], ["arc_choice.jsonl:1", "'question.choices[1].text'"])
    expect_refused(repo, tmp, "invalid_json", [good, '{"ind": 3, "ctx": "x",'], ["invalid_json.jsonl:2", "not valid JSON"])
    expect_refused(repo, tmp, "not_object", [good, "[1, 2]"], ["not_object.jsonl:2", "expected a JSON object, got a list"])
    expect_refused(repo, tmp, "not_object_string", ['"text"'], ["not_object_string.jsonl:1", "got a string"])
    expect_refused(repo, tmp, "empty_context", [dict(good, ctx="")], ["empty_context.jsonl:1", "'ctx'", "expected text"])
    expect_refused(repo, tmp, "unknown", [{"text": "x"}], ["unknown.jsonl:1", "cannot tell the format"])
    expect_refused(repo, tmp, "empty", [], ["no item", "empty"])
    expect_refused(repo, tmp, "wrong_format", [good], ["wrong_format.jsonl:1", "'question'", "missing"], ["--format", "arc"])


def test_probe_files(repo):
    maker = os.path.join(repo, "tools", "make_probe_evals.py")
    result = subprocess.run([sys.executable, maker, "--check"], capture_output=True, text=True, timeout=300)
    check(result.returncode == 0, f"make_probe_evals.py --check: exit {result.returncode}: "
                                  f"{(result.stderr or result.stdout).strip()}")

    rows_path = os.path.join(repo, "configs", "evals", "probe-rows.jsonl")
    try:
        rows = read_jsonl(rows_path)
    except (OSError, ValueError) as e:
        check(False, f"{rows_path}: {e}")
        return
    check(len(rows) == 200, f"probe-rows: {len(rows)} items, expected 200")
    positions = [0, 0, 0, 0]
    for n, item in enumerate(rows, 1):
        endings, label = item.get("endings"), item.get("label")
        ok = check(isinstance(item.get("context"), str) and item["context"].startswith("#h"),
                   f"probe-rows:{n}: the context is not a session")
        ok = check(isinstance(endings, list) and len(endings) == 4 and all(isinstance(e, str) for e in endings),
                   f"probe-rows:{n}: expected 4 endings") and ok
        ok = check(isinstance(label, int) and not isinstance(label, bool) and 0 <= label < 4,
                   f"probe-rows:{n}: label {label!r} is not in 0..3") and ok
        if ok:
            positions[label] += 1
    check(min(positions) >= 20, f"probe-rows: the right ending's positions are unbalanced: {positions}")

    coordinates_path = os.path.join(repo, "configs", "evals", "probe-coordinates.jsonl")
    try:
        coordinates = read_jsonl(coordinates_path)
    except (OSError, ValueError) as e:
        check(False, f"{coordinates_path}: {e}")
        return
    check([item.get("prompt") for item in coordinates] == [f"#h{h}" for h in range(64)],
          "probe-coordinates: expected the prompts #h0..#h63 in order")
    check(all(isinstance(item.get("answer"), str) and item["answer"].startswith(" ") and item["answer"].endswith("\n")
              for item in coordinates), "probe-coordinates: every answer is ' <lat> <lon>\\n'")


def main():
    if len(sys.argv) != 2:
        print("usage: test_convert_mc.py REPO_ROOT", file=sys.stderr)
        return 2
    repo = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory(prefix="ablate-convert-mc-") as tmp:
        test_converter(repo, tmp)
    test_probe_files(repo)
    if FAILURES:
        print(f"FAIL: {len(FAILURES)} check(s):\n" + "\n".join("  " + f for f in FAILURES), file=sys.stderr)
        return 1
    print("test_convert_mc: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
