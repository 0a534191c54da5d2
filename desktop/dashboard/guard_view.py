"""The thermal-guard part of the Fans & power page: its thresholds (margins below each card's
slowdown temperature, checked by the daemon on every change with a dry run), what they mean in
°C for each GPU, the level each GPU is at, and the guard's recent actions."""

from __future__ import annotations

import time

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QCheckBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from desktop.daemon.messages import CallResult
from desktop.dashboard.page import PageContext
from desktop.widgets.result_label import ResultLabel
from engines.events import GPUGuardAction, GuardLevel, GuardStatus

VALIDATE_AFTER_MS = 250
FIELDS = (
    ("guard_notice_margin_c", "1 · notify", " °C below", 0, 40),
    ("guard_power_margin_c", "2 · lower the power limit", " °C below", 0, 40),
    ("guard_pause_margin_c", "3 · pause new requests", " °C below", 0, 40),
    ("guard_stop_margin_c", "4 · stop the engines", " °C below", 0, 40),
    ("guard_power_pct", "Power limit it sets", " % of default", 10, 100),
    ("guard_step_s", "Time before the next step", " s", 0, 3600),
    ("guard_hysteresis_c", "Stand down when cooler by", " °C", 0, 30),
)


class GuardView(QGroupBox):
    def __init__(self, ctx: PageContext, parent: QWidget | None = None) -> None:
        super().__init__("Thermal guard", parent)
        self.ctx = ctx
        self.status: GuardStatus | None = None
        self.valid = True
        self._loading = False
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(VALIDATE_AFTER_MS)
        self._timer.timeout.connect(self.validate)
        layout = QHBoxLayout(self)
        left = QVBoxLayout()
        form = QFormLayout()
        self.enabled = QCheckBox("Act when a GPU nears its slowdown temperature")
        self.enabled.setObjectName("guardEnabled")
        self.enabled.toggled.connect(self.on_edited)
        form.addRow("Guard", self.enabled)
        self.spins: dict[str, QDoubleSpinBox] = {}
        for key, label, suffix, lo, hi in FIELDS:
            spin = QDoubleSpinBox(minimum=lo, maximum=hi, decimals=1, suffix=suffix)
            spin.setObjectName(key)
            spin.setMaximumWidth(170)
            spin.valueChanged.connect(self.on_edited)
            self.spins[key] = spin
            form.addRow(label, spin)
        left.addLayout(form)
        self.validation = ResultLabel("guardValidation")
        left.addWidget(self.validation)
        row = QHBoxLayout()
        self.apply_button = QPushButton("Apply thresholds")
        self.apply_button.setObjectName("applyGuard")
        self.apply_button.clicked.connect(self.on_apply_clicked)
        row.addWidget(self.apply_button)
        row.addStretch(1)
        left.addLayout(row)
        self.result = ResultLabel("guardResult")
        left.addWidget(self.result)
        left.addStretch(1)
        layout.addLayout(left, 1)
        right = QVBoxLayout()
        self.meaning = QLabel("")
        self.meaning.setObjectName("guardMeaning")
        self.meaning.setWordWrap(True)
        self.meaning.setTextFormat(Qt.TextFormat.RichText)
        right.addWidget(self.meaning)
        right.addWidget(QLabel("Recent actions"))
        self.action_list = QListWidget()
        self.action_list.setObjectName("guardActions")
        self.action_list.setMaximumHeight(170)
        right.addWidget(self.action_list, 1)
        layout.addLayout(right, 1)
        ctx.state.gpu.guard_acted.connect(self.on_guard_acted)
        ctx.state.settings_changed.connect(self._tooltips)

    def _tooltips(self) -> None:
        for key, spin in self.spins.items():
            spin.setToolTip(str(self.ctx.state.docs.get(f"gpu.{key}", "")))
        self.enabled.setToolTip(str(self.ctx.state.docs.get("gpu.guard_enabled", "")))

    # ----------------------------------------------------------------- daemon → widgets

    def refresh(self) -> None:
        self._tooltips()
        self.ctx.bridge.call(lambda c: c.guard(), self._on_status)

    def _on_status(self, result: CallResult) -> None:
        if not result.ok or not isinstance(result.value, GuardStatus):
            self.validation.error(result.error)
            return
        s = self.status = result.value
        self._loading = True
        try:
            self.enabled.setChecked(s.enabled)
            for key, spin in self.spins.items():
                spin.setValue(float(s.thresholds.get(key, spin.value())))
        finally:
            self._loading = False
        if s.problem:
            self.validation.error(s.problem)
        self.action_list.clear()
        for action in s.actions:
            self._add_action(action)
        self._show_meaning()

    def _show_meaning(self) -> None:
        s = self.status
        if s is None:
            return
        th = {k: spin.value() for k, spin in self.spins.items()}
        lines = []
        slowdowns = {g.uuid: g.slowdown_c for g in s.gpus}
        for info in self.ctx.state.gpu.infos():
            slowdown = slowdowns.get(info.uuid) or info.slowdown_temperature_c or 90
            level = next((g.level for g in s.gpus if g.uuid == info.uuid), GuardLevel.NORMAL)
            steps = " · ".join(
                f"{name} {slowdown - th[key]:.0f} °C"
                for key, name in (
                    ("guard_notice_margin_c", "notify"),
                    ("guard_power_margin_c", "lower power"),
                    ("guard_pause_margin_c", "pause"),
                    ("guard_stop_margin_c", "stop"),
                )
            )
            now = f"<b style='color:#d62828'>{level.name.lower()}</b>" if level else "normal"
            lines.append(
                f"<b>GPU {info.index}</b> (slows down at {slowdown} °C): {steps}<br>"
                f"&nbsp;&nbsp;level now: {now}"
            )
        if not self.enabled.isChecked():
            lines.insert(0, "<b>The guard is off: nothing acts when a GPU gets hot.</b>")
        self.meaning.setText("<br>".join(lines))

    def on_guard_acted(self, event: GPUGuardAction) -> None:
        if self.status is not None:
            self.refresh()  # levels and the action list, as the daemon keeps them
        else:
            self._add_action(event)

    def _add_action(self, event: GPUGuardAction) -> None:
        when = time.strftime("%H:%M:%S", time.localtime(event.ts_s))
        text = f"{when}  GPU {event.gpu_index} · {event.action}: {event.detail}"
        self.action_list.insertItem(0, text)
        if not event.ok:
            self.action_list.item(0).setForeground(QColor("#d62828"))

    # ----------------------------------------------------------------- widgets → daemon

    def changes(self) -> dict[str, object]:
        out: dict[str, object] = {"guard_enabled": self.enabled.isChecked()}
        out.update({key: spin.value() for key, spin in self.spins.items()})
        return out

    def on_edited(self, *_: object) -> None:
        if self._loading:
            return
        self.valid = False
        self.apply_button.setEnabled(False)
        self._show_meaning()
        self._timer.start()

    def validate(self) -> None:
        changes = self.changes()
        self.ctx.bridge.call(lambda c: c.set_guard(changes, dry_run=True), self._on_validated)

    def _on_validated(self, result: CallResult) -> None:
        self.valid = result.ok
        if result.ok:
            self.validation.ok("These thresholds are valid (checked by the daemon).")
        else:
            self.validation.error(result.error)
        self.apply_button.setEnabled(self.valid)

    def on_apply_clicked(self) -> None:
        changes = self.changes()

        def done(result: CallResult) -> None:
            if result.ok:
                self.result.ok("Guard thresholds saved (gpu.guard_* in config.toml).")
                self.ctx.bridge.call(self.ctx.bridge.link.load_settings)
            else:
                self.result.error(result.error)
            self.refresh()

        self.ctx.bridge.call(lambda c: c.set_guard(changes), done)
