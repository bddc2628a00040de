"""The paper's figure and our sweep plots, drawn from result files (matplotlib, Agg backend).

- `roofline.png` (Figure 1): every record of `microbench/kernels.json` placed at arithmetic
  intensity = FLOPs / bytes (from the record's `TFLOPs` and `GBps`, i.e. the minimum work and
  traffic of the op) against achieved TFLOP/s (one point set per op/layout: prefix_dense on
  shared and unique is the paper's pair), and the captures of `microbench/ncu.json` (per
  op/layout) at their *measured* DRAM bytes (useful_flops / dram_bytes_read, useful_flops /
  wall_us); roofs
  from `conf/hardware/<hw>.yaml` (`peak_bf16_tflops`, `hbm_read_tbps`) when present, else from
  the CLI arguments; the paper's A100 roof and two measured points (Table 23) for reference.
- `lp_ladder.png`: output throughput against Lp at B=256 per system, one panel per
  (model, TP), from sweeps `table3`, `table9`-`table11` (ShareGPT); the paper's Table 9-11 values
  dashed.
- `k_sweep.png`: throughput against the number of distinct prefixes k (sweep `table20`).
- `fp_sweep.png`: GraniKV throughput against the HOT fraction f_p, cascade as a reference line
  (sweep `table24`).
- `dispatch_heatmap.png`: share of decode steps sent to the dense pass,
  Σ engine.dense_steps / Σ engine.decode_steps, over Lp × B (granikv cells; per (Lp, B) the
  first of sweeps `table15`, `table6` that ran it).

Each plot with no data still writes a PNG that says so, so a partial result set never crashes
the pipeline. CLI: `python -m harness.report.plots --results results/<hw> --out plots/<hw>`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import yaml  # noqa: E402

from harness.report.paper import PAPER_HARDWARE, paper_figure, paper_table  # noqa: E402
from harness.report.tables.queries import TOK, canonical_model, where  # noqa: E402
from harness.run.results import ResultSet, load_results  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
SYSTEM_STYLE: Mapping[str, tuple[str, str]] = {"paged": ("SGLang default (paged)", "tab:gray"),
                                               "cascade": ("SGLang-Cascade (cascade)", "tab:blue"),
                                               "granikv": ("GraniKV", "tab:red")}
LADDER_SWEEPS = ("table3", "table9", "table10", "table11")
HEATMAP_SWEEPS = ("table15", "table6")
PAPER_LADDER = {("llama-3.1-8b", 1): 9, ("qwen2.5-14b", 2): 10, ("qwen2.5-32b", 4): 11}


@dataclass(frozen=True)
class Ceilings:
    """Roofline ceilings of our hardware; None where unknown (that roof is not drawn)."""

    peak_tflops: float | None = None
    hbm_tbps: float | None = None
    source: str = "none"


def load_ceilings(hardware: str, conf_dir: Path | str = REPO_ROOT / "conf" / "hardware",
                  peak_tflops: float | None = None, hbm_tbps: float | None = None) -> Ceilings:
    """Ceilings from `conf/hardware/<hardware>.yaml` when it has them, else from the arguments."""
    path = Path(conf_dir) / f"{hardware}.yaml"
    conf: dict[str, Any] = {}
    if path.exists():
        conf = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    peak = conf.get("peak_bf16_tflops") if conf.get("peak_bf16_tflops") is not None else peak_tflops
    bw = conf.get("hbm_read_tbps") if conf.get("hbm_read_tbps") is not None else hbm_tbps
    used_conf = conf.get("peak_bf16_tflops") is not None or conf.get("hbm_read_tbps") is not None
    return Ceilings(peak_tflops=None if peak is None else float(peak),
                    hbm_tbps=None if bw is None else float(bw),
                    source=str(path) if used_conf else ("arguments" if peak or bw else "none"))


def _no_data(ax: plt.Axes, what: str) -> None:
    ax.text(0.5, 0.5, f"no data\n{what}", ha="center", va="center", transform=ax.transAxes, fontsize=11,
            color="0.3", wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


def _mean_by(frame: pd.DataFrame, by: str, column: str = TOK) -> pd.Series:
    values = pd.to_numeric(frame[column], errors="coerce")
    keys = pd.to_numeric(frame[by], errors="coerce")
    return values.groupby(keys).mean().dropna().sort_index()


def _cells(results: ResultSet, sweeps: Sequence[str]) -> pd.DataFrame:
    cells = results.cells
    if not len(cells):
        return cells
    return cells[cells["sweep"].isin(sweeps)]


def plot_roofline(results: ResultSet, ceilings: Ceilings, ax: plt.Axes) -> bool:
    points = _kernel_points(results) + _ncu_points(results)
    if not points:
        _no_data(ax, "needs microbench/kernels.json records with positive TFLOPs and GBps\n"
                     "(or microbench/ncu.json counters)")
        return False
    for label, ai, tf, marker in points:
        ax.scatter(ai, tf, label=label, s=22 if marker == "o" else 60, marker=marker, zorder=3)
    xs = np.logspace(-1, 4, 200)
    if ceilings.hbm_tbps:
        roof = ceilings.hbm_tbps * xs
        if ceilings.peak_tflops:
            roof = np.minimum(roof, ceilings.peak_tflops)
        ax.plot(xs, roof, color="k", lw=1.5, label=f"our roof ({ceilings.hbm_tbps:g} TB/s"
                + (f", {ceilings.peak_tflops:g} TFLOP/s)" if ceilings.peak_tflops else ")"))
    elif ceilings.peak_tflops:
        ax.axhline(ceilings.peak_tflops, color="k", lw=1.5,
                   label=f"our peak {ceilings.peak_tflops:g} TFLOP/s")
    fig1 = {row["quantity"]: row["value"] for row in _figure1_rows()}
    a100_bw, a100_peak = fig1.get("A100 HBM bandwidth"), fig1.get("A100 BF16 tensor-core peak")
    if a100_bw and a100_peak:
        ax.plot(xs, np.minimum(a100_bw / 1e3 * xs, a100_peak), color="0.6", ls="--", lw=1,
                label=f"paper roof ({PAPER_HARDWARE})")
    for q_ai, q_tf, name in (("paged measured arithmetic intensity", "paged measured throughput", "paged"),
                             ("contiguous measured arithmetic intensity", "contiguous measured throughput",
                              "contiguous")):
        if q_ai in fig1 and q_tf in fig1:
            ax.scatter([fig1[q_ai]], [fig1[q_tf]], marker="x", color="0.4", s=40, zorder=3,
                       label=f"paper: {name}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte): kernels.json minimum bytes, ncu measured bytes")
    ax.set_ylabel("TFLOP/s")
    if ceilings.source == "none":
        ax.text(0.02, 0.98, "no ceilings: add peak_bf16_tflops / hbm_read_tbps to conf/hardware",
                transform=ax.transAxes, va="top", fontsize=8, color="tab:red")
    ax.legend(fontsize=7, loc="lower right")
    return True


Point = tuple[str, "pd.Series | list[float]", "pd.Series | list[float]", str]


def _kernel_points(results: ResultSet) -> list[Point]:
    """(label, intensity, TFLOP/s, marker) per op/layout of kernels.json: minimum-traffic model."""
    recs = results.microbench.get("kernels")
    if recs is None or not len(recs) or not {"TFLOPs", "GBps"} <= set(recs.columns):
        return []
    tflops = pd.to_numeric(recs["TFLOPs"], errors="coerce")
    gbps = pd.to_numeric(recs["GBps"], errors="coerce")
    ok = (tflops > 0) & (gbps > 0)
    recs = recs[ok].assign(ai=(tflops[ok] * 1e3 / gbps[ok]), tf=tflops[ok])
    if not len(recs):
        return []
    label_cols = [c for c in ("op", "layout") if c in recs.columns]
    groups = recs.groupby(label_cols) if label_cols else [("records", recs)]
    out = []
    for name, g in groups:
        label = "/".join(str(n) for n in (name if isinstance(name, tuple) else (name,)))
        out.append((f"ours: {label}", g["ai"], g["tf"], "o"))
    return out


def _ncu_points(results: ResultSet) -> list[Point]:
    """Per op/layout of ncu.json: intensity from *measured* DRAM bytes, as the paper's Figure 1 (a
    record without `op` counts as its kernel's op, `harness.microbench.ncu.op_of`)."""
    from harness.microbench.ncu import op_of

    recs = results.microbench.get("ncu")
    need = {"layout", "dram_bytes_read", "useful_flops", "wall_us"}
    if recs is None or not len(recs) or not need <= set(recs.columns):
        return []
    ops = recs.apply(lambda r: op_of({k: r[k] for k in ("op", "kernel") if k in r.index and isinstance(r[k], str)}),
                     axis=1)
    labels = [f"{op}/{layout}" if op else str(layout) for op, layout in zip(ops, recs["layout"])]
    out = []
    for layout, g in recs.groupby(pd.Series(labels, index=recs.index)):
        flops = pd.to_numeric(g["useful_flops"], errors="coerce")
        dram = pd.to_numeric(g["dram_bytes_read"], errors="coerce")
        wall = pd.to_numeric(g["wall_us"], errors="coerce")
        ok = (flops > 0) & (dram > 0) & (wall > 0)
        if ok.any():
            out.append((f"ours (ncu): {layout}", flops[ok] / dram[ok], flops[ok] / wall[ok] / 1e6, "D"))
    return out


