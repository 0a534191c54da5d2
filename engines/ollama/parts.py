"""What Ollama's API works with, handed over by the daemon: the gateway (relay, admission,
recorder, metrics), models on demand (the model list, loads and unloads) and the hub (pulls
and deletes)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from engines.errors import ModelInUse
from engines.events.hub import DownloadStatus, LibraryChanged
from engines.gateway.service import GatewayContext
from engines.hub.names import validate_repo_id
from engines.hub.service import HubFeature
from engines.ondemand.service import ModelsOnDemand


@dataclass(frozen=True)
class OllamaParts:
    gateway: GatewayContext
    ondemand: ModelsOnDemand
    hub: HubFeature

    async def pull(self, repo_id: str) -> DownloadStatus:
        """Queue the download of a Hub repo (as `traylm models pull` does)."""
        repo_id = validate_repo_id(repo_id)
        trusted = await asyncio.to_thread(self.hub.records.trusted)
        return await self.hub.downloads.add(repo_id, None, include_code=repo_id in trusted)

    async def delete(self, repo_id: str) -> None:
        """Delete a model's files from the Hub cache (as `traylm models rm` does): refused
        while an engine serves it."""
        repo_id = validate_repo_id(repo_id)
        users = self.hub.served().get(repo_id)
        if users:
            raise ModelInUse(
                f"{repo_id} is being served by engine {', '.join(users)}; unload it first "
                f"(`traylm unload {users[0]}`)"
            )
        await asyncio.to_thread(self.hub.library.delete, repo_id, None)
        self.hub.publish(LibraryChanged(repo_id=repo_id, commit_sha="", reason="deleted"))
