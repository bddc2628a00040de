"""Shared helpers of the storage tests: token runs, draining a storage, a checked granikv storage,
and a one-layer KV cache that says which token's prefill wrote each slot."""

from __future__ import annotations

import torch

from granikv.memory import KVCache
from granikv.systems import make_storage


def seq(start, n):
    return list(range(start, start + n))


def drain(st):
    for adm in list(st.live.values()):
        st.abort(adm)
    st.flush()
    st.audit()


def gk(num_slots=1001, hot_fraction=0.2, **kw):
    kw.setdefault("max_running", 8)
    kw.setdefault("max_context", 600)
    kw.setdefault("min_prefix_for_hot", 16)
    return make_storage("granikv", num_slots, hot_fraction=hot_fraction, check=True, **kw)


class TokenKV:
    """A one-layer KV cache whose K at a slot is the token whose prefill wrote it: a row reads
    the right KV exactly when the K at its slots spells its own tokens."""

    def __init__(self, num_slots):
        self.kv = KVCache(num_layers=1, num_slots=num_slots, num_kv_heads=1, head_dim=1)

    def prefill(self, adm, tokens, start=None):
        """The request's prefill: positions [start (default cached_len), len(tokens))."""
        start = adm.cached_len if start is None else start
        slots = torch.as_tensor(adm.slots[start : len(tokens)], dtype=torch.long)
        self.kv.k[0][slots, 0, 0] = torch.as_tensor(tokens[start:], dtype=torch.float32)

    def promote(self, st):
        """Copy and commit every planned promotion, as the engine does after a step."""
        for plan in st.take_promotions():
            self.kv.copy_slots(torch.as_tensor(plan.src), torch.as_tensor(plan.dst))
            st.commit_promotion(plan)

    def reads(self, adm, tokens):
        got = self.kv.k[0][torch.as_tensor(adm.slots[: len(tokens)], dtype=torch.long), 0, 0]
        return [int(t) for t in got.tolist()]
