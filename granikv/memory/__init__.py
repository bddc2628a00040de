"""KV storage: the slot space, its pools, the prefix cache and the per-system storage policies
(`storage/`; `granikv.systems` says which policy each system uses)."""

from granikv.memory.admission import AdmissionConfig, HotAdmission, PromotionPlan
from granikv.memory.cold import ColdPool
from granikv.memory.hot import HotPool, Slab
from granikv.memory.kv_cache import RESERVED_SLOT, KVCache
from granikv.memory.paged import PagedPool
from granikv.memory.radix import Match, Node, RadixCache, Segment
from granikv.memory.storage.base import Admission, PrefixInfo, Storage
from granikv.memory.storage.granikv import GraniKVStorage
from granikv.memory.storage.paged import PagedStorage

__all__ = [
    "RESERVED_SLOT", "Admission", "AdmissionConfig", "ColdPool", "GraniKVStorage", "HotAdmission",
    "HotPool", "KVCache", "Match", "Node", "PagedPool", "PagedStorage", "PrefixInfo", "PromotionPlan",
    "RadixCache", "Segment", "Slab", "Storage",
]
