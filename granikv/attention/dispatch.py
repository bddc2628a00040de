"""The per-step dispatcher (paper §3.6): which prefix pass each prefix class gets.

M_eff = n_class * g is the M dimension of the prefix contraction for one KV head. When it
reaches M_sat (fitted per GPU by harness/microbench, stored in conf/hardware/<gpu>.yaml) the
dense, fat-contraction pass saturates the tensor cores and wins; below it the cascade pass
(prefix streamed once in tiles) wins. A class that is too small or whose prefix is too short
for any prefix pass to pay for its launch and merge goes to the plain path (its requests read
the prefix through the slot table like every other token), so granikv never does worse than
the paged baseline by more than noise.

"Pays for" is measured, not assumed. A prefix pass kind adds fixed launches per layer (the
zero-filled partial output, the pass and the LSE merge) whatever the number of classes the launch
covers (the kernel sweep fits it as the intercept b, docs/generated/prefix-rule.md); what it
saves is the classes' other n-1 requests re-reading their prefixes, partly served from L2 in the
paged path when a prefix is short. So the rule is per launch: the classes of one pass kind take it together when the K/V
re-reads they avoid per layer, summed over the classes (sum of (n-1) * Lp * bytes_per_token),
reach `min_saved_bytes`; otherwise every class of that kind reads on the plain path. For one
class alone that is (n-1) * Lp * bytes_per_token >= min_saved_bytes, which the served Table 9
cells at B=8/32 bracket (docs/performance.md, "prefix_pass_min_saved_mib": lost at 62 MiB, won
at 224 MiB); many small classes (multiprefix k=64: ~64 classes of ~4 requests, each avoiding
96 MiB) pay as one launch, which the kernel sweep measures (harness/microbench/prefix_rule.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from granikv.attention.plan import CASCADE, DENSE, EXT, ROWS, is_ext

PLAIN = "plain"  # the request reads its prefix through the slot table like any token


@dataclass(frozen=True)
class DispatchPolicy:
    group_size: int  # g = query heads per KV head
    m_sat: int = 1024
    min_prefix_len: int = 256  # shorter shared prefixes are read on the plain path
    min_class_size: int = 2  # a prefix pass for a lone request buys nothing
    # K/V bytes of one token in one layer on this rank (H_kv_local * d * 2 * element size), and the
    # prefix re-reads per layer a pass must avoid to pay for its launches; 0 = any class pays
    kv_bytes_per_token: int = 0
    min_saved_bytes: int = 0

    def saved_bytes(self, class_size: int, prefix_len: int) -> int:
        """Prefix K/V reads per layer that reading one class once saves over the plain path."""
        return max(class_size - 1, 0) * prefix_len * self.kv_bytes_per_token

    def kind(self, class_size: int, prefix_len: int) -> str:
        """The pass a class takes if its launch pays (`pays`): PLAIN for a lone request or a
        prefix too short to form a class, else dense or cascade by M_eff against m_sat."""
        if prefix_len < self.min_prefix_len or class_size < self.min_class_size:
            return PLAIN
        return DENSE if class_size * self.group_size >= self.m_sat else CASCADE

    def pays(self, classes: Iterable[tuple[int, int]]) -> bool:
        """Whether one launch of a pass over these (class size, prefix length) classes avoids at
        least `min_saved_bytes` of K/V re-reads per layer, summed over the classes."""
        if not self.min_saved_bytes:
            return True
        return sum(self.saved_bytes(n, length) for n, length in classes) >= self.min_saved_bytes

    def choose(self, class_size: int, prefix_len: int) -> str:
        """A class alone in its launch: its kind if it pays by itself, else PLAIN."""
        kind = self.kind(class_size, prefix_len)
        return kind if kind == PLAIN or self.pays([(class_size, prefix_len)]) else PLAIN


@dataclass
class DispatchCounters:
    """Per-engine counters reported in /server_info and the result files."""

    decode_steps: int = 0
    dense_steps: int = 0  # steps with at least one dense class
    cascade_steps: int = 0  # steps with at least one cascade class
    rows_steps: int = 0  # steps with at least one COLD class read through a slot-table row
    ext_steps: int = 0  # steps with at least one extension class (nested sharing, after a head class)
    deep_ext_steps: int = 0  # steps with a class at extension level 2 or deeper (EngineConfig.share_depth >= 3)
    paged_steps: int = 0  # steps where every request took the plain path
    flat_steps: int = 0  # steps whose classes at two levels or more ran as one flattened launch
    contiguous_cold: int = 0  # COLD head classes whose run was one slot range, read by a slab-form pass
    class_decisions: dict = field(default_factory=lambda: {DENSE: 0, CASCADE: 0, ROWS: 0, EXT: 0, PLAIN: 0})
    # per decision, class size -> class-steps: a prefix pass's work is whole M tiles per class
    # (ceil(n * g / BLOCK_M) reads of the prefix), so two runs of one workload whose batches split
    # into classes differently (64+64+64+64 against 70+62+60+64) differ in prefix reads at equal
    # token counts; this is what tells such runs apart in a result file
    class_sizes: dict = field(default_factory=lambda: {DENSE: {}, CASCADE: {}, ROWS: {}, EXT: {}, PLAIN: {}})

    def record(self, decisions: list[str], sizes: list[int] | None = None) -> None:
        self.decode_steps += 1
        kinds = set(decisions)
        if DENSE in kinds:
            self.dense_steps += 1
        if CASCADE in kinds:
            self.cascade_steps += 1
        if ROWS in kinds:
            self.rows_steps += 1
        if any(is_ext(k) for k in kinds):
            self.ext_steps += 1
        if any(is_ext(k) and k != EXT for k in kinds):
            self.deep_ext_steps += 1
        if not kinds - {PLAIN}:
            self.paged_steps += 1
        for d in decisions:  # ext2, ext3, ...: keys of their own, from a step that has them on
            self.class_decisions[d] = self.class_decisions.get(d, 0) + 1
        for d, n in zip(decisions, sizes or (), strict=False):
            hist = self.class_sizes.setdefault(d, {})
            hist[n] = hist.get(n, 0) + 1

    def as_dict(self) -> dict:
        return {
            "decode_steps": self.decode_steps,
            "dense_steps": self.dense_steps,
            "cascade_steps": self.cascade_steps,
            "rows_steps": self.rows_steps,
            "ext_steps": self.ext_steps,
            **({"deep_ext_steps": self.deep_ext_steps} if self.deep_ext_steps else {}),
            **({"flat_steps": self.flat_steps} if self.flat_steps else {}),
            "paged_steps": self.paged_steps,
            "contiguous_cold": self.contiguous_cold,
            "class_decisions": dict(self.class_decisions),
            "class_sizes": {d: {str(n): c for n, c in sorted(h.items())} for d, h in self.class_sizes.items()},
        }
