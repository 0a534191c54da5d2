"""The /api/gpus routes (control API, token-protected like the rest of /api).

    GET  /api/gpus                          GPUOverview: static info, latest snapshot, helper,
                                            energy per engine, PSU headroom, simulated flag
    GET  /api/gpus/history?seconds=N&points=M   tuple of GPUHistory (ring buffer + SQLite)
    GET  /api/gpus/presets                  GPUPresets (fan curves, power limits)
    GET  /api/gpus/guard                    GuardStatus
    PUT  /api/gpus/guard[?dry_run=1]        {"guard_stop_margin_c": 3, ...} → GuardStatus
    GET  /api/gpus/{gpu}/fans               GPUFanStatus
    PUT  /api/gpus/{gpu}/fans[?dry_run=1]   {"preset": "quiet"} or {"curve": {...}}, optional
                                            "fans": [0, 1], "persist": true → FanCurveResult
    POST /api/gpus/{gpu}/fans/auto          fans back to the firmware ({gpu} may be "all")
    GET  /api/gpus/{gpu}/power              PowerLimitStatus
    PUT  /api/gpus/{gpu}/power[?dry_run=1]  {"watts": 300} or {"preset": "efficient"},
                                            optional "persist": true → PowerLimitStatus
    POST /api/gpus/{gpu}/power/reset        default power limit ({gpu} may be "all")
    GET  /api/gpus/profiles                 EfficiencyProfiles: names, descriptions, the one
                                            in force on each GPU, the user's unreadable files
    POST /api/gpus/profile                  {"name": "eco"}: an efficiency profile on every GPU
    GET  /api/gpus/{gpu}/programs           simulated GPUs: the other programs on it
    POST /api/gpus/{gpu}/programs           simulated GPUs: {"name": "blender", "memory_gib": 12}
                                            → SimulatedProgram (201); real GPUs: 409
    DELETE /api/gpus/{gpu}/programs/{program}   simulated GPUs: it exits (pid or name)

``{gpu}`` is a UUID or an NVML index. Writes go through traylm-gpud; without it they answer 409
``helper_unavailable`` with the install steps, and dry runs still validate.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web

from engines.core.http import json_body, ok, query_flag, query_float, query_int, traylm_errors
from engines.errors import ConfigError
from engines.events.gpu import (
    EfficiencyProfileEntry,
    EfficiencyProfiles,
    FanCurve,
    FanCurveResult,
    GPUEntry,
    GPUFanStatus,
    GPUInfo,
    GPUOverview,
    GPUPresets,
    GuardStatus,
    PowerLimitStatus,
)
from engines.gpu import efficiency, sim_programs
from engines.gpu import fans as fan_curves
from engines.gpu import power as power_presets
from engines.gpu.backend import find_info
from engines.gpu.guard import THRESHOLD_FIELDS, GuardThresholds
from engines.gpu.history import build_history
from engines.gpu.service import GPUFeature

routes = web.RouteTableDef()
MAX_HISTORY_S = 7 * 86400


GPU: web.AppKey[GPUFeature] = web.AppKey("gpu", GPUFeature)
"""``request.app[GPU]``: the GPU feature these routes act on (mounted by the daemon)."""


def gpu_routes() -> list[web.RouteDef]:
    return list(routes)  # type: ignore[arg-type]


def _feature(request: web.Request) -> GPUFeature:
    return request.app[GPU]


def _dry_run(request: web.Request) -> bool:
    return query_flag(request, "dry_run")


def _check_keys(body: dict[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(body) - allowed)
    if extra:
        raise ConfigError(
            f"unknown fields {', '.join(extra)}; allowed: {', '.join(sorted(allowed))}"
        )


def _persist(body: dict[str, Any]) -> bool:
    value = body.get("persist", True)
    if not isinstance(value, bool):
        raise ConfigError("persist must be true or false")
    return value


# --------------------------------------------------------------------------- overview, history


@routes.get("/api/gpus")
@traylm_errors
async def overview(request: web.Request) -> web.Response:
    f = _feature(request)
    latest = {s.uuid: s for s in f.sampler.latest}
    entries = tuple(
        GPUEntry(info=i, snapshot=latest.get(i.uuid), guard_level=f.guard.level(i.uuid))
        for i in f.sampler.infos
    )
    return ok(
        GPUOverview(
            backend=f.backend.name,
            simulated=f.backend.simulated,
            state=f.sampler.state,
            message=f.sampler.message,
            gpus=entries,
            helper=f.helper_status(),
            energy=tuple(f.energy.values()),
            psu=f.psu(),
            sample_interval_s=f.sampler.interval_s,
            paused=f.gateway.paused,
            profile=f.controls.profile([i.uuid for i in f.sampler.infos]),
        )
    )


@routes.get("/api/gpus/history")
@traylm_errors
async def history(request: web.Request) -> web.Response:
    f = _feature(request)
    seconds = query_float(request, "seconds", default=600, lo=1, hi=MAX_HISTORY_S)
    points = query_int(request, "points", default=600, lo=2, hi=5000)
    now = time.time()
    since = now - seconds
    ring = list(f.sampler.ring)
    oldest_ring = ring[0][0].ts_s if ring and ring[0] else now
    rows = []
    if since < oldest_ring:
        rows = await asyncio.to_thread(f.history.rows, since, oldest_ring)
    result = build_history(
        uuids=[(i.uuid, i.index) for i in f.sampler.infos],
        ring=ring,
        rows=rows,
        resolution_s=f.sampler.interval_s,
        points=points,
        since_s=since,
        simulated=f.backend.simulated,
    )
    return ok(result)


@routes.get("/api/gpus/presets")
@traylm_errors
async def presets(request: web.Request) -> web.Response:
    fans = await asyncio.to_thread(fan_curves.load_presets)
    power = await asyncio.to_thread(power_presets.load_presets)
    return ok(GPUPresets(fans=fans, power=power))


# --------------------------------------------------------------------------- guard


def _guard_status(f: GPUFeature) -> GuardStatus:
    th = GuardThresholds.from_settings(f.settings.current.gpu)
    return GuardStatus(
        enabled=th.enabled,
        thresholds=th.as_mapping(),
        gpus=f.guard.status(),
        actions=tuple(f.guard.actions),
        problem="; ".join(th.problems()),
    )


@routes.get("/api/gpus/guard")
@traylm_errors
async def guard(request: web.Request) -> web.Response:
    return ok(_guard_status(_feature(request)))


@routes.put("/api/gpus/guard")
@traylm_errors
async def set_guard(request: web.Request) -> web.Response:
    """Body: any of guard_enabled and the guard_* thresholds; all applied or none."""
    from engines.config.sections import replace_setting

    f = _feature(request)
    body = await json_body(request)
    _check_keys(body, {"guard_enabled", *THRESHOLD_FIELDS})
    changes = {f"gpu.{k}": v for k, v in body.items()}
    new = f.settings.current
    for dotted, value in changes.items():
        new = replace_setting(new, dotted, value)
    problems = GuardThresholds.from_settings(new.gpu).problems()
    if problems:
        raise ConfigError("guard thresholds refused: " + "; ".join(problems))
    if not _dry_run(request):
        await f.settings.update(changes)  # the feature's subscription gives the guard them
        return ok(_guard_status(f))
    status = _guard_status(f)
    th = GuardThresholds.from_settings(new.gpu)
    return ok(GuardStatus(enabled=th.enabled, thresholds=th.as_mapping(), gpus=status.gpus))


# --------------------------------------------------------------------------- fans


def _info(f: GPUFeature, gpu: str) -> GPUInfo:
    return find_info(f.infos(), gpu)


@routes.get("/api/gpus/{gpu}/fans")
@traylm_errors
async def fans(request: web.Request) -> web.Response:
    f = _feature(request)
    info = _info(f, request.match_info["gpu"])
    snap = next((s for s in f.sampler.latest if s.uuid == info.uuid), None)
    helper = f.helper_status()
    return ok(
        GPUFanStatus(
            uuid=info.uuid,
            index=info.index,
            name=info.name,
            readings=snap.fans if snap is not None else (),
            controls=tuple(c for c in helper.fans if c.uuid == info.uuid),
            min_pct=info.fan_min_pct,
            max_pct=info.fan_max_pct,
            helper_available=helper.available,
            simulated=f.backend.simulated,
        )
    )


@routes.put("/api/gpus/{gpu}/fans")
@traylm_errors
async def set_fans(request: web.Request) -> web.Response:
    f = _feature(request)
    info = _info(f, request.match_info["gpu"])
    body = await json_body(request)
    _check_keys(body, {"preset", "curve", "fans", "persist"})
    curve = _curve(body)
    fan_ids = fan_curves.fan_ids(body.get("fans"), info)
    persist = _persist(body)
    warnings = fan_curves.validate_curve(curve, min_pct=info.fan_min_pct, max_pct=info.fan_max_pct)
    result = FanCurveResult(
        uuid=info.uuid,
        fans=fan_ids,
        curve=curve,
        applied=False,
        persist=persist,
        preview=fan_curves.preview(curve),
        warnings=warnings,
    )
    if _dry_run(request):
        return ok(result)
    said = await f.controls.apply_curve(info, curve, fan_ids, persist=persist)
    extra = tuple(w for w in said if w not in warnings)
    return ok(
        FanCurveResult(
            uuid=info.uuid,
            fans=fan_ids,
            curve=curve,
            applied=True,
            persist=persist,
            preview=result.preview,
            warnings=(*warnings, *extra),
        )
    )


def _curve(body: dict[str, Any]) -> FanCurve:
    if ("preset" in body) == ("curve" in body):
        raise ConfigError('give either "preset" (a preset name) or "curve" (an object with points)')
    if "preset" in body:
        return fan_curves.preset(str(body["preset"]))
    if not isinstance(body["curve"], dict):
        raise ConfigError('"curve" must be an object: {"points": [[40, 30], [80, 100]]}')
    return fan_curves.curve_from_mapping(body["curve"])


@routes.post("/api/gpus/{gpu}/fans/auto")
@traylm_errors
async def fans_auto(request: web.Request) -> web.Response:
    f = _feature(request)
    gpu = request.match_info["gpu"]
    target = "all" if gpu == "all" else _info(f, gpu).uuid
    return ok({"gpus": await f.controls.restore_fans(target)})


# --------------------------------------------------------------------------- power


def _power_status(
    f: GPUFeature,
    info: GPUInfo,
    *,
    requested: int | None = None,
    applied: bool = False,
    persist: bool = False,
) -> PowerLimitStatus:
    snap = next((s for s in f.sampler.latest if s.uuid == info.uuid), None)
    control = next((p for p in f.helper_status().power if p.uuid == info.uuid), None)
    return PowerLimitStatus(
        uuid=info.uuid,
        index=info.index,
        name=info.name,
        enforced_mw=snap.power_limit_mw if snap is not None else None,
        default_mw=info.power_default_mw,
        min_mw=info.power_min_mw,
        max_mw=info.power_max_mw,
        requested_mw=requested,
        applied=applied,
        persist=persist,
        controlled_by=control.source if control is not None else "",
        simulated=f.backend.simulated,
    )


@routes.get("/api/gpus/{gpu}/power")
@traylm_errors
async def power(request: web.Request) -> web.Response:
    f = _feature(request)
    return ok(_power_status(f, _info(f, request.match_info["gpu"])))


@routes.put("/api/gpus/{gpu}/power")
@traylm_errors
async def set_power(request: web.Request) -> web.Response:
    f = _feature(request)
    info = _info(f, request.match_info["gpu"])
    body = await json_body(request)
    _check_keys(body, {"watts", "preset", "persist"})
    persist = _persist(body)
    limit_mw = power_presets.resolve_request(
        info, watts=body.get("watts"), preset=body.get("preset")
    )
    if _dry_run(request):
        return ok(_power_status(f, info, requested=limit_mw, persist=persist))
    default = limit_mw == info.power_default_mw and body.get("preset") is not None
    await f.controls.set_power(info, limit_mw, default=default, persist=persist)
    return ok(_power_status(f, info, requested=limit_mw, applied=True, persist=persist))


@routes.get("/api/gpus/profiles")
@traylm_errors
async def list_profiles(request: web.Request) -> web.Response:
    f = _feature(request)
    profiles, problems = await asyncio.to_thread(efficiency.scan_profiles)
    entries = tuple(
        EfficiencyProfileEntry(name=p.name, description=p.description, builtin=p.builtin)
        for p in profiles.values()
    )
    return ok(
        EfficiencyProfiles(
            profiles=entries,
            in_force=dict(f.controls.in_force),
            problems=tuple(problems.values()),
            simulated=f.backend.simulated,
        )
    )


@routes.post("/api/gpus/profile")
@traylm_errors
async def set_profile(request: web.Request) -> web.Response:
    """{"name": "eco"}: apply an efficiency profile (engines.gpu.efficiency) to every GPU.
    Every GPU's targets are resolved and checked before the first write."""
    f = _feature(request)
    body = await json_body(request)
    _check_keys(body, {"name"})
    name = body.get("name")
    return ok({"profile": name, "gpus": await f.apply_efficiency(name)})


