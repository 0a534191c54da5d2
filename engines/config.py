"""Settings and engine profiles (TOML), and every path traylm uses (platformdirs).

Each setting has one home here: one default and one doc line (``doc(field)``) that the UI shows
as its tooltip. Loading validates everything and raises ``ConfigError`` listing each problem with
the field, the value, and what would be valid. Files are written temp-then-rename.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import os
import re
import tempfile
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, get_args, get_origin, get_type_hints

import platformdirs
import tomli_w

from engines.errors import ConfigError, ProfileNotFound

APP_NAME = "traylm"
ENGINES = ("vllm", "trtllm", "sglang")
"""Engine names a profile may use (the adapter registry has one adapter per name)."""


# --------------------------------------------------------------------------- paths


@dataclass(frozen=True)
class Paths:
    """Where traylm keeps its files. ``TRAYLM_HOME`` puts everything under one folder (tests,
    portable installs); ``TRAYLM_ENVS_DIR`` moves only the engine venvs (CI caches them)."""

    config_dir: Path
    data_dir: Path
    state_dir: Path
    cache_dir: Path
    envs_override: Path | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Paths:
        env = os.environ if environ is None else environ
        envs = Path(env["TRAYLM_ENVS_DIR"]).expanduser() if env.get("TRAYLM_ENVS_DIR") else None
        home = env.get("TRAYLM_HOME")
        if home:
            root = Path(home).expanduser()
            return cls(root / "config", root / "data", root / "state", root / "cache", envs)
        return cls(
            Path(platformdirs.user_config_dir(APP_NAME)),
            Path(platformdirs.user_data_dir(APP_NAME)),
            Path(platformdirs.user_state_dir(APP_NAME)),
            Path(platformdirs.user_cache_dir(APP_NAME)),
            envs,
        )

    @property
    def config_file(self) -> Path:
        return self.config_dir / "config.toml"

    @property
    def profiles_dir(self) -> Path:
        return self.config_dir / "profiles"

    @property
    def local_models_dir(self) -> Path:
        """Model folders registered in the library (``traylm models add``), one TOML each."""
        return self.config_dir / "models"

    @property
    def envs_dir(self) -> Path:
        return self.envs_override or self.data_dir / "envs"

    @property
    def engine_cache_dir(self) -> Path:
        """Caches engines rebuild when lost (compiled graphs, per env and model)."""
        return self.cache_dir / "engines"

    @property
    def trt_engines_dir(self) -> Path:
        return self.data_dir / "trt-engines"

    @property
    def db_path(self) -> Path:
        return self.data_dir / "traylm.db"

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def daemon_json(self) -> Path:
        return self.state_dir / "daemon.json"

    @property
    def daemon_lock(self) -> Path:
        return self.state_dir / "daemon.lock"

    @property
    def engine_pids_json(self) -> Path:
        return self.state_dir / "engine-pids.json"


def resources_dir() -> Path:
    """The shipped resources/ folder (presets, flag allow-lists, icons)."""
    import resources

    return Path(resources.__file__).parent


# --------------------------------------------------------------------------- field metadata


def setting(
    default: Any,
    doc: str,
    *,
    min: float | None = None,
    max: float | None = None,
    choices: Iterable[str] | None = None,
    label: str = "",
    suggestions: Iterable[str] = (),
) -> Any:
    """A dataclass field with its doc line and validation bounds. ``label``: the name a form
    shows instead of the field's; ``suggestions``: common values a form offers (not a limit)."""
    meta = {
        "doc": doc,
        "min": min,
        "max": max,
        "choices": tuple(choices) if choices else None,
        "label": label,
        "suggestions": tuple(suggestions),
    }
    if isinstance(default, list | dict):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return field(default=default, metadata=meta)


