"""KVCache: per-layer K and V tensors over one slot space.

Every pool (HOT, COLD, paged) hands out indices into this one space, so attention kernels read any
token through `K[layer][slot]` whatever pool it lives in, and the HOT slab `[base, base+Lp)` is a
plain strided view `K[layer][base:base+Lp]`. Slot 0 is never handed out by a pool: padded tokens of
a CUDA-graph batch write their K/V there, so a padded write can never clobber live KV.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

RESERVED_SLOT = 0


def _dtype_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@dataclass
class KVCache:
    """K and V of every layer, `[num_slots, H_kv, d]` each.

    Allocated once at engine start; pools and the radix tree only move integer slot indices.
    """

    num_layers: int
    num_slots: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype = torch.float32
    device: str | torch.device = "cpu"
    k: list[torch.Tensor] = field(init=False, repr=False)
    v: list[torch.Tensor] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.num_slots < 2:
            raise ValueError("num_slots must be >= 2 (slot 0 is reserved)")
        shape = (self.num_slots, self.num_kv_heads, self.head_dim)
        self.k = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        self.v = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]

    @staticmethod
    def bytes_per_slot(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """Bytes one token occupies across all layers, K and V: 2·L·H_kv·d·sizeof(dtype)."""
        return 2 * num_layers * num_kv_heads * head_dim * _dtype_bytes(dtype)

    @classmethod
    def slots_for_budget(
        cls, budget_bytes: int, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        """How many slots (reserved slot 0 included) fit in `budget_bytes`."""
        per = cls.bytes_per_slot(num_layers, num_kv_heads, head_dim, dtype)
        n = int(budget_bytes) // per
        if n < 2:
            raise ValueError(f"a budget of {budget_bytes} B holds fewer than 2 slots of {per} B")
        return n

    @property
    def slot_bytes(self) -> int:
        return self.bytes_per_slot(self.num_layers, self.num_kv_heads, self.head_dim, self.dtype)

    @property
    def total_bytes(self) -> int:
        return self.slot_bytes * self.num_slots

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy K/V of slots `src` to slots `dst` in every layer (the HOT promotion copy)."""
        src = src.to(self.k[0].device, torch.long)
        dst = dst.to(self.k[0].device, torch.long)
        for layer in range(self.num_layers):
            self.k[layer][dst] = self.k[layer][src]
            self.v[layer][dst] = self.v[layer][src]
