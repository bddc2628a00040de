"""The kernel microbench's Table 5 records (harness.microbench.kernels, CPU under the Triton
interpreter, tiny shapes): the dense prefix kernel on the unique layout (B one-request classes,
each over its own contiguous copy of the prefix) against the float32 reference, its byte model and
split-K bookkeeping; the `--stage table5` run and its merge into a whole-run result."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import pytest
import torch

from granikv.kernels import CASCADE_CONFIG, DecodeConfig, PrefixConfig
from harness.microbench import kernels
from harness.microbench.kernel_bench import SMOKE, Bench
from harness.run.results import load_microbench

# a dense config small enough for the interpreter; min_split_len 32 lets the short prefixes split
DENSE = PrefixConfig(block_m=32, block_n=16, num_warps=4, num_stages=2, min_split_len=32, target_programs=1,
                     max_splits_cap=8, tma=True)
BEST = {"decode": DecodeConfig(), "decode_splits": 1, "dense": DENSE, "dense_splits": 2, "cascade": CASCADE_CONFIG}


def _bench(b: int, lp: int, dtype: torch.dtype) -> Bench:
    plan = replace(SMOKE, batches=(b,), lps=(lp,), headline_b=b, headline_lp=lp)
    return Bench(plan, smoke=True, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("b, lp", [(3, 37), (5, 72), (6, 129)])
def test_dense_unique_records_match_the_float32_reference(b, lp, dtype):
    bn = _bench(b, lp, dtype)
    q = bn.q(b, 4)
    kernels.dense_unique(bn, BEST, q, lp, shared_splits=BEST["dense_splits"])
    checks = {c["op"]: c for c in bn.checks}
    assert checks["prefix_dense/unique"]["ok"], checks
    main = [r for r in bn.records if r.get("table5")]
    assert [(r["op"], r["layout"], r["B"], r["Lp"]) for r in main] == [("prefix_dense", "unique", b, lp)]
    rec = main[0]
    # byte model: every request's own copy of the prefix, plus q/o/lse
    nbytes = b * lp * bn.kv_tok + bn.io_bytes(b, 4)
    assert rec["GBps"] == pytest.approx(nbytes / rec["us"] / 1e3, rel=1e-2, abs=0.06)
    assert rec["TFLOPs"] == pytest.approx(bn.attn_flops(b, 4, lp) / rec["us"] / 1e6, rel=1e-2, abs=0.006)
    assert rec["shared_max_splits"] == 2 and "prefix_max_splits" in rec["split_note"]
    if rec["max_splits"] != 2:  # the kernel's own split rule differs from shared's: both are timed
        assert "shared record's class" in rec["split_note"]
        [var] = [r for r in bn.records if r.get("table5_split_variant")]
        assert var["max_splits"] == 2 and not var.get("table5")
        assert all(c["ok"] for c in bn.checks)


def test_unique_slabs_are_private_and_fit_the_slot_space():
    bn = _bench(5, 72, torch.float32)
    bases = bn.unique_slab_bases(5, 72)
    assert all(b1 - b0 == 72 for b0, b1 in zip(bases, bases[1:]))
    assert bases[0] >= 1 + 72 and bases[-1] + 72 <= bn.k.shape[0]  # clear of the shared slab
    with pytest.raises(ValueError):
        bn.unique_slab_bases(5, 10_000)


def test_table5_writes_both_layouts_of_the_dense_kernel():
    bn = _bench(3, 41, torch.float32)
    kernels.table5(bn, BEST)
    assert all(c["ok"] for c in bn.checks), bn.checks
    t5 = {(r["op"], r["layout"]) for r in bn.records if r.get("table5")}
    assert {("prefix_dense", "shared"), ("prefix_dense", "unique"), ("decode_paged", "unique")} <= t5
    shared = next(r for r in bn.records if (r["op"], r["layout"]) == ("prefix_dense", "shared"))
    unique = next(r for r in bn.records if (r["op"], r["layout"], r.get("table5")) == ("prefix_dense", "unique", True))
    assert unique["shared_max_splits"] == shared["max_splits"] == 2


def _whole_run(records: list[dict]) -> dict:
    best = {k: (asdict(v) if hasattr(v, "__dataclass_fields__") else v) for k, v in BEST.items()}
    return {"env": {"git_sha": "old", "gpu": "G"}, "ceilings": {"gemm_bf16_TFLOPs": 1.0},
            "summary": {"bars": {"stale": True}, "m_sat": {"by_g": {}}, "best_configs": best},
            "checks": [{"op": "prefix_dense/shared", "ok": True, "rel_err": 9.0}, {"op": "extend", "ok": True}],
            "tuning": {"prefix_dense": []}, "records": records}


def test_merge_replaces_the_table5_set_and_keeps_the_rest(tmp_path):
    base = {"B": 3, "Lp": 41, "g": 4, "us": 10.0, "GBps": 1.0, "TFLOPs": 1.0}
    old = [{**base, "op": "prefix_dense", "layout": "shared", "table5": True},
           {**base, "op": "decode_paged", "layout": "unique", "table5": True},
           {**base, "op": "decode_paged", "layout": "unique", "sweep": True, "us": 99.0}]
    new = [{**base, "op": "prefix_dense", "layout": "shared", "table5": True, "us": 5.0},
           {**base, "op": "prefix_dense", "layout": "unique", "table5": True, "us": 50.0}]
    checks = [{"op": "prefix_dense/shared", "ok": True, "rel_err": 1e-7}]
    merged = kernels.merge_table5(_whole_run(old), new, checks, {"git_sha": "new", "gpu": "G"}, "configs",
                                  SMOKE)
    ops = [(r["op"], r["layout"], r.get("env", {}).get("git_sha")) for r in merged["records"]]
    assert ops == [("decode_paged", "unique", None), ("prefix_dense", "shared", "new"),
                   ("prefix_dense", "unique", "new")]
    assert [c["op"] for c in merged["checks"]] == ["extend", "prefix_dense/shared"]
    assert merged["checks"][1]["rel_err"] == 1e-7
    assert merged["stages"] == [{"stage": "table5", "env": {"git_sha": "new", "gpu": "G"}, "configs_from": "configs",
                                 "records": 2, "replaced": 2}]
    assert "stale" not in merged["summary"]["bars"] and merged["summary"]["m_sat"] == {"by_g": {}}
    # loaded for the tables: each merged record carries its own run's env, the others the file's
    path = tmp_path / "microbench" / "kernels.json"
    path.parent.mkdir()
    path.write_text(json.dumps(merged))
    frame = load_microbench(tmp_path, "kernels")
    assert list(frame["env.git_sha"]) == ["old", "new", "new"]


def test_stage_table5_cli_merges_into_a_whole_run(tmp_path):
    src = tmp_path / "kernels.json"
    keep = {"op": "decode_paged", "layout": "unique", "B": 2, "Lp": 40, "g": 4, "us": 9.0, "GBps": 1.0,
            "TFLOPs": 1.0, "sweep": True}
    src.write_text(json.dumps(_whole_run([keep])))
    out = tmp_path / "merged.json"
    assert kernels.main(["--smoke", "--stage", "table5", "--merge-into", str(src), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert json.loads(src.read_text())["records"] == [keep]  # --out given: the source is untouched
    assert doc["records"][0] == keep
    t5 = [r for r in doc["records"] if r.get("table5")]
    assert ("prefix_dense", "unique") in {(r["op"], r["layout"]) for r in t5}
    dense = [r for r in t5 if r["op"] == "prefix_dense"]
    assert all(r.get("env", {}).get("git_sha") for r in t5)
    assert {r["max_splits"] for r in dense if r["layout"] == "shared"} == {2}  # the file's dense_splits
    assert doc["stages"][0]["configs_from"] == str(src) and doc["summary"]["best_configs"]["dense"] == asdict(DENSE)
    with pytest.raises(SystemExit):
        kernels.main(["--smoke", "--merge-into", str(src)])  # only with --stage table5
