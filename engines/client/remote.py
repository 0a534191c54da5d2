"""The remote fallback: its status and the key it reads from the OS keyring
(engines/remote/routes.py)."""

from __future__ import annotations

from engines.client.base import ClientBase
from engines.events.codec import from_plain
from engines.events.remote import RemoteStatus


class RemoteCalls(ClientBase):
    async def remote_status(self) -> RemoteStatus:
        return from_plain(RemoteStatus, await self._call("GET", "/api/remote"))

    async def remote_refresh_key(self) -> RemoteStatus:
        """Make the daemon read the OS keyring again (after `traylm remote set-key`)."""
        return from_plain(RemoteStatus, await self._call("POST", "/api/remote/refresh-key"))
