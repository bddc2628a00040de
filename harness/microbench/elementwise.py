"""Elementwise-fusion microbenchmark: the decoder's small ops, torch vs fused Triton.

    python -m harness.microbench.elementwise                      # GPU: Llama-3.1-8B shapes, bf16
    python -m harness.microbench.elementwise --device cpu         # dry run: tiny model, interpreter

Per decoder layer the non-GEMM, non-attention work is: residual add + RMSNorm (twice), RoPE on q
and k, SiLU(gate) * up. The torch path runs them as 11 launches (add, F.rms_norm, table gather,
4 mul/addcmul for RoPE, add, F.rms_norm, silu, mul); the fused path as 4 (add_rms_norm_ x2,
rope_, silu_mul). For each token count T (a decode step of B = T requests) it times, each
captured in one CUDA graph of `--layers` repetitions (so the per-launch cost is the in-graph
one, as in the engine's decode graphs) and divided by the layer count:
- `op`: each op pair alone (norm, add_norm, rope, silu_mul);
- `chain`: the four ops of one layer in sequence;
- `layer`: a whole DecoderLayer forward (GEMMs included, attention stubbed by a preallocated
  output) with fused_elementwise off / on, so the saving is seen against the layer's real time.
Times are medians of graph replays (triton.testing.do_bench, L2 flushed before each replay; see
_timing.py). Records: {"op", "impl", "T", "us_per_layer", "launches_per_layer"}; the printed
table adds the saving x num_layers = predicted saving per decode step.
On CPU (no CUDA, or --device cpu) the Triton kernels run in the interpreter and times are wall
clock: they only prove the script runs; nothing is written unless --out is given.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch


def _setup(device: str) -> None:
    if device == "cpu":  # before granikv.kernels (triton.jit reads it at decoration time)
        os.environ.setdefault("TRITON_INTERPRET", "1")


class _StubAttention:
    """Attention replaced by a preallocated output: no kernel, so a layer's time is GEMMs +
    elementwise ops."""

    def __init__(self, t: int, hq: int, d: int, dtype: torch.dtype, device: torch.device):
        self.out = torch.zeros(t, hq, d, dtype=dtype, device=device)

    def __call__(self, layer_id, q, k, v):
        return self.out


def _bench(fn, layers: int, rep_ms: int):
    """Median µs of one call of fn (which runs `layers` repetitions) / layers."""
    from harness.microbench._timing import bench

    tm = bench(fn, rep_ms=rep_ms)
    return tm.us / layers, tm.graphed


def _cases(t: int, spec, rope, dtype, dev, rnd, max_positions: int) -> dict:
    """op -> (torch fn, fused fn, torch launches, fused launches) on fresh T-token inputs."""
    from granikv.kernels import add_rms_norm_, rms_norm, rope_, silu_mul

    hidden, inter, eps = spec.hidden_size, spec.intermediate_size, spec.rms_norm_eps
    hq, hkv, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    x = rnd(t, hidden)
    res = rnd(t, hidden)
    w = rnd(hidden) + 1.0
    qkv = rnd(t, (hq + 2 * hkv) * d)
    qk = qkv[:, : (hq + hkv) * d].view(t, hq + hkv, d)
    pos = torch.randint(0, max_positions, (t,)).to(dev)
    gate_up = rnd(t, 2 * inter)
    F = torch.nn.functional

    cases = {
        "norm": (lambda: F.rms_norm(x, (hidden,), w, eps), lambda: rms_norm(x, w, eps), 1, 1),
        "add_norm": (lambda: F.rms_norm(res.add_(x), (hidden,), w, eps), lambda: add_rms_norm_(x, res, w, eps), 2, 1),
        "rope": (lambda: rope(qk, pos), lambda: rope_(qk, pos, rope.cos_sin), 5, 1),
        "silu_mul": (lambda: F.silu(gate_up[:, :inter]) * gate_up[:, inter:], lambda: silu_mul(gate_up), 2, 1),
    }
    chain = ("add_norm", "rope", "add_norm", "silu_mul")
    torch_chain = [cases[k][0] for k in chain]
    fused_chain = [cases[k][1] for k in chain]
    cases["chain"] = (lambda: [f() for f in torch_chain], lambda: [f() for f in fused_chain], 11, 4)
    return cases


def _layer_case(t: int, spec, layer, dtype, dev, rnd, max_positions: int, layers: int) -> dict:
    """impl -> fn running `layers` DecoderLayer forwards (attention stubbed) on T tokens."""
    attn = _StubAttention(t, spec.num_heads, spec.head_dim, dtype, dev)
    h0 = rnd(t, spec.hidden_size)
    pos = torch.randint(0, max_positions, (t,)).to(dev)

    def make(fused: bool):
        def rep():
            x, r = h0, None
            for _ in range(layers):
                x, r = layer(x, r, pos, attn, fused)
            return x
        return rep

    return {"torch": make(False), "fused": make(True)}


def run(args) -> list[dict]:
    from granikv.dist import TPGroup
    from granikv.model.decoder import DecoderLayer
    from granikv.model.layers import RotaryEmbedding
    from granikv.model.spec import load_spec

    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    spec = load_spec(args.model)
    n_layers = args.layers
    rope = RotaryEmbedding(spec, args.max_positions, dtype, dev)
    g = torch.Generator(device="cpu").manual_seed(0)
    torch.manual_seed(0)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype).to(dev)

    layer = None
    if args.layer:
        layer = DecoderLayer(spec, 0, TPGroup(), rope, dtype, dev)
        for p in layer.parameters():
            p.copy_(rnd(*p.shape, scale=0.02) + (1.0 if p.dim() == 1 else 0.0))
    shape = {"dtype": str(dtype).removeprefix("torch."), "hidden": spec.hidden_size, "inter": spec.intermediate_size,
             "Hq": spec.num_heads, "Hkv": spec.num_kv_heads, "d": spec.head_dim}

    def one(op, impl, t, fn, launches):
        def rep():
            for _ in range(n_layers):
                fn()
        us, graphed = _bench(rep, n_layers, args.rep_ms)
        records.append({"op": op, "impl": impl, "T": t, "us_per_layer": us, "launches_per_layer": launches,
                        "graphed": graphed, **shape})
        print(f"  T={t:4d} {op:9s} {impl:5s} {us:9.2f} us/layer", flush=True)

    records: list[dict] = []
    for t in args.tokens:
        for op, (tf, ff, n_torch, n_fused) in _cases(t, spec, rope, dtype, dev, rnd, args.max_positions).items():
            one(op, "torch", t, tf, n_torch)
            one(op, "fused", t, ff, n_fused)
        if layer is not None:
            fns = _layer_case(t, spec, layer, dtype, dev, rnd, args.max_positions, n_layers)
            for impl, launches in (("torch", 11), ("fused", 4)):
                us, graphed = _bench(fns[impl], n_layers, args.rep_ms)
                records.append({"op": "layer", "impl": impl, "T": t, "us_per_layer": us,
                                "launches_per_layer": launches, "graphed": graphed, **shape})
                print(f"  T={t:4d} {'layer':9s} {impl:5s} {us:9.2f} us/layer", flush=True)
    return records


def table(records: list[dict], num_layers: int) -> str:
    """Markdown: torch vs fused µs per layer, saving per layer and per step (x num_layers)."""
    by = {(r["op"], r["T"], r["impl"]): r for r in records}
    lines = ["| T | op | torch µs/layer (launches) | fused µs/layer (launches) | saving µs/layer | "
             f"saving ms/step (x{num_layers}) |", "|---|---|---|---|---|---|"]
    for (op, t, impl), r in by.items():
        if impl != "torch" or (op, t, "fused") not in by:
            continue
        f = by[(op, t, "fused")]
        save = r["us_per_layer"] - f["us_per_layer"]
        lines.append(f"| {t} | {op} | {r['us_per_layer']:.2f} ({r['launches_per_layer']}) | "
                     f"{f['us_per_layer']:.2f} ({f['launches_per_layer']}) | {save:.2f} | "
                     f"{save * num_layers / 1e3:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="cuda (measurement) or cpu (dry run under the Triton interpreter)")
    ap.add_argument("--model", default=None, help="shapes (default llama-3.1-8b on cuda, tiny on cpu)")
    ap.add_argument("--tokens", default=None, help="T values, comma-separated (default 256,8; cpu: 8,3)")
    ap.add_argument("--layers", type=int, default=None, help="repetitions per graph (default 32; cpu: 2)")
    ap.add_argument("--no-layer", dest="layer", action="store_false", help="skip the whole-layer timing")
    ap.add_argument("--max-positions", type=int, default=16384 + 512)
    ap.add_argument("--rep-ms", type=int, default=200)
    ap.add_argument("--out", default=None,
                    help="result JSON (default results/h200/microbench/elementwise.json on cuda; none on cpu)")
    args = ap.parse_args(argv)
    cpu = args.device == "cpu"
    if not cpu and not torch.cuda.is_available():
        print("elementwise: no CUDA device (use --device cpu for a dry run)", file=sys.stderr)
        return 2
    _setup(args.device)
    args.model = args.model or ("tiny" if cpu else "llama-3.1-8b")
    args.tokens = [int(x) for x in (args.tokens or ("8,3" if cpu else "256,8")).split(",")]
    args.layers = args.layers or (2 if cpu else 32)
    if cpu:
        args.max_positions = min(args.max_positions, 512)
        print("CPU dry run (Triton interpreter, wall clock): the numbers are not measurements")
    from granikv.model.spec import load_spec
    from harness.microbench._timing import write_result

    records = run(args)
    num_layers = load_spec(args.model).num_layers
    print(table(records, num_layers))
    out = args.out or (None if cpu else "results/h200/microbench/elementwise.json")
    if out:
        write_result(out, dict(vars(args)), records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
