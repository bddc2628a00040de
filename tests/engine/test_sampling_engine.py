"""Per-request sampling and logprobs through the engine: seeds independent of the batch, top-k /
top-p limits equal greedy, stop_token_ids, logprobs equal to Hugging Face transformers' float32
log_softmax on the same random checkpoint, TP=2 agreeing with TP=1, and the logprobs reaching
the server's Events through EngineLoop and EngineProcess.

Comparing sampled tokens across runs with different batches (or TP degrees) compares runs whose
logits differ in the last float bits (another batch shape, another reduction order), and a
sampled token flips when such a difference moves a CDF or top-p boundary across the request's
uniform. The sampler itself is exact given the logits (test_sampling.py); these tests sample at
a low temperature, where the tiny model's nearly flat logits (log-probabilities within ~1 nat)
become a peaked distribution of a few tokens, so a 1e-6 change essentially never flips a draw
while the tokens still differ from greedy (checked)."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch
from engine_testutil import multi_prefix_prompts, tiny_config
from test_engine_correctness import hf_checkpoint

from granikv.engine.engine import Engine
from granikv.engine.request import SamplingParams


def run_engine(eng: Engine, prompts: list[list[int]], params: list[SamplingParams]) -> dict[str, list]:
    """Step the engine to the end; each request's StepOutputs in order, keyed by its index."""
    reqs = [eng.add_request(p, sp, rid=str(i)) for i, (p, sp) in enumerate(zip(prompts, params))]
    outs: dict[str, list] = {r.rid: [] for r in reqs}
    while eng.has_work():
        for o in eng.step():
            outs[o.req.rid].append(o)
    return outs


def prompts_of(seed: int, n: int) -> list[list[int]]:
    return [p for p, _ in multi_prefix_prompts(seed=seed, prefix_lens=(24,), per_prefix=(n,))]


T_LOW = 0.1
SAMPLED = SamplingParams(max_new_tokens=16, temperature=T_LOW, top_p=0.9, top_k=50, seed=11, ignore_eos=True)


def test_a_seeded_request_gives_the_same_tokens_whatever_else_is_in_the_batch():
    prompts = prompts_of(1, 4)
    alone = Engine(tiny_config("granikv", kernel_impl="torch")).generate(prompts[:1], SAMPLED)[0]
    others = [SamplingParams(max_new_tokens=20, temperature=1.0, ignore_eos=True),
              SamplingParams(max_new_tokens=9, ignore_eos=True),
              SamplingParams(max_new_tokens=16, temperature=T_LOW, seed=12, ignore_eos=True)]
    mixed = Engine(tiny_config("granikv", kernel_impl="torch")).generate(prompts, [SAMPLED] + others)
    assert mixed[0] == alone
    reseeded = Engine(tiny_config("granikv", kernel_impl="torch")).generate(
        prompts[:1], SamplingParams(**{**SAMPLED.__dict__, "seed": 12}))[0]
    assert reseeded != alone
    greedy = Engine(tiny_config("granikv", kernel_impl="torch")).generate(
        prompts[:1], SamplingParams(max_new_tokens=16, ignore_eos=True))[0]
    assert alone != greedy  # the sampler did sample


def test_seeded_sampling_survives_retraction():
    """Under KV pressure requests are retracted and recomputed; each seeded request's generator
    stays with it, so the tokens equal an unpressured run's."""
    prompts = multi_prefix_prompts(seed=5, prefix_lens=(40, 24), per_prefix=(4, 4))
    params = [SamplingParams(max_new_tokens=40, temperature=T_LOW, top_p=0.9, seed=i, ignore_eos=True)
              for i in range(len(prompts))]
    outs = {}
    for slots in (4096, 260):
        eng = Engine(tiny_config("granikv", num_slots=slots, hot_fraction=0.2, kernel_impl="torch"))
        outs[slots] = eng.generate([p for p, _ in prompts], params, shared_prefix_lens=[lp for _, lp in prompts])
        outs[f"{slots}_retractions"] = eng.stats()["retractions"]
    assert outs["260_retractions"] > 0 and outs["4096_retractions"] == 0
    assert outs[260] == outs[4096]


