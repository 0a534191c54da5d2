"""The Hugging Face hub: search, details, fit, the library, local folders, downloads
(engines/hub/routes.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engines.client.base import (
    CONNECT_TIMEOUT_S,
    JSON,
    ClientBase,
    _repo_path,
    api_error,
    api_path,
    named_path,
)
from engines.errors import DaemonUnavailable
from engines.events.codec import from_plain
from engines.events.hub import (
    DownloadStatus,
    FitResult,
    HFTokenStatus,
    LocalFolder,
    LocalModel,
    ModelDetails,
    ModelSummary,
)

if TYPE_CHECKING:
    pass


class HubCalls(ClientBase):
    async def hub_access(self) -> JSON:
        """Endpoint, cache folder, and whether a Hugging Face token is found and sent."""
        data: JSON = await self._call("GET", "/api/models/hub")
        return data

    async def hf_token(self) -> HFTokenStatus:
        """Which Hugging Face token the daemon finds (never the token itself)."""
        return from_plain(HFTokenStatus, await self._call("GET", "/api/hub/token"))

    async def set_hf_token(self, token: str) -> HFTokenStatus:
        """Save ``token`` as the login (the file ``hf auth login`` writes, readable only by
        you), for the daemon, its engines and every Hugging Face tool."""
        data = await self._call("PUT", "/api/hub/token", json_body={"token": token})
        return from_plain(HFTokenStatus, data)

    async def clear_hf_token(self) -> HFTokenStatus:
        """Remove the saved login (a token in the daemon's environment stays)."""
        return from_plain(HFTokenStatus, await self._call("DELETE", "/api/hub/token"))

    async def search_models(
        self, query: str = "", *, sort: str = "downloads", quant: str | None = None, limit: int = 20
    ) -> list[ModelSummary]:
        params = {"q": query, "sort": sort, "limit": str(limit)}
        if quant:
            params["quant"] = quant
        data = await self._call("GET", "/api/models/search", params=params)
        return [from_plain(ModelSummary, m) for m in data]

    async def model_details(self, repo_id: str, revision: str | None = None) -> ModelDetails:
        params = {"revision": revision} if revision else None
        data = await self._call("GET", _repo_path(repo_id), params=params)
        return from_plain(ModelDetails, data)

    async def model_fit(
        self,
        repo_id: str,
        *,
        revision: str | None = None,
        engine: str | None = None,
        gpus: int | None = None,
        context: int | None = None,
        concurrency: int = 1,
        kv_cache_dtype: str = "auto",
        device: str | None = None,
    ) -> list[FitResult]:
        """Without engine/gpus: every engine on 1 and 2 GPUs (the Models page badges);
        ``device="cpu"``: the CPU build in this computer's memory."""
        params = {"concurrency": str(concurrency), "kv_cache_dtype": kv_cache_dtype}
        for key, value in (
            ("revision", revision),
            ("engine", engine),
            ("gpus", gpus),
            ("context", context),
            ("device", device),
        ):
            if value is not None:
                params[key] = str(value)
        data = await self._call("GET", _repo_path(repo_id, "/fit"), params=params)
        return [from_plain(FitResult, r) for r in data]

    async def local_models(self) -> list[LocalModel]:
        return [from_plain(LocalModel, m) for m in await self._call("GET", "/api/models")]

    async def local_folders(self) -> list[LocalFolder]:
        """Model folders registered in the library (``traylm models add``)."""
        return [from_plain(LocalFolder, m) for m in await self._call("GET", "/api/models/local")]

    async def add_local_folder(
        self, path: str, name: str | None = None, settings: dict[str, str] | None = None
    ) -> LocalFolder:
        """Register a model folder; ``settings``: its tool_parser / reasoning_parser (default:
        its family's)."""
        body: JSON = {"path": path, **({"name": name} if name else {}), **(settings or {})}
        return from_plain(
            LocalFolder, await self._call("POST", "/api/models/local", json_body=body)
        )

    async def change_local_folder(self, name: str, settings: dict[str, str]) -> LocalFolder:
        """Change a registered folder's tool_parser / reasoning_parser."""
        path = named_path("/api/models/local/{}", name, "model folder")
        return from_plain(LocalFolder, await self._call("PATCH", path, json_body=dict(settings)))

    async def remove_local_folder(self, name: str) -> LocalFolder:
        return from_plain(
            LocalFolder,
            await self._call("DELETE", named_path("/api/models/local/{}", name, "model folder")),
        )

    async def verify_model(
        self, repo_id: str, revision: str | None = None, *, timeout_s: float = 3600
    ) -> list[LocalModel]:
        """Hash every file against the Hub's hashes (minutes for big models)."""
        import aiohttp

        params = {"revision": revision} if revision else None
        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=CONNECT_TIMEOUT_S)
        try:
            async with self._http().post(
                _repo_path(repo_id, "/verify"), params=params, timeout=timeout
            ) as resp:
                data = await resp.json(content_type=None)
                if resp.status >= 400:
                    raise api_error(resp.status, data)
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            raise DaemonUnavailable(f"verification of {repo_id} did not answer ({exc!r})") from None
        return [from_plain(LocalModel, m) for m in data]

    async def delete_model(self, repo_id: str, revision: str | None = None) -> JSON:
        params = {"revision": revision} if revision else None
        data: JSON = await self._call("DELETE", _repo_path(repo_id), params=params)
        return data

    async def trust_model(self, repo_id: str, trust_remote_code: bool) -> JSON:
        body = {"trust_remote_code": trust_remote_code}
        data: JSON = await self._call("PUT", _repo_path(repo_id, "/trust"), json_body=body)
        return data

    async def downloads(self) -> list[DownloadStatus]:
        return [from_plain(DownloadStatus, d) for d in await self._call("GET", "/api/downloads")]

    async def download(self, download_id: str) -> DownloadStatus:
        return from_plain(
            DownloadStatus, await self._call("GET", api_path("/api/downloads/{}", download_id))
        )

    async def pull(self, repo_id: str, revision: str | None = None) -> DownloadStatus:
        body: JSON = {"repo_id": repo_id}
        if revision:
            body["revision"] = revision
        return from_plain(
            DownloadStatus, await self._call("POST", "/api/downloads", json_body=body)
        )

    async def download_action(self, download_id: str, action: str) -> DownloadStatus:
        """``action``: pause, resume or cancel."""
        data = await self._call("POST", api_path("/api/downloads/{}/{}", download_id, action))
        return from_plain(DownloadStatus, data)
