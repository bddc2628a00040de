"""Engine: the in-process API (add_request / step / generate / stats).

One Engine = one model replica (one TP rank group) with one KV slot space, one storage
policy and one attention backend. The HTTP server drives an Engine from a background thread;
tests and microbenchmarks drive it directly.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np
import torch

from granikv.config import EngineConfig
from granikv.engine.request import PENDING, Request, SamplingParams, Status
from granikv.engine.runner import Launched
from granikv.engine.sampling import TokenLogprobs
from granikv.engine.scheduler import Scheduler
from granikv.engine.steplog import StepLog
from granikv.systems import system
from granikv.trace import span


@dataclass
class StepOutput:
    req: Request
    token: int | None  # None: the request ended without a token (`error` says why)
    finished: bool
    # when the request asked for logprobs: the token's raw logprob and the top alternatives
    # (granikv/engine/sampling.py, TokenLogprobs)
    logprobs: TokenLogprobs | None = None
    error: str | None = None  # the engine ended this request alone (Scheduler.fail)


def resolve_device(cfg: EngineConfig) -> torch.device:
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.device)


def resolve_dtype(cfg: EngineConfig, device: torch.device) -> torch.dtype:
    if cfg.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[cfg.dtype]


class Engine:
    def __init__(self, config: EngineConfig, tp_group=None, model=None, components=None) -> None:
        """`model`: an already loaded CausalLM to reuse (benchmarks comparing systems on one
        set of weights); built from the config when None. `components`: prebuilt `Components`
        (the CPU replay's model-free runner over the real storage and scheduler); when given,
        nothing is built from the config."""
        from granikv.engine.builder import build_components

        self.config = config
        self.device = resolve_device(config)
        self.dtype = resolve_dtype(config, self.device)
        t_build = time.perf_counter()
        c = components or build_components(config, self.device, self.dtype, tp_group, model=model)
        # where a server's start-up goes (weights, KV pools, then captures): a GPU cell spends
        # 10-25 s before its run, so this is what a shorter start would have to cut
        self.startup = {"build_s": round(time.perf_counter() - t_build, 3)}
        self.spec = c.spec
        self.model = c.model
        self.kv = c.kv
        self.storage = c.storage
        self.backend = c.backend
        self.runner = c.runner
        self.graphs_at_start = {"captured": 0, "seconds": 0.0, "extend_variants": 0, "extend_graphs": 0}
        if config.capture_at_start and self.device.type == "cuda":
            t0 = time.perf_counter()
            warmed = self.backend.warm_extend()
            n = 0
            if self.runner.graphs is not None:
                n = self.runner.graphs.capture_ahead(self.backend, config.max_running)
            eg = getattr(self.runner, "extend_graphs", None)
            n_ext = eg.capture_ahead() if eg is not None else 0
            self.graphs_at_start = {"captured": n, "seconds": round(time.perf_counter() - t0, 3),
                                    "extend_variants": warmed, "extend_graphs": n_ext}
        self.startup["capture_s"] = self.graphs_at_start["seconds"]
        self.scheduler = Scheduler(
            self.storage, config.max_running, config.max_context, config.chunked_prefill_tokens,
            on_row_assigned=self.runner.write_row, prefix_slabs=system(config.system).capabilities.prefix_slabs,
        )
        self.eos_ids: tuple[int, ...] = c.eos_ids
        self._ids = itertools.count()
        self._seq = itertools.count()
        self.requests: dict[str, Request] = {}
        self.steps = {"extend": 0, "decode": 0}
        self.inflight: Launched | None = None  # a queued decode step whose tokens are not read yet
        self.step_log = StepLog()

    # -- API ----------------------------------------------------------------------------------
    def add_request(self, input_ids: list[int], params: SamplingParams | None = None,
                    rid: str | None = None, shared_prefix_len: int | None = None) -> Request:
        if input_ids is None or not len(input_ids):
            raise ValueError("input_ids must not be empty")
        # One conversion, vectorized checks: this runs on the engine's step loop, and at a 16K
        # prompt `list(map(int, ...))` plus min/max over the list and the Request's int32 copy
        # cost ~0.9 ms (harness.diagnostics.admission); the array is what the storage takes.
        arr = np.asarray(input_ids)
        if arr.ndim != 1 or arr.dtype.kind not in "iub":
            raise ValueError("input_ids must be a flat sequence of integer token ids")
        if int(arr.min()) < 0 or int(arr.max()) >= self.spec.vocab_size:
            bad = arr[(arr < 0) | (arr >= self.spec.vocab_size)][:5].tolist()
            raise ValueError(f"token ids out of range [0, {self.spec.vocab_size}): {bad}")
        need = len(arr) + (params or SamplingParams()).max_new_tokens
        if need > self.kv_capacity:
            # it could never run, even alone: refused now, not failed after its prefill
            raise ValueError(f"the request needs {need} KV slots (prompt {len(arr)} + max new tokens "
                             f"{need - len(arr)}); this server's KV cache holds at most {self.kv_capacity} "
                             "tokens for one request")
        ids = arr.tolist()
        if shared_prefix_len is not None and not 0 <= shared_prefix_len <= len(input_ids):
            raise ValueError("shared_prefix_len must be within the prompt")
        rid = rid or f"r{next(self._ids)}"
        if rid in self.requests:
            raise ValueError(f"duplicate request id {rid!r}")
        req = Request(rid=rid, input_ids=ids, params=params or SamplingParams(),
                      shared_prefix_len=shared_prefix_len, seq=next(self._seq),
                      prompt_arr=arr.astype(np.int32))
        self.scheduler.add(req)
        self.requests[rid] = req
        return req

    def abort(self, rid: str) -> None:
        req = self.requests.pop(rid, None)
        if req is not None and req.status != Status.FINISHED:
            self.scheduler.abort(req)

    @property
    def kv_capacity(self) -> int:
        """The most tokens (prompt + output) one request can hold: admission refuses more."""
        return self.storage.max_request_tokens()

    def has_work(self) -> bool:
        return self.scheduler.has_work() or self.inflight is not None

    def _failed(self) -> list[StepOutput]:
        """The requests the scheduler ended with an error, as outputs without a token."""
        outs = []
        for req in self.scheduler.take_failed():
            req.finish_time = time.monotonic()
            self.requests.pop(req.rid, None)
            outs.append(StepOutput(req, None, True, error=req.error))
        return outs

    def step(self) -> list[StepOutput]:
        """One engine iteration; returns the tokens that became known in it.

        With `overlap_schedule` (greedy decode, nothing waiting to be admitted) the next decode
        step is scheduled and queued on the device *before* waiting for the current one: the
        host's bookkeeping runs while the GPU works, and the GPU never idles between steps. The
        price, as in SGLang's overlap scheduler, is that a request stopping on EOS may run one
        extra step whose result is dropped.
        """
        t0 = time.perf_counter()
        if self.inflight is None:
            with span("schedule"):
                step = self.scheduler.schedule()
            if step is None:
                return self._failed()
            if step.mode == "extend":
                outs = self._run_extend(step)
                self.step_log.extend.add(sum(it.end - it.start for it in step.prefill), len(step.prefill),
                                         time.perf_counter() - t0)
                return outs + self._failed() if self.scheduler.failed else outs
            self.inflight = self._launch(step)
        nxt = None
        if self._can_overlap():
            with span("schedule"):
                step = self.scheduler.schedule_decode()
            if step is not None:
                nxt = self._launch(step)
        outs = self._complete(self.inflight)
        self.inflight = nxt
        self._run_promotions()
        self.step_log.decode.add(len(outs), len(outs), time.perf_counter() - t0)
        return outs + self._failed() if self.scheduler.failed else outs

    def _can_overlap(self) -> bool:
        """Greedy steps only (logprobs or not: their tokens are on the device in `tok_buf`
        before the step is read back). A sampled step runs synchronously, so each of its
        requests draws from its generator exactly once per token it keeps."""
        if not self.config.overlap_schedule or self.scheduler.waiting:
            return False
        return all(r.params.temperature == 0 for r in self.inflight.reqs) and all(
            r.kv_len >= r.prefill_target for r in self.scheduler.running)

    def _launch(self, step) -> Launched:
        la = self.runner.launch_decode(step)
        la.gens = [r.gen for r in step.decode]
        for r in step.decode:
            r.output_ids.append(PENDING)
            r.pending += 1
        self.steps["decode"] += 1
        return la

    def _complete(self, la) -> list[StepOutput]:
        with span("sample"):
            res = self.runner.complete(la)
        now = time.monotonic()
        outs: list[StepOutput] = []
        lps = res.logprobs
        for i, (req, gen, tok) in enumerate(zip(la.reqs, la.gens, res.tokens)):
            if req.status != Status.RUNNING or req.gen != gen:
                continue  # finished, aborted or retracted while this step was in flight
            idx = len(req.output_ids) - req.pending
            req.output_ids[idx] = int(tok)
            req.pending -= 1
            self.scheduler.commit_decode(req)
            outs.append(self._emit(req, int(tok), now, idx, None if lps is None else lps[i]))
        return outs

    def _run_extend(self, step) -> list[StepOutput]:
        res = self.runner.run(step)
        for it in step.prefill:
            self.scheduler.commit_prefill(it)
        now = time.monotonic()
        outs = []
        lps = res.logprobs
        for i, (req, tok) in enumerate(zip([it.req for it in step.prefill if it.last_chunk], res.tokens)):
            req.output_ids.append(int(tok))
            outs.append(self._emit(req, int(tok), now, len(req.output_ids) - 1, None if lps is None else lps[i]))
        self._run_promotions()
        self.steps["extend"] += 1
        return outs

    def _emit(self, req: Request, tok: int, now: float, idx: int, lp: TokenLogprobs | None = None) -> StepOutput:
        if req.first_token_time is None:
            req.first_token_time = now
        done = req.check_finished(self.eos_ids, idx)
        if done:
            req.drop_pending()
            self.scheduler.finish(req)
            req.finish_time = now
            self.requests.pop(req.rid, None)
        return StepOutput(req, tok, done, lp)

    def _run_promotions(self) -> None:
        """Copy COLD prefixes the admission policy chose for HOT into their slabs (one copy of
        2·L·Lp·H_kv·d elements, queued on the device after the step), then re-point the tree and
        the running requests that read the old copy: their device slot-table rows are rewritten
        after the copy on the same stream, so a step already queued reads the old (still intact)
        slots and every later step, replayed graphs included, reads the slab. Their prefix
        class is set, so the next plan reads the slab once per class (docs/ARCHITECTURE.md,
        "Storage")."""
        plans = self.storage.take_promotions()
        if not plans:
            return
        dev = self.kv.k[0].device
        by_row = {r.row: r for r in self.scheduler.running}
        for plan in plans:
            self.kv.copy_slots(torch.as_tensor(plan.src, device=dev), torch.as_tensor(plan.dst, device=dev))
            base = plan.slab.base
            by_len: dict[int, list[int]] = {}
            for row, n in self.storage.commit_promotion(plan):
                by_len.setdefault(n, []).append(row)
                req = by_row[row]
                p = req.handle.prefix
                req.prefix_slab = (int(p.hot_base), int(p.prefix_len)) if p is not None else None
            for n, rows in by_len.items():
                self.runner.repoint_rows(rows, base, n)

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams] | None = None,
                 shared_prefix_lens: list[int | None] | None = None) -> list[list[int]]:
        if not isinstance(params, list):
            params = [params or SamplingParams()] * len(prompts)
        hints = shared_prefix_lens or [None] * len(prompts)
        reqs = [self.add_request(p, sp, shared_prefix_len=h) for p, sp, h in zip(prompts, params, hints)]
        while any(r.status != Status.FINISHED for r in reqs):
            self.step()
        return [r.output_ids for r in reqs]

    def flush_cache(self) -> bool:
        if self.scheduler.running or self.scheduler.waiting:
            return False
        self.storage.flush()
        return True

    def stats(self) -> dict:
        return {
            "config": self.config.to_dict(),
            "model": self.spec.name,
            "steps": dict(self.steps),
            "step_time_s": {"extend": self.step_log.extend.total_s, "decode": self.step_log.decode.total_s},
            "step_log": self.step_log.summary(),
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
            "retractions": self.scheduler.retractions,
            "hot_admits": self.scheduler.hot_admits,
            "hot_fallbacks": self.scheduler.hot_fallbacks,
            "storage": self.storage.stats(),
            "attention": self.backend.stats(),
            "graphs": self._graph_stats(),
            "startup": dict(self.startup),
        }

    def _graph_stats(self) -> dict:
        g, eg = self.runner.graphs, getattr(self.runner, "extend_graphs", None)
        extend = {} if eg is None else {"extend_graphs": {
            "captures": eg.captures, "replays": eg.replays, "runs": eg.runs, "keys": len(eg.graphs),
            "captured": eg.use_graphs, "captured_at_start": self.graphs_at_start["extend_graphs"]}}
        if g is None:
            return {"enabled": False, **extend}
        return {"enabled": True, "captures": g.captures, "replays": g.replays, **extend,
                "captured_at_start": self.graphs_at_start["captured"],
                "capture_at_start_s": self.graphs_at_start["seconds"],
                "extend_variants_at_start": self.graphs_at_start["extend_variants"]}
