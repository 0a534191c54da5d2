"""SIGINT/SIGTERM reach a Qt app without polling: the signal's wakeup byte lands on a socket
that a QSocketNotifier watches, and the handler runs on the GUI thread."""

from __future__ import annotations

import contextlib
import signal
import socket
from collections.abc import Callable

from PySide6.QtCore import QObject, QSocketNotifier


class SignalWatcher(QObject):
    def __init__(self, on_signal: Callable[[int], None], parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._on_signal = on_signal
        self._read, self._write = socket.socketpair()
        self._read.setblocking(False)
        self._write.setblocking(False)
        self._notifier = QSocketNotifier(self._read.fileno(), QSocketNotifier.Type.Read, self)
        self._notifier.activated.connect(self.on_readable)
        self._previous_fd = -1

    def install(self, signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> None:
        self._previous_fd = signal.set_wakeup_fd(self._write.fileno())
        for sig in signals:
            signal.signal(sig, lambda *_: None)  # the wakeup byte does the work

    def uninstall(self) -> None:
        with contextlib.suppress(ValueError):
            signal.set_wakeup_fd(self._previous_fd)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        self._notifier.setEnabled(False)
        self._read.close()
        self._write.close()

    def on_readable(self) -> None:
        with contextlib.suppress(BlockingIOError):
            for byte in self._read.recv(64):
                self._on_signal(byte)
