"""`python -m harness.run.client`: drive a running server with a workload file and print
bench_serving's summary (the cell app runs the same client: harness.run.cell).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from granikv.runtime import aio
from harness.run.client.benchmark import APIS, BenchmarkResult, ClientConfig, run_benchmark
from harness.run.workloads.requests import is_closed_loop, read_workload

_SUMMARY = (
    ("completed", "Successful requests", "d"),
    ("failed", "Failed requests", "d"),
    ("duration_s", "Benchmark duration (s)", ".2f"),
    ("total_input_tokens", "Total input tokens", "d"),
    ("total_output_tokens", "Total generated tokens", "d"),
    ("request_throughput", "Request throughput (req/s)", ".2f"),
    ("output_throughput", "Output token throughput (tok/s)", ".2f"),
    ("total_throughput", "Total token throughput (tok/s)", ".2f"),
    ("mean_ttft_ms", "Mean TTFT (ms)", ".2f"),
    ("median_ttft_ms", "Median TTFT (ms)", ".2f"),
    ("p99_ttft_ms", "P99 TTFT (ms)", ".2f"),
    ("mean_tpot_ms", "Mean TPOT (ms)", ".2f"),
    ("median_tpot_ms", "Median TPOT (ms)", ".2f"),
    ("p99_tpot_ms", "P99 TPOT (ms)", ".2f"),
    ("median_itl_ms", "Median ITL (ms)", ".2f"),
    ("p99_itl_ms", "P99 ITL (ms)", ".2f"),
    ("median_e2e_latency_ms", "Median E2E latency (ms)", ".2f"),
)


def format_summary(result: BenchmarkResult) -> str:
    lines = [" Serving Benchmark Result ".center(50, "=")]
    for key, label, fmt in _SUMMARY:
        lines.append(f"{label + ':':<40} {format(result.metrics[key], fmt)}")
    for err, n in result.errors().items():
        lines.append(f"  failed x{n}: {err}")
    lines.append("=" * 50)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.run.client", description=__doc__.split("\n")[0])
    ap.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:30000")
    ap.add_argument("--workload", required=True, help="workload .jsonl (python -m harness.run.workloads)")
    ap.add_argument("--rate", default="inf", help="requests/s (Poisson), or inf")
    ap.add_argument("--max-concurrency", type=int, default=256, help="0 = no cap")
    ap.add_argument("--num-requests", type=int, default=None, help="use only the first N requests")
    ap.add_argument("--warmup-requests", type=int, default=1)
    ap.add_argument("--warmup-output-len", type=int, default=32)
    ap.add_argument("--flush-cache", action="store_true")
    ap.add_argument("--send-prefix-hint", action="store_true")
    ap.add_argument("--api", choices=sorted(APIS), default="generate",
                    help="generate: POST /generate (SGLang-native); completions: POST /v1/completions (OpenAI)")
    ap.add_argument("--model", default=None, help="the completions API's model name (default: GET /v1/models' first)")
    ap.add_argument("--request-timeout", type=float, default=3600.0)
    ap.add_argument("--max-new-tokens", type=int, default=None, help="override the workload's output_len")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--output", default=None, help="write the result JSON here")
    ap.add_argument("--no-records", action="store_true", help="leave per-request records out of --output")
    args = ap.parse_args(argv)

    wl = read_workload(args.workload)
    if args.num_requests and is_closed_loop(wl.requests):
        ap.error("--num-requests would cut sessions apart; a closed-loop workload (kind debate) runs whole: "
                 "generate a smaller one (python -m harness.run.workloads --kind debate --num-requests N ...)")
    reqs = wl.requests[: args.num_requests] if args.num_requests else wl.requests
    cfg = ClientConfig(
        rate=float(args.rate),
        max_concurrency=args.max_concurrency or None,
        warmup_requests=args.warmup_requests,
        warmup_output_len=args.warmup_output_len,
        flush_cache=args.flush_cache,
        send_prefix_hint=args.send_prefix_hint,
        request_timeout_s=args.request_timeout,
        max_new_tokens=args.max_new_tokens,
        progress=not args.no_progress,
        api=args.api,
        model=args.model,
    )
    result = aio.run(run_benchmark(args.url, reqs, cfg))
    print(format_summary(result))
    if args.output:
        out = result.to_dict(with_records=not args.no_records)
        out["workload"] = {"path": str(args.workload), "header": wl.header, "num_requests": len(reqs)}
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(out, indent=1) + "\n")
    return 0
