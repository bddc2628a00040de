"""The sampling function (granikv/engine/sampling.py) on random logits: temperature never NaN,
top-k / top-p against Hugging Face's logits warpers as the float32 reference, masked tokens
never drawn, per-request generators, logprobs against log_softmax. Engine-level behaviour is
in test_sampling_engine.py."""

from __future__ import annotations

import math

import pytest
import torch

from granikv.engine.request import SamplingParams
from granikv.engine.sampling import inverse_cdf, sample


def tokens(logits, params, generator, generators=None) -> list[int]:
    gens = generators or [None] * len(params)
    return sample(logits, params, gens, generator).to_host(pinned=False).result().tokens


@pytest.mark.parametrize("temperature", [1e-40, 1e-300, 5e-324])
def test_a_tiny_temperature_is_greedy_not_nan(temperature):
    """logits / 1e-40 overflows float32 to inf (softmax: NaN, multinomial raised and took the
    engine down); shifted by the max first it is the argmax."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 1000, generator=g) * 4
    params = [SamplingParams(temperature=temperature), SamplingParams(temperature=temperature, top_k=5),
              SamplingParams(temperature=temperature, top_p=0.5), SamplingParams(temperature=0.0)]
    assert tokens(logits, params, g) == logits.argmax(dim=-1).tolist()


def test_ordinary_temperatures_still_sample():
    g = torch.Generator().manual_seed(1)
    logits = torch.zeros(1, 50)  # uniform: 200 draws at T=1 hit many tokens
    draws = {tokens(logits, [SamplingParams(temperature=1.0)], g)[0] for _ in range(200)}
    assert len(draws) > 30
    top = {tokens(torch.arange(50.0)[None], [SamplingParams(temperature=100.0, top_k=3)], g)[0] for _ in range(100)}
    assert top == {47, 48, 49}


@pytest.mark.parametrize("temperature", [math.nan, math.inf, -1.0])
def test_non_finite_or_negative_temperature_is_refused(temperature):
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=temperature)


@pytest.mark.parametrize("top_p", [0.0, -0.1, 1.5, math.nan])
def test_top_p_outside_0_1_is_refused(top_p):
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=top_p)


@pytest.mark.parametrize("logprobs", [-1, 21, True, 2.0])
def test_logprobs_outside_0_20_is_refused(logprobs):
    with pytest.raises(ValueError, match="logprobs"):
        SamplingParams(logprobs=logprobs)


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1, 1.5, True])
def test_a_seed_torch_cannot_take_is_refused(seed):
    with pytest.raises(ValueError, match="seed"):
        SamplingParams(seed=seed)


def test_only_temperature_zero_without_logprobs_is_plain():
    assert SamplingParams().plain and SamplingParams(top_k=3, top_p=0.5, seed=1).plain
    assert not SamplingParams(logprobs=0).plain and not SamplingParams(temperature=0.5).plain


def test_top_k_1_and_a_tiny_top_p_are_greedy():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(64, 1000, generator=g) * 3
    for p in (SamplingParams(temperature=1.0, top_k=1), SamplingParams(temperature=1.5, top_p=1e-6)):
        assert tokens(logits, [p] * 64, g) == logits.argmax(dim=-1).tolist()


def hf_reference(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The sampling distribution as Hugging Face transformers computes it (float32):
    temperature, then top-k, then top-p, in generate()'s warper order."""
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    x = logits.float()[None].clone()
    x = TemperatureLogitsWarper(p.temperature)(None, x)
    if p.top_k > 0:
        x = TopKLogitsWarper(p.top_k)(None, x)
    if p.top_p < 1:
        x = TopPLogitsWarper(p.top_p)(None, x)
    return torch.softmax(x, dim=-1)[0]


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.8),
    SamplingParams(temperature=1.0, top_k=7),
    SamplingParams(temperature=0.7, top_p=0.8),
    SamplingParams(temperature=1.3, top_k=12, top_p=0.6),
])
def test_empirical_frequencies_match_the_reference_distribution(params):
    """N draws of one row (as N rows of a batch, so one call): tokens the reference gives
    probability 0 never appear, and every token's frequency is within 5 standard deviations
    (plus a small slack) of its reference probability; the total variation is small."""
    g = torch.Generator().manual_seed(3)
    vocab, n = 40, 40000
    logits = torch.randn(vocab, generator=g) * 2
    ref = hf_reference(logits, params)
    got = tokens(logits[None].expand(n, vocab), [params] * n, torch.Generator().manual_seed(4))
    freq = torch.bincount(torch.tensor(got), minlength=vocab).double() / n
    ref = ref.double()
    assert (freq[ref == 0] == 0).all()
    assert (ref > 0).sum() >= 3  # the filter leaves a real choice, so the check means something
    sd = (ref * (1 - ref) / n).sqrt()
    assert ((freq - ref).abs() <= 5 * sd + 1e-3).all(), (freq - ref).abs().max()
    assert 0.5 * (freq - ref).abs().sum() < 0.02


