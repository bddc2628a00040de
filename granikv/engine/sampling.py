"""Greedy and temperature sampling over a step's logits.

Sampling uses one CPU generator seeded from the engine config, so every tensor-parallel rank
(which sees identical, all-gathered logits) draws the same tokens without communication.
"""

from __future__ import annotations

import torch

from granikv.engine.request import SamplingParams


def sample(logits: torch.Tensor, params: list[SamplingParams], generator: torch.Generator) -> list[int]:
    greedy = logits.argmax(dim=-1)
    if all(p.temperature == 0 for p in params):
        return greedy.tolist()
    out = greedy.tolist()
    for i, p in enumerate(params):
        if p.temperature == 0:
            continue
        # shift by the max before dividing: a tiny temperature (1e-40) would overflow float32 to
        # inf and softmax to NaN; shifted, the max is 0 and the rest go to -inf (greedy). The
        # divisor stays a normal float32 (1e-300 would round to 0, and 0/0 is NaN)
        row = logits[i].float()
        row = (row - row.max()) / max(p.temperature, torch.finfo(torch.float32).tiny)
        if p.top_k > 0:
            kth = torch.topk(row, min(p.top_k, row.numel())).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        probs = torch.softmax(row, dim=-1).cpu()
        out[i] = int(torch.multinomial(probs, 1, generator=generator))
    return out
