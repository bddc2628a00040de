"""Host time the load generator spends per streamed chunk: the client's own ceiling.

    python -m harness.diagnostics.client_stream [--out results/cpu/microbench/client-stream.json]

Why: at B=512 and a ~20 ms decode step the server streams ~25K chunks/s, and one client
process (harness.run.client, one asyncio loop) reads them all. If reading a chunk costs ~40 µs,
the client is then busy all the time and falls behind the engine: tokens reach it later than
they were made, each request ends late, its concurrency slot refills late, and the measured
throughput is the client's, not the engine's (H200, Table 9 Lp=512 B=512 rep 2 at cc8180a:
granikv's TPOT p50 22.8 ms against ~19 ms engine steps, the run 0.8 s longer than the engine's
work). The faster system is hit first, so the ratio shrinks towards 1.

Client side only, one process, no sockets: `B` aiohttp StreamReaders are fed one chunk each per
tick — the server's exact bytes (`granikv.server.app.sse_chunk`), cumulative (SGLang's default)
or incremental, for `--output-len` ticks — and the client's stream reader
(`harness.run.client.stream.read_stream`) consumes them between ticks, as it does when every TCP read
holds about one event. Records the wall µs per chunk (host time on one core: its inverse is
the most chunks/s one client process can take).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from types import SimpleNamespace

from aiohttp.base_protocol import BaseProtocol
from aiohttp.streams import StreamReader

from granikv.server.app import sse_chunk
from harness.microbench._timing import write_result
from harness.microbench.storage import env
from harness.run.client.metrics import RequestRecord
from harness.run.client.stream import read_stream

PROMPT = 4200


def chunks(output_len: int, streaming: str) -> list[bytes]:
    """The SSE events one request's stream carries, as the server formats them (a cl100k-like
    ~4 characters of text per token; ids spread over a 128K vocabulary)."""
    ids = [(1000 + 7919 * i) % 128256 for i in range(output_len)]
    out = []
    for n in range(1, output_len + 1):
        new = ids[n - 1:n]
        shown = new if streaming == "incremental" else ids[:n]
        meta = {"id": "bench", "prompt_tokens": PROMPT, "completion_tokens": n, "cached_tokens": 4096,
                "finish_reason": {"type": "length"} if n == output_len else None}
        out.append(sse_chunk(" tok" * len(shown), ",".join(map(str, shown)), meta))
    out.append(b"data: [DONE]\n\n")
    return out


class _Transport(asyncio.ReadTransport):
    """A connected socket's stand-in: the readers only pause and resume it."""

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _reader(loop: asyncio.AbstractEventLoop) -> StreamReader:
    proto = BaseProtocol(loop)
    proto.connection_made(_Transport())  # a reader refuses to wait on an unconnected protocol
    return StreamReader(proto, 2**16, loop=loop)


async def _consume(batch: int, events: list[bytes]) -> tuple[float, list[RequestRecord]]:
    loop = asyncio.get_running_loop()
    readers = [_reader(loop) for _ in range(batch)]
    recs = [RequestRecord(id=str(i), prompt_len=PROMPT, max_new_tokens=len(events) - 1) for i in range(batch)]
    for r in recs:
        r.start = time.perf_counter()
    tasks = [asyncio.ensure_future(read_stream(SimpleNamespace(content=rd), rec))
             for rd, rec in zip(readers, recs)]
    await asyncio.sleep(0)
    t0 = time.perf_counter()
    for tick, ev in enumerate(events):
        for rd in readers:
            rd.feed_data(ev)
        want = batch * min(tick + 1, len(events) - 1)
        while sum(len(r.chunk_times) for r in recs) < want:
            await asyncio.sleep(0)
            if any(t.done() for t in tasks) and tick < len(events) - 1:
                await asyncio.gather(*tasks)  # a reader failed: raise its error, not hang
                raise AssertionError(f"a stream ended at tick {tick} of {len(events)}")
    for rd in readers:
        rd.feed_eof()
    await asyncio.gather(*tasks)
    return time.perf_counter() - t0, recs


def run(batch: int, output_len: int, streaming: str, reps: int) -> dict:
    events = chunks(output_len, streaming)
    walls = []
    for _ in range(reps):
        wall, recs = asyncio.run(_consume(batch, events))
        bad = [r for r in recs if not r.success or r.output_tokens != output_len]
        if bad:
            raise AssertionError(f"{len(bad)} streams misread: {bad[0].error or bad[0].output_tokens}")
        walls.append(wall)
    per_chunk = statistics.median(walls) / (batch * output_len) * 1e6
    return {"batch": batch, "output_len": output_len, "streaming": streaming, "reps": reps,
            "mean_chunk_bytes": round(sum(map(len, events[:-1])) / output_len),
            "us_per_chunk": round(per_chunk, 2), "chunks_per_s": round(1e6 / per_chunk)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.diagnostics.client_stream",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--output-len", default="256,1024", help="tokens per request, comma-separated")
    ap.add_argument("--streaming", default="cumulative,incremental")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="results/cpu/microbench/client-stream.json")
    args = ap.parse_args(argv)
    records = []
    for n in (int(x) for x in args.output_len.split(",")):
        for mode in args.streaming.split(","):
            rec = run(args.batch, n, mode, args.reps)
            records.append(rec)
            print(f"B={rec['batch']} out={n:5d} {mode:11s}: {rec['us_per_chunk']:6.2f} µs/chunk "
                  f"({rec['chunks_per_s']} chunks/s, {rec['mean_chunk_bytes']} B/chunk)", flush=True)
    write_result(args.out, vars(args), records, env=env())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
