"""Tensor parallelism on CPU: two gloo ranks give the TP=1 logits.

One spawn runs every case (process start-up dominates): dummy weights on both tiny shapes,
a tiny-qwen variant whose vocabulary does not split evenly (padded vocab shard, tied
embeddings), and a safetensors checkpoint. Each case is a flat prefill of three sequences
followed by decode steps; rank 0 saves its logits, the parent compares them with TP=1.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.multiprocessing as mp

from granikv.dist import destroy_tp, init_tp
from granikv.model import ModelSpec, RefAttention, load_model, load_spec

LENGTHS = (6, 19, 33)
DECODE_STEPS = 4
TOL = 1e-5


def cases(ckpt: Path) -> dict[str, tuple[ModelSpec, str, Path | None]]:
    odd = dataclasses.replace(load_spec("tiny-qwen"), name="tiny-qwen-v1001", vocab_size=1001)
    return {
        "tiny-dummy": (load_spec("tiny"), "dummy", None),
        "tiny-qwen-dummy": (load_spec("tiny-qwen"), "dummy", None),
        "odd-vocab-dummy": (odd, "dummy", None),
        "tiny-safetensors": (load_spec(ckpt), "safetensors", ckpt),
    }


def run_case(spec: ModelSpec, load_format: str, path: Path | None, tp=None) -> list[torch.Tensor]:
    """Logits of a flat 3-sequence prefill and DECODE_STEPS decode steps (fixed token inputs)."""
    model = load_model(spec, tp, load_format=load_format, path=path, seed=7, max_positions=128)
    gen = torch.Generator().manual_seed(3)
    attn = RefAttention(spec.num_layers)
    attn.set_batch([(i, n) for i, n in enumerate(LENGTHS)])
    ids = torch.randint(0, spec.vocab_size, (sum(LENGTHS),), generator=gen)
    pos = torch.cat([torch.arange(n) for n in LENGTHS])
    out = [model(ids, pos, attn)]
    lengths = torch.tensor(LENGTHS)
    for _ in range(DECODE_STEPS):
        attn.set_batch([(i, 1) for i in range(len(LENGTHS))])
        ids = torch.randint(0, spec.vocab_size, (len(LENGTHS),), generator=gen)
        out.append(model(ids, lengths, attn))
        lengths = lengths + 1
    return out


def _worker(rank: int, world_size: int, init_file: str, ckpt: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    tp = init_tp(rank, world_size, backend="gloo", init_method=f"file://{init_file}")
    try:
        results = {name: run_case(*case, tp=tp) for name, case in cases(Path(ckpt)).items()}
        if rank == 0:
            torch.save(results, Path(out_dir) / "tp2.pt")
    finally:
        destroy_tp(tp)


def test_tp2_equals_tp1(tmp_path, hf_checkpoint):
    _, ckpt = hf_checkpoint(load_spec("tiny"))
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), str(ckpt), str(tmp_path)), nprocs=2, join=True)
    tp2 = torch.load(tmp_path / "tp2.pt")
    for name, case in cases(ckpt).items():
        tp1 = run_case(*case)
        assert len(tp1) == len(tp2[name]) == 1 + DECODE_STEPS
        for step, (a, b) in enumerate(zip(tp2[name], tp1)):
            assert a.shape == b.shape == (a.shape[0], case[0].vocab_size)
            err = ((a - b).abs().max() / b.abs().max()).item()
            assert err < TOL, f"{name} step {step}: rel err {err:.2e}"


def _worker4(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    tp = init_tp(rank, world_size, backend="gloo", init_method=f"file://{init_file}")
    try:
        out = run_case(load_spec("tiny-qwen-tp4"), "dummy", None, tp=tp)
        if rank == 0:
            torch.save(out, Path(out_dir) / "tp4.pt")
    finally:
        destroy_tp(tp)


def test_tp4_equals_tp1_qwen_shape(tmp_path):
    """Four gloo ranks (one KV head each, GQA group 5 as Qwen-2.5-32B at TP=4) give the TP=1 logits."""
    mp.spawn(_worker4, args=(4, str(tmp_path / "init"), str(tmp_path)), nprocs=4, join=True)
    tp4 = torch.load(tmp_path / "tp4.pt")
    tp1 = run_case(load_spec("tiny-qwen-tp4"), "dummy", None)
    assert len(tp4) == len(tp1) == 1 + DECODE_STEPS
    for step, (a, b) in enumerate(zip(tp4, tp1)):
        err = ((a - b).abs().max() / b.abs().max()).item()
        assert err < TOL, f"step {step}: rel err {err:.2e}"
