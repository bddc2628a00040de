"""Weights: where each Hugging Face tensor lands in this rank's fused, sharded parameters, and
two sources to read them from: seeded random values (`load_format=dummy`) or a safetensors
checkpoint.

Both sources go through one plan (`weight_plan`): every logical HF tensor is read as this
rank's slice only (`safe_open(...).get_slice` reads just those bytes), one tensor at a time,
and copied into its place in the fused parameter (q/k/v -> qkv_proj, gate/up -> gate_up_proj).
No rank ever materialises the full model, nor a full tensor it only holds a shard of.

Dummy weights are a pure function of (seed, HF tensor name, global element index): a counter
hash, not a stateful RNG. So a rank's shard is generated directly, TP=1 and TP=N hold the
same logical model, and CPU and GPU produce bit-identical values (integer hashing plus exact
float ops), which lets GPU runs be checked against a CPU reference.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import torch

from granikv.dist import TPGroup
from granikv.model.decoder import CausalLM
from granikv.model.layers import vocab_shard
from granikv.model.spec import ModelSpec

Init = Literal["random", "ones"]

DUMMY_STD = 0.02  # HF's initializer_range: keeps activations O(1) through every layer


@dataclass(frozen=True)
class WeightSlot:
    """One logical HF tensor and where this rank's slice of it goes.

    Along `axis` the rank reads `[src_start, src_start + size)` of the HF tensor and writes it
    to `[dst_start, dst_start + size)` of parameter `param`; other axes are copied whole.
    `axis=None` means replicated (the whole tensor, e.g. norms).
    """

    hf_name: str
    shape: tuple[int, ...]  # logical (unsharded) HF shape
    param: str
    axis: int | None = None
    src_start: int = 0
    dst_start: int = 0
    size: int = 0
    init: Init = "random"

    def src_index(self) -> tuple[slice, ...]:
        if self.axis is None:
            return tuple(slice(None) for _ in self.shape)
        return tuple(
            slice(self.src_start, self.src_start + self.size) if a == self.axis else slice(None)
            for a in range(len(self.shape))
        )


def weight_plan(spec: ModelSpec, tp: TPGroup) -> list[WeightSlot]:
    """Every HF tensor of `spec` with its destination on rank `tp.rank` (order: HF layers)."""
    h, d = spec.hidden_size, spec.head_dim
    q0, hq = tp.split(spec.num_heads, "num_heads")
    k0, hkv = tp.split(spec.num_kv_heads, "num_kv_heads")
    i0, inter = tp.split(spec.intermediate_size, "intermediate_size")
    v0, _, vrows = vocab_shard(spec.vocab_size, tp)

    def slot(name, shape, param, axis=None, src=0, dst=0, size=0, init: Init = "random") -> WeightSlot:
        return WeightSlot(name, shape, param, axis, src, dst, size, init)

    plan = [slot("model.embed_tokens.weight", (spec.vocab_size, h), "embed_tokens.weight", 0, v0, 0, vrows)]
    for n in range(spec.num_layers):
        pre, dst = f"model.layers.{n}.", f"layers.{n}."
        plan.append(slot(pre + "input_layernorm.weight", (h,), dst + "input_norm.weight", init="ones"))
        # q, k, v rows of this rank's heads, stacked into qkv_proj in that order.
        qkv_parts = [("q", spec.num_heads, q0, hq, 0), ("k", spec.num_kv_heads, k0, hkv, hq),
                     ("v", spec.num_kv_heads, k0, hkv, hq + hkv)]
        for p, heads, first, count, dst_head in qkv_parts:
            for kind in ("weight", "bias") if spec.qkv_bias else ("weight",):
                shape = (heads * d, h) if kind == "weight" else (heads * d,)
                plan.append(slot(pre + f"self_attn.{p}_proj.{kind}", shape, dst + f"attn.qkv_proj.{kind}",
                                 0, first * d, dst_head * d, count * d))
        plan.append(slot(pre + "self_attn.o_proj.weight", (h, spec.q_size), dst + "attn.o_proj.weight",
                         1, q0 * d, 0, hq * d))
        plan.append(slot(pre + "post_attention_layernorm.weight", (h,), dst + "post_attn_norm.weight",
                         init="ones"))
        for p, dst_start in (("gate", 0), ("up", inter)):
            plan.append(slot(pre + f"mlp.{p}_proj.weight", (spec.intermediate_size, h),
                             dst + "mlp.gate_up_proj.weight", 0, i0, dst_start, inter))
        plan.append(slot(pre + "mlp.down_proj.weight", (h, spec.intermediate_size),
                         dst + "mlp.down_proj.weight", 1, i0, 0, inter))
    plan.append(slot("model.norm.weight", (h,), "norm.weight", init="ones"))
    if not spec.tie_word_embeddings:
        plan.append(slot("lm_head.weight", (spec.vocab_size, h), "lm_head.weight", 0, v0, 0, vrows))
    return plan


class WeightSource(Protocol):
    """Reads a slice of a logical HF tensor (as float32 or its stored dtype) on any device."""

    def read(self, slot: WeightSlot, device: torch.device) -> torch.Tensor: ...


# ---- seeded random weights ----------------------------------------------------------------------
_M1 = 0xBF58476D1CE4E5B9 - (1 << 64)  # splitmix64 constants as signed int64
_M2 = 0x94D049BB133111EB - (1 << 64)
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
# Elements hashed per pass. On CPU small passes keep the int64 temporaries in cache (5x faster
# than large ones); on GPU large passes keep the launch count low (8B params in ~500 passes).
_CHUNK = {"cpu": 1 << 14, "cuda": 1 << 24}


def _lsr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _splitmix(x: torch.Tensor) -> torch.Tensor:
    x = x * _GOLDEN
    x = (x ^ _lsr(x, 30)) * _M1
    x = (x ^ _lsr(x, 27)) * _M2
    return x ^ _lsr(x, 31)


def _tensor_key(seed: int, name: str) -> int:
    k = zlib.crc32(f"{seed}:{name}".encode()) | (zlib.crc32(f"{name}:{seed}".encode()) << 32)
    return k - (1 << 64) if k >= 1 << 63 else k


@dataclass(frozen=True)
class DummySource:
    """Uniform(-a, a) weights with std `std`, value = hash(seed, name, flat global index).

    Norm weights are ones (as HF initialises them); biases are random like matrices so the bias
    path is exercised.
    """

    seed: int = 0
    std: float = DUMMY_STD

    def read(self, slot: WeightSlot, device: torch.device) -> torch.Tensor:
        if slot.init == "ones":
            return torch.ones(slot.shape, dtype=torch.float32, device=device)
        idx = slot.src_index()
        out_shape = tuple(len(range(*s.indices(n))) for s, n in zip(idx, slot.shape))
        rows = torch.arange(*idx[0].indices(slot.shape[0]), device=device, dtype=torch.int64)
        if len(slot.shape) == 1:
            return self._values(slot.hf_name, rows)
        cols = torch.arange(*idx[1].indices(slot.shape[1]), device=device, dtype=torch.int64)
        out = torch.empty(out_shape, dtype=torch.float32, device=device)
        step = max(1, _CHUNK.get(device.type, 1 << 20) // max(1, out_shape[1]))
        for r in range(0, out_shape[0], step):
            flat = rows[r : r + step, None] * slot.shape[1] + cols[None, :]
            out[r : r + step] = self._values(slot.hf_name, flat)
        return out

    def _values(self, name: str, flat_index: torch.Tensor) -> torch.Tensor:
        x = _splitmix(flat_index ^ _tensor_key(self.seed, name))
        u = _lsr(x, 40).float() * (2.0**-24)  # 24 random bits -> [0, 1), exact in float32
        return (2.0 * u - 1.0) * (self.std * math.sqrt(3.0))


# ---- safetensors checkpoints --------------------------------------------------------------------
class SafetensorsSource:
    """A HF checkpoint directory: `model.safetensors` or shards with `*.index.json`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        index = self.path / "model.safetensors.index.json"
        if index.is_file():
            self.file_of = {k: self.path / v for k, v in json.loads(index.read_text())["weight_map"].items()}
        else:
            from safetensors import safe_open

            self.file_of = {}
            files = sorted(self.path.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"no *.safetensors in {self.path}")
            for f in files:
                with safe_open(str(f), framework="pt") as st:
                    self.file_of.update({k: f for k in st.keys()})  # noqa: SIM118 (not a dict)
        self._open: dict[Path, object] = {}

    def missing(self, plan: Iterable[WeightSlot]) -> list[str]:
        return [s.hf_name for s in plan if s.hf_name not in self.file_of]

    def read(self, slot: WeightSlot, device: torch.device) -> torch.Tensor:
        from safetensors import safe_open

        f = self.file_of[slot.hf_name]
        if f not in self._open:
            self._open[f] = safe_open(str(f), framework="pt")
        sl = self._open[f].get_slice(slot.hf_name)
        shape = tuple(sl.get_shape())
        if shape != slot.shape:
            raise ValueError(f"{slot.hf_name}: checkpoint shape {shape} != expected {slot.shape}")
        return sl[slot.src_index()].to(device)

    def close(self) -> None:
        self._open.clear()


