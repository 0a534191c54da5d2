"""Ollama's error shape: ``{"error": "what went wrong"}`` with the HTTP status (the ollama
clients raise ``ResponseError(error, status_code)`` from it)."""

from __future__ import annotations

from aiohttp import web

from engines.gateway.sse import error_text

KEPT_HEADERS = ("Retry-After", "x-should-retry")


def ollama_error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


def from_openai(resp: web.Response) -> web.Response:
    """An error the gateway made in OpenAI's shape (a model not served, no room to load it),
    in Ollama's: the same status, message and retry headers."""
    body = resp.body if isinstance(resp.body, bytes) else b""
    headers = {k: resp.headers[k] for k in KEPT_HEADERS if k in resp.headers}
    return ollama_error(resp.status, error_text(body, resp.status), headers)
