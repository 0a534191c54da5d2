"""Ollama's API on its own port (ollama.port, 11434 by default), behind the gateway's
connection gate, on the gateway's address (loopback, or every interface with LAN sharing).

A port that is taken (Ollama itself runs there) is not an error: the daemon serves on, and
``status()`` says who holds the port and how to move either (`traylm status`, the doctor and
the app read it). Settings apply while the daemon runs: on/off, the port, LAN sharing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from aiohttp import web

from engines.config.live import SettingsView
from engines.config.sections import Settings
from engines.core.procs import port_holder
from engines.gateway.connections import ConnectionGate, Listener, http_logger

log = logging.getLogger(__name__)

OFF, SERVING, TAKEN = "off", "serving", "taken"


class OllamaServer:
    """Construct (no I/O), ``start(app)`` once the gateway serves, ``stop()`` on the way out."""

    def __init__(self, settings: SettingsView, gate: ConnectionGate) -> None:
        self._settings, self._gate = settings, gate
        self._runner: web.AppRunner | None = None
        self._listener: Listener | None = None
        self._where: tuple[bool, int, str] | None = None
        self.state, self.detail = OFF, ""
        self._moving: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        settings.subscribe(self._apply)

    @property
    def port(self) -> int:
        return self._settings.current.ollama.port

    async def start(self, app: web.Application) -> None:
        runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, logger=http_logger()
        )
        await runner.setup()
        self._runner = runner
        await self._place(self._settings.current)

    async def stop(self) -> None:
        if self._moving is not None:
            self._moving.cancel()
        if self._runner is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._runner.cleanup(), 5)
            self._runner = None

    async def settled(self) -> None:
        """Wait until a move the settings asked for is done (its outcome is in ``state``)."""
        moving = self._moving
        if moving is not None and not moving.done():
            await asyncio.wait([moving])

    def status(self) -> dict[str, Any]:
        """`traylm status`'s ``ollama``: state (serving | taken | off), port, addresses, and
        in ``detail`` what to do when the port is taken."""
        s = self._settings.current.ollama
        addresses = self._listener.addresses() if self._listener is not None else []
        return {
            "state": self.state,
            "enabled": s.enabled,
            "port": s.port,
            "addresses": addresses,
            "detail": self.detail,
        }

    def _apply(self, settings: Settings) -> None:
        if self._runner is None or self._where == _where(settings):
            return
        task = asyncio.create_task(self._place(settings))
        self._moving = task

    async def _place(self, settings: Settings) -> None:
        """Listen as ``settings`` say (or stop listening), one move at a time."""
        async with self._lock:
            where = _where(settings)
            if where == self._where:
                return
            if self._listener is not None:
                await self._close()
            self._where = where
            enabled, port, host = where
            if not enabled:
                self.state, self.detail = OFF, "turned off (ollama.enabled)"
                return
            assert self._runner is not None
            listener = Listener(self._runner, port=port, gate=self._gate)
            try:
                await listener.bind(host)
            except OSError as exc:
                self.state, self.detail = TAKEN, _taken(host, port, exc)
                log.warning("Ollama's API is not served: %s", self.detail)
                return
            self._listener = listener
            self.state, self.detail = SERVING, ""
            log.info("Ollama's API on %s", ", ".join(listener.addresses()))

    async def _close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            await listener.unbind()


def _where(settings: Settings) -> tuple[bool, int, str]:
    return settings.ollama.enabled, settings.ollama.port, settings.bind_host


def _taken(host: str, port: int, exc: OSError) -> str:
    holder = port_holder(host, port) or "another process"
    return (
        f"port {port} is held by {holder} ({exc.strerror}); apps that speak Ollama's API "
        f"reach that, not traylm. Move traylm's with `traylm config set ollama.port "
        f"{port + 1}` (and point the apps there), or stop the other server "
        "(`systemctl stop ollama` for Ollama)"
    )