@pytest.mark.parametrize("limit", [dict(top_k=1), dict(top_p=1e-6)])
def test_top_k_1_and_a_tiny_top_p_equal_greedy(limit):
    prompts = prompts_of(2, 3)
    greedy = Engine(tiny_config("paged", kernel_impl="torch")).generate(
        prompts, SamplingParams(max_new_tokens=12, ignore_eos=True))
    limited = Engine(tiny_config("paged", kernel_impl="torch")).generate(
        prompts, SamplingParams(max_new_tokens=12, temperature=1.5, ignore_eos=True, **limit))
    assert limited == greedy


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_stop_token_ids_stop_with_reason_stop(temperature):
    """Also with ignore_eos: it ignores the EOS ids only, as in vLLM."""
    prompt = prompts_of(3, 1)
    base = SamplingParams(max_new_tokens=30, temperature=temperature, seed=4, ignore_eos=True)
    full = Engine(tiny_config("granikv", kernel_impl="torch")).generate(prompt, base)[0]
    stop = full[9]
    first = full.index(stop)
    params = SamplingParams(**{**base.__dict__, "stop_token_ids": (stop,)})
    eng = Engine(tiny_config("granikv", kernel_impl="torch"))
    req = eng.add_request(prompt[0], params)
    while eng.has_work():
        eng.step()
    assert req.output_ids == full[:first + 1]
    assert req.finish_reason == "stop"


def test_greedy_tokens_with_logprobs_equal_greedy_tokens_without():
    """Also with the overlap scheduler (on by default): greedy steps with logprobs still overlap."""
    prompts = prompts_of(4, 5)
    plain = SamplingParams(max_new_tokens=14, ignore_eos=True)
    ref = Engine(tiny_config("granikv", kernel_impl="torch")).generate(prompts, plain)
    asks = [SamplingParams(max_new_tokens=14, ignore_eos=True, logprobs=k) for k in (0, 1, 5)] + [plain, plain]
    for overlap in (True, False):
        eng = Engine(tiny_config("granikv", kernel_impl="torch", overlap_schedule=overlap))
        outs = run_engine(eng, prompts, asks)
        for i in range(5):
            assert [o.token for o in outs[str(i)]] == ref[i]
            has = [o.logprobs is not None for o in outs[str(i)]]
            assert all(has) if asks[i].logprobs is not None else not any(has)


def hf_logprobs(hf, prompt: list[int], output: list[int]) -> torch.Tensor:
    """float32 log_softmax of the HF model's logits at every position that produced an output
    token: [len(output), vocab]."""
    ids = torch.tensor([prompt + output[:-1]])
    with torch.no_grad():
        logits = hf(ids).logits[0, len(prompt) - 1:].float()
    return torch.log_softmax(logits, dim=-1)


@pytest.mark.parametrize("system", ["paged", "granikv"])
def test_logprobs_equal_transformers_log_softmax(tmp_path, system):
    """Greedy and sampled requests (the logprobs are the raw model distribution, not the
    tempered one): each token's logprob and its top-k alternatives equal a float32 reference
    from transformers on the same checkpoint; the alternatives are sorted and hold the argmax."""
    hf, path = hf_checkpoint(tmp_path, "tiny")
    eng = Engine(tiny_config(system, model="tiny", load_format="safetensors", model_path=str(path),
                             kernel_impl="torch"))
    rng = random.Random(0)
    shared = [rng.randrange(1024) for _ in range(30)]
    prompts = [shared + [rng.randrange(1024) for _ in range(n)] for n in (3, 11, 7)]
    params = [SamplingParams(max_new_tokens=12, ignore_eos=True, logprobs=5),
              SamplingParams(max_new_tokens=12, ignore_eos=True, logprobs=0, temperature=1.0, seed=1),
              SamplingParams(max_new_tokens=12, ignore_eos=True, logprobs=3, temperature=0.7, top_p=0.9, seed=2)]
    outs = run_engine(eng, prompts, params)
    tol = 1e-3
    for i, (p, sp) in enumerate(zip(prompts, params)):
        got = outs[str(i)]
        ref = hf_logprobs(hf, p, [o.token for o in got])
        for j, o in enumerate(got):
            lp = o.logprobs
            assert lp.logprob == pytest.approx(ref[j, o.token].item(), abs=tol)
            assert len(lp.top) == sp.logprobs
            if not sp.logprobs:
                continue
            vals = [v for _, v in lp.top]
            assert vals == sorted(vals, reverse=True)
            assert vals == pytest.approx([ref[j, t].item() for t, _ in lp.top], abs=tol)
            # they are the top k: the k-th is at least the reference's k-th largest
            assert vals[-1] >= ref[j].topk(sp.logprobs).values[-1].item() - tol
            assert ref[j, lp.top[0][0]].item() >= ref[j].max().item() - tol  # holds the argmax
            if sp.temperature == 0:
                assert lp.top[0][0] == o.token


