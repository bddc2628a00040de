"""Streaming load generator for the SGLang-native HTTP API (`POST /generate`) or the OpenAI one
(`POST /v1/completions`).

The same client drives every system (paged, cascade, granikv in the bundled engine, and a real
SGLang server), so differences in the numbers come from the servers, not from the client.
It sends what SGLang's `bench_serving --backend sglang` sends for token-id prompts:

    {"input_ids": [...], "sampling_params": {"max_new_tokens": N, "ignore_eos": true,
     "temperature": 0.0}, "stream": true}

plus, only when `send_prefix_hint` is set, `"shared_prefix_len": Lp` (the explicit HOT-prefix
boundary (docs/design.md, "Storage"); off by default so the payload is exactly bench_serving's).

With `api="completions"` it sends what `bench_serving --backend vllm` (OpenAI completions) sends
for token-id prompts, plus `stream_options.include_usage` for an exact token count:

    {"model": M, "prompt": [...], "max_tokens": N, "temperature": 0.0, "ignore_eos": true,
     "stream": true, "stream_options": {"include_usage": true}}

(`ignore_eos` is an extra field SGLang and vLLM accept; the hint goes in the body the same way).
Each OpenAI chunk carries only its own text (`choices[0].text`): a chunk with text is one arrival
(TTFT, ITL), and the output token count is the final usage chunk's `completion_tokens` (the
count of chunks with text when a server sends no usage), as bench_serving counts them.

Run shape (bench_serving's): warm-up requests (the first workload request, at most
`warmup_output_len` tokens, excluded from metrics) -> optional `POST /flush_cache` -> the
measured run, where request i becomes ready at `t_unit_i / rate` (the workload's rate-1
Poisson times; `rate=inf` sends all at once) and then waits for one of `max_concurrency`
slots. Send time (TTFT's origin) is taken when the slot is granted, as in bench_serving.
Failed requests (HTTP errors, disconnects, timeouts, streams without `[DONE]`) are recorded
with their error and counted in `failed`; they never stop the run. Metrics: `metrics`.

Closed-loop session mode (workloads whose requests carry a `session` step, kind `debate`): a
session is a sequence of rounds whose prompts depend on earlier outputs. Each session starts at
its first request's arrival time; its round r is sent (all members at once, each still waiting
for a `max_concurrency` slot) when every request of round r - 1 has finished, each prompt being
the request's `input_ids` with the output token ids of the session's earlier rounds (rounds in
order, members in order) inserted at `session.insert_at`. Sessions progress independently. The
output ids are read from the response: /generate's `output_ids` (cumulative, or incremental with
SGLang's incremental streaming); /v1/completions sends vLLM's `"return_token_ids": true` and reads
`choices[0].token_ids`, and a stream without them fails the request (a server that cannot return
ids cannot run a closed loop). A failed request ends its session: the later rounds are recorded
as failed ("not sent") and never sent, because a transcript with a turn missing would make every
later prompt a different workload from the one the file describes. Metrics are the same
functions of the same records (all rounds of all sessions: one duration, TTFT/TPOT per request).

Modules: `benchmark` (ClientConfig, the run: warm-up, flush, measured requests), `stream` (a
streamed response read into a request's record), `sessions` (the closed-loop mode), `metrics`
(bench_serving's definitions) and `cli` (`python -m harness.run.client`).
"""
