"""The tuner (engines/tune/service.py): one run at a time, in the daemon; follow it with
``events(kinds=("tune",))``: TuneProgress while it runs, TuneFinished at the end."""

from __future__ import annotations

from engines.client.base import ClientBase
from engines.events.codec import from_plain, to_plain
from engines.events.tune import TuneBudget, TuneConfig, TuneJob, TuneTarget


class TuneCalls(ClientBase):
    async def tune_start(self, config: TuneConfig) -> TuneJob:
        """Plan and start a tune (bad input is refused here, before anything stops)."""
        data = await self._call("POST", "/api/tune", json_body=to_plain(config), timeout_s=120)
        return from_plain(TuneJob, data)

    async def tune_current(self) -> TuneJob | None:
        """The running tune, else the last one since the daemon started, else None."""
        data = await self._call("GET", "/api/tune")
        return from_plain(TuneJob, data["job"]) if data.get("job") else None

    async def tune_cancel(self, *, timeout_s: float = 300) -> TuneJob:
        """Stop the running tune; returns once what ran before was started again."""
        return from_plain(
            TuneJob, await self._call("POST", "/api/tune/cancel", timeout_s=timeout_s)
        )

    async def tune_apply(self) -> TuneJob:
        """Write the last finished tune's recommendation (the previous profile is kept)."""
        return from_plain(TuneJob, await self._call("POST", "/api/tune/apply"))

    async def tune_previous(self) -> tuple[str, ...]:
        """The profiles `tune_undo` can put back."""
        data = await self._call("GET", "/api/tune/previous")
        return tuple(str(n) for n in data["profiles"])

    async def tune_undo(self, profile: str) -> str:
        """Put back the profile `tune --apply` replaced; the daemon's words."""
        data = await self._call("POST", "/api/tune/undo", json_body={"profile": profile})
        return str(data["detail"])

    async def tune_report_html(self) -> str:
        return await self._text("/api/tune/report")

    async def tune_targets(self) -> tuple[tuple[TuneTarget, ...], tuple[TuneTarget, ...]]:
        """(what can be tuned on this computer, what cannot: each with ``blocked``)."""
        data = await self._call("GET", "/api/tune/targets")
        return (
            tuple(from_plain(TuneTarget, t) for t in data["targets"]),
            tuple(from_plain(TuneTarget, t) for t in data["left_out"]),
        )

    async def tune_least_budget(self, model: str, repeat: int) -> TuneBudget:
        """The smallest budget a tune of ``model`` works with here (a refusal's offer)."""
        params = {"model": model, "repeat": str(repeat)}
        return from_plain(TuneBudget, await self._call("GET", "/api/tune/budget", params=params))
