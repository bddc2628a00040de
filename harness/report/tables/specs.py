"""What each paper table (3-24) reads from our result files: the table specs, as data.

A `TableSpec` says which paper columns identify a row (`keys`), which serving-cell sweeps feed it
(`sweeps`, in order of preference), which columns we do not measure (`qualitative`) or must not
compare (`no_ratio`), and in `method` how our number of each column is derived; the code that
does it is `harness.report.tables.extract`, one extractor per table. Rules common to every table:

- Systems: `paged` = "SGLang default" (SGL), `cascade` = "SGLang-Cascade" (SGL-C), `granikv` =
  "GraniKV" (GKV). "SGL-C/GKV" (cascade kernel on GraniKV's HOT/COLD storage, Tables 13-14) is a
  `granikv` cell whose `config.m_sat >= 2**30` (dispatcher never picks dense; `variant` column
  `granikv_cascade` in `harness.run.results`).
- Serving cells are `results/<hw>/<sweep>/<cell>.json` (docs/design.md, "Result files"). For each paper row the
  *first* sweep of `sweeps` holding any cell for that row's configuration supplies all systems
  of that row (so a ratio never mixes two sweeps). Cells are matched on config keys only
  (`model`, `tp`, `lp`, `batch`, `k`, `hot_fraction`, `cold_page_size`), never on the workload
  name.
- Reps (`config.rep`) are averaged (the paper prints 3-rep means), over the reps
  `queries.ratio_reps` chooses for the row: a rep is *from one call* when every cell of it
  that the row compares (paged, cascade and granikv, or the knobbed granikv cells a row sets
  against each other: Table 18's page sizes, Table 24's f_p beside cascade) carries the same
  non-empty `env.call_id`. A row with such reps takes its ratios and its absolute numbers (tok/s,
  TPOT, TTFT) from those reps only. A row with none — cells of different calls, or files that
  record no call id — takes them from the reps that hold every compared system
  (`complete_reps`), and each of its ratios is a *mixed-call* ratio, marked ‡ in the rendered
  tables and counted per table and TP in their index (`harness.report.tables.write.count_mixed_call_points`).
  Ratios are ratios of the means; a row whose systems compare nothing (one system) reads its
  complete reps. The profile tables (13, 14) and Tables 12 and 15 compute no ratio between
  systems: they read their complete reps (13, 14) or every rep (12, 15).
- Profiler section of a cell (Tables 13, 14, 22): `"profile": {"<category>_ms": ms, ...}`,
  summed over the capture window, with categories `prefix_attention`, `decode_attention`,
  `linear_gemm`, `nccl`, `total_kernel` (all kernels), and the wall-clock terms `decode_wall_ms`
  (decode-step wall time in the window) and `host_gap_ms` (wall time with the GPU idle).
- The paper measured on A100-SXM4-40GB; we may measure on other hardware, so absolute values are
  shown side by side and the meaningful comparison is between ratios (e.g. GKV/SGL ours vs paper).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

TABLE_NUMBERS: tuple[int, ...] = tuple(range(3, 25))


@dataclass(frozen=True)
class TableSpec:
    """How our result cells map onto one paper table's rows and columns."""

    number: int
    keys: tuple[str, ...]  # paper columns that identify a row: printed once, not compared
    sweeps: tuple[str, ...]  # serving-cell sweeps read, in order of preference
    sources: str  # one line for the rendered notes
    method: str  # how our value of each column is derived (the extractor's contract)
    qualitative: tuple[str, ...] = ()  # columns we do not measure (judgements): ours is n/a
    no_ratio: tuple[str, ...] = ()  # compared columns where ours/paper means nothing
    # a (Lp, B) grid: points of the table's configuration that we measured and the paper does not
    # print get rows of their own after the paper's (e.g. Table 6's Lp=16K row, which it dropped)
    grid: bool = False


_SERVING = "output throughput / TPOT / TTFT of serving cells"
_GRID_METHOD = ("Rows (Lp, B); output tok/s, GKV/SGL, median TPOT (`metrics.median_tpot_ms`), median TTFT "
                "(`metrics.median_ttft_ms` / 1000, in s). A point of the table's configuration that we measured "
                "and the paper does not print gets a row of its own, in key order, marked `*`, with the paper's "
                "columns n/a.")


