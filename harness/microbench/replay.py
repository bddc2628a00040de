"""CPU replay of a serving run: the real scheduler and storage, no model.

    python -m harness.microbench.replay --workload /tmp/mp64.jsonl --systems paged,granikv \\
        --num-slots 555175 --batch 256 [--hot-fraction 0.2] --out results/cpu/microbench/replay-k64.json

What a KV-capacity-bound cell costs is decided by the storage policy (what it evicts, what it
recomputes, what it retracts), not by the kernels, and every one of those decisions is host
bookkeeping. This tool drives the engine's own `Engine.step()` (scheduler, storage, promotions,
overlap scheduling) with a stub runner in place of the model: an extend step "computes" every
scheduled prefill token, a decode step emits a fixed token for every request, so each request
runs exactly `output_len` tokens (the client sends `ignore_eos`). KV slots are bookkeeping only,
so a 555K-slot Llama-3.1-8B cell replays in seconds on a laptop.

The load mirrors the benchmark client at `rate=inf`: one warm-up request (the first request,
`warmup_output_len` tokens), a cache flush, then every request offered at t=0 with at most
`batch` in flight: a new request is added only when one finishes (the client's semaphore), in
file order, with its `shared_prefix_len` hint.

Reported per system: prefill tokens computed (extend tokens: not served from cache; recompute
after retraction included), extend and decode steps, evicted slots, retractions, and the storage
counters (hot stats for granikv). Extend time on the GPU is close to proportional to the
computed prefill tokens, so their ratio between systems predicts the extend-time ratio.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from granikv.config import EngineConfig
from granikv.engine.builder import Components
from granikv.engine.engine import Engine
from granikv.engine.request import SamplingParams
from granikv.engine.runner import Launched
from granikv.engine.sampling import Sampled
from granikv.engine.scheduler import Step
from granikv.model.spec import load_spec
from granikv.systems import storage_from_config
from harness.microbench._timing import env_info
from harness.run.workloads.requests import WorkloadRequest, read_workload, require_open_loop

FIXED_TOKEN = 13  # what every stub step "samples"; any id outside the model's EOS ids


# ----------------------------------------------------------------------------- stub components


@dataclass
class StubCounters:
    """What the stub runner was asked to compute."""

    prefill_tokens: int = 0  # extend tokens computed (cache misses, recompute included)
    extend_steps: int = 0
    decode_steps: int = 0
    decode_tokens: int = 0
    promotion_copies: int = 0
    promotion_slots: int = 0
    # decode steps' prefix classes (requests sharing one HOT slab): class size -> class-steps, and
    # for steps in the top graph bucket (more than half the batch), the cascade prefix pass's M tiles per step -> steps
    class_sizes: dict = field(default_factory=dict)
    full_batch_steps: int = 0
    full_batch_tiles: dict = field(default_factory=dict)


class StubKV:
    """Stands in for KVCache: promotions only count their copies (no tensors to copy)."""

    def __init__(self, counters: StubCounters):
        self.k = [torch.empty(0)]
        self.v = [torch.empty(0)]
        self._c = counters

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        self._c.promotion_copies += 1
        self._c.promotion_slots += int(dst.numel())


class StubBackend:
    """Stands in for the attention backend (only `stats()` is read outside the runner)."""

    def stats(self) -> dict:
        return {}


class StubRunner:
    """ModelRunner's interface without a model: counts what a step computes and samples a fixed
    token. No CUDA graphs, so the engine takes the eager decode path."""

    graphs = None

    def __init__(self, counters: StubCounters, token: int = FIXED_TOKEN, full_batch: int = 0,
                 group_size: int = 4, block_m: int = 64):
        self._c = counters
        self.token = token
        self.full_batch, self.group_size, self.block_m = full_batch, group_size, block_m

    def write_row(self, req, slots) -> None:
        pass

    def repoint_rows(self, rows, base: int, n: int) -> None:
        pass

    def run(self, step: Step) -> Sampled:
        if step.mode == "decode":
            return self.complete(self.launch_decode(step))
        self._c.extend_steps += 1
        self._c.prefill_tokens += sum(it.end - it.start for it in step.prefill)
        return Sampled([self.token] * sum(1 for it in step.prefill if it.last_chunk))

    def launch_decode(self, step: Step) -> Launched:
        self._c.decode_steps += 1
        self._c.decode_tokens += len(step.decode)
        self._count_classes(step.decode)
        return Launched(step.decode, None, None, None)

    def _count_classes(self, reqs) -> None:
        """The prefix classes this step would give granikv's dispatcher (one per HOT slab), and
        the prefix pass's M tiles: ceil(n * g / BLOCK_M) per class of two or more, each tile one
        stream of the class's prefix (granikv/kernels/prefix_cascade.py)."""
        sizes: dict = {}
        for r in reqs:
            if r.prefix_slab is not None:
                sizes[r.prefix_slab] = sizes.get(r.prefix_slab, 0) + 1
        hist = self._c.class_sizes
        for n in sizes.values():
            hist[n] = hist.get(n, 0) + 1
        if self.full_batch and 2 * len(reqs) > self.full_batch:  # the top CUDA-graph bucket
            tiles = sum(-(-n * self.group_size // self.block_m) for n in sizes.values() if n >= 2)
            self._c.full_batch_steps += 1
            self._c.full_batch_tiles[tiles] = self._c.full_batch_tiles.get(tiles, 0) + 1

    def complete(self, la: Launched) -> Sampled:
        return Sampled([self.token] * len(la.reqs))


def stub_engine(cfg: EngineConfig, num_slots: int) -> tuple[Engine, StubCounters]:
    """An Engine over the real storage policy of `cfg.system` with `num_slots` slots, whose
    runner computes nothing."""
    from granikv.kernels.prefix_cascade import CASCADE_CONFIG

    counters = StubCounters()
    spec = load_spec(cfg.model_path or cfg.model)
    storage = storage_from_config(cfg, num_slots)
    eos = tuple(getattr(spec, "eos_token_ids", ()) or ())
    runner = StubRunner(counters, full_batch=cfg.max_running, group_size=spec.num_heads // spec.num_kv_heads,
                        block_m=CASCADE_CONFIG.block_m)
    comps = Components(spec, None, StubKV(counters), storage, StubBackend(), runner, eos)
    return Engine(cfg, components=comps), counters


# ----------------------------------------------------------------------------- the load


@dataclass
class ReplayConfig:
    batch: int = 256  # the client's max concurrency (and the engine's max_running)
    num_slots: int = 555175
    hot_fraction: float = 0.2
    max_context: int = 9216  # the Table 20 cells' server flag
    chunked_prefill_tokens: int = 8192
    page_size: int = 16
    model: str = "llama-3.1-8b"
    warmup_requests: int = 1
    warmup_output_len: int = 32
    flush: bool = True
    send_prefix_hint: bool = True
    max_steps: int = 1_000_000  # a guard against a scheduler that stops making progress
    # the client's round trip, in engine steps: a finished request's replacement reaches the
    # engine 0..arrival_lag_steps steps later (uniform, seeded) instead of in the same step —
    # the timing that differs between two GPU runs of one workload
    arrival_lag_steps: int = 0
    seed: int = 0


@dataclass
class ReplayResult:
    system: str
    requests: int
    prefill_tokens: int
    extend_steps: int
    decode_steps: int
    decode_tokens: int
    evicted_slots: int
    retractions: int
    wall_s: float
    storage: dict = field(default_factory=dict)
    scheduler: dict = field(default_factory=dict)
    promotion_copies: int = 0
    promotion_slots: int = 0
    class_sizes: dict = field(default_factory=dict)
    full_batch_steps: int = 0
    full_batch_tiles: dict = field(default_factory=dict)
    arrival_lag_steps: int = 0
    seed: int = 0


def engine_config(system: str, rc: ReplayConfig) -> EngineConfig:
    return EngineConfig(model=rc.model, system=system, device="cpu", num_slots=rc.num_slots,
                        hot_fraction=rc.hot_fraction, max_running=rc.batch, max_context=rc.max_context,
                        chunked_prefill_tokens=rc.chunked_prefill_tokens, page_size=rc.page_size,
                        cuda_graphs=False)


@dataclass(frozen=True)
class Offer:
    """One request as the client sends it."""

    rid: str
    input_ids: list[int]
    output_len: int
    hint: int | None  # shared_prefix_len, when the client sends it


def offers(requests: list[WorkloadRequest], rc: ReplayConfig) -> list[Offer]:
    require_open_loop(requests, "the engine replay")  # a debate's prompts need the server's outputs
    return [Offer(r.id, r.input_ids, r.output_len,
                  r.shared_prefix_len if rc.send_prefix_hint and r.shared_prefix_len > 0 else None)
            for r in requests]


def serve(engine: Engine, load: list[Offer], batch: int, progress=None, max_steps: int = 1_000_000,
          lag_steps: int = 0, seed: int = 0) -> int:
    """All of `load` at t=0, at most `batch` in flight, the next one added when one finishes (the
    client's semaphore) — `lag_steps` > 0: 0..lag_steps engine steps later, drawn per request;
    runs the engine until it is idle. Returns the engine steps taken."""
    import heapq
    import random

    queue = deque(load)
    rng = random.Random(seed)
    due: list[int] = []  # a heap: the steps at which the next offers reach the engine

    def add() -> None:
        o = queue.popleft()
        engine.add_request(o.input_ids, SamplingParams(max_new_tokens=o.output_len, ignore_eos=True),
                           rid=o.rid, shared_prefix_len=o.hint)

    for _ in range(min(batch, len(queue))):
        add()
    steps = 0
    while engine.has_work() or due:
        while due and due[0] <= steps and queue:
            heapq.heappop(due)
            add()
        if engine.has_work():
            for out in engine.step():
                if out.finished:
                    if progress is not None:
                        progress(out)
                    if len(queue) > len(due):
                        heapq.heappush(due, steps + (rng.randint(0, lag_steps) if lag_steps else 0))
        steps += 1
        if steps > max_steps:
            raise RuntimeError(f"replay still running after {max_steps} steps")
    return steps


def warm_up(engine: Engine, load: list[Offer], rc: ReplayConfig) -> None:
    """The client's warm-up (its first request, `warmup_output_len` tokens, `warmup_requests`
    times at once), then its cache flush."""
    if not rc.warmup_requests or not load:
        return
    first = load[0]
    n = min(first.output_len, rc.warmup_output_len)
    serve(engine, [Offer(f"warmup{i}", first.input_ids, n, first.hint) for i in range(rc.warmup_requests)],
          rc.warmup_requests, max_steps=rc.max_steps)
    if rc.flush:
        engine.flush_cache()


def replay(system: str, requests: list[WorkloadRequest], rc: ReplayConfig, progress=None) -> ReplayResult:
    """Serve `requests` with `system`'s real scheduler and storage; what it computed and evicted.
    Counters include the warm-up request, as the engine's counters of a GPU cell do."""
    engine, c = stub_engine(engine_config(system, rc), rc.num_slots)
    t0 = time.perf_counter()
    load = offers(requests, rc)
    warm_up(engine, load, rc)
    serve(engine, load, rc.batch, progress, rc.max_steps, rc.arrival_lag_steps, rc.seed)
    st = engine.stats()
    storage = st["storage"]
    return ReplayResult(
        system=system, requests=len(requests), prefill_tokens=c.prefill_tokens,
        extend_steps=c.extend_steps, decode_steps=c.decode_steps, decode_tokens=c.decode_tokens,
        evicted_slots=int(storage["evicted_slots"]), retractions=int(st["retractions"]),
        wall_s=round(time.perf_counter() - t0, 3), storage=storage,
        scheduler={"hot_admits": st["hot_admits"], "hot_fallbacks": st["hot_fallbacks"]},
        promotion_copies=c.promotion_copies, promotion_slots=c.promotion_slots,
        class_sizes={str(n): v for n, v in sorted(c.class_sizes.items())}, full_batch_steps=c.full_batch_steps,
        full_batch_tiles={str(n): v for n, v in sorted(c.full_batch_tiles.items())},
        arrival_lag_steps=rc.arrival_lag_steps, seed=rc.seed,
    )


# ----------------------------------------------------------------------------- CLI


class Progress:
    """Finished requests of one system's replay: a tqdm bar on a terminal, else a line on stderr
    every 10% (logs of batch runs stay short)."""

    def __init__(self, total: int, label: str):
        self.total, self.label, self.done = total, label, 0
        self._bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=label, unit="req", file=sys.stderr, dynamic_ncols=True)

    def __call__(self, out) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update(1)
        elif self.done * 10 // max(1, self.total) != (self.done - 1) * 10 // max(1, self.total):
            print(f"[replay] {self.label}: {self.done}/{self.total} requests", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def summary_line(r: ReplayResult) -> str:
    s = r.storage
    hot = ""
    if r.system == "granikv":
        hot = (f" hot_admits={r.scheduler['hot_admits']} hot_fallbacks={r.scheduler['hot_fallbacks']}"
               f" slabs={s.get('slabs')} storage.hot_admits={s.get('hot_admits')} hot_hits={s.get('hot_hits')}"
               f" storage.hot_fallbacks={s.get('hot_fallbacks')} promotions={s.get('promotions_planned')}"
               f"/{s.get('promotions_failed')} failed lent={s.get('lent_slots')}")
    tiles = ""
    if r.full_batch_steps and r.system == "granikv":
        n = sum(r.full_batch_tiles.values())
        mean = sum(int(t) * c for t, c in r.full_batch_tiles.items()) / n
        tiles = f" full_batch_steps={r.full_batch_steps} prefix_tiles/step={mean:.2f}"
    lag = f" lag={r.arrival_lag_steps} seed={r.seed}" if r.arrival_lag_steps else ""
    return (f"{r.system:8s}{lag} prefill_tokens={r.prefill_tokens} extend_steps={r.extend_steps} "
            f"decode_steps={r.decode_steps} evicted_slots={r.evicted_slots} retractions={r.retractions}"
            f"{hot}{tiles} ({r.wall_s:.1f} s)")


def write_results(path: str, results: list[ReplayResult], rc: ReplayConfig, workload: str,
                  workload_config: dict | None) -> None:
    """A microbench result file (results/<hw>/microbench/*.json: `env` and `records`, one record
    per system carrying the replay's config)."""
    cfg = {"workload": workload, "workload_config": workload_config, **asdict(rc)}
    doc = {"env": env_info(), "config": cfg,
           "records": [{"op": "replay", **cfg, **asdict(r)} for r in results]}
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", required=True, help="a workload .jsonl (python -m harness.run.workloads)")
    ap.add_argument("--systems", default="paged,granikv")
    ap.add_argument("--num-slots", type=int, default=ReplayConfig.num_slots)
    ap.add_argument("--batch", type=int, default=ReplayConfig.batch)
    ap.add_argument("--hot-fraction", type=float, default=ReplayConfig.hot_fraction)
    ap.add_argument("--max-context", type=int, default=ReplayConfig.max_context)
    ap.add_argument("--chunked-prefill-tokens", type=int, default=ReplayConfig.chunked_prefill_tokens)
    ap.add_argument("--page-size", type=int, default=ReplayConfig.page_size, help="paged/cascade page size")
    ap.add_argument("--model", default=ReplayConfig.model, help="only its vocabulary and EOS ids are used")
    ap.add_argument("--warmup-requests", type=int, default=ReplayConfig.warmup_requests)
    ap.add_argument("--no-prefix-hint", action="store_true")
    ap.add_argument("--num-requests", type=int, default=None, help="replay only the first N requests")
    ap.add_argument("--arrival-lag-steps", type=int, default=0,
                    help="a finished request's replacement arrives 0..N engine steps later (the client's round trip)")
    ap.add_argument("--seeds", default="0", help="comma-separated seeds of the arrival lag: one replay per seed")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    rc = ReplayConfig(batch=args.batch, num_slots=args.num_slots, hot_fraction=args.hot_fraction,
                      max_context=args.max_context, chunked_prefill_tokens=args.chunked_prefill_tokens,
                      page_size=args.page_size, model=args.model, warmup_requests=args.warmup_requests,
                      send_prefix_hint=not args.no_prefix_hint, arrival_lag_steps=args.arrival_lag_steps)
    wl = read_workload(args.workload)
    requests = wl.requests[: args.num_requests] if args.num_requests else wl.requests
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()] or [0]
    results = []
    for seed in seeds:
        for system in [s for s in args.systems.split(",") if s]:
            progress = Progress(len(requests), system)
            r = replay(system, requests, replace(rc, seed=seed), progress=progress)
            progress.close()
            print(summary_line(r), flush=True)
            results.append(r)
    if args.out:
        write_results(args.out, results, rc, str(args.workload), wl.header.get("config"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
