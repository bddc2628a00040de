"""The seeded random streams a workload is drawn from, and the prompt runs made of them.

Randomness comes from numpy's PCG64 bit generator seeded by a SeedSequence per (seed, stream,
index) -- raw 64-bit output, whose stream numpy keeps stable across versions -- so the bytes of a
workload file do not depend on the numpy or Python version. Each use has a stream label of its
own (below), so adding a draw to one never shifts another.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

# Labels of the independent random streams (one SeedSequence per (seed, label, index)).
STREAM_PROMPT = 1
STREAM_PROMPT_FIRST = 2
STREAM_SUFFIX = 3
STREAM_ARRIVAL = 4
STREAM_ROLE = 5
STREAM_ROLE_FIRST = 6
STREAM_TREE = 7
STREAM_TREE_FIRST = 8
STREAM_JITTER = 9


def raw_draws(seed: int, stream: int, index: int, n: int) -> np.ndarray:
    """n raw uint64 draws of PCG64 for (seed, stream, index); stable across numpy versions."""
    bitgen = np.random.PCG64(np.random.SeedSequence([seed, stream, index]))
    return bitgen.random_raw(n).astype(np.uint64)


def map_ids(ids: Sequence[int], vocab_size: int) -> list[int]:
    """Ids bounded by a model's vocabulary (`id % vocab_size`: the tiny CPU model has 1024 ids)."""
    return [int(x) % vocab_size for x in ids]


def system_prompts(
    lengths: Sequence[int], pool: Sequence[int], vocab_size: int, seed: int,
    streams: tuple[int, int] = (STREAM_PROMPT, STREAM_PROMPT_FIRST),
) -> list[list[int]]:
    """Deterministic system prompts: prompt j has exactly lengths[j] ids drawn from `pool`.

    Prompts are "lexically distinct" from their first token on (after the vocab mapping), so a
    radix tree never sees two classes share a partial prefix. Needs len(lengths) <= vocab_size.
    `streams` are the random streams of the ids and of first-token redraws (agents' role
    prompts use their own, so they are not copies of the common prompt's opening).
    """
    if len([n for n in lengths if n > 0]) > vocab_size:
        raise ValueError("more distinct prefixes than token ids")
    pool_arr = np.asarray(pool, dtype=np.uint64)
    prompts: list[list[int]] = []
    firsts: set[int] = set()
    for j, n in enumerate(lengths):
        if n == 0:
            prompts.append([])
            continue
        ids = map_ids(pool_arr[raw_draws(seed, streams[0], j, n) % np.uint64(len(pool_arr))], vocab_size)
        redraw = 0
        while ids[0] in firsts:
            # Keep classes apart at token 0; the redraw stream makes the choice deterministic.
            alt = raw_draws(seed, streams[1], j * 1_000_003 + redraw, 1)[0]
            ids[0] = int(pool_arr[int(alt % np.uint64(len(pool_arr)))]) % vocab_size
            redraw += 1
            if redraw > 100_000:  # pool too small for the requested k after mapping
                ids[0] = next(t for t in range(vocab_size) if t not in firsts)
        firsts.add(ids[0])
        prompts.append(ids)
    return prompts


def unit_arrivals(n: int, process: str, seed: int) -> list[float]:
    """Send times of a rate-1 process: Poisson (first at 0, Exp(1) gaps) or burst (all 0).

    Each gap is quantized to a whole microsecond (of unit time) before the running sum, which
    is then exact integer arithmetic: a last-ulp difference of log() between math libraries
    could only change a gap that sits on a rounding boundary (odds ~1e-10 per gap), never
    drift through the sum.
    """
    if process == "burst":
        return [0.0] * n
    raw = raw_draws(seed, STREAM_ARRIVAL, 0, max(n - 1, 0))
    t_us = [0]
    for x in raw.tolist():
        u = ((x >> 11) + 0.5) * 2.0**-53  # uniform in (0, 1)
        t_us.append(t_us[-1] + round(-math.log(u) * 1e6))
    return [t / 1e6 for t in t_us[:n]]
