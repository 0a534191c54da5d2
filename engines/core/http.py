"""HTTP helpers every route module uses: JSON bodies in, JSON and OpenAI-shaped errors out.

A leaf: it imports aiohttp, the error tree and the events codec, and nothing from any feature, so
the gateway and every feature's ``routes.py`` can share it without importing each other.
"""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

from aiohttp import HttpVersion11, web

from engines.errors import ConfigError, TraylmError, quoted
from engines.events.codec import from_plain, to_plain

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


SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


def event_stream(
    request: web.Request, headers: Mapping[str, str] = SSE_HEADERS
) -> web.StreamResponse:
    """A streamed reply of unknown length for ``request`` (not prepared yet). An HTTP/1.1 client
    gets it chunked; an HTTP/1.0 client cannot be sent chunks, so its connection closes at the
    stream's end (even when it asked for keep-alive): the close is how it knows the end came,
    and nothing after it is read as part of this reply."""
    resp = web.StreamResponse(status=200, headers=headers)
    if request.version < HttpVersion11:
        resp.force_close()
    return resp


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
    """The request's JSON object, the one way every /api route reads a body; ConfigError (400)
    says what is wrong: not JSON, not an object, or text that is not valid Unicode (a lone
    surrogate such as ``"\\ud800"``, which JSON allows and nothing downstream can store or
    encode), naming the field. ``empty_ok``: no body is {}."""
    if empty_ok and not request.can_read_body:
        return {}
    data, problem = parse_json_body(await request.read())
    if data is None:
        raise ConfigError(problem or "the request body must be a JSON object")
    field = lone_surrogate_at(data)
    if field is not None:
        raise ConfigError(
            f"{field} is not valid Unicode text (it holds a lone surrogate such as \\ud800): "
            "send text as UTF-8"
        )
    return data


def lone_surrogate_at(value: Any) -> str | None:
    """Where the first text in a decoded JSON value holds a lone surrogate (``messages[0].
    content``; ``a key in params`` for a key), or None. Walked without recursion: the parser
    already allows nesting as deep as Python's recursion limit."""
    todo: list[tuple[str, Any]] = [("", value)]
    while todo:
        path, item = todo.pop()
        if isinstance(item, str) and not _encodable(item):
            return path or "the body"
        if isinstance(item, dict):
            for key, sub in reversed(item.items()):
                if not _encodable(key):
                    return f"a key in {path or 'the body'}"
                todo.append((f"{path}.{key}" if path else key, sub))
        elif isinstance(item, list):
            todo.extend((f"{path}[{i}]", sub) for i, sub in reversed(list(enumerate(item))))
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# --------------------------------------------------------------------------- query strings

_WHOLE = re.compile(r"-?[0-9]+")
_MAX_DIGITS = 30  # past any bound a route sets; longer (5,000 digits) is out of range unread


MAX_ID = 2**63 - 1
"""The largest id a path or query may name: SQLite's largest integer."""


def whole_number(raw: str, name: str, *, lo: int, hi: int) -> int:
    """``raw`` (a query parameter, a path's id) as a whole number from ``lo`` to ``hi``;
    ConfigError (400) names it and the range otherwise: also for digits that are not ASCII
    (``²``) and for numbers longer than Python parses (5,000 digits)."""
    if _WHOLE.fullmatch(raw) is None:
        raise ConfigError(f"{name} must be a whole number from {lo} to {hi}, not {quoted(raw)}")
    if len(raw.lstrip("-").lstrip("0")) > _MAX_DIGITS or not lo <= int(raw) <= hi:
        raise ConfigError(f"{name} must be from {lo} to {hi}, not {quoted(raw, 20)}")
    return int(raw)


def query_int(request: web.Request, name: str, *, default: T, lo: int, hi: int) -> int | T:
    """The query parameter ``name`` as a whole number from ``lo`` to ``hi`` (``whole_number``);
    ``default`` when absent or empty."""
    raw = request.query.get(name, "")
    return default if raw == "" else whole_number(raw, name, lo=lo, hi=hi)


