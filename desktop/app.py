"""The tray app: ``traylm`` with no arguments runs ``main``.

It attaches to the running daemon or starts one detached, shows the tray icon (or, on a desktop
without a system tray, the dashboard as a normal window with the tray's menu in its menu bar),
and opens the chat window and the dashboard on demand. A second ``traylm`` asks this one to
show its windows. Quit asks whether to stop the engines or leave the daemon serving, unless
``ui.quit_action`` already says.
"""

from __future__ import annotations

import argparse
import logging
import logging.handlers
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, QRect, Qt, QTimer, Signal
from PySide6.QtWidgets import QApplication, QWidget

from desktop.daemon.actions import Actions
from desktop.daemon.bridge import Bridge
from desktop.daemon.fixes import FIX_PAGES, INSTALL_ENGINE, SETUP, START_DAEMON, Fix
from desktop.daemon.notify import Notifier
from desktop.daemon.state import AppState
from desktop.daemon.theme_follower import ThemeFollower
from desktop.session.instance import InstanceServer, PrimaryLock, send_command
from desktop.tray.icon import TrayController, Windows
from desktop.tray.icons import app_icon
from desktop.tray.quit_dialog import QuitDialog
from engines.config.sections import Paths
from engines.events import DaemonStopping

if TYPE_CHECKING:
    from desktop.chat.window import ChatWindow
    from desktop.dashboard.window import DashboardWindow
    from desktop.setup.dialog import SetupDialog

log = logging.getLogger(__name__)
STOP_DEADLINE_MS = 15000


