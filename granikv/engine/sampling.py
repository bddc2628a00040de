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
        row = logits[i].float() / p.temperature
        if p.top_k > 0:
            kth = torch.topk(row, min(p.top_k, row.numel())).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        probs = torch.softmax(row, dim=-1).cpu()
        out[i] = int(torch.multinomial(probs, 1, generator=generator))
    return out
