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


# --------------------------------------------------------------------------- gpu (issue 3)
# GPU snapshots and telemetry/fan/power/thermal-guard events go here: they cross to the UI.


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
    repo_id: str
    commit_sha: str
    reason: str  # downloaded | deleted | verified | corrupt | trust


# --------------------------------------------------------------------------- engines (issue 5)
# TensorRT-LLM build progress, engine-cache and remote-fallback events go here.


# --------------------------------------------------------------------------- desktop (issue 6)
# Chat/conversation data crossing to the UI goes here.


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
