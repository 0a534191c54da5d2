"""``GPUFeature``: the daemon's GPU part. It builds the backend (NVML, the simulator with
``--simulate-gpus N``, or a replayed trace), runs the sampler thread, talks to traylm-gpud, runs
the thermal guard and the energy meter, and serves the /api/gpus routes (engines/gpu/routes.py).

With the simulator the feature also runs an in-process traylm-gpud on the same simulated GPUs
(a private socket in the state dir), so fan curves, power limits and the guard work end to end
without root; its status says "simulated". With real GPUs and no helper installed, everything is
read-only and the helper status says how to install it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
import time
from collections.abc import Coroutine, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp

from engines.config.live import SettingsEditor
from engines.config.sections import Settings
from engines.core.bus import EventBus
from engines.core.procs import descendants
from engines.core.store import Store
from engines.errors import ConfigError, GPUUnavailable, HelperUnavailable, TraylmError
from engines.events.core import EngineState, Notice
from engines.events.gpu import (
    EngineEnergy,
    GPUEnergyUpdated,
    GPUHelperChanged,
    GPUInfo,
    GPUProcess,
    GPUSnapshot,
    GPUState,
    HelperStatus,
    PSUStatus,
)
from engines.gpu import card_profile, efficiency
from engines.gpu.backend import GPUBackend, cuda_order
from engines.gpu.controls import GPUControls
from engines.gpu.efficiency import ProfileTarget
from engines.gpu.energy import (
    EnergyPoint,
    EnergyWindow,
    energy_now_mj,
    energy_per_token,
    parse_generation_tokens,
    psu_status,
)
from engines.gpu.guard import GuardThresholds, Step, ThermalGuard
from engines.gpu.guard_actions import DaemonGuardActions
from engines.gpu.helper_client import HelperClient
from engines.gpu.helper_core import HelperCore
from engines.gpu.helperd import HelperServer
from engines.gpu.history import TelemetryHistory
from engines.gpu.inventory import GPUInventory
from engines.gpu.prometheus import gpu_exposition
from engines.gpu.sampler import Sampler
from engines.gpu.sim import IDLE_USED_BYTES as SIM_BASELINE_BYTES
from engines.gpu.sim import MEMORY_TOTAL_BYTES as SIM_MEMORY_TOTAL_BYTES
from engines.gpu.sim import SimulatedBackend
from engines.runtime.supervisor import EngineView

if TYPE_CHECKING:
    from engines.runtime.supervisor import ManagedEngine

log = logging.getLogger(__name__)

ENERGY_PERIOD_S = 2.0
SIM_HOLDING = frozenset(
    {EngineState.STARTING, EngineState.READY, EngineState.SLEEPING, EngineState.STOPPING}
)
PSU_NOTICE_EVERY_S = 900.0
FRESH_SAMPLE_TIMEOUT_S = 5.0
"""The longest placement waits for a GPU sample newer than an engine's stop."""


def build_backend(settings: Settings) -> GPUBackend:
    g = settings.gpu
    if g.replay_file:
        from engines.gpu.replay import ReplayBackend

        return ReplayBackend(Path(g.replay_file).expanduser(), retime=True, loop=True)
    if g.simulate_gpus > 0:
        card = card_profile.load(Path(g.simulate_card).expanduser()) if g.simulate_card else None
        return SimulatedBackend(g.simulate_gpus, driver=g.simulate_driver or None, card=card)
    from engines.gpu.nvml import NVMLBackend

    return NVMLBackend()


class GatewayControl(Protocol):
    """What the GPU feature asks of the gateway (engines/gateway/service.py GatewayContext)."""

    @property
    def paused(self) -> str | None: ...

    def pause_requests(self, reason: str) -> None: ...

    def resume_requests(self) -> None: ...

    def in_flight(self, engine_id: str) -> int: ...


