"""KV storage: the slot space, its pools, the prefix cache and the per-system storage policies."""

from granikv.memory.admission import AdmissionConfig, HotAdmission, PromotionPlan
from granikv.memory.cold import ColdPool
from granikv.memory.hot import HotPool, Slab
from granikv.memory.kv_cache import RESERVED_SLOT, KVCache
from granikv.memory.paged import PagedPool
from granikv.memory.radix import Match, Node, RadixCache, Segment
from granikv.memory.storage import Admission, PrefixInfo, Storage
from granikv.memory.storage_factory import make_storage, storage_from_config
from granikv.memory.storage_granikv import GraniKVStorage
from granikv.memory.storage_paged import PagedStorage

__all__ = [
    "RESERVED_SLOT", "Admission", "AdmissionConfig", "ColdPool", "GraniKVStorage", "HotAdmission",
    "HotPool", "KVCache", "Match", "Node", "PagedPool", "PagedStorage", "PrefixInfo", "PromotionPlan",
    "RadixCache", "Segment", "Slab", "Storage", "make_storage", "storage_from_config",
]
