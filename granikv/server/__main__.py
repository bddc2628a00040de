"""`python -m granikv.server --model llama-3.1-8b --system granikv [--port 30000]`

Binds 127.0.0.1 unless --host says otherwise; stops cleanly on SIGINT/SIGTERM (the engine
thread finishes its step, the listener closes, worker processes exit).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from aiohttp import web

from granikv.server import aio
from granikv.server.app import LISTEN_BACKLOG
from granikv.server.cli import add_engine_args, config_from_args

log = logging.getLogger("granikv.server")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m granikv.server",
                                description="GraniKV serving engine (SGLang-compatible HTTP API)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=30000, help="port (default: 30000)")
    p.add_argument("--backlog", type=int, default=LISTEN_BACKLOG,
                   help=f"listen queue length (default: {LISTEN_BACKLOG}, as uvicorn's; capped by net.core.somaxconn): "
                        "a burst of B new connections beyond it waits for TCP's 1 s SYN retransmission")
    p.add_argument("--log-level", default="info")
    p.add_argument("--engine-thread", action="store_true",
                   help="run the engine on a thread of the server process instead of its own process "
                        "(debugging; it then shares the GIL with the HTTP side)")
    p.add_argument("--incremental-streaming-output", action="store_true",
                   help="streamed /generate chunks carry only the new text and output_ids (as SGLang's flag of "
                        "this name); default: everything generated so far, SGLang's default")
    add_engine_args(p)
    return p.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    from granikv.server.app import build_app, tcp_site
    from granikv.server.text import TextCodec

    cfg = config_from_args(args)
    log.info("starting engine: %s", cfg)
    if args.engine_thread:
        from granikv.engine.tp import create_engine
        from granikv.server.loop import EngineLoop

        engine = create_engine(cfg)
        loop = EngineLoop(engine)
        loop.start()
        codec = TextCodec(cfg.model_path)
    else:
        from granikv.server.proc import EngineProcess

        engine = None
        loop = EngineProcess(cfg)
        # the engine process boots (imports torch, builds, captures) while this one loads the
        # tokenizer: the server process itself never imports torch unless a tokenizer needs it
        started = asyncio.create_task(asyncio.to_thread(loop.start))
        codec = TextCodec(cfg.model_path)
        await started
    app = build_app(loop, codec, args.incremental_streaming_output)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = tcp_site(runner, args.host, args.port, args.backlog)
    await site.start()
    log.info("serving on http://%s:%d (system=%s, model=%s)", args.host, args.port, cfg.system, cfg.model)
    print(f"granikv server ready on http://{args.host}:{args.port}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down")
    await runner.cleanup()
    loop.stop()
    close = getattr(engine, "close", None)
    if close is not None:  # the thread mode's TP engine (the process mode closes it in the child)
        close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        aio.run(serve(args))
    except ValueError as e:  # bad configuration: say so, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
