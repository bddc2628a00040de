"""Profiler summaries: kernel names -> step categories, the host gap from overlapping kernel
intervals, a capture window driven through the engine thread, and POST /profile on a CPU
server (a clear 400, and the server keeps serving)."""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from engine_testutil import tiny_config

from granikv.engine.engine import Engine
from granikv.engine.request import SamplingParams  # noqa: E402
from granikv.profiling import capture, categorize, kernel_events, summarize, top_kernels, union_us  # noqa: E402
from granikv.runtime.loop import EngineLoop  # noqa: E402
from granikv.server.app import build_app  # noqa: E402
from granikv.server.text import TextCodec  # noqa: E402
from harness.run.profile import SteadyPolicy, alongside, profile_when_steady  # noqa: E402

# names as torch.profiler reports them on an H100/H200 (Triton kernels by their function name)
REAL_NAMES = {
    "_prefix_kernel": "prefix_attention",
    "_combine_prefix_kernel": "prefix_attention",
    "_decode_kernel": "decode_attention",
    "_fold": "decode_attention",
    "_combine_decode_kernel": "decode_attention",
    "_merge_kernel": "decode_attention",
    "void pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false>>(Flash_fwd_params)":
        "decode_attention",
    "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT": "linear_gemm",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas":
        "linear_gemm",
    "ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn": "linear_gemm",
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>(Params)":
        "linear_gemm",
    "void gemv2T_kernel_val<int, int, __nv_bfloat16, float, float, 128, 16, 4, 4, false>(...)": "linear_gemm",
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "nccl",
    "_store_kernel": "other",
    "_extend_kernel": "other",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>(...)": "other",
    "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0": "other",
    "Memcpy HtoD (Pageable -> Device)": "other",
    "void at::native::unfold_backward_elementwise_kernel<float>(...)": "other",
}


@pytest.mark.parametrize("name,category", sorted(REAL_NAMES.items()))
def test_categorize_real_kernel_names(name, category):
    assert categorize(name) == category


def test_union_counts_overlap_once():
    assert union_us([(0, 10), (5, 15), (20, 30), (22, 25)]) == 25
    assert union_us([]) == 0
    assert union_us([(3, 3)]) == 0


def test_summarize_categories_host_gap_and_wall():
    # two steps: GEMM 0-40 and a concurrent NCCL 30-50 (overlap 10 us), prefix 60-80, decode
    # 80-90, an elementwise kernel 100-110; idle 50-60 and 90-100
    events = [
        ("nvjet_tst_x", 0, 40), ("ncclDevKernel_AllReduce", 30, 50), ("_prefix_kernel", 60, 80),
        ("_decode_kernel", 80, 90), ("elementwise_kernel", 100, 110),
    ]
    s = summarize(events, steps=2)
    assert s["linear_gemm_ms"] == pytest.approx(0.040)
    assert s["nccl_ms"] == pytest.approx(0.020)
    assert s["prefix_attention_ms"] == pytest.approx(0.020)
    assert s["decode_attention_ms"] == pytest.approx(0.010)
    assert s["other_ms"] == pytest.approx(0.010)
    assert s["total_kernel_ms"] == pytest.approx(0.100)  # sum of durations (overlap counted twice)
    assert s["gpu_busy_ms"] == pytest.approx(0.090)  # union
    assert s["decode_wall_ms"] == pytest.approx(0.110)  # the kernel span without a host wall
    assert s["host_gap_ms"] == pytest.approx(0.020)
    assert s["kernels"] == 5 and s["steps"] == 2
    assert s["step_ms"] == pytest.approx(0.055)
    # a host-measured wall adds the host time outside the span to the gap
    h = summarize(events, steps=2, wall_ms=0.5)
    assert h["decode_wall_ms"] == pytest.approx(0.5) and h["host_gap_ms"] == pytest.approx(0.41)
    assert h["wall_source"] == "host"
    # a wall shorter than the kernel span (clock skew) never makes the gap negative
    assert summarize(events, 2, wall_ms=0.01)["host_gap_ms"] == pytest.approx(0.020)


