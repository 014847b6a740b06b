#!/usr/bin/env python3
"""Converts HellaSwag or ARC JSON Lines into the `multiple_choice` evaluator's format.

The output has one object a line: {"context": str, "endings": [str, ...], "label": int, "id": str}.
The evaluator scores each ending by the log-likelihood of its tokens given the context's tokens,
context and ending encoded separately, so an ending carries the space that separates it from the
context.

  HellaSwag (rowanz/hellaswag's hellaswag_val.jsonl, or Hugging Face's Rowan/hellaswag rows):
    context  ctx; without it, ctx_a + " " + ctx_b.capitalize() (ctx_a alone when ctx_b is empty)
    endings  " " + each of endings (llm.c's hellaswag.py does the same)
    label    label (an integer, or a string of digits)
    id       str(ind), when there is an ind
    (activity_label is not used)
  ARC (allenai's ARC-Easy / ARC-Challenge JSONL):
    context  "Question: " + question.stem + "\\nAnswer:"
    endings  " " + each question.choices[i].text
    label    the index of answerKey among question.choices[i].label ("A".."E" or "1".."5")
    id       id

--format auto (the default) tells the two apart per file by its first line: an object with
`question` is ARC, one with `endings` HellaSwag. Blank lines in the input are skipped. Bad input
(a line that is not a JSON object, a field missing or of the wrong type, an empty context, a
label out of range, an answerKey that is no choice's label) exits with code 2, naming FILE:LINE,
the field, what it holds and what was expected; so does a conversion that yields no item.
Nothing is written then.

  tools/convert_mc.py --out configs/evals/hellaswag-val.jsonl hellaswag_val.jsonl
  tools/convert_mc.py --format arc --limit 500 --out arc-easy.jsonl ARC-Easy-Dev.jsonl
"""
import argparse
import json
import sys

MIN_ENDINGS = 2
MAX_ENDINGS = 16


class InputError(Exception):
    """Bad input: reported as one message and exit code 2."""


def shown(value):
    """A value as JSON, cut to about 80 characters."""
    try:
        text = json.dumps(value, ensure_ascii=True)
    except ValueError:
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def kind(value):
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def field(where, obj, name, path=None):
    path = path or name
    if name not in obj:
        raise InputError(f"{where}: field '{path}' is missing")
    return obj[name]


def text_field(where, obj, name, path=None):
    path = path or name
    value = field(where, obj, name, path)
    if not isinstance(value, str):
        raise InputError(f"{where}: field '{path}' is {shown(value)}, expected a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{where}: field '{path}' is {shown(value)}, expected valid Unicode (it holds a lone surrogate)")
    return value


def hellaswag_item(where, obj):
    if "ctx" in obj:
        context = text_field(where, obj, "ctx")
    elif "ctx_a" in obj:
        ctx_a = text_field(where, obj, "ctx_a")
        ctx_b = text_field(where, obj, "ctx_b")
        context = ctx_a + " " + ctx_b.capitalize() if ctx_b else ctx_a
    else:
        raise InputError(f"{where}: field 'ctx' is missing (and there is no 'ctx_a' + 'ctx_b' either)")
    if not context.strip():
        source = "ctx" if "ctx" in obj else "ctx_a"
        raise InputError(f"{where}: field '{source}' is {shown(obj[source])}, expected text (the evaluator scores "
                         f"the endings given it)")
    endings = field(where, obj, "endings")
    if not isinstance(endings, list) or not MIN_ENDINGS <= len(endings) <= MAX_ENDINGS:
        raise InputError(f"{where}: field 'endings' is {shown(endings)}, expected a list of "
                         f"{MIN_ENDINGS}..{MAX_ENDINGS} strings")
    for i, ending in enumerate(endings):
        text_field(where, {"ending": ending}, "ending", f"endings[{i}]")
    label = field(where, obj, "label")
    expected = f"an integer 0..{len(endings) - 1}"
    if isinstance(label, str) and label.strip().isdigit() and label.strip().isascii():
        number = int(label.strip())
    elif isinstance(label, int) and not isinstance(label, bool):
        number = label
    else:
        raise InputError(f"{where}: field 'label' is {shown(label)}, expected {expected}")
    if not 0 <= number < len(endings):
        raise InputError(f"{where}: field 'label' is {shown(label)}, expected {expected}")
    item = {"context": context, "endings": [" " + e for e in endings], "label": number}
    if "ind" in obj:
        ind = obj["ind"]
        if isinstance(ind, bool) or not isinstance(ind, (int, str)):
            raise InputError(f"{where}: field 'ind' is {shown(ind)}, expected an integer or a string")
        item["id"] = str(ind) if isinstance(ind, int) else text_field(where, obj, "ind")
    return item


