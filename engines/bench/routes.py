"""The /api/bench routes (listed in engines/bench/service.py's docstring)."""

from __future__ import annotations

import asyncio

from aiohttp import web

from engines.bench.report import render_report
from engines.bench.runs import summary
from engines.bench.service import BenchFeature, config_from_body
from engines.core.http import (
    MAX_ID,
    json_body,
    ok,
    query_int,
    query_text,
    traylm_errors,
    whole_number,
)
from engines.errors import ConfigError

routes = web.RouteTableDef()
MAX_REPORT_RUNS = 12


BENCH: web.AppKey[BenchFeature] = web.AppKey("bench", BenchFeature)
"""``request.app[BENCH]``: the benchmark feature these routes act on (mounted by the daemon)."""


def bench_routes() -> list[web.RouteDef]:
    return list(routes)  # type: ignore[arg-type]


def _feature(request: web.Request) -> BenchFeature:
    return request.app[BENCH]


def _run_id(text: str) -> int:
    try:
        return whole_number(text.strip(), "a run id", lo=0, hi=MAX_ID)
    except ConfigError as exc:
        raise ConfigError(f"{exc.message}; `traylm bench ls` lists them") from None


@routes.get("/api/bench/runs")
@traylm_errors
async def list_runs(request: web.Request) -> web.Response:
    f = _feature(request)
    limit = query_int(request, "limit", default=200, lo=1, hi=MAX_ID)
    return ok(await asyncio.to_thread(f.runs.list, min(limit, 10_000)))


@routes.post("/api/bench/runs")
@traylm_errors
async def start_run(request: web.Request) -> web.Response:
    f = _feature(request)
    config, api_key = config_from_body(await json_body(request))
    return ok(await f.start_run(config, api_key=api_key), status=202)


@routes.get("/api/bench/runs/{run_id}")
@traylm_errors
async def get_run(request: web.Request) -> web.Response:
    f = _feature(request)
    run_id = _run_id(request.match_info["run_id"])
    current = f.current
    if current is not None and current.id == run_id:
        return ok(current)
    return ok(await asyncio.to_thread(f.runs.get, run_id))


@routes.delete("/api/bench/runs/{run_id}")
@traylm_errors
async def delete_run(request: web.Request) -> web.Response:
    f = _feature(request)
    run_id = _run_id(request.match_info["run_id"])
    f.check_not_running(run_id)
    await asyncio.to_thread(f.runs.delete, run_id)
    return ok({"deleted": run_id})


@routes.post("/api/bench/runs/{run_id}/cancel")
@traylm_errors
async def cancel_run(request: web.Request) -> web.Response:
    f = _feature(request)
    run = await f.cancel(_run_id(request.match_info["run_id"]))
    return ok(summary(run))


@routes.get("/api/bench/current")
@traylm_errors
async def current(request: web.Request) -> web.Response:
    f = _feature(request)
    run = f.current
    return ok({"run": summary(run) if run else None, "progress": f.progress})


@routes.get("/api/bench/report")
@traylm_errors
async def report(request: web.Request) -> web.Response:
    f = _feature(request)
    ids = [_run_id(x) for x in query_text(request, "ids", max_chars=10_000).split(",") if x.strip()]
    if not ids or len(ids) > MAX_REPORT_RUNS:
        raise ConfigError(f"give ?ids=1 or ?ids=1,2 (at most {MAX_REPORT_RUNS} runs)")
    runs = [await asyncio.to_thread(f.runs.get, i) for i in ids]
    html = await asyncio.to_thread(render_report, runs)
    return web.Response(text=html, content_type="text/html", charset="utf-8")
