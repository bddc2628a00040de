"""KernelOps: the kernel entry points an attention backend calls, in one place.

`impl="triton"` runs granikv.kernels (Triton on GPU, Triton's interpreter on CPU);
`impl="torch"` runs vectorized PyTorch versions (torch_ops.py) — fast on CPU, used by the
engine tests, and an independent cross-check of the Triton path. Prefix passes
always return (o, lse) for *every* request of the batch: rows of requests outside every class
come back as o = 0, lse = -inf, so a log-sum-exp merge leaves their plain-path result exact.
"""

from __future__ import annotations

import torch

from granikv import kernels as K
from granikv.attention import torch_ops as T
from granikv.kernels.prefix_classes import PrefixClasses
from granikv.kernels.prefix_flat import prefix_flat_


class KernelOps:
    def __init__(self, impl: str = "triton", dense_impl: str = "auto", split_extend: bool = True,
                 split_policy: K.ExtendSplitPolicy | None = None) -> None:
        if impl not in ("triton", "torch"):
            raise ValueError(f"kernel impl must be triton or torch, got {impl!r}")
        self.impl = impl
        self.dense_impl = dense_impl
        self.split_extend = split_extend  # EngineConfig.extend_split_keys
        self.split_policy = split_policy or K.ExtendSplitPolicy()  # EngineConfig.extend_split_rule

    def store_kv(self, k_cache, v_cache, slots, k, v) -> None:
        if self.impl == "torch":
            k_cache[slots] = k.to(k_cache.dtype)
            v_cache[slots] = v.to(v_cache.dtype)
            return
        K.store_kv(k_cache, v_cache, slots, k, v)

    def extend(self, q, k_cache, v_cache, slot_table, rows, qo_indptr, prefix_lens, sm_scale,
               max_qo_len: int | None = None, max_kv_len: int | None = None, splits: int | None = None):
        """`max_qo_len` / `max_kv_len`: host bounds that size the Triton grid and its key splits;
        `splits` fixes the split count instead (a captured extend graph's)."""
        if self.impl == "torch":
            return T.extend(q, k_cache, v_cache, slot_table, rows, qo_indptr, prefix_lens, sm_scale)
        if not self.split_extend:
            splits = 1
        return K.extend(q, k_cache, v_cache, slot_table, rows, qo_indptr, prefix_lens, sm_scale,
                        max_qo_len=max_qo_len, max_kv_len=max_kv_len if self.split_extend else None,
                        splits=splits, policy=self.split_policy)

    def warm_extend(self, k_cache, v_cache, slot_table, num_q_heads: int, sm_scale: float) -> int:
        """Compile the extend kernel's variants (one split; split keys and their fold) before a
        serving run, so none compiles inside it: the harness's warm-up request prefills one
        long prompt (one split), and the first small step behind a cached prefix would otherwise
        compile the split variant mid-run on a machine with a cold Triton cache. Reads the
        all-zero padding row (slot 0, reserved) and writes only a scratch output. Returns the
        number of extend launches (0 for the torch ops)."""
        if self.impl == "torch":
            return 0
        pad_row = slot_table.shape[0] - 1
        new = 16
        prefix = max(0, min(256, slot_table.shape[1] - new))
        dev = k_cache.device
        q = torch.zeros(new, num_q_heads, k_cache.shape[-1], dtype=k_cache.dtype, device=dev)
        i32 = {"dtype": torch.int32, "device": dev}
        rows = torch.tensor([pad_row], **i32)
        indptr = torch.tensor([0, new], **i32)
        plen = torch.tensor([prefix], **i32)
        variants = (1, 2) if self.split_extend else (1,)
        for splits in variants:
            K.extend(q, k_cache, v_cache, slot_table, rows, indptr, plen, sm_scale, max_qo_len=new, splits=splits,
                     policy=self.split_policy)
        return len(variants)

    def decode(self, q, k_cache, v_cache, slot_table, rows, kv_start, kv_len, sm_scale):
        if self.impl == "torch":
            return T.decode(q, k_cache, v_cache, slot_table, rows, kv_start, kv_len, sm_scale)
        return K.decode_paged(q, k_cache, v_cache, slot_table, rows, kv_start, kv_len, sm_scale)

    def _empty_prefix_out(self, q):
        o = torch.zeros_like(q)
        lse = torch.full(q.shape[:2], float("-inf"), dtype=torch.float32, device=q.device)
        return o, lse

    def prefix_cascade(self, q, k_cache, v_cache, classes: PrefixClasses, sm_scale):
        if self.impl == "torch":
            return T.prefix(q, k_cache, v_cache, classes, sm_scale)
        o, lse = self._empty_prefix_out(q)
        return K.prefix_cascade(q, k_cache, v_cache, classes, sm_scale, out=o, lse=lse)

    def prefix_dense(self, q, k_cache, v_cache, classes: PrefixClasses, sm_scale):
        if self.impl == "torch":
            return T.prefix(q, k_cache, v_cache, classes, sm_scale)
        o, lse = self._empty_prefix_out(q)
        return K.prefix_dense(q, k_cache, v_cache, classes, sm_scale, out=o, lse=lse, impl=self.dense_impl)

    def prefix_flat_(self, q, k_cache, v_cache, flat, sm_scale, out, lse) -> None:
        if self.impl == "torch":
            T.prefix_flat_(q, k_cache, v_cache, flat, sm_scale, out, lse)
            return
        prefix_flat_(q, k_cache, v_cache, flat, sm_scale, out, lse)

    def merge_(self, o_a, lse_a, o_b, lse_b) -> None:
        if self.impl == "torch":
            T.merge_(o_a, lse_a, o_b, lse_b)
            return
        K.merge_lse_(o_a, lse_a, o_b, lse_b)
