"""`python -m harness.run.workloads`: generate a workload file from the command line.

Every WorkloadConfig field is a flag (`--lp 8192`, `--levels 1x4096,4x4096,4x2048`); a flag left
out takes the kind's default, so the file is the one a cell with the same values reads.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from harness.run.workloads.build import write
from harness.run.workloads.config import KINDS, WorkloadConfig
from harness.run.workloads.naming import workload_filename


def _parse_field(f: dataclasses.Field, text: str) -> Any:
    if text.lower() in ("none", "null", ""):
        if f.name in ("tokenizer_path", "vocab_size", "dataset_path"):
            return None
        if f.name in ("lps", "levels"):
            return ()
    if f.name == "lps":
        return tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    if f.name == "levels":  # "1x4096,4x4096,4x2048" (fanout x length per level, root first)
        return tuple(tuple(int(v) for v in lv.split("x")) for lv in text.replace(" ", "").split(",") if lv)
    if f.name == "jitter":
        return float(text)
    if f.name == "vocab_size":
        return int(text)
    if f.type in ("int", int):
        return int(text)
    return text


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m harness.run.workloads",
        description="Generate a workload file of token ids (see harness/run/workloads/).",
    )
    ap.add_argument("--kind", choices=KINDS, default="sharegpt")
    for f in fields(WorkloadConfig):
        if f.name == "kind":
            continue
        ap.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None,
                        help=f"default: the kind's ({f.default!r} unless the kind overrides it)")
    ap.add_argument("--out", default=None, help="output file (default: <out-dir>/<derived name>)")
    ap.add_argument("--out-dir", default="workloads")
    ap.add_argument("--print-name", action="store_true", help="print the derived file name and exit")
    args = ap.parse_args(argv)
    overrides = {
        f.name: _parse_field(f, getattr(args, f.name))
        for f in fields(WorkloadConfig)
        if f.name != "kind" and getattr(args, f.name) is not None
    }
    cfg = WorkloadConfig.for_kind(args.kind, **overrides)
    name = workload_filename(cfg)
    if args.print_name:
        print(name)
        return 0
    out = Path(args.out) if args.out else Path(args.out_dir) / name
    write(cfg, out)
    print(out)
    return 0
