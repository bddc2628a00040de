"""Nsight Compute counters of the attention layouts of Table 5 (Table 23, Figure 1).

Table 23 explains the kernel speedup of Table 5 in hardware terms: the same dense prefix kernel
reads the prefix from DRAM about once on the shared (HOT slab) layout and B times on the unique
(one private copy per request) layout. We run a target program under
`ncu --clock-control none` (boost clocks, as the timed microbench runs; ncu would otherwise lock
base clocks and slow every kernel), capture the named kernels, read ncu's raw CSV page and turn
each captured launch into a `microbench/ncu.json` record (harness/report/tables/):
`{op, layout, B, Lp, kernel, dram_bytes_read, byte_model_bytes, l2_hit_rate_pct,
tensor_pipe_active_pct, waves_per_sm, wall_us, useful_flops}`.

Captures (`--layouts`, all by default; `CAPTURES`):
- `shared`: `prefix_dense` over one class of B requests reading the HOT slab (`_prefix_kernel`);
- `unique`: the same kernel and config over B one-request classes, each reading its own
  contiguous copy of the prefix (`_prefix_kernel`, the paper's "unique (paged)" column);
- `unique-decode`: our paged decode, `decode_paged` over per-request pages (`_decode_kernel`),
  layout `unique` too; Table 23 shows it as rows of its own, not the paper's experiment.
A record's `op` (`prefix_dense` or `decode_paged`) tells the two unique captures apart; records
written before `op` existed carry only `kernel`, from which `op_of` derives it.

The byte model is the minimum K/V the layout must read (unique: every request's Lp tokens;
shared: the prefix once); `useful_flops` is QK^T + PV over the prefix, 4·B·Hq·d·Lp per layer.
Parsing and command construction are host-only; the capture needs a GPU and ncu.

    python -m harness.microbench.ncu --out results/h200/microbench/ncu.json        # on the GPU host, ncu on PATH

By default the target is this module itself (`--launch-table5`): the Table 5 shape (B=256,
Lp=8K, Llama head) with the engine's launch configs (`DENSE_CONFIG`, the split count of
`prefix_max_splits` for each class list; the default `DecodeConfig`), warm-up launches skipped
in ncu.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import io
import json
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

DRAM = "dram__bytes_read.sum"
L2_HIT = "lts__t_sector_hit_rate.pct"
TENSOR = "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"
WAVES = "launch__waves_per_multiprocessor"
DURATION = "gpu__time_duration.sum"
METRICS = (DRAM, L2_HIT, TENSOR, WAVES, DURATION)



@dataclass(frozen=True)
class Capture:
    """One capture: the op launched, the storage layout it reads, the kernel ncu records."""

    op: str
    layout: str
    kernel_regex: str


# the Triton kernels of each capture (granikv/kernels): the dense prefix pass runs
# prefix_cascade's `_prefix_kernel` on both layouts; the paged decode runs decode_paged's
# `_decode_kernel`. Anchored: ncu's regex is a search, and `_combine_prefix_kernel` (the split-K
# combine) would otherwise take launches of the count meant for the prefix pass itself.
PREFIX_KERNEL = "^_prefix_kernel$"
DECODE_KERNEL = "^_decode_kernel$"
CAPTURES = {
    "shared": Capture("prefix_dense", "shared", PREFIX_KERNEL),
    "unique": Capture("prefix_dense", "unique", PREFIX_KERNEL),
    "unique-decode": Capture("decode_paged", "unique", DECODE_KERNEL),
}
LAYOUT_KERNELS = {name: c.kernel_regex for name, c in CAPTURES.items()}
# the op of a record that names only its kernel (ncu.json written before records carried `op`)
OP_OF_KERNEL = {"_prefix_kernel": "prefix_dense", "_decode_kernel": "decode_paged"}


def op_of(record: dict) -> str | None:
    """The op a ncu.json record measured: its `op`, else the one its `kernel` belongs to."""
    op = record.get("op")
    if isinstance(op, str) and op:
        return op
    kernel = record.get("kernel")
    return OP_OF_KERNEL.get(kernel) if isinstance(kernel, str) else None

_SCALE = {  # ncu units -> base unit (bytes, microseconds for time)
    "": 1.0, "byte": 1.0, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
    "nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6,
    "%": 1.0, "pct": 1.0,
}


class NcuError(RuntimeError):
    """ncu is missing, failed, or wrote something we cannot read."""


def ncu_command(python_args: Sequence[str], kernel_regex: str, out_csv: str | Path, launch_skip: int = 0,
                launch_count: int = 1, metrics: Sequence[str] = METRICS, ncu: str = "ncu") -> list[str]:
    """The ncu command line that profiles `launch_count` launches (after `launch_skip`) of kernels
    whose name matches `kernel_regex` in `python <python_args>` and writes the raw CSV page to
    `out_csv`. `--print-units base` keeps bytes in bytes and time in ns (no auto-scaling)."""
    return [
        ncu, "--clock-control", "none", "--metrics", ",".join(metrics), "--kernel-name-base", "function",
        "--kernel-name", f"regex:{kernel_regex}", "--launch-skip", str(launch_skip),
        "--launch-count", str(launch_count), "--csv", "--page", "raw", "--print-units", "base",
        "--log-file", str(out_csv), sys.executable, *python_args,
    ]


def _number(text: str) -> float | None:
    t = text.strip().replace(",", "")
    if t in ("", "n/a", "N/A"):
        return None
    try:
        return float(t)
    except ValueError:
        return None


def _csv_rows(text: str) -> list[list[str]]:
    """CSV rows from the first one that starts with "ID" (ncu prints ==PROF== lines around it)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise NcuError("no ncu CSV header (a line starting with \"ID\") in the output")
    rows = list(csv.reader(io.StringIO("\n".join(ln for ln in lines[start:] if not ln.startswith("==")))))
    return [r for r in rows if r]


