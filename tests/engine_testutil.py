"""Shared helpers for the engine tests: a tiny float32 engine per system, multi-prefix prompts."""

from __future__ import annotations

import random

from granikv.config import EngineConfig


def tiny_config(system: str, **kw) -> EngineConfig:
    base = dict(model="tiny", system=system, device="cpu", dtype="float32", num_slots=4096,
                max_running=16, max_context=512, chunked_prefill_tokens=256, min_prefix_for_hot=16,
                m_sat=12, hot_fraction=0.3, cuda_graphs=False)
    base.update(kw)
    return EngineConfig(**base)


def multi_prefix_prompts(seed: int = 0, prefix_lens=(40, 70, 23), per_prefix=(3, 2, 4),
                         vocab: int = 1024) -> list[tuple[list[int], int]]:
    """k = len(prefix_lens) shared prefixes of different lengths; suffixes of different lengths."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(vocab) for _ in range(n)] for n in prefix_lens]
    out = []
    for p, n in zip(prefixes, per_prefix):
        for _ in range(n):
            suffix = [rng.randrange(vocab) for _ in range(rng.randrange(1, 19))]
            out.append((p + suffix, len(p)))
    rng.shuffle(out)
    return out
