"""The three systems, one object each: what a name of `EngineConfig.system` stands for.

A system is a storage policy, a decode-attention backend, and what the rest of the engine may
rely on about the two (its capabilities). `SYSTEMS` maps each name to its `System`, and the
engine's builder and scheduler ask it instead of branching on the name: a system's parts are
declared in one place, and a new system is one more entry here. Everything else (model,
scheduler, prefill kernel, sampler) is shared, so the systems' throughputs compare cleanly
(docs/design.md, "The three systems").

`granikv.config` keeps the tuple of the names (`SYSTEM_NAMES`) and does not import this module:
a config is built and validated on any host without torch, and this module imports the
attention backends. tests/test_system_registry.py holds the two equal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

import torch

from granikv.attention.base import AttentionBackend
from granikv.attention.cascade import CascadeBackend
from granikv.attention.dispatch import DispatchPolicy
from granikv.attention.granikv import GraniKVBackend
from granikv.attention.ops import KernelOps
from granikv.attention.paged import PagedBackend
from granikv.config import PREFIX_PASS_MIN_SAVED_MIB, EngineConfig
from granikv.memory.admission import AdmissionConfig
from granikv.memory.storage.base import Storage
from granikv.memory.storage.granikv import GraniKVStorage
from granikv.memory.storage.paged import PagedStorage


@dataclass(frozen=True)
class Capabilities:
    """What the engine may rely on about a system, each named for what it means, not for which
    system has it."""

    # A request's named shared prefix (`shared_prefix_len`) gets a contiguous HOT slab of its own
    # at admission, so a named prefix admitted without one fell back to the per-request pool (the
    # scheduler counts those: `hot_fallbacks`). Without it a named prefix only meets the prefix
    # cache like any other prompt, and no admission is a fallback.
    prefix_slabs: bool


@dataclass(frozen=True)
class BackendInputs:
    """What every attention backend is built over: this rank's KV cache and head counts, the
    slot table, the kernels, and the device they run on."""

    k_cache: list[torch.Tensor]
    v_cache: list[torch.Tensor]
    slot_table: torch.Tensor
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    ops: KernelOps
    device: torch.device

    @property
    def args(self) -> tuple:
        """`AttentionBackend`'s positional arguments."""
        return (self.k_cache, self.v_cache, self.slot_table, self.num_q_heads, self.num_kv_heads, self.head_dim,
                self.ops)


class StorageFactory(Protocol):
    def __call__(self, cfg: EngineConfig, num_slots: int, check: bool = False) -> Storage:
        """The storage over `num_slots` KV slots (slot 0 reserved); `check`: its pools verify every
        operation (tests)."""


class BackendFactory(Protocol):
    def __call__(self, cfg: EngineConfig, inputs: BackendInputs) -> AttentionBackend:
        """The decode-attention backend over `inputs`."""


@dataclass(frozen=True)
class System:
    """One system: how to build its storage and its attention backend from an EngineConfig, and
    its capabilities."""

    name: str
    storage: StorageFactory
    backend: BackendFactory
    capabilities: Capabilities


def _paged_storage(name: str) -> StorageFactory:
    """`paged` and `cascade` store alike (P-slot pages, page-aligned sharing); the storage keeps the
    name for its stats."""

    def make(cfg: EngineConfig, num_slots: int, check: bool = False) -> Storage:
        return PagedStorage(name, num_slots, cfg.page_size, cfg.max_running, cfg.max_context, check=check)

    return make


def _granikv_storage(cfg: EngineConfig, num_slots: int, check: bool = False) -> Storage:
    adm = AdmissionConfig(cfg.min_prefix_for_hot, cfg.promote_min_refs)
    return GraniKVStorage(num_slots, cfg.hot_fraction, cfg.max_running, cfg.max_context, adm, check=check,
                          cold_page_size=cfg.cold_page_size)


def _paged_backend(cfg: EngineConfig, inputs: BackendInputs) -> AttentionBackend:
    return PagedBackend(*inputs.args)


def _cascade_backend(cfg: EngineConfig, inputs: BackendInputs) -> AttentionBackend:
    return CascadeBackend(*inputs.args, min_prefix_len=cfg.min_prefix_for_hot)


def _granikv_backend(cfg: EngineConfig, inputs: BackendInputs) -> AttentionBackend:
    """The dispatcher's saved-bytes rule defaults to the H200 fit on CUDA and to 0 on the CPU (no
    launch overhead to amortize; the tests want the prefix passes exercised)."""
    min_saved = cfg.prefix_pass_min_saved_mib
    if min_saved is None:
        min_saved = PREFIX_PASS_MIN_SAVED_MIB if inputs.device.type == "cuda" else 0.0
    kv_bytes_per_token = 2 * inputs.num_kv_heads * inputs.head_dim * inputs.k_cache[0].element_size()
    policy = DispatchPolicy(group_size=inputs.num_q_heads // inputs.num_kv_heads, m_sat=cfg.m_sat,
                            min_prefix_len=cfg.min_prefix_for_hot, kv_bytes_per_token=kv_bytes_per_token,
                            min_saved_bytes=int(min_saved * 2**20))
    return GraniKVBackend(*inputs.args, policy=policy, cold_range_as_slab=cfg.cold_range_as_slab,
                          share_depth=cfg.share_depth, flat=cfg.flat_prefix)


SYSTEMS: Mapping[str, System] = MappingProxyType({s.name: s for s in (
    System("paged", _paged_storage("paged"), _paged_backend, Capabilities(prefix_slabs=False)),
    System("cascade", _paged_storage("cascade"), _cascade_backend, Capabilities(prefix_slabs=False)),
    System("granikv", _granikv_storage, _granikv_backend, Capabilities(prefix_slabs=True)),
)})


def system(name: str) -> System:
    """The system called `name`; ValueError naming the known systems otherwise."""
    try:
        return SYSTEMS[name]
    except KeyError:
        raise ValueError(f"unknown system {name!r}; the systems are {', '.join(SYSTEMS)}") from None


def storage_from_config(cfg: EngineConfig, num_slots: int, check: bool = False) -> Storage:
    """The storage of `cfg.system` over `num_slots` slots (from the KV budget: KVCache)."""
    return system(cfg.system).storage(cfg, num_slots, check)


def make_storage(name: str, num_slots: int, *, check: bool = False, **fields) -> Storage:
    """The storage of system `name` over `num_slots` slots, configured by EngineConfig fields
    (page_size, hot_fraction, max_running, max_context, min_prefix_for_hot, promote_min_refs,
    cold_page_size; EngineConfig's defaults for the rest): for tests and microbenchmarks that
    build a storage without an engine."""
    return system(name).storage(EngineConfig(system=name, **fields), num_slots, check)