def _figure1_rows() -> list[Mapping[str, Any]]:
    return list(paper_figure(1).rows)


def plot_lp_ladder(results: ResultSet, axes: Sequence[plt.Axes]) -> bool:
    cells = _cells(results, LADDER_SWEEPS)
    any_data = False
    for ax, ((model, tp), number) in zip(axes, PAPER_LADDER.items()):
        paper = paper_table(number)
        ax.set_title(f"{model} TP={tp}, B=256", fontsize=9)
        mine = where(cells, model=model, tp=tp, batch=256) if len(cells) else cells
        for system, (label, color) in SYSTEM_STYLE.items():
            prefix = {"paged": "SGL", "cascade": "SGL-C", "granikv": "GKV"}[system]
            rows = sorted(paper.find_rows(B=256), key=lambda r: r["Lp"])
            ax.plot([r["Lp"] for r in rows], [r[f"{prefix}_tok_s"] for r in rows], ls="--", color=color,
                    alpha=0.45, lw=1)
            if len(mine):
                s = _mean_by(where(mine, system=system), "config.lp")
                if len(s):
                    any_data = True
                    ax.plot(s.index, s.values, marker="o", color=color, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("Lp (tokens)")
        ax.set_ylabel("output tok/s")
    axes[0].plot([], [], ls="--", color="0.5", label=f"paper ({PAPER_HARDWARE})")
    axes[0].legend(fontsize=7)
    if not any_data:
        axes[1].text(0.5, 0.5, "no data\nneeds sweeps table3 / table9-11 at B=256", ha="center", va="center",
                     transform=axes[1].transAxes, color="0.3")
    return any_data


def plot_k_sweep(results: ResultSet, ax: plt.Axes) -> bool:
    cells = _cells(results, ("table20",))
    paper = paper_table(20)
    names = {"paged": "SGLang default", "cascade": "SGLang-Cascade", "granikv": "GraniKV"}
    any_data = False
    for system, (label, color) in SYSTEM_STYLE.items():
        rows = [r for r in paper.rows if r["row_type"] == "throughput" and r["system"] == names[system]]
        ax.plot([r["k"] for r in rows], [r["output_tok_s"] for r in rows], ls="--", color=color, alpha=0.45)
        if len(cells) and "config.k" in cells.columns:
            s = _mean_by(where(cells, system=system), "config.k")
            if len(s):
                any_data = True
                ax.plot(s.index, s.values, marker="o", color=color, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("distinct prefixes k")
    ax.set_ylabel("output tok/s")
    ax.set_title("multi-prefix k sweep (Lp=8K, B=256); dashed: paper", fontsize=9)
    if any_data:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no data\nneeds sweep table20", ha="center", va="center", transform=ax.transAxes,
                color="0.3")
    return any_data


def plot_fp_sweep(results: ResultSet, ax: plt.Axes) -> bool:
    cells = _cells(results, ("table24",))
    paper = paper_table(24)
    rows = [r for r in paper.rows if r["system"] == "GraniKV"]
    ax.plot([r["fp"] for r in rows], [r["tok_s"] for r in rows], ls="--", color="tab:red", alpha=0.45)
    ax.axhline(next(r["tok_s"] for r in paper.rows if r["system"] == "Cascade"), ls="--", color="tab:blue",
               alpha=0.45)
    any_data = False
    if len(cells) and "config.hot_fraction" in cells.columns:
        s = _mean_by(where(cells, system="granikv"), "config.hot_fraction")
        if len(s):
            any_data = True
            ax.plot(s.index, s.values, marker="o", color="tab:red", label="GraniKV")
        casc = pd.to_numeric(where(cells, system="cascade")[TOK], errors="coerce").dropna()
        if len(casc):
            any_data = True
            ax.axhline(float(casc.mean()), color="tab:blue", label="cascade")
    ax.set_xlabel("HOT fraction f_p")
    ax.set_ylabel("output tok/s")
    ax.set_title("f_p sweep (Lp=8K, B=256); dashed: paper", fontsize=9)
    if any_data:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no data\nneeds sweep table24", ha="center", va="center", transform=ax.transAxes,
                color="0.3")
    return any_data


