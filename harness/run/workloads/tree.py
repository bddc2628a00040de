"""The `tree` kind: a prefix tree of seeded runs, request i on the root-to-leaf path of leaf i mod k.

Why a module of its own: the tree's geometry (how long each node is, which nodes a leaf's path
crosses) is what WorkloadConfig's prefix lengths, the workload file and the K/V floor of a tree
step (harness.microbench.tree_floor) all read, and it is the only kind whose prefixes nest more
than one level deep.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from harness.run.workloads.requests import Built, WorkloadRequest
from harness.run.workloads.streams import (
    STREAM_JITTER,
    STREAM_TREE,
    STREAM_TREE_FIRST,
    raw_draws,
    system_prompts,
    unit_arrivals,
)


class TreeSpec(Protocol):
    """What this module reads of a WorkloadConfig of kind tree. A protocol, not the class:
    WorkloadConfig.prefix_lengths needs the tree's geometry from here, so this module cannot
    import it."""

    @property
    def levels(self) -> tuple[tuple[int, int], ...]: ...
    @property
    def jitter(self) -> float: ...
    @property
    def seed(self) -> int: ...
    @property
    def k(self) -> int: ...
    @property
    def num_requests(self) -> int: ...
    @property
    def arrival(self) -> str: ...
    @property
    def output_len(self) -> int: ...


def tree_node_lengths(cfg: TreeSpec) -> tuple[tuple[int, ...], ...]:
    """The length of every node of a tree workload, level by level (root level first).

    Level l has prod(fanouts[:l+1]) nodes; node j of level l is child j mod fanout_l of node
    j // fanout_l of level l - 1. With jitter > 0, each node of a level with fanout > 1 (a node
    with siblings) gets max(1, round(length * (1 + jitter * u))), u uniform in (-1, 1) from its
    own seeded draw, so siblings differ in length; a level of fanout 1 keeps its length exactly.
    """
    out: list[tuple[int, ...]] = []
    n = 1
    for depth, (fanout, length) in enumerate(cfg.levels):
        n *= fanout
        if fanout == 1 or cfg.jitter == 0.0:
            out.append((length,) * n)
            continue
        units = [((x >> 11) + 0.5) * 2.0**-53 for x in raw_draws(cfg.seed, STREAM_JITTER, depth, n).tolist()]
        out.append(tuple(max(1, round(length * (1.0 + cfg.jitter * (2.0 * u - 1.0)))) for u in units))
    return tuple(out)


def tree_path(levels: Sequence[tuple[int, int]], leaf: int) -> list[int]:
    """Node indices (one per level, root level first) on the path from the root to `leaf`."""
    path = [leaf]
    for fanout, _ in reversed(levels[1:]):
        path.append(path[-1] // fanout)
    return path[::-1]


def tree_paths(node_lengths: Sequence[Sequence[int]]) -> list[list[int]]:
    """Per leaf, the lengths of the nodes on its root-to-leaf path (fanouts read off the level sizes)."""
    sizes = [len(level) for level in node_lengths]
    levels = [(sizes[0], 0)] + [(sizes[d] // sizes[d - 1], 0) for d in range(1, len(sizes))]
    return [[node_lengths[d][j] for d, j in enumerate(tree_path(levels, leaf))] for leaf in range(sizes[-1])]


def tree_requests(cfg: TreeSpec, pool: Sequence[int], vocab: int, suffixes: list[list[int]],
                  sources: list[str]) -> Built:
    """Request i: the root-to-leaf path of leaf i mod k (node runs concatenated), then its suffix.

    Every node's run is distinct from every other node's from its first token on, so two leaves'
    prompts share exactly their common path: the radix tree branches at node boundaries.
    """
    node_lengths = tree_node_lengths(cfg)
    flat = [n for level in node_lengths for n in level]
    runs = system_prompts(flat, pool, vocab, cfg.seed, streams=(STREAM_TREE, STREAM_TREE_FIRST))
    offsets = [sum(len(level) for level in node_lengths[:d]) for d in range(len(node_lengths))]
    t_unit = unit_arrivals(cfg.num_requests, cfg.arrival, cfg.seed)
    width = len(str(cfg.num_requests - 1))
    requests = []
    for i in range(cfg.num_requests):
        path = tree_path(cfg.levels, i % cfg.k)
        prefix: list[int] = []
        bounds: list[int] = []
        for d, j in enumerate(path):
            prefix += runs[offsets[d] + j]
            bounds.append(len(prefix))
        requests.append(WorkloadRequest(
            id=f"tree-{i:0{width}d}", input_ids=prefix + suffixes[i],
            prefix_id="t" + ".".join(str(j % cfg.levels[d][0]) for d, j in enumerate(path)),
            shared_prefix_len=len(prefix), output_len=cfg.output_len,
            arrival={"process": cfg.arrival, "t_unit": t_unit[i]}, source=sources[i], prefix_levels=bounds,
        ))
    return requests, {"tree_node_lengths": [list(level) for level in node_lengths]}
