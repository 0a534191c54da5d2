"""Paired boxes (engines/peers/routes.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engines.client.base import JSON, ClientBase, named_path
from engines.events.codec import from_plain
from engines.events.peers import PairingCode, PairingState, PeerInfo, PeersView, Unpaired

if TYPE_CHECKING:
    pass


class PeerCalls(ClientBase):
    async def peers(self, *, check: bool = True) -> PeersView:
        """This box and its paired boxes; ``check``: each one asked whether it is there."""
        data = await self._call("GET", "/api/peers", params={"check": "1" if check else "0"})
        return from_plain(PeersView, data)

    async def begin_pairing(self, expires_in_s: float | None = None) -> PairingCode:
        body = {} if expires_in_s is None else {"expires_in_s": expires_in_s}
        return from_plain(
            PairingCode, await self._call("POST", "/api/peers/pairing", json_body=body)
        )

    async def pairing(self) -> PairingState:
        return from_plain(PairingState, await self._call("GET", "/api/peers/pairing"))

    async def cancel_pairing(self) -> PairingState:
        return from_plain(PairingState, await self._call("DELETE", "/api/peers/pairing"))

    async def join_peer(self, address: str, code: str) -> PeerInfo:
        body = {"address": address, "code": code}
        return from_plain(PeerInfo, await self._call("POST", "/api/peers/join", json_body=body))

    async def unpair(self, name: str) -> Unpaired:
        path = named_path("/api/peers/{}", name, "box")
        return from_plain(Unpaired, await self._call("DELETE", path))

    async def spread_check(self, profile: str) -> JSON:
        """The preflight of a profile with ``boxes`` (one model across boxes): findings that
        name the box and the fix, what each link means for tokens/s, and the warning."""
        data: JSON = await self._call("GET", named_path("/api/spread/{}", profile, "profile"))
        return data
