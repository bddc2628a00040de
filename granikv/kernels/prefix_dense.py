"""Dense (Hydragen-style) prefix pass: the class's queries `[n_c*g, d]` per KV head against
the contiguous HOT slab as one fat contraction.

Two forms, both measured by harness/microbench/kernels.py:
- `fused`: the prefix kernel of `prefix_cascade` with large M/N tiles (tensor-core sized) and
  only as much split-K as fills the GPU; scores never leave the chip.
- `cublas`: torch.matmul (QK^T) -> float32 softmax -> torch.matmul (PV). It writes the
  `n_c*g x Lp` score matrix per head to memory, which costs more bytes than the KV itself once
  n_c*g > ~50, and needs the class shapes on the host (`PrefixClasses.host_*`).
`impl="auto"` picks the form that measured faster on the H200 (the fused one at every swept
shape; see docs/performance.md and docs/generated/kernels.md).

Only the slab form is accepted: the point of the dense pass is that the prefix needs no gather.
"""

from __future__ import annotations

import torch

from granikv.kernels.prefix_cascade import PrefixConfig, run_prefix_pass
from granikv.kernels.prefix_classes import PrefixClasses
from granikv.kernels.splits import SplitWorkspace

# measured best on an H200 at B=256, Lp=8K (results/h200/microbench/kernels.json, "tuning")
DENSE_CONFIG = PrefixConfig(block_m=128, block_n=128, num_warps=8, num_stages=3, min_split_len=1024,
                            target_programs=1, max_splits_cap=8, tma=True)


def prefix_dense(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, classes: PrefixClasses, sm_scale: float,
    out: torch.Tensor | None = None, lse: torch.Tensor | None = None, impl: str = "auto",
    max_splits: int | None = None, workspace: SplitWorkspace | None = None, cfg: PrefixConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense prefix pass over HOT slabs; same contract as `prefix_cascade` (o, lse natural log;
    requests outside every class untouched). impl: "auto" | "fused" | "cublas"."""
    if not classes.is_slab:
        raise ValueError("prefix_dense reads contiguous slabs only (slab_base); use prefix_cascade for pages")
    if impl in ("auto", "fused"):
        return run_prefix_pass(q, k_cache, v_cache, classes, sm_scale, cfg or DENSE_CONFIG, out, lse,
                               max_splits, workspace)
    if impl == "cublas":
        return prefix_dense_cublas(q, k_cache, v_cache, classes, sm_scale, out, lse)
    raise ValueError(f"impl must be auto, fused or cublas, got {impl!r}")


def prefix_dense_cublas(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, classes: PrefixClasses, sm_scale: float,
    out: torch.Tensor | None = None, lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unfused form: per class, S = Q K^T (cuBLAS batched over KV heads), float32 softmax and
    LSE, O = P V. Needs the host mirrors of the class shapes (no device reads)."""
    if classes.host_indptr is None or classes.host_prefix_len is None or classes.host_slab_base is None:
        raise ValueError("the cublas form needs PrefixClasses.host_indptr/host_prefix_len/host_slab_base")
    bsz, hq, d = q.shape
    hkv = k_cache.shape[1]
    g = hq // hkv
    if out is None:
        out = torch.empty_like(q)
    if lse is None:
        lse = torch.empty(bsz, hq, dtype=torch.float32, device=q.device)
    for c in range(classes.num_classes):
        i0, i1 = classes.host_indptr[c], classes.host_indptr[c + 1]
        n = i1 - i0
        if n == 0:
            continue
        reqs = classes.reqs[i0:i1].long()
        length, base = classes.host_prefix_len[c], classes.host_slab_base[c]
        if length == 0:
            out[reqs] = 0
            lse[reqs] = float("-inf")
            continue
        qc = q[reqs].view(n, hkv, g, d).permute(1, 0, 2, 3).reshape(hkv, n * g, d)
        kt = k_cache[base:base + length].permute(1, 2, 0)  # [Hkv, d, L], strided view of the slab
        vv = v_cache[base:base + length].permute(1, 0, 2)  # [Hkv, L, d]
        s = torch.matmul(qc, kt).float().mul_(sm_scale)
        lc = torch.logsumexp(s, dim=-1)
        p = torch.exp_(s.sub_(lc[..., None])).to(q.dtype)
        oc = torch.matmul(p, vv)
        out[reqs] = oc.view(hkv, n, g, d).permute(1, 0, 2, 3).reshape(n, hq, d).to(out.dtype)
        lse[reqs] = lc.view(hkv, n, g).permute(1, 0, 2).reshape(n, hq)
    return out, lse
