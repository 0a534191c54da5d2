"""Errors in the shape each API's clients read: OpenAI's ``{"error": {...}}`` everywhere, and
Anthropic's ``{"type": "error", "error": {"type", "message"}}`` on the Messages routes (the
anthropic SDK raises its typed errors from that shape only).

``api_error`` picks the shape from the request path, so every part of the gateway (middlewares,
routes, the relay's own errors) answers a client in its API's words.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from aiohttp import web

from engines.core.http import openai_error

ANTHROPIC_PREFIX = "/v1/messages"

# Anthropic's error types by status (docs.anthropic.com, "Errors").
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
OVERLOADED = "overloaded_error"
"""Anthropic's type for a server that is busy for a while: Claude Code retries it ten times
whatever ``x-should-retry`` says, so only a 503 that names its wait (Retry-After: a full queue
on the GPUs, a thermal pause) is typed so; a 503 that will fail again (a load that failed, a
Hub that cannot be reached) is ``api_error``."""
ANTHROPIC_TYPE_NAMES = frozenset((*_ANTHROPIC_TYPES.values(), OVERLOADED))

FINAL_STATUSES = (401, 403)
"""Refusals that the same request will meet again (a wrong key, a Host or Origin not allowed):
they carry ``x-should-retry: false``, which the openai and anthropic SDKs (and Claude Code,
which otherwise retries a 401 for minutes) obey before their own retry rules."""
NO_RETRY = {"x-should-retry": "false"}


INTERNAL_ERROR = "internal error in the traylm gateway; see the daemon log"
"""What a client is told of a bug in the gateway (the log has the traceback)."""


def is_anthropic(path: str) -> bool:
    return path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/")


def anthropic_type(status: int, headers: Mapping[str, str] | None = None) -> str:
    """Anthropic's error type for ``status``; a 503 whose ``headers`` carry Retry-After is
    the transient overload (OVERLOADED)."""
    if status == 503 and headers is not None and _retry_after(headers):
        return OVERLOADED
    if status in _ANTHROPIC_TYPES:
        return _ANTHROPIC_TYPES[status]
    return "invalid_request_error" if status < 500 else "api_error"


def anthropic_error(
    status: int, message: str, *, headers: Mapping[str, str] | None = None
) -> web.Response:
    kind = anthropic_type(status, headers)
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return web.json_response(body, status=status, headers=_final(status, headers))


def _retry_after(headers: Mapping[str, str]) -> bool:
    return any(k.lower() == "retry-after" for k in headers)


def _final(status: int, headers: Mapping[str, str] | None) -> Mapping[str, str] | None:
    """``headers`` with ``x-should-retry: false`` added to a final refusal."""
    if status not in FINAL_STATUSES:
        return headers
    return {**(headers or {}), **NO_RETRY}


def api_error(
    path: str,
    status: int,
    message: str,
    *,
    type_: str = "invalid_request_error",
    code: str | int | None = None,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    """An error for a request to ``path`` in its API's shape (OpenAI's type, code and param
    have no place in Anthropic's shape; its type follows from the status)."""
    if is_anthropic(path):
        return anthropic_error(status, message, headers=headers)
    headers = _final(status, headers)
    return openai_error(status, message, type_=type_, code=code, param=param, headers=headers)


def error_message(body: bytes) -> str | None:
    """The message of an error body in any shape an engine sends: OpenAI's, Anthropic's,
    Ollama's, or FastAPI's bare ``{"detail": ...}``; None when it is none of them."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    error = data.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    if isinstance(error, str):  # Ollama's {"error": "..."}
        return error
    detail = data.get("detail")
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list):  # FastAPI's validation errors: [{"loc": [...], "msg": ...}]
        parts = [
            f"{'.'.join(str(x) for x in d.get('loc', [])[1:])}: {d.get('msg', '')}"
            for d in detail
            if isinstance(d, dict)
        ]
        return "; ".join(parts) or None
    return None


def as_anthropic(resp: web.Response) -> web.Response:
    """An error reply (the engine's or the gateway's, in OpenAI's or FastAPI's shape, or in
    Anthropic's with vLLM's exception name as its type, "BadRequestError") in Anthropic's
    shape with Anthropic's type; anything else unchanged."""
    if resp.status < 400 or not isinstance(resp.body, bytes):
        return resp
    try:
        data = json.loads(resp.body)
    except (ValueError, UnicodeDecodeError):
        data = None
    if isinstance(data, dict) and data.get("type") == "error":
        error = data.get("error")
        if isinstance(error, dict) and error.get("type") in ANTHROPIC_TYPE_NAMES:
            return resp  # Anthropic's own shape and type (the gateway's errors)
    message = error_message(resp.body) or resp.body.decode(errors="replace")[:500]
    kept = ("retry-after", "x-traylm-engine", "x-should-retry")
    keep = {k: v for k, v in resp.headers.items() if k.lower() in kept}
    return anthropic_error(resp.status, message, headers=keep)


# vLLM's error types are its exception names; OpenAI's clients read OpenAI's types
_OPENAI_TYPES = {
    "BadRequestError": "invalid_request_error",
    "ValidationError": "invalid_request_error",
    "UnprocessableEntityError": "invalid_request_error",
    "NotFoundError": "not_found_error",
    "AuthenticationError": "authentication_error",
    "PermissionDeniedError": "permission_error",
    "RateLimitError": "rate_limit_error",
    "InternalServerError": "server_error",
    "ServiceUnavailableError": "server_error",
}


def openai_type(status: int) -> str:
    """OpenAI's error type for an engine error of ``status`` named by an exception only."""
    if status == 404:
        return "not_found_error"
    return "invalid_request_error" if status < 500 else "server_error"


def as_openai(resp: web.Response) -> web.Response:
    """An engine's error in OpenAI's shape with vLLM's exception name as its type
    ("BadRequestError") given OpenAI's type instead; anything else unchanged."""
    if resp.status < 400 or not isinstance(resp.body, bytes) or b"Error" not in resp.body:
        return resp
    try:
        data = json.loads(resp.body)
    except (ValueError, UnicodeDecodeError):
        return resp
    error = data.get("error") if isinstance(data, dict) else None
    kind = error.get("type") if isinstance(error, dict) else None
    if not isinstance(kind, str) or not kind.endswith("Error") or not kind[:1].isupper():
        return resp
    assert isinstance(error, dict)
    error["type"] = _OPENAI_TYPES.get(kind, openai_type(resp.status))
    if error.get("code") == resp.status:  # vLLM puts the status there
        error["code"] = None
    headers = {k: v for k, v in resp.headers.items() if k.lower() != "content-length"}
    return web.Response(body=json.dumps(data).encode(), status=resp.status, headers=headers)


def body_too_slow(path: str, timeout_s: float) -> web.Response:
    """408 for a body that stopped arriving (a slow client holds a connection and a task)."""
    resp = api_error(
        path,
        408,
        f"the request body did not arrive within {timeout_s:g} s (gateway.body_timeout_s)",
        type_="timeout",
    )
    resp.force_close()  # the rest of the body must not be taken for the next request
    return resp