def doc(cls: type[Any], name: str) -> str:
    """The one-line documentation of a settings or profile field (the UI's tooltip)."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            return str(f.metadata.get("doc", ""))
    raise KeyError(name)


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class GatewaySettings:
    host: str = setting(
        "127.0.0.1", "Address the gateway binds. Loopback unless LAN sharing is on."
    )
    port: int = setting(8000, "Port of the OpenAI-compatible endpoint.", min=1, max=65535)
    lan_sharing: bool = setting(
        False, "Serve on all interfaces (0.0.0.0). Refused unless at least one API key is set."
    )
    api_key_sha256: tuple[str, ...] = setting(
        (), "SHA-256 digests of accepted API keys (add keys with `traylm keys add`)."
    )
    allowed_hosts: tuple[str, ...] = setting(
        (),
        "Extra Host names accepted besides localhost, 127.0.0.1 and [::1] (DNS rebinding guard).",
    )
    allowed_origins: tuple[str, ...] = setting(
        (), "Exact browser Origins allowed to call the API (e.g. http://localhost:3000). No '*'."
    )
    max_concurrent: int = setting(
        256, "Requests forwarded to one engine at once; more wait in the queue.", min=1, max=100000
    )
    max_queue: int = setting(
        1024, "Requests waiting for one engine; past this the gateway answers 429.", min=0
    )
    queue_timeout_s: float = setting(
        30.0, "Longest a request waits in the queue before 429.", min=0.1, max=3600
    )
    max_body_bytes: int = setting(
        8 * 1024 * 1024, "Largest accepted request body; larger gets 413.", min=1024
    )
    max_audio_bytes: int = setting(
        25 * 1024 * 1024,
        "Largest audio upload to /v1/audio/* (multipart); larger gets 413 while it uploads. "
        "vLLM has its own 25 MB limit (VLLM_MAX_AUDIO_CLIP_FILESIZE_MB).",
        min=1024,
    )
    max_messages: int = setting(2048, "Most chat messages in one request.", min=1)
    max_n: int = setting(16, "Largest `n` (choices per request) accepted.", min=1)
    upstream_connect_timeout_s: float = setting(
        5.0, "Time to connect to an engine before the request fails with 502.", min=0.1
    )
    retry_after_s: int = setting(
        5, "Retry-After seconds sent with 503 while an engine starts and with 429.", min=1
    )
    max_connections: int = setting(
        4096,
        "Open client connections at once; past it the oldest one still sending its request "
        "is closed, else new ones get 503. Lowered to fit the open-files limit.",
        min=16,
    )
    header_timeout_s: float = setting(
        10.0,
        "Time a new connection has to send its request head; slower ones are closed.",
        min=0.5,
        max=600,
    )
    body_timeout_s: float = setting(
        60.0, "Time a request body has to arrive once its head has; slower gets 408.", min=1
    )
    client_stall_timeout_s: float = setting(
        60.0,
        "A streamed reply its client does not read for this long is ended, and the engine's "
        "request aborted (the concurrency slot is freed).",
        min=1,
    )
    keepalive_timeout_s: float = setting(
        60.0,
        "Idle keep-alive connections are closed after this long (from the next start).",
        min=1,
    )
    usage_days: float = setting(
        90.0, "How long the usage log (one row per request) is kept.", min=0.01
    )
    usage_max_rows: int = setting(
        1_000_000, "Most rows the usage log keeps; the oldest go first.", min=100
    )


@dataclass(frozen=True)
class EngineSettings:
    ready_timeout_s: float = setting(
        900.0, "Longest an engine may take to become ready (compile and warm-up on GPUs).", min=5
    )
    stop_timeout_s: float = setting(
        15.0, "Grace period after SIGTERM before the process group is killed.", min=0.5
    )
    restart_max: int = setting(
        3, "Automatic restarts after crashes before the engine is marked failed.", min=0, max=100
    )
    stall_timeout_s: float = setting(
        120.0,
        "An engine with requests in flight that produces no token for this long is hung: "
        "its requests end with an error and it is restarted.",
        min=1,
    )
    restart_backoff_s: float = setting(2.0, "First restart delay; doubles each time.", min=0.0)
    restart_backoff_max_s: float = setting(60.0, "Cap on the restart delay.", min=0.0)
    stable_after_s: float = setting(
        300.0, "An engine ready this long has its restart count reset.", min=1
    )
    log_ring_lines: int = setting(5000, "Engine log lines kept in memory per engine.", min=100)
    cpu_kv_cache_gib: int = setting(
        1, "KV cache size for CPU engines (VLLM_CPU_KVCACHE_SPACE, whole GiB).", min=1
    )
    warm_starts: int = setting(
        1,
        "Engine processes kept started ahead, imports done, for the next start of recently "
        "ready profiles (vLLM: about 5 s less per start; about 0.6 GB of RAM each). 0: off.",
        min=0,
        max=8,
    )
    jit: bool = setting(
        True,
        "Load a model on its first request (any profile, library model or attached server is "
        "addressable by name). Off: only loaded models are served (`traylm load NAME`).",
    )
    idle_ttl_s: float = setting(
        3600.0,
        "Unload a model loaded on demand after this many seconds without requests (0: never). "
        "A profile's idle_ttl_s and a request's keep_alive override it.",
        min=0,
    )


@dataclass(frozen=True)
class GPUSettings:
    simulate_gpus: int = setting(
        0, "Use the simulated RTX 4090 backend with this many GPUs (0: real NVML).", min=0, max=8
    )
    sample_interval_s: float = setting(1.0, "Telemetry sampling period.", min=0.1, max=60)
    history_resolution_s: float = setting(
        10.0, "Resolution of the telemetry history kept in the database.", min=1
    )
    history_days: float = setting(7.0, "How long telemetry history is kept.", min=0.01)
    history_max_rows: int = setting(
        1_000_000, "Most telemetry history rows kept (all GPUs); the oldest go first.", min=100
    )
    process_interval_s: float = setting(
        5.0, "Period of the (slow) per-GPU process list read.", min=1
    )
    replay_file: str = setting(
        "",
        "Replay this JSONL trace instead of reading GPUs (demos; `traylm gpus record` makes one).",
    )
    reserved: tuple[int, ...] = setting(
        (),
        "GPUs (CUDA indices) models on demand never place a model on, e.g. the card that drives "
        "the display. Profiles that name a reserved GPU still run there when loaded.",
    )
    helper_socket: str = setting(
        "/run/traylm-gpud/traylm-gpud.sock",
        "Unix socket of traylm-gpud, the privileged helper for fan curves and power limits.",
    )
    guard_enabled: bool = setting(
        True, "Thermal guard: act when a GPU nears its slowdown temperature."
    )
    guard_notice_margin_c: float = setting(
        10.0, "Guard step 1: notify this many °C below the card's slowdown temperature.", min=0
    )
    guard_power_margin_c: float = setting(
        7.0, "Guard step 2: lower the power limit this many °C below slowdown.", min=0
    )
    guard_pause_margin_c: float = setting(
        4.0, "Guard step 3: pause new requests at the gateway this many °C below slowdown.", min=0
    )
    guard_stop_margin_c: float = setting(
        2.0, "Guard step 4: stop the engines on that GPU this many °C below slowdown.", min=0
    )
    guard_power_pct: float = setting(
        70.0, "Power limit the guard sets, in % of the card's default limit.", min=10, max=100
    )
    guard_step_s: float = setting(
        10.0, "Shortest time at one guard step before the next one is taken.", min=0, max=3600
    )
    guard_hysteresis_c: float = setting(
        3.0, "The guard stands down once the GPU is this far below the notice threshold.", min=0
    )


@dataclass(frozen=True)
class EnergySettings:
    electricity_price_per_kwh: float = setting(
        0.30, "Electricity price per kWh, for cost per million tokens.", min=0
    )
    currency: str = setting("EUR", "Currency shown next to costs.")
    psu_watts: float = setting(
        1600.0, "Power supply rating; traylm warns when the GPUs draw close to it.", min=100
    )
    other_watts: float = setting(
        250.0,
        "Power drawn by everything but the GPUs (CPU, board, drives), for the PSU check.",
        min=0,
    )
    psu_warn_fraction: float = setting(
        0.85, "Warn when GPUs plus other_watts exceed this fraction of psu_watts.", min=0.1, max=1
    )
    window_s: float = setting(
        10.0, "Window for energy per token (NVML energy counter and token counter deltas).", min=5
    )


@dataclass(frozen=True)
class HubSettings:
    endpoint: str = setting(
        "", "Hugging Face endpoint (empty: the official Hub). Your token is sent to it."
    )
    token_env: str = setting("HF_TOKEN", "Environment variable holding a Hugging Face token.")
    trusted_endpoints: tuple[str, ...] = setting(
        (), "Endpoints besides the official Hub that may receive your Hugging Face token."
    )
    parallel_downloads: int = setting(
        1, "Models downloaded at the same time; more wait in the queue.", min=1, max=8
    )
    parallel_files: int = setting(4, "Files of one model fetched at the same time.", min=1, max=16)
    retry_max: int = setting(
        5, "Automatic retries of a failed download (network, server errors, stalls).", min=0
    )
    retry_backoff_s: float = setting(2.0, "First retry delay; doubles each time.", min=0.0)
    retry_backoff_max_s: float = setting(60.0, "Cap on the retry delay.", min=0.0)
    stall_timeout_s: float = setting(
        60.0, "A download that receives no bytes for this long is restarted.", min=1.0
    )
    read_timeout_s: float = setting(
        20.0, "Socket read timeout of one Hub request (HF_HUB_DOWNLOAD_TIMEOUT).", min=1.0
    )
    min_free_gib: float = setting(2.0, "Disk space that must stay free after a download.", min=0.0)


@dataclass(frozen=True)
class RemoteSettings:
    enabled: bool = setting(
        False, "Send requests to a remote OpenAI-compatible API when no local engine can serve."
    )
    base_url: str = setting("", "Remote API base URL, e.g. https://api.example.com/v1.")
    api_key_env: str = setting(
        "TRAYLM_REMOTE_API_KEY", "Environment variable with the remote key (else the OS keyring)."
    )
    aliases: tuple[str, ...] = setting(
        (), "Model names that may fall back to the remote API (empty: none)."
    )


@dataclass(frozen=True)
class TRTSettings:
    cache_budget_gib: float = setting(
        200.0,
        "Disk space built TensorRT engines may take; past it the least recently used ones "
        "(not in use) are removed.",
        min=1,
    )
    build_timeout_s: float = setting(
        7200.0, "Longest a TensorRT engine build may run before it is stopped.", min=30
    )


@dataclass(frozen=True)
class UISettings:
    quit_action: str = setting(
        "ask",
        "What Quit does to running engines: ask, stop them, or leave the daemon serving.",
        choices=("ask", "stop", "leave"),
    )
    autostart: bool = setting(False, "Start the tray app at login (XDG autostart entry).")
    notifications: bool = setting(True, "Show desktop notifications.")
    last_profile: str = setting(
        "", "Profile the tray's Start acts on (the last one started or picked in the menu)."
    )
    theme: str = setting(
        "system",
        "The app's colours: system (follow the desktop's light or dark setting), light or dark.",
        choices=("system", "light", "dark"),
    )
    setup_done: bool = setting(
        False,
        "The first-run setup was finished or skipped (Settings → Run the setup again reopens it).",
    )


@dataclass(frozen=True)
class Settings:
    gateway: GatewaySettings = field(default_factory=GatewaySettings)
    engines: EngineSettings = field(default_factory=EngineSettings)
    gpu: GPUSettings = field(default_factory=GPUSettings)
    energy: EnergySettings = field(default_factory=EnergySettings)
    hub: HubSettings = field(default_factory=HubSettings)
    remote: RemoteSettings = field(default_factory=RemoteSettings)
    trt: TRTSettings = field(default_factory=TRTSettings)
    ui: UISettings = field(default_factory=UISettings)

    @property
    def bind_host(self) -> str:
        return "0.0.0.0" if self.gateway.lan_sharing else self.gateway.host  # noqa: S104


SECTIONS: dict[str, type[Any]] = {
    "gateway": GatewaySettings,
    "engines": EngineSettings,
    "gpu": GPUSettings,
    "energy": EnergySettings,
    "hub": HubSettings,
    "remote": RemoteSettings,
    "trt": TRTSettings,
    "ui": UISettings,
}


def load_settings(path: Path) -> Settings:
    """Read config.toml; a missing file gives the defaults."""
    data = _read_toml(path) if path.exists() else {}
    problems: list[str] = []
    sections: dict[str, Any] = {}
    for key, value in data.items():
        if key not in SECTIONS:
            problems.append(f"[{key}] is not a settings section{_did_you_mean(key, SECTIONS)}")
            continue
        if not isinstance(value, dict):
            problems.append(f"[{key}] must be a table of settings")
            continue
        sections[key] = _build(SECTIONS[key], value, f"[{key}]", problems)
    if problems:
        raise ConfigError(_problems_message(str(path), problems))
    settings = Settings(**sections)
    _check_settings(settings, str(path))
    return settings


def _check_settings(settings: Settings, where: str) -> None:
    if settings.gateway.lan_sharing and not settings.gateway.api_key_sha256:
        raise ConfigError(
            f"{where}: gateway.lan_sharing is on but no API key is set; add one with "
            "`traylm keys add` first (an open LLM server on the LAN is found by scanners)"
        )


def save_settings(path: Path, settings: Settings) -> None:
    _check_settings(settings, str(path))
    data = {name: _non_default(getattr(settings, name)) for name in SECTIONS}
    write_toml_atomic(path, {k: v for k, v in data.items() if v})


def replace_setting(settings: Settings, dotted: str, value: Any) -> Settings:
    """Return settings with ``section.field`` set to ``value`` (validated like a file)."""
    section, _, name = dotted.partition(".")
    if section not in SECTIONS:
        raise ConfigError(
            f"'{section}' is not a settings section{_did_you_mean(section, SECTIONS)}"
        )
    current = dataclasses.asdict(getattr(settings, section))
    if name not in current:
        raise ConfigError(f"'{dotted}' is not a setting{_did_you_mean(name, current)}")
    current[name] = value
    problems: list[str] = []
    built = _build(SECTIONS[section], current, f"[{section}]", problems)
    if problems:
        raise ConfigError(_problems_message("setting", problems))
    new = dataclasses.replace(settings, **{section: built})
    _check_settings(new, "setting")
    return new


# --------------------------------------------------------------------------- profiles

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
AUTO = "auto"


@dataclass(frozen=True)
class Profile:
    """One way to run one model with one engine. Stored as ``profiles/<name>.toml``."""

    name: str = setting("", "Profile name (the file name without .toml).")
    engine: str = setting("vllm", "Inference engine.", choices=ENGINES)
    model: str = setting("", "Hugging Face repo id (org/name) or a local model folder.")
    revision: str | None = setting(None, "Model revision (commit sha, branch or tag).")
    served_name: str | None = setting(
        None, "Model name clients send in `model` (default: the repo's name part)."
    )
    aliases: tuple[str, ...] = setting((), "More names the gateway routes to this engine.")
    description: str = setting("", "A line shown in menus.")
    device: str = setting(
        "auto",
        "cuda, cpu, or auto (cuda when an NVIDIA GPU is present).",
        choices=("auto", "cuda", "cpu"),
    )
    gpus: tuple[int, ...] = setting(
        (0,),
        'CUDA device indices the engine may use, or "auto": the planner picks the card(s) '
        "when the model loads (one card, the one with the most room; both for tensor parallel).",
    )
    tensor_parallel_size: int = setting(1, "Tensor-parallel size (GPUs per model copy).", min=1)
    pipeline_parallel_size: int = setting(1, "Pipeline-parallel size.", min=1)
    p2p: bool = setting(
        False,
        "GPUs support peer-to-peer (patched driver). Off: NCCL P2P and custom all-reduce "
        "are disabled, which stock-driver GeForce cards need for tensor parallel.",
    )
    dtype: str = setting(
        "auto", "Weight/activation dtype.", choices=("auto", "float16", "bfloat16", "float32")
    )
    quantization: str | None = setting(None, "Quantization method (awq, gptq, fp8, ...).")
    kv_cache_dtype: str = setting(
        "auto",
        "KV-cache dtype (fp8 halves KV memory on Ada).",
        choices=("auto", "fp8", "fp8_e4m3", "fp8_e5m2"),
    )
    max_model_len: int | None = setting(
        None, "Context length in tokens (default: model's).", min=16
    )
    max_num_seqs: int | None = setting(None, "Most sequences batched at once.", min=1)
    max_num_batched_tokens: int | None = setting(None, "Token budget per scheduler step.", min=16)
    gpu_memory_utilization: float = setting(
        0.90, "Fraction of each GPU's memory the engine may take.", min=0.05, max=1.0
    )
    cpu_kv_cache_gib: int | None = setting(
        None, "KV cache for the CPU build, in whole GiB (default: engines.cpu_kv_cache_gib).", min=1
    )
    trust_remote_code: bool = setting(
        False, "Run the model repo's own Python code. Only for models you trust."
    )
    runner: str = setting(
        "auto",
        "vLLM: what the model runs as: generate (chat, completions, responses), pooling "
        "(embeddings, scores, rerank), or auto (from the model's architecture).",
        choices=("auto", "generate", "pooling"),
    )
    tool_parser: str = setting(
        "",
        "How the engine reads tool calls in the model's output (vLLM's --tool-call-parser): "
        "llama3_json for Llama 3.x, hermes for Qwen 2.5/3, mistral for Mistral. Empty: off.",
        label="Tool calling format",
        suggestions=("llama3_json", "hermes", "mistral", "qwen3_coder", "pythonic"),
    )
    reasoning_parser: str = setting(
        "",
        "How the engine separates the model's thinking from its answer (vLLM's "
        "--reasoning-parser): qwen3 for Qwen3, deepseek_r1 for DeepSeek-R1. Empty: off.",
        label="Reasoning (thinking) format",
        suggestions=("qwen3", "deepseek_r1", "mistral"),
    )
    engine_version: str | None = setting(
        None, "Installed engine version to use (default: the newest installed)."
    )
    mode: str = setting(
        "serve",
        "TensorRT-LLM only: serve (PyTorch backend) or build (compiled engine).",
        choices=("serve", "build"),
    )
    quant_recipe: str | None = setting(
        None, "TensorRT-LLM build: ModelOpt recipe (fp8, int4_awq, w4a8_awq) or none."
    )
    max_batch_size: int | None = setting(None, "TensorRT-LLM: maximum batch size.", min=1)
    extra_flags: tuple[str, ...] = setting(
        (), "More engine flags, checked against the installed version's allow-list."
    )
    env: dict[str, str] = setting({}, "Extra environment variables for the engine process.")
    idle_ttl_s: float | None = setting(
        None,
        "Unload the model after this many seconds without requests (0: never; default: "
        "engines.idle_ttl_s).",
        min=0,
    )
    sleep_mode: bool = setting(
        True,
        "vLLM on CUDA: start with sleep mode, so that when another model needs the GPU this one "
        "can move its weights to host RAM and wake in seconds instead of a cold start.",
    )

    @property
    def served_names(self) -> tuple[str, ...]:
        return (self.effective_served_name, *self.aliases)

    @property
    def effective_served_name(self) -> str:
        if self.served_name:
            return self.served_name
        return self.model.rstrip("/").rsplit("/", 1)[-1] or self.name

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def gpus_auto(self) -> bool:
        """``gpus = "auto"`` (held as no indices): placed when the model loads."""
        return not self.gpus


def profile_from_mapping(name: str, data: Mapping[str, Any], where: str = "") -> Profile:
    problems: list[str] = []
    values = {**dict(data), "name": name}
    if values.get("gpus") == AUTO:
        values["gpus"] = ()
    profile = _build(Profile, values, "", problems)
    problems.extend(_check_profile(profile))  # also with field errors: report everything at once
    if problems:
        raise ConfigError(_problems_message(where or f"profile '{name}'", problems))
    return profile


def profile_to_mapping(profile: Profile) -> dict[str, Any]:
    data = _non_default(profile)
    data.pop("name", None)
    if profile.gpus_auto:
        data["gpus"] = AUTO
    return data


def _check_profile(p: Profile) -> list[str]:
    problems: list[str] = []
    if not _NAME_RE.match(p.name):
        problems.append(
            f"name {p.name!r} must be 1-64 letters, digits, '.', '_' or '-' (no spaces or '/')"
        )
    if not p.model:
        problems.append("model is required: a Hugging Face repo id (org/name) or a local folder")
    if p.world_size > len(p.gpus) and p.device != "cpu" and not p.gpus_auto:
        problems.append(
            f"tensor_parallel_size × pipeline_parallel_size = {p.world_size} needs that many GPUs, "
            f"but gpus lists {len(p.gpus)}: set gpus = {list(range(p.world_size))}"
        )
    if len(set(p.gpus)) != len(p.gpus) or any(g < 0 for g in p.gpus):
        problems.append(f"gpus {list(p.gpus)} must be distinct non-negative CUDA indices")
    if p.device == "cpu" and p.world_size > 1:
        problems.append("the CPU build runs without tensor/pipeline parallel: set both to 1")
    if p.mode == "build" and p.engine != "trtllm":
        problems.append("mode = 'build' is for engine = 'trtllm' only")
    for key in p.env:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            problems.append(f"env key {key!r} is not a valid environment variable name")
    for key in ("tool_parser", "reasoning_parser"):
        value = getattr(p, key)
        if value and not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", value):
            problems.append(f"{key} {value!r} is not a parser name (letters, digits, '_', '-')")
        elif value and p.engine != "vllm":
            problems.append(f"{key} is a vLLM setting; leave it empty for engine = {p.engine!r}")
    if p.runner != "auto" and p.engine != "vllm":
        problems.append(f"runner is a vLLM setting; leave it 'auto' for engine = {p.engine!r}")
    if p.extra_flags and not p.extra_flags[0].startswith("-"):
        problems.append(f"extra_flags must start with a flag (--name), not {p.extra_flags[0]!r}")
    return problems


class ProfileStore:
    """Profiles in ``profiles/*.toml``; shipped presets (resources/profiles) are read-only."""

    def __init__(self, profiles_dir: Path, presets_dir: Path | None = None) -> None:
        self._dir = profiles_dir
        self._presets = presets_dir if presets_dir is not None else resources_dir() / "profiles"

    def names(self) -> list[str]:
        names = {p.stem for p in self._presets.glob("*.toml")}
        if self._dir.is_dir():
            names |= {p.stem for p in self._dir.glob("*.toml")}
        return sorted(names)

    def is_preset(self, name: str) -> bool:
        return (
            not (self._dir / f"{name}.toml").exists() and (self._presets / f"{name}.toml").exists()
        )

    def load(self, name: str) -> Profile:
        if not _NAME_RE.match(name):
            raise ProfileNotFound(f"no profile named {name!r}: names are letters, digits, . _ -")
        for folder in (self._dir, self._presets):
            path = folder / f"{name}.toml"
            if path.exists():
                return profile_from_mapping(name, _read_toml(path), str(path))
        raise ProfileNotFound(
            f"no profile named {name!r}{_did_you_mean(name, self.names())}; "
            "list them with `traylm profiles`"
        )

    def load_all(self) -> tuple[list[Profile], list[str]]:
        """Every loadable profile, and one error line for each broken file."""
        good: list[Profile] = []
        broken: list[str] = []
        for name in self.names():
            try:
                good.append(self.load(name))
            except ConfigError as exc:
                broken.append(exc.message)
        return good, broken

    def save(self, profile: Profile) -> Path:
        problems = _check_profile(profile)
        if problems:
            raise ConfigError(_problems_message(f"profile '{profile.name}'", problems))
        path = self._dir / f"{profile.name}.toml"
        write_toml_atomic(path, profile_to_mapping(profile))
        return path

    def delete(self, name: str) -> None:
        path = self._dir / f"{name}.toml"
        if not path.exists():
            if (self._presets / f"{name}.toml").exists():
                raise ConfigError(f"{name!r} is a shipped preset and cannot be deleted")
            raise ProfileNotFound(f"no profile named {name!r}")
        path.unlink()


# --------------------------------------------------------------------------- durations

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|h|m|s)?")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, None: 1.0}


def parse_duration(value: object, *, what: str) -> float:
    """Seconds from a number (seconds) or a duration string as Ollama and Go write them:
    "300", "90s", "10m", "1h30m", "-1". Negative values are returned as they are (the caller
    decides what they mean). Raises ConfigError naming ``what``."""
    if isinstance(value, bool):
        raise ConfigError(f'{what} must be a duration such as 300, "10m" or "1h", not {value}')
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip().lower()
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    total, pos = 0.0, 0
    for m in _DURATION_PART.finditer(body):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    if not body or pos != len(body):
        raise ConfigError(
            f"{what} {value!r} is not a duration: write seconds (300) or a number with a unit "
            "(90s, 10m, 1h, 1h30m)"
        )
    return sign * total


# --------------------------------------------------------------------------- TOML plumbing


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc}); fix the file or delete it") from exc
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{path}: not UTF-8 text (line {line} has the byte {exc.object[exc.start]:#04x}); "
            "save it as UTF-8, or delete it"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror})") from exc


def write_toml_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Write TOML so that a crash at any moment leaves either the old or the new file. Settings
    and profiles are the user's own: readable by nobody else (0600)."""
    write_bytes_atomic(path, tomli_w.dumps(dict(data)).encode(), mode=0o600)


def write_bytes_atomic(path: Path, payload: bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        Path(tmp).chmod(mode)
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


C = TypeVar("C")


def _build(cls: type[C], data: Mapping[str, Any], where: str, problems: list[str]) -> C:
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    prefix = f"{where} " if where else ""
    for key, raw in data.items():
        if key not in fields:
            problems.append(f"{prefix}'{key}' is not a known field{_did_you_mean(key, fields)}")
            continue
        meta = fields[key].metadata
        try:
            value = _coerce(hints[key], raw)
        except (TypeError, ValueError) as exc:
            problems.append(f"{prefix}{key} = {raw!r}: {exc}")
            continue
        bad = _check_bounds(value, meta)
        if bad:
            problems.append(f"{prefix}{key} = {raw!r}: {bad}")
            continue
        kwargs[key] = value
    return cls(**kwargs)


def _coerce(tp: Any, raw: Any) -> Any:
    origin = get_origin(tp)
    args = get_args(tp)
    if origin is not None and type(None) in args:
        if raw is None:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], raw)
    if tp is bool:
        if not isinstance(raw, bool):
            raise TypeError("must be true or false")
        return raw
    if tp is int:
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise TypeError("must be a whole number")
        return raw
    if tp is float:
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            raise TypeError("must be a number")
        return float(raw)
    if tp is str:
        if not isinstance(raw, str):
            raise TypeError("must be a string")
        return raw
    if origin is tuple:
        if not isinstance(raw, list | tuple):
            raise TypeError("must be a list")
        return tuple(_coerce(args[0], v) for v in raw)
    if origin is dict:
        if not isinstance(raw, dict):
            raise TypeError("must be a table")
        return {str(k): _coerce(args[1], v) for k, v in raw.items()}
    raise TypeError(f"unsupported field type {tp}")


def _check_bounds(value: Any, meta: Mapping[str, Any]) -> str | None:
    if value is None:
        return None
    lo, hi, choices = meta.get("min"), meta.get("max"), meta.get("choices")
    if choices and value not in choices:
        return f"must be one of {', '.join(choices)}{_did_you_mean(str(value), choices)}"
    if isinstance(value, int | float) and not isinstance(value, bool):
        if lo is not None and value < lo:
            return f"must be at least {lo}"
        if hi is not None and value > hi:
            return f"must be at most {hi}"
    return None


def _non_default(obj: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        default = (
            f.default
            if f.default is not dataclasses.MISSING
            else (f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        )
        if value != default and value is not None:
            out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def _did_you_mean(word: str, options: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def _problems_message(where: str, problems: list[str]) -> str:
    if len(problems) == 1:
        return f"{where}: {problems[0]}"
    return f"{where} has {len(problems)} problems:\n" + "\n".join(f"  - {p}" for p in problems)
