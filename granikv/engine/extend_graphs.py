"""CUDA graphs for small extend (prefill) steps, for all three systems. Off by default.

Why: in a serving run behind a long shared prefix most extend steps are small (a few suffixes
of tens to hundreds of tokens that arrived since the last step), and such a step is host-bound:
on the H200 a 20-token step's GPU work is a fraction of its wall time
(`harness.microbench.extend_steps --engine`), the rest being 32 layers of eager launches. Decode
steps avoid that cost with DecodeGraphs; this does the same for extend steps up to the largest
token bucket.

A graph is captured per key = (token bucket T, request bucket N, key splits S): T and N fix
every tensor shape of the step, S the extend kernel's grid. Everything a step varies (token ids,
positions, slots, rows, prefix lengths, the query ranges, which rows are sampled) lives in one
static int64 buffer, filled by one host-to-device copy. Padding never touches live KV: the N - n
padding requests read the reserved all-zero slot-table row (slot 0); the first of them owns the
T - t padding tokens, whose K/V land in slot 0; the others own none. So a step of t tokens from
n requests needs T >= t and N >= n + 1. The extend kernel's grid is sized for T tokens in one
request (the padding request may hold up to T - t); programs past a request's tokens return at
once. S is the split count the policy picks for the real step, rounded down to a power of two
(fewer keys) and capped by the workspace the padded step needs. With `capture_at_start` the
engine captures every key a run can meet (`ahead_keys`) before serving, so no capture lands
inside a measured run.

With `use_graphs=False` (CPU, or CUDA graphs off) the same padded static step runs eagerly: the
CPU tests check that path against the plain one, so the padding and the buffer layout are
tested wherever the suite runs; capture and replay are what the GPU tests add.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from granikv.attention.batch import StepBatch
from granikv.engine.graphs import capture
from granikv.kernels import ExtendConfig, ExtendSplitPolicy, extend_splits
from granikv.kernels._common import num_sms


@dataclass(frozen=True)
class ExtendKey:
    tokens: int  # T: the token bucket
    reqs: int  # N: the request bucket (>= real requests + 1)
    splits: int  # S: key splits of the extend kernel


@dataclass
class _Graph:
    key: ExtendKey
    host: torch.Tensor  # int64 [length] (pinned on CUDA)
    dev: torch.Tensor  # int64 [length] on the device
    graph: torch.cuda.CUDAGraph | None
    logits: torch.Tensor | None  # [N, vocab] of the captured step
    event: torch.cuda.Event | None


def _layout(key: ExtendKey) -> dict[str, slice]:
    """Fields of the packed buffer: ids, pos, slots [T]; rows, prefix, seq, logit_rows [N];
    indptr [N + 1]."""
    t, n = key.tokens, key.reqs
    out, off = {}, 0
    for name, size in (("ids", t), ("pos", t), ("slots", t), ("rows", n), ("prefix", n), ("seq", n),
                       ("logit_rows", n), ("indptr", n + 1)):
        out[name] = slice(off, off + size)
        off += size
    out["length"] = slice(off, off)
    return out


class ExtendGraphs:
    def __init__(self, model, backend, pad_row: int, token_buckets: tuple[int, ...],
                 req_buckets: tuple[int, ...], device: torch.device, use_graphs: bool,
                 policy: ExtendSplitPolicy | None = None, cfg: ExtendConfig | None = None) -> None:
        if not token_buckets or not req_buckets or min(req_buckets) < 2:
            raise ValueError("extend graphs need token buckets and request buckets >= 2 (one is padding)")
        self.model = model
        self.backend = backend
        self.pad_row = pad_row
        self.token_buckets = tuple(sorted(token_buckets))
        self.req_buckets = tuple(sorted(req_buckets))
        self.device = device
        self.use_graphs = use_graphs and device.type == "cuda"
        self.policy = policy or backend.ops.split_policy
        self.cfg = cfg or ExtendConfig()
        self.sms = num_sms(device)
        self.graphs: dict[ExtendKey, _Graph] = {}
        self.pool = None
        self.replays = 0  # graph replays
        self.captures = 0
        self.runs = 0  # steps run through here (replayed, or padded eager)

    # -- keys -------------------------------------------------------------------------------------
    @staticmethod
    def _bucket(buckets: tuple[int, ...], x: int) -> int | None:
        return next((b for b in buckets if b >= x), None)

    def key_for(self, num_tokens: int, num_reqs: int, max_kv_len: int) -> ExtendKey | None:
        """The graph key of a step, or None when the step is larger than every bucket."""
        t = self._bucket(self.token_buckets, num_tokens)
        n = self._bucket(self.req_buckets, num_reqs + 1)
        if t is None or n is None or num_tokens <= 0:
            return None
        return ExtendKey(t, n, self._splits(num_tokens, num_reqs, max_kv_len, t))

    def _max_splits(self, padded_tokens: int) -> int:
        """Most splits a key of `padded_tokens` may take: the policy's cap and its workspace."""
        if not self.backend.ops.split_extend:
            return 1
        b = self.backend
        by_mem = self.policy.workspace_bytes // (padded_tokens * b.num_q_heads * (b.head_dim + 1) * 4)
        return max(1, min(self.policy.max_splits, by_mem))

    def _splits(self, num_tokens: int, num_reqs: int, max_kv_len: int, padded_tokens: int) -> int:
        if not self.backend.ops.split_extend:
            return 1
        b = self.backend
        s = extend_splits(num_tokens, num_reqs, b.num_q_heads, b.num_kv_heads, b.head_dim, max_kv_len,
                          self.cfg.block_m, self.sms, self.policy)
        s = max(1, min(s, self._max_splits(padded_tokens)))
        return 1 << (s.bit_length() - 1)  # a power of two: few keys, never more splits than asked

    def ahead_keys(self) -> list[ExtendKey]:
        """Every key `key_for` can return: each token and request bucket, with each power-of-two
        split count up to the key's cap (what a run meets depends on its prefix lengths)."""
        keys = []
        for t in self.token_buckets:
            top = self._max_splits(t)
            for n in self.req_buckets:
                s = 1
                while s <= top:
                    keys.append(ExtendKey(t, n, s))
                    s *= 2
        return keys

    def capture_ahead(self) -> int:
        """Capture every key now (engine start, like DecodeGraphs.capture_ahead): a capture is
        two eager forwards and a recorded one, ~0.1 s, and a run would otherwise meet its keys
        one by one inside the measured window. Returns how many were captured."""
        if not self.use_graphs:
            return 0
        n = 0
        for key in self.ahead_keys():
            if key not in self.graphs:
                self.graphs[key] = self._new(key)
                n += 1
        return n

    # -- packing ----------------------------------------------------------------------------------
    def pack(self, key: ExtendKey, ids, pos, slots, rows, prefix, seq_lens, indptr, logit_rows) -> np.ndarray:
        """The step's packed int64 buffer (host), padding included (see the module docstring)."""
        lay = _layout(key)
        h = np.zeros(lay["length"].stop, dtype=np.int64)
        t, n = len(ids), len(rows)
        h[lay["ids"]][:t] = ids
        p = h[lay["pos"]]
        p[:t] = pos
        p[t:] = np.arange(key.tokens - t)  # the padding request's own positions
        h[lay["slots"]][:t] = slots  # padding tokens: slot 0 (reserved)
        r = h[lay["rows"]]
        r[:n] = rows
        r[n:] = self.pad_row
        h[lay["prefix"]][:n] = prefix
        s = h[lay["seq"]]
        s[:n] = seq_lens
        s[n] = key.tokens - t
        ind = h[lay["indptr"]]
        ind[:n + 1] = indptr
        ind[n + 1:] = key.tokens
        h[lay["logit_rows"]][:len(logit_rows)] = logit_rows
        return h

    def _bind(self, key: ExtendKey, dev: torch.Tensor):
        """Views and int32 conversions of the packed buffer (inside the capture); plans the
        backend's extend batch on them with the key's split count."""
        lay = _layout(key)
        f = {name: dev[sl] for name, sl in lay.items() if name != "length"}
        i32 = {name: f[name].to(torch.int32) for name in ("rows", "prefix", "seq", "indptr")}
        batch = StepBatch(mode="extend", reqs=[], num_tokens=key.tokens, out_slots=f["slots"], rows=i32["rows"],
                          prefix_lens=i32["prefix"], qo_indptr=i32["indptr"], seq_lens=i32["seq"],
                          _bounds=(key.tokens, 0), split_count=key.splits)
        self.backend.plan(batch)
        return f["ids"], f["pos"], f["logit_rows"]

    def _forward(self, key: ExtendKey, dev: torch.Tensor) -> torch.Tensor:
        ids, pos, logit_rows = self._bind(key, dev)
        return self.model.forward(ids, pos, self.backend, logits_index=logit_rows)

    # -- capture ----------------------------------------------------------------------------------
    def _new(self, key: ExtendKey) -> _Graph:
        length = _layout(key)["length"].stop
        host = torch.zeros(length, dtype=torch.int64)
        if self.use_graphs:
            host = host.pin_memory()
        dev = torch.zeros(length, dtype=torch.int64, device=self.device)
        if not self.use_graphs:
            return _Graph(key, host, dev, None, None, None)
        # a valid all-padding step: every token belongs to request 0, on the padding row
        dev.copy_(torch.from_numpy(self.pack(key, [], [], [], [], [], [], [0], [])))
        graph, logits, self.pool = capture(lambda: self._forward(key, dev), self.pool)
        self.captures += 1
        ev = torch.cuda.Event()
        ev.record()
        return _Graph(key, host, dev, graph, logits, ev)

    def release(self) -> None:
        """Destroy the captured graphs (before a TP engine destroys its process group)."""
        if self.use_graphs:
            torch.cuda.synchronize()
        for g in self.graphs.values():
            if g.graph is not None:
                g.graph.reset()
        self.graphs.clear()
        self.pool = None

    # -- replay -----------------------------------------------------------------------------------
    def run(self, key: ExtendKey, ids, pos, slots, rows, prefix, seq_lens, indptr,
            logit_rows) -> torch.Tensor:
        """Run one extend step through its graph; float32 logits [len(logit_rows), vocab]."""
        g = self.graphs.get(key)
        if g is None:
            g = self.graphs[key] = self._new(key)
        h = self.pack(key, ids, pos, slots, rows, prefix, seq_lens, indptr, logit_rows)
        m = len(logit_rows)
        self.runs += 1
        if g.graph is None:  # padded eager: the same static step without a capture
            g.dev.copy_(torch.from_numpy(h))
            return self._forward(key, g.dev)[:m]
        g.event.synchronize()  # the previous copy out of the pinned buffer is done
        g.host.numpy()[:] = h
        g.dev.copy_(g.host, non_blocking=True)
        g.event.record()
        g.graph.replay()
        self.replays += 1
        return g.logits[:m]

