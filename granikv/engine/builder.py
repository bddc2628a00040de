"""Builds an engine's parts from an EngineConfig: model, KV cache, storage, backend, runner
(the storage and backend of `cfg.system` as granikv.systems declares them).

KV sizing, in order of precedence: `num_slots` (tests), `kv_budget_gb` (emulate a smaller
GPU, e.g. the paper's A100-40GB), else `mem_fraction` of the device memory left after the
weights (GPU) or a small default (CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from granikv.attention.base import AttentionBackend
from granikv.attention.ops import KernelOps
from granikv.config import EngineConfig
from granikv.dist import TPGroup
from granikv.engine.runner import ModelRunner
from granikv.kernels import ExtendSplitPolicy
from granikv.memory.kv_cache import KVCache
from granikv.model.spec import ModelSpec, load_spec
from granikv.model.weights import load_model
from granikv.systems import BackendInputs, system

CPU_DEFAULT_SLOTS = 1 << 16


@dataclass
class Components:
    spec: ModelSpec
    model: object
    kv: KVCache
    storage: object
    backend: AttentionBackend
    runner: ModelRunner
    eos_ids: tuple[int, ...]


def kv_slots(cfg: EngineConfig, spec: ModelSpec, tp: TPGroup, dtype: torch.dtype, device: torch.device) -> int:
    hkv = spec.num_kv_heads // tp.world_size
    per = KVCache.bytes_per_slot(spec.num_layers, hkv, spec.head_dim, dtype)
    if cfg.num_slots is not None:
        return cfg.num_slots
    if cfg.kv_budget_gb is not None:
        return KVCache.slots_for_budget(int(cfg.kv_budget_gb * 1e9), spec.num_layers, hkv, spec.head_dim, dtype)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        reserve = 4 << 30  # activations, workspaces, CUDA graphs
        return max(2, int((free - reserve) * cfg.mem_fraction) // per)
    return CPU_DEFAULT_SLOTS


def build_components(cfg: EngineConfig, device: torch.device, dtype: torch.dtype,
                     tp: TPGroup | None = None, model=None) -> Components:
    tp = tp or TPGroup()
    spec = load_spec(cfg.model_path or cfg.model)
    max_pos = max(cfg.max_context, 16)
    if model is None:
        model = load_model(spec, tp, cfg.load_format, cfg.model_path, cfg.seed, dtype, device, max_positions=max_pos)
    model.fused_elementwise = None if cfg.fused_elementwise else False  # None: fused on CUDA only
    n_slots = kv_slots(cfg, spec, tp, dtype, device)
    hkv = spec.num_kv_heads // tp.world_size
    hq = spec.num_heads // tp.world_size
    kv = KVCache(spec.num_layers, n_slots, hkv, spec.head_dim, dtype, device)
    parts = system(cfg.system)
    storage = parts.storage(cfg, n_slots)
    # one extra all-zero row: padded batch entries read it (slot 0 only)
    slot_table = torch.zeros(cfg.max_running + 1, cfg.max_context, dtype=torch.int32, device=device)
    ops = KernelOps(cfg.kernel_impl, split_extend=cfg.extend_split_keys,
                    split_policy=ExtendSplitPolicy.named(cfg.extend_split_rule))
    backend = parts.backend(cfg, BackendInputs(kv.k, kv.v, slot_table, hq, hkv, spec.head_dim, ops, device))
    graphs = None
    if cfg.cuda_graphs and device.type == "cuda":
        from granikv.engine.graphs import DecodeGraphs

        buckets = tuple(b for b in cfg.graph_batch_sizes if b <= cfg.max_running) or (cfg.max_running,)
        graphs = DecodeGraphs(model, backend, slot_table, pad_row=cfg.max_running, buckets=buckets)
    extend_graphs = None
    if cfg.extend_graph_tokens:
        from granikv.engine.extend_graphs import ExtendGraphs

        # on CPU (or with CUDA graphs off) the same padded static steps run eagerly
        extend_graphs = ExtendGraphs(model, backend, pad_row=cfg.max_running,
                                     token_buckets=tuple(cfg.extend_graph_tokens),
                                     req_buckets=tuple(cfg.extend_graph_reqs), device=device,
                                     use_graphs=cfg.cuda_graphs)
    runner = ModelRunner(model, backend, kv, slot_table, device, spec.vocab_size, cfg.seed, graphs=graphs,
                         extend_graphs=extend_graphs)
    eos = tuple(getattr(spec, "eos_token_ids", ()) or ())
    return Components(spec, model, kv, storage, backend, runner, eos)