def parse_csv(text: str) -> list[dict]:
    """One dict per profiled kernel launch: `id`, `kernel`, and every metric as a float in base
    units (bytes, us for durations, % as is). Accepts the raw page (a header row of metric names,
    a units row, one row per launch) and the details page (one row per launch and metric:
    "ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value")."""
    rows = _csv_rows(text)
    header = rows[0]
    if "Metric Name" in header:
        return _parse_details(header, rows[1:])
    body = rows[1:]
    units = [""] * len(header)
    if body and body[0][0].strip() == "":  # the raw page's units row ("ID" column empty)
        units, body = body[0], body[1:]
    col = {name: i for i, name in enumerate(header)}
    if "Kernel Name" not in col:
        raise NcuError(f"ncu CSV without a Kernel Name column: {header[:8]}")
    out = []
    for r in body:
        d = {"id": int(_number(r[col["ID"]]) or 0), "kernel": r[col["Kernel Name"]]}
        for name, i in col.items():
            if "__" in name and i < len(r):
                v = _number(r[i])
                if v is not None:
                    d[name] = v * _SCALE.get(units[i].strip().lower(), 1.0)
        out.append(d)
    return out


def _parse_details(header: list[str], body: list[list[str]]) -> list[dict]:
    col = {name: i for i, name in enumerate(header)}
    by_id: dict[int, dict] = {}
    for r in body:
        rid = int(_number(r[col["ID"]]) or 0)
        d = by_id.setdefault(rid, {"id": rid, "kernel": r[col["Kernel Name"]]})
        v = _number(r[col["Metric Value"]])
        if v is not None:
            d[r[col["Metric Name"]]] = v * _SCALE.get(r[col["Metric Unit"]].strip().lower(), 1.0)
    return [by_id[k] for k in sorted(by_id)]


def _tensor(row: dict) -> float | None:
    if TENSOR in row:
        return row[TENSOR]
    # another tensor-pipe metric asked on the command line (e.g. hmma/gmma-specific names)
    return next((v for k, v in row.items() if k.startswith("sm__pipe_tensor")), None)


def to_records(rows: Sequence[dict], layout: str, useful_flops: float, byte_model_bytes: float,
               **extra) -> list[dict]:
    """`microbench/ncu.json` records (one per captured launch) from `parse_csv` rows."""
    recs = []
    for r in rows:
        recs.append({
            "layout": layout, "kernel": r.get("kernel"), "dram_bytes_read": r.get(DRAM),
            "byte_model_bytes": byte_model_bytes, "l2_hit_rate_pct": r.get(L2_HIT),
            "tensor_pipe_active_pct": _tensor(r), "waves_per_sm": r.get(WAVES), "wall_us": r.get(DURATION),
            "useful_flops": useful_flops, **extra,
        })
    return recs


@dataclass(frozen=True)
class Shape:
    """One attention layer of the Table 5 cell (Llama-3.1-8B head: Hq=32, Hkv=8, d=128, bf16)."""

    b: int = 256
    lp: int = 8192
    hq: int = 32
    hkv: int = 8
    d: int = 128
    elt: int = 2

    def useful_flops(self) -> float:
        return 4.0 * self.b * self.hq * self.d * self.lp

    def byte_model(self, layout: str) -> float:
        kv_tok = 2 * self.hkv * self.d * self.elt
        return float(self.lp * kv_tok * (self.b if layout == "unique" else 1))


