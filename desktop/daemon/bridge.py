"""The one place where Qt meets asyncio.

``Bridge`` owns an asyncio loop on a worker thread. The GUI calls into the core with
``call``/``call_gateway``/``call_link`` (each schedules a coroutine with
``asyncio.run_coroutine_threadsafe``); everything coming back, results included, is a frozen
value emitted on ``_posted`` and re-emitted on the GUI thread as ``message_received``, or handed
to the caller's ``on_done`` there. No Qt object is touched on the loop thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

from PySide6.QtCore import QObject, Qt, Signal

from desktop.daemon.gateway import GatewayHTTP
from desktop.daemon.link import DaemonLink
from desktop.daemon.messages import CallResult
from engines.client import DaemonClient
from engines.config.sections import Paths

log = logging.getLogger(__name__)

T = TypeVar("T")
OnDone = Callable[[CallResult], None]


async def _awaited(awaitable: Awaitable[object]) -> None:
    await awaitable


class Bridge(QObject):
    """Start with ``start()``; ``stop()`` before the QApplication goes away."""

    message_received = Signal(object)
    _posted = Signal(object)

    def __init__(
        self, paths: Paths, *, spawn_daemon: bool = True, parent: QObject | None = None
    ) -> None:
        super().__init__(parent)
        self.paths = paths
        self.link = DaemonLink(paths, self._post, spawn_daemon=spawn_daemon)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._callbacks: dict[int, OnDone] = {}
        self._futures: dict[int, concurrent.futures.Future[None]] = {}
        self._ids = itertools.count(1)
        self._posted.connect(self._on_posted, Qt.ConnectionType.QueuedConnection)

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            main = loop.create_task(self.link.run(), name="daemon-link")
            ready.set()
            try:
                loop.run_forever()
            finally:
                main.cancel()
                pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
                for task in pending:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.run_until_complete(self.link.close())
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=run, name="traylm-bridge", daemon=True)
        self._thread.start()
        ready.wait(5)

    def stop(self, timeout_s: float = 5.0) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        self.link.closing = True
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout_s)
        if thread.is_alive():
            log.warning("the bridge thread did not stop within %.0f s", timeout_s)
        self._loop = None
        self._thread = None
        self._callbacks.clear()
        self._futures.clear()

    @property
    def running(self) -> bool:
        return self._loop is not None

    # ----------------------------------------------------------------- GUI → core

    def call(
        self, fn: Callable[[DaemonClient], Awaitable[object]], on_done: OnDone | None = None
    ) -> int:
        """Run ``fn(client)`` on the loop with the connected DaemonClient."""
        return self._submit(lambda call_id: self.link.run_call(call_id, fn), on_done)

    def call_gateway(
        self, fn: Callable[[GatewayHTTP], Awaitable[object]], on_done: OnDone | None = None
    ) -> int:
        """Run ``fn(gateway)``: HTTP to the OpenAI endpoint, like any local app."""
        return self._submit(lambda call_id: self.link.run_gateway(call_id, fn), on_done)

    def call_link(
        self, fn: Callable[[DaemonLink], Awaitable[object]], on_done: OnDone | None = None
    ) -> int:
        """Run ``fn(link)``: start or restart the daemon, refresh what the GUI shows."""
        return self._submit(lambda call_id: self.link.run_link(call_id, fn), on_done)

    def wait_gateway(
        self, fn: Callable[[GatewayHTTP], Awaitable[object]], timeout_s: float
    ) -> None:
        """Run ``fn(gateway)`` and wait for it, at most ``timeout_s`` (the GUI thread blocks):
        for what must be over before the app quits, such as child processes to end."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        future = asyncio.run_coroutine_threadsafe(_awaited(fn(self.link.gateway)), loop)
        try:
            future.result(timeout_s)
        except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
            log.warning("a closing call did not finish within %.0f s", timeout_s)
        except Exception:  # boundary: quitting must go on whatever the call raised
            log.exception("a closing call failed")

    def cancel(self, call_id: int) -> None:
        future = self._futures.get(call_id)
        if future is not None:
            future.cancel()  # cancels the task on the loop

    def _submit(self, make: Callable[[int], Awaitable[None]], on_done: OnDone | None) -> int:
        call_id = next(self._ids)
        loop = self._loop
        if loop is None or loop.is_closed():
            if on_done is not None:
                on_done(CallResult(call_id, error="the app is shutting down", error_code="closed"))
            return call_id
        if on_done is not None:
            self._callbacks[call_id] = on_done

        async def wrapped() -> None:
            await make(call_id)

        future = asyncio.run_coroutine_threadsafe(wrapped(), loop)
        self._futures[call_id] = future
        return call_id

    # ----------------------------------------------------------------- core → GUI

    def _post(self, message: object) -> None:
        """From the loop thread (or any thread): queue ``message`` for the GUI thread."""
        self._posted.emit(message)

    def _on_posted(self, message: object) -> None:
        if isinstance(message, CallResult):
            self._futures.pop(message.call_id, None)
            callback = self._callbacks.pop(message.call_id, None)
            if callback is not None:
                try:
                    callback(message)
                except Exception:  # boundary: a failing slot must not kill the event flow
                    log.exception("callback for call %d failed", message.call_id)
            return
        self.message_received.emit(message)
