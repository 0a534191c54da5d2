"""The control API under /api: status, engines, profiles, settings, engine envs, events (SSE).

Guarded by the token in daemon.json (checked in the security middleware) plus the same Host and
Origin checks as /v1. Errors use the OpenAI error shape with traylm's error code as ``type``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from aiohttp import web

from engines.config.fields import doc
from engines.config.profiles import (
    ACROSS_BOXES_WARNING,
    Profile,
    check_name,
    profile_from_mapping,
    profile_to_mapping,
)
from engines.config.sections import SECTIONS
from engines.control.service import ControlAPI, adhoc_profile
from engines.core.http import (
    error_response,
    event_stream,
    json_body,
    ok,
    query_flag,
    query_int,
    query_text,
    traylm_errors,
)
from engines.core.waiting import within
from engines.envs.manager import env_summary
from engines.errors import ConfigError, EngineEnvError, TraylmError, quoted
from engines.events.codec import to_plain

log = logging.getLogger(__name__)
MAX_LOG_LINES = 1_000_000  # past any ring; 0 asks for all lines
routes = web.RouteTableDef()
SSE_KEEPALIVE_S = 15.0

CONTROL: web.AppKey[ControlAPI] = web.AppKey("control", ControlAPI)
"""``request.app[CONTROL]``: what these routes act on (mounted by the daemon)."""


def control_routes() -> list[web.RouteDef]:
    return list(routes)  # type: ignore[arg-type]


def _api(request: web.Request) -> ControlAPI:
    return request.app[CONTROL]


def _name(request: web.Request, key: str = "name", what: str = "profile") -> str:
    """The name in the path, refused (400, with the rule) before any action unless it is a
    valid profile name; engine ids are profile names."""
    return check_name(request.match_info[key], what)


# --------------------------------------------------------------------------- status


@routes.get("/api/status")
@traylm_errors
async def status(request: web.Request) -> web.Response:
    return ok(_api(request).status.report())


@routes.post("/api/shutdown")
@traylm_errors
async def shutdown(request: web.Request) -> web.Response:
    """Body (optional): {"close_apps": true} closes the tray app too (`traylm shutdown`)."""
    body = await json_body(request) if request.can_read_body else {}
    close_apps = body.get("close_apps") is True
    _api(request).request_stop("asked through the control API", close_apps=close_apps)
    return ok({"stopping": True, "close_apps": close_apps}, status=202)


# --------------------------------------------------------------------------- engines


@routes.get("/api/engines")
@traylm_errors
async def engines(request: web.Request) -> web.Response:
    return ok(_api(request).engines.statuses())


@routes.post("/api/engines")
async def start_engine(request: web.Request) -> web.Response:
    """Body: {"profile": NAME} or an ad-hoc profile {"model": M, "engine": "vllm", ...}."""
    api = _api(request)
    title = "cannot start engine"
    try:
        body = await json_body(request)
        if "profile" in body:
            title = f"cannot start {body['profile']}"
            profile = await api.load_profile(str(body["profile"]))
        else:
            profile = await asyncio.to_thread(adhoc_profile, dict(body))
            title = f"cannot start {profile.name}"
        status = await api.engines.start_engine(profile)
        if "profile" not in body and profile.model.startswith(("/", "~")):
            # a folder served with --model joins the library, to be started again by name
            await asyncio.to_thread(api.remember_folder, profile.model, profile.name)
        return ok(status, status=202)
    except TraylmError as exc:
        log.warning("%s: %s", title, exc.message)  # a refused start is in the daemon's log too
        api.engines.notify_error(title, exc)
        return error_response(exc)


@routes.post("/api/engines/command")
@traylm_errors
async def engine_command(request: web.Request) -> web.Response:
    """Body: {"profile": NAME}: the command line and environment a start of it would run on
    this computer; nothing is started."""
    api = _api(request)
    body = await json_body(request)
    profile = await api.load_profile(str(body.get("profile", "")))
    return ok(await api.engines.command_for(profile))


@routes.post("/api/engines/{engine_id}/stop")
@traylm_errors
async def stop_engine(request: web.Request) -> web.Response:
    return ok(await _api(request).engines.stop_engine(_name(request, "engine_id", "engine")))


@routes.post("/api/engines/{engine_id}/restart")
@traylm_errors
async def restart_engine(request: web.Request) -> web.Response:
    engine = _api(request).engines.engine(_name(request, "engine_id", "engine"))
    await engine.restart()
    return ok(engine.status(), status=202)


@routes.get("/api/engines/{engine_id}/logs")
@traylm_errors
async def engine_logs(request: web.Request) -> web.Response:
    tail = query_int(request, "tail", default=200, lo=0, hi=MAX_LOG_LINES)
    engine = _api(request).engines.engine(_name(request, "engine_id", "engine"))
    return ok(
        {
            "engine_id": engine.engine_id,
            "log_path": str(engine.log_path),
            "lines": engine.logs(tail),
        }
    )


# --------------------------------------------------------------------------- profiles


def _profile_view(api: ControlAPI, p: Profile) -> dict[str, Any]:
    return {"name": p.name, "preset": api.profiles.is_preset(p.name), "profile": to_plain(p)}


@routes.get("/api/profiles")
@traylm_errors
async def profiles(request: web.Request) -> web.Response:
    d = _api(request)
    good, broken = await asyncio.to_thread(d.profiles.load_all)
    return ok({"profiles": [_profile_view(d, p) for p in good], "broken": broken})


@routes.get("/api/profiles/{name}")
@traylm_errors
async def profile(request: web.Request) -> web.Response:
    d = _api(request)
    p = await asyncio.to_thread(d.profiles.load, _name(request))
    return ok(_profile_view(d, p))


@routes.put("/api/profiles/{name}")
@traylm_errors
async def save_profile(request: web.Request) -> web.Response:
    """Validate and save; ``?dry_run=1`` only validates (the profile editor's live check)."""
    d = _api(request)
    name = _name(request)
    body = await json_body(request)
    body.pop("name", None)
    p = profile_from_mapping(name, body)
    if not query_flag(request, "dry_run"):
        await asyncio.to_thread(d.profiles.save, p)
    warnings = [ACROSS_BOXES_WARNING] if p.boxes else []  # where it is turned on
    return ok({**_profile_view(d, p), "toml": profile_to_mapping(p), "warnings": warnings})


@routes.delete("/api/profiles/{name}")
@traylm_errors
async def delete_profile(request: web.Request) -> web.Response:
    d = _api(request)
    name = _name(request)
    await asyncio.to_thread(d.profiles.delete, name)
    return ok({"deleted": name})


# --------------------------------------------------------------------------- settings


@routes.get("/api/settings")
@traylm_errors
async def settings(request: web.Request) -> web.Response:
    d = _api(request)
    docs = {
        f"{name}.{field}": doc(cls, field)
        for name, cls in SECTIONS.items()
        for field in cls.__dataclass_fields__
    }
    return ok({"settings": d.settings.current, "docs": docs})


@routes.patch("/api/settings")
@traylm_errors
async def update_settings(request: web.Request) -> web.Response:
    """Body: {"section.field": value, ...}; all are applied or none. Answered once what the
    change moves while the daemon runs (Ollama's port) has moved, so the status read next
    says where it went."""
    d = _api(request)
    body = await json_body(request)
    settings = await d.settings.update(body)
    await d.settled()
    return ok({"settings": settings})


# --------------------------------------------------------------------------- engine envs


@routes.get("/api/envs")
@traylm_errors
async def envs(request: web.Request) -> web.Response:
    d = _api(request)
    found = await asyncio.to_thread(d.envs.list)
    return ok([env_summary(e) for e in found])


@routes.get("/api/envs/{name}/doctor")
@traylm_errors
async def env_doctor(request: web.Request) -> web.Response:
    d = _api(request)
    name = request.match_info["name"]
    for env in await asyncio.to_thread(d.envs.list):
        if env.name == name:
            return ok({"env": env_summary(env), "checks": await d.envs.doctor(env)})
    raise ConfigError(f"no engine environment named {quoted(name)}")


@routes.post("/api/envs")
@traylm_errors
async def install_env(request: web.Request) -> web.Response:
    """Body: {"engine": "vllm", "device": "cpu"|"cuda"|"auto", "version": null}. Starts the
    install in the background; progress arrives as ``env.install`` events."""
    d = _api(request)
    body = await json_body(request)
    engine = str(body.get("engine", ""))
    device = str(body.get("device") or "auto")
    version = body.get("version")
    job = d.engines.install_env(engine, device=device, version=str(version) if version else None)
    return ok(job, status=202)


@routes.post("/api/envs/install/cancel")
@traylm_errors
async def cancel_install(request: web.Request) -> web.Response:
    """Stop the running install; its half-made environment is removed (``env.install`` event
    with phase ``cancelled``). 409 when none runs."""
    if not await _api(request).engines.cancel_install():
        raise EngineEnvError("no engine install is running", code="not_installing")
    return ok({"cancelled": True})


# --------------------------------------------------------------------------- metrics, events


@routes.get("/api/metrics")
@traylm_errors
async def metrics(request: web.Request) -> web.Response:
    return ok({"text": _api(request).metrics_text()})


@routes.get("/api/events")
async def events(request: web.Request) -> web.StreamResponse:
    """Server-sent events; ``?kinds=engine,notice`` filters by kind or kind prefix."""
    d = _api(request)
    kinds_param = query_text(request, "kinds", max_chars=4096)
    kinds = (
        frozenset(k.strip() for k in kinds_param.split(",") if k.strip()) if kinds_param else None
    )
    resp = event_stream(request)
    # subscribed before the first byte: a client that has seen the stream open misses nothing
    with d.bus.subscribe(kinds) as sub:
        await resp.prepare(request)
        await resp.write(b": traylm events\n\n")
        while True:
            try:
                event = await within(SSE_KEEPALIVE_S, sub.get())
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
