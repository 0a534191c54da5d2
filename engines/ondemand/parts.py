"""What models on demand uses of the daemon's parts that are built after it.

Models on demand is the gateway's router, and engine control, the hub and the GPU feature
place through it, so the daemon builds it first; yet it starts engines through engine control,
reads each engine's traffic from the gateway, the GPUs from the GPU feature and the models from
the hub. That cycle is closed once: the daemon builds the others, then hands them over with
``ModelsOnDemand.connect(Parts(...))`` before anything starts. Each protocol names what this
feature asks of a part, and nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from engines.config.profiles import Profile
from engines.events.core import EngineStatus
from engines.events.gpu import GPUSnapshot
from engines.events.hub import LocalFolder, LocalModel
from engines.gpu.inventory import Inventory


class EngineStarts(Protocol):
    """Engine control (control/service.py EngineControl)."""

    async def start_engine(self, profile: Profile, *, placed: bool = False) -> EngineStatus:
        """Start a profile; ``placed``: its GPUs are chosen already (by this feature)."""
        ...

    async def check_start(self, profile: Profile) -> None:
        """Every check of a start that needs no placement: the engine env, trust, a Hub model
        that cannot be fetched offline, the flags. Raises TraylmError."""
        ...


class Traffic(Protocol):
    """The gateway's admissions (gateway/service.py GatewayContext)."""

    def activity(self, upstream: str) -> tuple[int, int, float | None]:
        """(in flight, queued, monotonic time idle since or None) for one upstream."""
        ...


class Samples(Protocol):
    """The GPU sampler (gpu/sampler.py)."""

    @property
    def latest(self) -> tuple[GPUSnapshot, ...]: ...


class GPUs(Protocol):
    """The GPU feature (gpu/service.py GPUFeature): its inventory and its latest samples,
    fresh ones on demand."""

    @property
    def inventory(self) -> Inventory: ...

    @property
    def sampler(self) -> Samples: ...

    async def sample_after(self, after_s: float) -> None:
        """Wait (bounded) until the latest samples were read after ``after_s`` (monotonic)."""
        ...


class LibraryModels(Protocol):
    """The hub library (hub/library.py)."""

    def models(self) -> list[LocalModel]:
        """The downloaded models (blocking)."""
        ...


class RegisteredFolders(Protocol):
    """The registered model folders (hub/folders.py)."""

    def list(self) -> list[LocalFolder]:
        """Every registered folder, with what is wrong with it (blocking)."""
        ...


class HubModels(Protocol):
    """The hub feature (hub/service.py HubFeature): its library and its model folders."""

    @property
    def library(self) -> LibraryModels: ...

    @property
    def folders(self) -> RegisteredFolders: ...


@dataclass(frozen=True)
class Parts:
    """The parts built after models on demand that it uses, handed over once."""

    control: EngineStarts
    gateway: Traffic
    gpus: GPUs
    hub: HubModels
