"""What the transformers comparison tests share: the tiny quickstart shapes they train, running
`ablate` (exit 1 with its output on failure) and loading an export in transformers."""
import subprocess
import sys

try:
    import torch
    import transformers  # noqa: F401
    import safetensors  # noqa: F401
except ImportError as e:
    sys.exit(f"FAIL: {e}: scripts/setup-tests.sh makes the test venv with them (tests/support/test_python.sh runs it)")

from transformers import AutoModelForCausalLM

TINY = ["model.d_model=48", "model.n_layers=2", "model.max_seq_len=64", "batching.batch_size=4", "batching.seq_len=64",
        "run.threads=2", "run.eval_batches=0", "run.steps=30", "schedule.warmup_steps=0", "data.synthetic_probes.documents=500"]
SHAPES = {
    "gpt2": ["model.n_heads=4"],
    "qwen3": ["model.n_heads=6", "model.n_kv_heads=2", "model.norm=rmsnorm", "model.mlp=swiglu_mlp", "model.position=rope",
              "model.qk_norm=true", "model.bias=false", "model.tie_embeddings=false", "model.rope.theta=500"],
    "llama": ["model.n_heads=4", "model.n_kv_heads=2", "model.norm=rmsnorm", "model.mlp=swiglu_mlp", "model.position=rope",
              "model.bias=false"],
}


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(" ".join(cmd), "\n", r.stdout, r.stderr)
        sys.exit(1)
    return r.stdout


def load(directory):
    """AutoModelForCausalLM in float32: `dtype=` on current transformers, `torch_dtype=` on older ones."""
    try:
        return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    except TypeError:
        return AutoModelForCausalLM.from_pretrained(directory, torch_dtype=torch.float32)
