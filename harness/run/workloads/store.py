"""The workload file a cell reads: found by name under workloads/, generated once if absent.

Why a lock: the cells of a sweep that share a workload may start at once (Snakemake jobs, the
lanes of a batch), and the second must read the file the first wrote, never a half-written one
or a second copy.

Why a default tokenizer name: naming a file loads the tokenizer only to learn its name and
vocabulary size (about 9 s of BPE tables on a small host). For the default tokenizer
(`tokenizer_path` None: cl100k_base) both are constants, so the name is derived with them;
`check_header` verifies them against every file actually read.
"""

from __future__ import annotations

import fcntl
import hashlib
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.run.workloads.build import write
from harness.run.workloads.config import WorkloadConfig
from harness.run.workloads.naming import workload_filename

DEFAULT_TOKENIZER = ("cl100k", 100277)  # cl100k_base's name and vocabulary size


def workload_file_name(wcfg: WorkloadConfig) -> str:
    """The file name of `wcfg`, without loading the default tokenizer."""
    return workload_filename(wcfg, tokenizer=DEFAULT_TOKENIZER if wcfg.tokenizer_path is None else None)


def check_header(header: Mapping[str, Any], wcfg: WorkloadConfig, path: Path) -> None:
    """Refuse a file whose tokenizer is not the default one its name assumed."""
    if wcfg.tokenizer_path is None and (header.get("tokenizer"), header.get("n_vocab")) != DEFAULT_TOKENIZER:
        raise ValueError(f"{path}: tokenizer {header.get('tokenizer')}/{header.get('n_vocab')} is not the "
                         f"expected default {DEFAULT_TOKENIZER}; delete the file or set workload.tokenizer_path")


def ensure_workload(wcfg: WorkloadConfig, workloads_dir: Path) -> Path:
    """The workload file for `wcfg`, generated under a file lock if absent (parallel cells share it)."""
    path = Path(workloads_dir) / workload_file_name(wcfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = hashlib.blake2b(str(path.resolve()).encode(), digest_size=8).hexdigest()
    with open(Path(tempfile.gettempdir()) / f"granikv-workload-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            write(wcfg, path)
    return path
