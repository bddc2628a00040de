"""NCCL all-reduce between the GPUs of one host: the floor for a TP decode step's all-reduces.

A TP decode step all-reduces the row-parallel outputs twice per layer (attention o_proj and the
MLP's down_proj): messages of B x hidden bf16 values. The TP all-reduce bar compares the step's
measured all-reduce time (harness.run.profile's `nccl_ms` of a TP cell) with these bytes over the
GPU-to-GPU bandwidth measured here.

For each message size, one process per GPU all-reduces a bf16 tensor `--iters` times between
CUDA events (after warm-up); the record has the median per-call time, the algorithm bandwidth
(bytes / time) and the bus bandwidth (algbw x 2(n-1)/n, NCCL's convention: what each link
carries). `peak_busbw_GBps` is the best bus bandwidth over the large sizes.

    python -m harness.microbench.allreduce --world 2 --out results/h200/microbench/allreduce-tp2.json

`--engine-cell <TP cell result with a profile section>` (no GPU needed) sets the engine's decode
all-reduces beside these: per call, from the profiled window's `nccl_ms` / NCCL kernel count (every
NCCL kernel of the window: two all-reduces per layer plus the logits' all-gather),
against (a) the message's bytes over the peak bus bandwidth (the bar of the TP design) and
(b) the isolated per-call time measured here at that message size (the floor including NCCL's
launch and synchronization latency, which dominates at decode sizes).

    python -m harness.microbench.allreduce --engine-cell results/h200/table22/paged-qwen2.5-14b-tp2-...json \
        --measured results/h200/microbench/allreduce-tp2.json --out results/h200/microbench/allreduce-in-engine.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from granikv.runtime.tp import _free_port
from harness.microbench._timing import env_info

DECODE_SHAPES = [(b, h) for h in (4096, 5120) for b in (8, 32, 128, 256, 512)]  # (B, hidden)
LARGE_BYTES = [1 << 24, 1 << 26, 1 << 28]  # 16 MB .. 256 MB: the link's bandwidth


def _time_allreduce(numel: int, iters: int, warmup: int) -> float:
    x = torch.ones(numel, dtype=torch.bfloat16, device="cuda")
    for _ in range(warmup):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        a.record()
        for _ in range(iters):
            dist.all_reduce(x)
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / iters)  # us per call
    return statistics.median(times)


def _worker(rank: int, world: int, port: int, iters: int, out: str) -> None:
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    recs = []
    sizes = [("decode", b, h, b * h) for b, h in DECODE_SHAPES] + [("large", None, None, n // 2) for n in LARGE_BYTES]
    for kind, b, h, numel in sizes:
        us = _time_allreduce(numel, iters if kind == "decode" else max(5, iters // 10), warmup=10)
        t = torch.tensor([us], device="cuda")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank is the call's time
        us = float(t.item())
        nbytes = numel * 2
        algbw = nbytes / (us * 1e-6) / 1e9
        recs.append({"kind": kind, "B": b, "hidden": h, "bytes": nbytes, "us": round(us, 2),
                     "algbw_GBps": round(algbw, 1), "busbw_GBps": round(algbw * 2 * (world - 1) / world, 1)})
    if rank == 0:
        Path(out).write_text(json.dumps(recs))
    dist.destroy_process_group()


def engine_vs_isolated(cell: dict, measured: dict) -> dict:
    """The engine's decode all-reduce per call vs the two floors (see the module docstring).

    The message is B x hidden bf16 (the row-parallel output of a decode step of the cell's batch,
    `profile.running` requests); the isolated time is the measured record of the same hidden size
    whose B is nearest."""
    from granikv.model.spec import load_spec

    prof = cell["profile"]
    calls = int(prof["kernel_counts"].get("nccl", 0))
    if not calls:
        raise ValueError("the cell's profile has no NCCL kernels (not a TP cell?)")
    spec = load_spec(cell["config"]["model"])
    b = int(prof.get("running") or cell["config"]["batch"])
    nbytes = b * spec.hidden_size * 2
    per_call_us = prof["nccl_ms"] * 1e3 / calls
    same = [r for r in measured["records"] if r["kind"] == "decode" and r["hidden"] == spec.hidden_size]
    if not same:
        raise ValueError(f"no isolated record for hidden={spec.hidden_size}")
    iso = min(same, key=lambda r: abs(r["B"] - b))
    bw_us = nbytes / (measured["peak_busbw_GBps"] * 1e9) * 1e6
    return {"model": spec.name, "tp": cell["config"]["tp"],
            "B": b, "message_bytes": nbytes, "calls_per_step": calls / max(1, int(prof["steps"])),
            "engine_us_per_call": per_call_us, "bytes_over_peak_busbw_us": bw_us,
            "isolated_us_per_call": iso["us"], "isolated_B": iso["B"],
            "engine_over_bytes_floor": per_call_us / bw_us, "engine_over_isolated": per_call_us / iso["us"],
            "nccl_share_of_step": prof["nccl_ms"] / prof["decode_wall_ms"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--out", default="results/h200/microbench/allreduce-tp2.json")
    ap.add_argument("--engine-cell", default=None, help="a TP cell's result file with a profile section")
    ap.add_argument("--measured", default="results/h200/microbench/allreduce-tp2.json",
                    help="this benchmark's isolated measurement (with --engine-cell)")
    args = ap.parse_args(argv)
    if args.engine_cell:
        cell = json.loads(Path(args.engine_cell).read_text())
        rec = engine_vs_isolated(cell, json.loads(Path(args.measured).read_text()))
        doc = {"env": env_info(), "engine_cell": args.engine_cell, "measured": args.measured,
               "cell_git_sha": cell.get("env", {}).get("git_sha"), "records": [rec]}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1))
        print(f"engine all-reduce {rec['engine_us_per_call']:.1f} us/call ({rec['message_bytes'] / 1e6:.2f} MB): "
              f"{rec['engine_over_bytes_floor']:.2f}x bytes/peak-bandwidth ({rec['bytes_over_peak_busbw_us']:.1f} us), "
              f"{rec['engine_over_isolated']:.2f}x isolated ({rec['isolated_us_per_call']:.1f} us) -> {args.out}")
        return 0
    if torch.cuda.device_count() < args.world:
        print(f"needs {args.world} GPUs, {torch.cuda.device_count()} visible", file=sys.stderr)
        return 2
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never NVLink multicast on shared hosts
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
    tmp = Path(args.out).with_suffix(".part")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    mp.start_processes(_worker, args=(args.world, _free_port(), args.iters, str(tmp)), nprocs=args.world,
                       start_method="spawn")
    recs = json.loads(tmp.read_text())
    tmp.unlink()
    peak = max(r["busbw_GBps"] for r in recs if r["kind"] == "large")
    doc = {"env": env_info(), "world": args.world, "peak_busbw_GBps": peak, "records": recs}
    Path(args.out).write_text(json.dumps(doc, indent=1))
    for r in recs:
        print(f"{r['kind']:6s} B={r['B']!s:5s} hidden={r['hidden']!s:5s} {r['bytes'] / 1e6:8.2f} MB "
              f"{r['us']:9.1f} us  busbw {r['busbw_GBps']:7.1f} GB/s")
    print(f"peak bus bandwidth {peak:.0f} GB/s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
