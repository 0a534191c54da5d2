"""HTTP helpers every route module uses: JSON bodies in, JSON and OpenAI-shaped errors out.

A leaf: it imports aiohttp, the error tree and the events codec, and nothing from any feature, so
the gateway and every feature's ``routes.py`` can share it without importing each other.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

from aiohttp import web

from engines.errors import ConfigError, TraylmError
from engines.events.codec import to_plain

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
T = TypeVar("T")


def openai_error(
    status: int,
    message: str,
    *,
    type_: str = "invalid_request_error",
    code: str | int | None = None,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    """An error in the shape OpenAI's API (and so every OpenAI client) reads."""
    body = {
        "error": {
            "message": message,
            "type": type_,
            "param": param,
            "code": code if code is not None else status,
        }
    }
    return web.json_response(body, status=status, headers=headers)


def error_response(exc: TraylmError) -> web.Response:
    """A TraylmError as an OpenAI-shaped error with traylm's code as ``type`` and ``code``."""
    return openai_error(exc.http_status, exc.message, type_=exc.code, code=exc.code)


def traylm_errors(handler: Handler) -> Handler:
    """Wrap a handler so that a TraylmError it raises becomes its error response."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except TraylmError as exc:
            return error_response(exc)

    wrapped.__name__ = handler.__name__
    return wrapped


def loads(body: bytes | str) -> Any:
    """Parse a request's JSON; ValueError says what is wrong with it, also for text that is not
    UTF-8 and for nesting deeper than the parser's recursion limit (which Python's json raises
    as RecursionError: a client's input, never the gateway's fault)."""
    try:
        return json.loads(body)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def parse_json_body(body: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """(the JSON object, None) or (None, what is wrong with it), for the OpenAI routes."""
    try:
        data = loads(body)
    except ValueError as exc:  # UnicodeDecodeError is a ValueError
        return None, f"the request body is not valid JSON ({exc})"
    if not isinstance(data, dict):
        return None, "the request body must be a JSON object"
    return data, None


async def json_body(request: web.Request, *, empty_ok: bool = False) -> dict[str, Any]:
    """The request's JSON object; ConfigError says what is wrong. ``empty_ok``: no body is {}."""
    if empty_ok and not request.can_read_body:
        return {}
    data, problem = parse_json_body(await request.read())
    if data is None:
        raise ConfigError(problem or "the request body must be a JSON object")
    return data


def ok(data: Any, status: int = 200) -> web.Response:
    """Any dataclass, list or mapping of them as JSON (through the events codec)."""
    return web.json_response(to_plain(data), status=status)


def mount(
    app: web.Application, key: web.AppKey[T], service: T, routes: Iterable[web.RouteDef]
) -> None:
    """Make ``service`` reachable as ``request.app[key]`` and add the routes that use it."""
    app[key] = service
    app.router.add_routes(routes)
