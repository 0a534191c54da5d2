"""Frozen event dataclasses: the only things that cross from the core to a UI.

Every event has a ``kind`` (its wire name) and a ``ts_s`` (Unix time). ``to_wire`` turns an
event into JSON-ready data for the control API's SSE stream; ``from_wire`` turns it back into
the same dataclass on the client side. Fields are plain values, tuples, mappings or other
frozen dataclasses, so nothing mutable ever reaches the GUI thread.
"""

from __future__ import annotations

import dataclasses
import enum
import time
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar, Union, get_args, get_origin, get_type_hints


class EngineState(enum.StrEnum):
    """Lifecycle of one engine process. Transitions: stopped → starting → ready → stopping →
    stopped; any state → failed; failed → starting on a (re)start."""

    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    FAILED = "failed"


def _now() -> float:
    return time.time()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Event:
    """Base of every event. Subclasses set ``kind`` as a class variable."""

    kind: ClassVar[str] = "event"
    ts_s: float = dataclasses.field(default_factory=_now)

    def to_wire(self) -> dict[str, Any]:
        data = to_plain(self)
        assert isinstance(data, dict)
        data["kind"] = self.kind
        return data


@dataclasses.dataclass(frozen=True, kw_only=True)
class Diagnosis:
    """A known failure recognised in an engine's log, with advice a person can act on."""

    code: str
    summary: str
    advice: str
    severity: str = "error"  # "error" (the engine will not run) | "warning" | "info" (benign)
    line: str = ""
    suggested: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class EngineStatus:
    """A snapshot of one managed engine, for the control API."""

    engine_id: str
    engine: str
    state: EngineState
    served_names: tuple[str, ...]
    port: int | None
    pid: int | None
    restarts: int
    detail: str
    diagnosis: Diagnosis | None
    started_at_s: float | None
    ready_at_s: float | None
    profile: str
    device: str
    version: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineStateChanged(Event):
    kind: ClassVar[str] = "engine.state"
    engine_id: str
    state: EngineState
    previous: EngineState
    engine: str = ""
    served_names: tuple[str, ...] = ()
    port: int | None = None
    pid: int | None = None
    detail: str = ""
    restarts: int = 0
    diagnosis: Diagnosis | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineLogLine(Event):
    kind: ClassVar[str] = "engine.log"
    engine_id: str
    line: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineDiagnosed(Event):
    kind: ClassVar[str] = "engine.diagnosis"
    engine_id: str
    diagnosis: Diagnosis


@dataclasses.dataclass(frozen=True, kw_only=True)
class Notice(Event):
    """Something a person should see (a tray notification, a banner in the dashboard)."""

    kind: ClassVar[str] = "notice"
    level: str  # "info" | "warning" | "error"
    title: str
    message: str
    source: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class DaemonStopping(Event):
    kind: ClassVar[str] = "daemon.stopping"
    reason: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvInstallProgress(Event):
    """Progress of `traylm engines install` run by the daemon (phase: create, install, fix,
    probe, done, failed)."""

    kind: ClassVar[str] = "env.install"
    engine: str
    device: str
    phase: str
    line: str
    elapsed_s: float = 0.0


# --------------------------------------------------------------------------- gpu (issue 3)
# GPU snapshots and telemetry/fan/power/thermal-guard events go here: they cross to the UI.
# Units are in the field names (mW, mJ, °C as _c, %). ``simulated`` is True wherever the numbers
# come from the simulator or a replayed trace rather than live hardware: a UI must say so.


class GPUState(enum.StrEnum):
    """Telemetry state: of the backend as a whole, or of one GPU."""

    OK = "ok"
    UNAVAILABLE = "unavailable"  # no driver / library / NVIDIA GPU: retried with backoff
    LOST = "lost"  # the GPU fell off the bus: needs a reboot; traylm stops controlling it


class GuardLevel(enum.IntEnum):
    """Thermal guard escalation, in the order its actions are taken."""

    NORMAL = 0
    NOTICE = 1
    POWER = 2
    PAUSE = 3
    STOP = 4


