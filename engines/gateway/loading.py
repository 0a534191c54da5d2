"""What a route learns while the model a request names is loading (models on demand).

``GatewayContext.resolve(model, progress=...)`` calls ``progress`` with a ``LoadProgress`` when a
cold start begins and then every few seconds until the model is ready or its load failed.
``ColdStream`` is that hook for streaming routes.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from engines.core.http import event_stream
from engines.gateway.proxy import CLIENT_GONE, CLIENT_WRITE_ERRORS, end_with_error
from engines.gateway.sse import error_text


@dataclass(frozen=True)
class LoadProgress:
    """Where a load stands: ``phase`` is a short word (queued, placing, evicting, waking,
    starting) and ``detail`` a line for people (while starting: the engine's start phase,
    "loading weights")."""

    model: str
    phase: str
    elapsed_s: float
    detail: str = ""

    @property
    def words(self) -> str:
        """ "starting: loading weights", on one line (an SSE comment must not break)."""
        text = f"{self.phase}: {self.detail}" if self.detail else self.phase
        return " ".join(text.split())[:200]


Progress = Callable[[LoadProgress], Awaitable[None]]
"""A route's hook for load progress (a streaming route writes an SSE comment)."""


PROGRESS_PERIOD_S = 3.0
"""How often a waiting streaming client gets a comment line (well under any client's idle
timeout: httpx's default read timeout is 5 s, the openai SDK's 600 s)."""


class ColdStream:
    """The progress hook of a streaming request whose model is cold: the client gets
    ``200`` + ``text/event-stream`` at once and an SSE comment line (``: loading NAME (phase,
    12 s)``) every few seconds, which every SSE parser skips; then the relayed stream, or an
    OpenAI-shaped error event if the load failed (the openai SDK raises it as ``APIError``)."""

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.response: web.StreamResponse | None = None

    async def __call__(self, progress: LoadProgress) -> None:
        """Write the comment line. A client that went away is only noted (CLIENT_GONE): the
        load goes on for the other waiters, and the relay then ends this request as a client
        disconnect, not as an error of the gateway."""
        if self.request.get(CLIENT_GONE):
            return
        line = f": loading {progress.model} ({progress.words}, {progress.elapsed_s:.0f} s)\n\n"
        try:
            resp = self.response
            if resp is None:
                resp = self.response = event_stream(self.request)
                await resp.prepare(self.request)
            await resp.write(line.encode())
        except CLIENT_WRITE_ERRORS:
            self.request[CLIENT_GONE] = True

    async def fail(self, error: web.Response) -> web.StreamResponse:
        """End the started stream with ``error`` (an error response) as the error event of
        the request's API (OpenAI's or Anthropic's)."""
        assert self.response is not None
        body = error.body if isinstance(error.body, bytes) else b"{}"
        type_ = "model_unavailable"
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            type_ = str(json.loads(body)["error"]["type"])
        message = error_text(body, error.status)
        return await end_with_error(
            self.request, self.response, message, type_=type_, status=error.status
        )
