"""The power-limit part of the Fans & power page: a slider within the card's own min/max, the
presets (efficient, balanced, stock), the daemon's verdict (dry run) and Apply / Reset through
traylm-gpud."""

from __future__ import annotations

import itertools

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (
    QCheckBox,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSlider,
    QVBoxLayout,
    QWidget,
)

from desktop.daemon.messages import CallResult
from desktop.dashboard.page import PageContext
from desktop.widgets.result_label import ResultLabel
from engines.events import GPUInfo, PowerLimitStatus, PowerPreset

STEP_W = 5
VALIDATE_AFTER_MS = 250


class PowerView(QGroupBox):
    def __init__(self, ctx: PageContext, parent: QWidget | None = None) -> None:
        super().__init__("Power limit", parent)
        self.ctx = ctx
        self.info: GPUInfo | None = None
        self.status: PowerLimitStatus | None = None
        self.helper_available = False
        self.valid = False
        self._loading = False
        self._reads = itertools.count(1)
        self._latest_read = 0
        """The newest status read asked for: an older one answering after it is stale (the
        bridge runs calls side by side, so a read from before an Apply can land last)."""
        self.chosen = False  # the user moved the slider since it last showed the card's limit
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(VALIDATE_AFTER_MS)
        self._timer.timeout.connect(self.validate)
        layout = QVBoxLayout(self)
        row = QHBoxLayout()
        self.min_label = QLabel("")
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setObjectName("powerSlider")
        self.slider.setSingleStep(STEP_W)
        self.slider.setPageStep(25)
        self.slider.valueChanged.connect(self.on_slider_changed)
        self.max_label = QLabel("")
        self.value_label = QLabel("")
        self.value_label.setObjectName("powerValue")
        self.value_label.setMinimumWidth(70)
        row.addWidget(self.min_label)
        row.addWidget(self.slider, 1)
        row.addWidget(self.max_label)
        row.addWidget(self.value_label)
        layout.addLayout(row)
        self.presets_row = QHBoxLayout()
        self.presets_row.addWidget(QLabel("Presets:"))
        self.preset_buttons: list[QPushButton] = []
        self.presets_row.addStretch(1)
        layout.addLayout(self.presets_row)
        self.facts = QLabel("")
        self.facts.setObjectName("powerFacts")
        self.facts.setWordWrap(True)
        layout.addWidget(self.facts)
        self.validation = ResultLabel("powerValidation")
        layout.addWidget(self.validation)
        buttons = QHBoxLayout()
        self.persist = QCheckBox("Keep after a reboot")
        self.persist.setObjectName("powerPersist")
        self.persist.setChecked(True)
        self.apply_button = QPushButton("Apply limit")
        self.apply_button.setObjectName("applyPower")
        self.apply_button.clicked.connect(self.on_apply_clicked)
        self.reset_button = QPushButton("Back to the default")
        self.reset_button.setObjectName("resetPower")
        self.reset_button.clicked.connect(self.on_reset_clicked)
        for w in (self.persist, self.apply_button, self.reset_button):
            buttons.addWidget(w)
        buttons.addStretch(1)
        layout.addLayout(buttons)
        self.result = ResultLabel("powerResult")
        layout.addWidget(self.result)

    # ----------------------------------------------------------------- inputs

    def set_presets(self, presets: dict[str, PowerPreset]) -> None:
        for b in self.preset_buttons:
            self.presets_row.removeWidget(b)
            b.deleteLater()
        self.preset_buttons = []
        for name, preset in sorted(presets.items(), key=lambda kv: kv[1].watts or 1e9):
            label = f"{name} ({preset.watts:.0f} W)" if preset.watts else f"{name} (default)"
            button = QPushButton(label)
            button.setObjectName(f"powerPreset-{name}")
            button.setToolTip(preset.description)
            button.clicked.connect(lambda _c=False, p=preset: self.on_preset_clicked(p))
            self.presets_row.insertWidget(self.presets_row.count() - 1, button)
            self.preset_buttons.append(button)

    def set_gpu(self, info: GPUInfo | None) -> None:
        self.info = info
        self.refresh()

    def set_helper_available(self, available: bool) -> None:
        self.helper_available = available
        self._update_buttons()

    def refresh(self, *, move_slider: bool = True) -> None:
        """Read the limit again; ``move_slider=False`` keeps what the user is choosing."""
        if self.info is None:
            return
        uuid = self.info.uuid
        read = self._latest_read = next(self._reads)
        self.ctx.bridge.call(
            lambda c: c.power_limit(uuid), lambda r: self._on_status(r, move_slider, read)
        )

    def on_enforced_seen(self, enforced_mw: int | None) -> None:
        """A sample shows the enforced limit: re-read the status when it changed. The slider
        follows it unless the user is choosing a value of their own."""
        if self.status is not None and enforced_mw != self.status.enforced_mw:
            self.refresh(move_slider=not self.chosen)

    def _on_status(self, result: CallResult, move_slider: bool, read: int) -> None:
        if read != self._latest_read:
            return  # a newer read is on its way
        if not result.ok or not isinstance(result.value, PowerLimitStatus):
            self.facts.setText(result.error)
            return
        s = self.status = result.value
        if s.min_mw is None or s.max_mw is None:
            self.slider.setEnabled(False)
            self.facts.setText("This card does not report its power-limit range: traylm leaves it.")
            return
        if move_slider:
            self._loading = True
            try:
                self.slider.setRange(s.min_mw // 1000, s.max_mw // 1000)
                now = s.enforced_mw or s.default_mw or s.max_mw
                self.slider.setValue(round(now / 1000))
            finally:
                self._loading = False
            self.valid = True
            self.chosen = False
        self.min_label.setText(f"{s.min_mw / 1000:.0f} W")
        self.max_label.setText(f"{s.max_mw / 1000:.0f} W")
        self.value_label.setText(f"<b>{self.slider.value()} W</b>")
        by = {
            "user": "set by you",
            "guard": "LOWERED BY THE THERMAL GUARD",
            "tune": "set by traylm tune while it measures; put back after",
            "": "not changed",
        }
        self.facts.setText(
            f"Enforced now: {_w(s.enforced_mw)} ({by.get(s.controlled_by, s.controlled_by)}) · "
            f"default {_w(s.default_mw)} · this card accepts {_w(s.min_mw)}–{_w(s.max_mw)}."
        )
        self._update_buttons()

    def on_slider_changed(self, watts: int) -> None:
        snapped = round(watts / STEP_W) * STEP_W
        if snapped != watts and self.slider.minimum() <= snapped <= self.slider.maximum():
            self.slider.setValue(snapped)
            return
        self.value_label.setText(f"<b>{watts} W</b>")
        if self._loading:
            return
        self.chosen = True
        self.valid = False
        self._update_buttons()
        self._timer.start()

    def on_preset_clicked(self, preset: PowerPreset) -> None:
        if self.status is None:
            return
        watts = preset.watts if preset.watts is not None else (self.status.default_mw or 0) / 1000
        self.slider.setValue(round(watts))
        self._timer.start()

    # ----------------------------------------------------------------- daemon

    def validate(self) -> None:
        if self.info is None:
            return
        uuid, watts = self.info.uuid, float(self.slider.value())
        self.ctx.bridge.call(
            lambda c: c.set_power_limit(uuid, watts=watts, dry_run=True), self._on_validated
        )

    def _on_validated(self, result: CallResult) -> None:
        self.valid = result.ok
        if result.ok:
            self.validation.ok(f"{self.slider.value()} W is within this card's limits.")
        else:
            self.validation.error(result.error)
        self._update_buttons()

    def _update_buttons(self) -> None:
        self.apply_button.setEnabled(self.valid and self.helper_available)
        self.reset_button.setEnabled(self.helper_available)

    def on_apply_clicked(self) -> None:
        if self.info is None:
            return
        uuid, watts, persist = self.info.uuid, float(self.slider.value()), self.persist.isChecked()

        def done(result: CallResult) -> None:
            applied = (
                result.ok and isinstance(result.value, PowerLimitStatus) and result.value.applied
            )
            if applied:
                self.result.ok(f"Power limit set to {watts:.0f} W.")
                # the slider stays at what was applied: the card may report it only with its
                # next sample, and the slider must not go back to the old limit meanwhile
                self.chosen = False
                self.refresh(move_slider=False)
            else:
                self.result.error(result.error or "the daemon did not apply the limit")
                self.refresh()

        self.result.neutral("Applying…")
        self.ctx.bridge.call(lambda c: c.set_power_limit(uuid, watts=watts, persist=persist), done)

    def on_reset_clicked(self) -> None:
        if self.info is None:
            return
        uuid = self.info.uuid

        def done(result: CallResult) -> None:
            if result.ok:
                self.result.ok("Power limit back to the card's default.")
            else:
                self.result.error(result.error)
            self.refresh()

        self.ctx.bridge.call(lambda c: c.reset_power_limit(uuid), done)


def _w(mw: int | None) -> str:
    return "?" if mw is None else f"{mw / 1000:.0f} W"
