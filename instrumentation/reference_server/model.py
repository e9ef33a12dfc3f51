"""A tiny randomly initialised decoder-only transformer over bytes, in plain torch (no downloads).

Tokens are bytes (0-255) plus an end-of-sequence token (256). The model always runs on a fixed window of
``context`` tokens with the position to predict passed as a tensor, so one compiled graph serves prefill
and every decode step (no shape- or value-driven recompiles).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

EOS = 256
VOCAB = 257


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(attn)
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, context: int = 64, dim: int = 64, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.context = context
        self.embed, self.pos = nn.Embedding(VOCAB, dim), nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, VOCAB)

    def forward(self, tokens: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """Logits ``[batch, VOCAB]`` for the token after position ``last`` of the window ``tokens [batch, context]``."""
        x = self.embed(tokens) + self.pos.weight
        for block in self.blocks:
            x = block(x)
        h = x.gather(1, last.view(-1, 1, 1).expand(-1, 1, x.shape[-1])).squeeze(1)
        return self.head(self.norm(h))


def build_model(seed: int = 0, context: int = 64) -> TinyLM:
    torch.manual_seed(seed)
    return TinyLM(context=context).eval()


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(tokens: list[int]) -> str:
    return bytes(t for t in tokens if t < 256).decode("utf-8", errors="replace")
