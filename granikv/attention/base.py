"""The attention-backend interface shared by the three systems.

A backend is planned once per step (`plan`) from a `StepBatch`, then called once per layer
(`forward`) by the model with that layer's q, k, v. Planning does all host work and fills the
metadata the kernels read; `forward` only launches kernels, so a decode step can be captured
in a CUDA graph and replayed. Prefill/extend is the same for every system (one kernel that
reads the cached prefix through the slot table plus the causal new part), so TTFT compares
cleanly; only decode differs.
"""

from __future__ import annotations

import math

import torch

from granikv.attention.batch import StepBatch
from granikv.attention.ops import KernelOps


class AttentionBackend:
    name = "base"

    def __init__(
        self,
        k_cache: list[torch.Tensor],
        v_cache: list[torch.Tensor],
        slot_table: torch.Tensor,
        num_q_heads: int,
        num_kv_heads: int,
        head_dim: int,
        ops: KernelOps,
    ) -> None:
        self.k_cache = k_cache
        self.v_cache = v_cache
        self.slot_table = slot_table
        self.num_q_heads = num_q_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.group_size = num_q_heads // num_kv_heads
        self.sm_scale = 1.0 / math.sqrt(head_dim)
        self.ops = ops
        self.batch: StepBatch | None = None

    # -- planning ---------------------------------------------------------------------------
    def plan(self, batch: StepBatch) -> None:
        self.batch = batch
        if batch.mode == "decode":
            self.plan_decode(batch)

    def plan_decode(self, batch: StepBatch) -> None:
        """Paged decode: every request reads its whole context."""
        batch.extras["kv_start"] = torch.zeros_like(batch.seq_lens)
        batch.extras["kv_len"] = batch.seq_lens

    # -- forward ----------------------------------------------------------------------------
    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.forward(layer, q, k, v)

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b = self.batch
        assert b is not None, "plan() must run before forward()"
        kc, vc = self.k_cache[layer], self.v_cache[layer]
        self.ops.store_kv(kc, vc, b.out_slots, k, v)
        if b.mode == "extend":
            return self.ops.extend(
                q, kc, vc, self.slot_table, b.rows, b.qo_indptr, b.prefix_lens, self.sm_scale
            )
        return self.forward_decode(layer, q, kc, vc)

    def forward_decode(self, layer: int, q, kc, vc) -> torch.Tensor:
        b = self.batch
        o, _ = self.ops.decode(
            q, kc, vc, self.slot_table, b.rows, b.extras["kv_start"], b.extras["kv_len"], self.sm_scale
        )
        return o

    def stats(self) -> dict:
        return {}