@routes.post("/api/gpus/{gpu}/power/reset")
@traylm_errors
async def power_reset(request: web.Request) -> web.Response:
    f = _feature(request)
    gpu = request.match_info["gpu"]
    target = "all" if gpu == "all" else _info(f, gpu).uuid
    return ok({"gpus": await f.controls.reset_power(target)})


# --------------------------------------------------------------------------- simulated programs


@routes.get("/api/gpus/{gpu}/programs")
@traylm_errors
async def programs(request: web.Request) -> web.Response:
    f = _feature(request)
    sim_programs.simulator(f.backend)  # before the GPUs: none here is a 409 too, not a 503
    return ok(sim_programs.listing(f.backend, f.infos(), request.match_info["gpu"]))


@routes.post("/api/gpus/{gpu}/programs")
@traylm_errors
async def start_program(request: web.Request) -> web.Response:
    f = _feature(request)
    sim_programs.simulator(f.backend)  # before the body: real GPUs answer 409 whatever it says
    body = await json_body(request)
    program = sim_programs.start(f.backend, f.infos(), request.match_info["gpu"], body)
    return ok(program, status=201)


@routes.delete("/api/gpus/{gpu}/programs/{program}")
@traylm_errors
async def stop_program(request: web.Request) -> web.Response:
    f = _feature(request)
    sim_programs.simulator(f.backend)
    gpu, which = request.match_info["gpu"], request.match_info["program"]
    return ok({"stopped": sim_programs.stop(f.backend, f.infos(), gpu, which)})
