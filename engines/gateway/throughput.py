"""The gateway's live throughput as events (``GatewayThroughput``), for the tray and the
dashboard: they ask the daemon instead of scraping and parsing /metrics.

A reporter task runs only while the gateway has traffic: the first request to take a slot after
none wakes it (``Admission.on_busy``), it publishes a snapshot every ``period_s`` and, once no
request runs or waits and no token was counted since its last snapshot, one snapshot of zeros,
and ends. An idle daemon has no such task: it neither wakes up nor publishes.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Mapping

from engines.core.metrics import Counter, Labels
from engines.events.codec import Event
from engines.events.gateway import EngineLoad, GatewayThroughput, ModelRate
from engines.gateway.admission import Admission

PERIOD_S = 1.0
WINDOW_S = 10.0
"""The rate is the token counter's growth over at most this many seconds (tokens are counted
when a request ends, so a shorter window jumps with every end)."""

Totals = dict[str, float]


class ThroughputReporter:
    """Publishes ``GatewayThroughput`` while requests run (see the module docstring)."""

    def __init__(
        self,
        *,
        tokens: Counter,
        admissions: Mapping[str, Admission],
        publish: Callable[[Event], None],
        period_s: float = PERIOD_S,
        window_s: float = WINDOW_S,
    ) -> None:
        """``tokens``: the gateway's generated-tokens counter (label ``model``);
        ``admissions``: the gateway's queue per upstream, read at each snapshot."""
        self._tokens = tokens
        self._admissions = admissions
        self._publish = publish
        self.period_s = period_s
        self.window_s = window_s
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None

    def busy(self) -> None:
        """A request took a slot after none ran: report until the traffic stops."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._report(), name="gateway throughput"
            )

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _report(self) -> None:
        try:
            await self._snapshots()
        finally:  # ended in any way: the next request after none starts a new reporter
            if self._task is asyncio.current_task():
                self._task = None

    async def _snapshots(self) -> None:
        window: collections.deque[tuple[float, Totals]] = collections.deque()
        window.append((time.monotonic(), self._totals()))
        while True:
            await asyncio.sleep(self.period_s)
            now_s, totals = time.monotonic(), self._totals()
            grew = totals != window[-1][1]
            window.append((now_s, totals))
            while len(window) > 2 and now_s - window[1][0] >= self.window_s:
                window.popleft()
            loads = self._loads()
            if not loads and not grew:
                self._task = None  # before the publish: a request from now on starts anew
                self._publish(GatewayThroughput(tokens_per_s=0.0, in_flight=0))
                return
            first_s, first = window[0]
            rates = tuple(
                ModelRate(model, (total - first.get(model, 0.0)) / (now_s - first_s))
                for model, total in sorted(totals.items())
                if total > first.get(model, 0.0)
            )
            self._publish(
                GatewayThroughput(
                    tokens_per_s=sum(r.tokens_per_s for r in rates),
                    in_flight=sum(load.in_flight for load in loads),
                    models=rates,
                    engines=loads,
                )
            )

    def _totals(self) -> Totals:
        totals: Totals = {}
        for labels, value in self._tokens.values.items():
            model = _label(labels, "model")
            totals[model] = totals.get(model, 0.0) + value
        return totals

    def _loads(self) -> tuple[EngineLoad, ...]:
        return tuple(
            EngineLoad(engine_id, adm.in_flight, adm.waiting)
            for engine_id, adm in sorted(self._admissions.items())
            if adm.in_flight or adm.waiting
        )


def _label(labels: Labels, name: str) -> str:
    return next((value for key, value in labels if key == name), "")
