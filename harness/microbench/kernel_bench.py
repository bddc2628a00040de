"""The attention-kernel bench: its plan (shapes), slot space, op closures, timing and records.

Run by `python -m harness.microbench.kernels` (which also tunes, fits M_sat and writes the report).
Shapes: Llama-3.1-8B head (32 q heads, 8 KV heads, d = 128, bf16) for g = 4, and the same KV
with 40 q heads (Qwen-2.5-14B at TP=1) for g = 5. Every time is the median of CUDA-graph
replays with L2 flushed before each (see _timing.py), for one launch = one layer.

Byte and FLOP models (the minimum the op must move / do; GBps and TFLOPs in the records use
them): a token's K+V for one layer is kv_tok = 2 * H_kv * d * 2 B = 4 KiB.
- decode_paged, layout "unique": B * L * kv_tok of K/V (+ q, o, lse, slot indices);
  layout "paged-shared" (every request points at the same prefix pages): L * kv_tok minimum,
  but B * L * kv_tok logically read (kv_GBps), mostly from L2.
- prefix passes on the shared slab: L * kv_tok + q + o. FLOPs 4 * B * Hq * L * d.
- prefix_dense, layout "unique" (the paper's Table 5 "unique (paged)" row): the same kernel and
  tile shape over B one-request classes, each reading its own contiguous copy of the prefix:
  B * L * kv_tok + q + o; FLOPs as above.
- extend: FLOPs 4 * Hq * d * sum over new tokens of the keys each sees; bytes = each
  request's K/V once + q + o.
Layouts: "unique" gives every request its own K/V (no two requests share a byte, so L2 cannot
flatter it): for decode_paged its own 16-slot pages drawn at random from a 34 GB slot space, for
the prefix passes its own slab [base_r, base_r + L), the B slabs back to back in that space;
"shared" is the HOT slab [base, base + L); "paged-shared" is one random page list that every
request's row repeats.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from granikv.kernels import (
    DecodeConfig,
    PrefixClasses,
    PrefixConfig,
    SplitWorkspace,
    decode_max_splits,
    decode_paged,
    extend,
    prefix_cascade,
    prefix_dense,
)
from granikv.kernels.prefix_cascade import prefix_max_splits
from harness.microbench._timing import Timing, bench


@dataclass(frozen=True)
class KernelBenchPlan:
    """Everything the run sweeps; FULL on the GPU, SMOKE on a CPU host."""

    batches: tuple[int, ...] = (8, 32, 128, 256, 512)
    lps: tuple[int, ...] = (2048, 8192, 16384)
    gs: tuple[int, ...] = (4, 5)
    hkv: int = 8
    d: int = 128
    page: int = 16
    headline_b: int = 256
    headline_lp: int = 8192
    cascade_b: int = 32
    ext_n: int = 64
    ext_prefix: int = 16384
    ext_new: int = 256
    gemm_n: int = 8192
    copy_mib: int = 2048
    rep_ms: int = 100
    tune: bool = True


FULL = KernelBenchPlan()
SMOKE = KernelBenchPlan(
    batches=(2, 3),
    lps=(40, 72),
    hkv=2,
    d=64,
    headline_b=3,
    headline_lp=72,
    cascade_b=2,
    ext_n=2,
    ext_prefix=50,
    ext_new=7,
    gemm_n=64,
    copy_mib=1,
    rep_ms=5,
    tune=False,
)

class Bench:
    """One benchmark run: the slot space, the records, and the op closures."""

    def __init__(self, plan: KernelBenchPlan, smoke: bool, dtype: torch.dtype | None = None):
        self.plan = plan
        self.smoke = smoke
        self.dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.dtype = dtype or (torch.float32 if smoke else torch.bfloat16)
        self.elt = torch.finfo(self.dtype).bits // 8
        self.gen = torch.Generator(device=self.dev).manual_seed(0)
        self.records: list[dict] = []
        self.checks: list[dict] = []
        self.tuning: dict[str, list] = {}
        p = plan
        self.max_lp = max(max(p.lps), p.ext_prefix + p.ext_new)
        self.slab_base = 1
        unique_tokens = max(
            max(p.batches) * max(p.lps), p.ext_n * (p.ext_prefix + p.ext_new), p.headline_b * p.headline_lp
        )
        self.unique_first_page = -(-(1 + self.max_lp) // p.page)
        self.unique_pages = -(-unique_tokens // p.page) + 8
        num_slots = (self.unique_first_page + self.unique_pages) * p.page
        self.kv_tok = 2 * p.hkv * p.d * self.elt
        print(f"slot space: {num_slots} slots, {num_slots * self.kv_tok / 1e9:.1f} GB of K/V", flush=True)
        self.k = torch.randn(num_slots, p.hkv, p.d, device=self.dev, dtype=self.dtype, generator=self.gen)
        self.v = torch.randn(num_slots, p.hkv, p.d, device=self.dev, dtype=self.dtype, generator=self.gen)
        self.sm = p.d**-0.5

    # ---- layouts -------------------------------------------------------------------------
    def unique_table(self, b: int, length: int) -> torch.Tensor:
        """Every request gets its own random 16-slot pages."""
        p = self.plan
        npg = -(-length // p.page)
        perm = torch.randperm(self.unique_pages, device=self.dev, generator=self.gen)[: b * npg]
        pages = (self.unique_first_page + perm).view(b, npg, 1) * p.page
        slots = pages + torch.arange(p.page, device=self.dev).view(1, 1, -1)
        return slots.view(b, npg * p.page)[:, :length].to(torch.int32).contiguous()

    def unique_slab_bases(self, b: int, length: int) -> list[int]:
        """B private contiguous slabs of `length` slots, back to back in the unique region (which
        holds max(B) x max(Lp) tokens, the headline B x Lp included): request r's copy of the
        prefix is [base_r, base_r + length)."""
        first = self.unique_first_page * self.plan.page
        if b * length > self.unique_pages * self.plan.page:
            raise ValueError(f"{b} private slabs of {length} slots do not fit the slot space")
        return [first + r * length for r in range(b)]

    def shared_table(self, b: int, length: int) -> torch.Tensor:
        """One random page list (the shared prefix pages), repeated in every request's row."""
        row = self.unique_table(1, length)
        return row.expand(b, length).contiguous()

    def q(self, b: int, g: int) -> torch.Tensor:
        return torch.randn(
            b, g * self.plan.hkv, self.plan.d, device=self.dev, dtype=self.dtype, generator=self.gen
        )

    def i32(self, xs) -> torch.Tensor:
        return torch.tensor(xs, dtype=torch.int32, device=self.dev)

    # ---- op closures (buffers allocated up front: graph-capturable) ------------------------
    def decode_fn(self, q, table, length: int, cfg: DecodeConfig, max_splits: int | None = None):
        b, hq, d = q.shape
        ms = max_splits or decode_max_splits(b, self.plan.hkv, self.dev, cfg)
        ws = SplitWorkspace.allocate(b, hq, ms, d, self.dev) if ms > 1 else None
        out = torch.empty_like(q)
        lse = torch.empty(b, hq, device=self.dev, dtype=torch.float32)
        rows = torch.arange(b, device=self.dev, dtype=torch.int32)
        start = torch.zeros(b, device=self.dev, dtype=torch.int32)
        lens = torch.full((b,), length, device=self.dev, dtype=torch.int32)

        def fn():
            return decode_paged(
                q,
                self.k,
                self.v,
                table,
                rows,
                start,
                lens,
                self.sm,
                out=out,
                lse=lse,
                max_splits=ms,
                workspace=ws,
                cfg=cfg,
            )

        return fn, ms

    def prefix_fn(
        self, op: str, q, length: int, cfg: PrefixConfig | None, table=None, max_splits=None, slab_bases=None
    ):
        """The prefix pass `op` over one class of all B requests reading the shared slab (or the
        page list `table`), or, with `slab_bases`, over B one-request classes, request r reading
        its own slab at slab_bases[r] (the unique layout). max_splits None: the kernel's own
        rule (`prefix_max_splits`) for that class list. Returns (fn, max_splits used)."""
        b, hq, d = q.shape
        g = hq // self.plan.hkv
        if slab_bases is not None:
            if table is not None or len(slab_bases) != b:
                raise ValueError("slab_bases: one base per request, and no page table")
            classes = PrefixClasses.from_lists([[r] for r in range(b)], [length] * b, self.dev, slab_base=slab_bases)
        elif table is None:
            classes = PrefixClasses.from_lists(
                [list(range(b))], [length], self.dev, slab_base=[self.slab_base]
            )
        else:
            classes = PrefixClasses.from_lists(
                [list(range(b))], [length], self.dev, page_rows=[0], slot_table=table
            )
        out = torch.empty_like(q)
        lse = torch.empty(b, hq, device=self.dev, dtype=torch.float32)
        if op == "prefix_dense_cublas":
            return (
                lambda: prefix_dense(q, self.k, self.v, classes, self.sm, out=out, lse=lse, impl="cublas")
            ), 1
        ms = max_splits or prefix_max_splits(classes, b, g, self.plan.hkv, self.dev, cfg)
        ws = SplitWorkspace.allocate(b, hq, ms, d, self.dev) if ms > 1 else None
        runner = prefix_cascade if op == "prefix_cascade" else prefix_dense

        def fn():
            kw = {} if runner is prefix_cascade else {"impl": "fused"}
            return runner(
                q,
                self.k,
                self.v,
                classes,
                self.sm,
                out=out,
                lse=lse,
                max_splits=ms,
                workspace=ws,
                cfg=cfg,
                **kw,
            )

        return fn, ms

    # ---- measurement ---------------------------------------------------------------------
    def time(self, fn: Callable) -> Timing | None:
        try:
            return bench(fn, rep_ms=self.plan.rep_ms)
        except Exception as exc:  # a config the compiler rejects (shared memory, registers)
            print(f"  skipped: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}", flush=True)
            if self.dev.type == "cuda":
                torch.cuda.synchronize()
            return None

    def record(self, op, layout, b, length, g, t: Timing, nbytes, flops, **extra) -> dict:
        p = self.plan
        rec = {
            "op": op,
            "layout": layout,
            "B": b,
            "Lp": length,
            "Hq": g * p.hkv,
            "Hkv": p.hkv,
            "d": p.d,
            "dtype": str(self.dtype).replace("torch.", ""),
            "g": g,
            "M_eff": b * g,
            "us": round(t.us, 2),
            "p20_us": round(t.p20_us, 2),
            "p80_us": round(t.p80_us, 2),
            "GBps": round(nbytes / t.us / 1e3, 1),
            "TFLOPs": round(flops / t.us / 1e6, 2),
            "graphed": t.graphed,
        }
        rec.update(extra)
        self.records.append(rec)
        return rec

    def io_bytes(self, b: int, g: int) -> int:
        p = self.plan
        return b * g * p.hkv * (2 * p.d * self.elt + 4)  # q + o + lse

    def attn_flops(self, b: int, g: int, length: int) -> int:
        return 4 * b * g * self.plan.hkv * length * self.plan.d

    # ---- correctness at full size (bf16 against float32 torch) -------------------------------
    def check_rows(self, name: str, o, lse, q, slots_of: Callable[[int], torch.Tensor], sample: list[int]):
        p = self.plan
        hq = q.shape[1]
        g = hq // p.hkv
        num = den = 0.0
        lse_err = 0.0
        nan = bool(torch.isnan(o.float()).any() or torch.isnan(lse).any())
        for b in sample:
            slots = slots_of(b).long()
            kk = self.k[slots].float()  # [L, Hkv, d]
            vv = self.v[slots].float()
            qq = q[b].float().view(p.hkv, g, p.d)
            s = torch.einsum("hgd,lhd->hgl", qq, kk) * self.sm
            ls = torch.logsumexp(s, -1)
            ref = torch.einsum("hgl,lhd->hgd", torch.softmax(s, -1), vv).reshape(hq, p.d)
            num += (o[b].float() - ref).norm().item() ** 2
            den += ref.norm().item() ** 2
            lse_err = max(
                lse_err, ((lse[b] - ls.reshape(hq)).abs() / ls.reshape(hq).abs().clamp_min(1)).max().item()
            )
        rel = math.sqrt(num / max(den, 1e-30))
        ok = rel < (1e-2 if self.dtype != torch.float32 else 1e-4) and not nan
        self.checks.append({"op": name, "rel_err": rel, "lse_rel_err": lse_err, "nan": nan, "ok": ok})
        print(f"  check {name}: rel err {rel:.2e}, lse {lse_err:.2e}, {'ok' if ok else 'FAIL'}", flush=True)

    def check_extend(self, o, q, table, indptr: list[int], prefix: int, sample: list[int]):
        p = self.plan
        hq = q.shape[1]
        g = hq // p.hkv
        num = den = 0.0
        for n in sample:
            q0, q1 = indptr[n], indptr[n + 1]
            nq = q1 - q0
            slots = table[n, : prefix + nq].long()
            kk, vv = self.k[slots].float(), self.v[slots].float()
            qq = q[q0:q1].float().view(nq, p.hkv, g, p.d)
            s = torch.einsum("thgd,lhd->thgl", qq, kk) * self.sm
            allowed = (
                torch.arange(prefix + nq, device=self.dev)[None, :]
                <= (prefix + torch.arange(nq, device=self.dev))[:, None]
            )
            s = s.masked_fill(~allowed[:, None, None, :], float("-inf"))
            ref = torch.einsum("thgl,lhd->thgd", torch.softmax(s, -1), vv).reshape(nq, hq, p.d)
            num += (o[q0:q1].float() - ref).norm().item() ** 2
            den += ref.norm().item() ** 2
        rel = math.sqrt(num / max(den, 1e-30))
        nan = bool(torch.isnan(o.float()).any())
        ok = rel < (1e-2 if self.dtype != torch.float32 else 1e-4) and not nan
        self.checks.append({"op": "extend", "rel_err": rel, "nan": nan, "ok": ok})
        print(f"  check extend: rel err {rel:.2e}, {'ok' if ok else 'FAIL'}", flush=True)


def extend_setup(bn: Bench) -> dict:
    p = bn.plan
    n, prefix, new = p.ext_n, p.ext_prefix, p.ext_new
    g = 4
    table = bn.unique_table(n, prefix + new)
    indptr = [i * new for i in range(n + 1)]
    q = torch.randn(n * new, g * p.hkv, p.d, device=bn.dev, dtype=bn.dtype, generator=bn.gen)
    out = torch.empty_like(q)
    rows = torch.arange(n, device=bn.dev, dtype=torch.int32)
    ip = bn.i32(indptr)
    pl = torch.full((n,), prefix, device=bn.dev, dtype=torch.int32)

    def make(cfg):
        return lambda: extend(q, bn.k, bn.v, table, rows, ip, pl, bn.sm, out=out, max_qo_len=new, cfg=cfg)

    keys = sum(prefix + i + 1 for i in range(new)) * n
    flops = 4 * g * p.hkv * p.d * keys
    nbytes = n * (prefix + new) * bn.kv_tok + 2 * q.numel() * bn.elt
    return {
        "make": make,
        "q": q,
        "out": out,
        "table": table,
        "indptr": indptr,
        "flops": flops,
        "nbytes": nbytes,
    }
