"""A plain-torch attention function for model tests and CPU reference runs.

It keeps each sequence's K/V per layer in Python lists (float32) and runs causal SDPA over
them, for flat batches of several sequences: the caller says, before each forward, which
sequences the step's tokens belong to and how many new tokens each brings (a prefill of many,
or one decode token). Slow and simple on purpose: it is the oracle the engine's backends
(paged, cascade, granikv) are compared against, not one of them.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
import torch.nn.functional as F


class RefAttention:
    """Causal float32 attention over per-sequence K/V histories (one instance per model run)."""

    def __init__(self, num_layers: int, scale: float | None = None):
        self.num_layers = num_layers
        self.scale = scale
        self._k: list[dict[Hashable, torch.Tensor]] = [{} for _ in range(num_layers)]
        self._v: list[dict[Hashable, torch.Tensor]] = [{} for _ in range(num_layers)]
        self._segments: list[tuple[Hashable, int]] = []

    def set_batch(self, segments: Sequence[tuple[Hashable, int]]) -> None:
        """Layout of the next forward's flat tokens: consecutive (seq_id, num_new_tokens) runs.
        New tokens extend the sequence's history (their positions follow its current length)."""
        if any(n < 1 for _, n in segments):
            raise ValueError("every segment needs at least one token")
        self._segments = list(segments)

    def seq_len(self, seq_id: Hashable, layer_id: int = 0) -> int:
        """Tokens of `seq_id` cached so far in `layer_id` (0 if unknown)."""
        k = self._k[layer_id].get(seq_id)
        return 0 if k is None else k.shape[0]

    def free(self, seq_id: Hashable) -> None:
        for layer in range(self.num_layers):
            self._k[layer].pop(seq_id, None)
            self._v[layer].pop(seq_id, None)

    def __call__(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        total = sum(n for _, n in self._segments)
        if total != q.shape[0]:
            raise ValueError(f"set_batch described {total} tokens, forward has {q.shape[0]}")
        g = q.shape[1] // k.shape[1]
        out = torch.empty_like(q)
        off = 0
        for seq_id, n in self._segments:
            ks, vs = self._k[layer_id], self._v[layer_id]
            new_k, new_v = k[off : off + n].float(), v[off : off + n].float()
            ks[seq_id] = new_k if seq_id not in ks else torch.cat([ks[seq_id], new_k])
            vs[seq_id] = new_v if seq_id not in vs else torch.cat([vs[seq_id], new_v])
            kk = ks[seq_id].repeat_interleave(g, dim=1).transpose(0, 1)  # [Hq, L, d]
            vv = vs[seq_id].repeat_interleave(g, dim=1).transpose(0, 1)
            length = kk.shape[1]
            qpos = torch.arange(length - n, length, device=q.device)
            mask = torch.arange(length, device=q.device)[None, :] <= qpos[:, None]  # [n, L]
            qq = q[off : off + n].float().transpose(0, 1)  # [Hq, n, d]
            o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, scale=self.scale)
            out[off : off + n] = o.transpose(0, 1).to(q.dtype)
            off += n
        return out
