#!/usr/bin/env python3
"""The PyTorch peer of the gpt2 and llama stages (bench/peers/pytorch_gpt.py) builds the model of an
ablate config: for a small GPT-2-family config and small Llama-family ones (GQA, SwiGLU, RoPE,
RMSNorm, untied; the SwiGLU width given, and left to ablate's default), its parameter count is
ablate's own (run.json of a one-step CPU run), and two CPU steps of it start at the loss of a
uniform guess over the vocabulary (ln V, within what N(0, 0.02) weights move it); `--float8`
without torchao exits 77 (skipped), never a wrong figure.
Usage: test_peer_models.py ABLATE SOURCE_DIR (run under the test venv's python, which has torch)"""
import json
import math
import os
import subprocess
import sys
import tempfile

ablate, source = sys.argv[1], sys.argv[2]
peer = os.path.join(source, "bench", "peers", "pytorch_gpt.py")
COMMON = {"vocab_size": 50257, "vocab_multiple": 128, "max_seq_len": 64}
LLAMA = {"d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "norm": "rmsnorm", "mlp": "swiglu_mlp", "position": "rope",
         "bias": False, "tie_embeddings": False}
FAMILIES = {
    "gpt2": {"d_model": 64, "n_layers": 2, "n_heads": 4},
    "llama": {**LLAMA, "mlp_hidden": 96},
    "llama-default-hidden": LLAMA,  # ablate's SwiGLU width (8 d / 3, rounded up to 64: 192), not 4 d
}
failures = []


def toml_value(v):
    return ("true" if v else "false") if isinstance(v, bool) else json.dumps(v)


def check(name, ok, detail):
    print(f"  {'ok  ' if ok else 'FAIL'} {name}: {detail}")
    if not ok:
        failures.append(name)


with tempfile.TemporaryDirectory() as tmp:
    for family, model in FAMILIES.items():
        config = os.path.join(tmp, f"{family}.toml")
        with open(config, "w") as f:
            f.write("[run]\nsteps = 1\neval_every = 0\nseed = 7\n\n[model]\n")
            f.writelines(f"{k} = {toml_value(v)}\n" for k, v in {**COMMON, **model}.items())
            f.write('\n[data]\nname = "synthetic_probes"\n\n[batching]\nname = "packed"\nbatch_size = 2\nseq_len = 64\n'
                    '\n[attention]\nname = "naive_cpu"\n\n[optimizer]\nname = "adamw"\n')
        run_dir = os.path.join(tmp, f"run-{family}")
        r = subprocess.run([ablate, "train", config, "--run-dir", run_dir], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"ablate train {family}: exit {r.returncode}\n{r.stderr[-2000:]}")
        with open(os.path.join(run_dir, "run.json")) as f:
            ablate_params = json.load(f)["parameters"]
        r = subprocess.run([sys.executable, peer, "--config", config, "--params-only"], capture_output=True, text=True)
        peer_params = int(r.stdout.split()[-1]) if r.returncode == 0 else None
        check(f"{family} parameters", peer_params == ablate_params, f"peer {peer_params}, ablate {ablate_params}")

        out = os.path.join(tmp, f"peer-{family}.json")
        r = subprocess.run([sys.executable, peer, "--config", config, "--device", "cpu", "--dtype", "fp32", "--no-compile",
                            "--batch", "2", "--steps", "1", "--warmup", "1", "--json", out], capture_output=True, text=True)
        if r.returncode != 0:
            check(f"{family} peer runs", False, r.stderr[-1500:])
            continue
        with open(out) as f:
            data = json.load(f)
        first = data["result"]["first_loss"]
        # Random tokens against logits of std ~0.02*sqrt(d) ~ 0.2 around 0: the loss is ln V + O(0.02).
        check(f"{family} first loss", abs(first - math.log(COMMON["vocab_size"])) < 0.1,
              f"{first:.4f} against ln V = {math.log(COMMON['vocab_size']):.4f}")
        check(f"{family} json", data["model"]["family"] == family.split("-")[0] and data["result"]["parameters"] == ablate_params
              and data["float8"] is False, f"family {data['model']['family']}, float8 {data['float8']}")

    try:
        import torchao  # noqa: F401
        have_torchao = True
    except ImportError:
        have_torchao = False
    if not have_torchao:
        r = subprocess.run([sys.executable, peer, "--config", os.path.join(tmp, "llama.toml"), "--device", "cpu",
                            "--dtype", "fp32", "--no-compile", "--batch", "2", "--steps", "1", "--warmup", "1",
                            "--float8"], capture_output=True, text=True)
        check("--float8 without torchao", r.returncode == 77 and "torchao is not importable" in r.stdout,
              f"exit {r.returncode}: {r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-300:]}")

if failures:
    sys.exit(f"test_peer_models: {len(failures)} check(s) failed: {', '.join(failures)}")
print("test_peer_models: all checks passed")
