"""Continuous batching with chunked prefill, radix prefix reuse, admission against the KV
budget, and retraction (recompute) when KV runs out.

Each `schedule()` returns one step: an extend (prefill) step when waiting requests can be
admitted, otherwise a decode step over every running request. Prefill goes first, as in
SGLang's default policy, so new requests join the decode batch quickly. Decode batches are
ordered by prefix class (requests sharing a slab are adjacent), which keeps each class's
queries contiguous for the prefix passes.

KV exhaustion is never an error: admission waits when the pools are full; a decode step that
cannot grow every request retracts the most recently admitted requests (their KV is freed,
they re-enter the waiting queue at the front, keep their generated tokens and are
re-prefilled later). No request is lost.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from granikv.engine.request import Request, Status

_HASH_BASE = np.uint64(0x100000001B3)  # odd: the powers never vanish mod 2^64
_HASH_MIX = np.uint64(0x9E3779B97F4A7C15)


@dataclass
class PrefillItem:
    req: Request
    start: int  # first position of the chunk
    end: int  # one past the last position
    last_chunk: bool  # sample a token after this chunk


@dataclass
class Step:
    mode: str  # "extend" | "decode"
    prefill: list[PrefillItem] = field(default_factory=list)
    decode: list[Request] = field(default_factory=list)
    decode_slots: list[int] = field(default_factory=list)  # the new slot of each decode request


class Scheduler:
    def __init__(self, storage, max_running: int, max_context: int, chunked_prefill_tokens: int,
                 on_row_assigned=None, defer_block_tokens: int = 16, prefix_slabs: bool = False) -> None:
        self.storage = storage
        # the system's `Capabilities.prefix_slabs` (granikv.systems): a named shared prefix gets
        # a HOT slab, so one admitted without a slab counts as a fallback (`hot_fallbacks`)
        self.prefix_slabs = prefix_slabs
        self.max_running = max_running
        self.max_context = max_context
        self.chunk_tokens = max(1, chunked_prefill_tokens)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admitted (prefilling or decoding)
        self.failed: list[Request] = []  # ended by `fail`, not reported yet
        self.on_row_assigned = on_row_assigned  # callback(req, slots): write the slot-table row
        # in-batch prefix sharing: a request whose prompt starts like the part of another prompt
        # still being prefilled waits for that prefill to be cached instead of recomputing (and
        # re-storing) it; prompts are compared by blocks of this many tokens (`_prefix_blocks`)
        self.defer_block_tokens = defer_block_tokens
        self._powers = np.zeros(0, dtype=np.uint64)  # _HASH_BASE ** (j + 1) mod 2^64, grown on demand
        self.retractions = 0
        self.hot_admits = 0
        self.hot_fallbacks = 0

    # -- queue management --------------------------------------------------------------------
    def add(self, req: Request) -> None:
        if len(req.input_ids) + req.params.max_new_tokens > self.max_context:
            raise ValueError(
                f"prompt ({len(req.input_ids)}) + max_new_tokens ({req.params.max_new_tokens}) "
                f"exceeds the context limit {self.max_context}"
            )
        req.status = Status.WAITING
        self.waiting.append(req)

    def abort(self, req: Request) -> None:
        req.drop_pending()
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self._release(req, finished=False)
        req.status = Status.FINISHED
        req.finish_reason = req.finish_reason or "abort"

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.failed)

    def fail(self, req: Request, why: str) -> None:
        """End a running request with an error (its KV freed); the engine reports it in its
        step's outputs (`take_failed`)."""
        req.drop_pending()
        self._release(req, finished=False)
        req.status = Status.FINISHED
        req.finish_reason = "error"
        req.error = why
        self.failed.append(req)

    def take_failed(self) -> list[Request]:
        out, self.failed = self.failed, []
        return out

    # -- admission -----------------------------------------------------------------------------
    def _prefix_blocks(self, req: Request) -> tuple[list[int], list[int]]:
        """(keys, ends) of the prompt's leading blocks: block i covers tokens [0, end_i), whole
        blocks of `defer_block_tokens` and a last partial one, up to the prompt's last token
        (always computed). Why blocks, not one key of the hinted length: two prompts share a
        block when they agree up to its end, so a request waits on whatever part of its prompt
        another request is computing — one system prompt, then each agent's role prompt behind
        it — with no hint from the client. A block's key is a polynomial hash of its whole
        prefix (one cumulative sum per prompt, mod 2^64, with its end mixed in); a collision
        only makes a request wait for another's prefill. Built once: the prompt never changes."""
        if req.prefix_blocks is None:
            b = self.defer_block_tokens
            n = len(req.prompt_arr) - 1
            ends = np.arange(b, n, b, dtype=np.int64)
            if n > 0:
                ends = np.append(ends, n)
            if len(self._powers) < n:
                self._powers = np.cumprod(np.full(max(n, 2 * len(self._powers)), _HASH_BASE, dtype=np.uint64))
            with np.errstate(over="ignore"):
                terms = (req.prompt_arr[:n].astype(np.uint64) + np.uint64(1)) * self._powers[:n]
                sums = np.cumsum(terms, dtype=np.uint64)
                keys = sums[ends - 1] ^ (ends.astype(np.uint64) * _HASH_MIX) if n > 0 else sums[:0]
            req.prefix_blocks = (keys.tolist(), ends.tolist())
        return req.prefix_blocks

    def _computing(self, req: Request) -> list[int]:
        """The blocks of the request's prompt its own prefill computes: those not found cached at
        admission (paged storage caches whole pages only, so up to P-1 cached tokens may be
        recomputed)."""
        keys, ends = self._prefix_blocks(req)
        return keys[bisect.bisect_left(ends, req.cached_tokens + getattr(self.storage, "P", 1)):]

    def _admit(self, req: Request) -> bool:
        if len(self.running) >= self.max_running:
            return False
        tokens = req.kv_tokens(req.seq_len)
        adm = self.storage.admit(tokens, req.shared_prefix_len)
        if adm is None:
            return False
        req.handle = adm
        req.row = adm.row
        req.gen += 1
        req.cached_tokens = int(adm.cached_len)
        req.kv_len = int(adm.cached_len)
        req.prefill_target = len(tokens)
        p = adm.prefix
        req.prefix_slab = (int(p.hot_base), int(p.prefix_len)) if p is not None else None
        if req.shared_prefix_len:
            if p is not None:
                self.hot_admits += 1
            elif self.prefix_slabs:
                self.hot_fallbacks += 1
        req.slots = adm.slots
        req.status = Status.RUNNING
        self.running.append(req)
        if self.on_row_assigned is not None:
            self.on_row_assigned(req, req.slots)
        return True

    def _release(self, req: Request, finished: bool) -> None:
        self.running.remove(req)
        if finished:
            self.storage.finish(req.handle, req.kv_tokens(req.kv_len))
        else:
            self.storage.abort(req.handle)
        req.handle = None
        req.row = -1

    def retract(self, req: Request) -> None:
        """Free a running request's KV and queue it for recompute (front of the queue)."""
        self._release(req, finished=False)
        req.drop_pending()
        req.status = Status.WAITING
        req.kv_len = 0
        req.prefix_slab = None
        req.retractions += 1
        self.retractions += 1
        self.waiting.appendleft(req)

    # -- scheduling ----------------------------------------------------------------------------
    def schedule(self) -> Step | None:
        step = self._schedule_prefill()
        if step is not None:
            return step
        return self._schedule_decode()

    def _schedule_prefill(self) -> Step | None:
        budget = self.chunk_tokens
        items: list[PrefillItem] = []
        # prompt blocks being computed right now and not cached yet: a request whose prompt
        # starts with one of them waits until it is cached (then any number reuse it at once)
        in_flight: set[int] = set()
        # continue requests whose prompt is partly prefilled (chunked prefill) first
        for req in self.running:
            if req.kv_len < req.prefill_target:
                in_flight.update(self._computing(req))
                if budget <= 0:
                    continue
                n = min(budget, req.prefill_target - req.kv_len)
                items.append(PrefillItem(req, req.kv_len, req.kv_len + n, req.kv_len + n == req.prefill_target))
                budget -= n
        deferred: list[Request] = []
        while self.waiting and budget > 0:
            req = self.waiting[0]
            if in_flight and req.retractions == 0 and not in_flight.isdisjoint(self._prefix_blocks(req)[0]):
                deferred.append(self.waiting.popleft())  # reuse the prefix once it is cached
                continue
            if not self._admit(req):
                break
            self.waiting.popleft()
            in_flight.update(self._computing(req))
            if req.kv_len >= req.prefill_target:
                # fully cached prompt: recompute the last token so there are logits to sample
                req.kv_len = req.prefill_target - 1
            n = min(budget, req.prefill_target - req.kv_len)
            items.append(PrefillItem(req, req.kv_len, req.kv_len + n, req.kv_len + n == req.prefill_target))
            budget -= n
        self.waiting.extendleft(reversed(deferred))
        if not items:
            return None
        return Step("extend", prefill=items)

    def schedule_decode(self) -> Step | None:
        """A decode step only (the overlapped path: nothing is waiting to be prefilled)."""
        return self._schedule_decode()

    def _schedule_decode(self) -> Step | None:
        while True:
            # requests whose last token is already queued (by count) are not stepped again
            reqs = [r for r in self.running
                    if r.kv_len >= r.prefill_target and len(r.output_ids) < r.params.max_new_tokens]
            if not reqs:
                return None
            rows = np.fromiter((r.row for r in reqs), dtype=np.int64, count=len(reqs))
            slots = self.storage.grow_batch(rows)
            if slots is not None:
                break
            # out of KV: retract the newest request (its KV returns to the pools) and retry
            if len(self.running) == 1:
                # alone and still out of KV (admission's capacity check makes this rare): this
                # request fails, never the engine: everyone else waiting is served after it
                self.fail(self.running[0], "the KV cache cannot hold this request's next token "
                                           f"({self.running[0].seq_len} tokens held)")
                continue
            self.retract(max(self.running, key=lambda x: x.seq))
        slot_of = dict(zip((id(r) for r in reqs), slots.tolist()))
        reqs.sort(key=lambda r: (r.prefix_slab or (-1, 0), r.row))
        return Step("decode", decode=reqs, decode_slots=[slot_of[id(r)] for r in reqs])

    # -- after the forward -------------------------------------------------------------------
    def commit_prefill(self, item: PrefillItem) -> None:
        req = item.req
        req.kv_len = item.end
        if item.last_chunk:
            # let requests admitted from now on share this prompt's KV (SGLang caches unfinished
            # requests the same way); for granikv this is what makes a fresh slab shared
            self.storage.cache_prompt(req.handle, req.kv_tokens(req.kv_len))

    def commit_decode(self, req: Request) -> None:
        req.kv_len += 1

    def finish(self, req: Request) -> None:
        self._release(req, finished=True)
        req.status = Status.FINISHED
