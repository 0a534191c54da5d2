"""The watch of a ready engine: once a second (every 3 s while it is healthy and idle) it looks
at the process, /health, the replies relayed to it, its token counters and its processes'
vitals, and returns the verdict once it exited, failed /health, hung or stopped
(engines/runtime/liveness.py). A crash is seen at once: the leader's exit wakes the wait."""

from __future__ import annotations

import time
from collections.abc import Callable

import aiohttp

from engines.config.sections import EngineSettings
from engines.core.procs import exit_code
from engines.events.core import EngineState
from engines.runtime.adapters.base import LaunchSpec
from engines.runtime.liveness import Evidence, Health, Liveness, Verdict
from engines.runtime.ports import Ranks
from engines.runtime.probe import probe, token_counters
from engines.runtime.process import EngineProcess
from engines.runtime.supervision import Supervision
from engines.runtime.traffic import EngineTraffic

WATCH_PERIOD_S = 1.0  # once ready: /health twice in a row failing = crashed within 2 s
QUIET_WATCH_PERIOD_S = 3.0  # ready, healthy, no request in flight: a crash is seen at once
# (the exit wait), a hang waits for the next look; a request or one bad look: WATCH_PERIOD_S
DESCENDANTS_READY_PERIOD_S = 5.0  # once ready the tree rarely changes; the scan reads every process


class Watch:
    """The watch of one ready life of an engine."""

    def __init__(
        self,
        engine_id: str,
        process: EngineProcess,
        spec: LaunchSpec,
        *,
        base_url: str | None,
        metrics_url: str | None,
        engine: str,
        settings: EngineSettings,
        traffic: EngineTraffic | None,
        ranks: Ranks | None,
        supervision: Supervision,
        state: Callable[[], EngineState],
        looked: Callable[[], None],
    ) -> None:
        """``engine``: the engine's name (its token counters); ``state``: the engine's state
        now (asleep, it is not judged); ``looked``: told after each look that found it well."""
        self.engine_id = engine_id
        self._process = process
        self._spec = spec
        self._base_url = base_url
        self._metrics_url = metrics_url
        self._engine = engine
        self._settings = settings
        self._traffic = traffic
        self._ranks = ranks
        self._supervision = supervision
        self._state = state
        self._looked = looked

    async def verdict(self) -> Verdict:
        """Return why, once the ready engine exits, fails /health, hangs or is stopped."""
        proc = self._process.proc
        liveness = Liveness(self._settings.stall_timeout_s)
        looked_s, scanned_s = time.monotonic(), 0.0  # replies of an earlier life do not count
        period_s = WATCH_PERIOD_S
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.5)) as http:
            while True:
                code = await exit_code(proc, period_s)
                if code is not None:
                    return Verdict("crashed", f"process exited with code {code}")
                if self._ranks is not None and (why := self._ranks.problem()):
                    return Verdict("crashed", why)
                if self._state() == EngineState.SLEEPING:  # asleep or waking: no replies,
                    liveness = Liveness(self._settings.stall_timeout_s)  # /health slow while
                    continue  # it moves weights; judged afresh once it serves again
                health = await self._health(http, looked_s)
                now = looked_s = time.monotonic()
                look = await self._evidence(http, now, health, liveness)
                verdict = liveness.look(look)
                if verdict is not None:
                    return verdict
                quiet = health == Health.OK and not look.in_flight
                period_s = QUIET_WATCH_PERIOD_S if quiet else WATCH_PERIOD_S
                tree_known = True  # the last scan worked: the next is due later
                if now - scanned_s >= DESCENDANTS_READY_PERIOD_S:
                    tree_known = await self._process.track_descendants()  # failed: next look
                    scanned_s = now if tree_known else scanned_s
                if tree_known and health != Health.UNKNOWN:
                    self._supervision.over()
                self._looked()

    async def _health(self, http: aiohttp.ClientSession, looked_s: float) -> Health:
        traffic = self._traffic
        replied_s = traffic.last_reply_byte_s(self.engine_id) if traffic is not None else 0.0
        if replied_s > looked_s:  # replies flowed since the last look: it serves
            return Health.OK
        return await probe(http, self._base_url, self._spec.health_path, self._supervision.trouble)

    async def _evidence(
        self, http: aiohttp.ClientSession, now: float, health: Health, liveness: Liveness
    ) -> Evidence:
        look = Evidence(now, health)
        traffic = self._traffic
        if traffic is not None:
            look.in_flight = traffic.in_flight(self.engine_id)
            look.streams = traffic.streams(self.engine_id)
            look.last_reply_byte_s = traffic.last_progress_s(self.engine_id)
        if health == Health.SILENT or liveness.wants_counters(
            now, in_flight=look.in_flight, last_reply_byte_s=look.last_reply_byte_s
        ):
            look.counters = await token_counters(http, self._metrics_url, self._engine)
        look.leader_cpu_s, look.stopped = await self._process.vitals()
        return look
