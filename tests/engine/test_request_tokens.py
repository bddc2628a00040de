"""Request's token views: the int32 prompt array and the slices the scheduler and runner take
instead of concatenating prompt + outputs (a 16K-token list per call on the engine loop)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from granikv.engine.request import Request


@settings(max_examples=200, deadline=None)
@given(prompt=st.lists(st.integers(0, 2**17), min_size=1, max_size=40),
       outputs=st.lists(st.integers(0, 2**17), max_size=20), data=st.data())
def test_views_equal_the_concatenation(prompt, outputs, data):
    req = Request(rid="r", input_ids=list(prompt))
    req.output_ids.extend(outputs)
    full = req.input_ids + req.output_ids
    n = data.draw(st.integers(0, len(full)))
    kv = req.kv_tokens(n)
    assert kv.dtype == np.int32 and kv.tolist() == full[:n]
    a = data.draw(st.integers(0, len(full)))
    b = data.draw(st.integers(a, len(full)))
    assert req.token_slice(a, b) == full[a:b]


def test_prompt_array_is_converted_once_and_viewed():
    req = Request(rid="r", input_ids=[5, 6, 7, 8])
    assert req.prompt_arr.tolist() == [5, 6, 7, 8]
    assert np.shares_memory(req.kv_tokens(3), req.prompt_arr)  # no copy within the prompt
    import pytest

    with pytest.raises(ValueError):  # the storage keeps views of it: read-only
        req.kv_tokens(3)[0] = 9


def test_add_request_checks_ids_in_one_pass_and_keeps_the_array():
    import pytest
    from engine_testutil import tiny_config

    from granikv.engine.engine import Engine

    eng = Engine(tiny_config("granikv"))
    req = eng.add_request(np.array([3, 1, 4, 1, 5]), shared_prefix_len=2)
    assert req.input_ids == [3, 1, 4, 1, 5] and all(type(t) is int for t in req.input_ids)
    assert req.prompt_arr.dtype == np.int32 and req.prompt_arr.tolist() == req.input_ids
    for bad, why in (([], "must not be empty"), ([1, 1024], "out of range"), ([-1, 2], "out of range"),
                     ([1.5, 2], "integer token ids"), ([[1, 2]], "integer token ids"), (["a"], "integer token ids"),
                     ([2**70], "integer token ids")):
        with pytest.raises(ValueError, match=why):
            eng.add_request(bad)
    assert len(eng.requests) == 1  # nothing half-added