def capture(target: str, name: str, what: Capture, shape: Shape, workdir: Path, launch_skip: int,
            launch_count: int, ncu: str = "ncu") -> list[dict]:
    """Run `python -m <target>` under ncu for one capture's kernel; its records."""
    if shutil.which(ncu) is None:
        raise NcuError(f"{ncu!r} (Nsight Compute) is not installed or not on PATH; nothing to capture")
    out_csv = workdir / f"ncu-{name}.csv"
    argv = ncu_command(["-m", *shlex.split(target)], what.kernel_regex, out_csv, launch_skip, launch_count, ncu=ncu)
    print("+", shlex.join(argv), flush=True)
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise NcuError(f"ncu exited with {proc.returncode}:\n{proc.stderr[-2000:]}")
    rows = parse_csv(out_csv.read_text())
    if not rows:
        raise NcuError(f"ncu captured no launch of {what.kernel_regex!r} in {target!r}")
    return to_records(rows, what.layout, shape.useful_flops(), shape.byte_model(what.layout), op=what.op,
                      capture=name, B=shape.b, Lp=shape.lp)


def launch_table5(layouts: Sequence[str], warmup: int, repeats: int, smoke: bool = False) -> None:
    """The capture target: the Table 5 cell's kernels with the engine's launch shapes (the dense
    prefix pass: `DENSE_CONFIG`, over the HOT slab (`shared`) or over B one-request classes each
    reading its own copy of the prefix (`unique`), the split count `prefix_max_splits` picks for
    each class list; the paged decode over per-request pages (`unique-decode`): the default
    `DecodeConfig`), `warmup` untimed launches (JIT compile) then `repeats` more.
    Skip `warmup` launches in ncu (`--launch-skip`). Reuses the kernel microbench's inputs."""
    import torch

    from granikv.kernels.decode_paged import DecodeConfig
    from granikv.kernels.prefix_dense import DENSE_CONFIG
    from harness.microbench.kernel_bench import FULL, SMOKE, Bench

    bn = Bench(SMOKE if smoke else FULL, smoke)
    b, length = bn.plan.headline_b, bn.plan.headline_lp
    q = bn.q(b, 4)
    fns = {"shared": lambda: bn.prefix_fn("prefix_dense", q, length, DENSE_CONFIG),
           "unique": lambda: bn.prefix_fn("prefix_dense", q, length, DENSE_CONFIG,
                                          slab_bases=bn.unique_slab_bases(b, length)),
           "unique-decode": lambda: bn.decode_fn(q, bn.unique_table(b, length), length, DecodeConfig())}
    for name in layouts:
        fn, splits = fns[name]()
        for _ in range(warmup + repeats):
            fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        print(f"launched {name}: B={b} Lp={length} max_splits={splits}, {warmup} warm-up + {repeats} launches",
              flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None,
                    help="python module (and its arguments) that launches the kernels at the Table 5 shape "
                         "(default: this module's --launch-table5)")
    ap.add_argument("--layouts", nargs="+", default=list(CAPTURES), choices=list(CAPTURES),
                    help="captures to run (default: all): shared and unique = prefix_dense on either layout "
                         "(Table 23's columns), unique-decode = decode_paged on the unique layout (its extra rows)")
    ap.add_argument("--launch-skip", type=int, default=None,
                    help="matching launches to skip (default: --warmup with the default target, else 0)")
    ap.add_argument("--launch-count", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3, help="(--launch-table5) untimed launches per layout")
    ap.add_argument("--launch-table5", action="store_true",
                    help="be the capture target: launch the --layouts kernels at the Table 5 shape and exit")
    ap.add_argument("--smoke", action="store_true", help="(--launch-table5) tiny shapes, CPU interpreter")
    ap.add_argument("--batch", type=int, default=Shape.b)
    ap.add_argument("--lp", type=int, default=Shape.lp)
    ap.add_argument("--ncu", default="ncu", help="the ncu executable")
    ap.add_argument("--workdir", default="/tmp/granikv-ncu")
    ap.add_argument("--out", default="results/h200/microbench/ncu.json")
    args = ap.parse_args(argv)
    if args.launch_table5:
        launch_table5(args.layouts, args.warmup, args.launch_count, args.smoke)
        return 0
    skip = args.launch_skip if args.launch_skip is not None else (args.warmup if args.target is None else 0)
    shape = Shape(b=args.batch, lp=args.lp)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    records: list[dict] = []
    try:
        for name in args.layouts:
            target = args.target or (f"harness.microbench.ncu --launch-table5 --layouts {name} --warmup {args.warmup} "
                                     f"--launch-count {args.launch_count}")
            records += capture(target, name, CAPTURES[name], shape, workdir, skip, args.launch_count, args.ncu)
    except NcuError as e:
        print(f"ncu capture failed: {e}", file=sys.stderr)
        return 2
    from harness.microbench._timing import env_info

    doc = {"env": {**env_info(), "started_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")},
           "target": args.target or "harness.microbench.ncu --launch-table5", "metrics": list(METRICS),
           "records": records}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(records)} records -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
