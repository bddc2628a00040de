"""The system registry (granikv.systems): each name gives its storage, its attention backend and its
capabilities; an unknown name is a clear error; the names equal the ones EngineConfig accepts."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from granikv.attention.cascade import CascadeBackend
from granikv.attention.granikv import GraniKVBackend
from granikv.attention.ops import KernelOps
from granikv.attention.paged import PagedBackend
from granikv.config import PREFIX_PASS_MIN_SAVED_MIB, SYSTEM_NAMES, EngineConfig
from granikv.memory import GraniKVStorage, PagedStorage
from granikv.systems import SYSTEMS, BackendInputs, make_storage, storage_from_config, system

EXPECTED = {  # name: (storage class, backend class, prefix_slabs)
    "paged": (PagedStorage, PagedBackend, False),
    "cascade": (PagedStorage, CascadeBackend, False),
    "granikv": (GraniKVStorage, GraniKVBackend, True),
}


def _inputs(device: str = "cpu", hq: int = 8, hkv: int = 2, d: int = 4) -> BackendInputs:
    k = [torch.zeros(32, hkv, d, dtype=torch.bfloat16)]
    v = [torch.zeros(32, hkv, d, dtype=torch.bfloat16)]
    return BackendInputs(k, v, torch.zeros(5, 64, dtype=torch.int32), hq, hkv, d, KernelOps("torch"),
                         torch.device(device))


def test_the_registry_holds_the_names_the_config_accepts():
    assert tuple(SYSTEMS) == SYSTEM_NAMES == tuple(EXPECTED)
    for name in SYSTEM_NAMES:
        EngineConfig(system=name)  # validates


@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_name_gives_its_storage_backend_and_capabilities(name):
    storage_cls, backend_cls, prefix_slabs = EXPECTED[name]
    s = system(name)
    assert s.name == name and s is SYSTEMS[name]
    cfg = EngineConfig(system=name, page_size=8, max_running=4, max_context=64)
    st = s.storage(cfg, 401)
    assert type(st) is storage_cls and st.system == name and st.num_slots == 401
    assert st.stats()["system"] == name
    backend = s.backend(cfg, _inputs())
    assert type(backend) is backend_cls and backend.name == name
    assert backend.group_size == 4 and backend.head_dim == 4
    assert s.capabilities.prefix_slabs is prefix_slabs


def test_unknown_name_is_a_clear_error():
    with pytest.raises(ValueError, match=r"unknown system 'vllm'; the systems are paged, cascade, granikv"):
        system("vllm")
    with pytest.raises(ValueError, match="unknown system 'vllm'"):
        make_storage("vllm", 10)
    with pytest.raises(ValueError, match="system must be one of"):
        EngineConfig(system="vllm")


def test_the_registry_is_immutable():
    with pytest.raises(TypeError):
        SYSTEMS["vllm"] = SYSTEMS["paged"]  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        SYSTEMS["paged"].name = "vllm"  # type: ignore[misc]


def test_from_engine_config():
    cfg = EngineConfig(system="granikv", hot_fraction=0.3, max_running=8, max_context=128)
    st = storage_from_config(cfg, 1001)
    assert isinstance(st, GraniKVStorage) and st.hot.size == 300
    st = storage_from_config(cfg.replace(system="cascade", page_size=8), 1001)
    assert isinstance(st, PagedStorage) and st.P == 8 and st.system == "cascade"
    with pytest.raises(ValueError):
        make_storage("vllm", 10)


def test_storage_and_backend_take_their_config_fields():
    cfg = EngineConfig(system="granikv", min_prefix_for_hot=32, promote_min_refs=3, cold_page_size=4, m_sat=77,
                       cold_range_as_slab=False, share_depth=3)
    st = system("granikv").storage(cfg, 1001, check=True)
    assert st.policy.cfg.min_prefix_for_hot == 32 and st.policy.cfg.promote_min_refs == 3 and st.P == 4
    st.audit()
    b = system("granikv").backend(cfg, _inputs())
    assert b.policy.m_sat == 77 and b.policy.min_prefix_len == 32 and not b.cold_range_as_slab and b.share_depth == 3
    assert b.policy.kv_bytes_per_token == 2 * 2 * 4 * 2  # K and V, 2 heads of 4 bf16 values
    assert system("cascade").backend(cfg.replace(system="cascade"), _inputs()).min_prefix_len == 32


@pytest.mark.parametrize("device, mib, want", [("cpu", None, 0), ("cuda", None, PREFIX_PASS_MIN_SAVED_MIB),
                                               ("cpu", 1.5, 1.5), ("cuda", 0.0, 0.0)])
def test_the_saved_bytes_rule_defaults_by_device(device, mib, want):
    cfg = EngineConfig(system="granikv", prefix_pass_min_saved_mib=mib)
    b = system("granikv").backend(cfg, _inputs(device))  # building touches no device memory
    assert b.policy.min_saved_bytes == int(want * 2**20)
