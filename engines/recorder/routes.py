"""The flight recorder's routes (all under the control token):

GET /api/requests                  recorded requests, newest first: ?limit, before, after (ids
                                   of the ``order`` field: after= gives what came since, oldest
                                   first), model, status (a code, ok or error), client (local,
                                   lan), text (in the request body or the reply)
GET /api/requests/export           every replayable request as OpenAI Batch input JSONL
                                   (a {"traylm_skipped": N} last line: docs/concepts/recorder.md)
GET /api/requests/{id}             one request: metadata, request body, reply
GET /api/requests/{id}/prompt      the prompt as its engine templated it (asks the engine)
"""

from __future__ import annotations

import re

from aiohttp import web

from engines.core.http import ok, traylm_errors
from engines.errors import ConfigError
from engines.events.gateway import CLIENTS
from engines.recorder.service import RequestRecorder

REQUESTS: web.AppKey[RequestRecorder] = web.AppKey("requests", RequestRecorder)
"""``request.app[REQUESTS]``: the flight recorder (mounted by the daemon)."""

_RID = re.compile(r"^req_[0-9a-f]{24}$")
MAX_LIST = 1000


def requests_routes() -> list[web.RouteDef]:
    return [
        web.get("/api/requests", traylm_errors(list_requests)),
        web.get("/api/requests/export", traylm_errors(export_requests)),
        web.get("/api/requests/{rid}", traylm_errors(get_request)),
        web.get("/api/requests/{rid}/prompt", traylm_errors(get_prompt)),
    ]


def _rid(request: web.Request) -> str:
    rid = request.match_info["rid"]
    if not _RID.match(rid):
        raise ConfigError(
            f"{rid[:80]!r} is not a request id (req_ and 24 hex digits, as x-request-id "
            "and `traylm requests ls` show them)"
        )
    return rid


def _int(request: web.Request, name: str, default: int | None) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    if not raw.isdigit():
        raise ConfigError(f"{name} must be a whole number, not {raw[:40]!r}")
    return int(raw)


async def list_requests(request: web.Request) -> web.Response:
    q = request.query
    status = q.get("status", "")
    if status and status not in ("ok", "error") and not status.isdigit():
        raise ConfigError(f"status must be an HTTP code, ok or error, not {status[:40]!r}")
    client = q.get("client", "")
    if client and client not in CLIENTS:
        raise ConfigError(f"client must be one of {', '.join(CLIENTS)}, not {client[:40]!r}")
    rows = await request.app[REQUESTS].summaries(
        limit=min(_int(request, "limit", 100) or 100, MAX_LIST),
        before_id=_int(request, "before", None),
        after_id=_int(request, "after", None),
        model=q.get("model", ""),
        status=status,
        client=client,
        text=q.get("text", "")[:500],
    )
    return ok(rows)


async def get_request(request: web.Request) -> web.Response:
    return ok(await request.app[REQUESTS].get(_rid(request)))


async def get_prompt(request: web.Request) -> web.Response:
    return ok(await request.app[REQUESTS].prompt(_rid(request)))


async def export_requests(request: web.Request) -> web.StreamResponse:
    """Streamed a page at a time; the last line is ``{"traylm_skipped": N}`` (requests with no
    whole JSON body kept), which `traylm requests export` reads and does not write."""
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await resp.prepare(request)
    async for page in request.app[REQUESTS].export_pages():
        if isinstance(page, int):
            await resp.write(b'{"traylm_skipped": %d}\n' % page)
        elif page:
            await resp.write(page.encode())
    await resp.write_eof()
    return resp
