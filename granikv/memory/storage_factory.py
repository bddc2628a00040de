"""The storage policy of a system, from arguments or an EngineConfig."""

from __future__ import annotations

from typing import TYPE_CHECKING

from granikv.memory.admission import AdmissionConfig
from granikv.memory.storage import Storage
from granikv.memory.storage_granikv import GraniKVStorage
from granikv.memory.storage_paged import PagedStorage

if TYPE_CHECKING:
    from granikv.config import EngineConfig


def make_storage(system: str, num_slots: int, *, page_size: int = 16, hot_fraction: float = 0.2,
                 max_running: int = 256, max_context: int = 32768, min_prefix_for_hot: int = 256,
                 promote_min_refs: int = 2, cold_page_size: int = 1, check: bool = False) -> Storage:
    """The storage policy of `system` over `num_slots` slots (slot 0 reserved)."""
    if system in ("paged", "cascade"):
        return PagedStorage(system, num_slots, page_size, max_running, max_context, check=check)
    if system == "granikv":
        adm = AdmissionConfig(min_prefix_for_hot, promote_min_refs)
        return GraniKVStorage(num_slots, hot_fraction, max_running, max_context, adm, check=check,
                              cold_page_size=cold_page_size)
    raise ValueError(f"unknown system {system!r}")


def storage_from_config(cfg: EngineConfig, num_slots: int, check: bool = False) -> Storage:
    """`make_storage` from an EngineConfig; `num_slots` comes from the KV budget (KVCache)."""
    return make_storage(cfg.system, num_slots, page_size=cfg.page_size, hot_fraction=cfg.hot_fraction,
                        max_running=cfg.max_running, max_context=cfg.max_context,
                        min_prefix_for_hot=cfg.min_prefix_for_hot, promote_min_refs=cfg.promote_min_refs,
                        cold_page_size=cfg.cold_page_size, check=check)
