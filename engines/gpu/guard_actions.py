"""What the thermal guard may do: notify, lower a power limit through traylm-gpud, pause the
gateway, stop the engines on a hot GPU, and undo the first three once it has cooled."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from engines.errors import TraylmError
from engines.events.core import EngineState
from engines.events.gpu import GPUInfo, GuardLevel
from engines.gpu.guard import PAUSE_PREFIX, Step
from engines.gpu.helper_client import HelperClient
from engines.gpu.power import percent_of_default
from engines.runtime.supervisor import EngineView

if TYPE_CHECKING:
    from engines.runtime.supervisor import ManagedEngine


class Pausable(Protocol):
    """The gateway's pause switch (engines/gateway/service.py GatewayContext)."""

    @property
    def paused(self) -> str | None: ...

    def pause_requests(self, reason: str) -> None: ...

    def resume_requests(self) -> None: ...


class DaemonGuardActions:
    """The guard's actions on this daemon. Keeps which GPUs asked for the pause: the gateway
    accepts requests again once the last of them has cooled."""

    def __init__(
        self,
        *,
        infos: Callable[[], Sequence[GPUInfo]],
        helper: Callable[[], HelperClient | None],
        require_helper: Callable[[], HelperClient],
        gateway: Pausable,
        engines: EngineView,
        engine_gpus: Callable[[ManagedEngine], tuple[str, ...]],
    ) -> None:
        self._infos = infos
        self._helper = helper
        self._require_helper = require_helper
        self._gateway = gateway
        self._engines = engines
        self._engine_gpus = engine_gpus
        self.paused_by: set[str] = set()
        """UUIDs of the GPUs whose heat paused the gateway."""

    async def notice(self, step: Step, text: str) -> str:
        return text

    async def lower_power(self, step: Step, power_pct: float) -> str:
        info = next(i for i in self._infos() if i.uuid == step.uuid)
        limit = percent_of_default(info, power_pct)
        default = info.power_default_mw or info.power_max_mw
        if limit is None or default is None:
            return f"GPU {step.index} reports no power limits; the power step is skipped"
        helper = self._require_helper()
        await helper.request("apply_power", gpu=step.uuid, limit_mw=limit, source="guard")
        return (
            f"power limit of GPU {step.index} lowered to {limit / 1000:g} W "
            f"(was {default / 1000:g} W)"
        )

    async def pause(self, step: Step, reason: str) -> str:
        self.paused_by.add(step.uuid)
        self._gateway.pause_requests(reason)
        return "new requests are paused at the gateway (503 with Retry-After)"

    async def stop_engines(self, step: Step) -> str:
        stopped = []
        for engine in list(self._engines.engines.values()):
            if engine.state in (EngineState.STOPPED, EngineState.FAILED):
                continue
            if step.uuid in self._engine_gpus(engine):
                await engine.stop("thermal guard")
                stopped.append(engine.engine_id)
        if not stopped:
            return f"no running engine uses GPU {step.index}"
        return f"stopped engine(s) {', '.join(stopped)} on GPU {step.index}"

    async def stand_down(self, step: Step) -> str:
        done = [f"GPU {step.index} cooled to {step.temperature_c} °C"]
        if step.uuid in self.paused_by:
            self.paused_by.discard(step.uuid)
            ours = (self._gateway.paused or "").startswith(PAUSE_PREFIX)
            if not self.paused_by and ours:
                self._gateway.resume_requests()
                done.append("the gateway accepts requests again")
        helper = self._helper()
        if step.previous >= GuardLevel.POWER and helper is not None:
            try:
                await helper.request("restore_power", gpu=step.uuid, source="guard")
                done.append("its power limit is back")
            except TraylmError as exc:
                done.append(f"its power limit could not be restored: {exc.message}")
        return "; ".join(done)
