"""`python -m granikv.server --model llama-3.1-8b --system granikv [--port 30000]`

Serves SGLang's native API (/generate, /get_model_info, /health_generate, ...), the OpenAI API
(/v1/models, /v1/completions, /v1/chat/completions) and Prometheus /metrics. Runs on a CPU
host as it is (`--device cpu`: the torch reference kernels, granikv/runtime/engine_setup.py) and
prints what runs once it is ready. Binds 127.0.0.1 unless --host says otherwise.

Its life, as a supervisor (systemd, Kubernetes, a Slurm job, harness.run.systems) sees it:
- start: the address is bound before the engine is built (minutes on a GPU), so a port in use is
  an error at once (exit 2), as is a bad configuration;
- SIGTERM or SIGINT: new requests get 503 and /health turns 503 while the requests in flight
  finish, for up to --graceful-shutdown-timeout seconds; those still running then get their API's
  error (an error event and [DONE] on a stream), the engine stops, and the process exits 0. A
  second signal cuts the wait short;
- the engine fails (an exception in a step, or its process killed): the requests in flight get a
  503, and the process exits 1 so its supervisor restarts it (a server that answers only 503 is of
  no use to anyone).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import ipaddress
import logging
import os
import signal
import socket
import sys

from aiohttp import web

from granikv.runtime import aio
from granikv.runtime.engine_setup import build_engine, describe_engine
from granikv.server.app import LISTEN_BACKLOG, SERVER, app_runner, build_app
from granikv.server.cli import add_engine_args, config_from_args, host_request
from granikv.server.text import TextCodec

log = logging.getLogger("granikv.server")

API_KEY_ENV = "GRANIKV_API_KEY"
# within Kubernetes' default 30 s termination grace period, leaving time to stop the engine
GRACEFUL_SHUTDOWN_TIMEOUT_S = 20.0
EXIT_ENGINE_FAILED = 1
EXIT_CONFIG = 2


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m granikv.server",
                                description="GraniKV serving engine (SGLang-compatible HTTP API)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=30000, help="port (default: 30000)")
    p.add_argument("--backlog", type=int, default=LISTEN_BACKLOG,
                   help=f"listen queue length (default: {LISTEN_BACKLOG}, as uvicorn's; capped by net.core.somaxconn): "
                        "a burst of B new connections beyond it waits for TCP's 1 s SYN retransmission")
    p.add_argument("--api-key", default=os.environ.get(API_KEY_ENV) or None,
                   help=f"require `Authorization: Bearer <key>` on every route but /health (default: ${API_KEY_ENV}; "
                        "none: no authentication)")
    p.add_argument("--graceful-shutdown-timeout", type=float, default=GRACEFUL_SHUTDOWN_TIMEOUT_S, metavar="S",
                   help="on SIGTERM/SIGINT, seconds in-flight requests may take to finish before they are cut "
                        f"with an error (default: {GRACEFUL_SHUTDOWN_TIMEOUT_S:g}; a second signal cuts at once)")
    p.add_argument("--max-request-bytes", type=int, default=None,
                   help="largest request body (default: what a batch of 64 context-long prompts of token ids "
                        "needs; larger bodies get 413)")
    p.add_argument("--log-level", default="info")
    p.add_argument("--engine-thread", action="store_true",
                   help="run the engine on a thread of the server process instead of its own process "
                        "(debugging; it then shares the GIL with the HTTP side)")
    p.add_argument("--incremental-streaming-output", action="store_true",
                   help="streamed /generate chunks carry only the new text and output_ids (as SGLang's flag of "
                        "this name); default: everything generated so far, SGLang's default")
    p.add_argument("--served-model-name", default=None,
                   help="the model's name in the OpenAI API (/v1/models, `model` of requests; default: --model); "
                        "requests may also name it by --model-path")
    p.add_argument("--tokenizer-path", "--tokenizer", dest="tokenizer_path", default=None, metavar="DIR",
                   help="a Hugging Face tokenizer dir for text prompts (default: the model dir's tokenizer, else "
                        "the id codec of the model's vocabulary, whose files /get_model_info names)")
    p.add_argument("--context-length", type=int, default=None,
                   help="prompt + output token limit (default: the model's max_position_embeddings, "
                        "within --max-context)")
    add_engine_args(p)
    args = p.parse_args(argv)
    if args.graceful_shutdown_timeout < 0:
        p.error("--graceful-shutdown-timeout must be >= 0")
    if args.tokenizer_path is not None and not any(
            os.path.isfile(os.path.join(args.tokenizer_path, f)) for f in ("tokenizer.json", "tokenizer_config.json")):
        p.error(f"--tokenizer-path {args.tokenizer_path}: no tokenizer.json or tokenizer_config.json there")
    return args


class ListenError(ValueError):
    """The address cannot be bound (in use, not this host's, no permission)."""


def bind_socket(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port), not listening yet: the port is ours from now on, but a
    client connecting while the engine starts is refused at once rather than left waiting in a
    queue nobody reads (aiohttp starts listening when the server is ready)."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as e:
        raise ListenError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise ListenError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.setblocking(False)
    return sock


def is_loopback(sock: socket.socket) -> bool:
    try:
        return ipaddress.ip_address(sock.getsockname()[0]).is_loopback
    except ValueError:
        return False


async def serve(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    request = host_request(args)
    sock = bind_socket(args.host, args.port)  # before the engine: a port in use fails in a second
    if args.api_key is None and not is_loopback(sock):
        log.warning("listening on %s without an API key: anyone who can reach it may use it "
                    "(set --api-key or $%s)", args.host, API_KEY_ENV)
    log.info("starting the engine: %s", cfg)
    engine = None
    try:
        if args.engine_thread:
            from granikv.runtime.loop import EngineLoop

            engine = build_engine(cfg, request)
            loop = EngineLoop(engine)
            loop.start()
            codec = TextCodec(cfg.model_path, vocab_size=loop.info["vocab_size"], tokenizer=args.tokenizer_path)
        else:
            from granikv.runtime.process import EngineProcess

            loop = EngineProcess(cfg, factory=functools.partial(build_engine, requested=request))
            # the engine process boots (imports torch, builds, captures) while this one loads the
            # tokenizer: the server process itself never imports torch unless a tokenizer needs it
            started = asyncio.create_task(asyncio.to_thread(loop.start))
            codec = TextCodec(cfg.model_path, tokenizer=args.tokenizer_path)
            await started
            codec = codec.with_vocab_size(loop.info["vocab_size"])
    except BaseException:
        sock.close()
        raise
    try:
        return await _run(args, loop, codec, sock)
    finally:
        loop.stop()
        close = getattr(engine, "close", None)
        if close is not None:  # the thread mode's TP engine (the process mode closes it in the child)
            close()


async def _run(args: argparse.Namespace, loop, codec: TextCodec, sock: socket.socket) -> int:
    """Serve until a signal (then drain) or the engine's failure; the exit status."""
    app = build_app(loop, codec, args.incremental_streaming_output, served_model_name=args.served_model_name,
                    model_path=args.model_path, context_length=args.context_length, api_key=args.api_key,
                    max_request_bytes_=args.max_request_bytes)
    server = app[SERVER]
    runner = app_runner(app)
    await runner.setup()
    await web.SockSite(runner, sock, backlog=args.backlog).start()
    what = describe_engine(loop.info, server.checks.context_limit)
    log.info("serving on http://%s:%d: %s%s", args.host, args.port, what,
             "" if args.api_key is None else "; API key required")
    print(f"granikv server ready on http://{args.host}:{args.port} ({what})", flush=True)

    signals = asyncio.Queue()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, signals.put_nowait, sig)
    code = 0
    first = asyncio.ensure_future(signals.get())
    try:
        while not first.done() and not loop.fatal:  # the engine's death is noticed within 0.5 s
            await asyncio.wait({first}, timeout=0.5)
        first.cancel()
        if loop.fatal:
            server.engine_error_seen()  # its traceback, once
            log.error("the engine failed; exiting with status %d", EXIT_ENGINE_FAILED)
            await server.cut(wait_s=2.0)  # the in-flight requests already have their 503: let them go out
            code = EXIT_ENGINE_FAILED
        else:
            await _shut_down(server, signals, args.graceful_shutdown_timeout)
    finally:
        await runner.cleanup()
    return code


async def _shut_down(server, signals: asyncio.Queue, timeout_s: float) -> None:
    """Drain: refuse new work, let the requests in flight finish within `timeout_s` (a second
    signal ends the wait), then cut the rest."""
    n = server.inflight
    log.info("shutting down: %d request(s) in flight, waiting up to %g s for them", n, timeout_s)
    drain = asyncio.ensure_future(server.drain(timeout_s))
    again = asyncio.ensure_future(signals.get())
    await asyncio.wait({drain, again}, return_when=asyncio.FIRST_COMPLETED)
    again.cancel()
    if not (drain.done() and drain.result()):
        drain.cancel()
        log.warning("shutting down: cutting %d request(s) still in flight", server.inflight)
        await server.cut()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return aio.run(serve(args))
    except ValueError as e:  # bad configuration, an address we cannot bind: say so, no traceback
        print(f"error: {e}", file=sys.stderr)
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
