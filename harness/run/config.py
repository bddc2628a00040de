"""A cell's Hydra config, parsed once into a typed, frozen `Cell` (conf/config.yaml and its groups).

    cell = Cell.from_config(cfg)      # at the entry point (harness.run.cell, harness.run.batch)
    cell.cell_id, cell.result_path, cell.workload, cell.server.host, cell.hardware.device, ...

Why parse once: every step of a cell (the workload file, the engine's arguments, the GPU checks,
the client, the result's `config` section) reads the same values, and each reading its own
`cfg.get(...)` would let one step see a default another never applied, or find a typo only when
it is reached. Here every key is read, converted to its type and checked in one place, and a bad
value is a CellError naming the key, before any work. Downstream code takes the Cell (or one of
its parts) and never sees a DictConfig.

The parts follow the config's groups: `Identity` (the values that name the cell, top-level
keys and group names), `SystemSpec` (conf/system), `ModelSpec` (conf/model), `Hardware`
(conf/hardware), the `WorkloadConfig` (conf/workload with the top-level lp/k/num_prompts/
output_len), `Server` and `ClientSettings` (the `server:` and `client:` blocks), `Measure` (what
the measured run does) and `Paths` (where files go). Importing this module registers the
`${cell_id:}` resolver the config's run directory uses.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from omegaconf import DictConfig, OmegaConf

from harness.run.sweeps import cell_id
from harness.run.workloads.config import WorkloadConfig

SYSTEM_KINDS = ("engine", "external")


class CellError(RuntimeError):
    """A cell could not be measured; the message says why."""


# --------------------------------------------------------------------------- reading one value


def plain(node: Any) -> Any:
    """A plain Python value of a config node (DictConfig/ListConfig resolved, others as is)."""
    if OmegaConf.is_config(node):
        return OmegaConf.to_container(node, resolve=True)
    return node


def _frozen(mapping: Any, key: str) -> Mapping[str, Any]:
    """A read-only view of a mapping-valued key (None: empty)."""
    value = plain(mapping)
    if value is None:
        return MappingProxyType({})
    if not isinstance(value, Mapping):
        raise CellError(f"{key} must be a mapping, got {value!r}")
    return MappingProxyType(dict(value))


def _group(cfg: DictConfig, name: str) -> Any:
    """A config group's node (`system`, `model`, `server`, ...); CellError when it is absent."""
    node = cfg.get(name)
    if not isinstance(node, Mapping):
        raise CellError(f"{name} is missing from the cell config (or is not a mapping)")
    return node


def _get(node: Any, key: str, where: str, default: Any = ..., *, required: bool = False) -> Any:
    """`node.key`, or `default`; CellError naming `where.key` when it is required and absent."""
    value = node.get(key, None) if isinstance(node, Mapping | DictConfig) else None
    if value is None:
        if required:
            raise CellError(f"{where}{key} is missing from the cell config")
        return None if default is ... else default
    return value


def _int(value: Any, key: str, *, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool):
        raise CellError(f"{key} must be an integer, got {value!r}")
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise CellError(f"{key} must be an integer, got {value!r}") from None
    if not f.is_integer():
        raise CellError(f"{key} must be an integer, got {value!r}")
    return int(f)


