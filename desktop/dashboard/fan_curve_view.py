"""The fan-curve part of the Fans & power page: the curve editor, presets, which fans, and the
daemon's verdict on every edit (``PUT /api/gpus/{gpu}/fans?dry_run=1``), then Apply through
traylm-gpud and what each fan does now."""

from __future__ import annotations

import dataclasses
import html

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from desktop.daemon.messages import CallResult
from desktop.dashboard.page import PageContext
from desktop.widgets.curve_editor import CurveEditor
from desktop.widgets.result_label import ResultLabel
from engines.events import (
    FanCurve,
    FanCurveResult,
    FanReading,
    GPUFanStatus,
    GPUInfo,
    GPUSampled,
    GPUSnapshot,
)

VALIDATE_AFTER_MS = 250
CUSTOM = "custom"  # the preset box while the curve in the editor is no preset


class FanCurveView(QGroupBox):
    def __init__(self, ctx: PageContext, parent: QWidget | None = None) -> None:
        super().__init__("Fan curve", parent)
        self.ctx = ctx
        self.info: GPUInfo | None = None
        self.presets: dict[str, FanCurve] = {}
        self.curve_name = "custom"
        self.valid = False
        self.status: GPUFanStatus | None = None
        self._loading = False
        self._loaded_from_helper: set[str] = set()
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(VALIDATE_AFTER_MS)
        self._timer.timeout.connect(self.validate)
        layout = QHBoxLayout(self)
        self.editor = CurveEditor()
        self.editor.setObjectName("curveEditor")
        self.editor.curve_edited.connect(self.on_curve_edited)
        layout.addWidget(self.editor, 3)
        layout.addLayout(self._side(), 2)
        ctx.state.gpu.sampled.connect(self.on_gpu_sampled)

    def _side(self) -> QVBoxLayout:
        side = QVBoxLayout()
        form = QFormLayout()
        presets = QHBoxLayout()
        self.preset_picker = QComboBox()
        self.preset_picker.setObjectName("fanPreset")
        presets.addWidget(self.preset_picker, 1)
        load = QPushButton("Load")
        load.setObjectName("loadFanPreset")
        load.clicked.connect(self.on_load_preset_clicked)
        presets.addWidget(load)
        form.addRow("Preset", presets)
        self.fans_row = QHBoxLayout()
        self.fans_row.addStretch(1)
        self.fan_boxes: list[QCheckBox] = []
        form.addRow("Fans", self.fans_row)
        self.hysteresis = self._spin(
            0,
            15,
            " °C",
            "Hysteresis: on the way down the duty holds until the GPU is this much cooler",
        )
        form.addRow("Hysteresis", self.hysteresis)
        self.min_step = self._spin(
            0, 20, " %", "Changes smaller than this are skipped (no hunting)"
        )
        form.addRow("Minimum step", self.min_step)
        self.spin_down = self._spin(0, 300, " s", "Wait this long before lowering the fans")
        form.addRow("Spin-down delay", self.spin_down)
        self.persist = QCheckBox("Keep after a reboot")
        self.persist.setToolTip("traylm-gpud applies the curve again when it starts")
        self.persist.setObjectName("fanPersist")
        self.persist.setChecked(True)
        form.addRow("", self.persist)
        side.addLayout(form)
        self.validation = ResultLabel("curveValidation")
        side.addWidget(self.validation)
        buttons = QHBoxLayout()
        self.apply_button = QPushButton("Apply curve")
        self.apply_button.setObjectName("applyCurve")
        self.apply_button.clicked.connect(self.on_apply_clicked)
        self.auto_button = QPushButton("Fans back to automatic")
        self.auto_button.setObjectName("fansAuto")
        self.auto_button.clicked.connect(self.on_auto_clicked)
        buttons.addWidget(self.apply_button)
        buttons.addWidget(self.auto_button)
        buttons.addStretch(1)
        side.addLayout(buttons)
        self.result = ResultLabel("curveResult")
        side.addWidget(self.result)
        self.fan_state = QLabel("")
        self.fan_state.setObjectName("fanState")
        self.fan_state.setWordWrap(True)
        side.addWidget(self.fan_state)
        side.addStretch(1)
        return side

    def _spin(self, lo: float, hi: float, suffix: str, tip: str) -> QDoubleSpinBox:
        spin = QDoubleSpinBox(minimum=lo, maximum=hi, decimals=0, suffix=suffix)
        spin.setToolTip(tip)
        spin.setMaximumWidth(120)
        spin.valueChanged.connect(self.on_curve_edited)
        return spin

    # ----------------------------------------------------------------- inputs

    def set_presets(self, presets: dict[str, FanCurve]) -> None:
        self.presets = presets
        self.preset_picker.clear()
        self.preset_picker.addItems(sorted(presets))

    def set_gpu(self, info: GPUInfo | None) -> None:
        self.info = info
        for box in self.fan_boxes:
            self.fans_row.removeWidget(box)
            box.deleteLater()
        self.fan_boxes = []
        count = info.fan_count if info is not None else 0
        for i in range(count):
            box = QCheckBox(f"fan {i}")
            box.setObjectName(f"fan{i}")
            box.setChecked(True)
            box.toggled.connect(self.on_curve_edited)
            self.fans_row.insertWidget(i, box)
            self.fan_boxes.append(box)
        self.editor.floor_pct = float(info.fan_min_pct) if info and info.fan_min_pct else None
        snap = self.ctx.state.gpu.latest.get(info.uuid) if info is not None else None
        self._show_live(snap)
        self.refresh_status()
        self._timer.start()

    def load_curve(self, curve: FanCurve) -> None:
        self._loading = True
        try:
            self.editor.set_points(curve.points)
            self.hysteresis.setValue(curve.hysteresis_c)
            self.min_step.setValue(curve.min_step_pct)
            self.spin_down.setValue(curve.spin_down_delay_s)
        finally:
            self._loading = False
        self.curve_name = curve.name or "custom"
        self._show_preset(self.curve_name)
        self._timer.start()

    def _show_preset(self, name: str) -> None:
        """The preset box names the curve in the editor: a preset's name, or "custom" once it
        was edited (never the name of a preset the curve no longer is)."""
        custom = self.preset_picker.findText(CUSTOM)
        if name in self.presets:
            if custom >= 0:
                self.preset_picker.removeItem(custom)
            self.preset_picker.setCurrentText(name)
            return
        if custom < 0:
            self.preset_picker.insertItem(0, CUSTOM)
        self.preset_picker.setCurrentIndex(self.preset_picker.findText(CUSTOM))

    def curve(self) -> FanCurve:
        return FanCurve(
            points=self.editor.curve_points(),
            hysteresis_c=self.hysteresis.value(),
            min_step_pct=self.min_step.value(),
            spin_down_delay_s=self.spin_down.value(),
            name=self.curve_name,
        )

    def fans(self) -> list[int]:
        return [i for i, box in enumerate(self.fan_boxes) if box.isChecked()]

    def on_load_preset_clicked(self) -> None:
        name = self.preset_picker.currentText()
        if name in self.presets:
            self.load_curve(dataclasses.replace(self.presets[name], name=name))

    def on_curve_edited(self, *_: object) -> None:
        if self._loading:
            return
        self.curve_name = "custom"
        self._show_preset(self.curve_name)
        self.valid = False
        self.apply_button.setEnabled(False)
        self._timer.start()

    # ----------------------------------------------------------------- daemon

    def validate(self) -> None:
        if self.info is None:
            return
        uuid, curve, fans = self.info.uuid, self.curve(), self.fans()
        self.ctx.bridge.call(
            lambda c: c.set_fan_curve(uuid, curve=curve, fans=fans, dry_run=True),
            self._on_validated,
        )

    def _on_validated(self, result: CallResult) -> None:
        if not result.ok or not isinstance(result.value, FanCurveResult):
            self.valid = False
            self.validation.error(result.error)
        else:
            self.valid = True
            warnings = result.value.warnings
            if warnings:
                self.validation.warning("Valid, but: " + "; ".join(warnings))
            else:
                self.validation.ok("Valid curve (checked by the daemon).")
        self._update_buttons()

    def _update_buttons(self) -> None:
        helper = self.status.helper_available if self.status is not None else False
        self.apply_button.setEnabled(self.valid and helper)
        self.auto_button.setEnabled(helper)
        tip = "" if helper else "needs traylm-gpud (see above)"
        self.apply_button.setToolTip(tip)
        self.auto_button.setToolTip(tip)

    def on_apply_clicked(self) -> None:
        if self.info is None or not self.valid:
            return
        uuid, curve, fans = self.info.uuid, self.curve(), self.fans()
        persist = self.persist.isChecked()
        self.result.neutral("Applying…")
        self.ctx.bridge.call(
            lambda c: c.set_fan_curve(uuid, curve=curve, fans=fans, persist=persist),
            self._on_applied,
        )

    def _on_applied(self, result: CallResult) -> None:
        if result.ok and isinstance(result.value, FanCurveResult) and result.value.applied:
            r = result.value
            fans = ", ".join(map(str, r.fans))
            kept = "kept after a reboot" if r.persist else "until the daemon stops"
            self.result.ok(f"Applied the {r.curve.name or 'custom'} curve to fans {fans} ({kept}).")
        else:
            self.result.error(result.error or "the daemon did not apply the curve")
        self.refresh_status()

    def on_auto_clicked(self) -> None:
        if self.info is None:
            return
        uuid = self.info.uuid

        def done(result: CallResult) -> None:
            if result.ok:
                self.result.ok("Fans handed back to the firmware (automatic).")
            else:
                self.result.error(result.error)
            self.refresh_status()

        self.ctx.bridge.call(lambda c: c.restore_fans(uuid), done)

    def refresh_status(self) -> None:
        if self.info is None:
            return
        uuid = self.info.uuid
        self.ctx.bridge.call(lambda c: c.fans(uuid), self._on_status)

    def _on_status(self, result: CallResult) -> None:
        if not result.ok or not isinstance(result.value, GPUFanStatus):
            self.fan_state.setText(html.escape(result.error))
            return
        self.status = status = result.value
        self._show_fan_state(status.readings)
        active = next((c for c in status.controls if c.curve is not None), None)
        if active is not None and active.curve and status.uuid not in self._loaded_from_helper:
            self._loaded_from_helper.add(status.uuid)
            self.load_curve(active.curve)  # show what runs now
        self._update_buttons()

    def _show_fan_state(self, readings: tuple[FanReading, ...]) -> None:
        """Each fan's speed now and who sets it (the controls as last read from the daemon)."""
        controls = self.status.controls if self.status is not None else ()
        lines = []
        for reading in readings:
            control = next((c for c in controls if c.fan == reading.index), None)
            mode = {"curve": "curve", "foreign": "ANOTHER PROGRAM's manual setting"}.get(
                control.mode if control else "", "automatic (firmware)"
            )
            if control is not None and control.mode == "curve" and control.curve is not None:
                mode = f"curve '{control.curve.name or 'custom'}' by traylm-gpud"
            lines.append(f"fan {reading.index}: {reading.speed_pct} % now, {mode}")
        text = "<br>".join(lines) or "no fan readings"
        if text != self.fan_state.text():
            self.fan_state.setText(text)

    def on_gpu_sampled(self, sample: GPUSampled) -> None:
        if self.info is None or not self.isVisible():
            return
        snap = next((s for s in sample.gpus if s.uuid == self.info.uuid), None)
        if snap is None or snap.temperature_c is None:
            return
        if self.status is not None and self.status.uuid == snap.uuid:
            self._show_fan_state(snap.fans)
        self._show_live(snap)

    def _show_live(self, snap: GPUSnapshot | None) -> None:
        """The marker of where the GPU is now: its temperature and mean fan duty."""
        if snap is None or snap.temperature_c is None:
            self.editor.set_live(None, None)
            return
        speeds = [f.speed_pct for f in snap.fans if f.speed_pct is not None]
        duty = sum(speeds) / len(speeds) if speeds else None
        self.editor.set_live(float(snap.temperature_c), duty)