def query_float(request: web.Request, name: str, *, default: float, lo: float, hi: float) -> float:
    """The query parameter ``name`` as a number from ``lo`` to ``hi``; ``default`` when absent
    or empty. ConfigError (400) names the parameter and the range otherwise (nan included)."""
    raw = request.query.get(name, "")
    if raw == "":
        return default
    try:
        value = float(raw) if len(raw) <= 2 * _MAX_DIGITS else float("nan")
    except ValueError:
        value = float("nan")
    if not lo <= value <= hi:
        raise ConfigError(f"{name} must be a number from {lo:g} to {hi:g}, not {quoted(raw, 20)}")
    return value


def query_flag(request: web.Request, name: str) -> bool:
    """The query parameter ``name`` as on (``1``/``true``) or off (absent, empty, ``0``/
    ``false``); ConfigError (400) for anything else."""
    raw = request.query.get(name, "")
    if raw in ("1", "true"):
        return True
    if raw in ("", "0", "false"):
        return False
    raise ConfigError(f"{name} must be 1 or 0 (true or false), not {quoted(raw)}")


def query_text(request: web.Request, name: str, *, default: str = "", max_chars: int = 256) -> str:
    """The query parameter ``name`` as text of at most ``max_chars``; ``default`` when absent.
    ConfigError (400) for longer text or text that is not valid Unicode."""
    raw = request.query.get(name)
    if raw is None:
        return default
    if len(raw) > max_chars:
        raise ConfigError(f"{name} must be at most {max_chars} characters, not {quoted(raw)}")
    if not _encodable(raw):
        raise ConfigError(f"{name} is not valid Unicode text: send it as UTF-8")
    return raw


def dataclass_body(defaults: T, body: Mapping[str, Any]) -> T:
    """``body``'s fields over ``defaults`` (a dataclass instance, e.g. a config), each checked
    against the field's type: ConfigError names an unknown field or a value of the wrong type.
    A tuple field takes a JSON list of its items' type."""
    cls = type(defaults)
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    refuse_unknown(body, names)
    for name, value in body.items():
        _check_type(name, value, getattr(defaults, name), hints[name])
    merged = {**to_plain(defaults), **body}
    return from_plain(cls, merged)


def refuse_unknown(body: Mapping[str, Any], allowed: Iterable[str]) -> None:
    """ConfigError (400) naming the fields of ``body`` not in ``allowed``: a misspelt field is
    an error, never silently a default."""
    names = set(allowed)
    unknown = sorted(set(body) - names)
    if unknown:
        raise ConfigError(
            f"unknown fields {', '.join(_field_name(k) for k in unknown[:5])}"
            f"{' …' if len(unknown) > 5 else ''}; allowed: {', '.join(sorted(names))}"
        )


def _field_name(key: str) -> str:
    return key if key.isidentifier() and len(key) <= 40 else quoted(key, 40)


def _check_type(name: str, value: Any, default: Any, hint: Any) -> None:
    if isinstance(default, bool) or isinstance(value, bool):
        ok = isinstance(value, bool) and isinstance(default, bool)
    elif isinstance(default, tuple):
        item = typing.get_args(hint)[0]
        ok = isinstance(value, list) and all(
            isinstance(v, item) and not isinstance(v, bool) for v in value
        )
    elif isinstance(default, float):
        ok = isinstance(value, int | float)
    else:
        ok = isinstance(value, type(default))
    if not ok:
        kind = "a list" if isinstance(default, tuple) else type(default).__name__
        if isinstance(default, tuple) and typing.get_args(hint)[0] is int:
            kind = "a list of whole numbers"
        raise ConfigError(f"{name} must be {kind}, not {value!r}")


def ok(data: Any, status: int = 200) -> web.Response:
    """Any dataclass, list or mapping of them as JSON (through the events codec)."""
    return web.json_response(to_plain(data), status=status)


def mount(
    app: web.Application, key: web.AppKey[T], service: T, routes: Iterable[web.RouteDef]
) -> None:
    """Make ``service`` reachable as ``request.app[key]`` and add the routes that use it."""
    app[key] = service
    app.router.add_routes(routes)
