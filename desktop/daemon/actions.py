"""What the tray menu, the dashboard and the chat window can ask of the daemon, in one place.

Each action goes through the bridge; its failure becomes a notification with the daemon's
message (which says what to do), so no caller has to handle errors itself.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QGuiApplication

from desktop.daemon.bridge import Bridge
from desktop.daemon.fixes import fix_for
from desktop.daemon.library import LibraryStart
from desktop.daemon.messages import CallResult, LinkState
from desktop.daemon.notify import Notifier
from desktop.daemon.state import LIVE_STATES, AppState
from engines.client import DaemonClient

Done = Callable[[CallResult], None]


class Actions(QObject):
    daemon_restarted = Signal(object)  # the names being loaded again (a tuple of str)

    def __init__(
        self, bridge: Bridge, state: AppState, notifier: Notifier, parent: QObject | None = None
    ) -> None:
        super().__init__(parent)
        self.bridge = bridge
        self.state = state
        self.notifier = notifier
        # a restart under way: the old daemon's pid, and what was loaded (loaded again after)
        self.restarting: tuple[int | None, tuple[str, ...]] | None = None
        state.connection_changed.connect(self.on_connection_changed)

    def _report(self, what: str, then: Done | None = None, *, target: str = "") -> Done:
        def done(result: CallResult) -> None:
            if not result.ok and not result.cancelled:
                fix = fix_for(result.error_code, result.error, target=target)
                self.notifier.notify("error", f"{what} failed", result.error, fix=fix)
            if then is not None:
                then(result)

        return done

    # ----------------------------------------------------------------- engines

    def start_profile(self, name: str, then: Done | None = None) -> None:
        self.remember_profile(name)
        self.bridge.call(
            lambda c: c.start(name), self._report(f"starting {name}", then, target=name)
        )

    def start_library(self, start: LibraryStart, then: Done | None = None) -> None:
        """A library model: a registered folder by its name, a cached model as a quick engine."""
        report = self._report(f"starting {start.name}", then, target=start.name)
        if start.kind == "folder":
            self.bridge.call(lambda c: c.start(start.name), report)
        else:
            self.bridge.call(lambda c: c.start(model=start.name), report)

    def stop_engine(self, engine_id: str, then: Done | None = None) -> None:
        self.bridge.call(lambda c: c.stop(engine_id), self._report(f"stopping {engine_id}", then))

    def restart_engine(self, engine_id: str, then: Done | None = None) -> None:
        self.bridge.call(
            lambda c: c.restart(engine_id), self._report(f"restarting {engine_id}", then)
        )

    def unload_model(self, name: str, then: Done | None = None) -> None:
        """Unload a model (models on demand): at once, or when its running requests end."""

        def done(result: CallResult) -> None:
            if result.ok and isinstance(result.value, dict):
                deferred = bool(result.value.get("deferred"))  # a popup only when it waits
                message = str(result.value["message"])
                self.notifier.notify("info", f"Unloading {name}", message, popup=deferred)
            if then is not None:
                then(result)

        report = self._report(f"unloading {name}", done, target=name)
        self.bridge.call(lambda c: c.unload_model(name), report)

    def engine_for_current(self) -> str:
        """The live engine Stop/Restart act on: the current profile's, else the only one."""
        current = self.state.current_profile()
        engine = self.state.engines.get(current)
        if engine is not None and engine.state in LIVE_STATES:
            return current
        live = self.state.live_engines()
        return live[0].engine_id if len(live) == 1 else ""

    def remember_profile(self, name: str) -> None:
        settings = self.state.settings
        if settings is not None and settings.ui.last_profile != name:
            self.update_settings({"ui.last_profile": name})

    # ----------------------------------------------------------------- settings, daemon

    def update_settings(self, changes: dict[str, object], then: Done | None = None) -> None:
        async def apply(c: DaemonClient) -> None:
            await c.update_settings(changes)
            await self.bridge.link.load_settings(c)

        keys = ", ".join(changes)
        self.bridge.call(apply, self._report(f"changing {keys}", then))

    def set_efficiency_profile(self, name: str, then: Done | None = None) -> None:
        """An efficiency profile on every GPU; the notifier says how it went."""

        def done(result: CallResult) -> None:
            if result.ok and isinstance(result.value, tuple | list):
                count = len(result.value)
                gpus = f"{count} simulated GPU" if self.state.gpu.simulated else f"{count} GPU"
                gpus += "" if count == 1 else "s"
                self.notifier.notify("info", "GPU efficiency", f"{name} is in force on {gpus}")
            self.reload_efficiency()
            if then is not None:
                then(result)

        report = self._report(f"switching the GPUs to {name}", done)
        self.bridge.call(lambda c: c.set_efficiency_profile(name), report)

    def reload_efficiency(self) -> None:
        self.bridge.call(self.bridge.link.load_efficiency)

    def reload_profiles(self) -> None:
        self.bridge.call(self.bridge.link.load_profiles)

    def reload_engines(self) -> None:
        self.bridge.call(self.bridge.link.load_engines)

    def start_daemon(self) -> None:
        async def start(link: object) -> None:
            self.bridge.link.request_daemon_start()

        self.bridge.call_link(start)

    def loaded_names(self) -> tuple[str, ...]:
        """What a daemon restart stops: the live engines, by the name that starts each again."""
        return tuple(e.profile or e.engine_id for e in self.state.live_engines())

    def restart_daemon(self, then: Done | None = None) -> None:
        """Restart the daemon; the models loaded now are started again once it is back."""
        back = self.loaded_names()
        old_pid = self.state.connection.daemon_pid

        def stopped(result: CallResult) -> None:
            if result.ok:  # the old daemon is gone and a new one is starting
                self.restarting = (old_pid, back)
            if then is not None:
                then(result)

        self.bridge.call_link(
            lambda link: link.restart_daemon(), self._report("restarting the daemon", stopped)
        )

    def _start_again(self, name: str) -> None:
        self.bridge.call(lambda c: c.start(name), self._report(f"starting {name}", target=name))

    def on_connection_changed(self, *_: object) -> None:
        conn = self.state.connection
        pending = self.restarting
        if pending is None or conn.state != LinkState.CONNECTED or conn.daemon_pid == pending[0]:
            return
        self.restarting = None
        back = pending[1]
        for name in back:
            self._start_again(name)
        again = f"; loading {', '.join(back)} again" if back else ""
        self.notifier.notify("info", "Daemon restarted", f"serving on {conn.url}{again}")
        self.daemon_restarted.emit(back)

    def copy_endpoint(self) -> str:
        url = self.state.endpoint_url
        if url:
            QGuiApplication.clipboard().setText(url)
            self.notifier.notify("info", "Endpoint copied", url, popup=False)
        return url
