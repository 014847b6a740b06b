"""The model families ablate trains, written in plain PyTorch: the peer the benchmarks compare with.

GPT-2 style (`GPT`), as ablate's defaults resolve it: token embedding (rows padded to a multiple of
`vocab_multiple`) + learned positions, pre-LayerNorm blocks with biases, separate q/k/v/o
projections, causal scaled_dot_product_attention, GELU (tanh) MLP of 4*d, final LayerNorm, LM head
tied to the token embedding, cross-entropy over the real vocabulary only (padded columns never
enter the softmax, as in ablate). Initialisation as ablate's init_params: N(0, 0.02), residual
output projections N(0, 0.02/sqrt(2 L)), norm weights 1, biases 0.

Llama style (`Llama`, configs/llama-1b.toml): no positions table, RMSNorm (eps 1e-6), no biases,
q over n_heads and k/v over n_kv_heads (grouped-query attention), RoPE on q and k rotating the two
halves of each head (as ablate and Hugging Face's Llama do), SwiGLU MLP down(silu(gate x) * up x),
an untied LM head; the same initialisation rule (o and down are the residual output projections).
"""
import math

import torch
import torch.nn.functional as F


def attention(q, k, v):
    """Causal attention over (B, H, T, D) q and (B, Hkv, T, D) k, v: SDPA where torch has it (with
    grouped-query heads repeated), else the definition (older torch, a CPU check of the script)."""
    if k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[2]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s.float(), dim=-1).to(v.dtype) @ v


class Block(torch.nn.Module):
    def __init__(self, d, h, hidden):
        super().__init__()
        self.h = h
        self.ln1 = torch.nn.LayerNorm(d, eps=1e-5)
        self.q = torch.nn.Linear(d, d)
        self.k = torch.nn.Linear(d, d)
        self.v = torch.nn.Linear(d, d)
        self.o = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d, eps=1e-5)
        self.fc = torch.nn.Linear(d, hidden)
        self.proj = torch.nn.Linear(hidden, d)

    def forward(self, x):
        B, T, C = x.shape
        a = self.ln1(x)
        q = self.q(a).view(B, T, self.h, C // self.h).transpose(1, 2)
        k = self.k(a).view(B, T, self.h, C // self.h).transpose(1, 2)
        v = self.v(a).view(B, T, self.h, C // self.h).transpose(1, 2)
        y = attention(q, k, v)
        x = x + self.o(y.transpose(1, 2).reshape(B, T, C))
        return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


def init_like_ablate(model, n_layers, residual_suffixes):
    """ablate's init_params: biases 0, norm weights 1, matrices N(0, 0.02), residual outputs scaled."""
    for name, p in model.named_parameters():
        if name.endswith(".bias"):
            torch.nn.init.zeros_(p)
        elif p.dim() == 1:
            torch.nn.init.ones_(p)
        else:
            std = 0.02 / math.sqrt(2 * n_layers) if name.endswith(residual_suffixes) else 0.02
            torch.nn.init.normal_(p, 0.0, std)


def padded(vocab, multiple):
    return (vocab + multiple - 1) // multiple * multiple


class GPT(torch.nn.Module):
    def __init__(self, vocab, d, n_layers, n_heads, max_seq_len, vocab_multiple=1):
        super().__init__()
        self.vocab = vocab
        self.wte = torch.nn.Embedding(padded(vocab, vocab_multiple), d)
        self.wpe = torch.nn.Embedding(max_seq_len, d)
        self.blocks = torch.nn.ModuleList(Block(d, n_heads, 4 * d) for _ in range(n_layers))
        self.ln_f = torch.nn.LayerNorm(d, eps=1e-5)
        init_like_ablate(self, n_layers, ("o.weight", "proj.weight"))

    def forward(self, tokens, targets):
        T = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(T, device=tokens.device))
        for b in self.blocks:
            x = b(x)
        logits = (self.ln_f(x) @ self.wte.weight.T)[..., : self.vocab]  # tied LM head, real columns only
        return F.cross_entropy(logits.reshape(-1, self.vocab).float(), targets.reshape(-1))

    def param_groups(self, weight_decay):
        """AdamW groups as ablate marks `decay`: matrices and embeddings decay, norms and biases do not."""
        decay = [p for p in self.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.parameters() if p.dim() < 2]
        return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class RMSNorm(torch.nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, the mean in f32."""

    def __init__(self, d, eps):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(d))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rope(x, cos, sin):
    """Rotates the two halves of each head of (B, H, T, D) x by the angles of each position."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


class LlamaBlock(torch.nn.Module):
    def __init__(self, d, h, h_kv, hidden, eps):
        super().__init__()
        self.h, self.h_kv, self.hd = h, h_kv, d // h
        self.ln1 = RMSNorm(d, eps)
        self.q = torch.nn.Linear(d, h * self.hd, bias=False)
        self.k = torch.nn.Linear(d, h_kv * self.hd, bias=False)
        self.v = torch.nn.Linear(d, h_kv * self.hd, bias=False)
        self.o = torch.nn.Linear(h * self.hd, d, bias=False)
        self.ln2 = RMSNorm(d, eps)
        self.gate = torch.nn.Linear(d, hidden, bias=False)
        self.up = torch.nn.Linear(d, hidden, bias=False)
        self.down = torch.nn.Linear(hidden, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        a = self.ln1(x)
        q = rope(self.q(a).view(B, T, self.h, self.hd).transpose(1, 2), cos, sin)
        k = rope(self.k(a).view(B, T, self.h_kv, self.hd).transpose(1, 2), cos, sin)
        v = self.v(a).view(B, T, self.h_kv, self.hd).transpose(1, 2)
        y = attention(q.to(v.dtype), k.to(v.dtype), v)
        x = x + self.o(y.transpose(1, 2).reshape(B, T, self.h * self.hd))
        m = self.ln2(x)
        return x + self.down(F.silu(self.gate(m)) * self.up(m))


class Llama(torch.nn.Module):
    def __init__(self, vocab, d, n_layers, n_heads, n_kv_heads, hidden, vocab_multiple=1, theta=10000.0, eps=1e-6):
        super().__init__()
        self.vocab, self.hd, self.theta = vocab, d // n_heads, theta
        self.wte = torch.nn.Embedding(padded(vocab, vocab_multiple), d)
        self.blocks = torch.nn.ModuleList(LlamaBlock(d, n_heads, n_kv_heads, hidden, eps) for _ in range(n_layers))
        self.ln_f = RMSNorm(d, eps)
        self.head = torch.nn.Linear(d, padded(vocab, vocab_multiple), bias=False)
        init_like_ablate(self, n_layers, ("o.weight", "down.weight"))

    def forward(self, tokens, targets):
        T = tokens.shape[1]
        i = torch.arange(self.hd // 2, device=tokens.device, dtype=torch.float32)
        angle = torch.arange(T, device=tokens.device, dtype=torch.float32)[:, None] * self.theta ** (-2 * i / self.hd)
        cos, sin = angle.cos(), angle.sin()
        x = self.wte(tokens)
        for b in self.blocks:
            x = b(x, cos, sin)
        logits = self.head(self.ln_f(x))[..., : self.vocab]  # real columns only
        return F.cross_entropy(logits.reshape(-1, self.vocab).float(), targets.reshape(-1))

    def param_groups(self, weight_decay):
        decay = [p for p in self.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.parameters() if p.dim() < 2]
        return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
