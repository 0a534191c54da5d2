"""Request/answer calls to the daemon's control API over the standard library's HTTP client
(oneshot.py's ``exchange``), each in a thread of its own: what the CLI's async commands need,
without importing aiohttp (about 150 ms of the command's start). engines/client/__init__.py sends
its calls here when connected with ``plain_calls=True``; its streams (events) still go through
aiohttp.

A call never blocks the event loop, and a command cancelled with Ctrl-C does not wait for its
call's thread (a daemon thread: it ends with the process).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

from engines.client.oneshot import exchange, request_target


class PlainCalls:
    """Calls to one daemon (``url``: http://127.0.0.1:PORT) with its control token."""

    def __init__(self, url: str, token: str, *, timeout_s: float, connect_timeout_s: float) -> None:
        self._url = url
        self._token = token
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s

    async def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> tuple[int, bytes]:
        """The answer's HTTP status and body; raises as ``exchange`` does (``timeout_s``:
        default the client's)."""
        target = request_target(path, params)
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[tuple[int, bytes]] = loop.create_future()

        def call() -> None:
            try:
                result = exchange(
                    self._url,
                    self._token,
                    method,
                    target,
                    json_body,
                    timeout_s=timeout_s or self._timeout_s,
                    connect_timeout_s=self._connect_timeout_s,
                )
            except Exception as exc:  # boundary: handed to the waiting coroutine
                error = exc
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                    loop.call_soon_threadsafe(_fail, answer, error)
                return
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_succeed, answer, result)

        threading.Thread(target=call, name="traylm-call", daemon=True).start()
        return await answer


def _succeed(answer: asyncio.Future[tuple[int, bytes]], result: tuple[int, bytes]) -> None:
    if not answer.done():  # not cancelled meanwhile
        answer.set_result(result)


def _fail(answer: asyncio.Future[tuple[int, bytes]], exc: Exception) -> None:
    if not answer.done():
        answer.set_exception(exc)
