"""A block's attention weights as an evaluation reads them: a block of query rows at a time.

An evaluation's metrics read few entries of each map S (R, B, H, Tq, T): its last row (the attention spread,
snapshots), a parent's and an induction anchor's weight per row. Holding S whole costs R·B·H·T² numbers per
layer (512 MiB at experiment=makkuva's 64 test sequences of 1,024 tokens in float64), and writing and reading
it back costs more than the rest of the evaluation. `Rows` computes S from the queries and keys one block of
rows at a time, each row's softmax as the whole map's (`causal`, over the keys a row can see), so
what a metric reads is the same number to rounding (tests/test_gpt.py: 1e-12 against a plain nanoGPT's maps); the merged attention (eq. 2.1), whose forward pass needs S anyway, hands its S over whole.
"""
from __future__ import annotations

import math

import torch

BLOCK = 1 << 22  # numbers in one block of rows (32 MiB in float64): bounds an evaluation's memory per layer


def causal(logits: torch.Tensor, start: int) -> torch.Tensor:
    """Softmax over keys j ≤ i for queries i = start … (logits (…, Tq, T), a fresh tensor: masked in place, which
    autograd allows, as the product that made it keeps its inputs, not its output)."""
    Tq, T = logits.shape[-2:]
    i = torch.arange(start, start + Tq, device=logits.device)[:, None]
    j = torch.arange(T, device=logits.device)[None, :]
    return torch.softmax(logits.masked_fill_(j > i, float("-inf")), -1)


class Rows:
    """S for the queries start … start + Tq − 1 over the keys 0 … T − 1, given whole (`S`) or by its queries
    q (R, B, Tq, H, dh) and keys k (R, B, T, H, dh), S = causal softmax(q·kᵀ/√dh)."""

    def __init__(self, start: int, S: torch.Tensor | None = None, q: torch.Tensor | None = None,
                 k: torch.Tensor | None = None):
        self.start, self._S, self._q, self._k = start, S, q, k
        if S is not None:
            self.Tq, self.T = S.shape[-2:]
        else:
            self.Tq, self.T = q.shape[2], k.shape[2]

    def _block(self, i0: int, i1: int) -> torch.Tensor:
        """Rows i0 … i1 − 1 (relative to start) over the keys 0 … start + i1 − 1: (R, B, H, i1 − i0, start + i1).
        The keys after the block's last query have weight 0 in every row of it and are left out."""
        if self._S is not None:
            return self._S[..., i0:i1, :]
        q, k = self._q[:, :, i0:i1], self._k[:, :, :self.start + i1]
        return causal(torch.einsum("rbihd,rbjhd->rbhij", q, k).div_(math.sqrt(q.shape[-1])), self.start + i0)

    def blocks(self):
        """(i0, S[..., i0:i0 + b, :k]) over every row, b rows at a time (at most BLOCK numbers a block), k the
        keys up to the block's last query (`_block`)."""
        if self._S is not None:
            yield 0, self._S
            return
        R, B, _, H, _ = self._q.shape
        b = max(1, BLOCK // (R * B * H * self.T))
        for i0 in range(0, self.Tq, b):
            yield i0, self._block(i0, min(self.Tq, i0 + b))

    def last(self) -> torch.Tensor:
        """The last query's row (R, B, H, T): every key."""
        return self._block(self.Tq - 1, self.Tq)[..., 0, :]

    def whole(self) -> torch.Tensor:
        """S itself (R, B, H, Tq, T): for short sequences only (snapshots keep whole maps up to 64 positions)."""
        if self._S is not None:
            return self._S
        S = self._block(0, self.Tq)
        return torch.nn.functional.pad(S, (0, self.T - S.shape[-1]))
