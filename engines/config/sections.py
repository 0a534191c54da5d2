"""Settings (config.toml), and every path traylm uses (``Paths``, from config/paths.py).

Each setting has one home here: one default and one doc line (``config.fields.doc``) that the UI
shows as its tooltip. Loading validates everything and raises ``ConfigError`` listing each
problem with the field, the value, and what would be valid. Files are written temp-then-rename.
Engine profiles are in profiles.py.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engines.config.fields import (
    build_dataclass,
    did_you_mean,
    non_default,
    problems_message,
    setting,
)
from engines.config.paths import APP_NAME as APP_NAME
from engines.config.paths import Paths as Paths
from engines.config.tomlfile import read_toml, write_toml_atomic
from engines.errors import ConfigError

log = logging.getLogger(__name__)


def resources_dir() -> Path:
    """The shipped resources/ folder (presets, flag allow-lists, icons)."""
    import resources

    return Path(resources.__file__).parent


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
    api_key_names: dict[str, str] = setting(
        {},
        "Names of API keys by fingerprint (the first 8 hex digits of the digest, as `traylm "
        "keys list` shows): the app or agent each was made for (`traylm keys add --name`).",
    )
    keys_for: str = setting(
        "all",
        "Who must send an API key once one exists: 'all' clients, or only 'lan' clients (apps "
        "on this computer need none; a reverse proxy on this computer counts as this computer).",
        choices=("all", "lan"),
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
    max_file_bytes: int = setting(
        200 * 1024 * 1024,
        "Largest file uploaded to /v1/files (batch input); larger gets 400 while it uploads.",
        min=1024,
    )
    batch_lines_at_once: int = setting(
        16,
        "Lines of a batch (POST /v1/batches) in flight at once. Interactive requests still go "
        "first (the queue and vLLM's priority); more lines give a batch more of the engine.",
        min=1,
        max=1024,
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
    make_room: bool = setting(
        True,
        "When another program (a game, Blender) takes memory on a GPU that holds an idle model "
        "and leaves less than make_room_margin_gib free, free that card: the model sleeps "
        "(vLLM sleep mode) or unloads, and comes back once the program exits. A model with "
        "requests running, or pinned (`traylm load --pin`), is never touched.",
    )
    make_room_margin_gib: float = setting(
        1.0,
        "Room is made when another program takes memory and the card has less than this free.",
        min=0,
        max=64,
    )
    make_room_ignore: tuple[str, ...] = setting(
        ("Xorg", "Xwayland", "gnome-shell", "kwin_wayland", "kwin_x11", "plasmashell", "sway"),
        "Programs never made room for (process names; shell-style patterns such as "
        "'steam*'): the desktop's own by default.",
    )
    make_room_always: tuple[str, ...] = setting(
        (),
        "Programs always made room for as soon as they appear, however much the card has free "
        "(process names or patterns, e.g. 'blender').",
    )
    make_room_return_s: float = setting(
        10.0,
        "How long a program made room for must be gone before its card's models come back "
        "(doubled each time it comes back soon after, up to 10 minutes: no sleep-wake flapping).",
        min=1,
        max=3600,
    )


@dataclass(frozen=True)
class GPUSettings:
    simulate_gpus: int = setting(
        0, "Use the simulated RTX 4090 backend with this many GPUs (0: real NVML).", min=0, max=8
    )
    simulate_driver: str = setting(
        "",
        "The NVIDIA driver version the simulated GPUs report; it sets their CUDA version, which "
        "picks the engine builds `traylm engines install` chooses (550: CUDA 12.4, 575: 12.9, "
        "580: 13.0). Empty: the card profile's driver, else a current 580-series one.",
    )
    simulate_card: str = setting(
        "",
        "A card profile (the JSON tests/gpu/truth.py writes on a real NVIDIA machine) whose "
        "name, memory totals, driver reserve and driver the simulated GPUs take. Empty: stock "
        "RTX 4090s.",
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
class PeersSettings:
    name: str = setting(
        "",
        "This box's name as paired boxes show it (empty: the host name); 1-64 letters, "
        "digits, '.', '_' or '-'.",
    )
    host: str = setting(
        "0.0.0.0",  # noqa: S104 - bound only while a box is paired or a pairing is on
        "Address the listener for paired boxes binds (0.0.0.0: every interface). It listens "
        "only while a box is paired or a pairing is on; paired boxes only, over mutual TLS. "
        "A change applies when the listener next opens.",
    )
    port: int = setting(
        8471,
        "Port of the listener for paired boxes (a change applies when it next opens).",
        min=1,
        max=65535,
    )
    pairing_timeout_s: float = setting(
        300.0, "How long a pairing code (`traylm pair`) stays valid.", min=10, max=3600
    )
    pairing_attempts: int = setting(
        3, "Wrong codes a pairing takes before its code is spent.", min=1, max=10
    )
    request_timeout_s: float = setting(
        5.0,
        "Longest a request to a paired box may take (pairing, unpair, status).",
        min=0.5,
        max=120,
    )
    share_models: bool = setting(
        True,
        "Serve the models loaded on this box to paired boxes: each is one more replica of its "
        "name behind their :8000 (only paired boxes reach it, over mutual TLS).",
    )
    load_for_peers: bool = setting(
        False,
        "A paired box's request may load a model here (making room as for a local one); off: "
        "paired boxes are served only the models already loaded on this box.",
    )
    replicas_poll_s: float = setting(
        5.0,
        "How often this box asks each paired box which models it serves (only while a box is "
        "paired; a box that does not answer is left out until it does).",
        min=0.5,
        max=300,
    )


@dataclass(frozen=True)
class RequestsSettings:
    capture: str = setting(
        "full",
        "What the flight recorder keeps of requests from this computer: full (bodies and the "
        "reply), metadata (no bodies) or off (nothing).",
        choices=("full", "metadata", "off"),
    )
    capture_lan: str = setting(
        "metadata",
        "What the flight recorder keeps of requests from other computers (LAN sharing, and "
        "the requests this box serves for a paired box).",
        choices=("full", "metadata", "off"),
    )
    body_max_bytes: int = setting(
        1024 * 1024,
        "Largest request body, and assembled reply, the recorder keeps; longer ones are cut "
        "and marked.",
        min=1024,
    )
    days: float = setting(30.0, "How long recorded requests are kept.", min=0.01)
    max_mib: float = setting(
        1024.0, "Most disk space recorded requests take; the oldest go first.", min=1
    )
    responses_keep: int = setting(
        10_000,
        "Responses API responses traylm keeps for previous_response_id and retrieve (in "
        "requests.db, whatever requests.capture says); the oldest go first; 0: none kept "
        "(those calls then go to the engine, which keeps none unless "
        "VLLM_ENABLE_RESPONSES_API_STORE=1).",
        min=0,
    )
    responses_max_mib: float = setting(
        256.0, "Most disk space kept responses take; the oldest go first.", min=1
    )
    responses_days: float = setting(30.0, "How long kept responses are kept.", min=0.01)


@dataclass(frozen=True)
class OllamaSettings:
    enabled: bool = setting(
        True,
        "Serve Ollama's API (its chat, generate, model list and the rest) for apps that speak "
        "only Ollama's; when the port is taken (Ollama itself runs) traylm says so and goes on.",
    )
    port: int = setting(
        11434,
        "Port of Ollama's API (11434, Ollama's own, is what those apps default to).",
        min=1,
        max=65535,
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
    peers: PeersSettings = field(default_factory=PeersSettings)
    requests: RequestsSettings = field(default_factory=RequestsSettings)
    ollama: OllamaSettings = field(default_factory=OllamaSettings)
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
    "peers": PeersSettings,
    "requests": RequestsSettings,
    "ollama": OllamaSettings,
    "ui": UISettings,
}


RETIRED = {
    ("gateway", "express_lane"): "the gateway's express lane was removed: one HTTP stack serves "
    "every request",
}
"""Settings that were removed: a config.toml that still has one loads, with a warning, instead
of keeping the daemon from starting."""


def load_settings(path: Path) -> Settings:
    """Read config.toml; a missing file gives the defaults."""
    data = read_toml(path) if path.exists() else {}
    problems: list[str] = []
    sections: dict[str, Any] = {}
    for key, value in data.items():
        if key not in SECTIONS:
            problems.append(f"[{key}] is not a settings section{did_you_mean(key, SECTIONS)}")
            continue
        if not isinstance(value, dict):
            problems.append(f"[{key}] must be a table of settings")
            continue
        sections[key] = build_dataclass(
            SECTIONS[key], _without_retired(key, value), f"[{key}]", problems
        )
    if problems:
        raise ConfigError(problems_message(str(path), problems))
    settings = Settings(**sections)
    _check_settings(settings, str(path))
    return settings


def _without_retired(section: str, table: Mapping[str, Any]) -> dict[str, Any]:
    kept = dict(table)
    for (where, key), why in RETIRED.items():
        if where == section and kept.pop(key, None) is not None:
            log.warning(
                "config.toml: [%s] %s is no longer a setting (%s); ignored", where, key, why
            )
    return kept


def _check_settings(settings: Settings, where: str) -> None:
    if settings.gateway.lan_sharing and not settings.gateway.api_key_sha256:
        raise ConfigError(
            f"{where}: gateway.lan_sharing is on but no API key is set; add one with "
            "`traylm keys add` first (an open LLM server on the LAN is found by scanners)"
        )


def save_settings(path: Path, settings: Settings) -> None:
    _check_settings(settings, str(path))
    data = {name: non_default(getattr(settings, name)) for name in SECTIONS}
    write_toml_atomic(path, {k: v for k, v in data.items() if v})


def replace_setting(settings: Settings, dotted: str, value: Any) -> Settings:
    """Return settings with ``section.field`` set to ``value`` (validated like a file)."""
    section, _, name = dotted.partition(".")
    if section not in SECTIONS:
        raise ConfigError(f"'{section}' is not a settings section{did_you_mean(section, SECTIONS)}")
    current = dataclasses.asdict(getattr(settings, section))
    if name not in current:
        raise ConfigError(f"'{dotted}' is not a setting{did_you_mean(name, current)}")
    current[name] = value
    problems: list[str] = []
    built = build_dataclass(SECTIONS[section], current, f"[{section}]", problems)
    if problems:
        raise ConfigError(problems_message("setting", problems))
    new = dataclasses.replace(settings, **{section: built})
    _check_settings(new, "setting")
    return new
