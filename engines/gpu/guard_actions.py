"""What the thermal guard may do to the daemon: notify, lower a power limit through traylm-gpud,
pause the gateway, stop the engines on a hot GPU, and undo the first three once it has cooled."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engines.errors import TraylmError
from engines.events.core import EngineState
from engines.events.gpu import GuardLevel
from engines.gateway.app import Pause
from engines.gpu.guard import Step

if TYPE_CHECKING:
    from engines.gpu.service import GPUFeature


class DaemonGuardActions:
    def __init__(self, feature: GPUFeature) -> None:
        self.feature = feature

    async def notice(self, step: Step, text: str) -> str:
        return text

    async def lower_power(self, step: Step, power_pct: float) -> str:
        info = next(i for i in self.feature.infos() if i.uuid == step.uuid)
        default = info.power_default_mw or info.power_max_mw
        if default is None:
            return f"GPU {step.index} reports no power limits; the power step is skipped"
        limit = round(default * power_pct / 100)
        if info.power_min_mw is not None:
            limit = max(limit, info.power_min_mw)
        helper = self.feature.require_helper()
        await helper.request("apply_power", gpu=step.uuid, limit_mw=limit, source="guard")
        return (
            f"power limit of GPU {step.index} lowered to {limit / 1000:g} W "
            f"(was {default / 1000:g} W)"
        )

    async def pause(self, step: Step, reason: str) -> str:
        ctx = self.feature.daemon.ctx
        if ctx is None:
            return "the gateway is not serving; nothing to pause"
        self.feature._paused_by.add(step.uuid)
        ctx.pause = Pause(reason)
        return "new requests are paused at the gateway (503 with Retry-After)"

    async def stop_engines(self, step: Step) -> str:
        daemon = self.feature.daemon
        stopped = []
        for engine in list(daemon.supervisor.engines.values()):
            if engine.state in (EngineState.STOPPED, EngineState.FAILED):
                continue
            if step.uuid in self.feature.engine_gpus(engine):
                await daemon.engine(engine.engine_id).stop("thermal guard")
                stopped.append(engine.engine_id)
        if not stopped:
            return f"no running engine uses GPU {step.index}"
        return f"stopped engine(s) {', '.join(stopped)} on GPU {step.index}"

    async def stand_down(self, step: Step) -> str:
        done = [f"GPU {step.index} cooled to {step.temperature_c} °C"]
        feature = self.feature
        if step.uuid in feature._paused_by:
            feature._paused_by.discard(step.uuid)
            ctx = feature.daemon.ctx
            ours = (
                ctx is not None
                and ctx.pause is not None
                and ctx.pause.reason.startswith("thermal guard")
            )
            if not feature._paused_by and ours and ctx is not None:
                ctx.pause = None
                done.append("the gateway accepts requests again")
        if step.previous >= GuardLevel.POWER and feature.helper is not None:
            try:
                await feature.helper.request("restore_power", gpu=step.uuid, source="guard")
                done.append("its power limit is back")
            except TraylmError as exc:
                done.append(f"its power limit could not be restored: {exc.message}")
        return "; ".join(done)
