#!/usr/bin/env python3
"""`ablate import hf` on checkpoints made by Hugging Face transformers itself: tiny random GPT-2,
Llama (GQA, untied, rms_norm_eps 1e-5) and, where the installed transformers has it, Qwen3
(qk-norm, attention biases off, head_dim given) models, every weight perturbed so that no norm
weight is 1 and no bias 0, saved with save_pretrained (safetensors). Each is imported; `ablate
eval` on a token shard must give transformers' mean next-token loss over the same windows within
1e-5 relative (ablate computes in fp32, transformers here in fp32 with the loss summed in fp64).
Then a run started with model.init_from = the directory and learning rate 0 must evaluate the same.

Fails (exit 1) where torch or transformers are missing: scripts/setup-tests.sh installs them.
usage: check_import_hf.py ABLATE_BINARY
"""
import json
import os
import struct
import sys
import tempfile

try:
    import torch
    import transformers
except ImportError as e:
    sys.exit(f"FAIL: {e}: scripts/setup-tests.sh makes the test venv with them (tests/support/test_python.sh runs it)")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_export import run, transformers_loss  # noqa: E402

BASE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support", "tiny_sweep_base.toml")
T = 32
V = 80


def models():
    common = dict(vocab_size=V, tie_word_embeddings=False)
    out = {
        "gpt2": transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=V, n_positions=64, n_embd=32, n_layer=2, n_head=2, activation_function="gelu_new", resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5)),
        "llama": transformers.LlamaForCausalLM(transformers.LlamaConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0, **common)),
    }
    if hasattr(transformers, "Qwen3ForCausalLM"):
        out["qwen3"] = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=500.0, **common))
    else:
        print(f"qwen3: transformers {transformers.__version__} has no Qwen3ForCausalLM; not checked")
    return out


def model_sets(run_dir):
    """The [model] keys of a run's config.toml (what `ablate import hf` read) as --set arguments,
    init_from left out."""
    with open(os.path.join(run_dir, "config.toml")) as f:
        model_keys = [line for line in f.read().split("[model]")[1].split("\n[")[0].splitlines() if "=" in line]
    return sum((["--set", "model." + k.split("=")[0].strip() + "=" + k.split("=", 1)[1].strip()] for k in model_keys
                if not k.startswith("init_from")), [])


def main():
    ablate = os.path.abspath(sys.argv[1])
    torch.manual_seed(0)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        g = torch.Generator().manual_seed(1)
        tokens = torch.randint(0, V, (T * 12 + 12,), generator=g).tolist()
        shard = os.path.join(tmp, "val.bin")
        with open(shard, "wb") as f:
            f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)) + struct.pack(f"<{len(tokens)}H", *tokens))
        for name, model in models().items():
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.05 * torch.randn(p.shape, generator=g))
            model.eval()
            hf_dir, run_dir = os.path.join(tmp, name + "-hf"), os.path.join(tmp, name + "-run")
            model.save_pretrained(hf_dir, safe_serialization=True)
            run([ablate, "import", "hf", hf_dir, "--run-dir", run_dir])
            ours = json.loads(run([ablate, "eval", "--checkpoint", run_dir, "--tokens", shard, "--seq-len", str(T), "--threads", "1", "--json"]))
            theirs, count = transformers_loss(model, tokens, T)
            rel = abs(ours["loss"] - theirs) / abs(theirs)
            ok = ours["tokens"] == count and rel <= 1e-5
            print(f"{name}: import + eval {ours['loss']:.8f}, transformers {theirs:.8f} over {count} tokens, "
                  f"relative difference {rel:.2e}: {'ok' if ok else 'MISMATCH'}")
            failures += not ok
            # A new training started from the checkpoint's weights (learning rate 0: they stay).
            ft = os.path.join(tmp, name + "-ft")
            sets = model_sets(run_dir)
            run([ablate, "train", BASE, "--run-dir", ft, *sets, "--set", f"model.init_from={hf_dir}", "--set", "run.steps=1",
                 "--set", "optimizer.lr=0", "--set", "schedule.warmup_steps=0", "--set", f"batching.seq_len={T}"])
            again = json.loads(run([ablate, "eval", "--checkpoint", ft, "--tokens", shard, "--seq-len", str(T), "--threads", "1", "--json"]))
            same = again["loss"] == ours["loss"]
            print(f"{name}: init_from then one step at lr 0: eval {again['loss']:.8f}: {'ok' if same else 'MISMATCH'}")
            failures += not same
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
