"""Request state as the scheduler and runner see it.

A request carries its prompt, sampling parameters and the generated tokens; the scheduler
moves it WAITING -> RUNNING -> FINISHED (or back to WAITING on retraction, in which case the
tokens generated so far are kept and re-prefilled: recompute, never a lost request).
"""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PENDING = -1  # placeholder for a token a queued decode step has not returned yet


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


MAX_LOGPROBS = 20  # the most alternatives a request may ask for (OpenAI's top_logprobs limit)


@dataclass(frozen=True)
class SamplingParams:
    """What one request asks of the sampler (granikv/engine/sampling.py).

    temperature 0 is greedy (top_k, top_p and seed then change nothing); top_k <= 0 and
    top_p = 1 are off. `seed` gives the request its own generator, so its tokens do not depend on
    the rest of the batch. `logprobs`: None for none, 0 for the sampled token's, k for it and the
    k most likely tokens (raw logprobs of the model's distribution). A request stops on an EOS id
    unless `ignore_eos`, and on any of `stop_token_ids` always (as vLLM)."""

    max_new_tokens: int = 128
    temperature: float = 0.0  # 0 = greedy
    top_k: int = -1
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    top_p: float = 1.0
    logprobs: int | None = None  # None: none; 0: the sampled token's; k in 1..20: plus the top k

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError("temperature must be a finite number >= 0")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):  # NaN fails too
            raise ValueError("top_p must be in (0, 1]")
        if self.seed is not None and not (isinstance(self.seed, int) and not isinstance(self.seed, bool)
                                          and -(2**63) <= self.seed < 2**64):  # what torch.Generator takes
            raise ValueError("seed must be None or an integer in [-2**63, 2**64)")
        if self.logprobs is not None and not (
                isinstance(self.logprobs, int) and not isinstance(self.logprobs, bool)
                and 0 <= self.logprobs <= MAX_LOGPROBS):
            raise ValueError(f"logprobs must be None or an integer in [0, {MAX_LOGPROBS}]")

    @property
    def plain(self) -> bool:
        """Greedy without logprobs: the decode step's on-device argmax is all it needs, so a
        step of only such requests runs no sampling code at all (runner.py)."""
        return self.temperature == 0 and self.logprobs is None


@dataclass(eq=False)
class Request:
    rid: str
    input_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    shared_prefix_len: int | None = None
    arrival: float = field(default_factory=time.monotonic)
    seq: int = 0  # admission order, assigned by the engine (deterministic across TP ranks)

    status: Status = Status.WAITING
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None  # why the engine ended it (finish_reason "error"), for its client
    # storage / runner state (set while RUNNING)
    handle: Any = None  # the Storage facade's per-request handle
    row: int = -1  # row of the slot table
    kv_len: int = 0  # tokens whose KV is in the cache for this request (cached + computed)
    cached_tokens: int = 0  # tokens reused from the radix cache at (last) admission
    prefix_slab: tuple[int, int] | None = None  # (hot_base, prefix_len) when the prefix is HOT
    retractions: int = 0
    gen: int = 0  # admission generation: results of steps launched before a retraction are dropped
    pending: int = 0  # trailing PENDING placeholders in output_ids (decode steps in flight)
    prefill_target: int = 0  # tokens whose KV the current admission must compute
    slots: object = None  # host copy of the prompt's slots (numpy int32)
    first_token_time: float | None = None
    finish_time: float | None = None
    # the prompt as int32, converted once: admission, cache_prompt and finish each hand the
    # storage the prompt's tokens, and converting a 16K-token list each time is host time per
    # request that grows with Lp (harness.diagnostics.admission)
    prompt_arr: np.ndarray = field(default=None, repr=False)  # type: ignore[assignment]
    # the scheduler's block chain of the prompt (Scheduler._prefix_blocks), built once
    prefix_blocks: tuple[list[int], list[int]] | None = field(default=None, repr=False)
    # the request's own torch.Generator when its params have a seed (made at its first sampled
    # token, kept across retractions: the draws continue where they stopped)
    generator: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.prompt_arr is None:
            self.prompt_arr = np.asarray(self.input_ids, dtype=np.int32)
        # the storage keeps views of it (radix keys), so nothing may write into it
        self.prompt_arr.flags.writeable = False

    def kv_tokens(self, n: int) -> np.ndarray:
        """The first n tokens of prompt + outputs as int32 (what the storage caches). A view of
        `prompt_arr` when n is within the prompt; only the outputs are converted otherwise."""
        p = len(self.input_ids)
        if n <= p:
            return self.prompt_arr[:n]
        return np.concatenate([self.prompt_arr, np.asarray(self.output_ids[: n - p], dtype=np.int32)])

    def token_slice(self, a: int, b: int) -> list[int]:
        """Tokens [a, b) of prompt + outputs, without concatenating the whole context."""
        p = len(self.input_ids)
        if b <= p:
            return self.input_ids[a:b]
        if a >= p:
            return self.output_ids[a - p : b - p]
        return self.input_ids[a:] + self.output_ids[: b - p]

    @property
    def last_token(self) -> int:
        """The newest token (its KV is written by the next decode step). O(1): the decode loop
        must never copy a 16K-token context per request per step."""
        return self.output_ids[-1] if self.output_ids else self.input_ids[-1]

    @property
    def seq_len(self) -> int:
        """Tokens the request's context holds once every known token has KV."""
        return len(self.input_ids) + len(self.output_ids)

    @property
    def needs_prefill(self) -> bool:
        # a decode step needs the KV of every token but the last generated one
        target = self.seq_len - (1 if self.output_ids else 0)
        return self.kv_len < target

    def drop_pending(self) -> None:
        if self.pending:
            del self.output_ids[len(self.output_ids) - self.pending:]
            self.pending = 0

    def check_finished(self, eos_ids: tuple[int, ...], idx: int | None = None) -> bool:
        """Whether the token at output position `idx` (default: the last) ends the request."""
        if not self.output_ids:
            return False
        idx = len(self.output_ids) - 1 if idx is None else idx
        last = self.output_ids[idx]
        if idx + 1 >= self.params.max_new_tokens:
            self.finish_reason = "length"
            return True
        if (not self.params.ignore_eos and last in eos_ids) or last in self.params.stop_token_ids:
            self.finish_reason = "stop"
            return True
        return False
