#!/usr/bin/env python3
"""LoRA fine-tuning against PEFT. For a tiny random GPT-2 and Llama made by transformers (every
weight perturbed) and saved with save_pretrained:

1. ablate trains LoRA adapters on it ([model] init_from = the Hugging Face directory, [adapter]
   name = "lora") for a few steps on a token shard;
2. `ablate eval` of that run must give the loss that PEFT gives with the exported adapter
   (`ablate export --format peft`, loaded by PeftModel.from_pretrained onto the same base) on the
   same windows, within 1e-5 relative, and that loss must differ from the base model's (the
   adapters moved: the check can fail);
3. `ablate export --format hf --merge` must equal PEFT's merge_and_unload() tensor for tensor
   (within fp32 rounding of the product) and give the same loss;
4. the frozen base is untouched: every base tensor of the trained run equals the Hugging Face
   checkpoint's bit for bit.

GPT-2 adapts q, k, v and o (PEFT sees c_attn with the three side by side and c_proj), Llama q and v
with GQA. Fails (exit 1) where torch, transformers or peft are missing
(scripts/setup-tests.sh installs them).
usage: check_lora_peft.py ABLATE_BINARY
"""
import json
import os
import struct
import sys
import tempfile

try:
    import torch
    import peft
    from safetensors.torch import load_file
except ImportError as e:
    sys.exit(f"FAIL: {e}: scripts/setup-tests.sh makes the test venv with them (tests/support/test_python.sh runs it)")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_export import run, transformers_loss, load  # noqa: E402
from check_import_hf import BASE, T, V, model_sets, models as hf_models  # noqa: E402  (fails without transformers)

EOT = V - 1
TARGETS = {"gpt2": '["q","k","v","o"]', "llama": '["q","v"]'}


def models():
    made = hf_models()
    return {name: (made[name], targets) for name, targets in TARGETS.items()}


def shard(path, tokens):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)) + struct.pack(f"<{len(tokens)}H", *tokens))


def main():
    ablate = os.path.abspath(sys.argv[1])
    torch.manual_seed(0)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        g = torch.Generator().manual_seed(1)
        # Documents of 20 to 60 tokens ended by EOT: a learnable repeating pattern with noise.
        train = []
        while len(train) < 6000:
            n = int(torch.randint(20, 60, (1,), generator=g))
            start = int(torch.randint(0, 8, (1,), generator=g))
            train += [(start + 3 * i) % (V - 1) for i in range(n)] + [EOT]
        val = torch.randint(0, V - 1, (T * 12 + 12,), generator=g).tolist()
        shard(os.path.join(tmp, "train.bin"), train)
        shard(os.path.join(tmp, "val.bin"), val)
        for name, (model, targets) in models().items():
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.05 * torch.randn(p.shape, generator=g))
            model.eval()
            hf_dir, probe = os.path.join(tmp, name + "-hf"), os.path.join(tmp, name + "-import")
            model.save_pretrained(hf_dir, safe_serialization=True)
            run([ablate, "import", "hf", hf_dir, "--run-dir", probe])
            sets = model_sets(probe)
            ft = os.path.join(tmp, name + "-lora")
            run([ablate, "train", BASE, "--run-dir", ft, *sets, "--set", f"model.init_from={hf_dir}",
                 "--set", "adapter.name=lora", "--set", "adapter.lora.rank=4", "--set", "adapter.lora.alpha=8",
                 "--set", f"adapter.targets={targets}", "--set", "data.name=token_shards",
                 "--set", f"data.token_shards.paths=[\"{tmp}/train.bin\"]", "--set", f"data.token_shards.val_paths=[\"{tmp}/val.bin\"]",
                 "--set", f"data.token_shards.vocab_size={V}", "--set", f"data.token_shards.eot={EOT}",
                 "--set", "data.token_shards.tokenizer=none", "--set", "run.steps=8", "--set", "run.eval_every=0",
                 "--set", "optimizer.lr=0.01", "--set", "schedule.warmup_steps=0", "--set", f"batching.seq_len={T}"])
            ours = json.loads(run([ablate, "eval", "--checkpoint", ft, "--tokens", os.path.join(tmp, "val.bin"), "--seq-len", str(T),
                                   "--threads", "1", "--json"]))["loss"]
            base_loss, count = transformers_loss(model, val, T)
            adapter_dir, merged_dir = os.path.join(tmp, name + "-peft"), os.path.join(tmp, name + "-merged")
            run([ablate, "export", "--checkpoint", ft, "--format", "peft", "--out", adapter_dir])
            peft_model = peft.PeftModel.from_pretrained(load(hf_dir), adapter_dir)
            peft_model.eval()
            theirs, _ = transformers_loss(peft_model, val, T)
            rel = abs(ours - theirs) / abs(theirs)
            moved = abs(ours - base_loss) / abs(base_loss)
            ok = rel <= 1e-5 and moved > 1e-4
            print(f"{name}: ablate eval after 8 LoRA steps {ours:.8f}, PEFT with the exported adapter {theirs:.8f} over {count} "
                  f"tokens (relative {rel:.2e}); base model {base_loss:.8f} (moved {moved:.2e}): {'ok' if ok else 'MISMATCH'}")
            failures += not ok
            # Merged weights against PEFT's merge_and_unload.
            run([ablate, "export", "--checkpoint", ft, "--format", "hf", "--merge", "--out", merged_dir, "--no-tokenizer"])
            peft_merged = peft_model.merge_and_unload().state_dict()
            ours_merged = load_file(os.path.join(merged_dir, "model.safetensors"))
            worst, compared = 0.0, 0
            for key, t in ours_merged.items():
                if key not in peft_merged:
                    continue
                theirs_t = peft_merged[key]
                if theirs_t.shape != t.shape:
                    print(f"{name}: {key}: shape {tuple(t.shape)} against PEFT's {tuple(theirs_t.shape)}")
                    failures += 1
                    continue
                worst = max(worst, float((t - theirs_t).abs().max() / max(theirs_t.abs().max().item(), 1e-30)))
                compared += 1
            merged_loss, _ = transformers_loss(load(merged_dir), val, T)
            ok = compared == len(ours_merged) and worst <= 1e-6 and abs(merged_loss - theirs) / abs(theirs) <= 1e-5
            print(f"{name}: --merge against merge_and_unload: {compared} tensors, worst relative difference {worst:.2e}; "
                  f"loss {merged_loss:.8f}: {'ok' if ok else 'MISMATCH'}")
            failures += not ok
            # The frozen base: the run's checkpoint holds the Hugging Face weights unchanged.
            ckpt = load_file(os.path.join(ft, "checkpoints", "step_00000008", "model.safetensors"))
            frozen = [k for k in ckpt if "lora_" not in k]
            probe_ckpt = load_file(os.path.join(probe, "checkpoints", "step_00000000", "model.safetensors"))
            same = all(torch.equal(ckpt[k], probe_ckpt[k]) for k in frozen) and len(frozen) == len(probe_ckpt)
            print(f"{name}: {len(frozen)} base tensors after training equal the imported ones bit for bit: {'ok' if same else 'MISMATCH'}")
            failures += not same
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
