#!/usr/bin/env python3
"""Writes text or JSONL as llm.c token shards, the input of ablate's `token_shards` data source.

A shard is a header of 256 little-endian int32 (magic 20240520, version 1, token count) followed by
that many uint16 tokens. Every document is preceded by the end-of-text token, as llm.c does.
Tokenizers: `gpt2` (GPT-2 BPE through tiktoken; eot 50256, vocab 50257) or `bytes` (UTF-8 bytes;
eot 256, vocab 257; needs nothing beyond the standard library). Only the standard library is used
for writing (no numpy).

  tools/tokenize_shards.py --tokenizer bytes --out data/tiny corpus/*.txt
  tools/tokenize_shards.py --out data/fineweb --val-fraction 0.01 --field text dump.jsonl
"""
import argparse
import array
import json
import struct
import sys
from pathlib import Path

SHARD_MAGIC = 20240520
SHARD_VERSION = 1
HEADER_INTS = 256


class ByteTokenizer:
    eot = 256
    vocab = 257

    def encode(self, text):
        return list(text.encode("utf-8"))


class Gpt2Tokenizer:
    eot = 50256
    vocab = 50257

    def __init__(self):
        try:
            import tiktoken
        except ImportError:
            sys.exit("tokenize_shards: --tokenizer gpt2 needs tiktoken (pip install tiktoken); --tokenizer bytes needs nothing")
        self._encoding = tiktoken.get_encoding("gpt2")

    def encode(self, text):
        return self._encoding.encode_ordinary(text)


def documents(paths, field, separator):
    """Yields the text of every document: a JSONL line's `field`, or a text file (or its pieces)."""
    for path in paths:
        path = Path(path)
        if path.suffix in (".jsonl", ".json"):
            with path.open(encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as e:
                        sys.exit(f"{path}:{number}: not JSON: {e}")
                    if field not in record:
                        sys.exit(f"{path}:{number}: no field '{field}'")
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
    parser.add_argument("--field", default="text", help="the JSONL field holding the text")
    parser.add_argument("--separator", default="", help="split text files into documents on this string (e.g. '\\n\\n')")
    parser.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per shard (llm.c uses 100M)")
    parser.add_argument("--val-fraction", type=float, default=0.0, help="every 1/F-th document goes to the validation shards")
    args = parser.parse_args()
    if args.shard_tokens < 1 or args.shard_tokens > 2**31 - 1:
        sys.exit("tokenize_shards: --shard-tokens must be in [1, 2^31)")
    separator = args.separator.encode().decode("unicode_escape")

    tokenizer = ByteTokenizer() if args.tokenizer == "bytes" else Gpt2Tokenizer()
    train = ShardWriter(args.out, "train", args.shard_tokens, tokenizer.eot)
    val = ShardWriter(args.out, "val", args.shard_tokens, tokenizer.eot)
    every = round(1 / args.val_fraction) if args.val_fraction > 0 else 0
    count = 0
    for index, text in enumerate(documents(args.inputs, args.field, separator)):
        (val if every and index % every == every - 1 else train).add(tokenizer.encode(text))
        count += 1
    train_files, val_files = train.close(), val.close()
    print(f"{count} documents -> {len(train_files)} train and {len(val_files)} validation shards")
    print("[data.token_shards]")
    print(f'paths = ["{args.out}_train_*.bin"]')
    if val_files:
        print(f'val_paths = ["{args.out}_val_*.bin"]')
    print(f"eot = {tokenizer.eot}\nvocab_size = {tokenizer.vocab}")


if __name__ == "__main__":
    main()
