"""The gateway's serving: the aiohttp runner, the listening socket behind the connection gate,
the move to another address while the daemon runs (LAN sharing turned on or off), and what
`traylm status` says of the sockets and connections.

The daemon builds the app (every part's routes) and hands it to ``GatewayServer.start``; the
gate's limits follow the live settings, capped by the descriptors this process may open.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging

from aiohttp import web

from engines.config.live import SettingsView
from engines.config.sections import Settings
from engines.core.procs import MAX_CONNECTIONS_CEILING, connections_for, port_holder
from engines.errors import PortInUseError
from engines.gateway.connections import ConnectionGate, Listener, http_logger

log = logging.getLogger(__name__)


class GatewayServer:
    """Construct (no I/O), ``start(app)`` to serve, ``stop()`` on the way out."""

    def __init__(self, settings: SettingsView) -> None:
        self._settings = settings
        g = settings.current.gateway
        self.gate = ConnectionGate(
            max_connections=g.max_connections,
            header_timeout_s=g.header_timeout_s,
            lan=g.lan_sharing,
        )
        self.listener: Listener | None = None
        self._runner: web.AppRunner | None = None
        self._fd_connections = MAX_CONNECTIONS_CEILING
        self._moving: set[asyncio.Task[None]] = set()
        settings.subscribe(self._apply)

    def limit_connections(self, open_files: int) -> None:
        """The open-files limit this process got (``procs.raise_open_files_limit``): the gate
        keeps room for engines, logs and the database below it."""
        self._fd_connections = connections_for(open_files)
        self._apply(self._settings.current)

    async def start(self, app: web.Application) -> None:
        """Serve ``app`` on the gateway's port; PortInUseError names who holds the port."""
        settings = self._settings.current
        g = settings.gateway
        runner = web.AppRunner(
            app,
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=2.0,
            logger=http_logger(),
            keepalive_timeout=g.keepalive_timeout_s,
        )
        await runner.setup()
        self._runner = runner
        listener = Listener(runner, port=g.port, gate=self.gate)
        try:
            await listener.bind(settings.bind_host)
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                holder = port_holder(settings.bind_host, g.port) or "another process"
                raise PortInUseError(
                    f"port {g.port} is held by {holder}; stop it, or move traylm with "
                    f"`traylm config set gateway.port {g.port + 1}`"
                ) from exc
            raise
        self.listener = listener

    async def stop(self) -> None:
        for task in self._moving:
            task.cancel()
        if self._runner is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._runner.cleanup(), 5)
            self._runner = None

    def addresses(self) -> list[str]:
        """The sockets actually bound (`traylm status`)."""
        return self.listener.addresses() if self.listener is not None else []

    def connections(self) -> dict[str, int]:
        gate = self.gate
        return {
            "open": gate.open,
            "max": gate.max_connections,
            "refused_total": gate.refused_total,
            "evicted_total": gate.evicted_total,
            "head_timeouts_total": gate.timed_out_total,
            "foreign_refused_total": gate.foreign_total,
        }

    def _apply(self, settings: Settings) -> None:
        """Connection limits apply at once; LAN sharing turned on or off moves the socket
        (and, off, closes the connections other computers hold)."""
        g = settings.gateway
        self.gate.configure(
            max_connections=min(g.max_connections, self._fd_connections),
            header_timeout_s=g.header_timeout_s,
            lan=g.lan_sharing,
        )
        if not g.lan_sharing and (closed := self.gate.close_foreign()):
            log.warning("LAN sharing is off: closed %d connections from other computers", closed)
        listener = self.listener
        if listener is not None and listener.host != settings.bind_host:
            task = asyncio.create_task(self._rebind(listener, settings.bind_host))
            self._moving.add(task)
            task.add_done_callback(self._moving.discard)

    async def _rebind(self, listener: Listener, host: str) -> None:
        try:
            await listener.rebind(host)
        except OSError as exc:
            log.error(
                "the gateway could not move to %s:%d (%s); it still listens on %s",
                host,
                listener.port,
                exc.strerror,
                ", ".join(listener.addresses()) or "nothing",
            )
