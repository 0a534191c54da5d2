"""The control API under /api: status, engines, profiles, settings, engine envs, events (SSE).

Guarded by the token in daemon.json (checked in the security middleware) plus the same Host and
Origin checks as /v1. Errors use the OpenAI error shape with traylm's error code as ``type``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from engines import __version__
from engines.config import SECTIONS, Profile, profile_from_mapping, profile_to_mapping
from engines.envs import env_summary
from engines.errors import ConfigError, TraylmError
from engines.events import to_plain
from engines.gateway.proxy import openai_error

if TYPE_CHECKING:
    from engines.daemon import Daemon

log = logging.getLogger(__name__)
routes = web.RouteTableDef()
SSE_KEEPALIVE_S = 15.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def control_routes() -> list[web.RouteDef]:
    return list(routes)  # type: ignore[arg-type]


def daemon_of(request: web.Request) -> Daemon:
    from engines.gateway.app import CONTEXT

    daemon = request.app[CONTEXT].daemon
    assert daemon is not None
    return daemon


def error_response(exc: TraylmError) -> web.Response:
    return openai_error(exc.http_status, exc.message, type_=exc.code, code=exc.code)


def traylm_errors(handler: Handler) -> Handler:
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except TraylmError as exc:
            return error_response(exc)

    wrapped.__name__ = handler.__name__
    return wrapped


async def json_body(request: web.Request) -> dict[str, Any]:
    try:
        data = await request.json()
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"the request body is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError("the request body must be a JSON object")
    return data


def ok(data: Any, status: int = 200) -> web.Response:
    return web.json_response(to_plain(data), status=status)


# --------------------------------------------------------------------------- status


@routes.get("/api/status")
@traylm_errors
async def status(request: web.Request) -> web.Response:
    d = daemon_of(request)
    ctx = d.ctx
    return ok(
        {
            "version": __version__,
            "pid": os.getpid(),
            "url": f"http://127.0.0.1:{d.settings.gateway.port}",
            "bind_host": d.settings.bind_host,
            "lan_sharing": d.settings.gateway.lan_sharing,
            "api_key_required": bool(d.settings.gateway.api_key_sha256),
            "started_at_s": d.started_at_s,
            "engines": [e.status() for e in d.supervisor.engines.values()],
            "paused": ctx.pause.reason if ctx and ctx.pause else None,
            "reaped_orphans": d.reaped,
            **{key: provide() for key, provide in d.status_providers.items()},
        }
    )


@routes.post("/api/shutdown")
@traylm_errors
async def shutdown(request: web.Request) -> web.Response:
    daemon_of(request).request_stop("asked through the control API")
    return ok({"stopping": True}, status=202)


# --------------------------------------------------------------------------- engines


@routes.get("/api/engines")
@traylm_errors
async def engines(request: web.Request) -> web.Response:
    return ok([e.status() for e in daemon_of(request).supervisor.engines.values()])


@routes.post("/api/engines")
async def start_engine(request: web.Request) -> web.Response:
    """Body: {"profile": NAME} or an ad-hoc profile {"model": M, "engine": "vllm", ...}."""
    d = daemon_of(request)
    title = "cannot start engine"
    try:
        body = await json_body(request)
        if "profile" in body:
            title = f"cannot start {body['profile']}"
            profile = await d.load_profile(str(body["profile"]))
        else:
            profile = d.adhoc_profile(dict(body))
            title = f"cannot start {profile.name}"
        return ok(await d.start_engine(profile), status=202)
    except TraylmError as exc:
        d.notify_error(title, exc)
        return error_response(exc)


@routes.post("/api/engines/{engine_id}/stop")
@traylm_errors
async def stop_engine(request: web.Request) -> web.Response:
    engine = daemon_of(request).engine(request.match_info["engine_id"])
    await engine.stop()
    return ok(engine.status())


@routes.post("/api/engines/{engine_id}/restart")
@traylm_errors
async def restart_engine(request: web.Request) -> web.Response:
    engine = daemon_of(request).engine(request.match_info["engine_id"])
    await engine.restart()
    return ok(engine.status(), status=202)


@routes.get("/api/engines/{engine_id}/logs")
@traylm_errors
async def engine_logs(request: web.Request) -> web.Response:
    engine = daemon_of(request).engine(request.match_info["engine_id"])
    try:
        tail = int(request.query.get("tail", "200"))
    except ValueError:
        raise ConfigError("tail must be a whole number of lines") from None
    return ok(
        {
            "engine_id": engine.engine_id,
            "log_path": str(engine.log_path),
            "lines": engine.logs(tail),
        }
    )


# --------------------------------------------------------------------------- profiles


def _profile_view(d: Daemon, p: Profile) -> dict[str, Any]:
    return {"name": p.name, "preset": d.profiles.is_preset(p.name), "profile": to_plain(p)}


@routes.get("/api/profiles")
@traylm_errors
async def profiles(request: web.Request) -> web.Response:
    d = daemon_of(request)
    good, broken = await asyncio.to_thread(d.profiles.load_all)
    return ok({"profiles": [_profile_view(d, p) for p in good], "broken": broken})


@routes.get("/api/profiles/{name}")
@traylm_errors
async def profile(request: web.Request) -> web.Response:
    d = daemon_of(request)
    p = await asyncio.to_thread(d.profiles.load, request.match_info["name"])
    return ok(_profile_view(d, p))


@routes.put("/api/profiles/{name}")
@traylm_errors
async def save_profile(request: web.Request) -> web.Response:
    """Validate and save; ``?dry_run=1`` only validates (the profile editor's live check)."""
    d = daemon_of(request)
    name = request.match_info["name"]
    body = await json_body(request)
    body.pop("name", None)
    p = profile_from_mapping(name, body)
    if request.query.get("dry_run") not in ("1", "true"):
        await asyncio.to_thread(d.profiles.save, p)
    return ok({**_profile_view(d, p), "toml": profile_to_mapping(p)})


@routes.delete("/api/profiles/{name}")
@traylm_errors
async def delete_profile(request: web.Request) -> web.Response:
    d = daemon_of(request)
    await asyncio.to_thread(d.profiles.delete, request.match_info["name"])
    return ok({"deleted": request.match_info["name"]})


# --------------------------------------------------------------------------- settings


@routes.get("/api/settings")
@traylm_errors
async def settings(request: web.Request) -> web.Response:
    from engines.config import doc

    d = daemon_of(request)
    docs = {
        f"{name}.{field}": doc(cls, field)
        for name, cls in SECTIONS.items()
        for field in cls.__dataclass_fields__
    }
    return ok({"settings": d.settings, "docs": docs})


@routes.patch("/api/settings")
@traylm_errors
async def update_settings(request: web.Request) -> web.Response:
    """Body: {"section.field": value, ...}; all are applied or none."""
    d = daemon_of(request)
    body = await json_body(request)
    await d.update_settings(body)
    return ok({"settings": d.settings})


# --------------------------------------------------------------------------- engine envs


@routes.get("/api/envs")
@traylm_errors
async def envs(request: web.Request) -> web.Response:
    d = daemon_of(request)
    found = await asyncio.to_thread(d.envs.list)
    return ok([env_summary(e) for e in found])


@routes.get("/api/envs/{name}/doctor")
@traylm_errors
async def env_doctor(request: web.Request) -> web.Response:
    d = daemon_of(request)
    name = request.match_info["name"]
    for env in await asyncio.to_thread(d.envs.list):
        if env.name == name:
            return ok({"env": env_summary(env), "checks": await d.envs.doctor(env)})
    raise ConfigError(f"no engine environment named {name!r}")


@routes.post("/api/envs")
@traylm_errors
async def install_env(request: web.Request) -> web.Response:
    """Body: {"engine": "vllm", "device": "cpu"|"cuda"|"auto", "version": null}. Starts the
    install in the background; progress arrives as ``env.install`` events."""
    d = daemon_of(request)
    body = await json_body(request)
    engine = str(body.get("engine", ""))
    device = str(body.get("device") or "auto")
    version = body.get("version")
    job = d.install_env(engine, device=device, version=str(version) if version else None)
    return ok(job, status=202)


# --------------------------------------------------------------------------- events


@routes.get("/api/events")
async def events(request: web.Request) -> web.StreamResponse:
    """Server-sent events; ``?kinds=engine,notice`` filters by kind or kind prefix."""
    d = daemon_of(request)
    kinds_param = request.query.get("kinds")
    kinds = (
        frozenset(k.strip() for k in kinds_param.split(",") if k.strip()) if kinds_param else None
    )
    resp = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    # subscribed before the first byte: a client that has seen the stream open misses nothing
    with d.bus.subscribe(kinds) as sub:
        await resp.prepare(request)
        await resp.write(b": traylm events\n\n")
        while True:
            try:
                event = await asyncio.wait_for(sub.get(), SSE_KEEPALIVE_S)
            except TimeoutError:
                await resp.write(b": keep-alive\n\n")
                continue
            payload = json.dumps(event.to_wire(), separators=(",", ":"))
            try:
                await resp.write(f"event: {event.kind}\ndata: {payload}\n\n".encode())
            except (ConnectionResetError, RuntimeError):
                break
    with contextlib.suppress(ConnectionResetError, RuntimeError):
        await resp.write_eof()
    return resp
