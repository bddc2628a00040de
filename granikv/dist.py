"""Tensor-parallel group: who this rank is among the ranks that split one model.

The model only ever needs three things from torch.distributed: its rank, the group size, and
two collectives (sum after a row-parallel projection, concatenation of vocab-parallel logits).
`TPGroup` carries exactly that, so TP=1 runs with no process group at all (no init, no global
state touched) and every collective is a no-op there.

NCCL on GPU, gloo on CPU. Both collectives are CUDA-graph capturable on NCCL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TPGroup:
    """This rank's place in a tensor-parallel group; `group=None` with world_size 1 is TP=1."""

    rank: int = 0
    world_size: int = 1
    group: Any = None  # a torch.distributed ProcessGroup, or None for TP=1

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"bad TP rank {self.rank} of {self.world_size}")
        if self.world_size > 1 and self.group is None:
            raise ValueError("TP > 1 needs a process group (use init_tp)")

    def split(self, n: int, what: str = "dimension") -> tuple[int, int]:
        """(start, size) of this rank's equal share of `n`; `n` must divide evenly."""
        if n % self.world_size:
            raise ValueError(f"{what} of {n} does not split over TP={self.world_size}")
        size = n // self.world_size
        return self.rank * size, size


def init_tp(
    rank: int,
    world_size: int,
    backend: str = "auto",
    init_method: str = "tcp://127.0.0.1:29511",
) -> TPGroup:
    """Join (or, for world_size 1, skip) the process group of one tensor-parallel model.

    `backend="auto"` picks NCCL when CUDA is available, gloo otherwise. On GPU the caller sets
    the current device (`torch.cuda.set_device(rank)`) before calling, as NCCL binds to it.
    """
    if world_size == 1:
        return TPGroup()
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)
    return TPGroup(rank=rank, world_size=world_size, group=dist.group.WORLD)


def all_reduce(tp: TPGroup, x: torch.Tensor) -> torch.Tensor:
    """Sum `x` over the group in place (row-parallel projections); returns `x`."""
    if tp.world_size > 1:
        dist.all_reduce(x, group=tp.group)
    return x


def all_gather(tp: TPGroup, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's `x` along `dim`, rank order (vocab-parallel logits)."""
    if tp.world_size == 1:
        return x
    x = x.contiguous()
    if dist.get_backend(tp.group) == "nccl":
        out = torch.empty((tp.world_size, *x.shape), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(out, x, group=tp.group)
        parts = out.unbind(0)
    else:  # gloo has no all_gather_into_tensor on every torch version we support
        parts = [torch.empty_like(x) for _ in range(tp.world_size)]
        dist.all_gather(parts, x, group=tp.group)
    return torch.cat(parts, dim=dim)


def destroy_tp(tp: TPGroup) -> None:
    """Leave the process group (end of a TP worker)."""
    if tp.world_size > 1 and dist.is_initialized():
        dist.destroy_process_group()
