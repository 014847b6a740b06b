#!/usr/bin/env python3
"""A Llama checkpoint with a SentencePiece tokenizer, end to end against transformers: a tiny
SentencePiece model is trained here (sentencepiece, the library transformers' LlamaTokenizer runs
on), text tokenized with it into a token shard, a tiny random Llama made by transformers and saved
with its tokenizer (LlamaTokenizer.save_pretrained: tokenizer.model). `ablate import hf` keeps
tokenizer.model; ablate's token_shards source reads it through Debian's libsentencepiece, so

1. `ablate sample --tokens 0` gives the prompt back (encode, then decode);
2. `ablate sample --temperature 0` (greedy) writes what transformers' model greedily continues
   from LlamaTokenizer's ids of the same prompt (which are sentencepiece's), decoded by the model:
   the same ids in and out;
3. a tokenizer.model that is not a SentencePiece model is exit 2 naming the file.

Fails (exit 1) where torch, transformers or sentencepiece are missing: scripts/setup-tests.sh installs them.
usage: check_sentencepiece.py ABLATE_BINARY
"""
import os
import shutil
import struct
import subprocess
import sys
import tempfile

try:
    import torch
    import transformers
    import sentencepiece as spm
except ImportError as e:
    sys.exit(f"FAIL: {e}: scripts/setup-tests.sh makes the test venv with them (tests/support/test_python.sh runs it)")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_export import run  # noqa: E402

WORDS = ("the quick brown fox jumps over a lazy dog while seven wise owls watch from old oak trees and "
         "rivers run slowly toward the silver sea under pale morning light").split()


def corpus(n, g):
    out = []
    for _ in range(n):
        k = int(torch.randint(5, 14, (1,), generator=g))
        out.append(" ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (k,), generator=g)).capitalize() + ".")
    return out


def main():
    ablate = os.path.abspath(sys.argv[1])
    g = torch.Generator().manual_seed(5)
    torch.manual_seed(5)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        lines = corpus(400, g)
        text = os.path.join(tmp, "corpus.txt")
        with open(text, "w") as f:
            f.write("\n".join(lines) + "\n")
        spm.SentencePieceTrainer.train(input=text, model_prefix=os.path.join(tmp, "sp"), vocab_size=96, model_type="bpe",
                                       unk_id=0, bos_id=1, eos_id=2, pad_id=-1, byte_fallback=False, minloglevel=2)
        sp = spm.SentencePieceProcessor(model_file=os.path.join(tmp, "sp.model"))
        V = sp.get_piece_size()
        # The shard, with the tokenizer beside it (token_shards' tokenizer = "auto").
        data = os.path.join(tmp, "data")
        os.makedirs(os.path.join(data, "tokenizer"))
        shutil.copy(os.path.join(tmp, "sp.model"), os.path.join(data, "tokenizer", "tokenizer.model"))
        ids = [i for line in lines for i in sp.encode(line) + [2]]
        with open(os.path.join(data, "train.bin"), "wb") as f:
            f.write(struct.pack("<256i", 20240520, 1, len(ids), *([0] * 253)) + struct.pack(f"<{len(ids)}H", *ids))
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=64, rms_norm_eps=1e-5, vocab_size=V, tie_word_embeddings=False))
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.2 * torch.randn(p.shape, generator=g))
        model.eval()
        hf_dir, run_dir = os.path.join(tmp, "llama-hf"), os.path.join(tmp, "llama-run")
        model.save_pretrained(hf_dir, safe_serialization=True)
        tok = transformers.LlamaTokenizer(vocab_file=os.path.join(tmp, "sp.model"), legacy=True)
        tok.save_pretrained(hf_dir)
        printed = run([ablate, "import", "hf", hf_dir, "--run-dir", run_dir, "--set", "data.name=token_shards",
                       "--set", f"data.token_shards.paths=[\"{data}/train.bin\"]", "--set", f"data.token_shards.vocab_size={V}",
                       "--set", "data.token_shards.eot=2"])
        kept = os.path.isfile(os.path.join(run_dir, "tokenizer", "tokenizer.model")) and "SentencePiece" in printed
        print(f"import keeps tokenizer.model: {'ok' if kept else 'MISSING'}")
        failures += not kept

        prompt = "The quick brown fox watches old"
        back = run([ablate, "sample", "--checkpoint", run_dir, "--prompt", prompt, "--tokens", "0"]).rstrip("\n")
        ok = back == prompt
        print(f"encode then decode: {back!r}: {'ok' if ok else 'MISMATCH'}")
        failures += not ok

        ours = run([ablate, "sample", "--checkpoint", run_dir, "--prompt", prompt, "--tokens", "12", "--temperature", "0",
                    "--stop-at-eot=off"]).rstrip("\n")
        ctx = tok(prompt, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            for _ in range(12):
                logits = model(torch.tensor([ctx])).logits[0, -1]
                ctx.append(int(torch.argmax(logits)))
        theirs = sp.decode(ctx)  # the model's own decoding (LlamaTokenizer spells special ids its own way)
        ok = ours == theirs and len(ours) > len(prompt) and tok(prompt, add_special_tokens=False)["input_ids"] == sp.encode(prompt)
        print(f"greedy, 12 tokens: ablate {ours!r}, transformers {theirs!r}: {'ok' if ok else 'MISMATCH'}")
        failures += not ok

        with open(os.path.join(data, "tokenizer", "tokenizer.model"), "wb") as f:  # the one the run's data source reads
            f.write(b"not a model")
        r = subprocess.run([ablate, "sample", "--checkpoint", run_dir, "--prompt", prompt, "--tokens", "1"], capture_output=True,
                           text=True)
        ok = r.returncode == 2 and "tokenizer.model" in r.stderr + r.stdout
        print(f"a broken tokenizer.model: exit {r.returncode}: {'ok' if ok else 'WRONG'}")
        if not ok:
            print(r.stdout, r.stderr)
        failures += not ok
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
