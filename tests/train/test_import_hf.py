#!/usr/bin/env python3
"""`ablate import hf` and `[model] init_from`, checked against ablate's own export (no torch needed;
check_import_hf.py compares with transformers itself):

- a GPT-2-, a Llama- and a Qwen3-shaped run, exported and imported back: `ablate eval` gives the
  same loss bit for bit (one thread), and the import exported again is the same file byte for byte;
  checkpoints saved in bf16 and in f16 (written here) import as their exact fp32 widenings;
- training with model.init_from = the Hugging Face directory (or the ablate run) and learning rate
  0 keeps those weights exactly (its export equals the source's); a differing [model] key is exit
  2 naming the key; an experiment that sets no shape key takes the checkpoint's;
- bad checkpoints are exit 2 naming the file and the tensor or key: a missing tensor, a tensor of
  the wrong shape, an unknown model_type, RoPE scaling, pytorch_model.bin only, a shard index
  naming a tensor its shard lacks; a run directory that holds a run is refused.

Run: python3 tests/train/test_import_hf.py path/to/ablate
"""
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

ABLATE = None
BASE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support", "tiny_sweep_base.toml")
SHAPES = {
    "gpt2": ["model.n_heads=2"],
    "llama": ["model.n_heads=4", "model.n_kv_heads=2", "model.norm=rmsnorm", "model.mlp=swiglu_mlp", "model.position=rope",
              "model.bias=false", "model.tie_embeddings=false"],
    "qwen3": ["model.n_heads=4", "model.n_kv_heads=2", "model.norm=rmsnorm", "model.mlp=swiglu_mlp", "model.position=rope",
              "model.bias=false", "model.tie_embeddings=false", "model.qk_norm=true", "model.rope.theta=500"],
}


def sets(items):
    return sum((["--set", s] for s in items), [])


def run(*args, ok=True):
    r = subprocess.run([ABLATE, *args], capture_output=True, text=True, timeout=600)
    if ok and r.returncode != 0:
        raise AssertionError(f"ablate {' '.join(args)}: exit {r.returncode}\n{r.stdout}{r.stderr}")
    return r


def eval_loss(run_dir, shard):
    r = run("eval", "--checkpoint", run_dir, "--tokens", shard, "--seq-len", "64", "--threads", "1", "--json")
    return json.loads(r.stdout)["loss"]


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        body = f.read()
    return header, body


def write_safetensors(path, header, tensors):
    """tensors: name -> bytes, in header order; offsets recomputed."""
    out, offset, h = b"", 0, {}
    for name, meta in header.items():
        if name == "__metadata__":
            h[name] = meta
            continue
        data = tensors[name]
        h[name] = {"dtype": meta["dtype"], "shape": meta["shape"], "data_offsets": [offset, offset + len(data)]}
        out += data
        offset += len(data)
    text = json.dumps(h).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + out)


