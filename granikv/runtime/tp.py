"""Tensor parallelism for the engine: one process per rank, replicated scheduling.

Every rank runs the same Engine (same config, same seed) on its shard of the model. Rank 0
owns the API; before each step it broadcasts the commands it received since the last step
(add, abort, flush, stop) to the workers over a gloo group, and every rank applies them and
steps. The scheduler and storage are deterministic functions of that command sequence, and
sampling draws from identically seeded generators over all-gathered (identical) logits, so all
ranks schedule the same batches without shipping tensors or slot tables around.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
import threading

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from granikv.config import EngineConfig
from granikv.dist import TPGroup
from granikv.engine.engine import Engine

log = logging.getLogger(__name__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init(rank: int, world: int, port: int, device_type: str) -> tuple[TPGroup, object]:
    backend = "nccl" if device_type == "cuda" else "gloo"
    if device_type == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    ctrl = dist.new_group(backend="gloo") if backend == "nccl" else dist.group.WORLD
    return TPGroup(rank=rank, world_size=world, group=dist.group.WORLD), ctrl


def _apply(engine: Engine, cmds: list) -> bool:
    for c in cmds:
        if c[0] == "add":
            _, rid, ids, params, hint = c
            try:
                engine.add_request(ids, params, rid=rid, shared_prefix_len=hint)
            except ValueError:
                pass  # rank 0 reports the error; workers just stay in step
        elif c[0] == "abort":
            engine.abort(c[1])
        elif c[0] == "flush":
            engine.flush_cache()
        elif c[0] == "stop":
            return False
    return True


def _worker(rank: int, world: int, port: int, cfg: EngineConfig) -> None:
    # rank 0 stops the workers with its "stop" command (and they die with it: daemon processes);
    # a signal to the whole process group must not take one rank out from under a collective
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    tp, ctrl = _init(rank, world, port, "cuda" if cfg.device in ("auto", "cuda") and torch.cuda.is_available()
                     else "cpu")
    if torch.cuda.is_available() and cfg.device in ("auto", "cuda"):
        cfg = cfg.replace(device=f"cuda:{rank}")
    engine = Engine(cfg, tp_group=tp)
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=0, group=ctrl)
        if not _apply(engine, box[0]):
            break
        if engine.has_work():
            engine.step()
    _teardown(engine)


def _teardown(engine: Engine, timeout_s: float = 60.0) -> bool:
    """Destroy this rank's process groups. The CUDA graphs go first (they hold references on
    the NCCL communicator that its teardown waits for), then `destroy_process_group`, which is
    collective for NCCL: every rank calls it at the same point (after the "stop" command). It
    runs in a daemon thread with a deadline, so a peer that died cannot hang the caller.
    Returns whether it finished."""
    for graphs in (engine.runner.graphs, getattr(engine.runner, "extend_graphs", None)):
        if graphs is not None:
            graphs.release()
    gc.collect()
    t = threading.Thread(target=dist.destroy_process_group, daemon=True, name="tp-teardown")
    t.start()
    t.join(timeout_s)
    return not t.is_alive()


class TPEngine(Engine):
    """Rank 0's engine: the ordinary Engine API, with each step mirrored on the workers."""

    def __init__(self, config: EngineConfig) -> None:
        world = config.tp
        port = _free_port()
        dev = "cuda" if config.device in ("auto", "cuda") and torch.cuda.is_available() else "cpu"
        ctx = mp.get_context("spawn")
        self._procs = [ctx.Process(target=_worker, args=(r, world, port, config), daemon=True)
                       for r in range(1, world)]
        for p in self._procs:
            p.start()
        tp, self._ctrl = _init(0, world, port, dev)
        self._pending: list = []
        super().__init__(config.replace(device="cuda:0") if dev == "cuda" else config, tp_group=tp)
        self._closed = False

    def add_request(self, input_ids, params=None, rid=None, shared_prefix_len=None):
        req = super().add_request(input_ids, params, rid=rid, shared_prefix_len=shared_prefix_len)
        # the int32 prompt (pickled as bytes: ~100x cheaper than a list of ints on both sides)
        self._pending.append(("add", req.rid, req.prompt_arr, req.params, shared_prefix_len))
        return req

    def abort(self, rid: str) -> None:
        super().abort(rid)
        self._pending.append(("abort", rid))

    def flush_cache(self) -> bool:
        ok = super().flush_cache()
        if ok:
            self._pending.append(("flush",))
        return ok

    def _sync(self, extra: list | None = None) -> None:
        cmds, self._pending = self._pending + (extra or []), []
        dist.broadcast_object_list([cmds], src=0, group=self._ctrl)

    def step(self):
        self._sync()
        return super().step()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._sync([("stop",)])
        if not _teardown(self):
            log.warning("TP teardown: destroy_process_group did not finish in time; terminating workers")
        for p in self._procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()


def create_engine(config: EngineConfig) -> Engine:
    if config.tp == 1:
        return Engine(config)
    # never NVLink multicast: on shared hosts it can take the GPUs out of service
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")
    return TPEngine(config)
