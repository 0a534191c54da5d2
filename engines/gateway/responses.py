"""The Responses API's state: a new response is kept (response_keep.py: the flight recorder's
store, bounded and persisted, on every engine) for the caller that made it, and a request with
``previous_response_id`` goes to the engine self-contained. Retrieve, delete and input_items
and cancel are answered from what is kept (a kept response has ended: cancel is OpenAI's 400,
as for any response not made in the background); a background response (which only an engine
with its own store runs), and a response traylm did not keep, go to the engine that made it
(response_owners.py). An id the caller did not make (another API key; another computer when
keys are off) gets the same clear 404 as one never made.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from engines.core.http import openai_error
from engines.errors import quoted
from engines.events.core import EngineState
from engines.gateway.balance import Affinity
from engines.gateway.capabilities import explain_engine_error, route_problem
from engines.gateway.connections import is_loopback
from engines.gateway.forward import route_of
from engines.gateway.proxy import ReplySink, Rewrite, relay
from engines.gateway.response_ids import ReplyIds, new_id
from engines.gateway.response_keep import (
    NewResponse,
    ResponseStore,
    StreamKeeper,
    chained,
    input_items,
)
from engines.gateway.response_owners import MAX_REMEMBERED
from engines.gateway.response_replay import replay, replayable
from engines.gateway.service import GatewayContext
from engines.gateway.shapes import as_openai
from engines.gateway.upstream import Upstream

INPUT_ITEMS_MAX_LIMIT = 100


def caller_of(ctx: GatewayContext, request: web.Request) -> str:
    """Who a stored response made by ``request`` belongs to (``Guard.caller``)."""
    return ctx.guard.caller(
        request.headers.get("Authorization"),
        request.headers.get("x-api-key"),
        remote=request.remote,
        local=is_loopback(request.remote),
    )


def _store(ctx: GatewayContext) -> ResponseStore | None:
    return ctx.kept if ctx.kept is not None and ctx.kept.enabled else None


class Creating:
    """POST /v1/responses on its way (forward.py's ``ReplyWatch``): the new response's id
    noted as its caller's (the owners map), and the response kept unless it asked
    ``store: false``."""

    def __init__(
        self,
        ctx: GatewayContext,
        caller: str,
        payload: Mapping[str, Any],
        store: ResponseStore | None,
    ) -> None:
        """``store``: None when traylm keeps no responses (an engine may)."""
        self._ctx, self._caller, self._store = ctx, caller, store
        self._input = input_items(payload)
        previous = payload.get("previous_response_id")
        self._previous = previous if isinstance(previous, str) else ""
        # a background response is the engine's to run, retrieve and cancel: its own id
        self._own = store is not None and payload.get("background") is not True

    def rewriter(self) -> Rewrite | None:
        """A kept response's ids: a new one of traylm's each time the reply begins (a
        request moved to another replica starts over)."""
        return ReplyIds(new_id(), self._previous) if self._own else None

    def first_events(self, engine_id: str, data: bytes) -> None:
        self._ctx.responses.record(engine_id, data, caller=self._caller)

    def whole(self, engine_id: str, body: bytes) -> None:
        self._ctx.responses.record(engine_id, body, caller=self._caller)
        if self._store is not None:
            self._keep(engine_id, body, streamed=False)

    def tap(self, engine_id: str, inner: ReplySink | None) -> ReplySink | None:
        if self._store is None:
            return inner
        return StreamKeeper(functools.partial(self._keep, engine_id, streamed=True), inner)

    def _keep(self, engine_id: str, reply: bytes, *, streamed: bool) -> None:
        assert self._store is not None
        new = NewResponse(self._caller, engine_id, self._input, self._previous, reply, streamed)
        self._store.keep(new)


async def on_create(
    ctx: GatewayContext, request: web.Request, payload: Mapping[str, Any]
) -> tuple[Creating | None, dict[str, Any] | None] | web.Response:
    """For POST /v1/responses: what watches the reply (None for ``store: false``: not
    retrievable) and the request for the engine (None: as received; self-contained for a
    ``previous_response_id``), or the 404 for a ``previous_response_id`` not kept for this
    caller (another caller's would hand that conversation over)."""
    caller = caller_of(ctx, request)
    previous = payload.get("previous_response_id")
    store = _store(ctx)
    if store is None:  # kept by the engine, if at all
        if (
            isinstance(previous, str)
            and previous in ctx.responses
            and ctx.responses.engine_for(previous, caller) is None
        ):
            return _not_found(ctx, previous, param="previous_response_id")
        return Creating(ctx, caller, payload, None), None
    request_now = None
    if isinstance(previous, str) and previous:
        history = await store.history(previous, caller)
        if history is None:
            return _not_found(ctx, previous, param="previous_response_id")
        request_now = chained(payload, history)
    if payload.get("store") is False:
        return None, request_now
    return Creating(ctx, caller, payload, store), request_now


def stays_here(ctx: GatewayContext, model: str) -> web.Response | None:
    """For a Responses request whose model is not served here: the 404 saying why when a
    paired box serves it (the Responses API is never passed to another box: its kept
    responses, and so every ``previous_response_id`` chain, live on this box); None else."""
    if ctx.routing.upstream(model) is not None:
        return None
    elsewhere = ctx.routing.upstream(model, Affinity(boxes=True))
    if elsewhere is None or not elsewhere.box:
        return None
    return openai_error(
        404,
        f"{model!r} is served here only by the paired box {elsewhere.box!r}, and the Responses "
        "API stays on this box: the responses it keeps, which previous_response_id and "
        "retrieve read, live here, so it is never passed to another box. Use "
        f"/v1/chat/completions for {model!r} (paired boxes serve it), or load the model here "
        f"(`traylm load {model}`)",
        param="model",
        code="model_not_found",
    )


async def stored_response(ctx: GatewayContext, request: web.Request) -> web.StreamResponse:
    """GET /v1/responses/{response_id}, POST /v1/responses/{response_id}/cancel, DELETE
    /v1/responses/{response_id} and GET /v1/responses/{response_id}/input_items."""
    response_id = request.match_info["response_id"]
    caller = caller_of(ctx, request)
    store = _store(ctx)
    if store is not None:
        answer = await _from_store(store, request, response_id, caller)
        if answer is not None:
            if request.method == "DELETE":
                ctx.responses.forget(response_id)
            return answer
    engine_id = ctx.responses.engine_for(response_id, caller)
    if engine_id is None:
        return _not_found(ctx, response_id, param="response_id")
    engine = ctx.routing.engines.get(engine_id)
    if engine is None or engine.state != EngineState.READY or not engine.base_url:
        state = engine.state if engine is not None else "gone"
        return openai_error(
            404,
            f"response {response_id!r} was made by engine {engine_id!r}, which is {state}; "
            "an engine keeps its responses in memory only while it runs",
            param="response_id",
            code="response_not_found",
        )
    caps = await ctx.capabilities.of(engine)
    model = engine.served_names[0]
    problem = route_problem(caps, request.method, route_of(request), request.path, model)
    if problem is not None:  # a version with create but without retrieve or cancel
        return problem
    upstream = Upstream(engine.engine_id, engine.base_url, {})
    resp = await _relay_stored(request, ctx, upstream)
    if resp.prepared or not isinstance(resp, web.Response) or resp.status < 400:
        return resp
    if store is not None and resp.status == 404:  # traylm keeps responses, not this one
        return _not_found(ctx, response_id, param="response_id")
    explained = explain_engine_error(
        caps,
        resp,
        method=request.method,
        route=route_of(request),
        path=request.path,
        model=model,
    )
    return as_openai(explained)


async def _from_store(
    store: ResponseStore, request: web.Request, response_id: str, caller: str
) -> web.Response | None:
    """Retrieve, delete or input_items answered from what traylm kept; None when it kept no
    ``response_id`` for ``caller``."""
    if request.method == "DELETE":
        if not await store.delete(response_id, caller):
            return None
        return web.json_response({"id": response_id, "object": "response", "deleted": True})
    found = await store.find(response_id, caller)
    if found is None:
        return None
    if request.method == "POST":
        return _cancel(response_id, found["response"])
    if request.path.endswith("/input_items"):
        return _input_items_page(request, response_id, found["input_items"])
    if request.query.get("stream", "").lower() in ("true", "1"):
        return _replayed(request, response_id, found["response"])
    return web.json_response(found["response"])


def _replayed(request: web.Request, response_id: str, response: Any) -> web.Response:
    """A kept response as its stream's events (retrieve with ``stream=true``), or the 400
    saying why it cannot be."""
    why = replayable(response)
    if why is not None:
        return openai_error(
            400, f"response {response_id!r} cannot be replayed as a stream: {why}", param="stream"
        )
    try:
        after = int(request.query.get("starting_after", "-1"))
    except ValueError:
        return openai_error(
            400, "starting_after must be an event's sequence number", param="starting_after"
        )
    return web.Response(
        body=replay(response, after),
        content_type="text/event-stream",
        headers={"Cache-Control": "no-cache"},
    )


def _cancel(response_id: str, response: Any) -> web.Response:
    """Cancel of a kept response, which has ended: OpenAI's answers (only a background
    response can be cancelled; one that has ended is returned as it is)."""
    if isinstance(response, dict) and response.get("background") is True:
        return web.json_response(response)
    return openai_error(
        400,
        f"Responses can only be cancelled if they were created with background=true; "
        f"{response_id!r} was not, and it has ended (status "
        f"{response.get('status') if isinstance(response, dict) else None!r})",
        param="response_id",
    )


def _input_items_page(request: web.Request, response_id: str, items: list[Any]) -> web.Response:
    """The input_items list: OpenAI's page (``limit``, ``order``, ``after``), each item with a
    type and an id as OpenAI lists them."""
    listed = [_listed_item(item, f"{response_id}_in{i}") for i, item in enumerate(items)]
    query = request.query
    try:
        limit = int(query.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= INPUT_ITEMS_MAX_LIMIT:
        return openai_error(
            400, f"limit must be 1 to {INPUT_ITEMS_MAX_LIMIT}", param="limit", code="invalid_value"
        )
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        return openai_error(400, "order must be asc or desc", param="order", code="invalid_value")
    if order == "desc":
        listed.reverse()
    after = query.get("after")
    if after:
        ids = [item["id"] for item in listed]
        listed = listed[ids.index(after) + 1 :] if after in ids else []
    page = listed[:limit]
    return web.json_response(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(listed) > limit,
        }
    )


def _listed_item(item: Any, default_id: str) -> dict[str, Any]:
    if not isinstance(item, dict):
        return {"id": default_id, "type": "unknown", "value": item}
    out = {"id": default_id, **item}
    if "role" in out:
        out.setdefault("type", "message")
        if isinstance(out.get("content"), str):
            kind = "output_text" if out["role"] == "assistant" else "input_text"
            out["content"] = [{"type": kind, "text": out["content"]}]
    return out


def _not_found(ctx: GatewayContext, response_id: str, *, param: str) -> web.Response:
    if _store(ctx) is None:
        kept = f"traylm remembers the last {MAX_REMEMBERED} response ids made through it"
    else:
        r = ctx.settings.requests
        kept = (
            f"traylm keeps the newest {r.responses_keep} responses made through it, for "
            f"{r.responses_days:g} days (requests.responses_keep, requests.responses_days), "
            "each for the API key that made it, none made with store: false"
        )
    return openai_error(
        404,
        f"no response {quoted(response_id)} is known for this caller: {kept}; check the id",
        param=param,
        code="response_not_found",
    )


async def _relay_stored(
    request: web.Request, ctx: GatewayContext, upstream: Upstream
) -> web.StreamResponse:
    return await relay(
        request,
        client=ctx.upstreams,
        upstream=upstream,
        body=await request.read(),
        model=upstream.name,
        connect_timeout_s=ctx.settings.gateway.upstream_connect_timeout_s,
        metrics=ctx.metrics,
    )
