"""Attention-kernel microbenchmark: correctness at full size, tuning, Table 5 analog, the
B x Lp sweep, the M_sat fit, and the bars of the kernels issue, in one run.

    python -m harness.microbench.kernels --out $OUT/kernels.json --hardware-yaml conf/hardware/h200.yaml
    python -m harness.microbench.kernels --smoke        # tiny shapes, CPU interpreter, proves the script runs

Shapes: Llama-3.1-8B head (32 q heads, 8 KV heads, d = 128, bf16) for g = 4, and the same KV
with 40 q heads (Qwen-2.5-14B at TP=1) for g = 5. Every time is the median of CUDA-graph
replays with L2 flushed before each (see _timing.py), for one launch = one layer.

Byte and FLOP models (the minimum the op must move / do; GBps and TFLOPs in the records use
them): a token's K+V for one layer is kv_tok = 2 * H_kv * d * 2 B = 4 KiB.
- decode_paged, layout "unique": B * L * kv_tok of K/V (+ q, o, lse, slot indices);
  layout "paged-shared" (every request points at the same prefix pages): L * kv_tok minimum,
  but B * L * kv_tok logically read (kv_GBps), mostly from L2.
- prefix passes on the shared slab: L * kv_tok + q + o. FLOPs 4 * B * Hq * L * d.
- extend: FLOPs 4 * Hq * d * sum over new tokens of the keys each sees; bytes = each
  request's K/V once + q + o.
Layouts: "unique" gives every request its own 16-slot pages drawn at random from a 34 GB slot
space (no two requests share a byte, so L2 cannot flatter it); "shared" is the HOT slab
[base, base + L); "paged-shared" is one random page list that every request's row repeats.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from granikv.kernels import (
    CASCADE_CONFIG,
    DENSE_CONFIG,
    DecodeConfig,
    ExtendConfig,
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
from harness.microbench._timing import Timing, bench, env_info

M_SAT_BEGIN = "# --- m_sat: written by harness/microbench/kernels.py (do not edit by hand) ---"


@dataclass(frozen=True)
class Plan:
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


FULL = Plan()
SMOKE = Plan(
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

DECODE_CANDIDATES = [
    DecodeConfig(block_n=bn, num_warps=w, num_stages=s)
    for bn, w, s in [(64, 4, 3), (64, 4, 4), (128, 8, 3), (32, 4, 4), (128, 4, 2)]
]
_DENSE = dict(min_split_len=1024, target_programs=1, max_splits_cap=8)
DENSE_CANDIDATES = [
    PrefixConfig(block_m=bm, block_n=bn, num_warps=w, num_stages=s, tma=tma, **_DENSE)
    for bm, bn, w, s, tma in [
        (128, 128, 8, 3, True),
        (128, 128, 8, 3, False),
        (128, 64, 8, 3, True),
        (64, 64, 4, 3, True),
        (64, 64, 4, 4, True),
        (64, 128, 4, 3, True),
        (64, 128, 4, 2, True),
        (64, 64, 4, 2, True),
    ]
]
CASCADE_CANDIDATES = [
    PrefixConfig(
        block_m=bm, block_n=bn, num_warps=w, num_stages=s, min_split_len=256, target_programs=tp, tma=tma
    )
    for bm, bn, w, s, tp, tma in [
        (64, 128, 4, 3, 1, False),
        (64, 128, 4, 3, 1, True),
        (64, 64, 4, 3, 2, False),
        (64, 64, 4, 3, 2, True),
        (64, 64, 4, 3, 1, True),
        (32, 64, 4, 3, 2, True),
        (64, 128, 4, 3, 2, True),
    ]
]
EXTEND_CANDIDATES = [
    ExtendConfig(block_m=bm, block_n=bn, num_warps=w, num_stages=s)
    for bm, bn, w, s in [(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 4, 4), (128, 64, 4, 2), (128, 32, 4, 4)]
]


class Bench:
    """One benchmark run: the slot space, the records, and the op closures."""

    def __init__(self, plan: Plan, smoke: bool):
        self.plan = plan
        self.smoke = smoke
        self.dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.dtype = torch.float32 if smoke else torch.bfloat16
        self.elt = torch.finfo(self.dtype).bits // 8
        self.gen = torch.Generator(device=self.dev).manual_seed(0)
        self.records: list[dict] = []
        self.checks: list[dict] = []
        self.tuning: dict[str, list] = {}
        p = plan
        self.max_lp = max(max(p.lps), p.ext_prefix + p.ext_new)
        self.slab_base = 1
        unique_tokens = max(max(p.batches) * max(p.lps), p.ext_n * (p.ext_prefix + p.ext_new))
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

    def prefix_fn(self, op: str, q, length: int, cfg: PrefixConfig | None, table=None, max_splits=None):
        b, hq, d = q.shape
        g = hq // self.plan.hkv
        if table is None:
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


# ---- sections ---------------------------------------------------------------------------------
def ceilings(bn: Bench) -> dict:
    p = bn.plan
    src = torch.empty(p.copy_mib * 2**20 // 2, device=bn.dev, dtype=torch.bfloat16).normal_()
    dst = torch.empty_like(src)
    t_copy = bench(lambda: dst.copy_(src), rep_ms=p.rep_ms)
    # a graph-captured copy_ may become a copy-engine memcpy node; also time it eagerly and
    # as an SM kernel (x * 1), the form a kernel's own reads and writes take
    t_copy_eager = bench(lambda: dst.copy_(src), rep_ms=p.rep_ms, graph=False)
    t_copy_sm = bench(lambda: torch.mul(src, 1.0, out=dst), rep_ms=p.rep_ms)
    a = torch.randn(p.gemm_n, p.gemm_n, device=bn.dev, dtype=bn.dtype)
    b = torch.randn(p.gemm_n, p.gemm_n, device=bn.dev, dtype=bn.dtype)
    c = torch.empty_like(a)
    t_gemm = bench(lambda: torch.matmul(a, b, out=c), rep_ms=p.rep_ms)
    out = {
        "copy_GBps_read_plus_write": round(2 * src.numel() * 2 / t_copy.us / 1e3, 1),
        "copy_eager_GBps_read_plus_write": round(2 * src.numel() * 2 / t_copy_eager.us / 1e3, 1),
        "sm_copy_GBps_read_plus_write": round(2 * src.numel() * 2 / t_copy_sm.us / 1e3, 1),
        "gemm_bf16_TFLOPs": round(2 * p.gemm_n**3 / t_gemm.us / 1e6, 1),
    }
    print(f"ceilings: {out}", flush=True)
    return out


def tune(bn: Bench) -> dict[str, object]:
    """Pick each kernel's launch shape at its headline shape; all candidates recorded."""
    p = bn.plan
    lim = None if p.tune else 1  # smoke: one candidate each, to exercise the code path
    best: dict[str, object] = {}
    b, length, g = p.headline_b, p.headline_lp, 4
    q = bn.q(b, g)
    table = bn.unique_table(b, length)
    rows = []
    for cfg in DECODE_CANDIDATES[:lim]:
        fn, used = bn.decode_fn(q, table, length, cfg, max_splits=1)
        t = bn.time(fn)
        if t:
            rows.append((t.us, cfg, used))
            print(f"  tune decode {cfg} splits={used}: {t.us:.1f} us", flush=True)
    rows.sort(key=lambda r: r[0])
    for _, cfg, _ in rows[:1]:  # does a second split help the best (tail of the last wave)?
        fn, used = bn.decode_fn(q, table, length, cfg, max_splits=2)
        t = bn.time(fn)
        if t:
            rows.append((t.us, cfg, used))
            print(f"  tune decode {cfg} splits={used}: {t.us:.1f} us", flush=True)
    rows.sort(key=lambda r: r[0])
    bn.tuning["decode"] = [{"us": round(u, 2), "cfg": asdict(c), "max_splits": s} for u, c, s in rows]
    best["decode"] = rows[0][1]
    best["decode_splits"] = rows[0][2]
    del table

    rows = []
    for cfg in DENSE_CANDIDATES[:lim]:
        for ms in ((1, 2) if cfg.block_m == 64 else (2,))[:lim]:
            fn, used = bn.prefix_fn("prefix_dense", q, length, cfg, max_splits=ms)
            t = bn.time(fn)
            if t:
                rows.append((t.us, cfg, used, ms))
                print(f"  tune dense {cfg} splits={used}: {t.us:.1f} us", flush=True)
    rows.sort(key=lambda r: r[0])
    bn.tuning["prefix_dense"] = [
        {"us": round(u, 2), "cfg": asdict(c), "max_splits": s} for u, c, s, _ in rows
    ]
    best["dense"] = rows[0][1]
    best["dense_splits"] = rows[0][3]

    rows = []
    qc = bn.q(p.cascade_b, g)
    for cfg in CASCADE_CANDIDATES[:lim]:
        fn, used = bn.prefix_fn("prefix_cascade", qc, length, cfg)
        t = bn.time(fn)
        if t:
            rows.append((t.us, cfg, used))
            print(f"  tune cascade {cfg} splits={used}: {t.us:.1f} us", flush=True)
    rows.sort(key=lambda r: r[0])
    bn.tuning["prefix_cascade"] = [{"us": round(u, 2), "cfg": asdict(c), "max_splits": s} for u, c, s in rows]
    best["cascade"] = rows[0][1]

    rows = []
    ext = extend_setup(bn)
    for cfg in EXTEND_CANDIDATES[:lim]:
        t = bn.time(ext["make"](cfg))
        if t:
            rows.append((t.us, cfg))
            print(f"  tune extend {cfg}: {t.us:.1f} us", flush=True)
    rows.sort(key=lambda r: r[0])
    bn.tuning["extend"] = [{"us": round(u, 2), "cfg": asdict(c)} for u, c in rows]
    best["extend"] = rows[0][1]
    return best


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