def _float(value: Any, key: str, *, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise CellError(f"{key} must be a number, got {value!r}") from None


def _bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    raise CellError(f"{key} must be true or false, got {value!r}")


def _str(value: Any, key: str, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if value is None or isinstance(value, Mapping | list | tuple) or OmegaConf.is_config(value):
        raise CellError(f"{key} must be a string, got {value!r}")
    return str(value)


def rate_value(rate: Any) -> float | str:
    """`inf` (the string the YAML gives) or a positive number."""
    try:
        r = float(str(rate))
    except ValueError:
        raise CellError(f"rate must be > 0 or inf, got {rate!r}") from None
    if not r > 0:
        raise CellError(f"rate must be > 0 or inf, got {rate!r}")
    return "inf" if math.isinf(r) else r


# --------------------------------------------------------------------------- the parts


@dataclass(frozen=True)
class Identity:
    """The values that name the cell (its id and result file): top-level keys and group names."""

    system: str
    model: str
    tp: int
    workload: str
    lp: int
    batch: int
    k: int
    rep: int
    hot_fraction: float
    cold_page_size: int
    page_size: int
    m_sat: int | None
    rate: float | str  # "inf" or a positive number of requests/s
    tag: str | None
    share_depth: int | None

    @classmethod
    def from_config(cls, cfg: DictConfig) -> Identity:
        """The identity alone (the `${cell_id:}` resolver needs nothing more)."""
        return cls(
            system=_str(_get(_group(cfg, "system"), "name", "system.", required=True), "system.name"),
            model=_str(_get(_group(cfg, "model"), "name", "model.", required=True), "model.name"),
            tp=_int(_get(cfg, "tp", "", required=True), "tp"),
            workload=_str(_get(_group(cfg, "workload"), "kind", "workload.", required=True), "workload.kind"),
            lp=_int(_get(cfg, "lp", "", required=True), "lp"),
            batch=_int(_get(cfg, "batch", "", required=True), "batch"),
            k=_int(_get(cfg, "k", "", required=True), "k"),
            rep=_int(_get(cfg, "rep", "", 0), "rep"),
            hot_fraction=_float(_get(cfg, "hot_fraction", "", required=True), "hot_fraction"),
            cold_page_size=_int(_get(cfg, "cold_page_size", "", required=True), "cold_page_size"),
            page_size=_int(_get(cfg, "page_size", "", required=True), "page_size"),
            m_sat=_int(cfg.get("m_sat"), "m_sat", optional=True),
            rate=rate_value(_get(cfg, "rate", "", "inf")),
            tag=_str(cfg.get("tag"), "tag", optional=True),
            share_depth=_int(cfg.get("share_depth"), "share_depth", optional=True),
        )

    def to_dict(self) -> dict[str, Any]:
        """The identity as the result file's `config` records it (and `cell_id` reads it)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def cell_id(self) -> str:
        return cell_id(self.to_dict())


@dataclass(frozen=True)
class SystemSpec:
    """conf/system/<name>.yaml: the bundled engine (`kind: engine`) or an external server."""

    name: str
    kind: str                                  # engine | external
    engine_args: Mapping[str, Any]             # extra EngineConfig fields for this system only
    module: str | None = None                  # external: the package that must import (sglang)
    command: str | None = None                 # external: the launch command template
    extra_values: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))  # template placeholders
    health_path: str = "/health"
    server_info_path: str = "/server_info"

    @property
    def is_engine(self) -> bool:
        return self.kind == "engine"

    @classmethod
    def from_config(cls, node: Any) -> SystemSpec:
        kind = _str(_get(node, "kind", "system.", required=True), "system.kind")
        if kind not in SYSTEM_KINDS:
            raise CellError(f"system kind must be engine or external, got {kind!r}")
        spec = cls(
            name=_str(_get(node, "name", "system.", required=True), "system.name"),
            kind=kind,
            engine_args=_frozen(node.get("engine_args"), "system.engine_args"),
            module=_str(node.get("module"), "system.module", optional=True),
            command=_str(node.get("command"), "system.command", optional=True),
            extra_values=_frozen(node.get("extra_values"), "system.extra_values"),
            health_path=_str(_get(node, "health_path", "system.", "/health"), "system.health_path"),
            server_info_path=_str(_get(node, "server_info_path", "system.", "/server_info"),
                                  "system.server_info_path"),
        )
        if kind == "external" and (spec.module is None or spec.command is None):
            raise CellError(f"external system {spec.name} needs `module` and `command` (conf/system/{spec.name}.yaml)")
        return spec


@dataclass(frozen=True)
class ModelSpec:
    """conf/model/<name>.yaml, the keys the harness reads (the engine reads the whole file itself)."""

    name: str
    num_heads: int
    num_kv_heads: int
    vocab_size: int

    @property
    def group_size(self) -> int:
        """GQA group size g = query heads per KV head (the M_sat fit is per g)."""
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_config(cls, node: Any) -> ModelSpec:
        return cls(name=_str(_get(node, "name", "model.", required=True), "model.name"),
                   num_heads=_int(_get(node, "num_heads", "model.", required=True), "model.num_heads"),
                   num_kv_heads=_int(_get(node, "num_kv_heads", "model.", required=True), "model.num_kv_heads"),
                   vocab_size=_int(_get(node, "vocab_size", "model.", required=True), "model.vocab_size"))


@dataclass(frozen=True)
class Hardware:
    """conf/hardware/<name>.yaml, the keys a cell reads: the card it must run on, the device, the
    server's environment, the KV budget (or the card it emulates), the fitted dispatcher numbers."""

    name: str
    device: str = "cuda"
    gpu: str | None = None                     # the card's name as nvidia-smi prints it; None: any
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    kv_budget_gb: float | None = None
    emulate: Mapping[str, Any] | None = None   # {hbm_gib, static_fraction} of an emulated card
    m_sat: Any = None                          # a number or a mapping by GQA group size
    m_sat_by_g: Any = None
    prefix_pass_min_saved_mib: float | None = None  # kept as the file gives it (int or float)

    @classmethod
    def from_mapping(cls, hw: Mapping[str, Any], where: str = "hardware.") -> Hardware:
        """From a hardware file's mapping (the config's `hardware` group, plain)."""
        if hw.get("name") is None:
            raise CellError(f"{where}name is missing from the cell config")
        emulate = hw.get("emulate")
        if emulate is not None and not isinstance(emulate, Mapping):
            raise CellError(f"{where}emulate must be a mapping or null, got {emulate!r}")
        saved = hw.get("prefix_pass_min_saved_mib")
        if saved is not None and (isinstance(saved, bool) or not isinstance(saved, int | float)):
            raise CellError(f"{where}prefix_pass_min_saved_mib must be a number or null, got {saved!r}")
        return cls(
            name=str(hw["name"]), device=str(hw.get("device") or "cuda"),
            gpu=_str(hw.get("gpu"), f"{where}gpu", optional=True),
            env=MappingProxyType({str(k): str(v) for k, v in (hw.get("env") or {}).items()}),
            kv_budget_gb=_float(hw.get("kv_budget_gb"), f"{where}kv_budget_gb", optional=True),
            emulate=MappingProxyType(dict(emulate)) if emulate else None,
            m_sat=hw.get("m_sat"), m_sat_by_g=hw.get("m_sat_by_g"), prefix_pass_min_saved_mib=saved,
        )


@dataclass(frozen=True)
class Server:
    """The `server:` block: how the system is launched and watched (not part of the cell's id)."""

    module: str
    host: str
    port: int | None
    ready_timeout_s: float
    stop_grace_s: float
    busy_gpu_mib: int | None
    stall_timeout_s: float
    max_running: int | None
    max_context: int | None
    kernel_impl: str
    cuda_graphs: bool | None
    incremental_streaming_output: bool
    extra: Mapping[str, Any]                   # any other EngineConfig field

    @classmethod
    def from_config(cls, node: Any) -> Server:
        w = "server."

        def req(key: str) -> Any:
            return _get(node, key, w, required=True)

        cuda_graphs = node.get("cuda_graphs")
        return cls(
            module=_str(req("module"), w + "module"), host=_str(req("host"), w + "host"),
            port=_int(node.get("port"), w + "port", optional=True),
            ready_timeout_s=_float(req("ready_timeout_s"), w + "ready_timeout_s"),
            stop_grace_s=_float(req("stop_grace_s"), w + "stop_grace_s"),
            busy_gpu_mib=_int(node.get("busy_gpu_mib"), w + "busy_gpu_mib", optional=True),
            stall_timeout_s=_float(req("stall_timeout_s"), w + "stall_timeout_s"),
            max_running=_int(node.get("max_running") or None, w + "max_running", optional=True),
            max_context=_int(node.get("max_context") or None, w + "max_context", optional=True),
            kernel_impl=_str(req("kernel_impl"), w + "kernel_impl"),
            cuda_graphs=None if cuda_graphs is None else _bool(cuda_graphs, w + "cuda_graphs"),
            incremental_streaming_output=_bool(_get(node, "incremental_streaming_output", w, False),
                                               w + "incremental_streaming_output"),
            extra=_frozen(node.get("extra"), w + "extra"),
        )


@dataclass(frozen=True)
class ClientSettings:
    """The `client:` block: how the load generator talks to the server."""

    request_timeout_s: float
    send_prefix_hint: bool
    warmup_output_len: int
    progress: bool
    api: str                                   # generate | completions
    model: str | None                          # completions' "model" field; None: the server's

    @classmethod
    def from_config(cls, node: Any) -> ClientSettings:
        w = "client."
        return cls(
            request_timeout_s=_float(_get(node, "request_timeout_s", w, required=True), w + "request_timeout_s"),
            send_prefix_hint=_bool(_get(node, "send_prefix_hint", w, False), w + "send_prefix_hint"),
            warmup_output_len=_int(_get(node, "warmup_output_len", w, required=True), w + "warmup_output_len"),
            progress=_bool(_get(node, "progress", w, False), w + "progress"),
            api=_str(_get(node, "api", w, "generate"), w + "api"),
            model=_str(node.get("model"), w + "model", optional=True),
        )


@dataclass(frozen=True)
class Measure:
    """What the measured run does besides the load's shape: its size, the warm-up, the profiler."""

    num_prompts: int
    output_len: int
    warmup: int
    flush_cache: bool
    profile: bool                              # capture steady decode (harness.run.profile)
    stands_for: Mapping[str, Any] | None       # the paper cell a scaled-down cell stands in for
    overwrite: bool                            # replace an existing result file


@dataclass(frozen=True)
class Paths:
    """Where the cell's files go: results/<hardware>/<sweep>/<cell-id>.json, workloads/<name>.jsonl."""

    results_dir: Path
    workloads_dir: Path
    sweep: str


# --------------------------------------------------------------------------- the cell


@dataclass(frozen=True)
class Cell:
    """One cell, typed: every value a step of the cell reads (see the module docstring)."""

    identity: Identity
    system: SystemSpec
    model: ModelSpec
    hardware: Hardware
    workload: WorkloadConfig
    server: Server
    client: ClientSettings
    measure: Measure
    paths: Paths

    @classmethod
    def from_config(cls, cfg: DictConfig) -> Cell:
        """Parse the composed config; CellError names the key of a missing or ill-typed value."""
        identity = Identity.from_config(cfg)
        model = ModelSpec.from_config(_group(cfg, "model"))
        hw = plain(_group(cfg, "hardware"))
        stands_for = plain(cfg.get("stands_for"))
        if stands_for is not None and not isinstance(stands_for, Mapping):
            raise CellError(f"stands_for must be a mapping or null, got {stands_for!r}")
        measure = Measure(
            num_prompts=_int(_get(cfg, "num_prompts", "", required=True), "num_prompts"),
            output_len=_int(_get(cfg, "output_len", "", required=True), "output_len"),
            warmup=_int(_get(cfg, "warmup", "", 0), "warmup"),
            flush_cache=_bool(_get(cfg, "flush_cache", "", False), "flush_cache"),
            profile=_bool(_get(cfg, "profile", "", False), "profile"),
            stands_for=MappingProxyType(dict(stands_for)) if stands_for is not None else None,
            overwrite=_bool(_get(cfg, "overwrite", "", False), "overwrite"),
        )
        sweep = _group(cfg, "sweep")
        paths = Paths(results_dir=Path(_str(_get(cfg, "results_dir", "", required=True), "results_dir")),
                      workloads_dir=Path(_str(_get(cfg, "workloads_dir", "", required=True), "workloads_dir")),
                      sweep=_str(_get(sweep, "name", "sweep.", required=True), "sweep.name"))
        return cls(identity=identity, system=SystemSpec.from_config(_group(cfg, "system")), model=model,
                   hardware=Hardware.from_mapping(hw), workload=_workload(cfg, identity, measure, model),
                   server=Server.from_config(_group(cfg, "server")),
                   client=ClientSettings.from_config(_group(cfg, "client")), measure=measure, paths=paths)

    @property
    def cell_id(self) -> str:
        return self.identity.cell_id

    @property
    def result_path(self) -> Path:
        return self.paths.results_dir / self.hardware.name / self.paths.sweep / f"{self.cell_id}.json"

    @property
    def on_gpu(self) -> bool:
        """Whether the cell's server uses a GPU (an external system always may; the engine on a CPU
        hardware profile does not, even on a GPU host)."""
        return not self.system.is_engine or self.hardware.device != "cpu"


def _workload(cfg: DictConfig, identity: Identity, measure: Measure, model: ModelSpec) -> WorkloadConfig:
    """The WorkloadConfig of the cell: the workload group, with the top-level lp/k/n/output_len."""
    wl = plain(_group(cfg, "workload"))
    names = {f.name for f in fields(WorkloadConfig)}
    d = {k: v for k, v in wl.items() if k in names}
    d.update(lp=identity.lp, k=identity.k, num_requests=measure.num_prompts, output_len=measure.output_len)
    if d.get("vocab_size") is None:
        d["vocab_size"] = model.vocab_size  # ids must be valid for the model (tiny: 1024)
    try:
        if d.get("kind") == "hetero" and not d.get("lps"):
            return WorkloadConfig.for_kind("hetero", **{k: v for k, v in d.items() if k not in ("kind", "lps")})
        return WorkloadConfig.from_dict(d)
    except (TypeError, ValueError) as e:
        raise CellError(f"invalid workload: {e}") from e


def _cell_id_resolver(*, _root_: DictConfig) -> str:
    return Identity.from_config(_root_).cell_id


if not OmegaConf.has_resolver("cell_id"):
    OmegaConf.register_new_resolver("cell_id", _cell_id_resolver)
