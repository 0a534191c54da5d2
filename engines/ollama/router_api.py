"""llama.cpp's router API (tools/server in ggml-org/llama.cpp, "router mode") on :8000: what
Open WebUI and other clients of llama-server read for a model's loaded state and use to load
and eject it, mapped onto traylm's models on demand.

    GET  /models          {"object": "list", "data": [{"id", "object": "model", "owned_by",
                          "created", "status": {"value": loaded | loading | unloaded,
                          "args": [], "failed"?: true}}]}
    POST /models/load     {"model"} → {"success": true} (the load goes on; poll /models)
    POST /models/unload   {"model"} → {"success": true}

They sit behind the gateway's middleware like /v1/models: API keys where keys are on, errors
in OpenAI's shape.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from engines.core.http import openai_error, parse_json_body
from engines.errors import TraylmError
from engines.gateway.routes import listed_status
from engines.ondemand.actions import load_model, unload_model
from engines.ondemand.service import ModelsOnDemand

ROUTER_ROUTES = ("GET /models", "POST /models/load", "POST /models/unload")


def router_routes(ondemand: ModelsOnDemand) -> list[web.RouteDef]:
    async def models(request: web.Request) -> web.Response:
        data = [
            {
                "id": name,
                "object": "model",
                "owned_by": "traylm",
                "created": 0,
                "status": listed_status(m),
            }
            for m in await ondemand.listing()
            if not m.blocked
            for name in (m.name, *m.aliases)
        ]
        return web.json_response({"object": "list", "data": data})

    async def load(request: web.Request) -> web.Response:
        return await _act(request, lambda name: load_model(ondemand, name))

    async def unload(request: web.Request) -> web.Response:
        return await _act(request, lambda name: unload_model(ondemand, name))

    return [
        web.get("/models", models),
        web.post("/models/load", load),
        web.post("/models/unload", unload),
    ]


async def _act(request: web.Request, act: Any) -> web.Response:
    payload, problem = parse_json_body(await request.read())
    if payload is None:
        return openai_error(400, problem or "the body must be JSON")
    name = payload.get("model")
    if not isinstance(name, str) or not name:
        return openai_error(400, 'the body must name a model: {"model": "NAME"}', param="model")
    try:
        await act(name)
    except TraylmError as exc:
        return openai_error(exc.http_status, exc.message, type_=exc.code, code=exc.code)
    return web.json_response({"success": True})