def dispatch_share(results: ResultSet) -> pd.DataFrame:
    """Dense share of decode steps, Lp rows × B columns, for the most common model (NaN = not run).

    Per (Lp, B) the counters come from the first of HEATMAP_SWEEPS that ran that point, as
    Table 15 reads them."""
    need = ("engine.dense_steps", "engine.decode_steps", "config.lp", "config.batch")
    parts, seen = [], set()
    for sweep in HEATMAP_SWEEPS:
        sub = where(results.sweep_cells(sweep), system="granikv") if len(results.cells) else results.cells
        if not len(sub) or not all(c in sub.columns for c in need):
            continue
        points = list(zip(pd.to_numeric(sub["config.lp"]), pd.to_numeric(sub["config.batch"])))
        parts.append(sub[[p not in seen for p in points]])
        seen |= set(points)
    if not parts:
        return pd.DataFrame()
    cells = pd.concat(parts)
    model = cells["config.model"].map(canonical_model).mode().iloc[0]
    cells = cells[cells["config.model"].map(canonical_model) == model]
    frame = pd.DataFrame({c: pd.to_numeric(cells[c], errors="coerce") for c in need}).dropna()
    sums = frame.groupby(["config.lp", "config.batch"])[["engine.dense_steps", "engine.decode_steps"]].sum()
    sums = sums[sums["engine.decode_steps"] > 0]
    if not len(sums):
        return pd.DataFrame()
    share = (sums["engine.dense_steps"] / sums["engine.decode_steps"]).unstack("config.batch")
    share.attrs["model"] = model
    return share


