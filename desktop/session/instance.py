"""One tray app per user (and per TRAYLM_HOME): a second ``traylm`` asks the first to show its
windows and exits.

The first instance holds an exclusive lock on ``state/desktop.lock`` and serves a user-only
QLocalServer. Commands are one JSON line each way:

    {"cmd": "show", "what": "chat"|"dashboard"|"", "page": "engines"}   → {"ok": true}
    {"cmd": "status"}   → tray geometry, menu and window state (for tests and benchmarks)
    {"cmd": "quit", "action": "leave"|"stop"}                           → {"ok": true}
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from typing import IO, Any

from PySide6.QtCore import QObject
from PySide6.QtNetwork import QLocalServer, QLocalSocket

from engines.config.sections import Paths

log = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any]], dict[str, Any]]
MAX_LINE_BYTES = 64 * 1024


def server_name(paths: Paths) -> str:
    digest = hashlib.sha256(str(paths.state_dir.resolve()).encode()).hexdigest()[:12]
    return f"traylm-desktop-{os.getuid()}-{digest}"


class PrimaryLock:
    """Held by the one running tray app for its whole life."""

    def __init__(self, fh: IO[str]) -> None:
        self._fh: IO[str] | None = fh

    @classmethod
    def try_acquire(cls, paths: Paths) -> PrimaryLock | None:
        paths.state_dir.mkdir(parents=True, exist_ok=True)
        fh = (paths.state_dir / "desktop.lock").open("a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            return None
        return cls(fh)

    def release(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def send_command(
    paths: Paths, command: dict[str, Any], *, timeout_s: float = 3.0
) -> dict[str, Any] | None:
    """Send one command to the running tray app; None when none answers in ``timeout_s`` (the
    first instance may still be starting its server, so connecting is retried)."""
    deadline = time.monotonic() + timeout_s
    sock = QLocalSocket()
    while True:
        sock.connectToServer(server_name(paths))
        if sock.waitForConnected(200):
            break
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)
    try:
        sock.write(json.dumps(command).encode() + b"\n")
        sock.waitForBytesWritten(1000)
        buffer = b""
        while b"\n" not in buffer and time.monotonic() < deadline + 5:
            if (
                not sock.waitForReadyRead(500)
                and sock.state() != QLocalSocket.LocalSocketState.ConnectedState
            ):
                break
            buffer += bytes(sock.readAll().data())
        line = buffer.split(b"\n", 1)[0]
        return dict(json.loads(line)) if line else None
    except ValueError:
        return None
    finally:
        sock.disconnectFromServer()


class InstanceServer(QObject):
    """Answers commands from later ``traylm`` invocations, on the GUI thread."""

    def __init__(self, paths: Paths, handler: Handler, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._name = server_name(paths)
        self._handler = handler
        self._server = QLocalServer(self)
        self._server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        self._server.newConnection.connect(self.on_new_connection)
        self._buffers: dict[QLocalSocket, bytes] = {}

    def listen(self) -> bool:
        QLocalServer.removeServer(self._name)  # a stale socket of a crashed app (we hold the lock)
        ok = self._server.listen(self._name)
        if not ok:
            log.warning("single-instance server: %s", self._server.errorString())
        return ok

    def close(self) -> None:
        self._server.close()

    def on_new_connection(self) -> None:
        while self._server.hasPendingConnections():
            sock = self._server.nextPendingConnection()
            self._buffers[sock] = b""
            sock.readyRead.connect(lambda s=sock: self.on_ready_read(s))
            sock.disconnected.connect(lambda s=sock: self._forget(s))

    def _forget(self, sock: QLocalSocket) -> None:
        self._buffers.pop(sock, None)
        with contextlib.suppress(RuntimeError):  # already gone with the server at exit
            sock.deleteLater()

    def on_ready_read(self, sock: QLocalSocket) -> None:
        data = self._buffers.get(sock, b"") + bytes(sock.readAll().data())
        if b"\n" not in data:
            if len(data) > MAX_LINE_BYTES:
                sock.disconnectFromServer()
            else:
                self._buffers[sock] = data
            return
        line = data.split(b"\n", 1)[0]
        try:
            command = json.loads(line)
            if not isinstance(command, dict):
                raise ValueError("not an object")
            reply = self._handler(command)
        except ValueError as exc:
            reply = {"ok": False, "error": f"bad command: {exc}"}
        with contextlib.suppress(RuntimeError):  # the peer may already be gone
            sock.write(json.dumps(reply).encode() + b"\n")
            sock.flush()
