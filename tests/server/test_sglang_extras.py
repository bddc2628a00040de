"""SGLang's /get_model_info, /model_info and /health_generate, and Prometheus /metrics (parsed
with prometheus_client's own parser) against the CPU server."""

from __future__ import annotations

import json
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=60) as r:
        return r.status, r.read()


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def _samples(url: str) -> dict:
    _, text = _get(url + "/metrics")
    out = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_model_info_in_sglangs_shape(cpu_server):
    for path in ("/get_model_info", "/model_info"):
        status, body = _get(cpu_server.url + path)
        info = json.loads(body)
        assert status == 200 and info["is_generation"] is True
        assert info["model_path"] == "tiny" and "tokenizer_path" in info
        assert info["max_context_length"] == 8192


def test_health_generate_generates(cpu_server):
    before = _samples(cpu_server.url)
    status, body = _get(cpu_server.url + "/health_generate")
    assert status == 200 and json.loads(body)["status"] == "ok"
    after = _samples(cpu_server.url)
    key = ("granikv_decode_steps_total", (("path", "all"),))
    # the one token came from a prefill step: the engine's step counters moved, not the decode ones
    assert after[key] == before[key]


def test_metrics_count_requests_tokens_and_latencies(cpu_server):
    before = _samples(cpu_server.url)
    out = _post(cpu_server.url + "/generate", {"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 5}})
    comp = _post(cpu_server.url + "/v1/completions", {"prompt": [9, 8, 7], "max_tokens": 3, "temperature": 0})
    after = _samples(cpu_server.url)

    def delta(name, labels=()):
        return after.get((name, labels), 0.0) - before.get((name, labels), 0.0)

    assert len(out["output_ids"]) == 5 and comp["usage"]["completion_tokens"] == 3
    assert delta("granikv_generation_tokens_total") == 8
    assert delta("granikv_prompt_tokens_total") == 7
    assert delta("granikv_request_success_total", (("finish_reason", "length"),)) == 2
    assert delta("granikv_time_to_first_token_seconds_count") == 2
    assert delta("granikv_time_per_output_token_seconds_count") == 2
    assert after[("granikv_num_running_reqs", ())] == 0 and after[("granikv_num_waiting_reqs", ())] == 0
    for pool in ("hot", "cold"):
        assert 0.0 <= after[(f"granikv_{pool}_occupancy", ())] <= 1.0
    assert ("granikv_prefix_class_decisions_total", (("decision", "dense"),)) in after


def test_each_app_has_its_own_registry():
    from granikv.server.metrics import Metrics

    a, b = Metrics(), Metrics()
    a.trace(10).tokens(3)
    assert b"granikv_generation_tokens_total 3.0" in a.render(None)
    assert b"granikv_generation_tokens_total 0.0" in b.render(None)
