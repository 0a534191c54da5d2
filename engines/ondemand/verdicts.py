"""Why each servable model cannot start here, as the servable list shows it, kept a short while.

The list runs a start's checks (EngineControl.check_start) for every unloaded model, and one of
them asks whether the Hub answers (up to 3 s). Clients list often (after each profile, library
or engine-env change, from every chat window), so the verdicts are kept: per profile as it
reads now (an edited profile is a new key, checked afresh), for ``ttl_s``, and all are
forgotten when an engine-env install ends or the library changes (``forget``). A start or a
load never reads them: it runs the checks itself.
"""

from __future__ import annotations

import asyncio
import time

from engines.config.profiles import Profile
from engines.errors import TraylmError
from engines.ondemand.lifecycle import CheckStart

VERDICT_TTL_S = 15.0
"""How long a verdict stands without a change that forgets it (the Hub's reachability, an
engine env removed, the GPUs)."""


class StartVerdicts:
    """``check_start``'s refusal per profile, kept ``ttl_s``; one check at a time per profile
    (listings that ask meanwhile wait for the same answer)."""

    def __init__(self, check: CheckStart, *, ttl_s: float = VERDICT_TTL_S) -> None:
        self._check = check
        self.ttl_s = ttl_s
        self._held: dict[str, tuple[float, asyncio.Task[TraylmError | None]]] = {}

    async def refusal(self, profile: Profile) -> TraylmError | None:
        """The error a start of ``profile`` would be refused with now, or None."""
        now_s = time.monotonic()
        for stale in [k for k, (until_s, _) in self._held.items() if until_s <= now_s]:
            del self._held[stale]
        key = repr(profile)  # every field: a profile edited since is checked again
        held = self._held.get(key)
        if held is None:
            task = asyncio.get_running_loop().create_task(self._run(profile))
            held = self._held[key] = (now_s + self.ttl_s, task)
        try:
            return await asyncio.shield(held[1])
        except Exception:
            self._held.pop(key, None)  # a check that broke is not an answer to keep
            raise

    async def _run(self, profile: Profile) -> TraylmError | None:
        try:
            await self._check(profile)
        except TraylmError as exc:
            return exc
        return None

    @property
    def held(self) -> int:
        """How many verdicts are kept now."""
        return len(self._held)

    def forget(self) -> None:
        """Something a verdict depends on changed: check again at the next listing."""
        self._held.clear()
