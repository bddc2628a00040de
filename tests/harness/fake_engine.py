"""A fake `python -m granikv.server` for pipeline tests (TEST DOUBLE: numbers are not measurements).

Run as `python -m tests.harness.fake_engine --host H --port P [engine flags...]`: it accepts
(and ignores) every engine flag, then serves the engine's HTTP API: GET /health,
GET /server_info (engine counters shaped like the real server's), POST /flush_cache and a
streaming POST /generate (one token per event, `meta_info.completion_tokens`, `[DONE]`).

Misbehaviour for systems tests, through flags:
  --fake-startup-delay S   listen only after S seconds
  --fake-never-healthy     /health answers 503 forever
  --fake-exit-code N       exit with N before listening
  --fake-ignore-sigterm    survive SIGTERM (stop() must SIGKILL the process group)
  --fake-spawn-child       start a child process in the same group (it must die with us)
  --fake-pidfile PATH      write "<pid> <child pid>" to PATH once listening
  --fake-token-delay S     seconds per streamed token (default: env FAKE_TOKEN_DELAY or 0.001)
  env FAKE_STALL=1         accept requests but never step (a crashed engine thread)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time

from aiohttp import web


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--system", default="granikv")
    p.add_argument("--fake-startup-delay", type=float, default=0.0)
    p.add_argument("--fake-never-healthy", action="store_true")
    p.add_argument("--fake-exit-code", type=int, default=None)
    p.add_argument("--fake-ignore-sigterm", action="store_true")
    p.add_argument("--fake-spawn-child", action="store_true")
    p.add_argument("--fake-pidfile", default=None)
    p.add_argument("--fake-token-delay", type=float, default=float(os.environ.get("FAKE_TOKEN_DELAY", "0.001")))
    args, _unknown_engine_flags = p.parse_known_args(argv)
    return args


def build_app(args: argparse.Namespace) -> web.Application:
    counters = {"decode_steps": 0, "dense_steps": 0, "cascade_steps": 0, "paged_steps": 0}
    state = {"flushes": 0, "requests": 0, "active": 0, "chunks": 0}
    stall = os.environ.get("FAKE_STALL") == "1"  # accept requests, never step (a dead engine thread)

    async def health(_: web.Request) -> web.Response:
        return web.Response(status=503 if args.fake_never_healthy else 200, text="ok")

    async def server_info(_: web.Request) -> web.Response:
        return web.json_response({"config": {"system": args.system}, "attention": dict(counters),
                                  "retractions": 0, "hot_admits": 1 if args.system == "granikv" else 0,
                                  "hot_fallbacks": 0, "storage": {"fake": True}, "running": state["active"],
                                  "waiting": 0, "steps": {"decode": counters["decode_steps"]},
                                  "server": {"cpu_s": time.process_time(), "chunks_sent": state["chunks"]},
                                  "fake": {"flushes": state["flushes"], "requests": state["requests"]}})

    async def flush(_: web.Request) -> web.Response:
        state["flushes"] += 1
        return web.json_response({"ok": True})

    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n = int(body["sampling_params"]["max_new_tokens"])
        prompt = len(body["input_ids"])
        state["requests"] += 1
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        state["active"] += 1
        if stall:
            await asyncio.sleep(3600)
        for i in range(1, n + 1):
            await asyncio.sleep(args.fake_token_delay)
            counters["decode_steps"] += 1
            key = "dense_steps" if args.system == "granikv" else "cascade_steps" if args.system == "cascade" \
                else "paged_steps"
            counters[key] += 1
            event = {"text": "x" * i, "output_ids": [7] * i,
                     "meta_info": {"prompt_tokens": prompt, "completion_tokens": i, "cached_tokens": 0}}
            await resp.write(f"data: {json.dumps(event)}\n\n".encode())
            state["chunks"] += 1
        state["active"] -= 1
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/server_info", server_info)
    app.router.add_post("/flush_cache", flush)
    app.router.add_post("/generate", generate)
    return app


async def serve(args: argparse.Namespace) -> None:
    child = None
    if args.fake_spawn_child:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    runner = web.AppRunner(build_app(args))
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    pidfile = args.fake_pidfile or os.environ.get("FAKE_PIDFILE")
    if pidfile:
        with open(pidfile, "w") as f:
            f.write(f"{os.getpid()} {child.pid if child else 0}\n")
    print(f"granikv server ready on http://{args.host}:{args.port}", flush=True)
    stop = asyncio.Event()
    if not args.fake_ignore_sigterm:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await runner.cleanup()
    if child is not None:
        child.terminate()


def main() -> int:
    args = parse()
    print(f"fake engine starting: {sys.argv[1:]}", flush=True)
    if args.fake_ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.fake_exit_code is not None:
        print("fake engine: exiting on purpose", flush=True)
        return args.fake_exit_code
    time.sleep(args.fake_startup_delay)
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