def sdpa_refs(bn: Bench, g: int) -> dict[str, float]:
    """torch SDPA (cuDNN / flash / efficient) decoding the headline batch from contiguous
    per-request KV, and the dense prefix pass against the slab view; best TB/s per backend."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    p = bn.plan
    b, length = p.headline_b, p.headline_lp
    out: dict[str, float] = {}
    kc = torch.randn(b, p.hkv, length, p.d, device=bn.dev, dtype=bn.dtype, generator=bn.gen)
    vc = torch.randn_like(kc)
    q4 = torch.randn(b, p.hkv, g, p.d, device=bn.dev, dtype=bn.dtype, generator=bn.gen)
    q1 = q4.reshape(b, p.hkv * g, 1, p.d)
    kv_bytes = b * length * bn.kv_tok
    backends = {
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
    }
    for name, be in backends.items():
        for form, fn in (
            ("heads-as-queries", lambda be=be: _sdpa(F, sdpa_kernel, be, q4, kc, vc, bn.sm, False)),
            ("enable_gqa", lambda be=be: _sdpa(F, sdpa_kernel, be, q1, kc, vc, bn.sm, True)),
        ):
            t = bn.time(fn)
            if t:
                rec = bn.record(
                    f"sdpa_decode_{name}",
                    "contiguous",
                    b,
                    length,
                    g,
                    t,
                    kv_bytes + bn.io_bytes(b, g),
                    bn.attn_flops(b, g, length),
                    form=form,
                    kv_GBps=round(kv_bytes / t.us / 1e3, 1),
                )
                out[name] = max(out.get(name, 0.0), rec["kv_GBps"])
                print(f"  sdpa decode {name} ({form}): {t.us:.1f} us, {rec['kv_GBps']:.0f} GB/s", flush=True)
    # the dense prefix pass with off-the-shelf fused attention: [1, Hkv, B*g, d] against the slab
    qd = torch.randn(1, p.hkv, b * g, p.d, device=bn.dev, dtype=bn.dtype, generator=bn.gen)
    slab_k = bn.k[bn.slab_base : bn.slab_base + length].permute(1, 0, 2).unsqueeze(0)
    slab_v = bn.v[bn.slab_base : bn.slab_base + length].permute(1, 0, 2).unsqueeze(0)
    for name, be in backends.items():
        t = bn.time(lambda be=be: _sdpa(F, sdpa_kernel, be, qd, slab_k, slab_v, bn.sm, False))
        if t:
            bn.record(
                f"sdpa_prefix_{name}",
                "shared",
                b,
                length,
                g,
                t,
                length * bn.kv_tok + bn.io_bytes(b, g),
                bn.attn_flops(b, g, length),
            )
            print(f"  sdpa prefix {name}: {t.us:.1f} us", flush=True)
    return out


def _sdpa(F, sdpa_kernel, be, q, k, v, scale, gqa):
    with sdpa_kernel([be]):
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=gqa)


def table5(bn: Bench, best: dict) -> None:
    p = bn.plan
    b, length, g = p.headline_b, p.headline_lp, 4
    q = bn.q(b, g)
    kv_all = b * length * bn.kv_tok
    io = bn.io_bytes(b, g)
    fl = bn.attn_flops(b, g, length)
    tu = bn.unique_table(b, length)
    fn, ms = bn.decode_fn(q, tu, length, best["decode"], best.get("decode_splits"))
    o, lse = fn()
    bn.check_rows("decode_paged/unique", o, lse, q, lambda r: tu[r], [0, b // 2, b - 1])
    t = bn.time(fn)
    if t:
        bn.record(
            "decode_paged",
            "unique",
            b,
            length,
            g,
            t,
            kv_all + io + b * length * 4,
            fl,
            table5=True,
            max_splits=ms,
            kv_GBps=round(kv_all / t.us / 1e3, 1),
        )
    ts = bn.shared_table(b, length)
    fn, ms = bn.decode_fn(q, ts, length, best["decode"], best.get("decode_splits"))
    o, lse = fn()
    bn.check_rows("decode_paged/paged-shared", o, lse, q, lambda r: ts[r], [0, b - 1])
    t = bn.time(fn)
    if t:
        bn.record(
            "decode_paged",
            "paged-shared",
            b,
            length,
            g,
            t,
            length * bn.kv_tok + io + b * length * 4,
            fl,
            table5=True,
            max_splits=ms,
            kv_GBps=round(kv_all / t.us / 1e3, 1),
        )
    slab = lambda r: torch.arange(bn.slab_base, bn.slab_base + length, device=bn.dev)  # noqa: E731
    for op, layout, cfg, table, ms in (
        ("prefix_dense", "shared", best["dense"], None, best.get("dense_splits")),
        ("prefix_dense_cublas", "shared", None, None, None),
        ("prefix_cascade", "shared", best["cascade"], None, None),
        ("prefix_cascade", "paged-shared", best["cascade"], ts, None),
    ):
        fn, used = bn.prefix_fn(op, q, length, cfg, table=table, max_splits=ms)
        o, lse = fn()
        bn.check_rows(
            f"{op}/{layout}", o, lse, q, (lambda r: ts[0]) if table is not None else slab, [0, b - 1]
        )
        t = bn.time(fn)
        if t:
            bn.record(
                op,
                layout,
                b,
                length,
                g,
                t,
                length * bn.kv_tok + io,
                fl,
                table5=True,
                max_splits=used,
                kv_GBps=round(kv_all / t.us / 1e3, 1),
            )


def sweep(bn: Bench, best: dict) -> None:
    p = bn.plan
    for g in p.gs:
        for length in p.lps:
            for b in p.batches:
                q = bn.q(b, g)
                io = bn.io_bytes(b, g)
                fl = bn.attn_flops(b, g, length)
                kv_all = b * length * bn.kv_tok
                tu = bn.unique_table(b, length)
                fn, ms = bn.decode_fn(q, tu, length, best["decode"])
                t = bn.time(fn)
                if t:
                    bn.record(
                        "decode_paged",
                        "unique",
                        b,
                        length,
                        g,
                        t,
                        kv_all + io + b * length * 4,
                        fl,
                        sweep=True,
                        max_splits=ms,
                        kv_GBps=round(kv_all / t.us / 1e3, 1),
                    )
                del tu, fn
                for op, cfg in (
                    ("prefix_cascade", best["cascade"]),
                    ("prefix_dense", best["dense"]),
                    ("prefix_dense_cublas", None),
                ):
                    fn, ms = bn.prefix_fn(op, q, length, cfg)
                    t = bn.time(fn)
                    if t:
                        bn.record(
                            op,
                            "shared",
                            b,
                            length,
                            g,
                            t,
                            length * bn.kv_tok + io,
                            fl,
                            sweep=True,
                            max_splits=ms,
                        )
                    del fn
                line = " ".join(f"{r['op']}={r['us']:.0f}" for r in bn.records[-4:])
                print(f"  g={g} Lp={length} B={b}: {line}", flush=True)


def fit_m_sat(records: list[dict], gs, lps, batches) -> dict:
    """Per g, the dispatch threshold that serves the sweep best: for each candidate M_sat (every
    swept M_eff = B*g, or "never"), dispatch every (B, Lp) cell to dense when B*g >= M_sat and
    to cascade otherwise, and score the candidate by the mean over cells of the dispatched
    time / the faster pass's time (1.0 = always the right pass). The smallest candidate with
    the lowest score wins. Dense here is the faster of its fused and cuBLAS forms."""
    fit: dict = {"by_g": {}, "regret": {}, "rule": "min mean(t_dispatched / t_best) over the B x Lp sweep"}
    never = 2 * max(batches) * max(gs)

    for g in gs:

        def t(op, b, length, g=g):
            xs = [
                r["us"]
                for r in records
                if r.get("sweep") and r["op"] == op and r["g"] == g and r["Lp"] == length and r["B"] == b
            ]
            return min(xs) if xs else math.inf

        cells = [(b, length) for b in batches for length in lps]
        cascade = {c: t("prefix_cascade", *c) for c in cells}
        dense = {c: min(t("prefix_dense", *c), t("prefix_dense_cublas", *c)) for c in cells}
        scores = {}
        for m in sorted({b * g for b in batches}) + [never]:
            ratios = []
            for c in cells:
                best = min(cascade[c], dense[c])
                if math.isfinite(best):
                    ratios.append((dense[c] if c[0] * g >= m else cascade[c]) / best)
            scores[m] = sum(ratios) / max(1, len(ratios))
        best_m = min(scores, key=lambda m: (round(scores[m], 4), m))
        fit["by_g"][g] = best_m
        fit["regret"][g] = {str(m): round(v, 4) for m, v in scores.items()}
    return fit


def bars(bn: Bench, sdpa: dict, ceil: dict) -> dict:
    p = bn.plan
    recs = bn.records

    def find(op, layout, b, length, g=4, **kw):
        xs = [
            r
            for r in recs
            if r["op"] == op
            and r["layout"] == layout
            and r["B"] == b
            and r["Lp"] == length
            and r["g"] == g
            and all(r.get(k) == v for k, v in kw.items())
        ]
        return min(xs, key=lambda r: r["us"]) if xs else None

    hb, hl = p.headline_b, p.headline_lp
    out: dict = {}
    du = find("decode_paged", "unique", hb, hl, table5=True)
    if du:
        out["decode_unique_TBps"] = round(du["kv_GBps"] / 1e3, 3)
        out["cudnn_decode_TBps"] = round(sdpa.get("cudnn", 0.0) / 1e3, 3)
        if sdpa.get("cudnn"):
            out["decode_vs_cudnn"] = round(du["kv_GBps"] / sdpa["cudnn"], 3)
        out["bar_decode_4TBps"] = du["kv_GBps"] >= 4000 and out.get("decode_vs_cudnn", 0) >= 0.9
        prefix = [
            find(op, "shared", hb, hl, table5=True)
            for op in ("prefix_dense", "prefix_dense_cublas", "prefix_cascade")
        ]
        fastest = min((r for r in prefix if r), key=lambda r: r["us"])
        out["fastest_prefix_op"] = fastest["op"]
        out["prefix_speedup_vs_unique"] = round(du["us"] / fastest["us"], 2)
        out["bar_prefix_25x"] = out["prefix_speedup_vs_unique"] >= 25
    cu = find("decode_paged", "unique", p.cascade_b, hl, sweep=True)
    cc = find("prefix_cascade", "shared", p.cascade_b, hl, sweep=True)
    if cu and cc:
        out["cascade_speedup_B32"] = round(cu["us"] / cc["us"], 2)
        out["bar_cascade_4x"] = out["cascade_speedup_B32"] >= 4
    ex = [r for r in recs if r["op"] == "extend"]
    if ex:
        e = min(ex, key=lambda r: r["us"])
        out["extend_TFLOPs"] = e["TFLOPs"]
        out["extend_frac_of_779"] = round(e["TFLOPs"] / 779, 3)
        if ceil["gemm_bf16_TFLOPs"] > 0:
            out["extend_frac_of_measured_gemm"] = round(e["TFLOPs"] / ceil["gemm_bf16_TFLOPs"], 3)
        out["bar_extend_40pct"] = e["TFLOPs"] >= 0.4 * 779
    return out


def write_hardware_yaml(path: Path, fit: dict, source: str) -> str:
    """Replace the m_sat block at the end of the hardware yaml (everything after the marker)."""
    text = path.read_text() if path.exists() else ""
    text = text.split(M_SAT_BEGIN)[0].rstrip("\n") + "\n"
    by_g = fit["by_g"]
    lines = [
        M_SAT_BEGIN,
        f"# fitted from {source}: per GQA ratio g, the M_eff = B*g threshold (dense when",
        "# M_eff >= m_sat, else cascade) with the lowest mean dispatched/best time over the",
        "# B x Lp sweep; a value above every swept M_eff means dense never paid off there.",
        f"m_sat: {by_g.get(4, next(iter(by_g.values())))}  # g = 4 (Llama-3.1-8B), the engine default",
        "m_sat_by_g:",
    ]
    lines += [f"  {g}: {m}" for g, m in sorted(by_g.items())]
    text += "\n".join(lines) + "\n"
    return text


def print_table(bn: Bench, summary: dict) -> None:
    print(f"\n== Table 5 analog (B={bn.plan.headline_b}, Lp={bn.plan.headline_lp}, g=4) ==")
    print(f"{'op':22s} {'layout':13s} {'us':>9s} {'KV GB/s':>9s} {'TFLOP/s':>8s}")
    for r in bn.records:
        if r.get("table5") or (r["op"].startswith("sdpa") and r["B"] == bn.plan.headline_b):
            print(
                f"{r['op']:22s} {r['layout']:13s} {r['us']:9.1f} {r.get('kv_GBps', r['GBps']):9.0f} "
                f"{r['TFLOPs']:8.1f}"
            )
    print("\n== sweep (us per launch) ==")
    for g in bn.plan.gs:
        for length in bn.plan.lps:
            cells = []
            for b in bn.plan.batches:
                xs = {
                    r["op"]: r["us"]
                    for r in bn.records
                    if r.get("sweep") and r["g"] == g and r["Lp"] == length and r["B"] == b
                }
                cells.append(
                    f"B{b}:"
                    + "/".join(
                        f"{xs.get(o, float('nan')):.0f}"
                        for o in ("decode_paged", "prefix_cascade", "prefix_dense", "prefix_dense_cublas")
                    )
                )
            print(f"g={g} Lp={length:5d} decode/cascade/dense/cublas  " + "  ".join(cells))
    print("\n== checks ==")
    for c in bn.checks:
        print(f"{c['op']:34s} rel_err={c['rel_err']:.2e} {'ok' if c['ok'] else 'FAIL'}")
    print("\n== bars ==")
    for k, v in summary["bars"].items():
        print(f"{k}: {v}")
    print(f"m_sat: {summary['m_sat']['by_g']}  regret: {summary['m_sat']['regret']}")


# ---- docs/perf-notes.md: the measured tables are rendered from result files, never typed ----------
NOTES_BEGIN = "<!-- kernels-microbench:begin (generated: python -m harness.microbench.kernels --notes) -->"
NOTES_END = "<!-- kernels-microbench:end -->"
HBM_READ = 4.48e12  # B/s: cuDNN decode reading contiguous KV on an H200 (DESIGN.md §8), the read ceiling
GEMM_PEAK = 779e12  # FLOP/s: bf16 GEMM on an H200 (DESIGN.md §8)


def _floor_us(nbytes: float, flops: float) -> tuple[float, str]:
    tb, tf = nbytes / HBM_READ * 1e6, flops / GEMM_PEAK * 1e6
    return (tb, "bytes") if tb >= tf else (tf, "FLOPs")


def render_notes(result: dict, history: list[tuple[str, dict]]) -> str:
    """Markdown tables of one result file (+ earlier runs) for docs/perf-notes.md."""
    env, ceil, summ, recs = result["env"], result["ceilings"], result["summary"], result["records"]
    bars_ = summ["bars"]
    out = [NOTES_BEGIN, ""]
    out.append(
        f"Run: {env.get('gpu')}, torch {env.get('torch')}, triton {env.get('triton')}, "
        f"git {str(env.get('git_sha'))[:7]}, {env.get('started_at')}; "
        f"file `results/h200/microbench/kernels.json`."
    )
    out += ["", "Ceilings measured in the same run:", "", "| ceiling | value |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in ceil.items()]
    cudnn = max((r.get("kv_GBps", 0) for r in recs if r["op"] == "sdpa_decode_cudnn"), default=0)
    out += [
        "",
        "| bar | target | measured | met |",
        "|---|---|---|---|",
        f"| decode_paged, unique layout, B=256 Lp=8K: K/V read | >= 4.0 TB/s and >= 90% of cuDNN "
        f"({cudnn / 1e3:.2f} TB/s here) | {bars_.get('decode_unique_TBps')} TB/s = "
        f"{bars_.get('decode_vs_cudnn')} x cuDNN | {bars_.get('bar_decode_4TBps')} |",
        f"| fastest prefix pass (shared) vs decode_paged (unique), B=256 Lp=8K | >= 25x | "
        f"{bars_.get('prefix_speedup_vs_unique')}x ({bars_.get('fastest_prefix_op')}) | "
        f"{bars_.get('bar_prefix_25x')} |",
        f"| prefix_cascade vs decode_paged (unique), B=32 Lp=8K | >= 4x | "
        f"{bars_.get('cascade_speedup_B32')}x | {bars_.get('bar_cascade_4x')} |",
        f"| extend, 64 x (16K cached + 256 new) | >= 40% of 779 TFLOP/s | {bars_.get('extend_TFLOPs')} "
        f"TFLOP/s = {bars_.get('extend_frac_of_779')} (of this run's GEMM: "
        f"{bars_.get('extend_frac_of_measured_gemm')}) | {bars_.get('bar_extend_40pct')} |",
    ]

    def pick(op, layout, b, lp, g=4, **kw):
        xs = [
            r
            for r in recs
            if r["op"] == op
            and r["layout"] == layout
            and r["B"] == b
            and r["Lp"] == lp
            and r["g"] == g
            and all(r.get(k) == v for k, v in kw.items())
        ]
        return min(xs, key=lambda r: r["us"]) if xs else None

    out += [
        "",
        "Floors (max of bytes / 4.48 TB/s and FLOPs / 779 TFLOP/s) and achieved fraction "
        "(floor / measured), g = 4:",
        "",
        "| op | layout | B | Lp | bytes (GB) | GFLOP | floor (us) | bound by | measured (us) | achieved |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = [
        pick("decode_paged", "unique", 256, 8192, table5=True),
        pick("decode_paged", "paged-shared", 256, 8192, table5=True),
        pick("prefix_dense", "shared", 256, 8192, table5=True),
        pick("prefix_cascade", "shared", 256, 8192, table5=True),
        pick("prefix_cascade", "paged-shared", 256, 8192, table5=True),
        pick("prefix_dense_cublas", "shared", 256, 8192, table5=True),
        pick("sdpa_prefix_cudnn", "shared", 256, 8192),
        pick("decode_paged", "unique", 32, 8192, sweep=True),
        pick("prefix_cascade", "shared", 32, 8192, sweep=True),
        pick("prefix_cascade", "shared", 8, 16384, sweep=True),
        pick("decode_paged", "unique", 8, 2048, sweep=True),
        pick("extend", "unique", 64, 16384),
    ]
    for r in rows:
        if not r:
            continue
        nbytes = r["GBps"] * r["us"] * 1e3
        flops = r["TFLOPs"] * r["us"] * 1e6
        fl, bound = _floor_us(nbytes, flops)
        out.append(
            f"| {r['op']} | {r['layout']} | {r['B']} | {r['Lp']} | {nbytes / 1e9:.3f} | {flops / 1e9:.1f} | "
            f"{fl:.1f} | {bound} | {r['us']:.1f} | {fl / r['us']:.2f} |"
        )
    base = pick("decode_paged", "unique", 256, 8192, table5=True)
    out += [
        "",
        "Table 5 analog (B=256, Lp=8K, Llama-3.1-8B head; KV GB/s = logical K/V bytes / time):",
        "",
        "| op | layout | us | KV GB/s | TFLOP/s | speedup vs decode_paged unique |",
        "|---|---|---|---|---|---|",
    ]
    for r in recs:
        if r.get("table5") or (r["op"].startswith("sdpa") and r["B"] == 256 and r["Lp"] == 8192):
            sp = f"{base['us'] / r['us']:.2f}" if base else ""
            form = f" ({r['form']})" if r.get("form") else ""
            out.append(
                f"| {r['op']}{form} | {r['layout']} | {r['us']:.1f} | {r.get('kv_GBps', r['GBps']):.0f} | "
                f"{r['TFLOPs']:.1f} | {sp} |"
            )
    for g in sorted({r["g"] for r in recs if r.get("sweep")}):
        out += [
            "",
            f"Sweep, g = {g} (Hq = {8 * g}, Hkv = 8, d = 128): median us per launch "
            "(decode TB/s of K/V; dense TFLOP/s)",
            "",
            "| Lp | B | M_eff | decode_paged | prefix_cascade | prefix_dense | prefix_dense_cublas |",
            "|---|---|---|---|---|---|---|",
        ]
        for lp in sorted({r["Lp"] for r in recs if r.get("sweep")}):
            for b in sorted({r["B"] for r in recs if r.get("sweep")}):
                cell = {
                    r["op"]: r
                    for r in recs
                    if r.get("sweep") and r["g"] == g and r["Lp"] == lp and r["B"] == b
                }
                if not cell:
                    continue
                d = cell.get("decode_paged")
                c = cell.get("prefix_cascade")
                de = cell.get("prefix_dense")
                cu = cell.get("prefix_dense_cublas")
                out.append(
                    f"| {lp} | {b} | {b * g} | {d['us']:.0f} ({d['kv_GBps'] / 1e3:.2f}) | {c['us']:.0f} | "
                    f"{de['us']:.0f} ({de['TFLOPs']:.0f}) | {cu['us']:.0f} |"
                    if d and c and de and cu
                    else f"| {lp} | {b} | {b * g} | incomplete | | | |"
                )
    fit = summ["m_sat"]
    out += [
        "",
        f"M_sat fit ({fit.get('rule')}): m_sat by g = {fit['by_g']}",
        "",
        "| g | candidate M_sat: mean dispatched/best time |",
        "|---|---|",
    ]
    for g, sc in fit.get("regret", {}).items():
        out.append(f"| {g} | " + ", ".join(f"{m}: {v}" for m, v in sc.items()) + " |")
    out += [
        "",
        "Tuning at the headline shapes (best three of each):",
        "",
        "| kernel | us | config | splits |",
        "|---|---|---|---|",
    ]
    for k, rows_ in result.get("tuning", {}).items():
        for x in rows_[:3]:
            c = {
                kk: v
                for kk, v in x["cfg"].items()
                if kk in ("block_m", "block_n", "num_warps", "num_stages", "target_programs", "tma")
            }
            out.append(f"| {k} | {x['us']} | {c} | {x.get('max_splits', '')} |")
    if history:
        out += [
            "",
            "Runs in order (results/h200/microbench/history/):",
            "",
            "| run | git | dense B=256 (us) | cascade B=256 (us) | cascade B=32 (us) | decode unique (TB/s) "
            "| extend (TFLOP/s) | prefix speedup | bars met |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for name, h in history:
            hr = h["records"]

            def hp(op, layout, b, sweep=False, hr=hr):
                xs = [
                    r
                    for r in hr
                    if r["op"] == op
                    and r["layout"] == layout
                    and r["B"] == b
                    and r["Lp"] == 8192
                    and r["g"] == 4
                    and (r.get("sweep") if sweep else r.get("table5"))
                ]
                return min((r["us"] for r in xs), default=float("nan"))

            hb = h.get("summary", {}).get("bars", {})
            met = sum(
                bool(hb.get(k))
                for k in ("bar_decode_4TBps", "bar_prefix_25x", "bar_cascade_4x", "bar_extend_40pct")
            )
            out.append(
                f"| {name} | {str(h['env'].get('git_sha'))[:7]} | "
                f"{hp('prefix_dense', 'shared', 256):.1f} | {hp('prefix_cascade', 'shared', 256):.1f} | "
                f"{hp('prefix_cascade', 'shared', 32, True):.1f} | "
                f"{hb.get('decode_unique_TBps')} | {hb.get('extend_TFLOPs')} | "
                f"{hb.get('prefix_speedup_vs_unique')} | {met}/4 |"
            )
    out += ["", NOTES_END]
    return "\n".join(out)


def write_notes(result_path: str, history_paths: list[str], notes_path: str | None) -> None:
    result = json.loads(Path(result_path).read_text())
    history = [
        (Path(h).stem.removeprefix("kernels."), json.loads(Path(h).read_text())) for h in history_paths
    ]
    block = render_notes(result, history)
    if not notes_path:
        print(block)
        return
    path = Path(notes_path)
    text = path.read_text()
    if NOTES_BEGIN not in text or NOTES_END not in text:
        raise SystemExit(f"{notes_path} has no generated-block markers")
    head, rest = text.split(NOTES_BEGIN, 1)
    tail = rest.split(NOTES_END, 1)[1]
    path.write_text(head + block + tail)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="result JSON (default results/h200/microbench/kernels.json)")
    ap.add_argument("--hardware-yaml", default=None, help="hardware yaml whose m_sat block to rewrite")
    ap.add_argument("--yaml-out", default=None, help="write the updated yaml here instead of in place")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes; runs on CPU under the interpreter")
    ap.add_argument(
        "--notes", default=None, metavar="RESULT_JSON", help="render the perf-notes tables of a result"
    )
    ap.add_argument("--history", nargs="*", default=[], help="earlier result files, in order (with --notes)")
    ap.add_argument("--notes-into", default=None, help="replace the generated block of this markdown file")
    args = ap.parse_args(argv)
    if args.notes:
        write_notes(args.notes, args.history, args.notes_into)
        return 0
    smoke = args.smoke or not torch.cuda.is_available()
    if smoke and not args.smoke:
        print("no CUDA device: running the smoke plan (numbers are not measurements)")
    plan = SMOKE if smoke else FULL
    out_path = Path(
        args.out or ("/tmp/kernels-smoke.json" if smoke else "results/h200/microbench/kernels.json")
    )
    t0 = time.time()
    bn = Bench(plan, smoke)
    env = env_info()
    ceil = ceilings(bn)
    best = tune(bn)
    print(f"best: { {k: (asdict(v) if hasattr(v, '__dataclass_fields__') else v) for k, v in best.items()} }")
    partial = {"env": env, "ceilings": ceil, "records": bn.records, "checks": bn.checks, "tuning": bn.tuning}

    def save(stage: str) -> None:  # keep what is measured if the run is cut short
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps({**partial, "stage": stage}, indent=1) + "\n")

    save("tuned")
    sdpa = sdpa_refs(bn, 4)
    table5(bn, best)
    ext = extend_setup(bn)
    fn = ext["make"](best["extend"])
    fn()
    bn.check_extend(ext["out"], ext["q"], ext["table"], ext["indptr"], plan.ext_prefix, [0, plan.ext_n - 1])
    t = bn.time(fn)
    if t:
        rec = bn.record(
            "extend",
            "unique",
            plan.ext_n,
            plan.ext_prefix,
            4,
            t,
            ext["nbytes"],
            ext["flops"],
            new_tokens=plan.ext_new,
            cfg=asdict(best["extend"]),
        )
        print(f"extend: {t.us:.0f} us, {rec['TFLOPs']:.0f} TFLOP/s", flush=True)
    del ext, fn
    save("table5")
    sweep(bn, best)
    fit = fit_m_sat(bn.records, plan.gs, plan.lps, plan.batches)
    summary = {
        "bars": bars(bn, sdpa, ceil),
        "m_sat": fit,
        "best_configs": {
            k: (asdict(v) if hasattr(v, "__dataclass_fields__") else v) for k, v in best.items()
        },
        "default_configs": {
            "decode": asdict(DecodeConfig()),
            "cascade": asdict(CASCADE_CONFIG),
            "dense": asdict(DENSE_CONFIG),
            "extend": asdict(ExtendConfig()),
        },
        "wall_s": round(time.time() - t0, 1),
    }
    result = {
        "env": env,
        "ceilings": ceil,
        "summary": summary,
        "checks": bn.checks,
        "tuning": bn.tuning,
        "records": bn.records,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1) + "\n")
    if args.hardware_yaml:
        src = Path(args.hardware_yaml)
        text = write_hardware_yaml(src, fit, "results/h200/microbench/kernels.json")
        Path(args.yaml_out or src).write_text(text)
    print_table(bn, summary)
    print(f"\nwrote {out_path} ({len(bn.records)} records) in {time.time() - t0:.0f} s")
    return 0 if all(c["ok"] for c in bn.checks) else 1


if __name__ == "__main__":
    sys.exit(main())
