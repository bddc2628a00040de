"""The ops run under CUDA graphs with fixed buffers: capture once, change the device-side
lengths in place, replay, and the outputs follow (split counts are decided on the device,
nothing is read on the host). GPU only: graphs do not exist in the interpreter."""

from __future__ import annotations

import pytest
import torch
from kernel_testutil import DEV, check_lse, gen, i32, make_cache, randn, rel_err, scattered_table

from granikv.kernels import PrefixClasses, SplitWorkspace, decode_paged, extend, prefix_cascade, prefix_dense
from granikv.kernels.ref import decode_paged_ref, extend_ref, prefix_attention_ref

pytestmark = pytest.mark.gpu
DT = torch.bfloat16


def _capture(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def test_decode_replay_follows_kv_len():
    g = gen(0)
    hkv, hq, d, bsz = 8, 32, 128, 4
    k_cache, v_cache = make_cache(20000, hkv, d, DT, g)
    table = scattered_table([3000] * bsz, 20000, g)
    q = randn(bsz, hq, d, g=g, dtype=DT)
    rows, start = i32(list(range(bsz))), i32([0] * bsz)
    kv_len = i32([3000, 17, 0, 1500])
    out = torch.empty_like(q)
    lse = torch.empty(bsz, hq, device=DEV)
    ws = SplitWorkspace.allocate(bsz, hq, 8, d, DEV)
    graph = _capture(lambda: decode_paged(q, k_cache, v_cache, table, rows, start, kv_len, 0.088, out=out,
                                          lse=lse, max_splits=8, workspace=ws))
    for lens in ([3000, 17, 0, 1500], [5, 2999, 700, 0]):
        kv_len.copy_(i32(lens))
        graph.replay()
        torch.cuda.synchronize()
        ro, rl = decode_paged_ref(q.float(), k_cache.float(), v_cache.float(), table, rows, start, kv_len,
                                  0.088)
        assert rel_err(out, ro) < 1e-2
        check_lse(lse, rl, 1e-2)


@pytest.mark.parametrize("dense", [False, True])
def test_prefix_replay_follows_prefix_len(dense):
    g = gen(1)
    hkv, hq, d, bsz = 8, 32, 128, 6
    k_cache, v_cache = make_cache(6000, hkv, d, DT, g)
    q = randn(bsz, hq, d, g=g, dtype=DT)
    classes = PrefixClasses.from_lists([[0, 2, 4], [1, 5]], [2000, 777], DEV, slab_base=[1, 3000])
    out = torch.zeros_like(q)
    lse = torch.zeros(bsz, hq, device=DEV)
    ws = SplitWorkspace.allocate(bsz, hq, 4, d, DEV)
    op = prefix_dense if dense else prefix_cascade
    graph = _capture(lambda: op(q, k_cache, v_cache, classes, 0.088, out=out, lse=lse, max_splits=4,
                                workspace=ws))
    for lens in ([2000, 777], [65, 2500]):
        classes.prefix_len.copy_(i32(lens))
        graph.replay()
        torch.cuda.synchronize()
        ro, rl, touched = prefix_attention_ref(q.float(), k_cache.float(), v_cache.float(), classes, 0.088)
        t = touched.to(DEV)
        assert rel_err(out[t], ro[touched]) < 1e-2
        check_lse(lse[t], rl[touched], 1e-2)
        assert (out[~t] == 0).all()  # request 3 is in no class: untouched


def test_extend_replay():
    g = gen(2)
    hkv, hq, d = 8, 32, 128
    prefix, new = [300, 0, 45], [20, 33, 1]
    totals = [p + n for p, n in zip(prefix, new)]
    k_cache, v_cache = make_cache(1000, hkv, d, DT, g)
    table = scattered_table(totals, 1000, g)
    indptr = i32([0, 20, 53, 54])
    q = randn(54, hq, d, g=g, dtype=DT)
    out = torch.empty_like(q)
    rows, pl = i32([0, 1, 2]), i32(prefix)
    graph = _capture(lambda: extend(q, k_cache, v_cache, table, rows, indptr, pl, 0.088, out=out,
                                    max_qo_len=33))
    graph.replay()
    torch.cuda.synchronize()
    ref = extend_ref(q.float(), k_cache.float(), v_cache.float(), table, rows, indptr, pl, 0.088)
    assert rel_err(out, ref) < 1e-2
