"""Prefix classes from shared runs: which requests of a decode batch read one prefix together.

A request reads a shared run of slot-table positions `[0, run)` (a HOT slab's contiguous range,
or the slots of a COLD radix path other requests hold too). A class of requests reads the run
they all share once, so its length is the shortest member's run and it saves `(n - 1) * length`
prefix re-reads. Taking the k requests with the longest runs and the k that maximizes
`(k - 1) * run_k` picks that class; a request that shares one more token with another (a common
suffix token, a longer agent prompt) therefore never splits a class, and one short run never
shortens a long class. What is left forms further classes the same way
(tests/attention/test_prefix_grouping.py).
"""

from __future__ import annotations


def best_class(runs: list[tuple[int, int]], min_size: int = 2) -> tuple[list[int], int] | None:
    """(members, common length) of the class that avoids the most prefix re-reads among requests
    `(batch index, run)`; None when fewer than `min_size` requests share a non-empty run."""
    order = sorted(runs, key=lambda t: (-t[1], t[0]))
    best_k, best_len, best_saved = 0, 0, 0
    for k in range(max(min_size, 1), len(order) + 1):
        length = order[k - 1][1]
        saved = (k - 1) * length
        if saved > best_saved:
            best_k, best_len, best_saved = k, length, saved
    if best_k == 0 or best_len <= 0:
        return None
    return sorted(i for i, _ in order[:best_k]), best_len


def partition_runs(runs: list[tuple[int, int]], min_size: int = 2,
                   max_classes: int = 4) -> list[tuple[list[int], int]]:
    """Classes of requests reading one shared run, best first, at most `max_classes`; requests in
    none read their prefix on the plain path."""
    out: list[tuple[list[int], int]] = []
    rest = runs
    while len(rest) >= min_size and len(out) < max_classes:
        got = best_class(rest, min_size)
        if got is None:
            break
        out.append(got)
        taken = set(got[0])
        rest = [t for t in rest if t[0] not in taken]
    return out
