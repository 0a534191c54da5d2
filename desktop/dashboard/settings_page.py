"""Settings: endpoint (port, LAN sharing, API keys), Ollama's API (on/off, port, whether it is
served or its port is taken, and how to move either), desktop (autostart, quit, notifications,
colours, the first-run setup again), Hugging Face, energy and the GPU simulator. Each change is
sent to the daemon at once (``PATCH /api/settings``), which validates and saves it; its tooltip
is the setting's doc line from the daemon."""

from __future__ import annotations

import html
from collections.abc import Mapping

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from desktop.daemon.fixes import HUB_LOGIN, Fix
from desktop.daemon.keyfile import write_key
from desktop.daemon.messages import CallResult
from desktop.daemon.restart import CONFIRM_RESTART, RESTART, port_of, restart_plan
from desktop.dashboard.page import Page, PageContext
from desktop.look.theme import THEMES
from desktop.session import autostart
from engines.config.sections import Settings
from engines.events import HFTokenStatus

RESTART_NOTE = "takes effect when the daemon restarts"
LIVE_NOTE = "applied now"
# what a saved setting is called in words (the form's labels), never its key
LABELS = {
    "gateway.port": "Port",
    "gateway.lan_sharing": "LAN sharing",
    "gateway.keys_for": "Keys needed by",
    "ollama.enabled": "Ollama's API",
    "ollama.port": "Ollama's port",
    "ui.autostart": "Autostart",
    "ui.quit_action": "Quit action",
    "ui.notifications": "Notifications",
    "ui.theme": "Colours",
    "hub.endpoint": "Hugging Face endpoint",
    "energy.electricity_price_per_kwh": "Electricity price",
    "energy.currency": "Currency",
    "energy.psu_watts": "Power supply",
    "gpu.simulate_gpus": "GPU simulator",
}


ADD_KEY, CONFIRM_ADD_KEY = "Add key", "Add the key"
KEYS_FOR = {"all": "every client (this computer too)", "lan": "LAN clients only"}


def key_effect(settings: Settings | None) -> str:
    """What adding a key changes, in the words of the setting that decides it."""
    if settings is not None and settings.gateway.api_key_sha256:
        return "Another key for the same clients; the existing keys stay valid."
    if settings is not None and settings.gateway.keys_for == "lan":
        return (
            "From now on, clients on the LAN must send this key; apps on this computer still "
            "need none. traylm's chat keeps working."
        )
    return (
        "From now on every client must send this key, apps on this computer too: those "
        "without it get 401 (choose 'LAN clients only' below to spare them). traylm's chat "
        "keeps working."
    )


def saved_text(key: str, value: object, note: str = "") -> str:
    """ "Saved: Colours dark" for a change the daemon took, in the form's words."""
    if key == "gateway.keys_for":
        shown = KEYS_FOR.get(str(value), str(value))
    elif isinstance(value, bool):
        shown = "on" if value else "off"
    elif value == "":
        shown = "the default"
    else:
        shown = str(value)
    return f"Saved: {LABELS.get(key, key)} {shown}" + (f" ({note})" if note else "")


def ollama_words(status: object) -> str:
    """Where Ollama's API is served, in words, from `traylm status`'s ``ollama``: its address,
    off, or (its port taken, by Ollama itself most often) who holds it and how to move either."""
    if not isinstance(status, Mapping) or "state" not in status:
        return "not served by this daemon"
    port = status.get("port")
    if status["state"] == "serving":
        return f"serving on http://127.0.0.1:{port} (apps that speak Ollama's API reach traylm)"
    if status["state"] == "taken":
        return f"NOT served: {status.get('detail', '')}, or change the port here"
    return "off"


