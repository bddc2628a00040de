"""The engine's extend path hands the kernel host bounds of the step (StepBatch.extend_bounds):
the longest request sizes the grid, the longest context lets it split keys — unless
EngineConfig.extend_split_keys is off."""

from __future__ import annotations

from engine_testutil import tiny_config

from granikv.engine.engine import Engine


def test_extend_split_keys_flag_reaches_the_kernel(monkeypatch):
    """EngineConfig.extend_split_keys: on, the extend kernel gets the step's longest context (so
    it may split keys); off, it gets None (one split). The grid bound max_qo_len is passed either
    way. Both from the host views of the step, no device read."""
    import torch

    from granikv.attention import ops as ops_mod
    from granikv.attention.batch import ReqView, StepBatch

    seen = []

    def fake_extend(q, *a, max_qo_len=None, max_kv_len=None, **kw):
        seen.append((max_qo_len, max_kv_len))
        return q

    monkeypatch.setattr(ops_mod.K, "extend", fake_extend)
    i32 = lambda xs: torch.tensor(xs, dtype=torch.int32)  # noqa: E731
    batch = StepBatch(mode="extend", reqs=[ReqView(row=0, seq_len=700, prefix_len=690),
                                           ReqView(row=1, seq_len=40, prefix_len=10)],
                      num_tokens=40, out_slots=None, rows=i32([0, 1]), prefix_lens=i32([690, 10]),
                      qo_indptr=i32([0, 10, 40]), seq_lens=i32([700, 40]))
    assert batch.extend_bounds() == (30, 700)
    q = torch.zeros(40, 4, 16)
    for split in (True, False):
        ops = ops_mod.KernelOps("triton", split_extend=split)
        ops.extend(q, None, None, None, batch.rows, batch.qo_indptr, batch.prefix_lens, 0.25,
                   *batch.extend_bounds())
    assert seen == [(30, 700), (30, None)]
    eng = Engine(tiny_config("paged", kernel_impl="torch", extend_split_keys=False))
    assert eng.backend.ops.split_extend is False
