"""Write new K/V rows into their slots (the one write path of every pool: HOT slab, COLD
token slot or page slot are all just slot indices). Padded tokens carry slot 0, the dummy."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kernel(KC, VC, Slots, K, V, s_kc, s_vc, s_k, s_v, HD: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(Slots + t).to(tl.int64)
    for off in tl.static_range(0, HD, BLOCK):
        offs = off + tl.arange(0, BLOCK)
        mask = offs < HD
        tl.store(KC + slot * s_kc + offs, tl.load(K + t * s_k + offs, mask=mask), mask=mask)
        tl.store(VC + slot * s_vc + offs, tl.load(V + t * s_v + offs, mask=mask), mask=mask)


def store_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor) -> None:
    """k_cache/v_cache [num_slots, H_kv, d]; slots int [T]; k, v [T, H_kv, d] (cast to the cache
    dtype). Each token's H_kv*d row must be contiguous in the cache (it is, for [S, H_kv, d])."""
    t = slots.numel()
    if t == 0:
        return
    if k.shape != v.shape or k.shape[0] != t or k.shape[1:] != k_cache.shape[1:]:
        raise ValueError(
            f"store_kv: k/v {tuple(k.shape)} do not match slots [{t}] and cache {tuple(k_cache.shape)}"
        )
    if k.dtype != k_cache.dtype:
        k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)
    k = k.reshape(t, -1)
    v = v.reshape(t, -1)
    if k.stride(1) != 1:
        k = k.contiguous()
    if v.stride(1) != 1:
        v = v.contiguous()
    hd = k.shape[1]
    if not (k_cache[0].is_contiguous() and v_cache[0].is_contiguous()):
        raise ValueError("store_kv: a slot's [H_kv, d] row must be contiguous")
    block = min(1024, triton.next_power_of_2(hd))
    _store_kernel[(t,)](k_cache, v_cache, slots, k, v, k_cache.stride(0), v_cache.stride(0), k.stride(0),
                        v.stride(0), HD=hd, BLOCK=block)
