"""Prefix-pass rule sweep: does a pass kind pay for itself by its launch's total saved bytes?

    python -m harness.microbench.prefix_rule --budget-s 240        # H200: results/h200/microbench/prefix-rule.json
    python -m harness.microbench.prefix_rule --smoke [--out PATH]  # CPU, Triton interpreter: the script runs

Why: every class of one pass kind runs in one launch (AttentionBackend.forward: zero-init of
o/lse, one prefix kernel over all classes, one LSE merge), so the fixed cost a pass must pay for
is per kind, not per class, and the dispatcher (granikv/attention/dispatch.py) sums the avoided
re-reads over a launch's classes: 64 classes of 4 requests at Lp = 8K avoid 6 GiB of reads per
layer together though each avoids only 96 MiB. Whether the total decides a win, and where the
threshold lies, is what this sweep measures. This sweep times, for one Llama-3.1-8B
layer (Hq = 32, Hkv = 8, d = 128, bf16), C classes of n requests sharing an Lp-token prefix
(B = C*n <= 512; each request also has its own suffix of S ~ U[64, 512] tokens in random
16-slot pages), the plain path (every request reads its whole context through its slot-table
row) against what the dispatcher would launch (the suffix decode from Lp + the prefix pass over
all C classes + the merge), each timed as one CUDA graph with L2 flushed per replay. Forms:
"slab" (each class's prefix is a HOT slab; dense or cascade as `DispatchPolicy.choose` picks
at the hardware's m_sat) and "rows" (a COLD run in random pages the class shares, read through
a member's slot-table row by the cascade kernel). The fit (`fit_rule`) gives the threshold on
the total saved MiB above which every measured point wins, a least-squares break-even per form,
and how many points the per-class and the total rule each misclassify at their best threshold.
Rendered by `harness.microbench.prefix_rule_report`. Every pass output is checked against the
plain output before it is timed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Plan:
    cs: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    ns: tuple[int, ...] = (2, 4, 8, 32)
    lps: tuple[int, ...] = (512, 1024, 2048, 4096, 8192)
    forms: tuple[str, ...] = ("slab", "rows")
    max_b: int = 512
    s_lo: int = 64  # suffix tokens per request ~ U[s_lo, s_hi]
    s_hi: int = 512
    hq: int = 32
    hkv: int = 8
    d: int = 128
    page: int = 16
    dtype: str = "bfloat16"
    spread: int = 4  # the random-page region is this many times the most pages one point uses
    rep_ms: int = 30
    warmup_ms: int = 10
    m_sat: int | None = None  # None: the hardware yaml's fitted m_sat for g = hq / hkv


FULL = Plan()
# tiny shapes for the interpreter; m_sat 16 makes n = 4 (M_eff = 16) dense and n = 2 cascade
SMOKE = Plan(cs=(1, 2), ns=(2, 4), lps=(32,), s_lo=3, s_hi=20, hq=4, hkv=1, d=32, dtype="float32",
             rep_ms=1, warmup_ms=1, m_sat=16)
TOL = {"bfloat16": (2e-2, 2e-3, 1e-2), "float16": (1e-2, 1e-3, 5e-3), "float32": (1e-4, 1e-5, 1e-4)}  # rtol, atol, rel


def grid(plan: Plan) -> list[tuple[int, int, int, str]]:
    """(C, n, Lp, form) points, B = C * n <= max_b; both forms of a (C, n, Lp) back to back."""
    return [(c, n, lp, f) for lp in plan.lps for n in plan.ns for c in plan.cs for f in plan.forms
            if c * n <= plan.max_b]


def kv_token_bytes(plan: Plan) -> int:
    """K+V bytes of one token in one layer (4096 for Llama-3.1-8B in bf16)."""
    return 2 * plan.hkv * plan.d * getattr(torch, plan.dtype).itemsize


class Space:
    """One layer's slot space: HOT slabs back to back from slot 16 (slot 0 is the dummy), then
    16-slot pages drawn at random from a region `spread` times larger than any point needs."""

    def __init__(self, plan: Plan, dev: torch.device):
        self.plan, self.dev = plan, dev
        p = plan
        pts = grid(p)
        self.slab_first = p.page
        slab_tokens = max(c * lp for c, _, lp, _ in pts)
        s_pages = -(-p.s_hi // p.page)
        need = max(c * lp // p.page + c * n * s_pages for c, n, lp, _ in pts)
        self.first_page = -(-(self.slab_first + slab_tokens) // p.page)
        self.num_pages = p.spread * need
        slots = (self.first_page + self.num_pages) * p.page
        dt = getattr(torch, p.dtype)
        gen = torch.Generator(device=dev).manual_seed(0)
        self.k = torch.randn(slots, p.hkv, p.d, device=dev, dtype=dt, generator=gen)
        self.v = torch.randn(slots, p.hkv, p.d, device=dev, dtype=dt, generator=gen)
        print(f"slot space: {slots} slots, {2 * self.k.numel() * self.k.element_size() / 1e9:.1f} GB of K/V",
              flush=True)

    def point(self, c: int, n: int, lp: int, form: str) -> dict:
        """Tensors of one point: class j holds requests j, j + C, j + 2C, ... (a mixed batch)."""
        from granikv.kernels import PrefixClasses

        p, dev = self.plan, self.dev
        if lp % p.page:
            raise ValueError(f"Lp {lp} is not a multiple of the page size {p.page}")
        b = c * n
        seed = (c * 131 + n) * 100_003 + lp  # the same suffixes and pages for both forms
        host = torch.Generator().manual_seed(seed)
        suffix = torch.randint(p.s_lo, p.s_hi + 1, (b,), generator=host)
        gen = torch.Generator(device=dev).manual_seed(seed)
        pp, sp = lp // p.page, -(-p.s_hi // p.page)
        perm = torch.randperm(self.num_pages, device=dev, generator=gen)[: c * pp + b * sp] + self.first_page
        within = torch.arange(p.page, device=dev)
        if form == "slab":
            bases = [self.slab_first + j * lp for j in range(c)]
            prefix = torch.tensor(bases, device=dev)[:, None] + torch.arange(lp, device=dev)[None, :]
        else:
            prefix = (perm[: c * pp].view(c, pp, 1) * p.page + within).reshape(c, lp)
        own = (perm[c * pp:].view(b, sp, 1) * p.page + within).reshape(b, sp * p.page)[:, : p.s_hi]
        cls = torch.arange(b, device=dev) % c
        table = torch.cat([prefix[cls], own], dim=1).to(torch.int32).contiguous()
        members = [list(range(j, b, c)) for j in range(c)]
        if form == "slab":
            classes = PrefixClasses.from_lists(members, [lp] * c, dev, slab_base=bases)
        else:
            classes = PrefixClasses.from_lists(members, [lp] * c, dev, page_rows=list(range(c)), slot_table=table)
        i32 = {"dtype": torch.int32, "device": dev}
        suffix = suffix.to(**i32)
        q = torch.randn(b, p.hq, p.d, device=dev, dtype=self.k.dtype, generator=gen)
        return {"q": q, "table": table, "rows": torch.arange(b, **i32), "zero": torch.zeros(b, **i32),
                "seq_len": suffix + lp, "start": torch.full((b,), lp, **i32), "suffix": suffix,
                "classes": classes}


def pass_kind(plan: Plan, m_sat: int, n: int, lp: int, form: str) -> str:
    """What the dispatcher launches for such classes once they take a pass: dense or cascade
    (slab, by M_eff = n * g against m_sat) or rows (COLD runs, always the cascade kernel)."""
    from granikv.attention.dispatch import DispatchPolicy
    from granikv.attention.plan import ROWS

    if form == "rows":
        return ROWS
    # min_prefix_len 0: the bench takes the pass at every Lp; only dense vs cascade is asked
    return DispatchPolicy(group_size=plan.hq // plan.hkv, m_sat=m_sat, min_prefix_len=0).kind(n, lp)


def closures(space: Space, pt: dict, kind: str):
    """(plain, pass) callables; each is one graph-capturable sequence returning (o, lse)."""
    from granikv.attention.ops import KernelOps
    from granikv.attention.plan import DENSE

    ops = KernelOps("triton")
    k, v, sm = space.k, space.v, space.plan.d ** -0.5
    q, table, rows = pt["q"], pt["table"], pt["rows"]
    prefix = ops.prefix_dense if kind == DENSE else ops.prefix_cascade

    def plain():
        return ops.decode(q, k, v, table, rows, pt["zero"], pt["seq_len"], sm)

    def with_pass():
        o, lse = ops.decode(q, k, v, table, rows, pt["start"], pt["suffix"], sm)
        op, lp = prefix(q, k, v, pt["classes"], sm)
        ops.merge_(o, lse, op, lp)
        return o, lse

    return plain, with_pass


def check(plain, with_pass, dtype: str) -> dict:
    """The pass output against the plain output (same inputs): allclose and relative L2 error."""
    rtol, atol, rel_max = TOL[dtype]
    o1, l1 = (x.float() for x in plain())
    o2, l2 = (x.float() for x in with_pass())
    rel = ((o2 - o1).norm() / o1.norm().clamp_min(1e-30)).item()
    lse_err = (l2 - l1).abs().max().item()
    ok = bool(torch.allclose(o2, o1, rtol=rtol, atol=atol)) and rel < rel_max and lse_err < 1e-2
    ok = ok and not bool(torch.isnan(o2).any() or torch.isnan(l2).any())
    return {"rel_err": rel, "lse_abs_err": lse_err, "ok": ok}


def measure(plan: Plan, m_sat: int, budget_s: float | None, save=None) -> tuple[list[dict], dict]:
    """Time every grid point (until the budget runs out); returns (records, run status)."""
    from harness.microbench._timing import bench

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.time()
    space = Space(plan, dev)
    kv_tok = kv_token_bytes(plan)
    pts = grid(plan)
    records: list[dict] = []
    status = {"points": len(pts), "measured": 0, "complete": True, "failed_checks": 0, "errors": 0}
    for i, (c, n, lp, form) in enumerate(pts):
        if budget_s is not None and time.time() - t0 > budget_s:
            status["complete"] = False
            print(f"prefix_rule: budget of {budget_s:.0f} s reached after {i} of {len(pts)} points; "
                  "writing what was measured", flush=True)
            break
        kind = pass_kind(plan, m_sat, n, lp, form)
        pt = space.point(c, n, lp, form)
        plain, with_pass = closures(space, pt, kind)
        try:
            chk = check(plain, with_pass, plan.dtype)
        except Exception as exc:  # a launch the compiler or the device rejects
            chk = {"rel_err": None, "lse_abs_err": None, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
        per_class = (n - 1) * lp * kv_tok / 2**20
        rec = {"C": c, "n": n, "Lp": lp, "form": form, "B": c * n, "kind": kind,
               "suffix_tokens": int(pt["suffix"].sum()), "saved_mib_total": c * per_class,
               "saved_mib_per_class": per_class, "check": chk}
        tp = tw = None
        if chk["ok"]:
            try:
                tp = bench(plain, rep_ms=plan.rep_ms, warmup_ms=plan.warmup_ms)
                tw = bench(with_pass, rep_ms=plan.rep_ms, warmup_ms=plan.warmup_ms)
            except Exception as exc:
                rec["error"] = f"{type(exc).__name__}: {exc}"[:300]
                if dev.type == "cuda":
                    torch.cuda.synchronize()
        if tp is not None and tw is not None:
            rec.update(t_plain_us=round(tp.us, 2), t_pass_us=round(tw.us, 2), gain_us=round(tp.us - tw.us, 2),
                       plain_p20_p80_us=[round(tp.p20_us, 2), round(tp.p80_us, 2)],
                       pass_p20_p80_us=[round(tw.p20_us, 2), round(tw.p80_us, 2)], graphed=tp.graphed and tw.graphed)
            line = (f"plain {tp.us:8.1f} us  pass {tw.us:8.1f} us  gain {tp.us - tw.us:+8.1f} us")
        else:  # never time a wrong plan
            status["failed_checks"] += not chk["ok"] and "error" not in chk
            status["errors"] += "error" in chk or "error" in rec
            rec.update(t_plain_us=None, t_pass_us=None, gain_us=None)
            line = ("not timed: " + (rec.get("error") or chk.get("error") or
                                     f"check FAILED, rel err {chk['rel_err']:.2e}, lse {chk['lse_abs_err']:.2e}"))
        records.append(rec)
        status["measured"] = len(records)
        print(f"[{i + 1:3}/{len(pts)}] {form:4} C={c:2} n={n:2} Lp={lp:5} B={c * n:3} {kind:7} {line}  "
              f"saved {c * per_class:7.4g} MiB ({time.time() - t0:.0f} s)", flush=True)
        del pt, plain, with_pass
        if save is not None and (i + 1) % 16 == 0:
            save(records, {**status, "complete": False})
    status["wall_s"] = round(time.time() - t0, 1)
    return records, status


# ---- the run -------------------------------------------------------------------------------------
def hardware_name(gpu: str | None) -> str | None:
    return "h200" if gpu and "H200" in gpu.upper() else None


def yaml_m_sat(hw: str, g: int) -> int:
    """The fitted m_sat for group size g from conf/hardware/<hw>.yaml (m_sat_by_g, else m_sat)."""
    import yaml

    doc = yaml.safe_load((ROOT / "conf" / "hardware" / f"{hw}.yaml").read_text())
    by_g = doc.get("m_sat_by_g") or {}
    got = by_g.get(g, by_g.get(str(g), doc.get("m_sat")))
    if not isinstance(got, int):
        raise ValueError(f"conf/hardware/{hw}.yaml has no m_sat for g = {g}")
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, float32; on CPU under Triton's interpreter")
    ap.add_argument("--out", default=None, help="result JSON (default results/<hw>/microbench/prefix-rule.json "
                    "on an H200; nothing is written on a smoke run without it)")
    ap.add_argument("--budget-s", type=float, default=None, help="stop starting new points after this many s")
    ap.add_argument("--rep-ms", type=int, default=None, help="timed replays per bench, ms (default 30)")
    ap.add_argument("--m-sat", type=int, default=None, help="dense when n * g >= this (default: hardware yaml)")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda:
        if not args.smoke:
            print("prefix_rule: no CUDA device (--smoke runs tiny shapes on the CPU)", file=sys.stderr)
            return 2
        if "triton" not in sys.modules:  # Triton reads it on import
            os.environ.setdefault("TRITON_INTERPRET", "1")
        if os.environ.get("TRITON_INTERPRET") != "1":
            print("prefix_rule: run the CPU smoke plan under TRITON_INTERPRET=1", file=sys.stderr)
            return 2
    gpu = torch.cuda.get_device_name(0) if cuda else None
    hw = hardware_name(gpu)
    out = args.out
    if out is None and not args.smoke:
        if hw is None:
            print(f"prefix_rule: no result path for GPU {gpu!r}; give --out", file=sys.stderr)
            return 2
        out = f"results/{hw}/microbench/prefix-rule.json"
    plan = SMOKE if args.smoke else FULL
    if args.rep_ms is not None:
        plan = Plan(**{**asdict(plan), "rep_ms": args.rep_ms})
    m_sat = args.m_sat or plan.m_sat or yaml_m_sat(hw or "h200", plan.hq // plan.hkv)
    if not cuda:
        print("CPU smoke run (Triton interpreter, wall clock): the numbers are not measurements")
    from harness.microbench._timing import env_info, write_result
    from harness.microbench.prefix_rule_report import fit_rule, overlap_lines, render_doc

    env = env_info()
    config = {**asdict(plan), "m_sat": m_sat, "smoke": args.smoke, "budget_s": args.budget_s,
              "kv_token_bytes": kv_token_bytes(plan), "hardware": hw}

    def save(records, status, fit=None):
        if out:
            write_result(out, config, records, env, status=status, fit=fit)

    records, status = measure(plan, m_sat, args.budget_s, save)
    fit = fit_rule(records)
    save(records, status, fit)
    doc = {"env": env, "config": config, "records": records, "status": status, "fit": fit}
    print(render_doc(doc))
    print("\n".join(overlap_lines(records, fit)))
    print(f"prefix_rule: {len(records)} of {status['points']} points in {status['wall_s']} s, "
          f"{status['failed_checks']} failed checks, {status['errors']} launch errors")
    return 1 if status["failed_checks"] or status["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
