"""Per-request sampling (temperature, top-k, top-p, seed) and logprobs over a step's logits.

Greedy requests take the argmax, which the decode step already computed on the device (the
CUDA graph writes it into the runner's `tok_buf`); a step whose requests are all greedy and ask
for no logprobs never calls into this module (runner.py: `SamplingParams.plain`).

Sampled rows are drawn on the logits' device by inverse-CDF sampling, with one uniform number
per row drawn on the host: from the request's own generator when it has a seed (so a seeded
request gives the same tokens whatever else is in the batch), else from the engine's
config-seeded generator. Tensor-parallel ranks hold identical all-gathered logits and
identically seeded generators, so they draw the same tokens without communication. The order
of operations is vLLM's and Hugging Face's: temperature, then top-k, then top-p on the
renormalised top-k distribution.

Logprobs are the model's raw distribution, as vLLM's default ("raw logprobs"): log_softmax in
float32 of the unmodified logits, before temperature, top-k and top-p.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from granikv.engine.request import SamplingParams

_TINY = torch.finfo(torch.float32).tiny
# rows sampled per pass: the sort and its float32/int64 temporaries take ~10 copies of
# rows x vocab x 4 bytes, ~1.5 GB for 256 rows of a 152K vocabulary, which the KV sizing's
# reserve (builder.py) should not have to hold; 64 rows keep it under ~0.4 GB
ROW_CHUNK = 64


@dataclass(frozen=True)
class TokenLogprobs:
    """The sampled token's raw logprob and, when asked for k >= 1, the k most likely tokens of
    the same distribution as (token id, logprob), most likely first (empty for logprobs=0)."""

    logprob: float
    top: list[tuple[int, float]]


@dataclass
class Sampled:
    """A step's tokens, one per sampling request in step order, and their logprobs (None when
    no request of the step asked; else one entry per request, None for those that did not)."""

    tokens: list[int]
    logprobs: list[TokenLogprobs | None] | None = None


@dataclass
class DeviceSample:
    """A sampling step's results still on the logits' device (or copied into pinned host
    tensors in flight): `tokens` [n] for every row; for the rows `lp_rows` that asked for
    logprobs, `chosen` [r] and the top `k` of each as `top_vals` / `top_ids` [r, max k]."""

    tokens: torch.Tensor
    lp_rows: list[int]
    lp_k: list[int]
    chosen: torch.Tensor | None = None
    top_vals: torch.Tensor | None = None
    top_ids: torch.Tensor | None = None

    def to_host(self, pinned: bool) -> DeviceSample:
        """Queue the copies to the host (non-blocking into pinned memory when `pinned`)."""
        def cp(t):
            if t is None:
                return None
            if not pinned:
                return t.cpu()
            h = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            h.copy_(t, non_blocking=True)
            return h
        return DeviceSample(cp(self.tokens), self.lp_rows, self.lp_k, cp(self.chosen), cp(self.top_vals),
                            cp(self.top_ids))

    def result(self) -> Sampled:
        """The host view (call once the copies of `to_host` have landed)."""
        tokens = self.tokens.tolist()
        if not self.lp_rows:
            return Sampled(tokens)
        lps: list[TokenLogprobs | None] = [None] * len(tokens)
        chosen = self.chosen.tolist()
        vals = self.top_vals.tolist() if self.top_vals is not None else None
        ids = self.top_ids.tolist() if self.top_ids is not None else None
        for j, (i, k) in enumerate(zip(self.lp_rows, self.lp_k)):
            top = list(zip(ids[j][:k], vals[j][:k])) if k else []
            lps[i] = TokenLogprobs(chosen[j], top)
        return Sampled(tokens, lps)


def draw_uniforms(params: list[SamplingParams], generators: list[torch.Generator | None],
                  default: torch.Generator) -> list[float]:
    """One uniform in [0, 1) per row with temperature > 0, in row order: from the row's own
    generator when it has one, else from `default`, in one call for all unseeded rows: the
    default generator's state then depends only on how many unseeded rows sampled, the same on
    every TP rank."""
    rows = [i for i, p in enumerate(params) if p.temperature > 0]
    shared = iter(torch.rand(sum(generators[i] is None for i in rows), generator=default).tolist())
    return [next(shared) if generators[i] is None else float(torch.rand(1, generator=generators[i]))
            for i in rows]


def filter_probs(x: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x: [m, V] float32 logits already divided by the temperature. Returns the sampling
    distribution as probabilities [m, V] and, when top-k or top-p applies, the vocabulary order
    (ids [m, V], most likely first) the probabilities are in. `top_k` [m] (V = off) masks every
    token past rank k; `top_p` [m] (>= 1: off) then keeps the smallest prefix of the renormalised
    top-k distribution whose mass reaches p (a token is kept when the mass before it is < p, so
    the most likely one always is)."""
    if top_k is None and top_p is None:
        return torch.softmax(x, dim=-1), None
    xs, order = x.sort(dim=-1, descending=True, stable=True)
    if top_k is not None:
        ranks = torch.arange(xs.shape[-1], device=xs.device)
        xs = xs.masked_fill(ranks[None, :] >= top_k[:, None], float("-inf"))
    probs = torch.softmax(xs, dim=-1)
    if top_p is not None:
        before = probs.cumsum(dim=-1) - probs
        xs = xs.masked_fill(before >= top_p[:, None], float("-inf"))
        probs = torch.softmax(xs, dim=-1)
    return probs, order


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The index each row's uniform `u` [m] selects from `probs` [m, V]: the first index whose
    cumulative mass exceeds u * total. Never an index of zero probability (the CDF does not rise
    there; a u that rounds up to the total is clamped to the last index of positive mass)."""
    cdf = probs.cumsum(dim=-1)
    idx = torch.searchsorted(cdf, (u[:, None] * cdf[:, -1:]).contiguous(), right=True).squeeze(-1)
    last = probs.shape[-1] - 1 - (probs > 0).flip(-1).to(torch.int8).argmax(dim=-1)
    return torch.minimum(idx, last)


def filtered(p: SamplingParams, vocab: int) -> bool:
    """Whether top-k or top-p limits the row (its draw then walks the sorted vocabulary)."""
    return 0 < p.top_k < vocab or p.top_p < 1.0


def sample_rows(logits: torch.Tensor, params: list[SamplingParams], u: list[float]) -> torch.Tensor:
    """Tokens [m] for rows that all have temperature > 0 (`u`: one uniform each) and are all
    `filtered` or all not (the inverse CDF walks the sorted vocabulary or the vocabulary's own
    order: a row's token must not depend on which other rows share its pass)."""
    dev = logits.device
    m, vocab = logits.shape
    temps = torch.tensor([max(p.temperature, _TINY) for p in params], dtype=torch.float32)
    x = logits.float()
    # shift by the max before dividing: a tiny temperature (1e-40) would overflow float32 to
    # inf and softmax to NaN; shifted, the max is 0 and the rest go to -inf (greedy). The
    # divisor stays a normal float32 (1e-300 would round to 0, and 0/0 is NaN)
    x = (x - x.amax(dim=-1, keepdim=True)) / temps.to(dev)[:, None]
    top_k = top_p = None
    # a row without a filter gets a bound that masks nothing (top-p 2: a float32 cumulative sum
    # may round past 1), so its draw is the same whatever filters the other rows of the pass use
    if any(0 < p.top_k < vocab for p in params):
        top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params], device=dev)
    if any(p.top_p < 1.0 for p in params):
        top_p = torch.tensor([p.top_p if p.top_p < 1.0 else 2.0 for p in params], dtype=torch.float32, device=dev)
    probs, order = filter_probs(x, top_k, top_p)
    idx = inverse_cdf(probs, torch.tensor(u, dtype=torch.float32, device=dev))
    return idx if order is None else order.gather(1, idx[:, None]).squeeze(1)


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None],
           default: torch.Generator, greedy: torch.Tensor | None = None) -> DeviceSample:
    """Tokens and logprobs of one step, on the logits' device (no host sync).

    logits: [n, V] float32, one row per request in `params` order; `generators`: each request's
    own generator (None: `default`); `greedy`: the rows' argmax when the step already has it.
    Rows with temperature 0 take the argmax; the others are drawn as the module doc says."""
    n = len(params)
    logits = logits[:n]
    tokens = logits.argmax(dim=-1) if greedy is None else greedy[:n]
    rows = [i for i, p in enumerate(params) if p.temperature > 0]
    if rows:
        u = dict(zip(rows, draw_uniforms(params, generators, default)))
        tokens = tokens.clone()
        vocab = logits.shape[-1]
        sorted_rows = [i for i in rows if filtered(params[i], vocab)]
        for group in (sorted_rows, [i for i in rows if not filtered(params[i], vocab)]):
            for a in range(0, len(group), ROW_CHUNK):
                part = group[a:a + ROW_CHUNK]
                idx = torch.tensor(part, device=logits.device)
                tokens[idx] = sample_rows(logits[idx], [params[i] for i in part], [u[i] for i in part])
    lp_rows = [i for i, p in enumerate(params) if p.logprobs is not None]
    out = DeviceSample(tokens, lp_rows, [params[i].logprobs for i in lp_rows])
    if lp_rows:
        idx = torch.tensor(lp_rows, device=logits.device)
        lp = torch.log_softmax(logits[idx].float(), dim=-1)
        out.chosen = lp.gather(1, tokens[idx][:, None]).squeeze(1)
        kmax = max(out.lp_k)
        if kmax:
            out.top_vals, out.top_ids = lp.topk(min(kmax, lp.shape[-1]), dim=-1)
    return out
