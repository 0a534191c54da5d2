"""Benchmark runs (engines/bench/routes.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from engines.client.base import ClientBase, api_path
from engines.events.bench import BenchConfig, BenchProgress, BenchRun, BenchRunSummary
from engines.events.codec import from_plain, to_plain

if TYPE_CHECKING:
    pass


class BenchCalls(ClientBase):
    async def bench_runs(self, limit: int = 200) -> list[BenchRunSummary]:
        """Stored runs, newest first."""
        data = await self._call("GET", "/api/bench/runs", params={"limit": str(limit)})
        return [from_plain(BenchRunSummary, r) for r in data]

    async def bench_run(self, run_id: int) -> BenchRun:
        return from_plain(BenchRun, await self._call("GET", api_path("/api/bench/runs/{}", run_id)))

    async def bench_start(self, config: BenchConfig, *, api_key: str = "") -> BenchRun:
        """Start a run (one at a time); ``api_key`` is for a gateway with keys and is never
        stored. Returns the run in state running."""
        body = to_plain(config)
        if api_key:
            body["api_key"] = api_key
        return from_plain(BenchRun, await self._call("POST", "/api/bench/runs", json_body=body))

    async def bench_cancel(self, run_id: int) -> BenchRunSummary:
        """Stop a running run; what finished is kept (state cancelled)."""
        data = await self._call("POST", api_path("/api/bench/runs/{}/cancel", run_id))
        return from_plain(BenchRunSummary, data)

    async def bench_delete(self, run_id: int) -> None:
        await self._call("DELETE", api_path("/api/bench/runs/{}", run_id))

    async def bench_current(self) -> tuple[BenchRunSummary | None, BenchProgress | None]:
        """The running run and its latest progress (None, None when none runs)."""
        data = await self._call("GET", "/api/bench/current")
        run = from_plain(BenchRunSummary, data["run"]) if data.get("run") else None
        progress = from_plain(BenchProgress, data["progress"]) if data.get("progress") else None
        return run, progress

    async def bench_report_html(self, run_ids: Iterable[int]) -> str:
        """The self-contained HTML report of one run, or a comparison of several."""
        return await self._text("/api/bench/report", {"ids": ",".join(str(i) for i in run_ids)})
