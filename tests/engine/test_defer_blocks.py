"""The scheduler's prompt blocks (Scheduler._prefix_blocks): two prompts share a block exactly
when they agree up to its end, whatever the client says is shared."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from granikv.engine.request import Request, SamplingParams
from granikv.engine.scheduler import Scheduler


def _req(ids: list[int]) -> Request:
    return Request(rid="r", input_ids=ids, params=SamplingParams(max_new_tokens=1))


@settings(max_examples=200, deadline=None)
@given(common=st.lists(st.integers(0, 50), max_size=300), a=st.lists(st.integers(0, 50), min_size=1, max_size=80),
       b=st.lists(st.integers(0, 50), min_size=1, max_size=80), block=st.sampled_from([1, 4, 64]))
def test_prompts_share_exactly_the_blocks_they_agree_on(common, a, b, block):
    sched = Scheduler(storage=None, max_running=1, max_context=1 << 20, chunked_prefill_tokens=1,
                      defer_block_tokens=block)
    ra, rb = _req(common + a), _req(common + b)
    ha, ea = sched._prefix_blocks(ra)
    hb, eb = sched._prefix_blocks(rb)
    pa, pb = ra.prompt_arr, rb.prompt_arr
    # blocks end at multiples of the block size, then at the prompt's last token (never covered)
    assert all(e % block == 0 for e in ea[:-1]) and (not ea or ea[-1] == len(pa) - 1)
    agree = next((i for i in range(min(len(pa), len(pb))) if pa[i] != pb[i]), min(len(pa), len(pb)))
    for h, e in zip(ha, ea, strict=True):
        same_block = e in eb and hb[eb.index(e)] == h
        assert same_block == (e <= agree and e in eb), (e, agree)
    assert sched._prefix_blocks(ra) is sched._prefix_blocks(ra)  # built once
