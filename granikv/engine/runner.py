"""ModelRunner: turns a scheduled Step into device tensors, runs the model, samples.

It owns the KV cache, the slot table (`req_to_slot[max_running + 1, max_context]`, int32 on
the device; the last row is an all-zero row that padded batch entries read), the attention
backend of the configured system, and `tok_buf[row]`: each running request's newest token on
the device. Decode steps read their input tokens from `tok_buf` and greedy decode writes the
sampled tokens back into it on the device, so the host never has to know a step's tokens
before launching the next step (this is what lets the engine overlap scheduling of step N+1
with the GPU work of step N). A decode step whose requests are all greedy without logprobs
(`SamplingParams.plain`) reads back only those tokens; any other step also runs the sampler
(granikv/engine/sampling.py) on the device right after the forward, writes its tokens into
`tok_buf` and reads back tokens and logprobs together. The scheduler stays host-only;
everything the kernels read is built here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from granikv.attention.batch import ReqView, StepBatch
from granikv.attention.plan import materialize
from granikv.engine.request import Request
from granikv.engine.sampling import DeviceSample, Sampled, sample
from granikv.engine.scheduler import Step
from granikv.trace import span


@dataclass
class _ExtendLists:
    """Host lists of one extend step (ModelRunner._extend_lists)."""

    ids: list[int] = field(default_factory=list)
    pos: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    prefix: list[int] = field(default_factory=list)
    seq: list[int] = field(default_factory=list)
    indptr: list[int] = field(default_factory=lambda: [0])
    views: list[ReqView] = field(default_factory=list)
    sample_reqs: list[Request] = field(default_factory=list)
    logit_rows: list[int] = field(default_factory=list)


@dataclass
class Launched:
    """A decode step whose GPU work is queued; `complete` turns it into tokens."""

    reqs: list[Request]
    tokens: torch.Tensor | None  # all plain greedy: the argmax ids (pinned host copy in flight)
    event: torch.cuda.Event | None
    sampled: DeviceSample | None  # otherwise: tokens and logprobs (host copies in flight)
    gens: list[int] = field(default_factory=list)  # each request's admission generation at launch


class ModelRunner:
    def __init__(self, model, backend, kv_cache, slot_table: torch.Tensor, device: torch.device,
                 vocab_size: int, seed: int = 0, graphs=None, max_running: int | None = None,
                 extend_graphs=None) -> None:
        self.graphs = graphs  # DecodeGraphs, or None for eager decode
        self.extend_graphs = extend_graphs  # ExtendGraphs for small extend steps, or None
        self.model = model
        self.backend = backend
        self.kv = kv_cache
        self.slot_table = slot_table
        self.device = device
        self.vocab_size = vocab_size
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        rows = slot_table.shape[0]
        self.tok_buf = torch.zeros(rows, dtype=torch.long, device=device)
        if graphs is not None:
            graphs.tok_buf = self.tok_buf
        self._pinned = device.type == "cuda"

    # -- slot table and token buffer ------------------------------------------------------------
    def write_row(self, req: Request, slots) -> None:
        n = len(slots)
        self.slot_table[req.row, :n] = torch.as_tensor(slots, dtype=torch.int32).to(self.device)

    def repoint_rows(self, rows: list[int], base: int, n: int) -> None:
        """Positions [0, n) of `rows` now read the slab `base + arange(n)` (a committed promotion;
        queued on the current stream, after the copy into the slab)."""
        idx = torch.as_tensor(rows, dtype=torch.long, device=self.device)
        self.slot_table[idx, :n] = torch.arange(base, base + n, dtype=torch.int32, device=self.device)

    def _set_tokens(self, reqs: list[Request], tokens: list[int]) -> None:
        rows = torch.tensor([r.row for r in reqs], dtype=torch.long, device=self.device)
        self.tok_buf[rows] = torch.tensor(tokens, dtype=torch.long, device=self.device)

    # -- steps --------------------------------------------------------------------------------
    def _i32(self, x) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.int32, device=self.device)

    def run(self, step: Step) -> Sampled:
        """Run one step synchronously; one sampled token per request that samples this step.
        An extend step that fits an ExtendGraphs bucket replays its graph; others run eagerly."""
        if step.mode == "decode":
            return self.complete(self.launch_decode(step))
        with span("plan"):
            h = self._extend_lists(step)
            key = None if self.extend_graphs is None else self.extend_graphs.key_for(
                len(h.ids), len(h.rows), max(h.seq, default=0))
            if key is None:
                batch = self._extend_batch(h)
                self.backend.plan(batch)
        with span("forward"):
            if key is not None:
                logits = self.extend_graphs.run(key, h.ids, h.pos, h.slots, h.rows, h.prefix, h.seq, h.indptr,
                                                h.logit_rows)
            else:
                logits = self.model.forward(torch.tensor(h.ids, dtype=torch.long, device=self.device),
                                            torch.tensor(h.pos, dtype=torch.long, device=self.device),
                                            self.backend, logits_index=self._i32(h.logit_rows).long())
        if not h.sample_reqs:
            return Sampled([])
        with span("sample"):
            out = sample(logits, [r.params for r in h.sample_reqs], self._generators(h.sample_reqs),
                         self.generator).to_host(pinned=False).result()
        self._set_tokens(h.sample_reqs, out.tokens)
        return out

    def launch_decode(self, step: Step) -> Launched:
        """Queue a decode step on the device. Input tokens come from `tok_buf`; positions and
        lengths from the host (`seq_len` counts tokens still being sampled by an earlier step)."""
        reqs = step.decode
        plain = all(r.params.plain for r in reqs)
        lens = [r.seq_len for r in reqs]
        rows = [r.row for r in reqs]
        views = [ReqView(r.row, n, n - 1, r.prefix_slab, r.slots, r.rid) for r, n in zip(reqs, lens)]
        plan = None
        if self.graphs is not None:
            host_batch = StepBatch(mode="decode", reqs=views, num_tokens=len(reqs), out_slots=None, rows=None,
                                   prefix_lens=None, qo_indptr=None, seq_lens=None)
            with span("dispatch"):
                plan = self.backend.plan_decode(host_batch)
            if self.graphs.supports(len(reqs), plan):
                with span("forward"):
                    logits, nxt = self.graphs.run([n - 1 for n in lens], step.decode_slots, rows, lens, plan)
                return self._launched(reqs, logits, nxt, plain, rows)
        rows_t = self._i32(rows)
        pos_t = torch.tensor([n - 1 for n in lens], dtype=torch.long, device=self.device)
        out_slots = torch.tensor(step.decode_slots, dtype=torch.long, device=self.device)
        self.slot_table[rows_t.long(), pos_t] = out_slots.to(torch.int32)
        batch = StepBatch(
            mode="decode", reqs=views, num_tokens=len(reqs), out_slots=out_slots, rows=rows_t,
            prefix_lens=pos_t.to(torch.int32), qo_indptr=self._i32(list(range(len(reqs) + 1))),
            seq_lens=self._i32(lens),
        )
        with span("plan"):
            if plan is None:
                self.backend.plan(batch)
            else:  # a decode step the graphs could not take: reuse its plan eagerly
                self.backend.bind(batch, materialize(plan, batch.seq_lens, self.slot_table,
                                                     self.backend.group_size))
        ids = self.tok_buf[rows_t.long()]
        with span("forward"):
            logits = self.model.forward(ids, pos_t, self.backend)
        nxt = logits.argmax(dim=-1)
        self.tok_buf[rows_t.long()] = nxt
        return self._launched(reqs, logits, nxt, plain, rows)

    def _launched(self, reqs, logits, nxt, plain: bool, rows: list[int]) -> Launched:
        if not plain:
            return self._launch_sampling(reqs, logits, nxt, rows)
        n = len(reqs)
        if self._pinned:
            host = torch.empty(n, dtype=torch.long, pin_memory=True)
            host.copy_(nxt[:n], non_blocking=True)
            ev = torch.cuda.Event()
            ev.record()
            return Launched(reqs, host, ev, None)
        return Launched(reqs, nxt[:n].clone(), None, None)

    def _launch_sampling(self, reqs, logits, nxt, rows: list[int]) -> Launched:
        """Queue the sampler after the forward (stream-ordered, so a graph's static logits are
        read before any later replay overwrites them: the engine may overlap greedy steps that
        ask for logprobs). Sampled tokens go into `tok_buf` on the device, as the argmax does."""
        n = len(reqs)
        params = [r.params for r in reqs]
        ds = sample(logits[:n], params, self._generators(reqs), self.generator, greedy=nxt[:n])
        if any(p.temperature > 0 for p in params):
            self.tok_buf[torch.tensor(rows, dtype=torch.long, device=self.device)] = ds.tokens
        host = ds.to_host(self._pinned)
        ev = None
        if self._pinned:
            ev = torch.cuda.Event()
            ev.record()
        return Launched(reqs, None, ev, host)

    def _generators(self, reqs: list[Request]) -> list[torch.Generator | None]:
        """Each sampling request's own generator (seeded requests; made at first use and kept on
        the request), None for the others (they draw from the config-seeded `self.generator`)."""
        out: list[torch.Generator | None] = []
        for r in reqs:
            if r.params.seed is None or r.params.temperature == 0:
                out.append(None)
                continue
            if r.generator is None:
                r.generator = torch.Generator(device="cpu").manual_seed(r.params.seed)
            out.append(r.generator)
        return out

    def complete(self, la: Launched) -> Sampled:
        """Wait for a launched decode step; its tokens (and logprobs), in `la.reqs` order."""
        if la.event is not None:
            la.event.synchronize()
        if la.tokens is not None:
            return Sampled(la.tokens.tolist())
        return la.sampled.result()

    def _extend_lists(self, step: Step) -> _ExtendLists:
        """The host side of an extend step: flat tokens, positions, slots, per-request rows,
        cached prefix lengths, context lengths, query ranges, and which rows sample."""
        h = _ExtendLists()
        for it in step.prefill:
            r = it.req
            h.ids.extend(r.token_slice(it.start, it.end))
            h.pos.extend(range(it.start, it.end))
            h.slots.extend(r.slots[it.start:it.end].tolist())
            h.rows.append(r.row)
            h.prefix.append(it.start)
            h.seq.append(it.end)
            h.indptr.append(len(h.ids))
            h.views.append(ReqView(row=r.row, seq_len=it.end, prefix_len=it.start, slab=r.prefix_slab,
                                   slots=r.slots, key=r.rid))
            if it.last_chunk:
                h.sample_reqs.append(r)
                h.logit_rows.append(len(h.ids) - 1)
        return h

    def _extend_batch(self, h: _ExtendLists) -> StepBatch:
        """The eager extend step's batch (device tensors of `h`)."""
        return StepBatch(
            mode="extend", reqs=h.views, num_tokens=len(h.ids),
            out_slots=torch.tensor(h.slots, dtype=torch.long, device=self.device),
            rows=self._i32(h.rows), prefix_lens=self._i32(h.prefix), qo_indptr=self._i32(h.indptr),
            seq_lens=self._i32(h.seq),
        )
