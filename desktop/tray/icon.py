"""The tray icon, its tooltip and its menu. Without a system tray the same menu lives in the
fallback window's menu bar (see app.py), so every action stays reachable.

Menu: status line · "Set up traylm…" (only while nothing can start here) · Start/Stop/Restart ·
Profiles ▸ (those that cannot start here greyed, with why) · Models ▸ (chat with a served one,
unload a loaded one, open an agent CLI in a terminal, start one from the library) · GPU
efficiency ▸ (the efficiency profiles, the one in force checked; only with GPUs) · Open chat ·
Open dashboard · Copy endpoint URL · LAN sharing state · Daemon ▸ (start/restart) · Quit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QAction, QActionGroup
from PySide6.QtWidgets import QMenu, QMessageBox, QSystemTrayIcon

from desktop.daemon.actions import Actions
from desktop.daemon.batches import batch_text
from desktop.daemon.fixes import Fix
from desktop.daemon.library import library_starts
from desktop.daemon.messages import LinkState
from desktop.daemon.notify import Notification, Notifier
from desktop.daemon.restart import CONFIRM_RESTART, restart_plan
from desktop.daemon.state import LIVE_STATES, AppState
from desktop.daemon.terminal import AGENTS, find_terminal, open_agent
from desktop.tray.icon_state import (
    disk_text,
    remote_text,
    tooltip_text,
    tray_state,
)
from desktop.tray.icons import TrayState, state_icon
from engines.config.profiles import replica_base
from engines.events import EngineState

BALLOON_MS = 8000
STOP_TIP = "Stop the engine now: replies being written are cut off and its memory is freed."
RESTART_TIP = "Stop the engine and start it again: replies being written are cut off."
UNLOAD_TIP = (
    "Free this model's memory once the replies it is writing are done; "
    "a request for it (a chat message) loads it again."
)
_LEVEL_ICONS = {
    "info": QSystemTrayIcon.MessageIcon.Information,
    "warning": QSystemTrayIcon.MessageIcon.Warning,
    "error": QSystemTrayIcon.MessageIcon.Critical,
}


@dataclass(frozen=True)
class Windows:
    """How the menu opens the app's windows and quits (provided by the app)."""

    open_chat: Callable[[str], object]  # model name or ""
    open_dashboard: Callable[[str], object]  # page key or ""
    request_quit: Callable[[], None]
    open_setup: Callable[[], object] = lambda: None  # the first-run setup
    run_fix: Callable[[Fix], None] = lambda _fix: None  # what a notification's fix does


