"""The engine and host pages of docs/generated/: the decode step against its floor (and a tree's
floor for each depth of sharing), the greedy step before and after the sampling features, the
storage layer's host bookkeeping, host-side costs, the TP=2 all-reduce and the CPU replays.
"""

from __future__ import annotations

import json

from harness.docs.common import CPU, H200, HEADER, Sources, cite, git_short, md_table


def tree_floor_rows(records: list[dict]) -> list[str]:
    """Tree cells (`engine_steps --trees`): the K/V floor for each depth of sharing, and the step
    against the floor of the sharing its system can have (harness.microbench.tree_floor)."""
    if not records:
        return []
    out = ["Tree cells (levels as fanout × length, request i on leaf i mod leaves, no hint): the K/V floor "
           "when shared runs are read per request (paged), the root once (cascade), two levels once (a head "
           "and one ext class), or every shared node once (any depth); each system's floor is the one of "
           "the sharing it can have (granikv: any depth).", ""]
    out += md_table(("system", "tree", "B", "K/V floor ms: paged", "root", "two levels", "any depth", "floor ms",
                   "step ms", "step / floor"),
                  [(r["system"], " ".join(f"{f}×{n}" for f, n in r["tree"]), r["B"],
                    *(f"{r['floor_kv_ms_by_depth'][k]:.2f}" for k in ("paged", "root", "two_level", "any_depth")),
                    f"{r['floor_ms']:.2f}", f"{r['step_ms']:.2f}", f"{r['step_over_floor']:.2f}")
                   for r in records])
    return out + [""]


def render_decode_step(src: Sources) -> str:
    """The decode step against its floor (linear layers + the K/V each system must read)."""
    rel = f"{H200}/engine/steps.json"
    doc = src.json(rel)
    bw = doc["config"]["hbm_tbps"]
    out = [HEADER, "", "Floor of a decode step = weights and GEMM FLOPs of the 32 layers + lm_head (each "
           "max(bytes / read ceiling, FLOPs / GEMM ceiling)) + the K/V the system must read: paged every "
           "request's whole context, cascade and granikv the shared prefix once plus each request's own "
           "tokens. Achieved = floor / measured step.", ""]
    out += md_table(("system", "Lp", "B", "linear floor ms", "K/V floor ms", "K/V GB", "floor ms", "step ms",
                   "achieved", "host-gap share"),
                  [(r["system"], r["Lp"], r["B"], f"{r['floor_linear_ms']:.2f}", f"{r['floor_kv_ms']:.2f}",
                    f"{r['floor_kv_ms'] * bw:.1f}", f"{r['floor_ms']:.2f}", f"{r['step_ms']:.2f}",
                    f"{r['floor_ms'] / r['step_ms']:.2f}", f"{r['host_gap_share']:.3f}")
                   for r in doc["records"] if "tree" not in r])
    out += ["", f"K/V GB = K/V floor × {bw} TB/s. Paged at Lp=16K beats its floor: 256 requests read the same "
            "prefix pages at the same time and hit L2, which the floor (every request streams from HBM) "
            "leaves out.", ""]
    out += tree_floor_rows([r for r in doc["records"] if "tree" in r])
    env = doc["env"]
    out.append(f"Measured on {env.get('gpu')} (torch {env.get('torch')}, triton {env.get('triton')}), "
               f"git {git_short(doc)}.")
    out += ["", "HTTP serving against the in-process engine (the same engine, a 1024-token burst):", ""]
    rows = []
    for name in ("http-steady-incremental.json", "http-steady.json"):
        doc_h = src.json(f"{H200}/engine/{name}")
        h = doc_h["http"]
        # the format the run used, as its config records it (a file from before the option: SGLang's default)
        chunks = doc_h.get("config", {}).get("http_streaming", "cumulative")
        rows.append((name, chunks,
                     git_short(src.json(f"{H200}/engine/{name}")), f"{h['inprocess_output_throughput']:.0f}",
                     f"{h['http_output_throughput']:.0f}", f"{h['http_over_inprocess']:.3f}"))
    out += md_table(("file", "chunks", "git", "in-process tok/s", "HTTP tok/s", "HTTP / in-process"), rows)
    out += ["", cite(f"{H200}/engine/steps.json", f"{H200}/engine/http-steady-incremental.json",
                      f"{H200}/engine/http-steady.json")]
    return "\n".join(out) + "\n"


