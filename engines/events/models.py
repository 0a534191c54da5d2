"""Models on demand (engines/ondemand/): the servable catalog, loaded models (`traylm ps`),
placements, attached servers, and their events.

``status`` is the three-word answer every client can show (loaded | loading | unloaded);
``state`` is the finer one (stopped, starting, ready, sleeping, stopping, failed, and for an
attached server ready | unreachable).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import ClassVar

from engines.events.codec import Event


class ModelStatus(enum.StrEnum):
    LOADED = "loaded"
    LOADING = "loading"
    UNLOADED = "unloaded"


@dataclasses.dataclass(frozen=True)
class ReplicaInfo:
    """One engine of a model served by several (``replicas`` in its profile)."""

    engine_id: str
    state: str
    gpus: tuple[int, ...] = ()
    in_flight: int = 0


@dataclasses.dataclass(frozen=True)
class ServableModel:
    """One model a request may name at :8000 (a profile, a library model, a registered model
    folder, an attached server)."""

    name: str
    """The name clients send (listed in /v1/models)."""
    aliases: tuple[str, ...]
    """More names listed in /v1/models for it (a profile's aliases, a server's model ids)."""
    names: tuple[str, ...]
    """Every name that routes here: ``name``, the aliases, the repo id, the profile name."""
    kind: str  # profile | library | folder | attached
    engine_id: str
    engine: str  # vllm | trtllm | sglang | external
    model: str  # repo id, local folder, or the attached server's URL
    status: ModelStatus
    state: str
    gpus: tuple[int, ...]
    """CUDA indices it is on (loaded) or would go to now (``gpus_planned``)."""
    gpus_planned: bool = False
    external: bool = False
    detail: str = ""
    blocked: str = ""
    """Why it cannot start on this computer, in a few words ("needs an NVIDIA GPU (this computer
    has none)", "needs the vLLM engine (CUDA build): traylm engines install vllm"); "" when it
    can. The daemon's one answer, from the checks a start makes: a start or load of it is
    refused by the same check, its message giving the fix. Every client shows this; none has
    rules of its own."""
    blocked_code: str = ""
    """The refusal's error code (gpu_not_found, engine_env, hub_unavailable, ...)."""
    replicas: tuple[ReplicaInfo, ...] = ()
    """Its engines when it has more than one (the profile's ``replicas``), each with its
    state and GPUs; empty for a model served by one engine."""
    accepts_images: bool = False
    """Its config.json describes a vision encoder: a chat may send it images."""
    tools_blocked: str = ""
    """Why it cannot call tools, with the command that fixes it (a vLLM model without a tool
    calling format); "" when it can (agents such as `traylm launch` need it)."""


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """One row of `traylm ps`: a model that holds (or is taking) resources now."""

    name: str
    engine_id: str
    engine: str
    state: str
    origin: str  # jit (a request) | load (traylm load) | start (traylm start) | attached
    gpus: tuple[int, ...]
    vram_bytes: int
    """Booked on its GPUs together, by the engine's memory rule (asleep: what sleep keeps)."""
    in_flight: int
    waiting: int
    idle_for_s: float | None
    """Seconds since its last request ended; None while requests run (or never served)."""
    unloads_in_s: float | None
    """Seconds until the idle unload; None: not while busy, pinned, or never."""
    ttl_s: float
    """Idle TTL in force (0: never)."""
    pinned: bool
    external: bool = False
    url: str = ""
    detail: str = ""
    ram_bytes: int = 0
    """Host RAM booked for a model on the CPU (``gpus`` is then empty)."""
    replica: str = ""
    """"2/2" for the second of two engines serving one model; "" when one serves it."""
    box: str = ""
    """The paired box that serves it (its GPUs are that box's); "" for this box's own."""


@dataclasses.dataclass(frozen=True)
class Eviction:
    """A model the planner frees memory from: ``sleep`` (vLLM sleep mode) or ``stop``."""

    engine_id: str
    action: str
    frees_bytes: int
    gpus: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where the planner puts a model now, or exactly why it cannot."""

    model: str
    fits: bool
    gpus: tuple[int, ...] = ()
    evictions: tuple[Eviction, ...] = ()
    need_bytes_per_gpu: int = 0
    free_bytes_per_gpu: tuple[int, ...] = ()
    """Free (for traylm) on each chosen GPU before the evictions."""
    reason: str = ""
    retry_later: bool = False
    """Only busy models stand in the way: it may fit once their requests finish."""
    on_cpu: bool = False
    """The engine runs on the CPU: no GPU placement."""
    host_bytes: int = 0
    """Host RAM it takes on the CPU (its booking)."""


@dataclasses.dataclass(frozen=True)
class SetupProposal:
    """One model the first-run setup proposes to download (or find), start and chat with on
    this computer: GET /api/setup/proposals (engines/ondemand/proposals.py)."""

    name: str
    """The profile's name: what `traylm start NAME` takes."""
    repo_id: str
    title: str
    about: str
    kind: str
    """"preset" (a shipped profile this computer's GPUs can start) or "starter" (a small
    model for vLLM's CPU build, whose profile the setup writes)."""
    device: str  # cuda | cpu
    profile: Mapping[str, object]
    """The profile's fields (a starter's: those the setup writes), as in its TOML file."""
    placement: Placement | None = None
    """Where the planner puts a preset on the GPUs now, or why it cannot; None for a
    starter (no profile yet: the hub's fit in this computer's memory says it)."""


@dataclasses.dataclass(frozen=True)
class AttachedServer:
    """An OpenAI-compatible server traylm did not start: routed, health-checked, never started
    or stopped by traylm. The key is read from ``key_env`` and never stored."""

    name: str
    url: str
    key_env: str
    state: str  # ready | unreachable
    models: tuple[str, ...]
    detail: str = ""
    checked_at_s: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelStateChanged(Event):
    """A servable model was loaded, unloaded, put to sleep, woken, or failed to load."""

    kind: ClassVar[str] = "model.state"
    name: str
    engine_id: str
    status: ModelStatus
    state: str
    gpus: tuple[int, ...] = ()
    reason: str = ""
    """asked | request | idle | keep_alive | evicted | room | failed | crashed | attached
    (room: asleep or unloaded to make room for another program, engines/ondemand/room_maker.py)"""
    detail: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelLoading(Event):
    """A load in progress (at each phase change and every few seconds)."""

    kind: ClassVar[str] = "model.loading"
    name: str
    engine_id: str
    phase: str
    elapsed_s: float
    detail: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class AttachedChanged(Event):
    kind: ClassVar[str] = "attached.state"
    server: AttachedServer


@dataclasses.dataclass(frozen=True)
class FreedModel:
    """A model put to sleep or unloaded to make room for another program."""

    name: str
    engine_id: str
    action: str  # sleep | stop
    frees_bytes: int
    """Per GPU."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RoomMade(Event):
    """Another program needed memory on a GPU (engines/ondemand/room_maker.py).

    ``phase``: ``made`` (its idle models sleep or unloaded), ``kept`` (the models there answer
    requests or are pinned: none was touched), ``back`` (the program exited, the models are
    back), ``failed`` (a model could not be freed or brought back; it comes back on its next
    request). ``message`` is the sentence the tray shows."""

    kind: ClassVar[str] = "model.room"
    gpu: int
    """CUDA index, as profiles name GPUs."""
    program: str
    pid: int
    phase: str
    models: tuple[FreedModel, ...] = ()
    message: str = ""
