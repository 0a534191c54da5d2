"""Open WebUI's Ollama connection, replayed against the real daemon (FAKE engine) as Open WebUI
makes its calls: the routes, bodies and fields below are read from its source
(backend/open_webui/routers/ollama.py in open-webui/open-webui: get_all_models,
get_ollama_loaded_models, unload_model), not copied from it. Open WebUI itself (a large
install) is not run in the suite; this is the recorded exchange of its calls instead.

What it does, with the connection's key as ``Authorization: Bearer``:
- verify: ``GET /api/version``, the version parsed as dotted integers;
- list: ``GET /api/tags`` (aiohttp, ``response.json()``), models keyed by ``model``;
- loaded state: ``GET /api/ps``, each ``expires_at`` parsed with ``datetime.fromisoformat``
  and set on the /api/tags row with the same ``model``;
- eject: the name made ``NAME:latest`` when it has no tag, looked up among the /api/tags
  models, then ``POST /api/generate {"model", "keep_alive": 0, "prompt": ""}`` read with
  aiohttp's ``response.json()`` (which refuses a body that is not application/json).
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime
from typing import Any

import aiohttp

from engines.core.procs import free_loopback_port
from engines.gateway.security import hash_key
from tests.conftest import RunningDaemon
from tests.engines.gateway.test_daemon_gateway import start_fake
from tests.engines.ollama.test_ollama_api import with_ollama

KEY = "sekret"
HEADERS = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}


async def get_json(http: aiohttp.ClientSession, url: str) -> Any:
    async with http.get(url, headers=HEADERS) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def all_models(http: aiohttp.ClientSession, url: str) -> dict[str, dict[str, Any]]:
    """Open WebUI's get_all_models: /api/tags with /api/ps's expires_at, by ``model``."""
    models = (await get_json(http, url + "/api/tags"))["models"]
    loaded = (await get_json(http, url + "/api/ps"))["models"]
    expires = {m["model"]: m["expires_at"] for m in loaded if "expires_at" in m}
    for m in models:
        if m["model"] in expires:
            m["expires_at"] = int(datetime.fromisoformat(expires[m["model"]]).timestamp())
    return {m["model"]: m for m in models}


async def eject(http: aiohttp.ClientSession, url: str, name: str) -> dict[str, Any]:
    """Open WebUI's unload_model for a name as its model menu has it."""
    models = await all_models(http, url)
    if ":" not in name:
        name = f"{name}:latest"
    assert name in models, f"Open WebUI says model {name} not found among {list(models)}"
    payload = {"model": name, "keep_alive": 0, "prompt": ""}
    async with http.post(url + "/api/generate", data=json.dumps(payload), headers=HEADERS) as r:
        assert r.ok, await r.text()
        reply: dict[str, Any] = await r.json()
    return reply


async def test_open_webuis_connection_lists_shows_loaded_and_ejects(
    daemon_factory,  # type: ignore[no-untyped-def]
    fake_env,
) -> None:
    port = free_loopback_port()
    d: RunningDaemon = await daemon_factory(with_ollama(port, api_key_sha256=(hash_key(KEY),)))
    await start_fake(d)
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as http:
        version = (await get_json(http, url + "/api/version"))["version"]
        assert tuple(map(int, re.sub(r"^v|-.*", "", version).split(".")))
        models = await all_models(http, url)
        assert list(models) == ["fake:latest"]
        assert models["fake:latest"]["expires_at"] > time.time()  # loaded, with its timer
        reply = await eject(http, url, "fake")
        assert reply["done"] and reply["done_reason"] == "unload"
        after = await all_models(http, url)
        assert list(after) == ["fake:latest"] and "expires_at" not in after["fake:latest"]
        chat = {"model": "fake:latest", "messages": [{"role": "user", "content": "hi"}]}
        async with http.post(url + "/api/chat", json=chat, headers=HEADERS) as r:
            assert r.status == 200 and r.content_type == "application/x-ndjson"
            lines = [json.loads(line) async for line in r.content if line.strip()]
        assert lines[-1]["done"] and "".join(x["message"]["content"] for x in lines)
        assert "expires_at" in (await all_models(http, url))["fake:latest"]  # loaded again
