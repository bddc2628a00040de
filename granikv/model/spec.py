"""ModelSpec: the shapes of a Llama-3.x / Qwen-2.5 decoder, and where they come from.

Throughput depends on shapes, not weight values, so a model is fully named by its spec: the
engine sizes its KV cache from it, the kernels take head counts and head_dim from it, and the
harness records it. Specs come from `conf/model/<name>.yaml` (the models of the paper plus tiny
CPU shapes) or from a Hugging Face `config.json` when real weights are loaded.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ARCHS: tuple[str, ...] = ("llama", "qwen2")
CONF_DIR = Path(__file__).resolve().parents[2] / "conf" / "model"

_HF_ARCH = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 RoPE frequency scaling (HF `rope_type: llama3`)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self) -> None:
        if self.factor <= 0 or self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(f"bad llama3 rope scaling {self}")


@dataclass(frozen=True)
class ModelSpec:
    """Shapes and constants of one decoder-only model (no weights, no torch)."""

    name: str
    arch: str  # "llama" | "qwen2"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    rope_scaling: RopeScaling | None = None
    qkv_bias: bool = False  # Qwen2 has a bias on q, k and v (not on o)
    tie_word_embeddings: bool = False
    hf_name: str | None = None  # the public checkpoint these shapes are taken from
    eos_token_ids: tuple[int, ...] = ()  # ids that end a generation (unless ignore_eos)

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"arch must be one of {ARCHS}, got {self.arch!r}")
        for f in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                  "num_kv_heads", "head_dim", "max_position_embeddings"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f} must be >= 1, got {getattr(self, f)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.rms_norm_eps <= 0 or self.rope_theta <= 0:
            raise ValueError("rms_norm_eps and rope_theta must be positive")
        object.__setattr__(self, "eos_token_ids", tuple(int(t) for t in self.eos_token_ids))
        if any(not 0 <= t < self.vocab_size for t in self.eos_token_ids):
            raise ValueError(f"eos_token_ids {self.eos_token_ids} outside the vocabulary")

    # ---- derived shapes -------------------------------------------------------------------
    @property
    def group_size(self) -> int:
        """GQA group size g: query heads per KV head (4 for Llama-3.1-8B, 5 for Qwen2.5-14B/32B)."""
        return self.num_heads // self.num_kv_heads

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, dtype_bytes: int = 2, tp: int = 1) -> int:
        """Bytes of K and V one token occupies on one rank, all layers (2·L·H_kv·d·bytes / TP)."""
        return 2 * self.num_layers * (self.num_kv_heads // tp) * self.head_dim * dtype_bytes

    def num_params(self) -> int:
        """Parameter count of the logical (unsharded) model."""
        h, i = self.hidden_size, self.intermediate_size
        attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        if self.qkv_bias:
            attn += self.q_size + 2 * self.kv_size
        layer = attn + 3 * h * i + 2 * h
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * layer + emb + h

    def check_tp(self, tp: int) -> None:
        """Raise unless `tp` ranks can split this model (every rank keeps whole KV heads)."""
        if tp < 1 or self.num_kv_heads % tp:
            raise ValueError(
                f"{self.name}: TP={tp} must divide num_kv_heads={self.num_kv_heads} "
                "(KV-head replication is not supported)"
            )
        if self.intermediate_size % tp:
            raise ValueError(f"{self.name}: TP={tp} must divide intermediate_size={self.intermediate_size}")

    # ---- conversions ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_hf_config(self) -> dict[str, Any]:
        """A `config.json` dict for transformers' LlamaConfig / Qwen2Config (legacy rope keys,
        which every transformers version from 4.45 on reads)."""
        cfg: dict[str, Any] = {
            "architectures": ["LlamaForCausalLM" if self.arch == "llama" else "Qwen2ForCausalLM"],
            "model_type": self.arch,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
        }
        if self.rope_scaling is not None:
            cfg["rope_scaling"] = {"rope_type": "llama3", **dataclasses.asdict(self.rope_scaling)}
        if self.arch == "llama":
            cfg["attention_bias"] = False
            cfg["mlp_bias"] = False
        else:
            cfg["use_sliding_window"] = False
        if self.hf_name:
            cfg["_name_or_path"] = self.hf_name
        # explicit null: transformers' config classes would otherwise fill in their default id
        cfg["eos_token_id"] = list(self.eos_token_ids) or None
        return cfg

    # ---- loaders --------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: dict[str, Any], name: str | None = None) -> ModelSpec:
        d = dict(d)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown ModelSpec keys {unknown}; known: {sorted(known)}")
        if name is not None and "name" not in d:
            d["name"] = name
        rs = d.get("rope_scaling")
        if isinstance(rs, dict):
            d["rope_scaling"] = RopeScaling(**rs)
        return cls(**d)

    @classmethod
    def from_yaml(cls, path: str | Path) -> ModelSpec:
        path = Path(path)
        with path.open() as f:
            d = yaml.safe_load(f)
        if not isinstance(d, dict):
            raise ValueError(f"{path}: expected a mapping of ModelSpec fields")
        return cls.from_dict(d, name=path.stem)

    @classmethod
    def from_hf_config(cls, src: str | Path | dict[str, Any]) -> ModelSpec:
        """From a HF `config.json` (a dict, the file, or the checkpoint directory holding it).

        Reads both the legacy keys (`rope_theta`, `rope_scaling`) and transformers 5's
        `rope_parameters`. Features the decoder does not implement (sliding window, biases
        outside q/k/v, other RoPE types) raise rather than load silently wrong.
        """
        name = None
        if not isinstance(src, dict):
            p = Path(src)
            if p.is_dir():
                name, p = p.name, p / "config.json"
            with p.open() as f:
                src = json.load(f)
            name = name or p.parent.name
        c = src
        arch = c.get("model_type") or _HF_ARCH.get((c.get("architectures") or [None])[0])
        if arch not in ARCHS:
            raise ValueError(f"unsupported model_type {arch!r} (supported: {ARCHS})")
        if c.get("hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported hidden_act {c['hidden_act']!r}")
        if arch == "llama" and (c.get("attention_bias") or c.get("mlp_bias")):
            raise ValueError("llama attention_bias/mlp_bias checkpoints are not supported")
        if arch == "qwen2" and c.get("use_sliding_window"):
            raise ValueError("qwen2 sliding-window attention is not supported")

        rope = c.get("rope_parameters") or {}
        if "layer_types" in rope or any(isinstance(v, dict) for v in rope.values()):
            raise ValueError("per-layer rope parameters are not supported")
        theta = c.get("rope_theta", rope.get("rope_theta", 10000.0))
        scaling = c.get("rope_scaling") or rope
        rope_type = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
        if rope_type == "llama3":
            rope_scaling = RopeScaling(
                factor=float(scaling["factor"]),
                low_freq_factor=float(scaling["low_freq_factor"]),
                high_freq_factor=float(scaling["high_freq_factor"]),
                original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
            )
        elif rope_type == "default":
            rope_scaling = None
        else:
            raise ValueError(f"unsupported rope type {rope_type!r} (supported: default, llama3)")

        heads = int(c["num_attention_heads"])
        eos = c.get("eos_token_id")
        return cls(
            name=name or c.get("_name_or_path") or arch,
            arch=arch,
            vocab_size=int(c["vocab_size"]),
            hidden_size=int(c["hidden_size"]),
            intermediate_size=int(c["intermediate_size"]),
            num_layers=int(c["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(c.get("num_key_value_heads") or heads),
            head_dim=int(c.get("head_dim") or c["hidden_size"] // heads),
            rope_theta=float(theta),
            rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(c.get("max_position_embeddings", 2048)),
            rope_scaling=rope_scaling,
            qkv_bias=arch == "qwen2",
            tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
            hf_name=c.get("_name_or_path") or None,
            eos_token_ids=() if eos is None else tuple(eos) if isinstance(eos, list) else (eos,),
        )


def known_model_names(conf_dir: Path = CONF_DIR) -> list[str]:
    """Names that `load_spec` resolves from the conf tree."""
    return sorted(p.stem for p in conf_dir.glob("*.yaml"))


def load_spec(name_or_path: str | Path, conf_dir: Path = CONF_DIR) -> ModelSpec:
    """Resolve a model name (`conf/model/<name>.yaml`), a yaml file, or a HF checkpoint dir."""
    p = Path(name_or_path)
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise FileNotFoundError(f"{p} is a directory without config.json")
        return ModelSpec.from_hf_config(p)
    if p.suffix in (".yaml", ".yml") and p.is_file():
        return ModelSpec.from_yaml(p)
    if p.name == "config.json" and p.is_file():
        return ModelSpec.from_hf_config(p)
    candidate = conf_dir / f"{name_or_path}.yaml"
    if candidate.is_file():
        return ModelSpec.from_yaml(candidate)
    raise ValueError(
        f"unknown model {str(name_or_path)!r}: not a directory with config.json and not one of "
        f"{known_model_names(conf_dir)} (in {conf_dir})"
    )
