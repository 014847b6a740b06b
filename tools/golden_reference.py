#!/usr/bin/env python3
"""Writes the golden files the C++ model is tested against (tests/golden/*.safetensors).

An independent PyTorch (float64) implementation of ablate's model family: token embedding (+ learned
positions), pre-norm blocks (LayerNorm eps 1e-5 | RMSNorm eps 1e-6), q/k/v projections, per-head
RMSNorm of q and k (qk_norm), RoPE (rotate-half: pairs (i, i + D/2), angle = pos * theta^(-2i/D)),
block-diagonal causal attention over the batch's segments with GQA, output projection, GELU (tanh)
or SwiGLU MLP, final norm, LM head (tied or not) with a cross-entropy over the real vocabulary only
(padded columns excluded), mean over real targets. Then a few AdamW steps (PyTorch's torch.optim.AdamW,
weight decay on matrices only) on the same batch.

Each file holds:
  param.<name>        the initial parameters (float32) under ablate's names
  batch.<field>       tokens, targets, positions, segment_ids (int32, shape (B, T))
  logits              (B*T, vocab_padded) float64
  loss                ()  float64, mean over real targets
  grad.<name>         float64 gradients of the loss
  losses              (steps + 1,) float64: the loss before each AdamW step and after the last
and metadata "config" (JSON: [model] keys and the optimizer's hyper-parameters).

Usage: python3 tools/golden_reference.py [--out tests/golden]
"""
import argparse
import json
import math
import os

import torch
from safetensors.torch import save_file

torch.set_default_dtype(torch.float64)

CASES = {
    "tiny_gpt2": dict(d_model=16, n_layers=2, n_heads=4, n_kv_heads=4, vocab_size=37, vocab_multiple=8,
                      max_seq_len=24, norm="layernorm", mlp="gelu_mlp", mlp_hidden=64, position="learned",
                      rope_theta=10000.0, qk_norm=False, bias=True, tie_embeddings=True),
    "tiny_llama": dict(d_model=24, n_layers=2, n_heads=6, n_kv_heads=2, vocab_size=41, vocab_multiple=8,
                       max_seq_len=24, norm="rmsnorm", mlp="swiglu_mlp", mlp_hidden=40, position="rope",
                       rope_theta=500.0, qk_norm=True, bias=False, tie_embeddings=False),
}
OPTIM = dict(lr=1e-2, weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8, steps=3)


