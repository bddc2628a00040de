"""Temperature sampling: never NaN whatever finite temperature a client sends, and the
parameters that would make it NaN are refused where they are made."""

from __future__ import annotations

import math

import pytest
import torch

from granikv.engine.request import SamplingParams
from granikv.engine.sampling import sample


@pytest.mark.parametrize("temperature", [1e-40, 1e-300, 5e-324])
def test_a_tiny_temperature_is_greedy_not_nan(temperature):
    """logits / 1e-40 overflows float32 to inf (softmax: NaN, multinomial raised and took the
    engine down); shifted by the max first it is the argmax."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 1000, generator=g) * 4
    params = [SamplingParams(temperature=temperature), SamplingParams(temperature=temperature, top_k=5),
              SamplingParams(temperature=0.0)]
    assert sample(logits, params, g) == logits.argmax(dim=-1).tolist()


def test_ordinary_temperatures_still_sample():
    g = torch.Generator().manual_seed(1)
    logits = torch.zeros(1, 50)  # uniform: 200 draws at T=1 hit many tokens
    draws = {sample(logits, [SamplingParams(temperature=1.0)], g)[0] for _ in range(200)}
    assert len(draws) > 30
    top = {sample(torch.arange(50.0)[None], [SamplingParams(temperature=100.0, top_k=3)], g)[0] for _ in range(100)}
    assert top == {47, 48, 49}


@pytest.mark.parametrize("temperature", [math.nan, math.inf, -1.0])
def test_non_finite_or_negative_temperature_is_refused(temperature):
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=temperature)
