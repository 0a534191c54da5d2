"""Engine environments (one venv per engine and version): the installed ones with their doctor
checks, and installing a new one from here (``POST /api/envs``) with its progress, phase by phase
and line by line, from ``env.install`` events."""

from __future__ import annotations

import html
from collections.abc import Mapping

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import (
    QComboBox,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from desktop.daemon.install_text import PHASE_WORDS
from desktop.daemon.messages import CallResult
from desktop.dashboard.page import PageContext
from desktop.look.theme import primary
from desktop.widgets.log_view import log_view
from desktop.widgets.result_label import ResultLabel
from desktop.widgets.table import read_only_table
from engines.events import EnvInstallProgress, Event

COLUMNS = ("name", "engine", "version", "device", "complete", "path")
PHASES = ("create", "install", "fix", "probe", "done")
LOG_LINES = 500


class EnvsView(QWidget):
    def __init__(self, ctx: PageContext, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.envs: tuple[Mapping[str, object], ...] = ()
        self._ticker = QTimer(self)  # the install's clock, between its events
        self._ticker.setInterval(1000)
        self._ticker.timeout.connect(self.on_tick)
        layout = QVBoxLayout(self)
        self.table = read_only_table(
            [c.capitalize() for c in COLUMNS],
            "envTable",
        )
        layout.addWidget(self.table, 1)
        row = QHBoxLayout()
        refresh = QPushButton("Refresh")
        refresh.clicked.connect(self.reload)
        self.doctor_button = QPushButton("Run doctor")
        self.doctor_button.setObjectName("runDoctor")
        self.doctor_button.clicked.connect(self.on_doctor_clicked)
        row.addWidget(refresh)
        row.addWidget(self.doctor_button)
        row.addStretch(1)
        layout.addLayout(row)
        self.report = QLabel("")
        self.report.setObjectName("doctorReport")
        self.report.setWordWrap(True)
        layout.addWidget(self.report)
        layout.addWidget(self._install_group())
        ctx.state.event_received.connect(self.on_event_received)
        ctx.state.envs_changed.connect(self.on_envs_changed)

    def _install_group(self) -> QGroupBox:
        box = QGroupBox("Install an engine")
        layout = QVBoxLayout(box)
        row = QHBoxLayout()
        self.engine = QComboBox()
        self.engine.setObjectName("installEngine")
        self.engine.addItem("vLLM", "vllm")
        self.engine.addItem("TensorRT-LLM", "trtllm")
        self.engine.addItem("SGLang", "sglang")
        self.device = QComboBox()
        self.device.setObjectName("installDevice")
        self.device.addItem("auto (CUDA with an NVIDIA GPU, else CPU)", "auto")
        self.device.addItem("CUDA", "cuda")
        self.device.addItem("CPU", "cpu")
        self.version = QLineEdit()
        self.version.setObjectName("installVersion")
        self.version.setPlaceholderText("default version")
        self.version.setMaximumWidth(140)
        self.install_button = primary(QPushButton("Install"))
        self.install_button.setObjectName("installEnv")
        self.install_button.clicked.connect(self.on_install_clicked)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setObjectName("cancelInstall")
        self.cancel_button.setToolTip("Stop the install; its unfinished environment is removed")
        self.cancel_button.setEnabled(False)
        self.cancel_button.clicked.connect(self.on_cancel_clicked)
        for w in (
            QLabel("Engine"),
            self.engine,
            QLabel("Device"),
            self.device,
            QLabel("Version"),
            self.version,
            self.install_button,
            self.cancel_button,
        ):
            row.addWidget(w)
        row.addStretch(1)
        layout.addLayout(row)
        self.install_bar = QProgressBar()
        self.install_bar.setObjectName("installProgress")
        self.install_bar.setRange(0, len(PHASES))
        self.install_bar.setValue(0)
        self.install_bar.setFormat("")
        self.install_bar.setVisible(False)  # until an install starts
        layout.addWidget(self.install_bar)
        self.install_status = ResultLabel("installStatus")
        layout.addWidget(self.install_status)
        self.install_log = log_view("installLog", LOG_LINES)
        self.install_log.setMaximumHeight(140)
        self.install_log.setPlaceholderText("The installer's output appears here.")
        layout.addWidget(self.install_log)
        return box

    # ----------------------------------------------------------------- install

    def on_install_clicked(self) -> None:
        engine, device = str(self.engine.currentData()), str(self.device.currentData())
        version = self.version.text().strip() or None

        def done(result: CallResult) -> None:
            if result.ok:
                self.install_status.neutral(f"Installing {engine} ({device})…")
            else:
                self.install_button.setEnabled(True)
                self.install_status.error(result.error)

        self.install_button.setEnabled(False)
        self.install_log.clear()
        self.install_bar.setValue(0)
        self.ctx.bridge.call(lambda c: c.install_env(engine, device=device, version=version), done)

    def on_cancel_clicked(self) -> None:
        self.cancel_button.setEnabled(False)

        def done(result: CallResult) -> None:
            if not result.ok:
                self.install_status.error(result.error)

        self.ctx.bridge.call(lambda c: c.cancel_install(), done)

    def on_event_received(self, event: Event) -> None:
        if not isinstance(event, EnvInstallProgress):
            return
        self.install_bar.setVisible(True)
        if event.line:  # progress-only updates carry bytes, not a line
            self.install_log.appendPlainText(f"[{event.phase}] {event.line}")
        ended = event.phase in ("done", "failed", "cancelled")
        self.install_button.setEnabled(ended)
        self.cancel_button.setEnabled(not ended)
        if event.phase in PHASES:
            self.install_bar.setValue(PHASES.index(event.phase) + 1)
        words = PHASE_WORDS.get(event.phase, event.phase)
        self.install_bar.setFormat(f"{event.engine} ({event.device}): {words}")
        if event.phase == "done":
            self.install_status.ok(event.line)
            self.reload()
        elif event.phase == "failed":
            self.install_status.error(event.line)
        elif event.phase == "cancelled":
            self.install_status.warning(f"Cancelled: {event.line}.")
            self.reload()
        else:
            self.install_status.neutral(self.ctx.state.install_text())
        if ended:
            self._ticker.stop()
        elif not self._ticker.isActive():
            self._ticker.start()

    def on_tick(self) -> None:
        """While pip is silent (a large download) the clock still moves."""
        text = self.ctx.state.install_text()
        if text:
            self.install_status.neutral(text)
        else:
            self._ticker.stop()

    def on_envs_changed(self) -> None:
        if self.isVisible():
            self.reload()

    def reload(self) -> None:
        self.ctx.bridge.call(lambda c: c.envs(), self._on_envs)

    def _on_envs(self, result: CallResult) -> None:
        if not result.ok or not isinstance(result.value, tuple):
            self.report.setText(f"cannot list engine environments: {result.error}")
            return
        self.envs = tuple(e for e in result.value if isinstance(e, Mapping))
        self.table.setRowCount(len(self.envs))
        for r, env in enumerate(self.envs):
            for c, key in enumerate(COLUMNS):
                value = env.get(key, "")
                text = str(value)
                if key == "complete":
                    pid = env.get("installing_pid")
                    text = "yes" if value else "NO (install did not finish)"
                    text = f"installing now (pid {pid})" if pid else text
                item = QTableWidgetItem(text)
                if key == "complete" and (held := str(env.get("held") or "")):
                    # a guarded upgrade kept it out of use: profiles pick it only by version
                    item.setText(f"{text}, held back")
                    version = env.get("version", "")
                    item.setToolTip(
                        f"{held}\nOnly a profile with engine_version = {version} runs it; "
                        f"`traylm engines remove --version {version}` deletes it."
                    )
                self.table.setItem(r, c, item)
        if self.envs and self.table.currentRow() < 0:
            self.table.selectRow(0)
        if not self.envs:
            self.report.setText("No engine installed yet: install one below.")
        elif self.report.text().startswith("No engine installed yet"):
            self.report.setText("")  # said before the install finished: no longer true

    def on_doctor_clicked(self) -> None:
        row = self.table.currentRow()
        if not 0 <= row < len(self.envs):
            return
        name = str(self.envs[row].get("name", ""))
        self.report.setText(f"checking {html.escape(name)}…")
        self.ctx.bridge.call(lambda c: c.env_doctor(name), self._on_doctor)

    def _on_doctor(self, result: CallResult) -> None:
        if not result.ok or not isinstance(result.value, Mapping):
            self.report.setText(f"doctor failed: {html.escape(result.error)}")
            return
        lines = []
        checks = result.value.get("checks", ())
        assert isinstance(checks, tuple)
        for check in checks:
            assert isinstance(check, Mapping)
            ok = bool(check.get("ok"))
            mark = (
                "<span style='color:#2f9e44'>ok</span>"
                if ok
                else "<b style='color:#d62828'>FAIL</b>"
            )
            name, detail = (
                html.escape(str(check.get("name"))),
                html.escape(str(check.get("detail"))),
            )
            line = f"[{mark}] {name}: {detail}"
            if not ok and check.get("fix"):
                line += f"<br>&nbsp;&nbsp;fix: <code>{html.escape(str(check['fix']))}</code>"
            lines.append(line)
        self.report.setText("<br>".join(lines) or "no checks ran")
