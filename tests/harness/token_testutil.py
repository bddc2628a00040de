"""Token-list helpers the workload tests share (an independent oracle: plain Python, not the
engine's own prefix matching)."""

from __future__ import annotations


def lcp(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of two token lists."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