def arc_item(where, obj):
    question = field(where, obj, "question")
    if not isinstance(question, dict):
        raise InputError(f"{where}: field 'question' is {shown(question)}, expected an object with 'stem' and 'choices'")
    stem = text_field(where, question, "stem", "question.stem")
    choices = field(where, question, "choices", "question.choices")
    if not isinstance(choices, list) or not MIN_ENDINGS <= len(choices) <= MAX_ENDINGS:
        raise InputError(f"{where}: field 'question.choices' is {shown(choices)}, expected a list of "
                         f"{MIN_ENDINGS}..{MAX_ENDINGS} objects with 'text' and 'label'")
    endings, labels = [], []
    for i, choice in enumerate(choices):
        path = f"question.choices[{i}]"
        if not isinstance(choice, dict):
            raise InputError(f"{where}: field '{path}' is {shown(choice)}, expected an object with 'text' and 'label'")
        endings.append(" " + text_field(where, choice, "text", path + ".text"))
        label = text_field(where, choice, "label", path + ".label")
        if label in labels:
            raise InputError(f"{where}: field '{path}.label' is {shown(label)}, expected a label no other choice has")
        labels.append(label)
    key = field(where, obj, "answerKey")
    if not isinstance(key, str) or key not in labels:
        raise InputError(f"{where}: field 'answerKey' is {shown(key)}, expected one of the choices' labels "
                         f"({', '.join(labels)})")
    item = {"context": "Question: " + stem + "\nAnswer:", "endings": endings, "label": labels.index(key)}
    if "id" in obj:
        item["id"] = text_field(where, obj, "id")
    return item


CONVERTERS = {"hellaswag": hellaswag_item, "arc": arc_item}


def detect(where, obj):
    if "question" in obj:
        return "arc"
    if "endings" in obj:
        return "hellaswag"
    raise InputError(f"{where}: cannot tell the format: expected HellaSwag's field 'endings' or ARC's field "
                     f"'question' (or name it with --format)")


def read_objects(path, name):
    """Yields (where, object) for each non-blank line of the file."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise InputError(f"{name}: cannot read: {e.strerror}")
    with f:
        for number, raw in enumerate(f, 1):
            where = f"{name}:{number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise InputError(f"{where}: not valid UTF-8 (byte {e.start + 1} of the line)")
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except RecursionError:
                raise InputError(f"{where}: not a JSON object: it nests too deep")
            except ValueError as e:
                raise InputError(f"{where}: not valid JSON ({e})")
            if not isinstance(obj, dict):
                raise InputError(f"{where}: expected a JSON object, got {kind(obj)}")
            yield where, obj


def convert(paths, fmt, limit):
    items = []
    for path in paths:
        file_format = None if fmt == "auto" else fmt
        for where, obj in read_objects(path, path):
            if limit and len(items) >= limit:
                return items
            if file_format is None:
                file_format = detect(where, obj)
            items.append(CONVERTERS[file_format](where, obj))
    return items


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n", 2)[2])
    parser.add_argument("inputs", nargs="+", metavar="FILE", help="HellaSwag or ARC JSON Lines")
    parser.add_argument("--format", choices=["hellaswag", "arc", "auto"], default="auto",
                        help="the inputs' format (default auto: per file, from its first line)")
    parser.add_argument("--out", default="-", help="the multiple_choice file to write (default: stdout)")
    parser.add_argument("--limit", type=int, default=0, help="convert the first N items only (0 = every item)")
    args = parser.parse_args()
    try:
        if args.limit < 0:
            raise InputError(f"--limit is {args.limit}, expected an integer >= 0 (0 = every item)")
        items = convert(args.inputs, args.format, args.limit)
        if not items:
            raise InputError(f"no item in {', '.join(args.inputs)}: the output would be empty")
        text = "".join(json.dumps(item, ensure_ascii=True, separators=(", ", ": ")) + "\n" for item in items)
        if args.out == "-":
            sys.stdout.write(text)
        else:
            try:
                with open(args.out, "w", encoding="utf-8", newline="\n") as f:
                    f.write(text)
            except OSError as e:
                raise InputError(f"{args.out}: cannot write: {e.strerror}")
            print(f"convert_mc: wrote {len(items)} items to {args.out}", file=sys.stderr)
    except InputError as e:
        print(f"convert_mc: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
