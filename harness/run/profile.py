"""A cell's profiler capture: wait for steady decode, then ask the server to profile (POST /profile).

What a capture measures (kernel categories, wall, host gap) is defined in the engine package,
`granikv.profiling`, because the server runs it on its engine thread; this module only decides
*when* a serving run is steady and collects the summary beside the client run.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass


@dataclass(frozen=True)
class SteadyPolicy:
    """When a serving run is in steady decode, judged from /server_info polls.

    Steady = the engine holds at least `target_running` requests, none waiting, no extend
    (prefill) step since the previous poll, and at least `min_decode_steps` decode steps since
    the last extend step (past CUDA-graph capture and the first steps' allocator warm-up).
    """

    target_running: int
    steps: int = 20
    min_decode_steps: int = 8
    poll_s: float = 0.5
    timeout_s: float = 1800.0
    post_timeout_s: float = 600.0

    @staticmethod
    def for_batch(batch: int, num_prompts: int, steps: int = 20) -> SteadyPolicy:
        """90% of the concurrency the client can reach (the batch, or fewer prompts)."""
        return SteadyPolicy(target_running=max(1, int(0.9 * min(batch, num_prompts))), steps=steps)


def _counters(info: dict) -> tuple[int, int, int, int]:
    steps = info.get("steps") if isinstance(info.get("steps"), dict) else {}
    return (int(info.get("running") or 0), int(info.get("waiting") or 0), int(steps.get("extend") or 0),
            int(steps.get("decode") or 0))


def _post_json(url: str, doc: dict, timeout: float) -> tuple[int, dict]:
    import json
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=json.dumps(doc).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        body = e.read()
        try:
            return e.code, json.loads(body)
        except ValueError:
            return e.code, {"error": body[:300].decode(errors="replace")}


async def profile_when_steady(base_url: str, policy: SteadyPolicy, state: dict) -> dict:
    """Poll /server_info until steady decode, then POST /profile; the summary, or {"error"}.

    Never raises for a server that misbehaves: a cell's throughput is still a measurement when
    its profile is not. `state["posted"]` tells the caller the capture is under way (worth
    waiting for when the client finishes first).
    """
    from harness.run.systems import get_json

    base = base_url.rstrip("/")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + policy.timeout_s
    last_extend, decode_at_extend, polls = None, 0, 0
    try:
        while True:
            if loop.time() > deadline:
                return {"error": f"no steady decode within {policy.timeout_s:.0f} s ({polls} polls)"}
            try:
                info = await asyncio.to_thread(get_json, base, "/server_info", 10.0)
            except Exception:  # noqa: BLE001 - a busy server may answer late
                await asyncio.sleep(policy.poll_s)
                continue
            polls += 1
            running, waiting, extend, decode = _counters(info)
            if extend != last_extend:
                last_extend, decode_at_extend = extend, decode
            elif (running >= policy.target_running and waiting == 0
                  and decode - decode_at_extend >= policy.min_decode_steps):
                break
            await asyncio.sleep(policy.poll_s)
        state["posted"] = True
        status, doc = await asyncio.to_thread(_post_json, base + "/profile", {"steps": policy.steps},
                                              policy.post_timeout_s)
    except Exception as e:  # noqa: BLE001 - recorded in the result, never fails the cell
        return {"error": f"{type(e).__name__}: {e}"}
    if status != 200 or not isinstance(doc, dict):
        return {"error": f"POST /profile answered HTTP {status}: {doc}"}
    doc["running_at_start"] = running
    return doc


async def alongside(benchmark, base_url: str, policy: SteadyPolicy, out: dict):
    """Await `benchmark` (the client run) while `profile_when_steady` runs beside it; fill `out`
    with the profile section. Returns the benchmark's result."""
    state: dict = {}
    task = asyncio.ensure_future(profile_when_steady(base_url, policy, state))
    finished = False
    try:
        result = await benchmark
        finished = True
        return result
    finally:
        if finished and not task.done() and state.get("posted"):  # the capture is under way: let it end
            await asyncio.wait({task}, timeout=policy.post_timeout_s)
        if task.done() and not task.cancelled() and task.exception() is None:
            out.update(task.result())
        else:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            out["error"] = "the run ended before the engine reached steady decode"
