"""Test-wide setup.

On a host without CUDA, Triton kernels run in the interpreter: TRITON_INTERPRET must be set
before triton is first imported, so it is set here, at collection time. GPU-only tests carry
`@pytest.mark.gpu` and are skipped on CPU hosts.
"""

from __future__ import annotations

import os


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch always importable in the test env
        return False


HAS_CUDA = _cuda_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
