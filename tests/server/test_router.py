"""Scale-out: two CPU replicas (`python -m granikv.server --model tiny --device cpu`, as a user
starts them) behind the real sglang-router with `--policy cache_aware` (docs/scale-out.md).

GraniKV's gain comes from reading a shared prefix once per decode step, which holds only while
every request that shares the prefix runs on one replica: split over two, each replica holds and
reads its own copy. The router keeps a prefix tree of the text it has sent to each replica: a
request whose text matches more than `--cache-threshold` of one replica's tree goes there, any
other to the replica with the fewest requests in flight. Balancing by load
(`--balance-abs-threshold`) would override the trees whenever in-flight counts differ enough, at
the mercy of timing, so the test sets it out of reach. The rest it holds fixed: each family's
first request is sent alone (concurrent requests of one family never race to an empty tree), and
family B's first request arrives while exactly one request of family A is in flight, so the
router must send the new prefix to the idle replica. The test thus also fails for a router that
sends everything to one replica."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import LiveServer, free_port, start_server, stop_server

pytest.importorskip("sglang_router")  # the `test` extra installs it; absent on a bare GPU image

pytestmark = pytest.mark.timeout(300)  # a hung replica or router fails the test instead of blocking CI

TOKENS = 4
GREEDY = {"max_new_tokens": TOKENS, "temperature": 0}
# Two long prefixes that differ from their first character (the router's tree matches characters).
PREFIX_A = "".join(f"Shared system prompt of team A, rule {i}: answer briefly and cite the plan. "
                   for i in range(12))
PREFIX_B = "".join(f"Team B's own role prompt, clause {i}: review every change before it is merged. "
                   for i in range(12))


def _post(url: str, body: dict, timeout: float = 120) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise AssertionError(f"{url}: {e.code} {e.read()[:500]!r}") from None


def _get(url: str, timeout: float = 30) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def _metrics(srv: LiveServer) -> dict[str, float]:
    """Requests this replica finished (aborted ones left out) and requests it is running."""
    with urllib.request.urlopen(srv.url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    out = {"finished": 0.0, "running": 0.0}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "granikv_request_success_total" and s.labels.get("finish_reason") != "abort":
                out["finished"] += s.value
            elif s.name == "granikv_num_running_reqs":
                out["running"] = s.value
    return out


def _finished(replicas: list[LiveServer]) -> list[int]:
    return [int(_metrics(r)["finished"]) for r in replicas]


def _wait_idle(replicas: list[LiveServer], timeout_s: float = 30.0) -> None:
    t0 = time.time()
    while any(_metrics(r)["running"] for r in replicas):
        assert time.time() - t0 < timeout_s, "a replica still runs an aborted request"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def replicas():
    """Two replicas, started side by side (each boots its own engine process)."""
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(start_server) for _ in range(2)]
    started = [f.result() for f in futures if f.exception() is None]
    try:
        for f in futures:
            if f.exception() is not None:
                raise f.exception()
        yield started
    finally:
        for srv in started:
            stop_server(srv)


def start_router(worker_urls: list[str], log_path: str, timeout_s: float = 60.0) -> tuple[str, subprocess.Popen]:
    """`python -m sglang_router.launch_router` (the `sglang-router launch` console script) on a free
    port; returns once every worker is registered and healthy."""
    port, prom = free_port(), free_port()
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
           "--worker-urls", *worker_urls, "--policy", "cache_aware",
           "--cache-threshold", "0.5",  # a shared prefix is ~95% of each prompt; a foreign one ~0%
           "--balance-abs-threshold", "1000000",  # never balance by load: routing by prefix alone
           "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom),
           "--worker-startup-timeout-secs", "30", "--request-timeout-secs", "120",
           "--shutdown-grace-period-secs", "1", "--log-level", "warn"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    t0 = time.time()
    while time.time() - t0 < timeout_s:
        if proc.poll() is not None:
            break
        try:
            workers = _get(url + "/workers", timeout=5)["workers"]
            if len(workers) == len(worker_urls) and all(w["is_healthy"] for w in workers):
                return url, proc
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    stop_router(proc)
    raise RuntimeError(f"sglang-router did not register {worker_urls}:\n{open(log_path).read()[-3000:]}")


def stop_router(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@pytest.fixture
def router(replicas, tmp_path):
    """A fresh router (an empty prefix tree) in front of the two replicas."""
    url, proc = start_router([r.url for r in replicas], str(tmp_path / "router.log"))
    try:
        yield url
    finally:
        stop_router(proc)


def _family(router: str, prefix: str) -> list[dict]:
    """One agent family: the first request alone, then a burst of /generate, /v1/completions and
    /v1/chat/completions requests at once, each the shared prefix plus the agent's own suffix."""
    def gen(i):
        return _post(router + "/generate", {"text": prefix + f"Agent {i}: what is your next step?",
                                            "sampling_params": GREEDY})

    def completion(i):
        return _post(router + "/v1/completions", {"model": "tiny", "prompt": prefix + f"Agent {i}: go on.",
                                                  "max_tokens": TOKENS, "temperature": 0})

    def chat(i):
        msg = [{"role": "user", "content": prefix + f"Agent {i}: summarise the plan."}]
        return _post(router + "/v1/chat/completions", {"model": "tiny", "messages": msg, "max_tokens": TOKENS,
                                                       "temperature": 0})

    first = gen(0)
    calls = [(gen, 1), (gen, 2), (completion, 3), (chat, 4)]
    with ThreadPoolExecutor(len(calls)) as pool:
        return [first, *pool.map(lambda c: c[0](c[1]), calls)]