class SettingsPage(Page):
    def __init__(self, ctx: PageContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self._loading = False
        self._tooltips: dict[str, QWidget] = {}
        outer = QVBoxLayout(self)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        inner = QWidget()
        self.column = QVBoxLayout(inner)
        self.column.addWidget(self._endpoint())
        self.column.addWidget(self._ollama())
        self.column.addWidget(self._desktop())
        self.column.addWidget(self._hub())
        self.column.addWidget(self._energy())
        self.column.addStretch(1)
        scroll.setWidget(inner)
        outer.addWidget(scroll, 1)
        self.result = QLabel("")
        self.result.setObjectName("settingsResult")
        self.result.setWordWrap(True)
        self.result.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        outer.addWidget(self.result)
        ctx.state.settings_changed.connect(self.on_settings_changed)
        ctx.state.status_changed.connect(self.on_settings_changed)
        ctx.actions.daemon_restarted.connect(self.on_daemon_restarted)
        self.on_settings_changed()

    # ----------------------------------------------------------------- groups

    def _group(self, title: str) -> tuple[QGroupBox, QFormLayout]:
        box = QGroupBox(title)
        return box, QFormLayout(box)

    def _endpoint(self) -> QWidget:
        box, form = self._group("Endpoint")
        self.port = QSpinBox(minimum=1, maximum=65535)
        self.port.setMaximumWidth(280)
        self.port.setObjectName("gateway.port")
        self.port.editingFinished.connect(
            lambda: self._apply("gateway.port", self.port.value(), RESTART_NOTE)
        )
        port_row = QHBoxLayout()
        port_row.addWidget(self.port)
        self.restart_daemon = QPushButton(RESTART)
        self.restart_daemon.setObjectName("restartDaemon")
        self.restart_daemon.setToolTip(
            "Stops the daemon and its engines, starts it again with the saved settings, and "
            "loads the models that were loaded; the first click says what it will stop"
        )
        self.restart_daemon.clicked.connect(self.on_restart_daemon_clicked)
        port_row.addWidget(self.restart_daemon)
        port_row.addStretch(1)
        form.addRow("Port", port_row)
        self._tooltips["gateway.port"] = self.port
        self.bound = QLabel("")
        self.bound.setObjectName("boundAddress")
        form.addRow("Serving on", self.bound)
        self.lan = QCheckBox("Share on the LAN (bind 0.0.0.0; API key required)")
        self.lan.setObjectName("gateway.lan_sharing")
        self.lan.toggled.connect(lambda on: self._apply("gateway.lan_sharing", on, RESTART_NOTE))
        form.addRow("LAN sharing", self.lan)
        self._tooltips["gateway.lan_sharing"] = self.lan
        self.keys = QListWidget()
        self.keys.setObjectName("apiKeys")
        self.keys.setMaximumHeight(90)
        self._tooltips["gateway.api_key_sha256"] = self.keys
        key_buttons = QHBoxLayout()
        add = self.add_key_button = QPushButton(ADD_KEY)
        add.setObjectName("addApiKey")
        add.clicked.connect(self.on_add_key_clicked)
        remove = QPushButton("Remove selected")
        remove.setObjectName("removeApiKey")
        remove.clicked.connect(self.on_remove_key_clicked)
        key_buttons.addWidget(add)
        key_buttons.addWidget(remove)
        key_buttons.addStretch(1)
        keys = QVBoxLayout()
        keys.addWidget(self.keys)
        keys.addLayout(key_buttons)
        self.key_note = QLabel("")  # what a key changes, said before it takes effect
        self.key_note.setObjectName("apiKeyNote")
        self.key_note.setWordWrap(True)
        self.key_note.setVisible(False)
        keys.addWidget(self.key_note)
        self.new_key = QLineEdit()
        self.new_key.setObjectName("newApiKey")
        self.new_key.setReadOnly(True)
        self.new_key.setVisible(False)
        keys.addWidget(self.new_key)
        form.addRow("API keys", keys)
        self.keys_for = QComboBox()
        self.keys_for.setMaximumWidth(280)
        self.keys_for.setObjectName("gateway.keys_for")
        for value, text in KEYS_FOR.items():
            self.keys_for.addItem(text, value)
        self.keys_for.currentIndexChanged.connect(
            lambda _i: self._apply("gateway.keys_for", self.keys_for.currentData())
        )
        form.addRow("Keys needed by", self.keys_for)
        self._tooltips["gateway.keys_for"] = self.keys_for
        return box

    def _ollama(self) -> QWidget:
        box, form = self._group("Ollama's API")
        self.ollama_on = QCheckBox("Serve Ollama's API for apps that speak only Ollama's")
        self.ollama_on.setObjectName("ollama.enabled")
        self.ollama_on.toggled.connect(lambda on: self._apply("ollama.enabled", on, LIVE_NOTE))
        form.addRow("Ollama's API", self.ollama_on)
        self._tooltips["ollama.enabled"] = self.ollama_on
        self.ollama_port = QSpinBox(minimum=1, maximum=65535)
        self.ollama_port.setMaximumWidth(280)
        self.ollama_port.setObjectName("ollama.port")
        self.ollama_port.editingFinished.connect(
            lambda: self._apply("ollama.port", self.ollama_port.value(), LIVE_NOTE)
        )
        form.addRow("Port", self.ollama_port)
        self._tooltips["ollama.port"] = self.ollama_port
        self.ollama_state = QLabel("")
        self.ollama_state.setObjectName("ollamaState")
        self.ollama_state.setWordWrap(True)
        self.ollama_state.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        form.addRow("State", self.ollama_state)
        return box

    def _desktop(self) -> QWidget:
        box, form = self._group("Desktop")
        self.autostart = QCheckBox("Start traylm when I log in")
        self.autostart.setObjectName("ui.autostart")
        self.autostart.toggled.connect(self.on_autostart_toggled)
        form.addRow("Autostart", self.autostart)
        self._tooltips["ui.autostart"] = self.autostart
        self.quit_action = QComboBox()
        self.quit_action.setMaximumWidth(280)
        self.quit_action.setObjectName("ui.quit_action")
        self.quit_action.addItems(["ask", "stop", "leave"])
        self.quit_action.currentTextChanged.connect(lambda v: self._apply("ui.quit_action", v))
        form.addRow("Quit action", self.quit_action)
        self._tooltips["ui.quit_action"] = self.quit_action
        self.notifications = QCheckBox("Show desktop notifications")
        self.notifications.setObjectName("ui.notifications")
        self.notifications.toggled.connect(lambda on: self._apply("ui.notifications", on))
        form.addRow("Notifications", self.notifications)
        self._tooltips["ui.notifications"] = self.notifications
        self.theme = QComboBox()
        self.theme.setMaximumWidth(280)
        self.theme.setObjectName("ui.theme")
        self.theme.addItems(list(THEMES))
        self.theme.currentTextChanged.connect(lambda v: self._apply("ui.theme", v))
        form.addRow("Colours", self.theme)
        self._tooltips["ui.theme"] = self.theme
        self.setup_button = QPushButton("Run the setup again…")
        self.setup_button.setObjectName("runSetup")
        self.setup_button.setToolTip(
            "The first-run setup: this computer, the engine, a model that fits, a first answer"
        )
        self.setup_button.clicked.connect(lambda: self.ctx.open_setup())
        form.addRow("First-run setup", self.setup_button)
        return box

    def _hub(self) -> QWidget:
        box, form = self._group("Hugging Face")
        row = QHBoxLayout()
        self.hf_token = QLineEdit()
        self.hf_token.setObjectName("hfToken")
        self.hf_token.setEchoMode(QLineEdit.EchoMode.Password)
        self.hf_token.setPlaceholderText("hf_… (for gated models such as Llama)")
        save = QPushButton("Save token")
        save.setObjectName("saveHfToken")
        save.clicked.connect(self.on_save_token_clicked)
        self.clear_hf_token = QPushButton("Remove")
        self.clear_hf_token.setObjectName("clearHfToken")
        self.clear_hf_token.setToolTip("Remove the saved token (the file hf auth login writes)")
        self.clear_hf_token.clicked.connect(self.on_clear_token_clicked)
        row.addWidget(self.hf_token, 1)
        row.addWidget(save)
        row.addWidget(self.clear_hf_token)
        form.addRow("Token", row)
        self.hf_status = QLabel("")
        self.hf_status.setObjectName("hfTokenStatus")
        self.hf_status.setWordWrap(True)
        form.addRow("", self.hf_status)
        self.hf_endpoint = QLineEdit()
        self.hf_endpoint.setObjectName("hub.endpoint")
        self.hf_endpoint.setPlaceholderText("https://huggingface.co (default)")
        self.hf_endpoint.editingFinished.connect(
            lambda: self._apply("hub.endpoint", self.hf_endpoint.text().strip())
        )
        form.addRow("Endpoint", self.hf_endpoint)
        self._tooltips["hub.endpoint"] = self.hf_endpoint
        return box

    def _energy(self) -> QWidget:
        box, form = self._group("Energy and GPUs")
        price_row = QHBoxLayout()
        self.price = QDoubleSpinBox(decimals=3, minimum=0.0, maximum=100.0, singleStep=0.01)
        self.price.setMaximumWidth(280)
        self.price.setObjectName("energy.electricity_price_per_kwh")
        self.price.editingFinished.connect(
            lambda: self._apply("energy.electricity_price_per_kwh", self.price.value())
        )
        self.currency = QLineEdit()
        self.currency.setObjectName("energy.currency")
        self.currency.setMaximumWidth(70)
        self.currency.editingFinished.connect(
            lambda: self._apply("energy.currency", self.currency.text().strip() or "EUR")
        )
        price_row.addWidget(self.price)
        price_row.addWidget(self.currency)
        price_row.addWidget(QLabel("per kWh"))
        price_row.addStretch(1)
        form.addRow("Electricity price", price_row)
        self._tooltips["energy.electricity_price_per_kwh"] = self.price
        self._tooltips["energy.currency"] = self.currency
        self.psu = QSpinBox(minimum=100, maximum=20000, singleStep=50, suffix=" W")
        self.psu.setMaximumWidth(280)
        self.psu.setObjectName("energy.psu_watts")
        self.psu.editingFinished.connect(
            lambda: self._apply("energy.psu_watts", float(self.psu.value()))
        )
        form.addRow("Power supply", self.psu)
        self._tooltips["energy.psu_watts"] = self.psu
        self.simulate = QSpinBox(minimum=0, maximum=8)
        self.simulate.setMaximumWidth(280)
        self.simulate.setObjectName("gpu.simulate_gpus")
        self.simulate.setSpecialValueText("off (real GPUs through NVML)")
        self.simulate.editingFinished.connect(
            lambda: self._apply(
                "gpu.simulate_gpus", self.simulate.value(), "used by GPU telemetry; " + RESTART_NOTE
            )
        )
        form.addRow("GPU simulator", self.simulate)
        self._tooltips["gpu.simulate_gpus"] = self.simulate
        return box

    # ----------------------------------------------------------------- state → widgets

    def on_settings_changed(self) -> None:
        state = self.ctx.state
        s = state.settings
        for key, widget in self._tooltips.items():
            widget.setToolTip(str(state.docs.get(key, "")))
        if s is None:
            return
        self._loading = True
        try:
            self.port.setValue(s.gateway.port)
            self.lan.setChecked(s.gateway.lan_sharing)
            self.ollama_on.setChecked(s.ollama.enabled)
            self.ollama_port.setValue(s.ollama.port)
            has_keys = bool(s.gateway.api_key_sha256)
            self.keys_for.setCurrentIndex(max(0, self.keys_for.findData(s.gateway.keys_for)))
            self.lan.setEnabled(has_keys or s.gateway.lan_sharing)
            if not has_keys:
                self.lan.setToolTip(
                    "Add an API key first: an open LLM server on the LAN is found by scanners. "
                    + str(state.docs.get("gateway.lan_sharing", ""))
                )
            self.keys.clear()
            for digest in s.gateway.api_key_sha256:
                self.keys.addItem(f"sha256 {digest[:16]}…")
                self.keys.item(self.keys.count() - 1).setData(Qt.ItemDataRole.UserRole, digest)
            self.autostart.setChecked(autostart.is_enabled())
            self.quit_action.setCurrentText(s.ui.quit_action)
            self.notifications.setChecked(s.ui.notifications)
            self.theme.setCurrentText(s.ui.theme)
            self.hf_endpoint.setText(s.hub.endpoint)
            self.price.setValue(s.energy.electricity_price_per_kwh)
            self.currency.setText(s.energy.currency)
            self.psu.setValue(int(s.energy.psu_watts))
            self.simulate.setValue(s.gpu.simulate_gpus)
        finally:
            self._loading = False
        self.ctx.bridge.call(lambda c: c.hf_token(), self._show_token)
        status = state.status
        self.ollama_state.setText(ollama_words(status.get("ollama")))
        host = status.get("bind_host", "?")
        bound = status.get("bound")
        # the sockets really bound; a port saved since takes effect with a restart
        where = ", ".join(map(str, bound)) if isinstance(bound, list | tuple) and bound else ""
        port = port_of(where) if where else s.gateway.port
        required = " (no API key)"
        if status.get("api_key_required"):
            lan_only = s.gateway.keys_for == "lan"
            required = " (API key required from the LAN)" if lan_only else " (API key required)"
        later = f"; port {s.gateway.port} after a restart" if port != s.gateway.port else ""
        self.bound.setText(f"{where or f'{host}:{port}'}{required}{later}")

    def show_fix(self, fix: Fix) -> None:
        field = self.hf_token if fix.action == HUB_LOGIN else self.port
        field.setFocus()

    # ----------------------------------------------------------------- widgets → daemon

    def _apply(self, key: str, value: object, note: str = "") -> None:
        if self._loading:
            return
        settings = self.ctx.state.settings
        if settings is not None and _current(settings, key) == value:
            return

        def done(result: CallResult) -> None:
            if result.ok:
                self._say(True, saved_text(key, value, note))
            else:
                self._say(False, result.error)
                self.on_settings_changed()  # put the widget back to what the daemon has

        self.ctx.actions.update_settings({key: value}, then=done)

    def _say(self, ok: bool, text: str) -> None:
        self.result.setStyleSheet("color: #2f9e44;" if ok else "color: #d62828;")
        self.result.setProperty("ok", ok)
        self.result.setText(text)

    def on_autostart_toggled(self, on: bool) -> None:
        if self._loading:
            return
        try:
            path = autostart.set_enabled(on)
        except OSError as exc:
            self._say(False, f"cannot write the autostart entry: {exc}")
            return
        self._apply("ui.autostart", on, f"{'wrote' if on else 'removed'} {path}")

    def on_add_key_clicked(self) -> None:
        """The first click says what a key changes; the second adds it."""
        if self.add_key_button.text() == ADD_KEY:
            self.key_note.setText(key_effect(self.ctx.state.settings))
            self.key_note.setVisible(True)
            self.add_key_button.setText(CONFIRM_ADD_KEY)
            return
        self.add_key_button.setText(ADD_KEY)
        self.key_note.setVisible(False)

        def added(result: CallResult) -> None:
            if not result.ok or not isinstance(result.value, str):
                self._say(False, result.error)
                return
            key = result.value
            write_key(self.ctx.bridge.paths, key)
            self.new_key.setText(key)
            self.new_key.setVisible(True)
            QGuiApplication.clipboard().setText(key)
            self._say(
                True,
                "New API key copied to the clipboard. It is shown once: the daemon keeps only "
                "its SHA-256 (the chat window keeps a copy to use it).",
            )
            self.ctx.bridge.call(self.ctx.bridge.link.load_settings)

        self.ctx.bridge.call(lambda c: c.add_api_key(), added)

    def on_remove_key_clicked(self) -> None:
        item = self.keys.currentItem()
        if item is None:
            return
        digest = str(item.data(Qt.ItemDataRole.UserRole))

        def removed(result: CallResult) -> None:
            if result.ok:
                self._say(True, "API key removed")
                self.new_key.setVisible(False)
            else:
                self._say(False, result.error)
            self.ctx.bridge.call(self.ctx.bridge.link.load_settings)

        self.ctx.bridge.call(lambda c: c.remove_api_key(digest), removed)

    def on_save_token_clicked(self) -> None:
        """The daemon saves it (its hub route): the file every Hugging Face tool reads."""
        token = self.hf_token.text().strip()
        if not token:
            return

        def saved(result: CallResult) -> None:
            self._show_token(result)
            if isinstance(result.value, HFTokenStatus):
                self.hf_token.clear()
                self._say(True, f"Hugging Face token saved to {html.escape(result.value.path)}")

        self.ctx.bridge.call(lambda c: c.set_hf_token(token), saved)

    def on_clear_token_clicked(self) -> None:
        def cleared(result: CallResult) -> None:
            self._show_token(result)
            if result.ok:
                self._say(True, "The saved Hugging Face token is removed")

        self.ctx.bridge.call(lambda c: c.clear_hf_token(), cleared)

    def _show_token(self, result: CallResult) -> None:
        """The daemon's answer about its token, in words, or why there is none."""
        if not result.ok or not isinstance(result.value, HFTokenStatus):
            self._say(False, result.error or "the daemon did not say where its token is")
            return
        self.hf_status.setText(token_text(result.value))
        self.clear_hf_token.setEnabled(result.value.source == "file")

    def on_restart_daemon_clicked(self) -> None:
        """The first click says what a restart stops and brings back; the second restarts."""
        actions = self.ctx.actions
        if self.restart_daemon.text() == RESTART:
            self.restart_daemon.setText(CONFIRM_RESTART)
            state = self.ctx.state
            plan = restart_plan(
                actions.loaded_names(), state.settings, state.status, state.connection.serve_args
            )
            self._say(True, plan)
            return
        self.restart_daemon.setText(RESTART)
        self._say(True, "Restarting the daemon…")

        def failed(result: CallResult) -> None:
            if not result.ok:
                self._say(False, f"The daemon did not restart: {result.error}")

        actions.restart_daemon(then=failed)

    def on_daemon_restarted(self, back: object) -> None:
        names = ", ".join(back) if isinstance(back, tuple) else ""
        url = self.ctx.state.connection.url
        self._say(
            True,
            f"The daemon restarted: serving on {url}"
            + (f"; loading {names} again" if names else ""),
        )


def _current(settings: object, key: str) -> object:
    section, _, name = key.partition(".")
    return getattr(getattr(settings, section, None), name, None)


def token_text(status: HFTokenStatus) -> str:
    """Where the daemon's Hugging Face token comes from, in a sentence."""
    if status.source == "env":
        where = (
            f"A token is set in ${status.env_var} (the daemon's environment); it takes precedence."
        )
    elif status.source == "file":
        where = f"A token is saved in {status.path}."
    else:
        return "No token: public models only (gated models such as Llama need one)."
    return f"{where} {status.withheld_reason}" if status.withheld_reason else where