class GPUFeature:
    name = "gpu"

    def __init__(
        self,
        *,
        settings: SettingsEditor,
        bus: EventBus,
        store: Store,
        engines: EngineView,
        gateway: GatewayControl,
        state_dir: Path,
        backend: GPUBackend | None = None,
    ) -> None:
        """No I/O. ``backend``: use this one instead of the one the settings name (tests)."""
        self.settings = settings
        self.bus = bus
        self.gateway = gateway
        self._engines = engines
        self._state_dir = state_dir
        self.local_helper: HelperServer | None = None
        self.helper: HelperClient | None = None
        self.energy: dict[str, EngineEnergy] = {}
        self._windows: dict[str, EnergyWindow] = {}
        self._energy_published_s: dict[str, float] = {}
        self._guard_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._energy_task: asyncio.Task[None] | None = None
        self._psu_notice_s = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        current = settings.current
        self.backend = backend or build_backend(current)
        self.inventory = GPUInventory(self.backend)
        """The machine's GPUs for every other part (hub fit, TensorRT-LLM checks)."""
        self.guard = ThermalGuard(
            GuardThresholds.from_settings(current.gpu), simulated=self.backend.simulated
        )
        self.history = TelemetryHistory(
            store,
            resolution_s=current.gpu.history_resolution_s,
            keep_days=current.gpu.history_days,
            max_rows=current.gpu.history_max_rows,
        )
        self.sampler = Sampler(
            self.backend,
            interval_s=current.gpu.sample_interval_s,
            process_interval_s=current.gpu.process_interval_s,
            publish=bus.publish_threadsafe,
            on_sample=self._on_sample_threadsafe,
            history=self.history,
            engine_pids=self._engine_pids,
        )
        self.actions = DaemonGuardActions(
            infos=self.infos,
            helper=lambda: self.helper,
            require_helper=self.require_helper,
            gateway=gateway,
            engines=engines,
            engine_gpus=self.engine_gpus,
        )
        self.controls = GPUControls(
            require_helper=self.require_helper,
            publish=bus.publish,
            simulated=self.backend.simulated,
        )
        """Fan curves and power limits, set through the root helper (the /api/gpus routes)."""
        settings.subscribe(self._on_settings)

    def _on_settings(self, settings: Settings) -> None:
        self.guard.thresholds = GuardThresholds.from_settings(settings.gpu)

    def exposition(self) -> Iterator[str]:
        """GPU gauges, lines of the Prometheus text format (a /metrics collector)."""
        return gpu_exposition(self.sampler, self.energy)

    # ----------------------------------------------------------------- Feature protocol

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self._start_helper()
        self.sampler.start()
        self._energy_task = asyncio.create_task(self._energy_loop(), name="gpu energy")

    async def stop(self) -> None:
        if self._energy_task is not None:
            self._energy_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._energy_task
        await asyncio.to_thread(self.sampler.stop)
        for task in list(self._tasks):
            task.cancel()
        if self.helper is not None:
            await self.helper.stop()
        if self.local_helper is not None:
            await self.local_helper.stop()
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
        await asyncio.to_thread(self.backend.close)

    # ----------------------------------------------------------------- helper

    async def _start_helper(self) -> None:
        on_change = self._on_helper_change
        if isinstance(self.backend, SimulatedBackend):
            socket_path = self._private_socket()
            core = HelperCore(self.backend, self._state_dir / "gpud-sim")
            server = HelperServer(core, socket_path, interval_s=1.0)
            try:
                await server.start()
                self.local_helper = server
            except (OSError, TraylmError) as exc:  # the daemon still runs, read-only
                log.error("the in-process traylm-gpud for the simulator did not start: %s", exc)
            self.helper = HelperClient(
                socket_path, on_change=on_change, label="in-process, on the simulated GPUs"
            )
        elif self.backend.name == "replay":
            self.helper = None
            return
        else:
            path = Path(self.settings.current.gpu.helper_socket)
            self.helper = HelperClient(path, on_change=on_change)
        await self.helper.start()

    def _private_socket(self) -> Path:
        path = self._state_dir / "gpud-sim.sock"
        if len(str(path)) < 100:  # AF_UNIX paths are limited to 107 bytes
            path.parent.mkdir(parents=True, exist_ok=True)
            return path
        self._tmpdir = tempfile.TemporaryDirectory(prefix="traylm-gpud-")
        return Path(self._tmpdir.name) / "gpud.sock"

    def _on_helper_change(self, status: HelperStatus) -> None:
        log.info(
            "traylm-gpud: %s", status.detail if status.available else "unavailable (read-only)"
        )
        self.bus.publish(GPUHelperChanged(status=status))

    def helper_status(self) -> HelperStatus:
        if self.helper is not None:
            return self.helper.status
        return HelperStatus(
            available=False,
            detail="the GPUs are a replayed trace: nothing can be controlled",
            backend=self.backend.name,
            simulated=True,
        )

    def require_helper(self) -> HelperClient:
        if self.helper is None:
            raise HelperUnavailable(self.helper_status().detail)
        return self.helper

    # ----------------------------------------------------------------- GPUs

    def infos(self) -> tuple[GPUInfo, ...]:
        if not self.sampler.infos:
            raise GPUUnavailable(self.sampler.message)
        return self.sampler.infos

    async def efficiency_targets(self, name: object) -> tuple[ProfileTarget, ...]:
        """Efficiency profile ``name`` resolved on these GPUs, checked before any write:
        ConfigError for an unknown name, a user's file that cannot be used or a value outside
        a card's range; GPUUnavailable when there are no GPUs."""
        profiles, problems = await asyncio.to_thread(efficiency.scan_profiles)
        if isinstance(name, str) and name not in profiles and name in problems:
            raise ConfigError(f"efficiency profile {name!r} cannot be used: {problems[name]}")
        if not isinstance(name, str) or name not in profiles:
            raise ConfigError(f"no efficiency profile {name!r}; profiles: {', '.join(profiles)}")
        return efficiency.resolve(profiles[name], self.infos())

    async def apply_efficiency(self, name: object) -> list[str]:
        """Put efficiency profile ``name`` on every GPU (through the helper); their UUIDs."""
        targets = await self.efficiency_targets(name)  # ConfigError unless a profile's name
        await self.controls.apply_profile(str(name), targets)
        return [t.info.uuid for t in targets]

    def efficiency_in_force(self) -> str | None:
        """The efficiency profile in force on every GPU (None: none, or they differ)."""
        return self.controls.profile([i.uuid for i in self.infos()])

    def engine_gpus(self, engine: ManagedEngine) -> tuple[str, ...]:
        """UUIDs of the GPUs an engine uses (profile.gpus are CUDA indices in PCI order). An
        engine on the CPU uses none, on simulated GPUs too: it must not be drawn holding GPU
        memory it never touches."""
        if engine.runtime.device != "cuda":
            return ()
        order = cuda_order(self.sampler.infos)
        return tuple(order[i].uuid for i in engine.profile.gpus if 0 <= i < len(order))

    async def sample_after(self, after_s: float) -> None:
        """Wait (at most FRESH_SAMPLE_TIMEOUT_S) until the latest snapshots were read after
        ``after_s`` (monotonic; an engine's stop), so that placement does not count the memory
        the stopped engine held as another program's. Simulated GPUs are first made to look like
        the engines now, as a real card frees the memory when the process exits."""
        if self.sampler.state != GPUState.OK:
            return
        if isinstance(self.backend, SimulatedBackend):  # it shows the engines of now from now on
            self._drive_simulator()
            after_s = max(after_s, time.monotonic())
        if self.sampler.sampled_at_s > after_s:
            return
        fresh = self.sampler.sample_after
        if not await asyncio.to_thread(fresh, after_s, FRESH_SAMPLE_TIMEOUT_S):
            log.info("no GPU sample within %.0f s of an engine's stop", FRESH_SAMPLE_TIMEOUT_S)

    def _engine_pids(self) -> Mapping[int, str]:
        """pid → engine id for every engine process and its children (sampler thread)."""
        out: dict[int, str] = {}
        for engine in list(self._engines.engines.values()):
            pid = engine.pid
            if not pid or engine.state == EngineState.STOPPED:
                continue
            out[pid] = engine.engine_id
            for child in descendants(pid):
                out[child.pid] = engine.engine_id
        return out

    # ----------------------------------------------------------------- per sample (loop)

    def _on_sample_threadsafe(self, snaps: tuple[GPUSnapshot, ...]) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._on_sample, snaps)

    def _on_sample(self, snaps: tuple[GPUSnapshot, ...]) -> None:
        if self._guard_lock.locked():
            return  # the previous step is still acting (stopping an engine takes seconds)
        infos = {i.uuid: i for i in self.sampler.infos}
        steps = self.guard.evaluate(snaps, infos, time.time())
        if steps:
            self._spawn(self._act(steps))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _act(self, steps: list[Step]) -> None:
        async with self._guard_lock:
            events = await self.guard.act(steps, self.actions)
        for event in events:
            self.bus.publish(event)
            self.bus.publish(
                Notice(
                    level="warning" if event.ok else "error",
                    title=f"Thermal guard: GPU {event.gpu_index}",
                    message=event.detail,
                    source="gpu.guard",
                )
            )

    # ----------------------------------------------------------------- energy

    async def _energy_loop(self) -> None:
        timeout = aiohttp.ClientTimeout(total=2.0)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while True:
                await asyncio.sleep(ENERGY_PERIOD_S)
                try:
                    await self._energy_tick(http)
                    self._check_psu()
                except TraylmError as exc:
                    log.debug("energy update skipped: %s", exc.message)

    async def _energy_tick(self, http: aiohttp.ClientSession) -> None:
        settings = self.settings.current.energy
        live = {}
        for engine in list(self._engines.engines.values()):
            gpus = self.engine_gpus(engine)
            if engine.state != EngineState.READY or not engine.base_url or not gpus:
                continue
            live[engine.engine_id] = (engine, gpus)
        for engine_id in set(self._windows) - set(live):
            self._windows.pop(engine_id, None)
            self.energy.pop(engine_id, None)
        if isinstance(self.backend, SimulatedBackend):
            self._drive_simulator()
        for engine_id, (engine, gpus) in live.items():
            tokens = await _scrape_tokens(http, engine.metrics_url, engine.profile.engine)
            at_s = time.time()
            energy = energy_now_mj(self.sampler.latest, gpus, at_s)
            if tokens is None or energy is None:
                continue
            window = self._windows.setdefault(engine_id, EnergyWindow(settings.window_s))
            window.window_s = max(5.0, settings.window_s)
            window.add(EnergyPoint(at_s, energy, tokens))
            span = window.span()
            if span is None:
                continue
            result = energy_per_token(
                engine_id,
                *span,
                gpus=gpus,
                price_per_kwh=settings.electricity_price_per_kwh,
                currency=settings.currency,
                simulated=self.backend.simulated,
            )
            self.energy[engine_id] = result
            if at_s - self._energy_published_s.get(engine_id, 0.0) >= window.window_s:
                self._energy_published_s[engine_id] = at_s
                self.bus.publish(GPUEnergyUpdated(energy=result, psu=self.psu()))

    def _drive_simulator(self) -> None:
        """Make the simulated GPUs look like the engines on them: their processes, the memory
        each holds by its engine's own rule (vLLM: gpu_memory_utilization of the card; asleep:
        what sleep mode leaves), and a load that follows the requests in flight."""
        assert isinstance(self.backend, SimulatedBackend)
        per_gpu: dict[str, list[GPUProcess]] = {i.uuid: [] for i in self.sampler.infos}
        in_flight: dict[str, int] = dict.fromkeys(per_gpu, 0)
        for engine in list(self._engines.engines.values()):
            gpus = self.engine_gpus(engine)
            if engine.state not in SIM_HOLDING or not engine.pid or not gpus:
                continue
            held = simulated_hold_bytes(engine, self.backend.reserved_bytes)
            for uuid in gpus:
                per_gpu[uuid].append(GPUProcess(pid=engine.pid, used_memory_bytes=held))
                if engine.state == EngineState.READY:
                    in_flight[uuid] += self.gateway.in_flight(engine.engine_id)
        for uuid, procs in per_gpu.items():
            self.backend.set_processes(uuid, procs)
            busy = in_flight[uuid]
            load = min(1.0, 0.35 + 0.15 * busy) if busy else (0.02 if procs else 0.0)
            memory = SIM_BASELINE_BYTES + sum(p.used_memory_bytes or 0 for p in procs)
            self.backend.set_load(uuid, load, memory, from_traffic=True)

    def psu(self) -> PSUStatus | None:
        latest = [s for s in self.sampler.latest if s.power_draw_mw is not None]
        if not latest:
            return None
        e = self.settings.current.energy
        return psu_status(
            latest,
            psu_watts=e.psu_watts,
            other_watts=e.other_watts,
            warn_fraction=e.psu_warn_fraction,
        )

    def _check_psu(self) -> None:
        status = self.psu()
        now = time.monotonic()
        if status is None or not status.warning or now - self._psu_notice_s < PSU_NOTICE_EVERY_S:
            return
        self._psu_notice_s = now
        log.warning("PSU headroom: %s", status.warning)
        self.bus.publish(
            Notice(
                level="warning",
                title="Power supply headroom",
                message=status.warning,
                source="gpu.psu",
            )
        )


def simulated_hold_bytes(engine: ManagedEngine, reserved_bytes: int) -> int:
    """What a simulated RTX 4090 shows an engine holding, by its adapter's memory rule, on
    the card as CUDA sees it (less the driver's ``reserved_bytes``)."""
    total = SIM_MEMORY_TOTAL_BYTES - reserved_bytes
    free = total - SIM_BASELINE_BYTES
    need = engine.adapter.memory_need(
        engine.profile, total_bytes=total, free_bytes=free, weights_bytes=None
    )
    if engine.state == EngineState.SLEEPING and need.sleep_residual_bytes is not None:
        return need.sleep_residual_bytes
    return min(need.hold_bytes, free)


async def _scrape_tokens(http: aiohttp.ClientSession, url: str | None, engine: str) -> float | None:
    """The engine's generated tokens from its Prometheus route; an engine without one (None)
    is never polled: TensorRT-LLM's /metrics is JSON and drains its iteration stats."""
    if url is None:
        return None
    try:
        async with http.get(url) as resp:
            if resp.status != 200:
                return None
            return parse_generation_tokens(await resp.text(), engine)
    except (aiohttp.ClientError, TimeoutError):
        return None
