"""CUDA graphs for decode steps, for all three systems.

A decode step of a 32-layer model is hundreds of small launches; replaying them from a CUDA
graph removes the per-launch host cost. A graph is captured per key = (batch-size bucket,
plan signature): the signature fixes which prefix passes run and their padded class counts and
largest class sizes, because the prefix kernels' grids depend on those. Everything else a step
varies (token ids, positions, slots, rows, lengths, class membership) lives in one static int64
buffer: the host packs the step into a pinned array, one host-to-device copy moves it, and the
graph itself converts the fields to the int32 tensors the kernels read and writes the new
tokens' slots into the slot table. Padding requests read the reserved all-zero row (slot 0)
and padding classes are empty, so neither touches live KV.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from granikv.attention.batch import StepBatch
from granikv.attention.plan import FLAT, FLAT_LEVEL, DecodeMeta, DecodePlan, flat_sizes, pass_table
from granikv.kernels.prefix_classes import PrefixClasses
from granikv.kernels.prefix_flat import FLAT_CONFIG, FlatClasses, flat_lists

N_BASE = 6  # (unused), pos, out_slots, rows, seq_lens, kv_start


@dataclass
class _PassLayout:
    kind: str
    classes: int  # padded class count C
    size: int  # padded largest class S (grid sizing)
    slab: bool
    off: int  # offset of [indptr C+1 | reqs bucket | lens C | base_or_row C] in the packed buffer


@dataclass
class _FlatLayout:
    """The flattened launch's region: [indptr C+1 | reqs R | lens C | where C | rows C | level C |
    item_class I | item_tile I | mask bucket] (granikv/kernels/prefix_flat.py)."""

    off: int
    classes: int  # C: the flat kinds' padded class counts summed
    reqs: int  # R: bucket x levels (a request is in one class per level)
    items: int  # I: the work-list bound
    levels: int

    @property
    def length(self) -> int:
        return 5 * self.classes + 1 + self.reqs + 2 * self.items


@dataclass
class _Graph:
    bucket: int
    passes: list[_PassLayout]
    flat: _FlatLayout | None
    length: int
    host: torch.Tensor  # pinned int64 [length]
    dev: torch.Tensor  # device int64 [length]
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor
    next_tokens: torch.Tensor
    event: torch.cuda.Event


def capture(forward, pool):
    """Run `forward()` twice on a side stream (Triton compiles, cuBLAS warm-up: outside the
    capture), then capture it into a CUDA graph on `pool` (a new pool when None). Returns
    (graph, forward's outputs in the graph's memory, pool) — shared by decode and extend graphs."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            forward()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    pool = pool if pool is not None else torch.cuda.graph_pool_handle()
    with torch.cuda.graph(graph, pool=pool):
        out = forward()
    return graph, out, pool


