"""The K/V floor of a decode step over a tree of shared prompt runs, for each depth of sharing.

A `tree` workload (harness.run.workloads) gives every request the root-to-leaf path of leaf i mod
n_leaves, then its own tokens. One decode step must read each request's own tokens once per
request; a shared run (a node with two or more live readers) need be read only once per step if
the attention kernels read it once for all its readers, and its FLOPs (4 · readers · heads ·
head_dim · length per layer) still grow with the readers. How many levels a system reads once
decides its floor:

- `paged` reads every request's whole context (depth 0);
- `cascade` reads the batch-wide common prefix once (the root level, when every request reads it);
- a two-level engine reads the first two levels once (a head and one `ext` class per request);
- sharing at any depth reads every shared node once.

Each floor is own-token bytes / HBM read bandwidth + max(shared bytes / bandwidth, shared
FLOPs / bf16 peak), the same form as harness.microbench.engine_steps's single-prefix floor, so a
tree cell's step is judged against the floor of the sharing it could have had.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

ANY_DEPTH = None  # shared_depth value: every level


@dataclass(frozen=True)
class TreeNode:
    """One shared run: its level (0 = root), its length in tokens and its live readers."""

    level: int
    length: int
    readers: int


def tree_nodes(levels: Sequence[tuple[int, int]], requests: int) -> list[TreeNode]:
    """The nodes of a tree of `levels` ((fanout, length) per level, root level first) read by
    `requests` requests assigned round-robin over the leaves (request i reads leaf i mod leaves):
    a node's readers are the requests whose leaf lies under it."""
    if requests < 0:
        raise ValueError(f"requests must be >= 0, got {requests}")
    if not levels or any(f < 1 or n < 0 for f, n in levels):
        raise ValueError(f"levels need fanout >= 1 and length >= 0 each, got {list(levels)}")
    leaves = math.prod(f for f, _ in levels)
    per_leaf = [requests // leaves + (1 if j < requests % leaves else 0) for j in range(leaves)]
    out: list[TreeNode] = []
    below = leaves  # leaves under one node of the current level
    count = 1
    for level, (fanout, length) in enumerate(levels):
        count *= fanout
        below //= fanout
        for node in range(count):
            out.append(TreeNode(level, length, sum(per_leaf[node * below:(node + 1) * below])))
    return out


def system_depth(system: str) -> int | None:
    """The levels a system reads once per step: paged none, cascade the root, granikv any depth."""
    return {"paged": 0, "cascade": 1, "granikv": ANY_DEPTH}[system]


def tree_kv_floor_ms(nodes: Sequence[TreeNode], own_tokens: int, per_tok_bytes: int, flops_per_tok_reader: int,
                     bw: float, peak: float, shared_depth: int | None = ANY_DEPTH) -> float:
    """The K/V part of a decode step's floor, in ms.

    `own_tokens`: the requests' tokens after their tree path, summed; `per_tok_bytes`: K+V bytes
    of one token over all layers (per rank); `flops_per_tok_reader`: attention FLOPs one reader
    spends on one token over all layers; `shared_depth`: levels read once (None: any depth). A
    node deeper than `shared_depth`, or with one reader, is read per reader. The root level
    counts as shared only when every request reads it (cascade's batch-global prefix)."""
    total = sum(n.readers for n in nodes if n.level == 0)  # every request reads one root
    shared_bytes = shared_flops = per_request = 0
    for n in nodes:
        once = (n.readers >= 2 and (shared_depth is None or n.level < shared_depth)
                and not (shared_depth == 1 and n.readers < total))
        if once:
            shared_bytes += n.length * per_tok_bytes
            shared_flops += n.readers * n.length * flops_per_tok_reader
        else:
            per_request += n.readers * n.length
    own = (own_tokens + per_request) * per_tok_bytes / bw
    return (own + max(shared_bytes / bw, shared_flops / peak)) * 1e3