@dataclasses.dataclass(frozen=True, kw_only=True)
class FanReading:
    """One fan controller. Speeds are NVML's intended speed in % (may exceed 100)."""

    index: int
    speed_pct: int | None = None
    target_pct: int | None = None
    manual: bool | None = None  # True: a program set a speed; False: firmware (automatic)
    min_pct: int | None = None
    max_pct: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPUProcess:
    pid: int
    used_memory_bytes: int | None = None
    name: str = ""
    engine_id: str | None = None  # set when the pid belongs to a traylm engine


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPUInfo:
    """What does not change while the driver is loaded. ``index`` is NVML's (not CUDA's)."""

    uuid: str
    index: int
    name: str
    simulated: bool = False
    pci_bus_id: str = ""
    driver_version: str = ""
    cuda_version: str = ""
    memory_total_bytes: int | None = None
    slowdown_temperature_c: int | None = None
    shutdown_temperature_c: int | None = None
    power_default_mw: int | None = None
    power_min_mw: int | None = None
    power_max_mw: int | None = None
    fan_count: int = 0
    fan_min_pct: int | None = None
    fan_max_pct: int | None = None
    pcie_generation_max: int | None = None
    pcie_width_max: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPUSnapshot:
    """One reading of one GPU. Each field NVML cannot give on this card is None."""

    uuid: str
    index: int
    ts_s: float
    state: GPUState = GPUState.OK
    simulated: bool = False
    temperature_c: int | None = None
    temperature_margin_c: int | None = None  # degrees left before thermal slowdown
    power_draw_mw: int | None = None
    power_limit_mw: int | None = None  # the enforced limit
    energy_mj: int | None = None  # total since the driver loaded
    fans: tuple[FanReading, ...] = ()
    sm_clock_mhz: int | None = None
    memory_clock_mhz: int | None = None
    utilization_gpu_pct: int | None = None
    utilization_memory_pct: int | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    memory_total_bytes: int | None = None
    clock_event_reasons: tuple[str, ...] = ()
    pcie_generation: int | None = None
    pcie_width: int | None = None
    pcie_tx_kbps: int | None = None  # slow path (processes interval)
    pcie_rx_kbps: int | None = None
    persistence_mode: bool | None = None
    processes: tuple[GPUProcess, ...] | None = None  # None: not read yet (slow path)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FanCurve:
    """Temperature (°C) → fan duty (%) points, linear in between. Below the first point the
    fans go back to the firmware; above the last point they stay at its duty."""

    points: tuple[tuple[float, float], ...]
    hysteresis_c: float = 2.0
    min_step_pct: float = 0.0
    spin_down_delay_s: float = 0.0
    name: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class PowerPreset:
    name: str
    description: str = ""
    watts: float | None = None  # None: the card's default (stock) limit


