"""The Llama / Qwen2 decoder over flat token batches, with attention injected by the engine.

A step's tokens (all requests, prefill chunks and decode tokens alike) arrive concatenated as
`input_ids[T]`, `positions[T]`; there is no padding dimension. Each attention layer computes
q, k, v (RoPE applied) and hands them to the injected `attn(layer_id, q, k, v)`: storing K/V
and attending over the cache is the backend's job (paged, cascade, granikv), so the three
systems share this model exactly and differ only in the function they pass in.

Tensor parallelism (Megatron layout): q/k/v and gate/up are column-parallel (each rank owns
whole heads and a slice of the intermediate size), o and down are row-parallel followed by an
all-reduce; embedding and LM head are vocab-parallel (see layers.py).

Residual stream: each layer returns its MLP output and the residual *before* that output is
added; the add happens inside the next norm (the next layer's input norm, or the final norm), which
updates the residual in place. The math is the same as `h = h + sublayer(norm(h))`, but on CUDA the
add and the norm are one launch (`fused_elementwise`), as are SiLU * up and RoPE on q and k: four
elementwise launches a layer instead of eleven. On CPU the torch path runs (HF parity).

`forward` makes no host syncs and no data-dependent shapes, so the decode step can be captured
in a CUDA graph.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from granikv.dist import TPGroup, all_reduce
from granikv.model.layers import ParallelLMHead, RMSNorm, RotaryEmbedding, VocabParallelEmbedding, _kernels, _param
from granikv.model.spec import ModelSpec


class AttentionFn(Protocol):
    """Attention over the KV cache for one layer of one step.

    q: [T, Hq_local, d], k, v: [T, Hkv_local, d] for the step's flat tokens, RoPE already
    applied to q and k. The tensors have unit stride in the last dim but may be strided views
    along tokens and heads (they are slices of one fused projection): use `.stride()` or
    `reshape`, not `view`. Returns [T, Hq_local, d] in q's dtype; the softmax scale is
    head_dim ** -0.5 and the mask causal within each request.
    """

    def __call__(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


class Attention(nn.Module):
    """Fused qkv projection (one GEMM), RoPE, injected attention, row-parallel o projection."""

    def __init__(self, spec: ModelSpec, layer_id: int, tp: TPGroup, rope: RotaryEmbedding,
                 dtype: torch.dtype, device: torch.device | str):
        super().__init__()
        self.layer_id = layer_id
        self.tp = tp
        self.rope = rope
        self.head_dim = spec.head_dim
        _, self.num_heads = tp.split(spec.num_heads, "num_heads")
        _, self.num_kv_heads = tp.split(spec.num_kv_heads, "num_kv_heads")
        qkv_rows = (self.num_heads + 2 * self.num_kv_heads) * spec.head_dim
        self.qkv_proj = nn.Module()
        self.qkv_proj.weight = _param(qkv_rows, spec.hidden_size, dtype=dtype, device=device)
        self.qkv_proj.bias = _param(qkv_rows, dtype=dtype, device=device) if spec.qkv_bias else None
        self.o_proj = nn.Module()
        o_cols = self.num_heads * spec.head_dim
        self.o_proj.weight = _param(spec.hidden_size, o_cols, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, attn: AttentionFn, fused: bool = False) -> torch.Tensor:
        t = x.shape[0]
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = F.linear(x, self.qkv_proj.weight, self.qkv_proj.bias)
        # RoPE on q and k together: one in-place launch over the projection's output (fused), or
        # one set of elementwise kernels for both (torch).
        qk = qkv[:, : (hq + hkv) * d].view(t, hq + hkv, d)
        qk = self.rope.apply_(qk, positions) if fused else self.rope(qk, positions)
        q, k = qk[:, :hq], qk[:, hq:]
        v = qkv[:, (hq + hkv) * d :].view(t, hkv, d)
        o = attn(self.layer_id, q, k, v)
        out = F.linear(o.reshape(t, hq * d), self.o_proj.weight)
        return all_reduce(self.tp, out)


class MLP(nn.Module):
    """SwiGLU with a fused gate/up projection (one GEMM) and a row-parallel down projection."""

    def __init__(self, spec: ModelSpec, tp: TPGroup, dtype: torch.dtype, device: torch.device | str):
        super().__init__()
        self.tp = tp
        _, self.inter = tp.split(spec.intermediate_size, "intermediate_size")
        self.gate_up_proj = nn.Module()
        self.gate_up_proj.weight = _param(2 * self.inter, spec.hidden_size, dtype=dtype, device=device)
        self.down_proj = nn.Module()
        self.down_proj.weight = _param(spec.hidden_size, self.inter, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor, fused: bool = False) -> torch.Tensor:
        gate_up = F.linear(x, self.gate_up_proj.weight)
        if fused:
            act = _kernels().silu_mul(gate_up)  # one launch, reads gate|up once
        else:
            act = F.silu(gate_up[:, : self.inter]) * gate_up[:, self.inter :]
        out = F.linear(act, self.down_proj.weight)
        return all_reduce(self.tp, out)


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, layer_id: int, tp: TPGroup, rope: RotaryEmbedding,
                 dtype: torch.dtype, device: torch.device | str):
        super().__init__()
        self.input_norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device)
        self.attn = Attention(spec, layer_id, tp, rope, dtype, device)
        self.post_attn_norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device)
        self.mlp = MLP(spec, tp, dtype, device)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor, attn: AttentionFn,
                fused: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous layer's MLP output, or the embeddings when `residual` is None (first
        layer). residual: the stream x is still to be added to; updated in place. Returns (this
        layer's MLP output, the residual it is to be added to) -- `h_out = residual + mlp_out`.
        """
        if residual is None:
            residual = x
            h = self.input_norm(x, fused=fused)
        else:
            h = self.input_norm(x, residual, fused=fused)  # residual += x; h = norm(residual)
        x = self.attn(h, positions, attn, fused)
        h = self.post_attn_norm(x, residual, fused=fused)  # residual += attn out
        return self.mlp(h, fused), residual


