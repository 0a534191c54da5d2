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

from engines.core.http import MAX_ID, ok, query_int, query_text, traylm_errors
from engines.errors import ConfigError, quoted
from engines.events.gateway import CLIENTS
from engines.recorder.service import RequestRecorder

REQUESTS: web.AppKey[RequestRecorder] = web.AppKey("requests", RequestRecorder)
"""``request.app[REQUESTS]``: the flight recorder (mounted by the daemon)."""

_RID = re.compile(r"^req_[0-9a-f]{24}$")
_STATUS = re.compile(r"[1-5][0-9][0-9]")
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
            f"{quoted(rid)} is not a request id (req_ and 24 hex digits, as x-request-id "
            "and `traylm requests ls` show them)"
        )
    return rid


async def list_requests(request: web.Request) -> web.Response:
    status = query_text(request, "status", max_chars=5)
    if status and status not in ("ok", "error") and not _STATUS.fullmatch(status):
        raise ConfigError(f"status must be an HTTP code, ok or error, not {quoted(status)}")
    client = query_text(request, "client", max_chars=20)
    if client and client not in CLIENTS:
        raise ConfigError(f"client must be one of {', '.join(CLIENTS)}, not {quoted(client)}")
    rows = await request.app[REQUESTS].summaries(
        limit=min(query_int(request, "limit", default=100, lo=1, hi=MAX_ID), MAX_LIST),
        before_id=query_int(request, "before", default=None, lo=0, hi=MAX_ID),
        after_id=query_int(request, "after", default=None, lo=0, hi=MAX_ID),
        model=query_text(request, "model"),
        status=status,
        client=client,
        text=query_text(request, "text", max_chars=100_000)[:500],
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
