"""Request fields -> checked values: the SGLang-native `sampling_params` and the OpenAI fields.

JSON `null` is the same as an absent field everywhere (the OpenAI spec allows it, and SDKs
send it). Every message names the field as the client spelled it (`max_tokens`, not the
engine's `max_new_tokens`). A parameter the server cannot honour is refused with a 400 that
names it (`UNSUPPORTED`): a client that asked for it must not get output that silently
ignores it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from granikv.engine.request import SamplingParams
from granikv.server.errors import BadRequest

MAX_N = 16  # choices per OpenAI request: n engine requests each
MAX_LOGPROBS = 20  # top alternatives per token (OpenAI's chat limit; the engine's SamplingParams.logprobs)
MAX_STOPS = 16
# characters per stop string: stop strings are delimiters ("\nObservation:", "</answer>"); matching
# them costs per generated token up to their length (detok.py), so a 100 kB one would slow its
# request and the event loop it shares with every other client
MAX_STOP_CHARS = 1024


def get(body: dict, key: str, default=None):
    """body[key], with `null` read as absent."""
    v = body.get(key)
    return default if v is None else v


def as_int(v, name: str, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadRequest(f"{name} must be an integer, got {type(v).__name__}", name)
    if lo is not None and v < lo:
        raise BadRequest(f"{name} must be >= {lo}, got {v}", name)
    if hi is not None and v > hi:
        raise BadRequest(f"{name} must be <= {hi}, got {v}", name)
    return v


def as_float(v, name: str, lo: float | None = None, hi: float | None = None) -> float:
    # JSON's NaN/Infinity parse in Python: refuse them here, never in the engine
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise BadRequest(f"{name} must be a finite number", name)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        bounds = f">= {lo}" if hi is None else f"in [{lo}, {hi}]" if lo is not None else f"<= {hi}"
        raise BadRequest(f"{name} must be {bounds}, got {v}", name)
    return float(v)


def as_bool(v, name: str) -> bool:
    if not isinstance(v, bool):
        raise BadRequest(f"{name} must be a boolean", name)
    return v


def token_ids(v, name: str) -> tuple[int, ...]:
    if not isinstance(v, list):
        raise BadRequest(f"{name} must be a list of integers", name)
    return tuple(as_int(t, f"{name}[]", 0) for t in v)


def _sampling(max_new: int, temperature: float, top_p: float, top_k: int, ignore_eos: bool,
              stop_ids: tuple[int, ...], seed: int | None, logprobs: int | None, max_name: str) -> SamplingParams:
    try:
        return SamplingParams(max_new_tokens=max_new, temperature=temperature, top_k=top_k, ignore_eos=ignore_eos,
                              stop_token_ids=stop_ids, seed=seed, top_p=top_p, logprobs=logprobs)
    except ValueError as e:  # whatever SamplingParams refuses is the client's error, never a 500
        raise BadRequest(str(e).replace("max_new_tokens", max_name)) from None


def parse_native_sampling(sp, default_max: int = 128) -> SamplingParams:
    """SGLang's `sampling_params` object of /generate."""
    if sp is None:
        sp = {}
    if not isinstance(sp, dict):
        raise BadRequest("sampling_params must be an object", "sampling_params")
    max_new = as_int(get(sp, "max_new_tokens", default_max), "max_new_tokens", 1)
    temp = as_float(get(sp, "temperature", 0.0), "temperature", 0.0)
    top_p = as_float(get(sp, "top_p", 1.0), "top_p", 0.0, 1.0)
    if top_p == 0.0:
        raise BadRequest("top_p must be > 0", "top_p")
    top_k = as_int(get(sp, "top_k", -1), "top_k")
    ignore_eos = as_bool(get(sp, "ignore_eos", False), "ignore_eos")
    stop_ids = token_ids(get(sp, "stop_token_ids", []), "stop_token_ids")
    seed = get(sp, "seed")
    seed = None if seed is None else as_int(seed, "seed", 0)
    for name, neutral in (("frequency_penalty", 0.0), ("presence_penalty", 0.0), ("repetition_penalty", 1.0),
                          ("min_p", 0.0)):
        if get(sp, name, neutral) != neutral:
            raise BadRequest(f"{name} is not supported (only {neutral})", name)
    if get(sp, "stop"):
        raise BadRequest("stop strings are not supported on /generate; use stop_token_ids or /v1", "stop")
    return _sampling(max_new, temp, top_p, top_k, ignore_eos, stop_ids, seed, None, "max_new_tokens")


@dataclass(frozen=True)
class OpenAIRequest:
    """One /v1/completions or /v1/chat/completions request after checking."""

    params: SamplingParams  # choice i runs with seed + i when a seed is given (`choice_params`)
    max_tokens: int | None  # None: the rest of the context (chat's default)
    max_tokens_name: str  # the field the client used, for messages
    n: int
    stop: tuple[str, ...]  # stop strings, matched on the detokenized text
    stream: bool
    include_usage: bool
    logprobs: int | None  # alternatives per token (0: the sampled token's own only); None: no logprobs
    echo: bool
    skip_special_tokens: bool = True
    # vLLM's `return_token_ids`: each choice carries the ids it generated (`token_ids`, a stream's
    # chunk the new ones) and its prompt's (`prompt_token_ids`), so a client that builds the next
    # prompt from real outputs (an agent's transcript) needs no tokenizer round trip
    return_token_ids: bool = False

    def choice_params(self, i: int, max_new: int) -> SamplingParams:
        seed = None if self.params.seed is None else self.params.seed + i
        return replace(self.params, seed=seed, max_new_tokens=max_new)