def test_inverse_cdf_never_picks_a_zero_probability_token():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]] * 4)
    u = torch.tensor([0.0, 0.4999, 0.5, 1.0 - 2 ** -24])
    assert inverse_cdf(probs, u).tolist() == [1, 1, 3, 3]


def test_seeded_rows_draw_from_their_own_generator_whatever_else_is_in_the_batch():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 200, generator=g)
    p = SamplingParams(temperature=1.0, top_p=0.95, seed=7)

    def run(seed: int, steps: int = 30, batch: bool = False) -> list[int]:
        own = torch.Generator().manual_seed(seed)
        if not batch:
            return [tokens(logits[1:2], [p], g, [own])[0] for _ in range(steps)]
        # the row among an unseeded row and a differently seeded one, which draw as well
        others = [SamplingParams(temperature=1.0), p, SamplingParams(temperature=1.0, seed=8)]
        return [tokens(logits, others, g, [None, own, torch.Generator().manual_seed(8)])[1] for _ in range(steps)]

    assert run(7) == run(7, batch=True)
    assert run(7) != run(9)


def test_a_batch_past_one_row_chunk_draws_each_row_as_alone():
    """Rows are sampled ROW_CHUNK at a time (bounded temporaries): each row, with its own seed and
    its own parameters, gets the token it gets alone."""
    from granikv.engine.sampling import ROW_CHUNK

    n = 2 * ROW_CHUNK + 7
    logits = torch.randn(n, 300, generator=torch.Generator().manual_seed(10)) * 3
    params = [SamplingParams(temperature=0.5 + (i % 5) / 4, top_k=(i % 3) * 10, top_p=1.0 - (i % 4) / 8, seed=i)
              for i in range(n)]
    g = torch.Generator().manual_seed(0)
    batch = tokens(logits, params, g, [torch.Generator().manual_seed(i) for i in range(n)])
    alone = [tokens(logits[i:i + 1], [params[i]], g, [torch.Generator().manual_seed(i)])[0] for i in range(n)]
    assert batch == alone


def test_logprobs_are_the_raw_log_softmax_of_the_chosen_and_top_tokens():
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(4, 300, generator=g) * 3
    params = [SamplingParams(logprobs=3), SamplingParams(), SamplingParams(temperature=2.0, top_k=20, logprobs=0),
              SamplingParams(temperature=0.5, logprobs=20)]
    res = sample(logits, params, [None] * 4, g).to_host(pinned=False).result()
    ref = torch.log_softmax(logits.float(), dim=-1)  # raw: before temperature and filters
    assert res.logprobs[1] is None
    for i in (0, 2, 3):
        lp = res.logprobs[i]
        assert lp.logprob == pytest.approx(ref[i, res.tokens[i]].item(), abs=1e-5)
        k = params[i].logprobs
        assert len(lp.top) == k
        if k:
            vals, ids = ref[i].topk(k)
            assert [t for t, _ in lp.top] == ids.tolist()
            assert [v for _, v in lp.top] == pytest.approx(vals.tolist(), abs=1e-5)
            assert lp.top[0][0] == int(logits[i].argmax())
    assert res.tokens[0] == int(logits[0].argmax())


def test_a_step_without_logprobs_returns_none_for_them():
    g = torch.Generator().manual_seed(7)
    res = sample(torch.randn(2, 50, generator=g), [SamplingParams(temperature=1.0), SamplingParams()],
                 [None, None], g).to_host(pinned=False).result()
    assert res.logprobs is None and len(res.tokens) == 2