class DesktopApp(QObject):
    """Composition root of the GUI. Construct (no I/O), ``start()``, ``shutdown()``."""

    finished = Signal()

    def __init__(
        self,
        paths: Paths,
        *,
        spawn_daemon: bool = True,
        use_tray: bool = True,
        offer_setup: bool = True,
        open_window: bool = False,
    ) -> None:
        super().__init__()
        self.paths = paths
        self.use_tray = use_tray
        self.offer_setup = offer_setup  # open the setup by itself on a first run
        # started by the user (not at login): a window opens, the setup on a first run, else
        # the chat with the model last used
        self.open_window = open_window
        self.bridge = Bridge(paths, spawn_daemon=spawn_daemon, parent=self)
        self.state = AppState(self)
        self.bridge.message_received.connect(self.state.on_message_received)
        self.notifier = Notifier(self.state, self)
        self.actions = Actions(self.bridge, self.state, self.notifier, self)
        windows = Windows(
            self.open_chat, self.open_dashboard, self.request_quit, self.open_setup, self.run_fix
        )
        self.tray = TrayController(self.state, self.actions, self.notifier, windows, self)
        qapp = QApplication.instance()
        assert isinstance(qapp, QApplication)
        self.theme = ThemeFollower(qapp, self.state, self)
        self.chat_window: ChatWindow | None = None
        self.dashboard: DashboardWindow | None = None
        self.setup: SetupDialog | None = None
        self._setup_offered = False
        for signal in (
            self.state.envs_changed,
            self.state.settings_changed,
            self.state.profiles_changed,
            self.state.gpu.overview_changed,
            self.state.servable_changed,
        ):
            signal.connect(self.offer_setup_once)
        self.state.event_received.connect(self.on_event_received)
        self.quit_dialog: QuitDialog | None = None
        self.fallback = False
        self._finished = False
        self._shut = False

    def start(self) -> None:
        self.theme.apply()
        self.bridge.start()
        if not (self.use_tray and self.tray.show()):
            self.fallback = True
            log.info("no system tray on this desktop: running in a window")
            self.open_dashboard("")

    # ----------------------------------------------------------------- windows

    def open_chat(self, model: str = "") -> ChatWindow:
        if self.chat_window is None:
            from desktop.chat.window import ChatWindow

            self.chat_window = ChatWindow(
                self.bridge,
                self.state,
                self.actions,
                run_fix=self.run_fix,
                open_setup=self.open_setup,
            )
            self.chat_window.setWindowIcon(app_icon())
        if model:
            self.chat_window.select_model(model)
        _raise(self.chat_window)
        return self.chat_window

    def open_dashboard(self, page: str = "") -> DashboardWindow:
        if self.dashboard is None:
            from desktop.dashboard.window import DashboardWindow

            self.dashboard = DashboardWindow(
                self.bridge,
                self.state,
                self.actions,
                self.notifier,
                open_chat=self.open_chat,
                open_setup=self.open_setup,
                run_fix=self.run_fix,
            )
            self.dashboard.setWindowIcon(app_icon())
            if self.fallback:
                self.dashboard.become_main_window(self.tray.menu, self.request_quit)
        if page:
            self.dashboard.show_page(page)
        _raise(self.dashboard)
        return self.dashboard

    def open_setup(self) -> SetupDialog:
        if self.setup is None:
            from desktop.setup.dialog import SetupDialog

            self.setup = SetupDialog(
                self.bridge,
                self.state,
                self.actions,
                open_chat=self.open_chat,
                run_fix=self.run_fix,
            )
            self.setup.setWindowIcon(app_icon())
        self.setup.begin()
        _raise(self.setup)
        return self.setup

    def offer_setup_once(self) -> None:
        """A first run (nothing can start here yet, the setup never finished): open the setup
        by itself, once, as soon as the daemon has said enough to know."""
        s = self.state
        settings = s.settings
        known = (
            s.envs is not None
            and s.servable_listed  # the daemon said what can start here
            and (s.gpu.overview is not None or bool(s.gpu.error))
        )
        if (
            not self.offer_setup
            or self._setup_offered
            or not s.connected
            or settings is None
            or not known
        ):
            return
        self._setup_offered = True
        if not settings.ui.setup_done and not s.current_profile() and not s.live_engines():
            self.open_setup()
        elif self.open_window and self.chat_window is None:
            self.open_chat(s.current_profile())

    def on_event_received(self, event: object) -> None:
        """`traylm shutdown` stops traylm as a whole: this app closes with its daemon."""
        if isinstance(event, DaemonStopping) and event.close_apps:
            log.info("the daemon is shutting down and asked the apps to close")
            QTimer.singleShot(0, self, lambda: self.quit_with("leave"))

    def run_fix(self, fix: Fix) -> None:
        """What a fix button (a notification's, an error card's) does."""
        if fix.action in (SETUP, INSTALL_ENGINE):
            self.open_setup()
        elif fix.action == START_DAEMON:
            self.actions.start_daemon()
        elif fix.action in FIX_PAGES:
            key = FIX_PAGES[fix.action]
            self.open_dashboard(key).page(key).show_fix(fix)

    # ----------------------------------------------------------------- quitting

    def request_quit(self) -> None:
        settings = self.state.settings
        action = settings.ui.quit_action if settings is not None else "ask"
        if not self.state.connected:
            self.quit_with("leave")
        elif action == "ask":
            if self.quit_dialog is None:
                self.quit_dialog = QuitDialog(self.state, self.on_quit_chosen)
            self.quit_dialog.open()
            self.quit_dialog.raise_()
        else:
            self.quit_with(action)

    def on_quit_chosen(self, action: str, remember: bool) -> None:
        self.quit_dialog = None
        if action == "cancel":
            return
        if remember:
            self.actions.update_settings(
                {"ui.quit_action": action}, then=lambda _r: self.quit_with(action)
            )
        else:
            self.quit_with(action)

    def quit_with(self, action: str) -> None:
        """``stop``: shut the daemon down (it stops its engines first); ``leave``: just go."""
        if action == "stop":  # connected or not (a restart under way): the daemon stops
            self.bridge.call_link(lambda link: link.shutdown_daemon(), lambda _r: self._finish())
            QTimer.singleShot(STOP_DEADLINE_MS, self, self._finish)
        else:
            self._finish()

    def _finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        self.shutdown()
        self.finished.emit()  # main() quits the Qt event loop on it

    def shutdown(self) -> None:
        """Close every window and dialog the app opened and delete them with the tray's menu
        (once: a second call does nothing), then stop following the theme and the daemon."""
        if self._shut:
            return
        self._shut = True
        for window in (self.chat_window, self.dashboard):
            if window is not None:
                window.prepare_close()
        for widget in (self.chat_window, self.dashboard, self.setup, self.quit_dialog):
            if widget is not None:
                widget.close()
                widget.deleteLater()
        self.chat_window = self.dashboard = self.setup = self.quit_dialog = None
        self.tray.dispose()
        self.theme.stop()
        self.bridge.stop()

    # ----------------------------------------------------------------- instance commands

    def handle_command(self, command: dict[str, Any]) -> dict[str, Any]:
        cmd = command.get("cmd")
        if cmd == "show":
            what, page = str(command.get("what", "")), str(command.get("page", ""))
            if what == "chat":
                self.open_chat(str(command.get("model", "")))
            elif what == "dashboard" or page or self.fallback or not self.tray.icon.isVisible():
                self.open_dashboard(page)
            else:
                self.open_chat("")
                self.open_dashboard("")
            return {"ok": True}
        if cmd == "status":
            return self.describe()
        if cmd == "quit":
            action = str(command.get("action", "leave"))
            QTimer.singleShot(0, self, lambda: self.quit_with(action))
            return {"ok": True}
        return {"ok": False, "error": f"unknown command {cmd!r}; known: show, status, quit"}

    def describe(self) -> dict[str, Any]:
        """What is on screen: used by the real-tray tests and the start-up benchmark."""
        menu = self.tray.menu
        actions = {}
        if menu.isVisible():
            for action in menu.actions():
                if action.text() and not action.isSeparator():
                    rect = menu.actionGeometry(action)
                    center = menu.mapToGlobal(rect.center())
                    actions[action.text()] = [center.x(), center.y(), action.isEnabled()]
        return {
            "ok": True,
            "tray_visible": self.tray.icon.isVisible(),
            "tray_geometry": _rect(self.tray.icon.geometry()),
            "tray_state": str(self.tray.current),
            "tooltip": self.tray.icon.toolTip(),
            "link": str(self.state.connection.state),
            "link_message": self.state.connection.message,
            "menu_visible": menu.isVisible(),
            "menu_actions": actions,
            "fallback": self.fallback,
            "chat_visible": bool(self.chat_window and self.chat_window.isVisible()),
            "dashboard_visible": bool(self.dashboard and self.dashboard.isVisible()),
        }


