"""The tuner's power-limit candidates, held on the candidate's GPUs while it is measured.

A power candidate (``Candidate.power_pct``) runs the profile as it is, with the power limit of
the GPUs its engine was placed on set to a share of each card's default. The limit is set
through traylm-gpud in the helper's ``tune`` layer (engines/gpu/helper_core.py LAYERS): above the
user's own limit (a lease or a persisted one), below the thermal guard's. Lifting that layer gives
back exactly what was there before; the helper drops it by itself when the daemon's connection
goes away (the daemon crashed mid-tune), as it does with leases.

No profile setting holds a power limit (it belongs to the card, not to one model), so
`traylm tune --apply` of a power candidate makes the limits it was measured with the GPUs'
persisted limits (as `traylm power set WATTS --gpu G` does), and `--undo` puts back the persisted
limits they replaced (or the default where there was none).
"""

from __future__ import annotations

from engines.errors import TraylmError, TuneError
from engines.gpu.power import percent_of_default
from engines.gpu.service import GPUFeature
from engines.runtime.supervisor import ManagedEngine


class PowerLimits:
    """The limits the tuner holds now (the UUIDs it set one on)."""

    def __init__(self, gpu: GPUFeature) -> None:
        """No I/O."""
        self._gpu = gpu
        self._held: set[str] = set()
        self.measured: dict[int, dict[str, int]] = {}
        """Power candidate's % → the limits it was measured with, by GPU UUID."""

    def refusal(self) -> str | None:
        """Why no power limit can be set here (no traylm-gpud), or None."""
        status = self._gpu.helper_status()
        if status.available:
            return None
        return f"setting a power limit needs traylm-gpud: {status.detail}"

    async def hold(self, engine: ManagedEngine, pct: int) -> str:
        """Set ``pct`` % of the default limit on every GPU ``engine`` runs on; what was set, in
        words. TuneError when it cannot be (the measurement is then a failed one)."""
        uuids = self._gpu.engine_gpus(engine)
        if not uuids:
            raise TuneError("the engine runs on no GPU, so a power limit changes nothing")
        infos = {i.uuid: i for i in self._gpu.infos()}
        helper = self._gpu.require_helper()
        said, limits = [], {}
        for uuid in uuids:
            info = infos[uuid]
            limit = percent_of_default(info, pct)
            if limit is None:
                raise TuneError(f"GPU {info.index} reports no power limits")
            self._held.add(uuid)  # before the request: a cancel while it is sent still lifts it
            try:
                await helper.request(
                    "apply_power", gpu=uuid, limit_mw=limit, persist=False, source="tune"
                )
            except TraylmError as exc:
                raise TuneError(f"the power limit was not set: {exc.message}") from None
            said.append(f"GPU {info.index} at {limit / 1000:g} W")
            limits[uuid] = limit
        self.measured[pct] = limits  # this run's placement (an earlier tune's is forgotten)
        return ", ".join(said)

    async def release(self) -> str:
        """Lift every limit the tuner set (each GPU back to what it had before): "" or what
        could not be lifted (the helper lifts it when the daemon's connection closes)."""
        problems = []
        helper = self._gpu.helper
        for uuid in sorted(self._held):
            try:
                if helper is not None:
                    await helper.request("restore_power", gpu=uuid, source="tune")
            except TraylmError as exc:
                problems.append(f"the power limit of GPU {uuid} was not restored: {exc.message}")
        self._held.clear()
        return "; ".join(problems)

    async def persist(self, pct: int) -> dict[str, int | None]:
        """Make the limits the ``pct`` candidate was measured with the GPUs' persisted ones;
        the persisted limits they replace, by UUID (None: there was none, the default)."""
        limits = self.measured.get(pct)
        if not limits:
            raise TuneError("the power candidate was not measured on any GPU")
        helper = self._gpu.require_helper()
        status = await helper.refresh()
        before = {p.uuid: p.limit_mw for p in status.power if p.persist}
        previous = {uuid: before.get(uuid) for uuid in limits}
        done: dict[str, int | None] = {}
        try:
            for uuid, limit in limits.items():
                await helper.request("apply_power", gpu=uuid, limit_mw=limit, persist=True)
                done[uuid] = previous[uuid]
        except TraylmError:
            await self.put_back(done)  # all GPUs or none
            raise
        return previous

    async def put_back(self, previous: dict[str, int | None]) -> str:
        """Put back the persisted limits ``persist`` replaced; what was done, in words."""
        helper = self._gpu.require_helper()
        said = []
        for uuid, limit in previous.items():
            if limit is None:
                await helper.request("restore_power", gpu=uuid, source="user")
                said.append(f"{uuid} to its default")
            else:
                await helper.request("apply_power", gpu=uuid, limit_mw=limit, persist=True)
                said.append(f"{uuid} to {limit / 1000:g} W")
        await helper.refresh()
        return "power limit of " + ", ".join(said)
