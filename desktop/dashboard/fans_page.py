"""Fans & power: per GPU, the fan-curve editor, the power-limit slider and the thermal guard
(a tab each), with traylm-gpud's status on top. Without the helper everything stays readable
and every edit is still checked by the daemon (dry runs); Apply needs the helper, and the page
shows how to install it (the daemon's own hint)."""

from __future__ import annotations

import html

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from desktop.daemon.messages import CallResult
from desktop.dashboard.fan_curve_view import FanCurveView
from desktop.dashboard.guard_view import GuardView
from desktop.dashboard.page import Page, PageContext
from desktop.dashboard.power_view import PowerView
from engines.events import Event, GPUControlChanged, GPUPresets, GPUSampled


class FansPage(Page):
    def __init__(self, ctx: PageContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self._presets_loaded = False
        self._helper_available: bool | None = None
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        top = QHBoxLayout()
        self.gpu_label = QLabel("GPU")
        top.addWidget(self.gpu_label)
        self.gpu_picker = QComboBox()
        self.gpu_picker.setObjectName("fansGpu")
        self.gpu_picker.setMinimumWidth(360)
        self.gpu_picker.currentIndexChanged.connect(self.on_gpu_picked)
        top.addWidget(self.gpu_picker)
        self.sim_badge = QLabel("SIMULATED")
        self.sim_badge.setObjectName("simBadge")
        self.sim_badge.setToolTip("The simulator is the source: no real fan or limit changes.")
        top.addWidget(self.sim_badge)
        top.addStretch(1)
        layout.addLayout(top)
        self.helper = QLabel("")
        self.helper.setObjectName("helperHint")
        self.helper.setWordWrap(True)
        self.helper.setTextFormat(Qt.TextFormat.RichText)
        self.helper.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.helper)
        self.no_gpu = QLabel(
            "<b>No NVIDIA GPU on this computer.</b> Fan curves, power limits and the thermal "
            "guard act on NVIDIA GPUs; models here run on the CPU (Engines shows them). To "
            "try these pages, turn on the GPU simulator in Settings."
        )
        self.no_gpu.setObjectName("noGpuCard")
        self.no_gpu.setWordWrap(True)
        self.no_gpu.setProperty("role", "card")
        self.no_gpu.setContentsMargins(12, 12, 12, 12)
        self.no_gpu.setVisible(False)
        layout.addWidget(self.no_gpu, 1, Qt.AlignmentFlag.AlignTop)  # at the top, not centred
        # one tab each, so that every part fits a 1366×768 screen without scrolling
        self.tabs = QTabWidget()
        self.tabs.setObjectName("fansTabs")
        self.fans = FanCurveView(ctx)
        self.power = PowerView(ctx)
        self.guard = GuardView(ctx)
        for view, title in (
            (self.fans, "Fan curve"),
            (self.power, "Power limit"),
            (self.guard, "Thermal guard"),
        ):
            self.tabs.addTab(_top_aligned(view), title)
        layout.addWidget(self.tabs, 1)
        gpu = ctx.state.gpu
        gpu.overview_changed.connect(self.on_overview_changed)
        gpu.sampled.connect(self.on_gpu_sampled)
        ctx.state.event_received.connect(self.on_event_received)
        self.on_overview_changed()

    # ----------------------------------------------------------------- state → widgets

    def current_uuid(self) -> str:
        return str(self.gpu_picker.currentData() or "")

    def on_overview_changed(self) -> None:
        gpu = self.ctx.state.gpu
        uuids = [i.uuid for i in gpu.infos()]
        listed = [self.gpu_picker.itemData(i) for i in range(self.gpu_picker.count())]
        if uuids != listed:
            current = self.current_uuid()
            self.gpu_picker.blockSignals(True)
            self.gpu_picker.clear()
            for info in gpu.infos():
                self.gpu_picker.addItem(f"GPU {info.index} · {info.name}", info.uuid)
            if current in uuids:
                self.gpu_picker.setCurrentIndex(uuids.index(current))
            self.gpu_picker.blockSignals(False)
            self.on_gpu_picked()
        self.sim_badge.setVisible(gpu.simulated)
        # no GPU at all: nothing to edit, so no editor, and no helper to install for it
        none = gpu.overview is not None and not gpu.available
        self.no_gpu.setVisible(none)
        for widget in (self.tabs, self.helper, self.gpu_picker, self.gpu_label):
            widget.setVisible(not none)
        self._show_helper()
        for view in (self.fans, self.power, self.guard):
            view.setEnabled(gpu.available)

    def _show_helper(self) -> None:
        ov = self.ctx.state.gpu.overview
        if ov is None:
            self.helper.setText(html.escape(self.ctx.state.gpu.error or "no GPU data yet"))
            return
        h = ov.helper
        if h.available:
            text = f"<b>traylm-gpud is running</b> ({html.escape(h.detail)}"
            text += f", version {html.escape(h.version)})" if h.version else ")"
            text += ": fan curves and power limits can be applied."
            for warning in h.warnings:
                text += f"<br><span style='color:#b7791f'>{html.escape(warning)}</span>"
        else:
            # the detail may carry the install hint already: said once
            hint = "" if h.install_hint in h.detail else f"<br>{html.escape(h.install_hint)}"
            text = (
                "<b>Read-only: traylm-gpud is not running.</b> "
                f"{html.escape(h.detail)}{hint}"
                "<br>Curves and limits are still checked below; Apply needs the helper."
            )
        self.helper.setText(text)
        if h.available != self._helper_available:  # the helper came or went
            self._helper_available = h.available
            self.power.set_helper_available(h.available)
            self.fans.refresh_status()

    def on_gpu_picked(self, *_: object) -> None:
        info = self.ctx.state.gpu.info(self.current_uuid())
        self.fans.set_gpu(info)
        self.power.set_gpu(info)

    def on_gpu_sampled(self, sample: GPUSampled) -> None:
        if not self.isVisible():
            return
        snap = next((s for s in sample.gpus if s.uuid == self.current_uuid()), None)
        if snap is not None:
            self.power.on_enforced_seen(snap.power_limit_mw)

    def on_event_received(self, event: Event) -> None:
        if isinstance(event, GPUControlChanged) and event.uuid == self.current_uuid():
            self.fans.refresh_status()
            self.power.refresh(move_slider=False)

    # ----------------------------------------------------------------- showing

    def page_shown(self) -> None:
        if not self._presets_loaded:
            self.ctx.bridge.call(lambda c: c.gpu_presets(), self._on_presets)
        self.on_gpu_picked()
        self.guard.refresh()

    def _on_presets(self, result: CallResult) -> None:
        if not result.ok or not isinstance(result.value, GPUPresets):
            return
        self._presets_loaded = True
        self.fans.set_presets(dict(result.value.fans))
        self.power.set_presets(dict(result.value.power))


def _top_aligned(view: QGroupBox) -> QWidget:
    view.setTitle("")  # the tab says what it is
    view.setFlat(True)
    holder = QWidget()
    column = QVBoxLayout(holder)
    column.setContentsMargins(0, 0, 0, 0)
    column.addWidget(view)
    column.addStretch(1)
    return holder
