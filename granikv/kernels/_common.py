"""Helpers shared by the attention kernels: launch-time flags and the online-softmax step.

Why a shared step: every attention op here (decode, prefix passes, extend) is the same
flash-style loop, tile of keys after tile of keys, with a running max `m`, a running sum `l`
and an unnormalised accumulator. Keeping that step in one `@triton.jit` function keeps the
numerics identical across ops, which is what lets their outputs be merged by LSE.

Scores are kept in base 2 (`qk * sm_scale * log2(e)`, then `exp2`); the ops convert the
log-sum-exp they return to natural log.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


def interpreted() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def upcast_flag(t: torch.Tensor) -> bool:
    """Cast tiles to float32 after loading? Only in the interpreter, where bf16/fp16 dot and
    arithmetic are unreliable; compiled kernels keep bf16 operands for the tensor cores."""
    return interpreted() and t.dtype != torch.float32


def dot_precision(t: torch.Tensor) -> str:
    """float32 inputs get exact fp32 dots (the references are fp32); 16-bit inputs ignore it."""
    return "ieee" if t.dtype == torch.float32 else "tf32"


def stages_for(num_stages: int, t: torch.Tensor) -> int:
    """Pipeline depth: the configs are sized for 16-bit tiles; float32 tiles (GPU tests only)
    are twice as large, so they get one stage to stay inside shared memory."""
    return num_stages if t.element_size() <= 2 else 1


def next_pow2(x: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, x))))


def num_sms(device: torch.device) -> int:
    """Multiprocessor count (132 on an H200); a nominal 132 on CPU so heuristics match the GPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132


def check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, int]:
    """Validate the slot-space layout [num_slots, H_kv, d] and return (H_kv, d)."""
    if k_cache.dim() != 3 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k_cache/v_cache must both be [num_slots, H_kv, d], got {k_cache.shape}, {v_cache.shape}"
        )
    if k_cache.stride(2) != 1 or v_cache.stride(2) != 1:
        raise ValueError("the head dimension of k_cache/v_cache must be contiguous")
    d = k_cache.shape[2]
    if d & (d - 1) or d < 16:
        raise ValueError(f"head dim must be a power of two >= 16, got {d}")
    return k_cache.shape[1], d


@triton.jit
def num_splits_for(n, MIN_SPLIT_LEN: tl.constexpr, max_splits):
    """Split count of a key range of length n, decided on the device (no host sync): as many
    splits as keep each at least MIN_SPLIT_LEN keys, at most max_splits, at least 1."""
    s = (n + MIN_SPLIT_LEN - 1) // MIN_SPLIT_LEN
    s = tl.minimum(s, max_splits)
    return tl.maximum(s, 1)


@triton.jit
def online_softmax_step(q, k, v, m_i, l_i, acc, qk_scale, valid, MASKED: tl.constexpr, PREC: tl.constexpr):
    """One key tile of flash attention. q [M, D], k/v [N, D]; `valid` [M, N] or [1, N] marks keys
    a row may see (used only when MASKED). Returns the updated (m, l, acc), base-2 scores."""
    qk = tl.dot(q, tl.trans(k), input_precision=PREC)
    if MASKED:
        qk = tl.where(valid, qk, float("-inf"))
    # the scale is folded into the max and into one FMA per score (qk * scale - m), not a
    # separate multiply pass over the tile
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    # a row that has seen no valid key yet keeps m = -inf; shift by 0 so no inf - inf appears
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(qk * qk_scale - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
    return m_new, l_i, acc


@triton.jit
def finish_rows(m_i, l_i, acc):
    """Normalise the accumulator; rows that saw no key give o = 0 and a base-2 LSE of -inf."""
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    o = acc / l_safe[:, None]
    lse2 = tl.where(empty, float("-inf"), m_i + tl.log2(l_safe))
    return o, lse2