def _grid(number: int) -> TableSpec:
    """Tables 6-8 (synthetic grid) and 9-11 (ShareGPT grid): one sweep each."""
    sweep = f"table{number}"
    return TableSpec(number, ("Lp", "B"), (sweep,), _SERVING, _GRID_METHOD, grid=True)


_SPECS: tuple[TableSpec, ...] = (
    TableSpec(3, ("config", "Lp"), ("table3", "table9", "table10", "table11"), _SERVING,
              "Rows (model, TP, Lp) at B=256; SGL/SGL-C/GKV `metrics.output_throughput`, ratios GKV/SGL and "
              "GKV/SGL-C."),
    TableSpec(4, ("system",), ("table4", "table21"), "throughput over paged's, heterogeneous multi-prefix",
              "Heterogeneous multi-prefix, `config.k` in {4, 8}, B=256; output throughput of each system over "
              "paged's."),
    TableSpec(5, ("storage",), (), "microbench/kernels.json: prefix_dense on shared vs unique (+ decode_paged/unique, "
              "ours)",
              "Microbench file `kernels.json`, records `{op, layout, B, Lp, Hq, Hkv, d, dtype, us, GBps, "
              "TFLOPs}` at B=256, Lp=8192, Llama head (Hq=32, Hkv=8, d=128 when given; records with "
              "`\"table5\": true` preferred). The paper's rows are one kernel on two storages: \"shared (HOT)\" = op "
              "`prefix_dense` layout `shared` (one class of B requests over the HOT slab), \"unique (paged)\" = op "
              "`prefix_dense` layout `unique` (same config, B one-request classes, each over its own contiguous "
              "copy of the prefix). Wall = median `us`, effective traffic = `GBps` (minimum bytes / time), "
              "speedup = the unique row's us / this row's us; a row whose record is missing is missing (no other "
              "kernel stands in). Extra row (ours, `*`): our paged system's decode kernel, op `decode_paged` "
              "layout `unique` (per-request pages), its speedup = its us / the shared row's us."),
    *(_grid(n) for n in (6, 7, 8, 9, 10, 11)),
    TableSpec(12, ("config",), ("table12", "table9", "table10", "table11"), "GraniKV output throughput",
              "GraniKV tok/s at Lp=16K for B in {256, 512, 1024} and the B with the highest throughput (only "
              "when all three are present).", no_ratio=("peak_B",)),
    TableSpec(13, ("category",), ("table13",), "profile section of serving cells",
              "Profiler: cells at B=256, Lp=8K of every variant, each with a `profile` section. Columns SGL / "
              "SGL-C / SGL-C/GKV / GKV."),
    TableSpec(14, ("category",), ("table14",), "profile section of serving cells",
              "As Table 13, from the `table14` sweep."),
    TableSpec(15, ("Lp",), ("table15", "table6"), "engine.dense_steps / engine.decode_steps (granikv)",
              "100·Σ`engine.dense_steps`/Σ`engine.decode_steps` of the granikv cells per (Lp, B), the "
              "warm-up request's steps left out where recorded. \"majority\" (ours): the dense share averaged "
              "over the row's B columns is \"cascade\" below 1/3, \"dense\" above 2/3, else \"mixed\"."),
    TableSpec(16, ("B", "M_eff"), ("table16", "table6"), "median TPOT of serving cells",
              "Lp=8K, median TPOT of GKV and SGL-C and their ratio; M_eff = B·n_q/kv is a property of the row, "
              "printed once."),
    TableSpec(17, ("quantity", "comparator", "unit"), (), "microbench/dispatch.json",
              "nsys dispatch overhead: microbench file `dispatch.json` (harness.microbench.dispatch), one record "
              "(the first) with `{window_s, dense_launches, dense_launches_per_15s, kernel_us_per_launch, "
              "wrapper_cpu_us_per_step, step_us}`; launches are the 15 s-scaled count when present; wrapper % "
              "= 100·wrapper_cpu_us_per_step/step_us."),
    TableSpec(18, ("config",), ("table18",), "granikv cells by config.cold_page_size",
              "Granikv cells at B=256, Lp=8K by `config.cold_page_size` in {1, 4, 16}; |Δ|max = "
              "100·(max−min)/min over the three page sizes."),
    TableSpec(19, ("config", "Hkv_per_rank", "NCCL"), ("table19", "table6", "table7", "table8"),
              "GKV/SGL output throughput",
              "GKV/SGL at Lp=8K, B=256. H_kv/rank and NCCL follow from (model, TP); \"KV mem\" and \"regime\" "
              "are the paper's judgement (n/a for us).", qualitative=("KV_mem", "regime")),
    TableSpec(20, ("row_type", "system", "k"), ("table20",), "serving cells by config.k",
              "Lp=8K, B=256, by `config.k` in {1, 4, 16, 64}; the reps `ratio_reps` chooses (of one call, else "
              "complete)."),
    TableSpec(21, ("config", "k", "system"), ("table21", "table4"), _SERVING,
              "By `config.k`; tok/s, ×default, TPOT p50/p99 (`metrics.median_tpot_ms`, `metrics.p99_tpot_ms`), "
              "TTFT p50 in s; slab tokens (K) from the granikv cell's `engine.hot_slab_tokens` / 1000 when the "
              "engine reports it; the reps `ratio_reps` chooses (of one call, else complete)."),
    TableSpec(22, ("config",), ("table22", "table3", "table9", "table10", "table11"),
              "profile section of the paged cell (table22) + Table 5 speedup + GKV/SGL",
              "Amdahl: the paged cell at Lp=16K, B=256 with a `profile` section; α = prefix_attention_ms / "
              "decode_wall_ms (paged has no prefix kernel: its decode_attention_ms × Lp / mean context, the "
              "context being prompt + half the output from the cell's metrics), β = nccl_ms / decode_wall_ms, "
              "γ = host_gap_ms / decode_wall_ms. s is *our* Table 5 speedup, its main rows' (prefix_dense unique "
              "us / prefix_dense shared us; none without both records; the column keeps the paper's label "
              "\"s=15.6\"); S(s) = 1/((1−α′) + α′/s) with α′ = α/(1−γ) (the kernel-time share, as the paper's "
              "numbers imply); S(+β,γ) = 1/((1−α−β−γ) + α/s + β + γ); measured = GKV/SGL output throughput "
              "from the first of `sweeps` holding both; s_eff solves measured = 1/((1−α) + α/s_eff)."),
    TableSpec(23, ("metric", "shared_HOT_unit", "unique_paged_unit"), (),
              "microbench/ncu.json (ours at boost clocks, `ncu --clock-control none`; 1410 MHz is the paper's clock)",
              "ncu: microbench file `ncu.json`, records (one per captured launch, averaged) with "
              "`{op, layout, B, Lp, kernel, dram_bytes_read, byte_model_bytes, l2_hit_rate_pct, "
              "tensor_pipe_active_pct, waves_per_sm, wall_us, useful_flops}`; a record without `op` counts as "
              "the op of its `kernel` (`_prefix_kernel` = prefix_dense, `_decode_kernel` = decode_paged). "
              "Columns, one kernel on two layouts as in the paper: shared (HOT) = op `prefix_dense` layout "
              "`shared`, unique (paged) = op `prefix_dense` layout `unique`. Derived: excess over byte model %, "
              "useful TF/s, DRAM GB/s, FLOP/byte; shown in the paper's units. Extra rows (ours, `*`), one per "
              "metric: op `decode_paged` layout `unique` (our paged decode kernel) in the unique column.",
              qualitative=("remark",)),
    TableSpec(24, ("system", "fp"), ("table24",), "granikv cells by config.hot_fraction + cascade",
              "Granikv cells at Lp=8K, B=256 by `config.hot_fraction`, and the cascade cell; † (ours) = the "
              "granikv cell reported `engine.hot_fallbacks > 0`.", no_ratio=("dagger",)),
)
TABLE_SPECS: Mapping[int, TableSpec] = {s.number: s for s in _SPECS}