@dataclasses.dataclass(frozen=True, kw_only=True)
class FanControl:
    """What traylm-gpud does with one fan."""

    uuid: str
    fan: int
    mode: str  # "auto" (firmware), "curve" (traylm-gpud), "foreign" (another program's manual)
    curve: FanCurve | None = None
    duty_pct: int | None = None
    persist: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class PowerControl:
    uuid: str
    limit_mw: int
    source: str = "user"  # "user" | "guard"
    persist: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class HelperStatus:
    """Whether traylm-gpud answers; without it traylm is read-only (and says how to fix it)."""

    available: bool
    socket_path: str = ""
    detail: str = ""
    install_hint: str = ""
    version: str = ""
    backend: str = ""
    simulated: bool = False
    fans: tuple[FanControl, ...] = ()
    power: tuple[PowerControl, ...] = ()
    warnings: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineEnergy:
    """Energy per generated token of one engine over its last window (≥ 5 s)."""

    engine_id: str
    gpus: tuple[str, ...]  # UUIDs summed
    window_s: float
    energy_j: float
    tokens: int
    power_w: float
    joules_per_token: float | None  # None while no token was generated in the window
    cost_per_mtok: float | None  # at energy.electricity_price_per_kwh
    currency: str = ""
    simulated: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class PSUStatus:
    psu_watts: float
    gpu_power_w: float
    other_watts: float
    load_fraction: float  # (GPU draw + other) / PSU rating
    limits_w: float  # worst case: sum of the enforced GPU power limits
    warning: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPUEntry:
    info: GPUInfo
    snapshot: GPUSnapshot | None = None
    guard_level: GuardLevel = GuardLevel.NORMAL


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPUOverview:
    """GET /api/gpus: everything the dashboard's GPU page shows."""

    backend: str  # "nvml" | "simulated" | "replay"
    simulated: bool
    state: GPUState
    message: str = ""
    gpus: tuple[GPUEntry, ...] = ()
    helper: HelperStatus = dataclasses.field(default_factory=lambda: HelperStatus(available=False))
    energy: tuple[EngineEnergy, ...] = ()
    psu: PSUStatus | None = None
    sample_interval_s: float = 1.0
    paused: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPUHistory:
    """Columns of one GPU's telemetry (oldest first), for charts."""

    uuid: str
    index: int
    simulated: bool
    resolution_s: float
    ts_s: tuple[float, ...] = ()
    temperature_c: tuple[float | None, ...] = ()
    power_draw_w: tuple[float | None, ...] = ()
    power_limit_w: tuple[float | None, ...] = ()
    utilization_gpu_pct: tuple[float | None, ...] = ()
    fan_speed_pct: tuple[float | None, ...] = ()
    memory_used_bytes: tuple[float | None, ...] = ()
    sm_clock_mhz: tuple[float | None, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class FanCurveResult:
    """Answer to a fan-curve PUT (also with dry_run: validated, not applied)."""

    uuid: str
    fans: tuple[int, ...]
    curve: FanCurve
    applied: bool
    persist: bool
    preview: tuple[tuple[float, float], ...]  # (°C, % the fans would run at)
    warnings: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPUFanStatus:
    """GET /api/gpus/{gpu}/fans: what each fan reads and who controls it."""

    uuid: str
    index: int
    name: str
    readings: tuple[FanReading, ...]
    controls: tuple[FanControl, ...]  # empty without traylm-gpud
    min_pct: int | None = None
    max_pct: int | None = None
    helper_available: bool = False
    simulated: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPUPresets:
    fans: Mapping[str, FanCurve]
    power: Mapping[str, PowerPreset]


@dataclasses.dataclass(frozen=True, kw_only=True)
class PowerLimitStatus:
    uuid: str
    index: int
    name: str
    enforced_mw: int | None
    default_mw: int | None
    min_mw: int | None
    max_mw: int | None
    requested_mw: int | None = None
    applied: bool = False
    persist: bool = False
    controlled_by: str = ""  # "" | "user" | "guard"
    simulated: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class GuardGPU:
    uuid: str
    index: int
    level: GuardLevel
    temperature_c: int | None
    slowdown_c: int
    since_s: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPUGuardAction(Event):
    """The thermal guard acted (or tried to): shown in the dashboard and as a notification."""

    kind: ClassVar[str] = "gpu.guard"
    uuid: str
    gpu_index: int
    level: GuardLevel
    action: str  # "notice" | "lower_power" | "pause" | "stop_engine" | "stand_down" (cooled down)
    detail: str
    temperature_c: int | None = None
    threshold_c: float | None = None
    ok: bool = True
    simulated: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class GuardStatus:
    enabled: bool
    thresholds: Mapping[str, float]  # the gpu.guard_* settings
    gpus: tuple[GuardGPU, ...] = ()
    actions: tuple[GPUGuardAction, ...] = ()  # most recent last
    problem: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPUSampled(Event):
    """One sample of every GPU (one event per sample, all GPUs in it)."""

    kind: ClassVar[str] = "gpu.sample"
    backend: str
    simulated: bool
    gpus: tuple[GPUSnapshot, ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPUStateChanged(Event):
    kind: ClassVar[str] = "gpu.state"
    state: GPUState
    backend: str
    message: str
    uuid: str = ""  # empty: the backend as a whole
    simulated: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPUControlChanged(Event):
    """A fan curve or power limit was applied or handed back."""

    kind: ClassVar[str] = "gpu.control"
    uuid: str
    what: str  # "fan_curve" | "fans_auto" | "power_limit" | "power_reset"
    detail: str
    simulated: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPUHelperChanged(Event):
    kind: ClassVar[str] = "gpu.helper"
    status: HelperStatus


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPUEnergyUpdated(Event):
    kind: ClassVar[str] = "gpu.energy"
    energy: EngineEnergy
    psu: PSUStatus | None = None


# --------------------------------------------------------------------------- hub (issue 4)
# Search results, fit verdicts, download progress and library events go here.


@dataclasses.dataclass(frozen=True)
class ModelSummary:
    """One search hit. ``weights_bytes`` is estimated from the Hub's safetensors parameter
    counts (None when the Hub does not know them)."""

    repo_id: str
    author: str
    downloads: int
    likes: int
    last_modified: str  # ISO 8601 from the Hub, "" when unknown
    gated: str  # "" (open), "auto" or "manual"
    quantization: str | None  # awq, gptq, fp8, compressed-tensors, bitsandbytes, ...
    parameters: int | None
    weights_bytes: int | None
    tags: tuple[str, ...] = ()
    pipeline_tag: str = ""


@dataclasses.dataclass(frozen=True)
class ModelFile:
    path: str
    size_bytes: int
    kind: str  # weights | config | tokenizer | chat_template | code
    sha256: str | None  # LFS files (the weights); None for small git files
    git_sha1: str


@dataclasses.dataclass(frozen=True)
class ModelDetails:
    """What the Hub says about a model, read from metadata and config.json only (no weights)."""

    repo_id: str
    revision: str  # as asked ("main" by default)
    commit_sha: str
    architecture: str
    model_type: str
    parameters: int | None
    parameters_by_dtype: Mapping[str, int]
    num_layers: int | None
    hidden_size: int | None
    intermediate_size: int | None
    num_attention_heads: int | None
    num_kv_heads: int | None
    head_dim: int | None
    kv_latent_dim: int | None  # MLA models (DeepSeek): kv_lora_rank + qk_rope_head_dim
    vocab_size: int | None
    max_context: int | None
    dtype: str
    quantization: str | None
    quantization_config: Mapping[str, str]
    license: str
    gated: str
    private: bool
    needs_remote_code: bool  # config.json has auto_map: the engine must run the repo's code
    files: tuple[ModelFile, ...]
    skipped_files: tuple[str, ...]  # "path (why)"
    download_bytes: int  # total size of ``files``
    weights_bytes: int  # safetensors part of download_bytes
    tie_word_embeddings: bool = False


@dataclasses.dataclass(frozen=True)
class GPUSpec:
    name: str
    memory_bytes: int
    compute_capability: str  # "8.9" for Ada (RTX 4090)


@dataclasses.dataclass(frozen=True)
class FitFix:
    """One change that would make a model fit, with the verdict it would give."""

    change: str  # tp2 | fp8_kv | fp8_variant | awq_variant | shorter_context
    description: str
    verdict: str
    context_len: int | None = None


@dataclasses.dataclass(frozen=True)
class FitResult:
    """Memory estimate for one engine on one GPU set. Verdicts: ``fits`` (``concurrency``
    sequences of the full context fit), ``tight`` (the engine starts, but fewer sequences fit, or
    there is little room to spare), ``wont_fit`` (weights or one full-length sequence do not)."""

    engine: str
    gpus: tuple[GPUSpec, ...]
    tensor_parallel: int
    quantization: str | None
    kv_cache_dtype: str
    context_len: int
    concurrency: int
    budget_bytes_per_gpu: int
    weights_bytes_per_gpu: int
    overhead_bytes_per_gpu: int
    kv_budget_bytes_per_gpu: int
    kv_bytes_per_token: int  # whole model (all layers, all GPUs together)
    kv_tokens: int
    sequences_fit: int
    verdict: str  # fits | tight | wont_fit
    reason: str
    supported: bool  # the engine supports this quantization on these GPUs
    fixes: tuple[FitFix, ...] = ()
    notes: tuple[str, ...] = ()


class DownloadState(enum.StrEnum):
    """queued → downloading → verifying → ready; paused, retrying (waiting to try again), failed
    and cancelled. Only ``ready`` means every file is present and its hash matches the Hub's."""

    QUEUED = "queued"
    DOWNLOADING = "downloading"
    VERIFYING = "verifying"
    RETRYING = "retrying"
    PAUSED = "paused"
    READY = "ready"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclasses.dataclass(frozen=True)
class DownloadStatus:
    id: str
    repo_id: str
    revision: str
    commit_sha: str
    state: DownloadState
    files_total: int
    files_done: int
    total_bytes: int  # bytes of the selected files
    done_bytes: int  # bytes present (finished files + the current file's progress)
    rate_bytes_per_s: float
    eta_s: float | None
    current_file: str
    attempts: int
    error_code: str  # "" or gated | not_found | disk_full | network | server | integrity | ...
    message: str  # what happened and what to do (failed, retrying, paused)
    created_s: float
    updated_s: float
    worker_pid: int | None
    resume_note: str  # what pause/resume keeps, measured for the installed huggingface_hub
    snapshot_path: str = ""


@dataclasses.dataclass(frozen=True)
class LocalModel:
    """One revision of a model in the shared Hugging Face cache."""

    repo_id: str
    commit_sha: str
    refs: tuple[str, ...]
    size_bytes: int
    files: int
    snapshot_path: str
    verified: str  # verified | unverified | corrupt | incomplete
    verified_at_s: float | None
    problems: tuple[str, ...]
    profiles: tuple[str, ...]  # profiles whose model is this repo
    engines: tuple[str, ...]  # engines that can serve it (architecture and quantization)
    served_by: tuple[str, ...]  # running engine ids using it now
    trust_remote_code: bool  # the user consented to run this repo's code
    needs_remote_code: bool
    last_modified_s: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class DownloadStateChanged(Event):
    kind: ClassVar[str] = "download.state"
    status: DownloadStatus
    previous: DownloadState


@dataclasses.dataclass(frozen=True, kw_only=True)
class DownloadProgress(Event):
    """Sent at most a few times per second per download."""

    kind: ClassVar[str] = "download.progress"
    download_id: str
    repo_id: str
    done_bytes: int
    total_bytes: int
    rate_bytes_per_s: float
    eta_s: float | None
    current_file: str
    files_done: int
    files_total: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class LibraryChanged(Event):
    kind: ClassVar[str] = "library.changed"
    repo_id: str  # the repo, or the name of a model folder
    commit_sha: str
    reason: str  # downloaded | deleted | verified | corrupt | trust | added | removed


@dataclasses.dataclass(frozen=True)
class LocalFolder:
    """A model folder on this computer registered in the library: servable by ``name``."""

    name: str
    path: str
    served_name: str
    engine: str  # the engine a start uses
    engines: tuple[str, ...]  # engines that can serve its architecture
    family: str  # config.json's model_type (llama, qwen2, ...)
    architecture: str
    size_bytes: int  # weights
    added_s: float
    problems: tuple[str, ...]  # why it cannot be served now (deleted, shards missing); () = ok


# --------------------------------------------------------------------------- engines (issue 5)
# TensorRT-LLM build progress, engine-cache and remote-fallback events go here.


@dataclasses.dataclass(frozen=True, kw_only=True)
class TRTBuildProgress(Event):
    """A TensorRT engine build for a starting engine: one per step change and about once a
    second while a step runs. ``eta_s`` comes from past builds of similar size (None before the
    first one)."""

    kind: ClassVar[str] = "trt.build"
    engine_id: str
    cache_id: str
    state: str  # "running" | "done" | "failed" | "cancelled"
    step: str  # "quantize" | "convert" | "build" | ""
    step_index: int  # 1-based
    steps_total: int
    elapsed_s: float
    eta_s: float | None = None
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class TRTCacheEntry:
    """One built TensorRT engine in the cache, for `traylm engines cache ls` and the UI."""

    id: str
    model: str
    quant_recipe: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    arguments: Mapping[str, str]
    environment: Mapping[str, str]
    """tensorrt_llm and tensorrt versions, GPU name, compute capability, driver/CUDA major."""
    size_bytes: int
    created_s: float
    last_used_s: float
    build_s: float
    path: str
    in_use_by: tuple[str, ...] = ()
    compatible: bool = True
    problem: str = ""
    """Why this engine cannot run here (another TensorRT-LLM version, another GPU)."""


@dataclasses.dataclass(frozen=True)
class RemoteStatus:
    """The optional remote OpenAI-compatible fallback, for the tray and /api/status."""

    enabled: bool
    base_url: str
    aliases: tuple[str, ...]
    key_source: str  # "keyring" | "env" | "none"
    ready: bool
    detail: str
    routed_requests: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class RemoteRouted(Event):
    """A request went to the remote API instead of a local engine."""

    kind: ClassVar[str] = "remote.routed"
    model: str
    why: str  # "not_served" | an engine state | "queue_full"


# --------------------------------------------------------------------------- desktop (issue 6)
# Chat/conversation data crossing to the UI goes here.

CHAT_ROLES = ("system", "user", "assistant")


@dataclasses.dataclass(frozen=True)
class ChatSummary:
    """One stored conversation of the chat window, without its messages."""

    chat_id: int
    title: str
    model: str
    system_prompt: str
    params: Mapping[str, float]  # temperature, top_p, max_tokens
    created_s: float
    updated_s: float
    message_count: int


@dataclasses.dataclass(frozen=True)
class ChatMessage:
    """One message of a conversation. ``stats`` holds per-reply figures (ttft_s, tokens_per_s,
    completion_tokens); ``finish_reason`` is stop, length, stopped (by the user) or error."""

    message_id: int
    chat_id: int
    position: int
    role: str
    content: str
    model: str
    stats: Mapping[str, float]
    finish_reason: str
    created_s: float


@dataclasses.dataclass(frozen=True)
class ChatTranscript:
    chat: ChatSummary
    messages: tuple[ChatMessage, ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChatChanged(Event):
    """A conversation was created, renamed, given messages, or deleted (any client did it)."""

    kind: ClassVar[str] = "chat.changed"
    chat_id: int
    change: str  # created | updated | messages | deleted


# --------------------------------------------------------------------------- bench
# Benchmark configs, results and progress (engines/bench/, `traylm bench`, /api/bench). Times are
# seconds in the data (milliseconds only where they are printed). Latency definitions follow
# `vllm bench serve` (engines/bench/metrics.py): TTFT = first content chunk − request start;
# E2EL = last content chunk − start; TPOT per request = (E2EL − TTFT) / (output tokens − 1), only
# when output tokens > 1; ITL = every gap between consecutive content chunks, pooled. NVIDIA's
# AIPerf calls vLLM's TPOT "ITL": a UI must say which one it shows (BenchRun.definitions).


class BenchState(enum.StrEnum):
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"  # the daemon stopped while the run was going


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """What to run. One run measures each concurrency level in turn, with the same workload."""

    model: str
    url: str = ""  # OpenAI base URL of an engine (http://127.0.0.1:PORT/v1); "": the gateway
    workload: str = "random"  # "random" (fixed lengths, ignore_eos) | "chat" (varied prompts)
    input_len: int = 128  # prompt tokens per request (random)
    output_len: int = 128  # generated tokens per request (random); the max_tokens cap (chat)
    concurrency: tuple[int, ...] = (1,)  # most requests in flight, one level after the other
    requests: int = 0  # measured requests per level; 0: max(32, 4 × concurrency)
    warmup: int = 1  # requests sent before each level and left out of its figures
    rate_rps: float = 0.0  # Poisson arrivals at this mean rate; 0: all at once
    seed: int = 0
    name: str = ""
    request_timeout_s: float = 600.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class LatencyStats:
    """One latency list, in seconds. Percentiles use linear interpolation on the raw values
    (numpy's default); keys are the percentile as text ("50", "99", "99.9")."""

    count: int = 0
    mean_s: float | None = None
    std_s: float | None = None
    min_s: float | None = None
    max_s: float | None = None
    percentiles_s: Mapping[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchRequest:
    """One measured request (for charts). ``start_s`` is from the level's start."""

    start_s: float
    ttft_s: float | None = None
    e2el_s: float | None = None
    tpot_s: float | None = None
    input_tokens: int | None = None
    output_tokens: int = 0
    error: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPUBenchTelemetry:
    """One GPU over one level's measured window."""

    uuid: str
    index: int
    name: str = ""
    temperature_peak_c: float | None = None
    temperature_mean_c: float | None = None
    power_mean_w: float | None = None
    energy_j: float | None = None  # Δ NVML total-energy counter over the window
    memory_used_peak_bytes: int | None = None
    memory_used_mean_bytes: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchTelemetry:
    """GPU telemetry over one level's measured window, all GPUs the daemon sees summed (power,
    energy, memory) or at their worst (peak temperature). ``simulated``: numbers from
    `traylm serve --simulate-gpus N` or a replayed trace, not from hardware."""

    available: bool
    simulated: bool = False
    backend: str = ""
    detail: str = ""  # why there is none, or how a figure was obtained
    samples: int = 0
    window_s: float = 0.0
    temperature_peak_c: float | None = None
    temperature_mean_c: float | None = None  # mean over samples of the hottest GPU
    power_mean_w: float | None = None  # energy / window when the counter works
    energy_j: float | None = None
    joules_per_token: float | None = None  # energy_j / output tokens of the level
    energy_source: str = ""  # "counter" (NVML total energy) | "power" (readings × time) | ""
    memory_used_peak_bytes: int | None = None
    gpus: tuple[GPUBenchTelemetry, ...] = ()
    ts_s: tuple[float, ...] = ()  # timeline: seconds from the level's start
    temperature_c: tuple[float | None, ...] = ()  # hottest GPU per sample
    power_w: tuple[float | None, ...] = ()  # summed per sample


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchLevel:
    """The figures of one concurrency level (warm-up excluded)."""

    concurrency: int
    rate_rps: float
    requests: int  # asked
    completed: int
    failed: int
    duration_s: float  # first measured request sent → last one finished
    input_tokens: int
    output_tokens: int
    input_tokens_source: str  # "usage" (the engine said) | "tokenize" | "approx" | "mixed"
    output_tokens_source: str  # "usage" | "chunks" (content chunks counted) | "mixed"
    request_throughput_rps: float
    output_throughput_tps: float
    total_throughput_tps: float  # (input + output tokens) / duration
    max_concurrency_seen: int
    ttft: LatencyStats
    tpot: LatencyStats
    itl: LatencyStats
    e2el: LatencyStats
    telemetry: BenchTelemetry
    errors: Mapping[str, int] = dataclasses.field(default_factory=dict)  # message → count
    requests_detail: tuple[BenchRequest, ...] = ()
    cancelled: bool = False  # cut short by a cancel: figures cover the finished requests


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchRun:
    """One stored benchmark run (GET /api/bench/runs/{id})."""

    id: int
    name: str
    created_s: float
    state: BenchState
    config: BenchConfig
    finished_s: float | None = None
    target: str = ""  # the OpenAI base URL the requests went to
    engine: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """engine_id, engine, version, device, profile of the engine serving the model, if known."""
    prompt_source: str = ""  # "tokenize" (exact lengths from the engine) | "approx" | "chat"
    definitions: str = ""  # which TTFT/TPOT/ITL definitions the figures use
    detail: str = ""  # the error of a failed run, or notes
    levels: tuple[BenchLevel, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchRunSummary:
    """A row of GET /api/bench/runs (newest first)."""

    id: int
    name: str
    created_s: float
    state: BenchState
    model: str
    workload: str
    input_len: int
    output_len: int
    concurrency: tuple[int, ...]
    target: str = ""
    engine: str = ""  # "vllm 0.32.0 (cpu)"
    finished_s: float | None = None
    best_output_throughput_tps: float | None = None
    best_concurrency: int | None = None
    joules_per_token: float | None = None  # at best_concurrency
    simulated: bool = False
    detail: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchProgress(Event):
    """A running benchmark: at each phase change and about twice a second while measuring."""

    kind: ClassVar[str] = "bench.progress"
    run_id: int
    phase: str  # "prepare" | "warmup" | "measure" | "telemetry"
    level_index: int  # 0-based
    levels_total: int
    concurrency: int
    completed: int = 0
    failed: int = 0
    total: int = 0
    elapsed_s: float = 0.0
    output_throughput_tps: float = 0.0  # so far in this level
    detail: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchFinished(Event):
    """A benchmark ended (done, failed, cancelled or interrupted); it is stored."""

    kind: ClassVar[str] = "bench.finished"
    summary: BenchRunSummary


# --------------------------------------------------------------------------- wire registry


def _all_event_types() -> dict[str, type[Event]]:
    found: dict[str, type[Event]] = {}
    pending: list[type[Event]] = [Event]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls is not Event:
            found[cls.kind] = cls
    return found


EVENT_TYPES: dict[str, type[Event]] = _all_event_types()
"""Every Event subclass defined above, by wire name (computed once, at import)."""


def from_wire(data: Mapping[str, Any]) -> Event:
    """Rebuild an event from its wire form. Unknown kinds raise KeyError; extra keys are ignored
    so that an older client can read a newer daemon's events."""
    cls = EVENT_TYPES[str(data["kind"])]
    return from_plain(cls, data)


def to_plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [to_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    return value


T = TypeVar("T")


def from_plain(cls: type[T], data: Mapping[str, Any]) -> T:
    """Rebuild any frozen dataclass of this module (or nested ones) from JSON data."""
    hints = get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in data:
            kwargs[f.name] = _convert(hints[f.name], data[f.name])
    return cls(**kwargs)


def _convert(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        for arg in get_args(tp):
            if arg is type(None):
                continue
            return _convert(arg, value)
        return value
    if origin is tuple:
        args = get_args(tp)
        item = args[0] if args else Any
        return tuple(_convert(item, v) for v in value)
    if origin in (Mapping, dict, typing.Mapping):
        args = get_args(tp)
        vt = args[1] if len(args) == 2 else Any
        return {k: _convert(vt, v) for k, v in value.items()}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(value)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return from_plain(tp, value)
    if tp is float and isinstance(value, int):
        return float(value)
    return value