def test_a_shared_prefix_stays_on_one_replica(replicas, router):
    before = _finished(replicas)
    a = _family(router, PREFIX_A)
    n = len(a)
    after_a = _finished(replicas)
    da = [x - y for x, y in zip(after_a, before)]
    assert sorted(da) == [0, n], f"family A split over the replicas: {da}"

    # a request of family A stays in flight (streamed, long) while family B arrives
    hold = urllib.request.Request(router + "/generate", headers={"Content-Type": "application/json"}, data=json.dumps(
        {"text": PREFIX_A + "Agent 5: think aloud.", "stream": True,
         "sampling_params": {"max_new_tokens": 2048, "ignore_eos": True}}).encode())
    with urllib.request.urlopen(hold, timeout=120) as stream:
        assert stream.readline().startswith(b"data: ")  # routed and running
        b = _family(router, PREFIX_B)
    _wait_idle(replicas)  # the router passed the client's disconnect on: the replica aborted it
    db = [x - y for x, y in zip(_finished(replicas), after_a)]
    assert db == [0 if d else n for d in da], f"family B not on the other replica: A {da}, B {db}"

    # every /generate after a family's first reads the prefix from its replica's cache (prompts are bytes)
    for out in a[1:3]:
        assert out["meta_info"]["cached_tokens"] >= len(PREFIX_A.encode()), out["meta_info"]
    for out in b[1:3]:
        assert out["meta_info"]["cached_tokens"] >= len(PREFIX_B.encode()), out["meta_info"]


def test_the_router_answers_as_a_replica_does(replicas, router):
    """Greedy answers through the router equal a replica's own (both replicas hold the same dummy
    weights, seed 0), for SGLang's /generate, streamed and not, and the OpenAI routes."""
    direct = replicas[0].url
    text = PREFIX_A + "Agent 9: report."
    gen = {"text": text, "sampling_params": GREEDY}
    want = _post(direct + "/generate", gen)
    got = _post(router + "/generate", gen)
    assert (got["text"], got["output_ids"]) == (want["text"], want["output_ids"])
    assert got["meta_info"]["prompt_tokens"] == len(text.encode())

    req = urllib.request.Request(router + "/generate", data=json.dumps({**gen, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        events = [line[6:] for line in r.read().decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["text"] == want["text"]  # cumulative text (SGLang's default streaming)

    comp = {"model": "tiny", "prompt": text, "max_tokens": TOKENS, "temperature": 0}
    assert (_post(router + "/v1/completions", comp)["choices"][0]["text"]
            == _post(direct + "/v1/completions", comp)["choices"][0]["text"] == want["text"])
    chat = {"model": "tiny", "messages": [{"role": "user", "content": text}], "max_tokens": TOKENS,
            "temperature": 0}
    got_chat, want_chat = _post(router + "/v1/chat/completions", chat), _post(direct + "/v1/chat/completions", chat)
    assert got_chat["choices"][0]["message"] == want_chat["choices"][0]["message"]
    for key in ("prompt_tokens", "completion_tokens"):
        assert got_chat["usage"][key] == want_chat["usage"][key]


def test_the_router_lists_the_served_model(router):
    """The router names a worker's model from `served_model_name` (else `model_path`) at the top
    of its GET /server_info, and answers /v1/models itself from that."""
    assert [m["id"] for m in _get(router + "/v1/models")["data"]] == ["tiny"]
