"""ModelRunner: turns a scheduled Step into device tensors, runs the model, samples.

It owns the KV cache, the slot table (`req_to_slot[max_running + 1, max_context]`, int32 on
the device; the last row is an all-zero row that padded batch entries read) and the attention
backend of the configured system. The scheduler stays host-only; everything the kernels read
is built here.
"""

from __future__ import annotations

import torch

from granikv.attention.batch import ReqView, StepBatch
from granikv.attention.plan import materialize
from granikv.engine.request import Request
from granikv.engine.sampling import sample
from granikv.engine.scheduler import Step


class ModelRunner:
    def __init__(self, model, backend, kv_cache, slot_table: torch.Tensor, device: torch.device,
                 vocab_size: int, seed: int = 0, graphs=None) -> None:
        self.graphs = graphs  # DecodeGraphs, or None for eager decode
        self.model = model
        self.backend = backend
        self.kv = kv_cache
        self.slot_table = slot_table
        self.device = device
        self.vocab_size = vocab_size
        self.generator = torch.Generator(device="cpu").manual_seed(seed)

    # -- slot table -------------------------------------------------------------------------
    def write_row(self, req: Request, slots) -> None:
        n = len(slots)
        self.slot_table[req.row, :n] = torch.as_tensor(slots, dtype=torch.int32).to(self.device)

    # -- one step ---------------------------------------------------------------------------
    def _i32(self, x) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.int32, device=self.device)

    def run(self, step: Step) -> list[int]:
        """Run one step; returns one sampled token per request that samples this step."""
        plan = None
        if step.mode == "decode" and self.graphs is not None:
            out, plan = self._run_decode_graph(step)
            if out is not None:
                return out
        if step.mode == "extend":
            batch, ids, pos, sample_reqs, logit_rows = self._build_extend(step)
        else:
            batch, ids, pos, sample_reqs, logit_rows = self._build_decode(step)
        if plan is None:
            self.backend.plan(batch)
        else:  # a decode step the graphs could not take: reuse its plan eagerly
            self.backend.bind(batch, materialize(plan, batch.seq_lens, self.slot_table))
        if not sample_reqs:
            self.model.forward(ids, pos, self.backend, logits_index=torch.zeros(0, dtype=torch.long,
                                                                                 device=self.device))
            return []
        logits = self.model.forward(ids, pos, self.backend, logits_index=self._i32(logit_rows).long())
        return sample(logits, [r.params for r in sample_reqs], self.generator)

    def _run_decode_graph(self, step: Step):
        reqs = step.decode
        lens = [r.seq_len for r in reqs]
        views = [ReqView(r.row, n, n - 1, r.prefix_slab, r.slots, r.rid) for r, n in zip(reqs, lens)]
        host_batch = StepBatch(mode="decode", reqs=views, num_tokens=len(reqs), out_slots=None, rows=None,
                               prefix_lens=None, qo_indptr=None, seq_lens=None)
        plan = self.backend.plan_decode(host_batch)
        if not self.graphs.supports(len(reqs), plan):
            return None, plan
        logits = self.graphs.run([r.last_token for r in reqs], [n - 1 for n in lens], step.decode_slots,
                                 [r.row for r in reqs], lens, plan)
        return sample(logits, [r.params for r in reqs], self.generator), plan

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

    def _build_decode(self, step: Step):
        reqs = step.decode
        ids = [r.last_token for r in reqs]
        pos = [r.seq_len - 1 for r in reqs]
        rows = [r.row for r in reqs]
        out_slots = torch.tensor(step.decode_slots, dtype=torch.long, device=self.device)
        rows_t = self._i32(rows)
        pos_t = torch.tensor(pos, dtype=torch.long, device=self.device)
        # the new token's slot goes into the slot table before attention reads it
        self.slot_table[rows_t.long(), pos_t] = out_slots.to(torch.int32)
        views = [ReqView(row=r.row, seq_len=r.seq_len, prefix_len=r.seq_len - 1, slab=r.prefix_slab,
                         slots=r.slots, key=r.rid) for r in reqs]
        batch = StepBatch(
            mode="decode", reqs=views, num_tokens=len(reqs), out_slots=out_slots, rows=rows_t,
            prefix_lens=self._i32([v.prefix_len for v in views]),
            qo_indptr=self._i32(list(range(len(reqs) + 1))),
            seq_lens=self._i32([v.seq_len for v in views]),
        )
        return batch, torch.tensor(ids, dtype=torch.long, device=self.device), pos_t, reqs, \
            list(range(len(reqs)))