class TrayController(QObject):
    state_changed = Signal(object)  # TrayState

    def __init__(
        self,
        state: AppState,
        actions: Actions,
        notifier: Notifier,
        windows: Windows,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.state = state
        self.actions = actions
        self.windows = windows
        self.confirm_restart: Callable[[str], bool] = ask_restart  # tests answer it themselves
        self.current = TrayState.STARTING
        self.icon = QSystemTrayIcon(state_icon(self.current), self)
        self.menu = QMenu()
        self.menu.setObjectName("trayMenu")
        self._build_menu()
        self.icon.setContextMenu(self.menu)
        self.icon.activated.connect(self.on_icon_activated)
        self.icon.messageClicked.connect(self.on_message_clicked)
        self.last_popup: Notification | None = None
        for signal in (
            state.connection_changed,
            state.engines_changed,
            state.profiles_changed,
            state.settings_changed,
            state.status_changed,
            state.throughput_sampled,
        ):
            signal.connect(self.refresh)
        for signal in (
            state.envs_changed,
            state.library_changed,
            state.servable_changed,
            state.gpu.overview_changed,
        ):
            signal.connect(self.refresh)
        for signal in (
            state.engines_changed,
            state.profiles_changed,
            state.settings_changed,
            state.envs_changed,
            state.library_changed,
            state.servable_changed,
        ):
            signal.connect(self.refresh_menus)
        state.gpu.hot_changed.connect(self.refresh)
        state.gpu.overview_changed.connect(self.refresh)
        state.gpu.sampled.connect(self.on_gpu_sampled)
        state.gpu.efficiency_changed.connect(self._fill_efficiency)
        state.gpu.overview_changed.connect(self._fill_efficiency)
        notifier.notified.connect(self.on_notified)
        self.refresh()
        self.refresh_menus()

    # ----------------------------------------------------------------- menu

    def _add(self, text: str, slot: Callable[[], object], name: str) -> QAction:
        action = QAction(text, self.menu)
        action.setObjectName(name)
        action.triggered.connect(lambda _checked=False: slot())
        self.menu.addAction(action)
        return action

    def _build_menu(self) -> None:
        self.status_action = QAction("", self.menu)
        self.status_action.setEnabled(False)
        self.menu.addAction(self.status_action)
        self.menu.setToolTipsVisible(True)  # Stop, Restart and Unload say what they do
        self.menu.addSeparator()
        self.setup_action = self._add("Set up traylm…", lambda: self.windows.open_setup(), "setup")
        self.setup_action.setVisible(False)
        self.start_action = self._add("Start", self.on_start_triggered, "start")
        self.stop_action = self._add("Stop", self.on_stop_triggered, "stop")
        self.stop_action.setToolTip(STOP_TIP)
        self.restart_action = self._add("Restart", self.on_restart_triggered, "restart")
        self.restart_action.setToolTip(RESTART_TIP)
        self.profiles_menu = self.menu.addMenu("Profiles")
        self.profiles_menu.setObjectName("profilesMenu")
        self.models_menu = self.menu.addMenu("Models")
        self.models_menu.setObjectName("modelsMenu")
        self.models_menu.setToolTipsVisible(True)
        self.efficiency_menu = self.menu.addMenu("GPU efficiency")
        self.efficiency_menu.setObjectName("efficiencyMenu")
        self.efficiency_menu.setToolTipsVisible(True)  # each profile's description
        self.efficiency_menu.menuAction().setVisible(False)
        self._efficiency_shown: object = None  # what the submenu was filled from
        self.menu.addSeparator()
        self._add("Open chat", lambda: self.windows.open_chat(""), "openChat")
        self._add("Open dashboard", lambda: self.windows.open_dashboard(""), "openDashboard")
        self.copy_action = self._add("Copy endpoint URL", self.actions.copy_endpoint, "copyUrl")
        self.lan_action = self._add(
            "LAN sharing: off", lambda: self.windows.open_dashboard("settings"), "lan"
        )
        self.remote_action = self._add(
            "Remote fallback: off", lambda: self.windows.open_dashboard("engines"), "remote"
        )
        self.remote_action.setVisible(False)
        self.hot_action = self._add(
            "GPU hot: thermal guard acting", lambda: self.windows.open_dashboard("gpus"), "hot"
        )
        self.hot_action.setVisible(False)
        self.daemon_menu = self.menu.addMenu("Daemon")
        self.start_daemon_action = QAction("Start the daemon", self.daemon_menu)
        self.start_daemon_action.triggered.connect(self.actions.start_daemon)
        self.restart_daemon_action = QAction("Restart the daemon", self.daemon_menu)
        self.restart_daemon_action.triggered.connect(self.on_restart_daemon_triggered)
        self.restart_daemon_action.setToolTip(
            "Stop the daemon and its engines and start it again with the saved settings; the "
            "models loaded now are loaded again"
        )
        self.daemon_menu.setToolTipsVisible(True)
        self.daemon_menu.addAction(self.start_daemon_action)
        self.daemon_menu.addAction(self.restart_daemon_action)
        self.menu.addSeparator()
        self._add("Quit", self.windows.request_quit, "quit")
        self.menu.aboutToShow.connect(self.refresh)
        self.menu.aboutToShow.connect(self.refresh_menus)

    def _fill_profiles(self) -> None:
        self.profiles_menu.clear()
        group = QActionGroup(self.profiles_menu)
        current = self.state.current_profile()
        for entry in self.state.profiles:
            engine = self.state.engines.get(entry.name)
            live = engine is not None and engine.state in LIVE_STATES
            blocker = "" if live else self.state.blocker(entry)
            running = f"  [{engine.state}]" if live and engine else ""
            text = f"{entry.name}{running}" + (f"  ({blocker})" if blocker else "")
            action = QAction(text, self.profiles_menu, checkable=True)
            action.setChecked(entry.name == current)
            action.setEnabled(not blocker)
            action.setToolTip(entry.description)
            action.setObjectName(f"profile:{entry.name}")
            group.addAction(action)
            action.triggered.connect(
                lambda _checked=False, name=entry.name: self.on_profile_triggered(name)
            )
            self.profiles_menu.addAction(action)
        if not self.state.profiles:
            empty = self.profiles_menu.addAction("(no profiles: add one in the dashboard)")
            empty.setEnabled(False)

    def _fill_efficiency(self) -> None:
        """The efficiency profiles, the one in force on every GPU checked; choosing one puts
        it on every GPU (the notifier says how it went). Only while there are GPUs."""
        gpu = self.state.gpu
        profiles = gpu.efficiency.profiles if gpu.efficiency is not None else ()
        in_force = gpu.profile_in_force()
        shown = (gpu.available, profiles, in_force)
        checked = [a.objectName() for a in self.efficiency_menu.actions() if a.isChecked()]
        expected = [f"efficiency:{in_force}"] if in_force else []
        if shown == self._efficiency_shown and checked == expected:
            return  # the overview changes every few seconds: the open menu stays as it is
        self._efficiency_shown = shown
        self.efficiency_menu.clear()
        self.efficiency_menu.menuAction().setVisible(gpu.available and bool(profiles))
        group = QActionGroup(self.efficiency_menu)
        for entry in profiles:
            action = QAction(entry.name, self.efficiency_menu, checkable=True)
            action.setChecked(entry.name == in_force)
            action.setToolTip(entry.description)
            action.setObjectName(f"efficiency:{entry.name}")
            group.addAction(action)
            action.triggered.connect(
                lambda _checked=False, name=entry.name: self.actions.set_efficiency_profile(name)
            )
            self.efficiency_menu.addAction(action)

    def _fill_models(self) -> None:
        """Served models to chat with (one only a paired box serves marked "on BOX"), then
        the library's models (folders registered with `traylm models add`, models in the
        Hugging Face cache) to start."""
        self.models_menu.clear()
        models = self.state.served_models()
        for model in models:
            action = self.models_menu.addAction(f"Chat with {model}")
            action.setObjectName(f"model:{model}")
            action.triggered.connect(lambda _c=False, m=model: self.windows.open_chat(m))
        for replica in self.state.box_only_models():  # served only by a paired box
            action = self.models_menu.addAction(f"Chat with {replica.name} ({replica.label})")
            action.setObjectName(f"model:{replica.name}")
            action.setEnabled(not replica.away)  # no box serves it now: a chat would get a 503
            action.setToolTip(replica.detail)
            action.triggered.connect(lambda _c=False, m=replica.name: self.windows.open_chat(m))
        if not models and not self.state.box_replicas:
            self.models_menu.addAction("(no model served)").setEnabled(False)
        loaded = self.state.loaded_engines()
        if loaded:
            self.models_menu.addSection("Loaded")
        firsts = {replica_base(e.engine_id): e for e in reversed(loaded)}  # a model once
        for engine in (e for e in loaded if firsts[replica_base(e.engine_id)] is e):
            names = ", ".join(engine.served_names) or engine.engine_id
            asleep = " (asleep)" if engine.state == EngineState.SLEEPING else ""
            copies = len(self.state.replicas_of(engine))
            asleep += f" ({copies} replicas)" if copies > 1 else ""
            action = self.models_menu.addAction(f"Unload {names}{asleep}")
            base = replica_base(engine.engine_id)  # unloads every replica
            action.setObjectName(f"unload:{base}")
            action.setToolTip(UNLOAD_TIP)
            action.triggered.connect(lambda _c=False, e=base: self.actions.unload_model(e))
        self._fill_agents()
        startable = library_starts(self.state)
        if startable:
            self.models_menu.addSection("Library")
        for start in startable:
            action = self.models_menu.addAction(start.label)
            action.setObjectName(f"library:{start.name}")
            action.setEnabled(not start.blocker)
            action.setToolTip(start.blocker or start.path)
            action.triggered.connect(lambda _c=False, x=start: self.actions.start_library(x))

    def _fill_agents(self) -> None:
        """Agent CLIs run in a terminal with `traylm launch` (a model that can call tools:
        the loaded or last-used one); none where no terminal emulator is installed."""
        if find_terminal() is None:
            return
        self.models_menu.addSection("Agents")
        for agent, title in AGENTS:
            action = self.models_menu.addAction(f"Open {title} in a terminal")
            action.setObjectName(f"agent:{agent}")
            action.setToolTip(f"traylm launch {agent}: {title} with a model that can call tools")
            action.triggered.connect(lambda _c=False, a=agent: open_agent(a))

    # ----------------------------------------------------------------- refresh

    def refresh(self, *_: object) -> None:
        s = self.state
        link = s.connection.state
        self._refresh_icon_and_tooltip()
        self._refresh_actions(link, bool(s.status.get("lan_sharing", False)))

    def on_gpu_sampled(self, _sample: object) -> None:
        """Once a second with GPU telemetry: only what a sample can change."""
        self._refresh_icon_and_tooltip()

    def _refresh_icon_and_tooltip(self) -> None:
        s = self.state
        link = s.connection.state
        new = tray_state(link, s.engines.values(), busy=s.busy, hot=s.gpu.hot and link.usable)
        if new != self.current:
            self.current = new
            self.icon.setIcon(state_icon(new))
            self.state_changed.emit(new)
        tokens = s.throughput.tokens_per_s if s.throughput else None
        text = tooltip_text(
            link=link,
            link_message=s.connection.message,
            endpoint=s.endpoint_url,
            engines=s.engines.values(),
            tokens_per_s=tokens,
            lan_sharing=bool(s.status.get("lan_sharing", False)),
            gpu_lines=s.gpu.tooltip_lines(),
            remote=remote_text(s.remote),
            disk=disk_text(s.status),
            batches=batch_text(s.status),
        )
        if text != self.icon.toolTip():
            self.icon.setToolTip(text)

    def refresh_menus(self) -> None:
        self._fill_profiles()
        self._fill_models()
        self._fill_efficiency()

    def _refresh_actions(self, link: LinkState, lan: bool) -> None:
        s = self.state
        usable = link.usable
        status = {
            LinkState.CONNECTING: "Connecting to the daemon…",
            LinkState.STARTING_DAEMON: "Starting the daemon…",
            LinkState.UNREACHABLE: "Daemon not reachable",
            LinkState.VERSION_MISMATCH: "Daemon of another version",
        }.get(link, "")
        current = s.current_profile()
        engine_id = self.actions.engine_for_current()
        if not status:
            live = s.live_engines()
            status = (
                ", ".join(f"{e.engine_id}: {e.state}" for e in live)
                if live
                else "No engine running"
            )
            if s.endpoint_url:
                status += f"  ·  {s.endpoint_url}"
        self.status_action.setText(status)
        current_live = current in s.engines and s.engines[current].state in LIVE_STATES
        # nothing can start here yet: the setup leads the way, in an item of its own (Start
        # keeps one meaning: start the model named in it)
        self.setup_action.setVisible(usable and not current)
        self.start_action.setText(f"Start {current}" if current else "Start")
        self.start_action.setEnabled(usable and bool(current) and not current_live)
        self.stop_action.setText(f"Stop {engine_id}" if engine_id else "Stop")
        self.stop_action.setEnabled(usable and bool(engine_id))
        self.restart_action.setText(f"Restart {engine_id}" if engine_id else "Restart")
        self.restart_action.setEnabled(usable and bool(engine_id))
        self.copy_action.setEnabled(bool(s.endpoint_url))
        self.profiles_menu.setEnabled(usable)
        if lan:
            self.lan_action.setText("LAN sharing: ON (0.0.0.0, API key required)")
        else:
            self.lan_action.setText("LAN sharing: off (this computer only)")
        remote = remote_text(s.remote) if usable else ""
        self.remote_action.setText(remote)
        self.remote_action.setVisible(bool(remote))
        self.hot_action.setVisible(usable and s.gpu.hot)
        self.start_daemon_action.setEnabled(link == LinkState.UNREACHABLE)
        self.restart_daemon_action.setEnabled(usable)

    # ----------------------------------------------------------------- slots

    def on_start_triggered(self) -> None:
        current = self.state.current_profile()
        if current:
            self.actions.start_profile(current)

    def on_restart_daemon_triggered(self) -> None:
        """Ask first, as Settings does: what the restart stops, brings back and keeps."""
        s = self.state
        plan = restart_plan(
            self.actions.loaded_names(), s.settings, s.status, s.connection.serve_args
        )
        if self.confirm_restart(plan):
            self.actions.restart_daemon()

    def on_stop_triggered(self) -> None:
        engine_id = self.actions.engine_for_current()
        if engine_id:
            self.actions.stop_engine(engine_id)

    def on_restart_triggered(self) -> None:
        engine_id = self.actions.engine_for_current()
        if engine_id:
            self.actions.restart_engine(engine_id)

    def on_profile_triggered(self, name: str) -> None:
        engine = self.state.engines.get(name)
        if engine is not None and engine.state in LIVE_STATES:
            self.actions.remember_profile(name)
        else:
            self.actions.start_profile(name)

    def on_icon_activated(self, reason: QSystemTrayIcon.ActivationReason) -> None:
        if reason == QSystemTrayIcon.ActivationReason.Trigger:
            self.windows.open_dashboard("")
        elif reason == QSystemTrayIcon.ActivationReason.MiddleClick:
            self.windows.open_chat("")

    def on_notified(self, note: Notification) -> None:
        if note.popup and self.icon.isVisible() and QSystemTrayIcon.supportsMessages():
            self.last_popup = note
            message = note.message
            if note.fix is not None and note.fix.action:
                message += f"\n\nClick: {note.fix.label.rstrip('…')}"
            self.icon.showMessage(
                note.title,
                message,
                _LEVEL_ICONS.get(note.level, _LEVEL_ICONS["info"]),
                BALLOON_MS,
            )

    def on_message_clicked(self) -> None:
        """A click on the balloon does its fix (or shows the dashboard)."""
        note, self.last_popup = self.last_popup, None
        if note is not None and note.fix is not None and note.fix.action:
            self.windows.run_fix(note.fix)
        else:
            self.windows.open_dashboard("")

    # ----------------------------------------------------------------- visibility

    def show(self) -> bool:
        """Show the icon; False when the desktop has no system tray (use a window instead)."""
        if not QSystemTrayIcon.isSystemTrayAvailable():
            return False
        self.icon.show()
        return True

    def hide(self) -> None:
        self.icon.hide()

    def dispose(self) -> None:
        """Hide the icon and delete the menu (a top-level widget of its own) with the
        controller: the app is going."""
        self.icon.hide()
        self.menu.deleteLater()
        self.deleteLater()


def ask_restart(plan: str) -> bool:
    """The tray's question before a restart (the menu has no room to say it)."""
    box = QMessageBox(QMessageBox.Icon.Question, "Restart the traylm daemon?", plan)
    go = box.addButton(CONFIRM_RESTART, QMessageBox.ButtonRole.AcceptRole)
    box.addButton(QMessageBox.StandardButton.Cancel)
    box.exec()
    return box.clickedButton() is go
