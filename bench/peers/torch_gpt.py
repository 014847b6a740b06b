"""The model family ablate trains, written in plain PyTorch: the peer the benchmarks compare with.

GPT-2 style, as ablate's defaults resolve it: token embedding (rows padded to a multiple of
`vocab_multiple`) + learned positions, pre-LayerNorm blocks with biases, separate q/k/v/o
projections, causal scaled_dot_product_attention, GELU (tanh) MLP of 4*d, final LayerNorm, LM head
tied to the token embedding, cross-entropy over the real vocabulary only (padded columns never
enter the softmax, as in ablate). Initialisation as ablate's init_params: N(0, 0.02), residual
output projections N(0, 0.02/sqrt(2 L)), norm weights 1, biases 0.
"""
import math

import torch
import torch.nn.functional as F


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
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(B, T, C))
        return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(torch.nn.Module):
    def __init__(self, vocab, d, n_layers, n_heads, max_seq_len, vocab_multiple=1):
        super().__init__()
        self.vocab = vocab
        padded = (vocab + vocab_multiple - 1) // vocab_multiple * vocab_multiple
        self.wte = torch.nn.Embedding(padded, d)
        self.wpe = torch.nn.Embedding(max_seq_len, d)
        self.blocks = torch.nn.ModuleList(Block(d, n_heads, 4 * d) for _ in range(n_layers))
        self.ln_f = torch.nn.LayerNorm(d, eps=1e-5)
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                torch.nn.init.zeros_(p)
            elif p.dim() == 1:
                torch.nn.init.ones_(p)
            else:
                std = 0.02 / math.sqrt(2 * n_layers) if name.endswith(("o.weight", "proj.weight")) else 0.02
                torch.nn.init.normal_(p, 0.0, std)

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
