"""What the served engine runs on this host (granikv.runtime.engine_setup): the kernel path and
whether Triton's interpreter must be switched on, for each device, CUDA or not, and flag."""

from __future__ import annotations

import pytest

from granikv.config import EngineConfig
from granikv.runtime.engine_setup import resolve_kernels


@pytest.mark.parametrize("device,cuda,requested,impl,interpret", [
    ("cpu", False, "auto", "torch", False),
    ("auto", False, "auto", "torch", False),
    ("auto", True, "auto", "triton", False),
    ("cuda", True, "auto", "triton", False),
    ("cpu", True, "auto", "torch", False),
    ("cpu", False, "triton", "triton", True),
    ("auto", True, "triton", "triton", False),
    ("cpu", False, "torch", "torch", False),
])
def test_kernel_path_resolution(device, cuda, requested, impl, interpret):
    cfg, interp = resolve_kernels(EngineConfig(device=device), requested, cuda)
    assert (cfg.kernel_impl, interp) == (impl, interpret)
