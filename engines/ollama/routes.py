"""Ollama's API routes (docs/api.md in ollama/ollama), each mapped onto what traylm does at
:8000: generation through the gateway's relay (relay.py), the model list and loaded models from
models on demand, pulls and deletes through the hub.

    GET    /api/version              {"version"}
    GET    /api/tags                 every servable model (models.py)
    GET    /api/ps                   the loaded ones, with size_vram and expires_at
    POST   /api/show                 one model's details, model_info and capabilities
    POST   /api/chat, /api/generate  NDJSON stream by default, one object with stream false;
                                     an empty messages/prompt only loads (unloads with
                                     keep_alive 0), as Ollama does
    POST   /api/embed, /api/embeddings
    POST   /api/pull                 a Hub repo id (an Ollama library tag is refused with the
                                     repo to use)
    DELETE /api/delete               the model's files in the Hub cache
    HEAD   /                         200 "Ollama is running" (clients probe it), GET / too
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from engines.config.fields import parse_duration
from engines.core.http import parse_json_body
from engines.errors import ConfigError, TraylmError
from engines.ollama import models
from engines.ollama.errors import ollama_error
from engines.ollama.library import refusal
from engines.ollama.parts import OllamaParts
from engines.ollama.relay import Ask, forward, resolved
from engines.ollama.replies import line, now_text
from engines.ollama.shapes import (
    BadRequest,
    chat_request,
    embed_request,
    generate_request,
    model_of,
    served_of,
)
from engines.ondemand.actions import unload_model

VERSION = "0.12.6"
"""The Ollama version traylm answers /api/version with: clients check it for the features they
use (tools, think, structured outputs), which traylm serves as Ollama 0.12 does."""
SERVED = (
    "GET /api/version",
    "GET /api/tags",
    "GET /api/ps",
    "POST /api/show",
    "POST /api/chat",
    "POST /api/generate",
    "POST /api/embed",
    "POST /api/embeddings",
    "POST /api/pull",
    "DELETE /api/delete",
)
Handler = Callable[[OllamaParts, web.Request], Awaitable[web.StreamResponse]]


async def version(parts: OllamaParts, request: web.Request) -> web.Response:
    return web.json_response({"version": VERSION})


async def root(parts: OllamaParts, request: web.Request) -> web.Response:
    return web.Response(text="Ollama is running (traylm)")


async def tags(parts: OllamaParts, request: web.Request) -> web.Response:
    return web.json_response({"models": await models.tags(parts.ondemand)})


async def ps(parts: OllamaParts, request: web.Request) -> web.Response:
    return web.json_response({"models": await models.loaded(parts.ondemand)})


async def show(parts: OllamaParts, request: web.Request) -> web.Response:
    body = await _body(request)
    return web.json_response(await models.show(parts.ondemand, served_of(body)))


async def chat(parts: OllamaParts, request: web.Request) -> web.StreamResponse:
    body = await _body(request)
    model = served_of(body)
    if not body.get("messages"):
        return await _load_only(parts, request, body, model, chat=True)
    payload = chat_request(body, model)
    ask = Ask("/v1/chat/completions", payload, model, "chat", _keep(body), model_of(body))
    return await forward(parts.gateway, request, ask)


async def generate(parts: OllamaParts, request: web.Request) -> web.StreamResponse:
    body = await _body(request)
    model = served_of(body)
    if not body.get("prompt") and not body.get("images"):
        return await _load_only(parts, request, body, model, chat=False)
    route, payload = generate_request(body, model)
    kind = "raw" if route == "/v1/completions" else "generate"
    ask = Ask(route, payload, model, kind, _keep(body), model_of(body))
    return await forward(parts.gateway, request, ask)


async def embed(parts: OllamaParts, request: web.Request) -> web.StreamResponse:
    body = await _body(request)
    model = served_of(body)
    legacy = request.path == "/api/embeddings"
    payload = embed_request(body, model, legacy=legacy)
    ask = Ask("/v1/embeddings", payload, model, "embed", _keep(body), model_of(body))
    resp = await forward(parts.gateway, request, ask)
    if not legacy or resp.status != 200 or not isinstance(resp, web.Response):
        return resp
    vectors = json.loads(resp.body)["embeddings"] if isinstance(resp.body, bytes) else [[]]
    return web.json_response({"embedding": vectors[0] if vectors else []})


async def _load_only(
    parts: OllamaParts, request: web.Request, body: dict[str, Any], model: str, *, chat: bool
) -> web.StreamResponse:
    """An empty prompt (or messages): load the model (done_reason "load"), or with keep_alive
    0 unload it ("unload"), answered as Ollama does: one JSON object whatever ``stream`` says
    (Open WebUI's eject reads it as JSON)."""
    keep = _keep(body)
    if keep == 0:
        try:
            await unload_model(parts.ondemand, model)
        except TraylmError as exc:
            return ollama_error(exc.http_status, exc.message)
        reason = "unload"
    else:
        target = await resolved(parts.gateway, request, Ask("", {}, model, "load", keep))
        if isinstance(target, web.Response):
            return target
        reason = "load"
    out: dict[str, Any] = {"model": model_of(body), "created_at": now_text()}
    if chat:
        out["message"] = {"role": "assistant", "content": ""}
    else:
        out["response"] = ""
    out.update(done=True, done_reason=reason)
    return web.json_response(out)


async def pull(parts: OllamaParts, request: web.Request) -> web.StreamResponse:
    body = await _body(request)
    name = model_of(body)
    if "/" not in name:
        return ollama_error(400, refusal(name))
    try:
        status = await parts.pull(name)
    except TraylmError as exc:
        return ollama_error(exc.http_status, exc.message)
    stream = body.get("stream", True) is not False
    resp = await _lines(request, [], done=False) if stream else None
    final = await _follow(parts, status.id, resp)
    if resp is None:
        return web.json_response(final, status=200 if "error" not in final else 500)
    await resp.write(line(final))
    await resp.write_eof()
    return resp


async def _follow(
    parts: OllamaParts, download_id: str, resp: web.StreamResponse | None
) -> dict[str, Any]:
    """Report a download's progress as Ollama's pull lines until it ends; its last line."""
    seen = None
    while True:
        status = parts.hub.downloads.get(download_id)
        state = str(status.state)
        if state == "ready":
            return {"status": "success"}
        if state in ("failed", "cancelled"):
            return {"error": status.message or f"the download {state}"}
        now = (state, status.done_bytes)
        if resp is not None and now != seen:
            await resp.write(
                line(
                    {
                        "status": f"pulling {status.repo_id}",
                        "digest": status.commit_sha,
                        "total": status.total_bytes,
                        "completed": status.done_bytes,
                    }
                )
            )
            seen = now
        await asyncio.sleep(0.5)


async def delete(parts: OllamaParts, request: web.Request) -> web.Response:
    body = await _body(request)
    name = served_of(body)
    try:
        await parts.delete(name)
    except TraylmError as exc:
        return ollama_error(exc.http_status, exc.message)
    return web.Response(status=200)


async def _lines(
    request: web.Request, rows: list[dict[str, Any]], *, done: bool = True
) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await resp.prepare(request)
    for row in rows:
        await resp.write(line(row))
    if done:
        await resp.write_eof()
    return resp


async def _body(request: web.Request) -> dict[str, Any]:
    payload, problem = parse_json_body(await request.read())
    if payload is None:
        raise BadRequest(problem or "the body must be a JSON object")
    return payload


def _keep(body: dict[str, Any]) -> float | None:
    """Ollama's keep_alive ("5m", 300, 0, -1) in seconds, or None when not given."""
    if body.get("keep_alive") is None:
        return None
    try:
        return parse_duration(body["keep_alive"], what="keep_alive")
    except ConfigError as exc:
        raise BadRequest(exc.message) from None


def ollama_routes(parts: OllamaParts) -> list[web.RouteDef]:
    def bound(handler: Handler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def run(request: web.Request) -> web.StreamResponse:
            return await handler(parts, request)

        return run

    return [
        web.get("/", bound(root)),  # HEAD too
        web.get("/api/version", bound(version)),
        web.get("/api/tags", bound(tags)),
        web.get("/api/ps", bound(ps)),
        web.post("/api/show", bound(show)),
        web.post("/api/chat", bound(chat)),
        web.post("/api/generate", bound(generate)),
        web.post("/api/embed", bound(embed)),
        web.post("/api/embeddings", bound(embed)),
        web.post("/api/pull", bound(pull)),
        web.delete("/api/delete", bound(delete)),
    ]
