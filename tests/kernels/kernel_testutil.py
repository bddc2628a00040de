"""Shared builders for the kernel tests: random caches, slot tables with holes, error checks."""

from __future__ import annotations

import pytest
import torch

DEV = "cuda" if torch.cuda.is_available() else "cpu"

# float32 everywhere (the CPU interpreter); bf16 only on a GPU
DTYPES = [
    pytest.param(torch.float32, id="fp32"),
    pytest.param(torch.bfloat16, id="bf16", marks=pytest.mark.gpu),
]
TOL = {torch.float32: 1e-4, torch.bfloat16: 1e-2}


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape, g: torch.Generator, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=g).to(dtype).to(DEV)


def make_cache(num_slots: int, hkv: int, d: int, dtype, g: torch.Generator):
    """Random K/V over a slot space; K gets a larger scale so softmaxes are not flat."""
    k = (torch.randn(num_slots, hkv, d, generator=g) * 1.5).to(dtype).to(DEV)
    v = torch.randn(num_slots, hkv, d, generator=g).to(dtype).to(DEV)
    return k, v


def scattered_table(lengths: list[int], num_slots: int, g: torch.Generator, max_ctx: int | None = None,
                    page: int = 1) -> torch.Tensor:
    """A slot table whose rows use disjoint random slots (holes between them; slot 0 never
    used). page > 1 gives aligned runs of `page` slots, as a paged layout does."""
    max_ctx = max_ctx or max(lengths + [1])
    table = torch.zeros(len(lengths) + 1, max_ctx, dtype=torch.int32)  # one spare row, all dummy
    npages = (num_slots - 1) // page
    perm = torch.randperm(npages, generator=g)
    cursor = 0
    for r, n in enumerate(lengths):
        need = -(-n // page)
        pages = perm[cursor:cursor + need]
        cursor += need
        assert cursor <= npages, "slot space too small for this table"
        slots = (1 + pages[:, None] * page + torch.arange(page)[None, :]).reshape(-1)[:n]
        table[r, :n] = slots.to(torch.int32)
    return table.to(DEV)


def i32(xs) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int32, device=DEV)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out = out.double().cpu()
    ref = ref.double().cpu()
    assert not torch.isnan(out).any(), "NaN in output (unwritten element or bad arithmetic)"
    den = ref.norm().item()
    return (out - ref).norm().item() / (den if den > 0 else 1.0)


def poisoned(shape, dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=DEV)


def check_lse(lse: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    """LSE: -inf exactly where the reference is -inf, close elsewhere, never NaN."""
    lse = lse.double().cpu()
    ref = ref.double().cpu()
    assert not torch.isnan(lse).any()
    inf = torch.isinf(ref)
    assert torch.equal(torch.isinf(lse), inf)
    if (~inf).any():
        assert rel_err(lse[~inf], ref[~inf]) < tol
