"""Engine configuration: one typed dataclass that every layer of the engine reads.

The harness turns Hydra configs into an `EngineConfig`; the server turns CLI flags into one
(a flag per field). Nothing here imports torch, so configs can be built and validated on any host.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

# The systems' names. `granikv.systems.SYSTEMS` is the registry keyed by them; it imports the
# attention backends (torch), so this torch-free module keeps the names on its own
# (tests/test_system_registry.py holds the two equal).
SYSTEM_NAMES: tuple[str, ...] = ("paged", "cascade", "granikv")

# The dispatcher's break-even on an H200 (Llama-3.1-8B, TP=1; conf/hardware/h200.yaml, docs/
# performance.md, "prefix_pass_min_saved_mib"): a pass launch pays once its classes avoid this many
# MiB of K/V re-reads per layer together
PREFIX_PASS_MIN_SAVED_MIB = 192.0


@dataclass(frozen=True)
class EngineConfig:
    """Everything that decides how one engine instance stores KV and decodes.

    The three systems share the model, scheduler, prefill kernel and sampler; they differ only
    in `system` (storage policy + decode attention: granikv.systems), so their throughputs
    compare cleanly.
    """

    model: str = "tiny"  # a name under conf/model/, or a directory holding an HF config.json
    system: str = "granikv"  # paged | cascade | granikv
    tp: int = 1
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto (bf16 on GPU, fp32 on CPU) | bfloat16 | float16 | float32
    load_format: str = "dummy"  # dummy (seeded random weights) | safetensors
    model_path: str | None = None
    seed: int = 0

    # storage
    page_size: int = 16  # paged/cascade page size; granikv's COLD pool is always token-level
    cold_page_size: int = 1  # COLD granularity (Table 18 sweeps it); 1 is the paper's default
    hot_fraction: float = 0.2  # f_p: share of KV slots reserved for HOT slabs (granikv only)
    kv_budget_gb: float | None = None  # cap the KV cache (emulates a smaller GPU); None = fill
    mem_fraction: float = 0.85  # share of free device memory the KV cache may take when no budget
    num_slots: int | None = None  # explicit slot count (tests); overrides the two above

    # attention dispatch (granikv)
    m_sat: int = 1024  # dense when n_class * g >= m_sat; fitted per GPU, see conf/hardware/
    min_prefix_for_hot: int = 256  # shorter shared prefixes are not worth a slab
    promote_min_refs: int = 2  # a COLD prefix reused by this many live requests is copied to HOT
    # the classes of one prefix pass kind take the pass only when together they avoid at least this
    # many MiB of K/V re-reads per layer (sum of (n_class - 1) * Lp * K/V bytes per token per rank);
    # below, the plain path is faster.
    # None: PREFIX_PASS_MIN_SAVED_MIB on CUDA (fitted on an H200, conf/hardware/h200.yaml), 0 on the
    # CPU (no launch overhead to amortize; the tests want the prefix passes exercised)
    prefix_pass_min_saved_mib: float | None = None
    # a COLD prefix class whose run is one ascending slot range (a prompt prefilled from an
    # unfragmented COLD pool) is read by the slab form of the pass (contiguous loads) instead of
    # through a member's slot-table row; False: every COLD class takes the page-row (rows) form
    cold_range_as_slab: bool = True
    # shared levels a request's attention reads once per step (granikv): 1 = its head class only,
    # 2 = the head and one extension level (a system prompt and an agent's role), up to 5 (a tree of
    # runs: granikv.attention.granikv)
    share_depth: int = 2
    # a step whose classes span two levels or more reads them in one flattened launch and merges
    # them in one pass (granikv/kernels/prefix_flat.py); False: one launch and merge per level
    flat_prefix: bool = True

    # scheduler
    max_running: int = 256
    max_context: int = 32768
    chunked_prefill_tokens: int = 8192
    max_prefill_tokens: int = 16384

    # kernels: "triton" (GPU, or Triton's interpreter on CPU) or "torch" (float32 references;
    # slow, for cross-checks in tests)
    kernel_impl: str = "triton"
    # fused Triton kernels for the decoder's elementwise ops (residual add + RMSNorm, SiLU * up,
    # RoPE) on CUDA; the CPU always runs the torch path
    fused_elementwise: bool = True
    # split the keys of prefill steps too small to fill the GPU (a few short suffixes behind a long
    # cached prefix) across programs and fold the partials (granikv.kernels.extend); False runs
    # one program per query tile and KV head, whatever the step's size
    extend_split_keys: bool = True
    # how many splits: "fill" (split until the programs fill 2 waves of SMs) or "long-keys"
    # (also >= 4 splits behind >= 8K keys while the programs are within 6 waves, and none behind
    # shorter keys once one split fills 3/4 of a wave; ExtendSplitPolicy.named). "long-keys" fits
    # the extend kernel sweep; its serving A/B cells (tag=long-keys, Lp=8K/16K B=256) stay within
    # the repetitions' spread (tables/h200/repetitions.md, "A/B cells"), hence not the default.
    extend_split_rule: str = "fill"

    # runner
    cuda_graphs: bool = True
    # capture the decode graphs of single-prefix steps for every batch bucket when the engine
    # starts (compiling their Triton variants too), and compile the extend kernel's one-split and
    # split-keys variants (CUDA only), not when a serving run first meets them
    capture_at_start: bool = True
    overlap_schedule: bool = True  # queue decode step N+1 before reading step N's tokens (greedy)
    graph_batch_sizes: tuple[int, ...] = field(
        default_factory=lambda: (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512)
    )
    # CUDA graphs for small extend steps (granikv.engine.extend_graphs): token buckets, e.g.
    # 64,128,256; empty (the default) runs every extend step eagerly: their serving A/B cells
    # (tag=egraphs, Lp=8K/16K B=256; tables/h200/repetitions.md, "A/B cells") gain nothing beyond
    # the repetitions' spread and the graphs add start-up capture time.
    extend_graph_tokens: tuple[int, ...] = ()
    # request buckets of those graphs (one request of each is padding: a bucket of 4 takes <= 3)
    extend_graph_reqs: tuple[int, ...] = (2, 4, 8)

    def __post_init__(self) -> None:
        if self.system not in SYSTEM_NAMES:
            raise ValueError(f"system must be one of {SYSTEM_NAMES}, got {self.system!r}")
        if self.tp < 1:
            raise ValueError(f"tp must be >= 1, got {self.tp}")
        if not 0.0 <= self.hot_fraction < 1.0:
            raise ValueError(f"hot_fraction must be in [0, 1), got {self.hot_fraction}")
        if self.page_size < 1 or self.cold_page_size < 1:
            raise ValueError("page sizes must be >= 1")
        if self.max_running < 1 or self.max_context < 2:
            raise ValueError("max_running must be >= 1 and max_context >= 2")
        if self.extend_split_rule not in ("fill", "long-keys"):
            raise ValueError(f"extend_split_rule must be fill or long-keys, got {self.extend_split_rule!r}")
        if self.kernel_impl not in ("triton", "torch"):
            raise ValueError(f"kernel_impl must be triton or torch, got {self.kernel_impl!r}")
        if self.kv_budget_gb is not None and self.kv_budget_gb <= 0:
            raise ValueError("kv_budget_gb must be positive")
        if not 1 <= self.share_depth <= 5:  # granikv.attention.plan.MAX_SHARE_DEPTH (no torch import here)
            raise ValueError(f"share_depth must be in 1..5, got {self.share_depth}")
        if self.prefix_pass_min_saved_mib is not None and self.prefix_pass_min_saved_mib < 0:
            raise ValueError("prefix_pass_min_saved_mib must be >= 0")
        if any(t < 1 for t in self.extend_graph_tokens) or any(n < 2 for n in self.extend_graph_reqs):
            raise ValueError("extend_graph_tokens must be >= 1 and extend_graph_reqs >= 2 (one is padding)")

    def replace(self, **changes) -> EngineConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        return d