def _rect(r: QRect) -> list[int]:
    return [r.x(), r.y(), r.width(), r.height()]


def _raise(window: QWidget) -> None:
    """Bring a window to the front, un-minimized: show() alone leaves a minimized window in the
    taskbar, and without a tray a relaunch then showed nothing."""
    if window.isMinimized():
        window.setWindowState(window.windowState() & ~Qt.WindowState.WindowMinimized)
    window.show()
    window.raise_()
    window.activateWindow()


# --------------------------------------------------------------------------- entry point


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="traylm", description="traylm tray app")
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--show", choices=("chat", "dashboard"), help="open this window at start")
    p.add_argument(
        "--at-login",
        action="store_true",
        help="start in the tray only, opening no window (the autostart entry uses it)",
    )
    p.add_argument("--page", default="", help="dashboard page to open (gpus, engines, models, ...)")
    p.add_argument(
        "--no-daemon-start",
        action="store_true",
        help="do not start a daemon when none runs; wait for one",
    )
    p.add_argument("--no-tray", action="store_true", help="run in a window, without a tray icon")
    args = p.parse_args(list(argv))
    if args.page:
        from desktop.dashboard.pages import PAGES

        keys = [spec.key for spec in PAGES]
        if args.page not in keys:
            p.error(f"no dashboard page {args.page!r}; pages: {', '.join(keys)}")
    return args


def _setup_logging(paths: Paths, *, verbose: bool) -> None:
    """stderr, and logs/desktop.log (an app started at login has no terminal)."""
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format=fmt)
    logging.getLogger().handlers[0].setLevel(logging.DEBUG if verbose else logging.WARNING)
    try:
        paths.logs_dir.mkdir(parents=True, exist_ok=True)
        handler = logging.handlers.RotatingFileHandler(
            paths.logs_dir / "desktop.log", maxBytes=2_000_000, backupCount=2
        )
    except OSError:
        return
    handler.setFormatter(logging.Formatter(fmt))
    logging.getLogger().addHandler(handler)


def no_display_reason(environ: Mapping[str, str]) -> str | None:
    """Why Qt cannot show windows here, or None. Checked before QApplication exists: without a
    display Qt aborts the process with a message about platform plugins that helps nobody."""
    if environ.get("QT_QPA_PLATFORM") or environ.get("DISPLAY") or environ.get("WAYLAND_DISPLAY"):
        return None
    return (
        "no graphical session here (DISPLAY and WAYLAND_DISPLAY are unset). Start `traylm` from "
        "your desktop, or run the daemon alone with `traylm serve` and use the CLI and "
        "http://127.0.0.1:8000/v1"
    )


def main(argv: Sequence[str] = ()) -> int:
    args = _parse(argv)
    paths = Paths.from_env()
    _setup_logging(paths, verbose=args.verbose)
    reason = no_display_reason(os.environ)
    if reason is not None and QApplication.instance() is None:
        print(f"traylm: {reason}", file=sys.stderr)
        return 2
    qapp = QApplication.instance() or QApplication([sys.argv[0] if sys.argv else "traylm"])
    assert isinstance(qapp, QApplication)
    qapp.setApplicationName("traylm")
    qapp.setDesktopFileName("traylm")
    qapp.setQuitOnLastWindowClosed(False)
    qapp.setWindowIcon(app_icon())
    lock = PrimaryLock.try_acquire(paths)
    if lock is None:
        what = args.show or ("dashboard" if args.page else "")
        reply = send_command(paths, {"cmd": "show", "what": what, "page": args.page})
        if reply is None:
            print("traylm: another tray app holds the lock but does not answer", file=sys.stderr)
            return 1
        return 0
    from desktop.session.unix_signals import SignalWatcher

    app = DesktopApp(
        paths,
        spawn_daemon=not args.no_daemon_start,
        use_tray=not args.no_tray,
        open_window=not args.at_login and not args.show and not args.page,
    )
    app.finished.connect(qapp.quit)
    server = InstanceServer(paths, app.handle_command)
    server.listen()
    watcher = SignalWatcher(lambda _sig: app.quit_with("leave"))
    watcher.install()
    app.start()
    if args.show == "chat":
        app.open_chat("")
    elif args.show == "dashboard" or args.page:
        app.open_dashboard(args.page)
    try:
        code = qapp.exec()
    finally:
        if not app._finished:
            app.shutdown()
        watcher.uninstall()
        server.close()
        lock.release()
    return int(code)
