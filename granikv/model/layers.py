"""Building blocks of the decoder: RMSNorm, RoPE (with Llama-3 scaling), and the vocab-parallel
embedding and LM head.

Numerics follow Hugging Face transformers (RMSNorm statistics in float32; RoPE tables computed
in float32 then cast to the activation dtype), so a float32 model reproduces
`LlamaForCausalLM` / `Qwen2ForCausalLM` logits to rounding. Where fewer kernels are possible
with the same math (fused RMSNorm, one table gather and in-place multiply-adds for RoPE) we
take them: in a decode step of 256 tokens every elementwise launch costs about as much as the
work it does. With `fused=True` (the model's choice on CUDA) RMSNorm takes the residual add
into its launch and RoPE is one in-place Triton kernel (granikv.kernels.norm / .rope); the torch
path stays for CPU and as the reference.

Parameters are allocated zero-filled on their final device and dtype; `weights.py` fills them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from granikv.dist import TPGroup, all_gather, all_reduce
from granikv.model.spec import ModelSpec, RopeScaling


def _param(*shape: int, dtype: torch.dtype, device: torch.device | str) -> nn.Parameter:
    return nn.Parameter(torch.zeros(shape, dtype=dtype, device=device), requires_grad=False)


def _kernels():
    """granikv.kernels, imported on first use: Triton is needed only by the fused path, so the
    model stays importable (torch path) on hosts without it."""
    from granikv import kernels

    return kernels


class RMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * weight via `F.rms_norm`: one fused kernel on CUDA (computed in
    float32, rounded once), the same float32 math as transformers on CPU.

    With `residual`, the residual add that precedes the norm is done here: `residual += x` in
    place (rounded to its dtype, as `h + x` is), and the norm of the sum is returned. `fused`
    runs both in one Triton launch (`add_rms_norm_`) instead of an add and `F.rms_norm`.
    """

    def __init__(self, size: int, eps: float, dtype: torch.dtype, device: torch.device | str) -> None:
        super().__init__()
        self.eps = eps
        self.weight = _param(size, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, fused: bool = False) -> torch.Tensor:
        if fused:
            k = _kernels()
            if residual is None:
                return k.rms_norm(x, self.weight, self.eps)
            return k.add_rms_norm_(x, residual, self.weight, self.eps)
        if residual is not None:
            x = residual.add_(x)
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """Inverse RoPE frequencies [head_dim/2] (float32, CPU).

    With `scaling`, the Llama-3.1 rule, as transformers' `_compute_llama3_parameters`:
    wavelengths shorter than original_ctx/high_freq_factor are kept, longer than
    original_ctx/low_freq_factor are divided by `factor`, and the band between is interpolated.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None:
        return inv_freq
    old_ctx = scaling.original_max_position_embeddings
    low_freq_wavelen = old_ctx / scaling.low_freq_factor
    high_freq_wavelen = old_ctx / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    band = scaling.high_freq_factor - scaling.low_freq_factor
    smooth = (old_ctx / wavelen - scaling.low_freq_factor) / band
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """Rotate-half RoPE (the HF checkpoint layout) from cos/sin tables indexed by position.

    The tables cover `max_positions` positions and live on the device, so applying RoPE is a
    gather plus elementwise ops: no host sync, CUDA-graph safe.
    """

    def __init__(self, spec: ModelSpec, max_positions: int, dtype: torch.dtype, device: torch.device | str):
        super().__init__()
        inv_freq = rope_inv_freq(spec.head_dim, spec.rope_theta, spec.rope_scaling)
        t = torch.arange(max_positions, dtype=torch.int64).float()
        freqs = t[:, None] * inv_freq[None, :]  # [P, d/2], float32 as in HF
        table = torch.cat((freqs.cos(), freqs.sin()), dim=-1)  # [P, d]: cos | sin
        self.register_buffer("cos_sin", table.to(dtype=dtype, device=device), persistent=False)

    def apply_(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: [T, H, d] (any token/head stride, unit last stride) rotated in place by one Triton
        launch (granikv.kernels.rope_); returns x."""
        return _kernels().rope_(x, positions, self.cos_sin)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: [T, H, d] (any token stride) -> rotated copy [T, H, d] (contiguous)."""
        half = x.shape[-1] // 2
        cs = self.cos_sin.index_select(0, positions).unsqueeze(1)  # [T, 1, d]
        cos, sin = cs[..., :half], cs[..., half:]
        x1, x2 = x[..., :half], x[..., half:]
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        o1, o2 = out[..., :half], out[..., half:]
        torch.mul(x1, cos, out=o1).addcmul_(x2, sin, value=-1)  # x1 cos - x2 sin
        torch.mul(x2, cos, out=o2).addcmul_(x1, sin)  # x2 cos + x1 sin
        return out


def vocab_shard(vocab_size: int, tp: TPGroup) -> tuple[int, int, int]:
    """(start, rows held, rows read) of this rank's vocab shard.

    Every rank holds ceil(V/TP) rows so the gathered logits have a uniform layout; rows past V
    on the last rank are zero padding, read from no checkpoint, and cut off after the gather.
    """
    per_rank = -(-vocab_size // tp.world_size)
    start = tp.rank * per_rank
    return start, per_rank, max(0, min(per_rank, vocab_size - start))


class VocabParallelEmbedding(nn.Module):
    """Token embedding split by vocabulary rows: each rank looks up the ids it owns, zeros the
    rest, and an all-reduce assembles the rows (one [T, hidden] sum, no gather of the table)."""

    def __init__(self, spec: ModelSpec, tp: TPGroup, dtype: torch.dtype, device: torch.device | str):
        super().__init__()
        self.tp = tp
        self.start, rows, _ = vocab_shard(spec.vocab_size, tp)
        self.end = self.start + rows
        self.weight = _param(rows, spec.hidden_size, dtype=dtype, device=device)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.world_size == 1:
            return F.embedding(ids, self.weight)
        mine = (ids >= self.start) & (ids < self.end)
        out = F.embedding(torch.where(mine, ids - self.start, 0), self.weight)
        out = out * mine.unsqueeze(-1).to(out.dtype)
        return all_reduce(self.tp, out)


class ParallelLMHead(nn.Module):
    """LM head split by vocabulary rows (the same split as the embedding, so tied weights are
    literally the same tensor); the per-rank logits of the selected rows are all-gathered.

    Vocab-parallel rather than replicated: a replicated head costs every rank the full
    V x hidden weight (1.5 GB in bf16 for Qwen2.5-32B) and the full GEMM, while the gather moves
    only N x V logits for the N sampled rows.
    """

    def __init__(
        self,
        spec: ModelSpec,
        tp: TPGroup,
        dtype: torch.dtype,
        device: torch.device | str,
        tied: nn.Parameter | None = None,
    ):
        super().__init__()
        self.tp = tp
        self.vocab_size = spec.vocab_size
        if tied is not None:
            self.weight = tied
        else:
            _, rows, _ = vocab_shard(spec.vocab_size, tp)
            self.weight = _param(rows, spec.hidden_size, dtype=dtype, device=device)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h: [N, hidden] -> float32 logits [N, vocab]."""
        logits = F.linear(h, self.weight)
        if self.tp.world_size > 1:
            logits = all_gather(self.tp, logits, dim=-1)
        return logits[:, : self.vocab_size].float()
