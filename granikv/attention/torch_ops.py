"""Vectorized PyTorch versions of the attention ops (impl="torch").

They compute the same functions as the Triton kernels with plain gathers, masks and float32
softmax — fast enough for CPU engine tests and an independent cross-check of the Triton path
(granikv/kernels/ref.py holds the slow float64 loop references the kernel tests use).
"""

from __future__ import annotations

import torch

NEG_INF = float("-inf")


def _softmax_lse(s: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """s [..., M, N] scores (masked with -inf), v [..., N, d] -> (o [..., M, d], lse [..., M])."""
    lse = torch.logsumexp(s, dim=-1)
    finite = torch.isfinite(lse)
    p = torch.exp(s - torch.where(finite, lse, torch.zeros_like(lse))[..., None])
    p = torch.where(finite[..., None], p, torch.zeros_like(p))
    return p @ v, lse


def decode(q, k_cache, v_cache, slot_table, rows, kv_start, kv_len, sm_scale):
    b, hq, d = q.shape
    hkv = k_cache.shape[1]
    g = hq // hkv
    n = int(kv_len.max()) if b else 0
    if n == 0:
        return torch.zeros_like(q), torch.full((b, hq), NEG_INF, device=q.device)
    j = torch.arange(n, device=q.device)
    valid = j[None, :] < kv_len[:, None]  # [B, N]
    pos = (kv_start[:, None] + j[None, :]).clamp(max=slot_table.shape[1] - 1)
    slots = torch.where(valid, slot_table[rows.long()[:, None], pos.long()], 0).long()
    k = k_cache[slots].float()  # [B, N, Hkv, d]
    v = v_cache[slots].float()
    qf = q.float().view(b, hkv, g, d)
    s = torch.einsum("bhgd,bnhd->bhgn", qf, k) * sm_scale
    s = s.masked_fill(~valid[:, None, None, :], NEG_INF)
    o, lse = _softmax_lse(s, v.permute(0, 2, 1, 3))  # v -> [B, Hkv, N, d]
    return o.reshape(b, hq, d).to(q.dtype), lse.reshape(b, hq)


def prefix(q, k_cache, v_cache, classes, sm_scale):
    """Every class's members attend to its prefix; rows in no class get o = 0, lse = -inf."""
    b, hq, d = q.shape
    hkv = k_cache.shape[1]
    g = hq // hkv
    o = torch.zeros_like(q)
    lse = torch.full((b, hq), NEG_INF, device=q.device)
    indptr = classes.indptr.tolist()
    lens = classes.prefix_len.tolist()
    for c in range(len(indptr) - 1):
        members = classes.reqs[indptr[c]:indptr[c + 1]].long()
        if members.numel() == 0 or lens[c] == 0:
            continue
        if classes.slab_base is not None:
            base = int(classes.slab_base[c])
            slots = torch.arange(base, base + lens[c], device=q.device)
        else:
            # the kernel's pointer arithmetic: page_rows[c] * stride(0) + j over the table's storage
            # (an EXT pass reads a flat [rows * columns, 1] view, so its page row is a flat position)
            t = classes.slot_table
            first = int(classes.page_rows[c]) * t.stride(0)
            slots = t.reshape(-1)[first : first + lens[c]].long()
        k = k_cache[slots].float().permute(1, 0, 2)  # [Hkv, L, d]
        v = v_cache[slots].float().permute(1, 0, 2)
        qm = q[members].float().view(-1, hkv, g, d).permute(1, 0, 2, 3)  # [Hkv, n, g, d]
        s = torch.einsum("hngd,hld->hngl", qm, k) * sm_scale
        oc, lc = _softmax_lse(s, v[:, None])
        o[members] = oc.permute(1, 0, 2, 3).reshape(-1, hq, d).to(q.dtype)
        lse[members] = lc.permute(1, 0, 2).reshape(-1, hq)
    return o, lse


def prefix_flat_(q, k_cache, v_cache, flat, sm_scale, out, lse) -> None:
    """The flattened prefix pass (granikv/kernels/prefix_flat.py): each level's classes, then
    one LSE merge per level into (out, lse)."""
    b, hq, d = q.shape
    hkv = k_cache.shape[1]
    g = hq // hkv
    indptr, lens = flat.indptr.tolist(), flat.lens.tolist()
    where, rows, level = flat.where.tolist(), flat.rows.tolist(), flat.level.tolist()
    table = flat.slot_table.reshape(-1)
    for lv in range(flat.levels):
        o_l = torch.zeros_like(q)
        lse_l = torch.full((b, hq), NEG_INF, device=q.device)
        for c in range(len(indptr) - 1):
            members = flat.reqs[indptr[c]:indptr[c + 1]].long()
            if level[c] != lv or members.numel() == 0 or lens[c] == 0:
                continue
            if rows[c]:
                slots = table[where[c]:where[c] + lens[c]].long()
            else:
                slots = torch.arange(where[c], where[c] + lens[c], device=q.device)
            k = k_cache[slots].float().permute(1, 0, 2)  # [Hkv, L, d]
            v = v_cache[slots].float().permute(1, 0, 2)
            qm = q[members].float().view(-1, hkv, g, d).permute(1, 0, 2, 3)
            oc, lc = _softmax_lse(torch.einsum("hngd,hld->hngl", qm, k) * sm_scale, v[:, None])
            o_l[members] = oc.permute(1, 0, 2, 3).reshape(-1, hq, d).to(q.dtype)
            lse_l[members] = lc.permute(1, 0, 2).reshape(-1, hq)
        merge_(out, lse, o_l, lse_l)


def merge_(o_a, lse_a, o_b, lse_b) -> None:
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    wa, wb = torch.exp(lse_a - m), torch.exp(lse_b - m)
    tot = wa + wb
    o = (wa[..., None] * o_a.float() + wb[..., None] * o_b.float()) / torch.where(tot > 0, tot, 1.0)[..., None]
    o_a.copy_(o.to(o_a.dtype))
    lse_a.copy_(torch.where(tot > 0, m + torch.log(tot), torch.full_like(m, NEG_INF)))


def extend(q, k_cache, v_cache, slot_table, rows, qo_indptr, prefix_lens, sm_scale):
    t, hq, d = q.shape
    hkv = k_cache.shape[1]
    g = hq // hkv
    out = torch.empty_like(q)
    ip = qo_indptr.tolist()
    pl = prefix_lens.tolist()
    rw = rows.tolist()
    for i in range(len(rw)):
        q0, q1 = ip[i], ip[i + 1]
        nq = q1 - q0
        if nq == 0:
            continue
        total = pl[i] + nq
        slots = slot_table[rw[i], :total].long()
        k = k_cache[slots].float().permute(1, 0, 2)  # [Hkv, total, d]
        v = v_cache[slots].float().permute(1, 0, 2)
        qi = q[q0:q1].float().view(nq, hkv, g, d).permute(1, 2, 0, 3)  # [Hkv, g, nq, d]
        s = torch.einsum("hgqd,hkd->hgqk", qi, k) * sm_scale
        qpos = pl[i] + torch.arange(nq, device=q.device)
        mask = torch.arange(total, device=q.device)[None, :] <= qpos[:, None]
        s = s.masked_fill(~mask, NEG_INF)
        o, _ = _softmax_lse(s, v[:, None])
        out[q0:q1] = o.permute(2, 0, 1, 3).reshape(nq, hq, d).to(q.dtype)
    return out