def tensors_of(header, body):
    return {k: body[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in header.items() if k != "__metadata__"}


class ImportHF(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        d = cls.dir = cls.tmp.name
        random.seed(1)
        toks = [random.randrange(80) for _ in range(3000)]
        cls.shard = os.path.join(d, "shard.bin")
        with open(cls.shard, "wb") as f:
            f.write(struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)) + struct.pack("<%dH" % len(toks), *toks))
        for shape, extra in SHAPES.items():
            run("train", BASE, "--run-dir", os.path.join(d, "run-" + shape), *sets(["run.steps=6", *extra]))
            run("export", "--checkpoint", os.path.join(d, "run-" + shape), "--out", os.path.join(d, "hf-" + shape), "--no-tokenizer")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def p(self, *names):
        return os.path.join(self.dir, *names)

    def test_import_evaluates_and_exports_back_exactly(self):
        for shape in SHAPES:
            with self.subTest(shape=shape):
                r = run("import", "hf", self.p("hf-" + shape), "--run-dir", self.p("imp-" + shape))
                self.assertIn("[model]", r.stdout)
                self.assertEqual(eval_loss(self.p("imp-" + shape), self.shard), eval_loss(self.p("run-" + shape), self.shard))
                run("export", "--checkpoint", self.p("imp-" + shape), "--out", self.p("hf2-" + shape), "--no-tokenizer")
                with open(self.p("hf-" + shape, "model.safetensors"), "rb") as a, open(self.p("hf2-" + shape, "model.safetensors"), "rb") as b:
                    self.assertEqual(a.read(), b.read())
                with open(self.p("imp-" + shape, "checkpoints", "step_00000000", "state.json")) as f:
                    state = json.load(f)
                self.assertEqual(state["imported_from"]["model_type"], shape)
                self.assertEqual(state["step"], 0)

    def narrowed_round_trip(self, dtype, narrow, widen):
        """hf-llama with every tensor narrowed to `dtype` by `narrow` (fp32 values -> 16-bit bytes),
        imported and exported back: each exported fp32 tensor must be `widen` (16-bit bytes -> fp32
        bytes) of what was written."""
        header, body = read_safetensors(self.p("hf-llama", "model.safetensors"))
        narrowed = {}
        for name, data in tensors_of(header, body).items():
            narrowed[name] = narrow(struct.unpack("<%df" % (len(data) // 4), data))
            header[name]["dtype"] = dtype
        d = self.p("hf-llama-" + dtype)
        shutil.copytree(self.p("hf-llama"), d)
        write_safetensors(os.path.join(d, "model.safetensors"), header, narrowed)
        run("import", "hf", d, "--run-dir", self.p("imp-" + dtype))
        run("export", "--checkpoint", self.p("imp-" + dtype), "--out", self.p("back-" + dtype), "--no-tokenizer")
        h, b = read_safetensors(self.p("back-" + dtype, "model.safetensors"))
        for name, data in tensors_of(h, b).items():
            self.assertEqual(data, widen(narrowed[name]), f"{dtype} {name}")

    def test_bf16_and_sharded_checkpoints(self):
        # bf16: the upper half of each fp32 value's bits (truncation); widened back by appending zeros.
        def to_bf16(vals):
            bits = struct.unpack("<%dI" % len(vals), struct.pack("<%df" % len(vals), *vals))
            return struct.pack("<%dH" % len(bits), *[v >> 16 for v in bits])

        def from_bf16(data):
            halves = struct.unpack("<%dH" % (len(data) // 2), data)
            return struct.pack("<%dI" % len(halves), *[v << 16 for v in halves])

        self.narrowed_round_trip("BF16", to_bf16, from_bf16)
        # F16: rounded and decoded by Python's struct (an independent IEEE half conversion).
        self.narrowed_round_trip("F16", lambda vals: struct.pack("<%de" % len(vals), *vals),
                                 lambda data: struct.pack("<%df" % (len(data) // 2), *struct.unpack("<%de" % (len(data) // 2), data)))
        # Two shards and an index.
        header, body = read_safetensors(self.p("hf-gpt2", "model.safetensors"))
        tensors = tensors_of(header, body)
        names = [n for n in header if n != "__metadata__"]
        d = self.p("hf-gpt2-sharded")
        os.makedirs(d)
        shutil.copy(self.p("hf-gpt2", "config.json"), d)
        halves = [names[: len(names) // 2], names[len(names) // 2:]]
        weight_map = {}
        for i, part in enumerate(halves):
            fn = f"model-0000{i + 1}-of-00002.safetensors"
            write_safetensors(os.path.join(d, fn), {n: header[n] for n in part}, tensors)
            weight_map.update({n: fn for n in part})
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f)
        run("import", "hf", d, "--run-dir", self.p("imp-sharded"))
        self.assertEqual(eval_loss(self.p("imp-sharded"), self.shard), eval_loss(self.p("run-gpt2"), self.shard))
        # An index naming a tensor its shard does not hold.
        weight_map[names[0]] = f"model-00002-of-00002.safetensors"
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"weight_map": weight_map}, f)
        r = run("import", "hf", d, "--run-dir", self.p("imp-bad-index"), ok=False)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn(names[0], r.stderr)

    def train_at_lr_zero_exports_qwen3(self, base, out, source, extra):
        """Two steps at learning rate 0 from `source` with `base` and `extra` --sets: the export is hf-qwen3's, byte for byte."""
        run("train", base, "--run-dir", out,
            *sets(["run.steps=2", "optimizer.lr=0", "schedule.warmup_steps=0", f"model.init_from={source}", *extra]))
        run("export", "--checkpoint", out, "--out", out + "-hf", "--no-tokenizer")
        with open(self.p("hf-qwen3", "model.safetensors"), "rb") as a, open(out + "-hf/model.safetensors", "rb") as b:
            self.assertEqual(a.read(), b.read())

    def test_init_from_keeps_the_weights_with_learning_rate_zero(self):
        for source in (self.p("hf-qwen3"), self.p("run-qwen3")):
            with self.subTest(source=source):
                self.train_at_lr_zero_exports_qwen3(BASE, self.p("ft-" + os.path.basename(source)), source, SHAPES["qwen3"])
        r = run("train", BASE, "--run-dir", self.p("ft-bad"),
                *sets(["run.steps=2", f"model.init_from={self.p('hf-qwen3')}", *SHAPES["qwen3"], "model.rope.theta=10000"]), ok=False)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("model.rope.theta", r.stderr)
        self.assertIn("500", r.stderr)
        r = run("train", BASE, "--run-dir", self.p("ft-bad2"), *sets(["run.steps=2", f"model.init_from={self.p('run-gpt2')}", *SHAPES["llama"]]), ok=False)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("model.init_from", r.stderr)

    def test_init_from_takes_the_model_shape_from_the_checkpoint(self):
        # An experiment whose [model] sets no shape key: each comes from the checkpoint (its
        # config.json, or the ablate checkpoint's config.toml), so the Qwen3-shaped weights load
        # and, at learning rate 0, export unchanged; the resolved config says where they came from.
        with open(BASE) as f:
            text = f.read()
        start = text.index("[model]")
        bare = self.p("bare.toml")
        with open(bare, "w") as f:
            f.write(text[:start] + "[model]\n" + text[text.index("[data]"):])
        for source in (self.p("hf-qwen3"), self.p("run-qwen3")):
            with self.subTest(source=source):
                out = self.p("bare-" + os.path.basename(source))
                self.train_at_lr_zero_exports_qwen3(bare, out, source, [])
                with open(os.path.join(out, "config.toml")) as f:
                    resolved = f.read()
                for line in ("qk_norm = true", 'position = "rope"', "n_kv_heads = 2", "d_model = 32", "[model.rope]\ntheta = 500.0"):
                    self.assertIn(line, resolved)
        # A key the experiment sets stays set: one that differs from the checkpoint is exit 2 naming it.
        r = run("train", bare, "--run-dir", self.p("bare-bad"),
                *sets(["run.steps=2", f"model.init_from={self.p('run-qwen3')}", "model.d_model=64"]), ok=False)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("d_model=32 where this experiment's [model] has d_model=64", r.stderr)
        r = run("train", bare, "--run-dir", self.p("bare-bad-hf"),
                *sets(["run.steps=2", f"model.init_from={self.p('hf-qwen3')}", "model.rope.theta=10000"]), ok=False)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("model.rope.theta", r.stderr)
        # `ablate config show` prints the checkpoint's keys too.
        r = run("config", "show", bare, "--set", f"model.init_from={self.p('hf-qwen3')}")
        self.assertIn("qk_norm = true", r.stdout)

    def broken(self, name, edit_config=None, edit_tensors=None):
        d = self.p("broken-" + name)
        shutil.copytree(self.p("hf-gpt2"), d)
        if edit_config:
            with open(os.path.join(d, "config.json")) as f:
                cfg = json.load(f)
            edit_config(cfg)
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(cfg, f)
        if edit_tensors:
            header, body = read_safetensors(os.path.join(d, "model.safetensors"))
            tensors = tensors_of(header, body)
            edit_tensors(header, tensors)
            write_safetensors(os.path.join(d, "model.safetensors"), header, tensors)
        r = run("import", "hf", d, "--run-dir", self.p("imp-broken-" + name), ok=False)
        self.assertEqual(r.returncode, 2, name + r.stdout + r.stderr)
        self.assertFalse(os.path.exists(self.p("imp-broken-" + name, "checkpoints")), name)
        return r.stderr

    def test_bad_checkpoints_are_input_errors(self):
        def drop(h, t):
            del h["transformer.h.0.mlp.c_fc.weight"]

        def reshape(h, t):
            h["transformer.h.0.attn.c_proj.weight"]["shape"] = [16, 64]

        self.assertIn("'transformer.h.0.mlp.c_fc.weight'", self.broken("missing", edit_tensors=drop))
        err = self.broken("shape", edit_tensors=reshape)
        self.assertIn("'transformer.h.0.attn.c_proj.weight' is 16x64", err)
        self.assertIn("32x32", err)
        self.assertIn("'model_type' is \"bert\"", self.broken("type", edit_config=lambda c: c.update(model_type="bert")))
        self.assertIn("'activation_function'", self.broken("act", edit_config=lambda c: c.update(activation_function="relu")))
        self.assertIn("'n_embd'", self.broken("nembd", edit_config=lambda c: c.update(n_embd="wide")))
        d = self.p("broken-bin")
        os.makedirs(d)
        shutil.copy(self.p("hf-gpt2", "config.json"), d)
        open(os.path.join(d, "pytorch_model.bin"), "wb").close()
        r = run("import", "hf", d, "--run-dir", self.p("imp-bin"), ok=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("safe_serialization=True", r.stderr)
        llama = self.p("broken-rope")
        shutil.copytree(self.p("hf-llama"), llama)
        with open(os.path.join(llama, "config.json")) as f:
            cfg = json.load(f)
        cfg["rope_scaling"] = {"type": "linear", "factor": 2.0}
        with open(os.path.join(llama, "config.json"), "w") as f:
            json.dump(cfg, f)
        r = run("import", "hf", llama, "--run-dir", self.p("imp-rope"), ok=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("'rope_scaling'", r.stderr)
        # Never over a run.
        r = run("import", "hf", self.p("hf-gpt2"), "--run-dir", self.p("run-gpt2"), ok=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("already holds a run", r.stderr)
        r = run("import", "hf", self.p("hf-gpt2"), "--run-dir", self.p("imp-set"), "--set", "model.d_model=64", ok=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("model.d_model is the checkpoint's", r.stderr)


if __name__ == "__main__":
    ABLATE = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
