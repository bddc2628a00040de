"""Float32 torch references of every kernel: plain loops, obviously correct, slow.

Each returns what the kernel returns (o in float32, lse natural log, -inf for no keys). The
tests compare the kernels against these on fresh random inputs.
"""

from __future__ import annotations

import torch


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float,
            allowed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """q [M, d] against k, v [N, d] -> (o [M, d], lse [M]); allowed [M, N] masks keys."""
    q, k, v = q.double(), k.double(), v.double()
    m = q.shape[0]
    if k.shape[0] == 0:
        empty = torch.full((m,), float("-inf"), dtype=torch.float64)
        return torch.zeros(m, q.shape[1], dtype=torch.float64), empty
    s = (q @ k.T) * sm_scale
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, dim=1)
    p = torch.exp(s - lse[:, None])
    p = torch.nan_to_num(p, nan=0.0)
    return p @ v, lse


def store_kv_ref(k_cache, v_cache, slots, k, v) -> None:
    for t in range(slots.numel()):
        k_cache[int(slots[t])] = k[t]
        v_cache[int(slots[t])] = v[t]


def decode_paged_ref(q, k_cache, v_cache, slot_table, rows, kv_start, kv_len, sm_scale):
    bsz, hq, d = q.shape
    hkv = k_cache.shape[1]
    g = hq // hkv
    o = torch.zeros(bsz, hq, d, dtype=torch.float64)
    lse = torch.zeros(bsz, hq, dtype=torch.float64)
    for b in range(bsz):
        st, n = int(kv_start[b]), int(kv_len[b])
        slots = slot_table[int(rows[b]), st:st + n].long().cpu()
        for h in range(hkv):
            kk = k_cache[slots, h].cpu()
            vv = v_cache[slots, h].cpu()
            ob, lb = _attend(q[b, h * g:(h + 1) * g].cpu(), kk, vv, sm_scale)
            o[b, h * g:(h + 1) * g] = ob
            lse[b, h * g:(h + 1) * g] = lb
    return o.float(), lse.float()


def prefix_slots(classes, c: int) -> torch.Tensor:
    """Slots of class c's prefix in order, from either descriptor form."""
    n = int(classes.prefix_len[c])
    if classes.slab_base is not None:
        base = int(classes.slab_base[c])
        return torch.arange(base, base + n)
    return classes.slot_table[int(classes.page_rows[c]), :n].long().cpu()


def prefix_attention_ref(q, k_cache, v_cache, classes, sm_scale):
    """Reference of prefix_cascade and prefix_dense: each request of class c attends to class
    c's prefix. Returns (o, lse, touched) where touched[b] says whether b is in some class."""
    bsz, hq, d = q.shape
    hkv = k_cache.shape[1]
    g = hq // hkv
    o = torch.zeros(bsz, hq, d, dtype=torch.float64)
    lse = torch.zeros(bsz, hq, dtype=torch.float64)
    touched = torch.zeros(bsz, dtype=torch.bool)
    indptr = classes.indptr.cpu()
    reqs = classes.reqs.cpu()
    for c in range(indptr.numel() - 1):
        slots = prefix_slots(classes, c)
        for i in range(int(indptr[c]), int(indptr[c + 1])):
            b = int(reqs[i])
            touched[b] = True
            for h in range(hkv):
                ob, lb = _attend(q[b, h * g:(h + 1) * g].cpu(), k_cache[slots, h].cpu(),
                                 v_cache[slots, h].cpu(), sm_scale)
                o[b, h * g:(h + 1) * g] = ob
                lse[b, h * g:(h + 1) * g] = lb
    return o.float(), lse.float(), touched


def merge_ref(o_a, lse_a, o_b, lse_b):
    la, lb = lse_a.double(), lse_b.double()
    m = torch.maximum(la, lb)
    m_safe = torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m)
    wa, wb = torch.exp(la - m_safe), torch.exp(lb - m_safe)
    tot = wa + wb
    den = torch.where(tot == 0, 1.0, tot)[..., None]
    o = (wa[..., None] * o_a.double() + wb[..., None] * o_b.double()) / den
    lse = torch.where(tot == 0, torch.full_like(m, float("-inf")), m_safe + torch.log(tot))
    return o.float(), lse.float()


def extend_ref(q, k_cache, v_cache, slot_table, rows, qo_indptr, prefix_len, sm_scale):
    t, hq, d = q.shape
    hkv = k_cache.shape[1]
    g = hq // hkv
    o = torch.zeros(t, hq, d, dtype=torch.float64)
    for n in range(rows.numel()):
        q0, q1 = int(qo_indptr[n]), int(qo_indptr[n + 1])
        p = int(prefix_len[n])
        nq = q1 - q0
        if nq == 0:
            continue
        slots = slot_table[int(rows[n]), :p + nq].long().cpu()
        qpos = p + torch.arange(nq)
        allowed = torch.arange(p + nq)[None, :] <= qpos[:, None]
        for h in range(hkv):
            for j in range(g):
                ob, _ = _attend(q[q0:q1, h * g + j].cpu(), k_cache[slots, h].cpu(), v_cache[slots, h].cpu(),
                                sm_scale, allowed)
                o[q0:q1, h * g + j] = ob
    return o.float()
