"""The flight recorder's requests (engines/recorder/routes.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from engines.client.base import JSON, ClientBase, api_error, api_path
from engines.client.lines import lines
from engines.errors import ConfigError, DaemonUnavailable


class RequestCalls(ClientBase):
    async def requests_list(self, **filters: str | int) -> list[JSON]:
        """Recorded requests, newest first; filters: limit, before, after, model, status,
        client, text (see engines/recorder/routes.py)."""
        params = {k: str(v) for k, v in filters.items() if v not in ("", None)}
        data: list[JSON] = await self._call("GET", "/api/requests", params=params)
        return data

    async def request_detail(self, rid: str) -> JSON:
        data: JSON = await self._call("GET", api_path("/api/requests/{}", rid))
        return data

    async def request_prompt(self, rid: str) -> JSON:
        """The prompt as the engine that served ``rid`` templated it (asks that engine)."""
        data: JSON = await self._call("GET", api_path("/api/requests/{}/prompt", rid))
        return data

    async def requests_export(self) -> AsyncIterator[bytes]:
        """The export's JSONL lines as the daemon streams them (the last one is
        ``{"traylm_skipped": N}``)."""
        import aiohttp

        try:
            async with self._http().get(
                "/api/requests/export", timeout=aiohttp.ClientTimeout(sock_read=60)
            ) as resp:
                if resp.status != 200:
                    raise api_error(resp.status, await resp.json(content_type=None))
                async for line in lines(resp.content):
                    yield line
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            raise DaemonUnavailable(
                f"the traylm daemon at {self.info.url} does not answer ({type(exc).__name__})"
            ) from None

    async def replay_request(self, rid: str, *, model: str = "", api_key: str = "") -> JSON:
        """Send a recorded request again through the gateway (to ``model`` instead of the
        recorded one when given). Returns {status, request_id, body}: the new request is
        recorded too (``request_detail(request_id)`` has its reply)."""
        import aiohttp

        detail = await self.request_detail(rid)
        body = replayable_body(detail)
        if model:
            body["model"] = model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        url = self.info.url.rstrip("/") + str(detail["path"])
        timeout = aiohttp.ClientTimeout(total=None)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as http,
                http.post(url, json=body, headers=headers) as resp,
            ):
                data = await resp.read()
                return {
                    "status": resp.status,
                    "request_id": resp.headers.get("x-request-id", ""),
                    "body": data.decode("utf-8", "replace"),
                }
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            raise DaemonUnavailable(
                f"the gateway at {url} does not answer ({type(exc).__name__})"
            ) from None


def replayable_body(detail: JSON) -> JSON:
    """The recorded JSON body of a request, or ConfigError saying why it cannot be sent
    again."""
    why = ""
    if detail.get("capture") != "full":
        why = f"only its metadata was recorded (requests.capture = {detail.get('capture')})"
    elif detail.get("request_cut"):
        why = "its body was cut when recorded (requests.body_max_bytes)"
    elif not str(detail.get("content_type", "")).startswith("application/json"):
        why = f"its body is {detail.get('content_type') or 'not JSON'}, not a JSON body"
    if not why:
        try:
            body = json.loads(str(detail.get("request_body", "")))
        except ValueError:
            body = None
        if isinstance(body, dict):
            return body
        why = "its recorded body is not a JSON object"
    raise ConfigError(f"request {detail.get('id')} cannot be replayed: {why}")
