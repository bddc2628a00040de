"""KV capacity: a request the cache could never hold is refused at admission, and a request that
runs out of KV while it is the only one left fails alone — the engine keeps serving the rest."""

from __future__ import annotations

import pytest
from engine_testutil import tiny_config

from granikv.engine.engine import Engine
from granikv.engine.request import SamplingParams, Status


@pytest.mark.parametrize("system,cold_page_size", [("paged", 1), ("cascade", 1), ("granikv", 1), ("granikv", 4)])
def test_capacity_is_what_one_request_can_fill(system, cold_page_size):
    eng = Engine(tiny_config(system, kernel_impl="torch", num_slots=600, max_context=1024,
                             cold_page_size=cold_page_size))
    cap = eng.kv_capacity
    # paged: slots [1, 600) in whole 16-slot pages, the page of reserved slot 0 lost: pages 1..36;
    # granikv: token-level COLD borrows HOT, so every slot but slot 0; with 4-slot COLD pages only
    # COLD's own whole pages: HOT is [1, 180) (f_p = 0.3 of 599 slots), COLD pages 45..149
    usable = {("paged", 1): 36 * 16, ("cascade", 1): 36 * 16, ("granikv", 1): 599, ("granikv", 4): 105 * 4}
    assert cap == usable[(system, cold_page_size)]
    with pytest.raises(ValueError, match="KV cache holds at most"):
        eng.add_request([3] * 100, SamplingParams(max_new_tokens=cap - 99))
    # the largest request that fits runs to its end alone
    req = eng.add_request([3] * 100, SamplingParams(max_new_tokens=cap - 100, ignore_eos=True))
    while eng.has_work():
        eng.step()
    assert req.status == Status.FINISHED and req.finish_reason == "length" and len(req.output_ids) == cap - 100
    eng.storage.audit()


@pytest.mark.parametrize("system", ["paged", "cascade", "granikv"])
def test_a_lone_request_out_of_kv_fails_alone(system, monkeypatch):
    """Admission's check is the guard; should a lone request still run out (here: the check is
    defeated), it ends with an error output and its KV freed, and the others are served."""
    eng = Engine(tiny_config(system, kernel_impl="torch", num_slots=600, max_context=1024, max_running=4))
    monkeypatch.setattr(eng.storage, "max_request_tokens", lambda: 10**6)
    big = eng.add_request([5] * 50, SamplingParams(max_new_tokens=900, ignore_eos=True))
    small = [eng.add_request([7 + i] * 20, SamplingParams(max_new_tokens=30, ignore_eos=True)) for i in range(3)]
    errors = []
    while eng.has_work():
        for out in eng.step():
            if out.error is not None:
                errors.append(out)
    assert [o.req for o in errors] == [big] and errors[0].token is None and errors[0].finished
    assert "KV cache cannot hold" in errors[0].error and big.finish_reason == "error"
    assert all(r.finish_reason == "length" and len(r.output_ids) == 30 for r in small)
    assert eng.stats()["storage"]["live_requests"] == 0
    eng.storage.audit()
    # and the engine serves on
    assert len(eng.generate([[9, 9, 9]], SamplingParams(max_new_tokens=4))[0]) == 4