def test_summarize_empty_window():
    s = summarize([], steps=3, wall_ms=1.5)
    assert s["total_kernel_ms"] == 0 and s["host_gap_ms"] == pytest.approx(1.5) and s["kernels"] == 0


def test_kernel_events_keep_gpu_activities_and_drop_annotations():
    import types

    import torch

    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU

    def ev(name, dev, s, e, ann=False):
        tr = types.SimpleNamespace(start=s, end=e, elapsed_us=lambda: e - s)
        return types.SimpleNamespace(name=name, device_type=dev, time_range=tr, is_user_annotation=ann)

    prof = types.SimpleNamespace(events=lambda: [
        ev("_decode_kernel", cuda, 10, 20), ev("granikv::forward", cpu, 0, 30),
        ev("granikv::forward", cuda, 5, 40),             # the range mirrored on the GPU timeline
        ev("some_range", cuda, 5, 40, ann=True),          # flagged by torch
        ev("Memcpy HtoD (Pinned -> Device)", cuda, 1, 3), ev("empty", cuda, 7, 7),
    ])
    assert kernel_events(prof) == [("_decode_kernel", 10.0, 20.0), ("Memcpy HtoD (Pinned -> Device)", 1.0, 3.0)]


def test_capture_on_cpu_counts_steps_and_stops_when_idle():
    calls = []

    from granikv.trace import span

    def step():
        with span("schedule"):
            calls.append(1)
        return len(calls) < 3  # the third call says "nothing to do"

    s = capture(step, 5)
    assert s["device"] in ("cpu", "cuda") and s["requested_steps"] == 5
    assert set(s["host_phase_ms"]) == {"schedule"} and s["host_phase_ms"]["schedule"] >= 0
    assert s["steps"] == 2 and len(calls) == 3
    assert s["decode_wall_ms"] >= 0
    with pytest.raises(ValueError):
        capture(step, 0)


def test_capture_window_runs_on_the_engine_thread_and_clients_still_finish():
    engine = Engine(tiny_config("granikv", kernel_impl="torch", max_running=8, max_context=256))
    loop = EngineLoop(engine)
    loop.start()

    async def go():
        params = SamplingParams(max_new_tokens=12, ignore_eos=True)
        qs = [loop.submit(f"r{i}", [1 + i, 2, 3, 4, 5, 6], params, None) for i in range(4)]
        summary = await loop.run_exclusive(lambda step: capture(step, 3))

        async def drain(q):
            n = 0
            while True:
                ev = await q.get()
                n += 1
                if ev.finished:
                    return n
        counts = await asyncio.wait_for(asyncio.gather(*(drain(q) for q in qs)), 60)
        with pytest.raises(RuntimeError, match="boom"):  # fn's error goes to the caller
            await loop.run_exclusive(lambda step: (_ for _ in ()).throw(RuntimeError("boom")))
        return summary, counts

    try:
        summary, counts = asyncio.run(go())
    finally:
        loop.stop()
    assert 1 <= summary["steps"] <= 3
    assert "forward" in summary["host_phase_ms"]  # the engine's granikv.trace spans were captured
    assert counts == [12] * 4  # steps inside the window delivered their tokens too
    assert loop.fatal is None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_profile_endpoint_on_cpu_is_a_clear_400_and_server_keeps_serving():
    engine = Engine(tiny_config("paged", kernel_impl="torch", max_running=8, max_context=256))
    loop = EngineLoop(engine)
    loop.start()
    port = _free_port()
    ready = threading.Event()
    state = {}

    def serve():
        aloop = asyncio.new_event_loop()
        state["loop"] = aloop
        runner = web.AppRunner(build_app(loop, TextCodec()))
        aloop.run_until_complete(runner.setup())
        aloop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        ready.set()
        aloop.run_forever()
        aloop.run_until_complete(runner.cleanup())

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    assert ready.wait(30)
    url = f"http://127.0.0.1:{port}"

    async def go():
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/profile", json={"steps": 5}) as r:
                cpu = (r.status, await r.json())
            async with s.post(url + "/profile", json={"steps": 0}) as r:
                bad = (r.status, await r.json())
            async with s.post(url + "/profile", data=b"{nope") as r:
                malformed = r.status
            async with s.post(url + "/generate", json={"input_ids": [1, 2, 3],
                                                       "sampling_params": {"max_new_tokens": 4}}) as r:
                gen = (r.status, await r.json())
        return cpu, bad, malformed, gen

    try:
        cpu, bad, malformed, gen = asyncio.run(go())
    finally:
        state["loop"].call_soon_threadsafe(state["loop"].stop)
        t.join(10)
        loop.stop()
    assert cpu[0] == 400 and "needs CUDA" in cpu[1]["error"]
    assert bad[0] == 400 and "steps" in bad[1]["error"]
    assert malformed == 400
    assert gen[0] == 200 and len(gen[1]["output_ids"]) == 4