def param_shapes(c):
    """ablate's parameter names and shapes, in its table order."""
    C, H, Hk, M = c["d_model"], c["n_heads"], c["n_kv_heads"], c["mlp_hidden"]
    D = C // H
    Vp = -(-c["vocab_size"] // c["vocab_multiple"]) * c["vocab_multiple"]
    shapes = [("wte.weight", (Vp, C))]
    if c["position"] == "learned":
        shapes.append(("wpe.weight", (c["max_seq_len"], C)))

    def norm(prefix, width, allow_bias=True):
        shapes.append((prefix + ".weight", (width,)))
        if c["norm"] == "layernorm" and c["bias"] and allow_bias:
            shapes.append((prefix + ".bias", (width,)))

    def linear(prefix, out, inp):
        shapes.append((prefix + ".weight", (out, inp)))
        if c["bias"]:
            shapes.append((prefix + ".bias", (out,)))

    for l in range(c["n_layers"]):
        p = f"blocks.{l}"
        norm(p + ".ln1", C)
        linear(p + ".attn.q", H * D, C)
        linear(p + ".attn.k", Hk * D, C)
        linear(p + ".attn.v", Hk * D, C)
        if c["qk_norm"]:
            shapes.append((p + ".attn.q_norm.weight", (D,)))
            shapes.append((p + ".attn.k_norm.weight", (D,)))
        linear(p + ".attn.o", C, H * D)
        norm(p + ".ln2", C)
        if c["mlp"] == "gelu_mlp":
            linear(p + ".mlp.fc", M, C)
            linear(p + ".mlp.proj", C, M)
        else:
            linear(p + ".mlp.gate", M, C)
            linear(p + ".mlp.up", M, C)
            linear(p + ".mlp.down", C, M)
    norm("ln_f", C)
    if not c["tie_embeddings"]:
        shapes.append(("lm_head.weight", (Vp, C)))
    return shapes, Vp


def make_batch(c, gen):
    """Two packed rows of 16 positions: documents of lengths [5, 1, 7, 3] and [10, 3] + 3 padding."""
    B, T = 2, 16
    layouts = [[5, 1, 7, 3], [10, 3]]
    tokens = torch.zeros(B, T, dtype=torch.int32)
    targets = torch.full((B, T), -1, dtype=torch.int32)
    positions = torch.zeros(B, T, dtype=torch.int32)
    segments = torch.zeros(B, T, dtype=torch.int32)
    for b, lengths in enumerate(layouts):
        at = 0
        for s, n in enumerate(lengths):
            doc = torch.randint(0, c["vocab_size"], (n + 1,), generator=gen, dtype=torch.int32)
            tokens[b, at:at + n] = doc[:n]
            targets[b, at:at + n] = doc[1:]
            if n > 2:
                targets[b, at + n - 1] = -1  # a document that ends without a next-token target
            positions[b, at:at + n] = torch.arange(n, dtype=torch.int32)
            segments[b, at:at + n] = s + 1
            at += n
    return dict(tokens=tokens, targets=targets, positions=positions, segment_ids=segments)


def rmsnorm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def layernorm(x, w, b, eps):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    y = (x - mu) / torch.sqrt(var + eps) * w
    return y + b if b is not None else y


def rope(x, pos, theta):
    # x: (B, T, H, D); pairs (i, i + D/2)
    D = x.shape[-1]
    half = D // 2
    inv = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / D)
    ang = pos.to(torch.float64)[..., None] * inv  # (B, T, half)
    cos, sin = torch.cos(ang)[:, :, None, :], torch.sin(ang)[:, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def forward(c, P, batch):
    C, H, Hk = c["d_model"], c["n_heads"], c["n_kv_heads"]
    D = C // H
    tok = batch["tokens"].long()
    pos = batch["positions"].long()
    seg = batch["segment_ids"].long()
    B, T = tok.shape

    def norm(x, prefix):
        if c["norm"] == "layernorm":
            return layernorm(x, P[prefix + ".weight"], P.get(prefix + ".bias"), 1e-5)
        return rmsnorm(x, P[prefix + ".weight"], 1e-6)

    def linear(x, prefix):
        y = x @ P[prefix + ".weight"].T
        return y + P[prefix + ".bias"] if prefix + ".bias" in P else y

    x = P["wte.weight"][tok]
    if c["position"] == "learned":
        x = x + P["wpe.weight"][pos]
    i = torch.arange(T)
    allowed = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] != 0) & (i[None, None, :] <= i[None, :, None])
    for l in range(c["n_layers"]):
        p = f"blocks.{l}"
        h = norm(x, p + ".ln1")
        q = linear(h, p + ".attn.q").view(B, T, H, D)
        k = linear(h, p + ".attn.k").view(B, T, Hk, D)
        v = linear(h, p + ".attn.v").view(B, T, Hk, D)
        if c["qk_norm"]:
            q = rmsnorm(q, P[p + ".attn.q_norm.weight"], 1e-6)
            k = rmsnorm(k, P[p + ".attn.k_norm.weight"], 1e-6)
        if c["position"] == "rope":
            q = rope(q, pos, c["rope_theta"])
            k = rope(k, pos, c["rope_theta"])
        k = k.repeat_interleave(H // Hk, dim=2)
        v = v.repeat_interleave(H // Hk, dim=2)
        s = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(D)
        s = s.masked_fill(~allowed[:, None], float("-inf"))
        a = torch.softmax(s, dim=-1)
        a = torch.nan_to_num(a, nan=0.0)  # padding rows attend to nothing: output 0
        o = torch.einsum("bhij,bjhd->bihd", a, v).reshape(B, T, H * D)
        x = x + linear(o, p + ".attn.o")
        h = norm(x, p + ".ln2")
        if c["mlp"] == "gelu_mlp":
            m = linear(torch.nn.functional.gelu(linear(h, p + ".mlp.fc"), approximate="tanh"), p + ".mlp.proj")
        else:
            m = linear(torch.nn.functional.silu(linear(h, p + ".mlp.gate")) * linear(h, p + ".mlp.up"), p + ".mlp.down")
        x = x + m
    x = norm(x, "ln_f")
    W = P["wte.weight"] if c["tie_embeddings"] else P["lm_head.weight"]
    logits = (x @ W.T).reshape(B * T, -1)
    V = c["vocab_size"]
    tgt = batch["targets"].reshape(-1).long()
    loss = torch.nn.functional.cross_entropy(logits[:, :V], tgt, ignore_index=-1, reduction="sum") / (tgt >= 0).sum()
    return logits, loss


def build(name, c, seed):
    gen = torch.Generator().manual_seed(seed)
    shapes, Vp = param_shapes(c)
    params32 = {}
    for n, shape in shapes:
        if n.endswith(".bias"):
            t = 0.05 * torch.randn(shape, generator=gen)
        elif len(shape) == 1:  # norm weights around 1
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        else:
            t = 0.2 * torch.randn(shape, generator=gen)
        if n in ("wte.weight", "lm_head.weight"):
            t[c["vocab_size"]:] = 0.0  # padded vocabulary rows
        params32[n] = t.to(torch.float32)
    batch = make_batch(c, gen)
    P = {n: t.to(torch.float64).clone().requires_grad_(True) for n, t in params32.items()}
    logits, loss = forward(c, P, batch)
    loss.backward()
    out = {f"param.{n}": t.contiguous() for n, t in params32.items()}
    out.update({f"batch.{k}": v.contiguous() for k, v in batch.items()})
    out["logits"] = logits.detach().contiguous()
    out["loss"] = loss.detach().reshape(())
    for n, t in P.items():
        out[f"grad.{n}"] = t.grad.detach().contiguous()
    # AdamW steps on the same batch, from the same float32 starting point (kept in float64).
    Q = {n: t.to(torch.float64).clone().requires_grad_(True) for n, t in params32.items()}
    decay = [t for n, t in Q.items() if t.dim() >= 2]
    no_decay = [t for n, t in Q.items() if t.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": OPTIM["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=OPTIM["lr"], betas=(OPTIM["beta1"], OPTIM["beta2"]), eps=OPTIM["eps"])
    losses = []
    for _ in range(OPTIM["steps"]):
        opt.zero_grad()
        _, l = forward(c, Q, batch)
        losses.append(l.item())
        l.backward()
        opt.step()
    with torch.no_grad():
        losses.append(forward(c, Q, batch)[1].item())
    out["losses"] = torch.tensor(losses, dtype=torch.float64)
    meta = {"config": json.dumps({**c, "vocab_padded": Vp, "optimizer": OPTIM})}
    return out, meta


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "golden"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for i, (name, c) in enumerate(CASES.items()):
        tensors, meta = build(name, c, 1000 + i)
        path = os.path.join(args.out, f"{name}.safetensors")
        save_file(tensors, path, metadata=meta)
        print(f"{path}: loss {tensors['loss'].item():.6f}, losses {[round(x, 6) for x in tensors['losses'].tolist()]}, "
              f"{sum(t.numel() for t in tensors.values())} values (torch {torch.__version__})")


if __name__ == "__main__":
    main()