# ---- loading ------------------------------------------------------------------------------------
@torch.no_grad()
def load_weights(model: CausalLM, source: WeightSource) -> None:
    """Fill every parameter of `model` from `source`, one HF tensor slice at a time."""
    plan = weight_plan(model.spec, model.tp)
    if isinstance(source, SafetensorsSource):
        missing = source.missing(plan)
        if missing:
            raise KeyError(f"checkpoint {source.path} lacks {len(missing)} tensors, e.g. {missing[:5]}")
    params = dict(model.named_parameters())
    for slot in plan:
        dst = params[slot.param]
        src = source.read(slot, dst.device)
        if slot.axis is not None:
            dst = dst.narrow(slot.axis, slot.dst_start, slot.size)
        if tuple(src.shape) != tuple(dst.shape):
            raise ValueError(
                f"{slot.hf_name}: slice {tuple(src.shape)} does not fit {slot.param} {tuple(dst.shape)}"
            )
        dst.copy_(src)
    if isinstance(source, SafetensorsSource):
        source.close()


def load_model(
    spec: ModelSpec,
    tp: TPGroup | None = None,
    load_format: str = "dummy",
    path: str | Path | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    max_positions: int | None = None,
    fused_elementwise: bool | None = None,
) -> CausalLM:
    """Build this rank's `CausalLM` and load it (`dummy`: seeded; `safetensors`: from `path`).
    `fused_elementwise`: see CausalLM (None = Triton elementwise kernels on CUDA only)."""
    model = CausalLM(spec, tp, dtype=dtype, device=device, max_positions=max_positions,
                     fused_elementwise=fused_elementwise)
    if load_format == "dummy":
        source: WeightSource = DummySource(seed)
    elif load_format == "safetensors":
        if path is None:
            raise ValueError("load_format=safetensors needs a checkpoint path")
        source = SafetensorsSource(path)
    else:
        raise ValueError(f"load_format must be dummy or safetensors, got {load_format!r}")
    load_weights(model, source)
    return model.eval()