def test_tp2_samples_and_reports_logprobs_as_tp1():
    """Every rank draws the same tokens (a rank that drew others would feed its shard other
    tokens, and the all-gathered logits, hence rank 0's tokens, would differ from TP=1)."""
    from granikv.runtime.tp import create_engine

    prompts = prompts_of(7, 4)
    params = [SamplingParams(max_new_tokens=10, temperature=T_LOW, top_p=0.9, seed=3, ignore_eos=True, logprobs=2),
              SamplingParams(max_new_tokens=10, temperature=T_LOW, top_k=20, ignore_eos=True),
              SamplingParams(max_new_tokens=10, ignore_eos=True, logprobs=1),
              SamplingParams(max_new_tokens=10, ignore_eos=True)]
    ref = run_engine(Engine(tiny_config("granikv", kernel_impl="torch")), prompts, params)
    eng = create_engine(tiny_config("granikv", kernel_impl="torch", tp=2))
    try:
        got = run_engine(eng, prompts, params)
    finally:
        eng.close()
    for rid, outs in ref.items():
        assert [o.token for o in got[rid]] == [o.token for o in outs]
        for a, b in zip(got[rid], outs):
            if b.logprobs is None:
                assert a.logprobs is None
                continue
            assert a.logprobs.logprob == pytest.approx(b.logprobs.logprob, abs=1e-4)
            assert [t for t, _ in a.logprobs.top] == [t for t, _ in b.logprobs.top]


async def collect(handle, prompts, params) -> dict[str, list]:
    queues = {str(i): handle.submit(str(i), p, sp, None) for i, (p, sp) in enumerate(zip(prompts, params))}
    events: dict[str, list] = {}
    for rid, q in queues.items():
        events[rid] = []
        while True:
            ev = await q.get()
            events[rid].append(ev)
            if ev.finished:
                break
    return events


LP_PARAMS = [SamplingParams(max_new_tokens=6, ignore_eos=True, logprobs=3),
             SamplingParams(max_new_tokens=6, ignore_eos=True, temperature=1.0, seed=5, logprobs=0),
             SamplingParams(max_new_tokens=6, ignore_eos=True)]


def check_events(events: dict[str, list], cfg) -> None:
    ref = run_engine(Engine(cfg), prompts_of(8, 3), LP_PARAMS)
    for rid, outs in ref.items():
        evs = events[rid]
        assert [e.token for e in evs] == [o.token for o in outs]
        assert evs[-1].finished and evs[-1].finish_reason == "length"
        for e, o in zip(evs, outs):
            if o.logprobs is None:
                assert e.logprob is None and e.top_logprobs is None
            else:
                assert e.logprob == pytest.approx(o.logprobs.logprob, abs=1e-6)
                assert [t for t, _ in e.top_logprobs] == [t for t, _ in o.logprobs.top]
                assert len(e.top_logprobs) == LP_PARAMS[int(rid)].logprobs


def test_engine_loop_events_carry_logprobs():
    from granikv.runtime.loop import EngineLoop

    cfg = tiny_config("granikv", kernel_impl="torch")
    loop = EngineLoop(Engine(cfg))
    assert loop.info["logprobs"] is True
    loop.start()
    try:
        events = asyncio.run(collect(loop, prompts_of(8, 3), LP_PARAMS))
    finally:
        loop.stop()
    check_events(events, cfg)


def test_engine_process_events_carry_logprobs():
    from granikv.runtime.process import EngineProcess

    cfg = tiny_config("granikv", kernel_impl="torch")
    handle = EngineProcess(cfg)
    handle.start()
    try:
        assert handle.info["logprobs"] is True
        events = asyncio.run(collect(handle, prompts_of(8, 3), LP_PARAMS))
    finally:
        handle.stop()
    check_events(events, cfg)