SAMPLING_AB = (f"{H200}/engine/sampling-ab/without-sampling.json", f"{H200}/engine/sampling-ab/with-sampling.json")


SAMPLING_AB_BAR = 1.01  # the greedy step may grow by at most 1% from the sampling features


def render_sampling_ab(src: Sources) -> str:
    """The greedy decode step before and after the sampling features (top-p/top-k/seed/logprobs)."""
    docs = [src.json(rel) for rel in SAMPLING_AB]
    recs = [d["records"][0] for d in docs]
    out = [HEADER, "", f"`harness.microbench.engine_steps`, granikv, Lp={recs[0]['Lp']} B={recs[0]['B']}, "
           "every request greedy (the tree after the features runs them with sampled share "
           f"{docs[1]['config'].get('sampled_share', 0.0)}), the two trees one after the other on one machine:", ""]
    out += md_table(("tree", "git", "step ms", "p10–p90 ms", "floor ms", "host-gap share"),
                  [(name, git_short(d), f"{r['step_ms']:.2f}", f"{r['step_ms_p10']:.2f}–{r['step_ms_p90']:.2f}",
                    f"{r['floor_ms']:.2f}", f"{r['host_gap_share']:.3f}")
                   for name, d, r in zip(("without sampling", "with sampling"), docs, recs, strict=True)])
    ratio = recs[1]["step_ms"] / recs[0]["step_ms"]
    out += ["", f"With / without step ms: {ratio:.4f}; bar ≤ {SAMPLING_AB_BAR}: "
            f"{'met' if ratio <= SAMPLING_AB_BAR else 'not met'}.", "", cite(*SAMPLING_AB)]
    return "\n".join(out) + "\n"


def render_storage(src: Sources) -> str:
    """Host bookkeeping of the storage facade at engine scale (CPU)."""
    from harness.microbench.storage import render_notes

    rel = f"{CPU}/microbench/storage.json"
    return f"{HEADER}\n\n{render_notes(src.json(rel))}\n\n{cite(rel)}\n"


def render_host(src: Sources) -> str:
    """Host-side costs: fused elementwise ops, the dispatcher's per-step cost, thread vs process."""
    el_rel, di_rel, sv_rel = (f"{H200}/microbench/elementwise.json", f"{H200}/microbench/dispatch.json",
                              f"{H200}/microbench/server.json")
    el, di, sv = src.json(el_rel), src.json(di_rel), src.json(sv_rel)
    recs = {(r["op"], r["impl"], r["T"]): r for r in el["records"]}
    rows = []
    for t in sorted({r["T"] for r in el["records"]}, reverse=True):
        for op in ("add_norm", "rope", "silu_mul", "chain", "layer"):
            a, b = recs.get((op, "torch", t)), recs.get((op, "fused", t))
            if a and b:
                rows.append((t, op, f"{a['us_per_layer']:.2f} ({a['launches_per_layer']})",
                             f"{b['us_per_layer']:.2f} ({b['launches_per_layer']})",
                             f"{a['us_per_layer'] - b['us_per_layer']:.2f}",
                             f"{(a['us_per_layer'] - b['us_per_layer']) * el['config']['layers'] / 1e3:.2f}"))
    out = [HEADER, "", f"Fused elementwise kernels against the torch ops, µs per layer in a CUDA graph (launches); "
           f"`chain` = the layer's four fused ops, `layer` = a whole layer with attention stubbed "
           f"(git {git_short(el)}):", ""]
    out += md_table(("T", "part", "torch", "fused", "saving µs/layer", f"× {el['config']['layers']} layers (ms)"),
                  rows)
    d = di["records"][0]
    out += ["", f"Dispatcher cost per decode step (B={d['B']}, Lp={d['Lp']}, git {git_short(di)}):", ""]
    out += md_table(("quantity", "value"), [
        ("one decision (`DispatchPolicy.choose`), µs", f"{d['choose_us']:.2f}"),
        ("the engine's dispatch phase per step, µs", f"{d['wrapper_cpu_us_per_step']:.1f}"),
        ("decode step, µs", f"{d['step_us']:.0f}"),
        ("dispatch share of the step", f"{d['wrapper_cpu_us_per_step'] / d['step_us']:.4f}"),
    ])
    out += ["", f"Simulated engine (fixed step, part of it holding the GIL) behind the real server and client "
            f"(git {git_short(sv)}):", ""]
    out += md_table(("engine", "B", "step ms (host ms)", "served tok/s", "engine tok/s", "served / engine"),
                  [(r["mode"], r["batch"], f"{r['step_ms']:.0f} ({r['host_ms']:.0f})",
                    f"{r['output_throughput']:.0f}", f"{r['engine_rate']:.0f}", f"{r['ratio']:.3f}")
                   for r in sv["records"]])
    out += ["", cite(el_rel, di_rel, sv_rel)]
    return "\n".join(out) + "\n"


