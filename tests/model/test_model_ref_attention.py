"""RefAttention: flat multi-sequence batches equal per-sequence causal attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from granikv.model import RefAttention


def causal_gqa(q, k, v):
    """Plain causal attention of one whole sequence: q [L, Hq, d], k/v [L, Hkv, d]."""
    g = q.shape[1] // k.shape[1]
    qq, kk, vv = (x.transpose(0, 1) for x in (q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)))
    return F.scaled_dot_product_attention(qq, kk, vv, is_causal=True).transpose(0, 1)


def test_prefill_then_decode_equals_full_recompute():
    torch.manual_seed(0)
    hq, hkv, d = 6, 2, 16
    total = {"a": 9, "b": 4, "c": 13}
    q = {s: torch.randn(n + 3, hq, d) for s, n in total.items()}
    k = {s: torch.randn(n + 3, hkv, d) for s, n in total.items()}
    v = {s: torch.randn(n + 3, hkv, d) for s, n in total.items()}
    attn = RefAttention(num_layers=2)
    # step 1: prefill every sequence in one flat batch; then 3 single-token decode steps
    steps = [[(s, n) for s, n in total.items()]] + [[(s, 1) for s in total]] * 3
    done = dict.fromkeys(total, 0)
    for layout in steps:
        attn.set_batch(layout)
        new = [torch.cat([x[s][done[s] : done[s] + n] for s, n in layout]) for x in (q, k, v)]
        out = attn(1, *new)
        off = 0
        for s, n in layout:
            ref = causal_gqa(q[s][: done[s] + n], k[s][: done[s] + n], v[s][: done[s] + n])[done[s] :]
            torch.testing.assert_close(out[off : off + n], ref, rtol=1e-5, atol=1e-5)
            off += n
            done[s] += n
    assert attn.seq_len("c", layer_id=1) == 16 and attn.seq_len("c") == 0 and attn.seq_len("zzz", 1) == 0
    attn.free("c")
    assert attn.seq_len("c", layer_id=1) == 0


def test_layout_must_match_tokens():
    attn = RefAttention(1)
    attn.set_batch([(0, 3)])
    with pytest.raises(ValueError):
        attn(0, torch.zeros(4, 2, 8), torch.zeros(4, 1, 8), torch.zeros(4, 1, 8))
    with pytest.raises(ValueError):
        attn.set_batch([(0, 0)])