class CausalLM(nn.Module):
    """A Llama-3.x / Qwen-2.5 causal LM (this rank's shard of it).

    Build it, then fill the weights with `granikv.model.weights.load_weights` (or build and
    load in one go with `load_model`). Parameter names are our fused layout
    (`layers.N.attn.qkv_proj.weight`, ...); `weights.weight_plan` maps HF names onto them.
    """

    def __init__(
        self,
        spec: ModelSpec,
        tp: TPGroup | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        max_positions: int | None = None,
        fused_elementwise: bool | None = None,
    ):
        super().__init__()
        tp = tp or TPGroup()
        spec.check_tp(tp.world_size)
        self.spec = spec
        self.tp = tp
        self.dtype = dtype
        self.max_positions = max_positions or spec.max_position_embeddings
        # Triton kernels for norm(+residual add), SiLU*up and RoPE: None = on CUDA only (auto),
        # True = always (CPU: Triton's interpreter, for tests), False = the torch path
        self.fused_elementwise = fused_elementwise
        self.rope = RotaryEmbedding(spec, self.max_positions, dtype, device)
        self.embed_tokens = VocabParallelEmbedding(spec, tp, dtype, device)
        self.layers = nn.ModuleList(
            DecoderLayer(spec, i, tp, self.rope, dtype, device) for i in range(spec.num_layers)
        )
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device)
        tied = self.embed_tokens.weight if spec.tie_word_embeddings else None
        self.lm_head = ParallelLMHead(spec, tp, dtype, device, tied=tied)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @torch.no_grad()  # not inference_mode: callers may update the returned logits in place
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionFn,
        logits_index: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids, positions: [T] (flat step batch) -> float32 logits [N, vocab] of the rows in
        `logits_index` (e.g. each request's last token), or of all T rows when it is None."""
        x = self.embed_tokens(input_ids)
        fused = self.fused_elementwise if self.fused_elementwise is not None else x.is_cuda
        residual = None
        for layer in self.layers:
            x, residual = layer(x, residual, positions, attn, fused)
        if logits_index is not None:
            x = x.index_select(0, logits_index)
            residual = residual.index_select(0, logits_index) if residual is not None else None
        return self.lm_head(self.norm(x, residual, fused=fused))  # the last residual add is in here
