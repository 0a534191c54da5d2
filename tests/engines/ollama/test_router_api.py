"""llama.cpp's router API on :8000 (what Open WebUI reads for a model's loaded state and
eject), through the real daemon with the FAKE engine, in raw HTTP as those clients call it."""

from __future__ import annotations

import aiohttp

from tests.conftest import RunningDaemon
from tests.engines.gateway.test_daemon_gateway import start_fake


async def listed(http: aiohttp.ClientSession, url: str) -> dict[str, str]:
    async with http.get(url + "/models") as resp:
        assert resp.status == 200
        body = await resp.json()
    assert body["object"] == "list"
    return {m["id"]: m["status"]["value"] for m in body["data"]}


async def test_list_unload_and_load_as_llama_cpp_clients_do(daemon: RunningDaemon) -> None:
    await start_fake(daemon)
    url = daemon.url
    async with aiohttp.ClientSession() as http:
        assert (await listed(http, url))["fake"] == "loaded"
        async with http.post(url + "/models/unload", json={"model": "fake"}) as resp:
            assert resp.status == 200
            assert await resp.json() == {"success": True}
        assert (await listed(http, url))["fake"] == "unloaded"
        async with http.post(url + "/models/load", json={"model": "fake"}) as resp:
            assert resp.status == 200
        assert (await listed(http, url))["fake"] in ("loading", "loaded")
        async with http.post(url + "/models/load", json={"model": "nope"}) as resp:
            assert resp.status == 404
            assert "fake" in (await resp.json())["error"]["message"]
        async with http.post(url + "/models/load", json={}) as resp:
            assert resp.status == 400