# field -> the only value(s) the server honours (anything else is a 400 naming the field)
_NEUTRAL = {"frequency_penalty": (0, 0.0), "presence_penalty": (0, 0.0), "repetition_penalty": (1, 1.0),
            "min_p": (0, 0.0), "min_tokens": (0,), "logit_bias": ({},), "suffix": ("",), "tools": ([],),
            "functions": ([],), "tool_choice": ("none",), "function_call": ("none",),
            "parallel_tool_calls": (False, True), "prompt_logprobs": (0,), "use_beam_search": (False,),
            "length_penalty": (1, 1.0), "guided_json": (), "guided_regex": (), "guided_choice": (),
            "guided_grammar": (), "regex": (), "json_schema": (), "ebnf": (), "lora_path": (),
            "audio": (), "modalities": (["text"],), "prediction": (), "reasoning_effort": ()}


def _refuse_unsupported(body: dict) -> None:
    for name, ok in _NEUTRAL.items():
        v = body.get(name)
        if v is not None and v not in ok:
            raise BadRequest(f"{name} is not supported by this server", name)
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise BadRequest("response_format other than {\"type\": \"text\"} is not supported", "response_format")


def _stop(v) -> tuple[str, ...]:
    if v is None:
        return ()
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise BadRequest("stop must be a string or a list of strings", "stop")
    if len(v) > MAX_STOPS:
        raise BadRequest(f"stop takes at most {MAX_STOPS} strings, got {len(v)}", "stop")
    if any(s == "" for s in v):
        raise BadRequest("stop strings must not be empty", "stop")
    if any(len(s) > MAX_STOP_CHARS for s in v):
        raise BadRequest(f"stop strings may be at most {MAX_STOP_CHARS} characters long, got "
                         f"{max(len(s) for s in v)}", "stop")
    return tuple(v)


def parse_openai(body: dict, chat: bool, logprobs_supported: bool, default_max: int | None) -> OpenAIRequest:
    """The fields of /v1/completions (`chat=False`) or /v1/chat/completions shared by both."""
    _refuse_unsupported(body)
    n = as_int(get(body, "n", 1), "n", 1, MAX_N)
    best_of = get(body, "best_of")
    if best_of is not None and as_int(best_of, "best_of", 1) != n:
        raise BadRequest("best_of must equal n (no server-side ranking of choices)", "best_of")
    name = "max_tokens"
    max_tokens = get(body, "max_tokens")
    if chat and get(body, "max_completion_tokens") is not None:
        name, max_tokens = "max_completion_tokens", body["max_completion_tokens"]
    max_tokens = default_max if max_tokens is None else as_int(max_tokens, name, 1)
    # OpenAI's default (as vLLM's and SGLang's); greedy is temperature 0
    temp = as_float(get(body, "temperature", 1.0), "temperature", 0.0, 2.0)
    top_p = as_float(get(body, "top_p", 1.0), "top_p", 0.0, 1.0)
    if top_p == 0.0:
        raise BadRequest("top_p must be > 0", "top_p")
    top_k = as_int(get(body, "top_k", -1), "top_k")
    seed = get(body, "seed")
    seed = None if seed is None else as_int(seed, "seed", 0, 2**63 - 1 - MAX_N)
    ignore_eos = as_bool(get(body, "ignore_eos", False), "ignore_eos")
    stop_ids = token_ids(get(body, "stop_token_ids", []), "stop_token_ids")
    stream = as_bool(get(body, "stream", False), "stream")
    opts = get(body, "stream_options")
    include_usage = False
    if opts is not None:
        if not isinstance(opts, dict):
            raise BadRequest("stream_options must be an object", "stream_options")
        if not stream:
            raise BadRequest("stream_options is only allowed when stream is true", "stream_options")
        include_usage = as_bool(get(opts, "include_usage", False), "stream_options.include_usage")
    logprobs: int | None = None
    if chat:
        if as_bool(get(body, "logprobs", False), "logprobs"):
            logprobs = as_int(get(body, "top_logprobs", 0), "top_logprobs", 0, MAX_LOGPROBS)
        elif get(body, "top_logprobs") is not None:
            raise BadRequest("top_logprobs needs logprobs: true", "top_logprobs")
        echo = False
    else:
        lp = get(body, "logprobs")
        logprobs = None if lp is None else as_int(lp, "logprobs", 0, MAX_LOGPROBS)
        echo = as_bool(get(body, "echo", False), "echo")
        if echo and logprobs is not None:
            raise BadRequest("echo together with logprobs is not supported (no prompt logprobs)", "echo")
    if logprobs is not None and not logprobs_supported:
        raise BadRequest("logprobs are not supported by this engine", "logprobs")
    skip = as_bool(get(body, "skip_special_tokens", True), "skip_special_tokens")
    return_ids = as_bool(get(body, "return_token_ids", False), "return_token_ids")
    params = _sampling(max_tokens or 1, temp, top_p, top_k, ignore_eos, stop_ids, seed, logprobs, name)
    return OpenAIRequest(params, max_tokens, name, n, _stop(get(body, "stop")), stream, include_usage, logprobs,
                         echo, skip, return_ids)