def render_tp2(src: Sources) -> str:
    """NCCL all-reduce between the two H200s, isolated and inside the engine's decode graph."""
    iso_rel, eng_rel = f"{H200}/microbench/allreduce-tp2.json", f"{H200}/microbench/allreduce-in-engine.json"
    iso, eng = src.json(iso_rel), src.json(eng_rel)
    out = [HEADER, "", f"Isolated all-reduce (git {git_short(iso)}; peak bus bandwidth {iso['peak_busbw_GBps']} GB/s):",
           ""]
    out += md_table(("kind", "B", "bytes", "µs", "bus GB/s"),
                  [(r["kind"], r.get("B") or "—", r["bytes"], r["us"], r["busbw_GBps"]) for r in iso["records"]])
    r = eng["records"][0]
    out += ["", f"Inside the engine ({r['model']}, TP={r['tp']}, B={r['B']}, all-reduces in the decode graph):", ""]
    out += md_table(("quantity", "value"), [
        ("message bytes", r["message_bytes"]),
        ("calls per step", f"{r['calls_per_step']:.0f}"),
        ("µs per call", f"{r['engine_us_per_call']:.1f}"),
        ("bytes / peak bus bandwidth, µs", f"{r['bytes_over_peak_busbw_us']:.1f}"),
        ("engine call / isolated call", f"{r['engine_over_isolated']:.2f}"),
        ("NCCL share of the step", f"{r['nccl_share_of_step']:.3f}"),
    ])
    out += ["", cite(iso_rel, eng_rel)]
    return "\n".join(out) + "\n"


def render_replay(src: Sources) -> str:
    """CPU replays of KV-capacity-bound multi-prefix cells: prefill tokens each system computes."""
    folder = src.root / CPU / "microbench"
    rows = []
    for p in sorted(folder.glob("replay-multiprefix-*.json")):
        doc = json.loads(p.read_text())
        by = {r["system"]: r for r in doc["records"] if r.get("op") == "replay"}
        if "paged" not in by or "granikv" not in by:
            continue
        pg, gk = by["paged"], by["granikv"]
        rows.append((doc["config"]["workload_config"]["k"], doc["config"]["num_slots"], pg["prefill_tokens"],
                     gk["prefill_tokens"], f"{gk['prefill_tokens'] / pg['prefill_tokens']:.3f}", git_short(doc),
                     p.name))
    rows.sort(key=lambda r: (r[0], r[1]))
    out = [HEADER, "", "The engine's own step loop, scheduler and storage with a stub runner on a CPU "
           "(`harness.microbench.replay`), multi-prefix Lp=8K, B=256; prefill tokens each system computes:", ""]
    out += md_table(("k", "KV slots", "paged prefill tokens", "granikv prefill tokens", "granikv / paged", "git",
                   "file"), rows)
    out += ["", cite(f"{CPU}/microbench/replay-multiprefix-*.json")]
    return "\n".join(out) + "\n"
