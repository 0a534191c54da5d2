"""MultiNode: one model across paired boxes. On the head box it makes each such engine's
ranks (the EngineControl hook ``ranks``) and answers the preflight of a profile; on every box
it runs the ranks paired head boxes ask for (``followers``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from engines.config.profiles import ACROSS_BOXES_WARNING, Profile
from engines.errors import ConfigError
from engines.multinode.follower import FollowerRanks
from engines.multinode.head import HeadRanks, PeerChannel, preflight
from engines.peers.service import PeersFeature
from engines.runtime.adapters.base import EngineRuntime

LEASE_S = 15.0
"""A follower box ends its rank once the head box has not asked about it for this long."""
POLL_S = 1.0
"""How often the head box asks each box about its rank (a dead rank ends all within ~2 s)."""


class MultiNode:
    name = "spread"

    def __init__(
        self,
        *,
        peers: PeersFeature,
        followers: FollowerRanks,
        load_profile: Callable[[str], Awaitable[Profile]],
        lease_s: float = LEASE_S,
        poll_s: float = POLL_S,
    ) -> None:
        self._peers = peers
        self.followers = followers
        self._load_profile = load_profile
        self._lease_s = lease_s
        self._poll_s = poll_s

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        await self.followers.stop_all()

    def status(self) -> dict[str, object]:
        return {"ranks_here": self.followers.running()}

    def ranks(self, profile: Profile, runtime: EngineRuntime, model: str) -> HeadRanks:
        """EngineControl's hook for a profile with ``boxes``."""
        return HeadRanks(
            channel=PeerChannel(self._peers),
            profile=profile,
            runtime=runtime,
            model=model,
            lease_s=self._lease_s,
            poll_s=self._poll_s,
        )

    async def check(self, name: str) -> dict[str, Any]:
        """The preflight of profile ``name`` (`traylm spread check`)."""
        profile = await self._load_profile(name)
        if not profile.boxes:
            raise ConfigError(
                f"profile {name!r} runs on this box only; list the paired boxes that run its "
                "other pipeline stages in its `boxes` field"
            )
        runtime, model = await self.followers.resolve(profile)
        found = await preflight(PeerChannel(self._peers), profile, runtime, model)
        return {
            "profile": name,
            "ok": not found.blocking,
            "warning": ACROSS_BOXES_WARNING,
            "interface": dataclasses.asdict(found.route) if found.route else None,
            "links": found.notes,
            "findings": [dataclasses.asdict(f) for f in found.findings],
        }
