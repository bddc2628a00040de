"""ModelRunner: turns a scheduled Step into device tensors, runs the model, samples.

It owns the KV cache, the slot table (`req_to_slot[max_running + 1, max_context]`, int32 on
the device; the last row is an all-zero row that padded batch entries read), the attention
backend of the configured system, and `tok_buf[row]`: each running request's newest token on
the device. Decode steps read their input tokens from `tok_buf` and greedy decode writes the
sampled tokens back into it on the device, so the host never has to know a step's tokens
before launching the next step (this is what lets the engine overlap scheduling of step N+1
with the GPU work of step N). The scheduler stays host-only; everything the kernels read is
built here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from granikv.attention.batch import ReqView, StepBatch
from granikv.attention.plan import materialize
from granikv.engine.request import Request
from granikv.engine.sampling import sample
from granikv.engine.scheduler import Step
from granikv.trace import span


@dataclass
class Launched:
    """A decode step whose GPU work is queued; `complete` turns it into tokens."""

    reqs: list[Request]
    tokens: torch.Tensor | None  # greedy: sampled ids (pinned host copy in flight)
    event: torch.cuda.Event | None
    logits: torch.Tensor | None  # non-greedy: sampled on the host at completion
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

    def _set_tokens(self, reqs: list[Request], tokens: list[int]) -> None:
        rows = torch.tensor([r.row for r in reqs], dtype=torch.long, device=self.device)
        self.tok_buf[rows] = torch.tensor(tokens, dtype=torch.long, device=self.device)

    # -- steps --------------------------------------------------------------------------------
    def _i32(self, x) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.int32, device=self.device)

    def run(self, step: Step) -> list[int]:
        """Run one step synchronously; one sampled token per request that samples this step."""
        if step.mode == "decode":
            return self.complete(self.launch_decode(step))
        if self.extend_graphs is not None:
            tokens = self._run_extend_graph(step)
            if tokens is not None:
                return tokens
        with span("plan"):
            batch, ids, pos, sample_reqs, logit_rows = self._build_extend(step)
            self.backend.plan(batch)
        if not sample_reqs:
            with span("forward"):
                self.model.forward(ids, pos, self.backend, logits_index=torch.zeros(0, dtype=torch.long,
                                                                                     device=self.device))
            return []
        with span("forward"):
            logits = self.model.forward(ids, pos, self.backend, logits_index=self._i32(logit_rows).long())
        with span("sample"):
            tokens = sample(logits, [r.params for r in sample_reqs], self.generator)
        self._set_tokens(sample_reqs, tokens)
        return tokens

    def _run_extend_graph(self, step: Step) -> list[int] | None:
        """An extend step through ExtendGraphs when it fits a bucket; None when it does not."""
        items = step.prefill
        num_tokens = sum(it.end - it.start for it in items)
        key = self.extend_graphs.key_for(num_tokens, len(items), max(it.end for it in items))
        if key is None:
            return None
        with span("plan"):
            ids: list[int] = []
            pos: list[int] = []
            slots: list[int] = []
            rows, prefix, seq, indptr, logit_rows, sample_reqs = [], [], [], [0], [], []
            for it in items:
                r = it.req
                ids.extend(r.all_ids[it.start:it.end])
                pos.extend(range(it.start, it.end))
                slots.extend(int(s) for s in r.slots[it.start:it.end])
                rows.append(r.row)
                prefix.append(it.start)
                seq.append(it.end)
                indptr.append(len(ids))
                if it.last_chunk:
                    sample_reqs.append(r)
                    logit_rows.append(len(ids) - 1)
        with span("forward"):
            logits = self.extend_graphs.run(key, ids, pos, slots, rows, prefix, seq, indptr, logit_rows)
        if not sample_reqs:
            return []
        with span("sample"):
            tokens = sample(logits, [r.params for r in sample_reqs], self.generator)
        self._set_tokens(sample_reqs, tokens)
        return tokens

    def launch_decode(self, step: Step) -> Launched:
        """Queue a decode step on the device. Input tokens come from `tok_buf`; positions and
        lengths from the host (`seq_len` counts tokens still being sampled by an earlier step)."""
        reqs = step.decode
        greedy = all(r.params.temperature == 0 for r in reqs)
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
                return self._launched(reqs, logits, nxt, greedy)
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
                self.backend.bind(batch, materialize(plan, batch.seq_lens, self.slot_table))
        ids = self.tok_buf[rows_t.long()]
        with span("forward"):
            logits = self.model.forward(ids, pos_t, self.backend)
        nxt = logits.argmax(dim=-1)
        if greedy:
            self.tok_buf[rows_t.long()] = nxt
        return self._launched(reqs, logits, nxt, greedy)

    def _launched(self, reqs, logits, nxt, greedy: bool) -> Launched:
        if not greedy:
            return Launched(reqs, None, None, logits)
        n = len(reqs)
        if self._pinned:
            host = torch.empty(n, dtype=torch.long, pin_memory=True)
            host.copy_(nxt[:n], non_blocking=True)
            ev = torch.cuda.Event()
            ev.record()
            return Launched(reqs, host, ev, None)
        return Launched(reqs, nxt[:n].clone(), None, None)

    def complete(self, la: Launched) -> list[int]:
        """Wait for a launched decode step; its sampled tokens, in `la.reqs` order."""
        if la.tokens is not None:
            if la.event is not None:
                la.event.synchronize()
            return la.tokens.tolist()
        n = len(la.reqs)
        tokens = sample(la.logits[:n], [r.params for r in la.reqs], self.generator)
        self._set_tokens(la.reqs, tokens)
        return tokens

    def _build_extend(self, step: Step):
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        views, rows, prefix, indptr = [], [], [], [0]
        sample_reqs, logit_rows = [], []
        for it in step.prefill:
            r = it.req
            toks = r.all_ids[it.start:it.end]
            ids.extend(toks)
            pos.extend(range(it.start, it.end))
            slots.extend(int(s) for s in r.slots[it.start:it.end])
            rows.append(r.row)
            prefix.append(it.start)
            indptr.append(len(ids))
            views.append(ReqView(row=r.row, seq_len=it.end, prefix_len=it.start, slab=r.prefix_slab,
                                 slots=r.slots, key=r.rid))
            if it.last_chunk:
                sample_reqs.append(r)
                logit_rows.append(len(ids) - 1)
        t = len(ids)
        batch = StepBatch(
            mode="extend", reqs=views, num_tokens=t,
            out_slots=torch.tensor(slots, dtype=torch.long, device=self.device),
            rows=self._i32(rows), prefix_lens=self._i32(prefix), qo_indptr=self._i32(indptr),
            seq_lens=self._i32([v.seq_len for v in views]),
        )
        return batch, torch.tensor(ids, dtype=torch.long, device=self.device), \
            torch.tensor(pos, dtype=torch.long, device=self.device), sample_reqs, logit_rows
