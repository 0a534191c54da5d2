"""Hugging Face Hub data (engines/hub/): search results, model details, fit verdicts, download
progress and library events."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import ClassVar

from engines.events.codec import Event
from engines.events.gpu import GPUInfo
from engines.events.models import Placement


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
    gpus: tuple[GPUInfo, ...]
    """The GPUs the estimate is for (the machine's, or RTX 4090s when it has none)."""
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
    placement: Placement | None = None
    """Where it would load now (the GPUs, what would be unloaded first, or why there is no
    room): the same planner as a load. None when the machine has no GPUs."""


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


@dataclasses.dataclass(frozen=True)
class HFTokenStatus:
    """Which Hugging Face token the daemon finds (never the token itself): GET, PUT and
    DELETE /api/hub/token."""

    source: str
    """"env" (a variable of the daemon's environment, which takes precedence), "file" (the
    login file ``hf auth login`` writes, and traylm's Save token), or "" (none)."""
    env_var: str
    """The variable that holds it, when ``source`` is "env"."""
    path: str
    """The login file, where a saved token is (or would be) kept, readable only by you."""
    sent: bool
    """Sent to the configured endpoint (False when none, or withheld from an untrusted one)."""
    withheld_reason: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class LibraryChanged(Event):
    kind: ClassVar[str] = "library.changed"
    repo_id: str  # the repo, or the name of a model folder
    commit_sha: str
    reason: str  # downloaded | deleted | verified | corrupt | trust | added | changed | removed


FOLDER_SETTINGS = ("tool_parser", "reasoning_parser")
"""What a registered model folder keeps as settings of its own (`traylm models set`)."""


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
    tool_parser: str = ""  # vLLM's --tool-call-parser for it ("" = tool calling off)
    reasoning_parser: str = ""  # vLLM's --reasoning-parser for it ("" = off)
