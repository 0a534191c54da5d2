"""Open WebUI's OpenAI connection with its provider set to llama.cpp, replayed against the real
daemon (FAKE engine) as Open WebUI 0.12.4 makes its calls: the routes, bodies and fields below
are read from its source (backend/open_webui/routers/openai.py: MODEL_MANAGEMENT_ENDPOINTS,
get_model_management_root_url, get_provider_model_loaded_state, load_provider_model,
unload_provider_model), not copied from it. Open WebUI itself is not run in the suite.

What it does, with the connection's URL ``http://localhost:PORT/v1`` (traylm's gateway) and key as
``Authorization: Bearer``:
- list: ``GET {url}/models`` (the OpenAI list); each model's loaded state is read from its
  ``status`` object, llama.cpp's: ``status.value`` loaded or sleeping is loaded, loading or
  unloaded is not, anything else (a ``status`` that is not an object) is no state at all, so no
  loaded mark and no eject button;
- load and eject: ``POST {root}/models/load`` and ``/models/unload`` with ``{"model"}``, where
  the root is the URL without its ``/v1``; the answer read as JSON.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from engines.core.procs import free_loopback_port
from engines.gateway.security import hash_key
from tests.conftest import RunningDaemon, fast_settings
from tests.engines.gateway.test_daemon_gateway import start_fake

KEY = "sekret"
HEADERS = {"Authorization": f"Bearer {KEY}"}


def loaded_state(model: dict[str, Any]) -> bool | None:
    """Open WebUI's reading of a llama.cpp model's loaded state (None: it shows none)."""
    status = model.get("status")
    if isinstance(status, dict):
        if status.get("value") in ("loaded", "sleeping"):
            return True
        if status.get("value") in ("loading", "unloaded"):
            return False
    return True if "status" not in model else None


async def states(http: aiohttp.ClientSession, url: str) -> dict[str, bool | None]:
    async with http.get(url + "/models", headers=HEADERS) as resp:
        assert resp.status == 200, await resp.text()
        data = (await resp.json())["data"]
    return {m["id"]: loaded_state(m) for m in data}


async def manage(http: aiohttp.ClientSession, url: str, operation: str, name: str) -> Any:
    root = url.removesuffix("/v1")
    async with http.post(f"{root}/models/{operation}", json={"model": name}, headers=HEADERS) as r:
        assert r.ok, await r.text()
        return await r.json()


async def test_open_webuis_llama_cpp_connection_shows_loaded_and_ejects(
    daemon_factory,  # type: ignore[no-untyped-def]
    fake_env,
) -> None:
    settings = fast_settings(free_loopback_port(), api_key_sha256=(hash_key(KEY),))
    d: RunningDaemon = await daemon_factory(settings)
    await start_fake(d)
    url = d.url + "/v1"
    async with aiohttp.ClientSession() as http:
        assert (await states(http, url))["fake"] is True  # a loaded mark, and eject offered
        assert await manage(http, url, "unload", "fake") == {"success": True}
        assert (await states(http, url))["fake"] is False
        assert await manage(http, url, "load", "fake") == {"success": True}
        assert (await states(http, url))["fake"] in (True, False)  # loaded, or loading