class ScriptedServer:
    """/server_info walks through `infos` (one per poll, the last repeats); /profile answers
    `answer` with `status` and records the bodies it got."""

    def __init__(self, infos: list[dict], status: int = 200, answer: dict | None = None) -> None:
        self.infos, self.status, self.answer = infos, status, answer or {"total_kernel_ms": 1.0}
        self.polls, self.posts = 0, []

    async def info(self, _):
        doc = self.infos[min(self.polls, len(self.infos) - 1)]
        self.polls += 1
        return web.json_response(doc)

    async def profile(self, request):
        self.posts.append((await request.json(), self.polls))
        return web.json_response(self.answer, status=self.status)

    async def serve(self, coro_fn):
        app = web.Application()
        app.router.add_get("/server_info", self.info)
        app.router.add_post("/profile", self.profile)
        runner = web.AppRunner(app)
        await runner.setup()
        port = _free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            return await coro_fn(f"http://127.0.0.1:{port}")
        finally:
            await runner.cleanup()


def _info(running, waiting, extend, decode):
    return {"running": running, "waiting": waiting, "steps": {"extend": extend, "decode": decode}}


FAST = dict(poll_s=0.01, min_decode_steps=8, steps=7)


def test_profile_posts_only_once_decode_is_steady():
    infos = [
        _info(1, 0, 1, 3),      # warm-up request
        _info(4, 2, 5, 3),      # admitting
        _info(8, 0, 9, 4),      # prefill done
        _info(8, 0, 9, 10),     # 6 decode steps since the last extend: not yet
        _info(8, 0, 10, 11),    # another extend (a chunk): the count restarts
        _info(8, 0, 10, 18),    # 7
        _info(8, 0, 10, 19),    # 8 -> steady
    ]
    srv = ScriptedServer(infos, answer={"total_kernel_ms": 3.5, "steps": 7})
    doc = asyncio.run(srv.serve(lambda url: profile_when_steady(url, SteadyPolicy(8, **FAST), {})))
    assert doc["total_kernel_ms"] == 3.5 and doc["running_at_start"] == 8
    assert srv.posts == [({"steps": 7}, 7)]


def test_profile_error_answers_are_recorded_not_raised():
    srv = ScriptedServer([_info(4, 0, 1, 50), _info(4, 0, 1, 60)], status=400,
                         answer={"error": "profiling needs CUDA"})
    doc = asyncio.run(srv.serve(lambda url: profile_when_steady(url, SteadyPolicy(4, **FAST), {})))
    assert "HTTP 400" in doc["error"] and "needs CUDA" in doc["error"]
    # never steady (too few running) -> a timeout error
    srv = ScriptedServer([_info(2, 0, 1, 50), _info(2, 0, 1, 60)])
    doc = asyncio.run(srv.serve(lambda url: profile_when_steady(
        url, SteadyPolicy(4, timeout_s=0.2, **FAST), {})))
    assert "no steady decode" in doc["error"] and srv.posts == []
    # nothing listening -> polls fail until the deadline, still an error value
    doc = asyncio.run(profile_when_steady(f"http://127.0.0.1:{_free_port()}",
                                          SteadyPolicy(4, timeout_s=0.3, **FAST), {}))
    assert "error" in doc