def plot_dispatch_heatmap(results: ResultSet, ax: plt.Axes) -> bool:
    share = dispatch_share(results)
    if share.empty:
        _no_data(ax, "needs granikv cells with engine.dense_steps and decode steps (sweeps table15 / table6)")
        return False
    model = share.attrs.get("model", "")
    im = ax.imshow(share.values * 100, origin="lower", cmap="viridis", vmin=0, vmax=100, aspect="auto")
    ax.set_xticks(range(len(share.columns)), [f"{int(b)}" for b in share.columns])
    ax.set_yticks(range(len(share.index)), [f"{int(lp)}" for lp in share.index])
    for i in range(share.shape[0]):
        for j in range(share.shape[1]):
            v = share.values[i, j]
            if not np.isnan(v):
                ax.text(j, i, f"{100 * v:.0f}%", ha="center", va="center", color="w" if v < 0.6 else "k",
                        fontsize=8)
    ax.set_xlabel("B")
    ax.set_ylabel("Lp")
    ax.set_title(f"dense-dispatched share of decode steps ({model})", fontsize=9)
    plt.colorbar(im, ax=ax, label="% dense")
    return True


@dataclass(frozen=True)
class PlotResult:
    path: Path
    has_data: bool


def _one(out: Path, name: str, draw: Callable[[plt.Figure], bool], size: tuple[float, float]) -> PlotResult:
    fig = plt.figure(figsize=size)
    try:
        ok = draw(fig)
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
    return PlotResult(path=path, has_data=ok)


def write_plots(results: ResultSet, out_dir: Path | str,
                ceilings: Ceilings | None = None) -> dict[str, PlotResult]:
    """Write every plot as `<name>.png` under `out_dir`; returns which ones had data."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ceilings = ceilings or load_ceilings(results.hardware)
    return {
        "roofline": _one(out, "roofline", lambda f: plot_roofline(results, ceilings, f.add_subplot()),
                         (6.5, 4.5)),
        "lp_ladder": _one(out, "lp_ladder", lambda f: plot_lp_ladder(results, f.subplots(1, 3)), (13, 4)),
        "k_sweep": _one(out, "k_sweep", lambda f: plot_k_sweep(results, f.add_subplot()), (5.5, 4)),
        "fp_sweep": _one(out, "fp_sweep", lambda f: plot_fp_sweep(results, f.add_subplot()), (5.5, 4)),
        "dispatch_heatmap": _one(out, "dispatch_heatmap",
                                 lambda f: plot_dispatch_heatmap(results, f.add_subplot()), (6, 4.5)),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.report.plots", description=__doc__.split("\n")[0])
    p.add_argument("--results", required=True, help="results/<hardware> directory")
    p.add_argument("--out", required=True, help="output directory, e.g. plots/<hardware>")
    p.add_argument("--peak-tflops", type=float, help="bf16 peak when conf/hardware/<hw>.yaml lacks it")
    p.add_argument("--hbm-tbps", type=float, help="HBM read bandwidth (TB/s) when the conf lacks it")
    p.add_argument("--hardware-conf-dir", default=str(REPO_ROOT / "conf" / "hardware"))
    args = p.parse_args(argv)
    if not Path(args.results).is_dir():
        print(f"error: results directory {args.results} does not exist", file=sys.stderr)
        return 2
    results = load_results(args.results)
    ceilings = load_ceilings(results.hardware, args.hardware_conf_dir, args.peak_tflops, args.hbm_tbps)
    for name, r in write_plots(results, args.out, ceilings).items():
        print(f"{name}: {r.path} ({'ok' if r.has_data else 'no data'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
