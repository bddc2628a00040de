"""The attention-backend interface shared by the three systems.

A backend is planned once per step, then called once per layer (`forward`) by the model with
that layer's q, k, v. Decode planning is pure host work (`plan_decode` returns a DecodePlan of
plain lists); the device form (`DecodeMeta`) is either built eagerly or packed into the static
buffers of a captured CUDA graph, so a decode step replays without host syncs in the forward.
Prefill/extend is the same for every system (one kernel that reads the cached prefix through
the slot table plus the causal new part), so TTFT compares cleanly; only decode differs.
"""

from __future__ import annotations

import math

import torch

from granikv.attention.batch import StepBatch
from granikv.attention.ops import KernelOps
from granikv.attention.plan import CASCADE, DENSE, EXT_KINDS, ROWS, DecodeMeta, DecodePlan, materialize
from granikv.trace import span


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
        self.meta: DecodeMeta | None = None

    # -- planning ---------------------------------------------------------------------------
    def plan(self, batch: StepBatch) -> DecodePlan | None:
        """Eager planning: host decision + device metadata for this step."""
        self.batch = batch
        if batch.mode != "decode":
            return None
        with span("dispatch"):
            plan = self.plan_decode(batch)
        self.meta = materialize(plan, batch.seq_lens, self.slot_table, self.group_size)
        return plan

    def plan_decode(self, batch: StepBatch) -> DecodePlan:
        """Paged decode: every request reads its whole context."""
        return DecodePlan()

    def warm_signatures(self, n: int) -> list[tuple]:
        """Plan signatures (DecodePlan.signature) of a decode step of n requests that share one
        long prefix, and of one without prefix passes: what the CUDA graphs are captured for at
        start-up (DecodeGraphs.capture_ahead), so no capture or Triton compile lands inside a
        serving run. Paged decode has no prefix pass."""
        return [()]

    def warm_class_signatures(self, n: int, max_classes: int) -> list[tuple]:
        """Plan signatures of a decode step of n requests split evenly over 2, 4, ... up to
        `max_classes` shared prefixes (a multi-prefix or multi-agent run at its steady batch
        size), captured at start-up for the batch size a run sits at. Only backends that form
        several prefix classes in one step have them."""
        return []

    def warm_extend(self) -> int:
        """Compile the extend kernel's variants at start-up (KernelOps.warm_extend)."""
        return self.ops.warm_extend(self.k_cache[0], self.v_cache[0], self.slot_table, self.num_q_heads,
                                    self.sm_scale)

    def bind(self, batch: StepBatch, meta: DecodeMeta) -> None:
        """Use prebuilt (static, graph-owned) metadata instead of planning."""
        self.batch, self.meta = batch, meta

    # -- forward ----------------------------------------------------------------------------
    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.forward(layer, q, k, v)

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b = self.batch
        kc, vc = self.k_cache[layer], self.v_cache[layer]
        self.ops.store_kv(kc, vc, b.out_slots, k, v)
        if b.mode == "extend":
            max_qo, max_kv = b.extend_bounds()
            return self.ops.extend(q, kc, vc, self.slot_table, b.rows, b.qo_indptr, b.prefix_lens, self.sm_scale,
                                   max_qo_len=max_qo, max_kv_len=max_kv, splits=b.split_count)
        m = self.meta
        o, lse = self.ops.decode(q, kc, vc, self.slot_table, b.rows, m.kv_start, m.kv_len, self.sm_scale)
        dense = m.passes.get(DENSE)
        if dense is not None:
            op, lp = self.ops.prefix_dense(q, kc, vc, dense, self.sm_scale)
            self.ops.merge_(o, lse, op, lp)
        # ROWS: COLD shared runs through a slot-table row; EXT, ext2, ...: the runs a head class's
        # members share after the head, level by level (granikv; a request may be in one class of
        # each kind, each merged by LSE)
        for kind in (CASCADE, ROWS, *EXT_KINDS):
            casc = m.passes.get(kind)
            if casc is not None:
                op, lp = self.ops.prefix_cascade(q, kc, vc, casc, self.sm_scale)
                self.ops.merge_(o, lse, op, lp)
        if m.flat is not None:  # those kinds' classes at every level in one launch, one merge
            self.ops.prefix_flat_(q, kc, vc, m.flat, self.sm_scale, o, lse)
        return o

    def stats(self) -> dict:
        return {}