def test_alongside_returns_the_benchmark_and_fills_the_profile():
    srv = ScriptedServer([_info(4, 0, 1, 2), _info(4, 0, 1, 20)], answer={"prefix_attention_ms": 2.0})

    async def bench(url):
        out: dict = {}

        async def client():
            await asyncio.sleep(0.5)
            return "metrics"
        res = await alongside(client(), url, SteadyPolicy(4, **FAST), out)
        return res, out

    res, out = asyncio.run(srv.serve(bench))
    assert res == "metrics" and out == {"prefix_attention_ms": 2.0, "running_at_start": 4}


def test_alongside_records_an_error_when_the_run_ends_first_and_passes_client_errors_through():
    srv = ScriptedServer([_info(1, 0, 1, 2)])

    async def quick(url):
        out: dict = {}

        async def client():
            return "done"
        return await alongside(client(), url, SteadyPolicy(4, **FAST), out), out

    res, out = asyncio.run(srv.serve(quick))
    assert res == "done" and "before the engine reached steady decode" in out["error"]

    async def failing(url):
        async def client():
            raise RuntimeError("client broke")
        await alongside(client(), url, SteadyPolicy(4, **FAST), {})

    with pytest.raises(RuntimeError, match="client broke"):
        asyncio.run(srv.serve(failing))


def test_steady_policy_targets_the_reachable_concurrency():
    assert SteadyPolicy.for_batch(256, 500).target_running == 230
    assert SteadyPolicy.for_batch(256, 6).target_running == 5
    assert SteadyPolicy.for_batch(1, 1).target_running == 1


def test_cell_with_profile_true_records_a_failed_capture_and_still_writes_the_result(tmp_path):
    """The fake engine has no POST /profile: the cell must still be measured and written, with
    the failure in its profile section."""
    import json
    import subprocess

    from harness.run.results import validate_cell

    root = Path(__file__).resolve().parents[3]
    overrides = ["system=granikv", "model=tiny", "hardware=cpu", "workload=burst", "lp=32", "batch=4",
                 "num_prompts=6", "output_len=5", "workload.suffix_len=8", "sweep=table13", "profile=true",
                 f"results_dir={tmp_path}/results", f"workloads_dir={tmp_path}/workloads",
                 "server.module=tests.harness.fake_engine"]
    out = subprocess.run([sys.executable, "-m", "harness.run.cell", *overrides], cwd=root, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    [path] = (tmp_path / "results" / "cpu" / "table13").glob("*.json")
    doc = json.loads(path.read_text())
    validate_cell(doc, path)
    assert doc["config"]["profile"] is True and doc["metrics"]["completed"] == 6
    assert set(doc["profile"]) == {"error"} and doc["profile"]["error"]


def test_top_kernels_ranks_by_time_per_step():
    ev = [("_decode_kernel", 0, 10), ("nvjet_gemm", 10, 40), ("_decode_kernel", 40, 50), ("nvjet_gemm", 50, 80),
          ("_merge_kernel", 80, 81)]
    rows = top_kernels(ev, steps=2, n=2)
    assert [r["name"] for r in rows] == ["nvjet_gemm", "_decode_kernel"]
    assert rows[0]["category"] == "linear_gemm" and rows[0]["launches_per_step"] == 1.0
    assert rows[0]["ms_per_step"] == 0.03 and rows[0]["us_per_launch"] == 30.0