class DecodeGraphs:
    def __init__(self, model, backend, slot_table: torch.Tensor, pad_row: int, buckets: tuple[int, ...],
                 max_classes: int = 64) -> None:
        self.model = model
        self.backend = backend
        self.slot_table = slot_table
        self.pad_row = pad_row
        self.buckets = tuple(sorted(buckets))
        self.max_classes = max_classes
        self.graphs: dict[tuple, _Graph] = {}
        self.pool = None
        self.tok_buf: torch.Tensor | None = None  # set by the runner: newest token per row
        self.replays = 0
        self.captures = 0

    def bucket_for(self, n: int) -> int | None:
        for b in self.buckets:
            if b >= n:
                return b
        return None

    def supports(self, n: int, plan: DecodePlan) -> bool:
        return self.bucket_for(n) is not None and all(len(c.members) <= self.max_classes
                                                      for c in plan.passes.values())

    def release(self) -> None:
        """Destroy every captured graph. Needed before a TP engine destroys its NCCL process
        group: each graph that captured an all-reduce holds a reference on the communicator, and
        NCCL's teardown waits for those references to drop (pytorch/pytorch#115388), so
        `destroy_process_group()` with live graphs hangs."""
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        for g in self.graphs.values():
            g.graph.reset()
        self.graphs.clear()
        self.pool = None

    # -- capture ----------------------------------------------------------------------------------
    def ahead_keys(self, backend, max_batch: int) -> list[tuple]:
        """(bucket, signature) keys a single-prefix serving run meets: for every bucket up to
        the one holding `max_batch`, the backend's warm signatures at both ends of the batch
        sizes the bucket takes (the pass kind and padded class size are monotone in n); and at
        `max_batch` itself, a batch split evenly over several prefixes."""
        keys: list[tuple] = []
        lo = 1
        top = self.bucket_for(max_batch) or self.buckets[-1]
        for b in self.buckets:
            if b > top:
                break
            for n in (lo, b):
                for sig in backend.warm_signatures(n):
                    if (b, sig) not in keys:
                        keys.append((b, sig))
            lo = b + 1
        # the batch a closed-loop run sits at, split over several prefixes (multi-prefix, hetero
        # and agents runs): their steady-state graphs, not captured when the run first meets them
        steady = backend.warm_class_signatures(max_batch, self.max_classes) if self.bucket_for(max_batch) else []
        for sig in steady:
            if (top, sig) not in keys:
                keys.append((top, sig))
        return keys

    def capture_ahead(self, backend, max_batch: int) -> int:
        """Capture the graphs of `ahead_keys` now (at engine start, as SGLang captures its
        graphs at start-up): a capture also compiles the Triton variants its shapes need, and
        either costs up to seconds when it first happens inside a serving run. Other keys (uneven or
        mixed prefix classes below the steady batch, a draining batch) are still captured when first
        met (about 0.13 s each on the H200). Returns how many were captured."""
        n = 0
        for key in self.ahead_keys(backend, max_batch):
            if key not in self.graphs:
                self.graphs[key] = self._capture(*key)
                n += 1
        return n

    def _layout(self, bucket: int, sig: tuple) -> tuple[list[_PassLayout], _FlatLayout | None, int]:
        off = N_BASE * bucket
        passes = []
        flat_on = (FLAT,) in sig
        for entry in sig:
            if entry == (FLAT,) or (flat_on and entry[0] in FLAT_LEVEL):
                continue  # in the flat region
            kind, c, s, slab = entry
            passes.append(_PassLayout(kind, c, s, slab, off))
            off += (c + 1) + bucket + 2 * c
        flat = None
        if flat_on:
            classes, levels, items = flat_sizes(sig, self.backend.group_size)
            flat = _FlatLayout(off, classes, bucket * levels, items, levels)
            off += flat.length + bucket
        return passes, flat, off

    def _bind(self, g_bucket: int, passes: list[_PassLayout], flat: _FlatLayout | None, dev: torch.Tensor) -> StepBatch:
        """Views + int32 conversions of the packed buffer (run inside the capture)."""
        b = g_bucket
        f = [dev[i * b:(i + 1) * b] for i in range(N_BASE)]
        pos, out_slots = f[1], f[2]
        rows, seq_lens, kv_start = (x.to(torch.int32) for x in f[3:6])
        self.slot_table[rows.long(), pos] = out_slots.to(torch.int32)
        ids = self.tok_buf[f[3]]
        meta_passes = {}
        for p in passes:
            o, c = p.off, p.classes
            indptr = dev[o:o + c + 1].to(torch.int32)
            reqs = dev[o + c + 1:o + c + 1 + b].to(torch.int32)
            lens = dev[o + c + 1 + b:o + 2 * c + 1 + b].to(torch.int32)
            where = dev[o + 2 * c + 1 + b:o + 3 * c + 1 + b].to(torch.int32)
            meta_passes[p.kind] = PrefixClasses(
                indptr=indptr, reqs=reqs, prefix_len=lens,
                slab_base=where if p.slab else None, page_rows=None if p.slab else where,
                slot_table=None if p.slab else pass_table(p.kind, self.slot_table), max_class_size=p.size)
        flat_meta = None
        if flat is not None:
            cuts = [flat.classes + 1, flat.reqs] + [flat.classes] * 4 + [flat.items] * 2 + [b]
            parts, o = [], flat.off
            for n in cuts:
                parts.append(dev[o:o + n].to(torch.int32))
                o += n
            flat_meta = FlatClasses(*parts, slot_table=self.slot_table.reshape(-1, 1), levels=flat.levels)
        batch = StepBatch(mode="decode", reqs=[], num_tokens=b, out_slots=out_slots, rows=rows,
                          prefix_lens=seq_lens - 1, qo_indptr=None, seq_lens=seq_lens)
        self.backend.bind(batch, DecodeMeta(kv_start=kv_start, kv_len=seq_lens - kv_start, passes=meta_passes,
                                            flat=flat_meta))
        return ids, pos, f[3]

    def _pack(self, g: _Graph, pos, out_slots, rows, seq_lens, plan: DecodePlan, n: int) -> None:
        b = g.bucket
        h = np.zeros(g.length, dtype=np.int64)
        h[b:b + n] = pos
        h[2 * b:2 * b + n] = out_slots
        h[3 * b:3 * b + n] = rows
        h[3 * b + n:4 * b] = self.pad_row
        h[4 * b:4 * b + n] = seq_lens
        h[4 * b + n:5 * b] = 1
        if plan.kv_start is not None:
            h[5 * b:5 * b + n] = plan.kv_start
        for p in g.passes:
            c = plan.passes[p.kind]
            o, C = p.off, p.classes
            sizes = [len(m) for m in c.members]
            ind = np.zeros(C + 1, dtype=np.int64)
            ind[1:len(sizes) + 1] = np.cumsum(sizes)
            ind[len(sizes) + 1:] = ind[len(sizes)]
            h[o:o + C + 1] = ind
            flat = [i for m in c.members for i in m]
            h[o + C + 1:o + C + 1 + len(flat)] = flat
            h[o + C + 1 + b:o + C + 1 + b + len(c.lens)] = c.lens
            where = c.where(self.slot_table.stride(0))
            w0 = o + 2 * C + 1 + b
            h[w0:w0 + len(where)] = where
            if not p.slab:
                h[w0 + len(where):w0 + C] = self.pad_row
        if g.flat is not None:
            f = g.flat
            classes, levels = plan.flat_classes(self.slot_table.stride(0))
            if levels != f.levels:
                raise RuntimeError(f"flat plan of {levels} levels met a graph of {f.levels}")
            lists = flat_lists(classes, b, levels, self.backend.group_size, FLAT_CONFIG.block_m,
                               num_classes=f.classes, num_reqs=f.reqs, num_items=f.items,
                               pad_row_where=self.pad_row * self.slot_table.stride(0))
            o = f.off
            for a in (lists.indptr, lists.reqs, lists.lens, lists.where, lists.rows, lists.level, lists.item_class,
                      lists.item_tile, lists.mask):
                h[o:o + len(a)] = a
                o += len(a)
        g.event.synchronize()  # the previous copy out of this pinned buffer is done (not the replay)
        g.host.numpy()[:] = h
        g.dev.copy_(g.host, non_blocking=True)  # stream-ordered: lands after the previous replay
        g.event.record()

    def _capture(self, bucket: int, sig: tuple) -> _Graph:
        passes, flat, length = self._layout(bucket, sig)
        dev_t = self.slot_table.device
        host = torch.zeros(length, dtype=torch.int64).pin_memory()
        dev = torch.zeros(length, dtype=torch.int64, device=dev_t)
        # a valid all-padding step: pads read row `pad_row` (slot 0), classes empty
        dev[3 * bucket:4 * bucket] = self.pad_row
        dev[4 * bucket:5 * bucket] = 1
        for p in passes:
            if not p.slab:
                dev[p.off + 2 * p.classes + 1 + bucket:p.off + 3 * p.classes + 1 + bucket] = self.pad_row
        graph, (logits, nxt), self.pool = capture(lambda: self._forward(bucket, passes, flat, dev), self.pool)
        self.captures += 1
        ev = torch.cuda.Event()
        ev.record()
        return _Graph(bucket, passes, flat, length, host, dev, graph, logits, nxt, ev)

    def _forward(self, bucket, passes, flat, dev):
        """The captured step: inputs from tok_buf, model, greedy sample written back to tok_buf."""
        ids, pos, rows = self._bind(bucket, passes, flat, dev)
        logits = self.model.forward(ids, pos, self.backend)
        nxt = logits.argmax(dim=-1)
        self.tok_buf[rows] = nxt
        return logits, nxt

    # -- replay -----------------------------------------------------------------------------------
    def run(self, pos, out_slots, rows, seq_lens, plan: DecodePlan) -> tuple[torch.Tensor, torch.Tensor]:
        """Replay the step's graph; returns (logits[:n], greedy tokens[:n]) on the device."""
        n = len(pos)
        bucket = self.bucket_for(n)
        key = (bucket, plan.signature())
        g = self.graphs.get(key)
        if g is None:
            g = self.graphs[key] = self._capture(bucket, key[1])
        self._pack(g, pos, out_slots, rows, seq_lens, plan, n)
        g.graph.replay()
        self.replays += 1
        return g.logits[:n], g.next_tokens[:n]
