"""OpenAI's Batch API on the gateway's port, under the same API keys as every /v1 route; a
batch belongs to the caller that created it (``Guard.caller``), as its files do:

POST /v1/batches               {"input_file_id", "endpoint", "completion_window": "24h"}
GET  /v1/batches               the caller's batches, newest first (``?after=ID&limit=N``)
GET  /v1/batches/{id}          one Batch object, its ``request_counts`` current
POST /v1/batches/{id}/cancel   stop it; what finished is kept in its output and error files

and for traylm's own tools (`traylm batches`, the app), under the control token, every
caller's batches:

GET  /api/batches              newest first (``?limit=N``)
GET  /api/batches/{id}         one
POST /api/batches/{id}/cancel  stop it
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from aiohttp import web

from engines.batch.service import BatchFeature
from engines.batch.validate import check_endpoint
from engines.core.http import query_int, traylm_errors
from engines.errors import BatchNotFound, ConfigError, quoted
from engines.gateway.responses import caller_of
from engines.gateway.service import GATEWAY
from engines.gateway.shapes import api_error

BATCHES: web.AppKey[BatchFeature] = web.AppKey("batches", BatchFeature)
"""``request.app[BATCHES]``: the batches (mounted by the daemon)."""

BATCH_ROUTES = (
    "POST /v1/batches",
    "GET /v1/batches",
    "GET /v1/batches/{id}",
    "POST /v1/batches/{id}/cancel",
)
WINDOWS = ("24h",)
LIST_LIMIT_MAX = 100
METADATA_MAX_KEYS = 16
_BATCH_ID = re.compile(r"^batch_[0-9a-f]{24}$")


def batch_routes() -> list[web.RouteDef]:
    return [
        web.post("/v1/batches", create),
        web.get("/v1/batches", list_batches),
        web.get("/v1/batches/{batch_id}", retrieve),
        web.post("/v1/batches/{batch_id}/cancel", cancel),
        web.get("/api/batches", traylm_errors(control_list)),
        web.get("/api/batches/{batch_id}", traylm_errors(control_get)),
        web.post("/api/batches/{batch_id}/cancel", traylm_errors(control_cancel)),
    ]


def _owner(request: web.Request) -> str:
    return caller_of(request.app[GATEWAY], request)


def _not_found(request: web.Request, batch_id: str) -> web.Response:
    return api_error(
        request.path, 404, f"no batch {batch_id[:80]!r} (see GET /v1/batches)", type_="not_found"
    )


async def create(request: web.Request) -> web.Response:
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError):
        return api_error(request.path, 400, "the body is not JSON; send a JSON object")
    try:
        file_id, endpoint, meta = _create_args(body)
        record = await request.app[BATCHES].create(_owner(request), file_id, endpoint, meta)
    except ConfigError as exc:
        return api_error(request.path, 400, exc.message)
    return web.json_response(record)


def _create_args(body: object) -> tuple[str, str, dict[str, str] | None]:
    """The input file id, endpoint and metadata of a create, or ConfigError saying what is
    wrong."""
    if not isinstance(body, dict):
        raise ConfigError("the body must be a JSON object with input_file_id and endpoint")
    file_id = body.get("input_file_id")
    if not isinstance(file_id, str) or not file_id:
        raise ConfigError("input_file_id is missing; upload the input with POST /v1/files")
    endpoint = check_endpoint(body.get("endpoint"))
    window = body.get("completion_window", "24h")
    if window not in WINDOWS:
        raise ConfigError(f"completion_window must be one of {', '.join(WINDOWS)}, not {window!r}")
    meta = body.get("metadata")
    if meta is not None and (
        not isinstance(meta, dict)
        or len(meta) > METADATA_MAX_KEYS
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items())
    ):
        raise ConfigError(f"metadata must be at most {METADATA_MAX_KEYS} text keys and values")
    return file_id, endpoint, meta


async def list_batches(request: web.Request) -> web.Response:
    after = request.query.get("after") or None
    try:
        limit = int(request.query.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= LIST_LIMIT_MAX:
        return api_error(
            request.path, 400, f"limit must be a whole number from 1 to {LIST_LIMIT_MAX}"
        )
    feature = request.app[BATCHES]
    rows = await asyncio.to_thread(feature.page, _owner(request), after, limit + 1)
    data: list[dict[str, Any]] = rows[:limit]
    return web.json_response(
        {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": len(rows) > limit,
        },
        dumps=json.dumps,
    )


async def retrieve(request: web.Request) -> web.Response:
    batch_id = request.match_info["batch_id"]
    found = None
    if _BATCH_ID.match(batch_id):
        found = await asyncio.to_thread(request.app[BATCHES].get, batch_id, _owner(request))
    return web.json_response(found) if found else _not_found(request, batch_id)


async def cancel(request: web.Request) -> web.Response:
    batch_id = request.match_info["batch_id"]
    if not _BATCH_ID.match(batch_id):
        return _not_found(request, batch_id)
    found = await request.app[BATCHES].cancel(batch_id, _owner(request))
    return web.json_response(found) if found else _not_found(request, batch_id)


def _control_id(request: web.Request) -> str:
    batch_id = request.match_info["batch_id"]
    if not _BATCH_ID.match(batch_id):
        raise BatchNotFound(f"no batch {quoted(batch_id)} (`traylm batches ls` lists them)")
    return batch_id


async def control_list(request: web.Request) -> web.Response:
    limit = query_int(request, "limit", default=LIST_LIMIT_MAX, lo=1, hi=10_000)
    return web.json_response(await asyncio.to_thread(request.app[BATCHES].every, limit))


async def control_get(request: web.Request) -> web.Response:
    batch_id = _control_id(request)
    found = await asyncio.to_thread(request.app[BATCHES].get, batch_id, None)
    if found is None:
        raise BatchNotFound(f"no batch {quoted(batch_id)} (`traylm batches ls` lists them)")
    return web.json_response(found)


async def control_cancel(request: web.Request) -> web.Response:
    batch_id = _control_id(request)
    found = await request.app[BATCHES].cancel(batch_id, None)
    if found is None:
        raise BatchNotFound(f"no batch {quoted(batch_id)} (`traylm batches ls` lists them)")
    return web.json_response(found)
