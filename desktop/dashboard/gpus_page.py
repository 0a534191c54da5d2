"""The GPUs page: where the numbers come from (SIMULATED in large letters when the simulator is the
source), the power supply's headroom, whether the gateway is paused, and a card per GPU with
live charts (desktop/dashboard/gpu_card.py).

Samples arrive as ``gpu.sample`` events (one a second, all GPUs in each) through AppState; the
page opens with the last two minutes from ``GET /api/gpus/history``.
"""

from __future__ import annotations

import html

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QScrollArea, QVBoxLayout, QWidget

from desktop.dashboard.gpu_card import HISTORY_POINTS, GPUCard
from desktop.dashboard.page import Page, PageContext
from desktop.messages import CallResult
from engines.events import GPUHistory, GPUInfo, GPUSampled, GPUState, GuardLevel


class GPUsPage(Page):
    def __init__(self, ctx: PageContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self.cards: dict[str, GPUCard] = {}
        self._history_loaded = False  # asked for
        self.history_shown = False  # in the charts
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        self.source = QLabel("")
        self.source.setObjectName("gpuSource")
        self.source.setWordWrap(True)
        self.source.setTextFormat(Qt.TextFormat.RichText)
        layout.addWidget(self.source)
        self.summary = QLabel("")
        self.summary.setObjectName("gpuSummary")
        self.summary.setWordWrap(True)
        self.summary.setTextFormat(Qt.TextFormat.RichText)
        layout.addWidget(self.summary)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        inner = QWidget()
        self.column = QVBoxLayout(inner)
        self.column.setContentsMargins(0, 0, 0, 0)
        self.column.addStretch(1)
        scroll.setWidget(inner)
        layout.addWidget(scroll, 1)
        gpu = ctx.state.gpu
        gpu.overview_changed.connect(self.on_overview_changed)
        gpu.sampled.connect(self.on_gpu_sampled)
        gpu.guard_acted.connect(lambda _e: self.on_overview_changed())
        self.on_overview_changed()

    # ----------------------------------------------------------------- state → widgets

    def on_overview_changed(self) -> None:
        gpu = self.ctx.state.gpu
        ov = gpu.overview
        if ov is None:
            self._set_source("unknown", html.escape(gpu.error or "no GPU data yet"))
            self._rebuild([])
            self.summary.setText("")
            return
        if ov.simulated:
            what = "a replayed trace" if ov.backend == "replay" else "traylm's GPU simulator"
            self._set_source(
                "simulated",
                f"<b>SIMULATED</b> — these GPUs and every number below come from {what} "
                "(<code>traylm serve --simulate-gpus N</code>), not from hardware.",
            )
        elif ov.state != GPUState.OK:
            self._set_source("unknown", f"<b>No GPU telemetry:</b> {html.escape(ov.message)}")
        else:
            self._set_source("live", f"Live readings through {html.escape(ov.backend.upper())}.")
        self._rebuild(gpu.infos())
        self.summary.setText(self._summary_html())
        for uuid in gpu.latest:
            card = self.cards.get(uuid)
            if card is not None:
                self._show_facts(card, uuid)

    def _set_source(self, kind: str, text: str) -> None:
        self.source.setText(text)
        if self.source.property("kind") != kind:
            self.source.setProperty("kind", kind)
            self.source.style().unpolish(self.source)
            self.source.style().polish(self.source)

    def _summary_html(self) -> str:
        ov = self.ctx.state.gpu.overview
        assert ov is not None
        lines = []
        if ov.psu is not None:
            psu = ov.psu
            text = (
                f"Power supply {psu.psu_watts:.0f} W: GPUs draw {psu.gpu_power_w:.0f} W + "
                f"{psu.other_watts:.0f} W for the rest = {psu.load_fraction * 100:.0f} % load; "
                f"at their power limits the GPUs could draw {psu.limits_w:.0f} W."
            )
            if psu.warning:
                text += f" <b style='color:#d62828'>{html.escape(psu.warning)}</b>"
            lines.append(text)
        if ov.paused:
            lines.append(
                f"<b style='color:#d62828'>The gateway is paused:</b> {html.escape(ov.paused)}"
            )
        helper = ov.helper
        if helper.available:
            lines.append(f"Fan and power control: traylm-gpud ({html.escape(helper.detail)}).")
        else:
            lines.append(
                "Fan and power control: off (traylm-gpud not running); see Fans &amp; power."
            )
        energy = "" if ov.energy else " Energy per token appears once an engine on them generates."
        span_s = HISTORY_POINTS * ov.sample_interval_s
        span = f"{span_s / 60:g} minutes" if span_s >= 120 else f"{span_s:.0f} seconds"
        lines.append(f"Charts: the last {span}, one point per sample.{energy}")
        return "<br>".join(lines)

    def _rebuild(self, infos: list[GPUInfo]) -> None:
        if [i.uuid for i in infos] == list(self.cards):
            return
        for card in self.cards.values():
            self.column.removeWidget(card)
            card.deleteLater()
        self.cards = {}
        for info in infos:
            card = GPUCard(info)
            self.cards[info.uuid] = card
            self.column.insertWidget(self.column.count() - 1, card)
        self._history_loaded = False
        if self.isVisible():
            self._load_history()

    def on_gpu_sampled(self, sample: GPUSampled) -> None:
        visible = self.isVisible()
        for snap in sample.gpus:
            card = self.cards.get(snap.uuid)
            if card is None:
                continue
            if visible:
                self._show(card, snap.uuid)
            elif snap.state == GPUState.OK:
                card.append(snap)  # the words catch up when the page is shown again

    def _show(self, card: GPUCard, uuid: str, *, charts: bool = True) -> None:
        gpu = self.ctx.state.gpu
        snap = gpu.latest.get(uuid)
        if snap is not None:
            level = gpu.guard_levels.get(uuid, GuardLevel.NORMAL)
            helper = gpu.overview.helper if gpu.overview is not None else None
            controls = tuple(c for c in helper.fans if c.uuid == uuid) if helper else ()
            card.show_snapshot(snap, level, gpu.energy_for(uuid), controls, charts=charts)

    def _show_facts(self, card: GPUCard, uuid: str) -> None:
        self._show(card, uuid, charts=False)

    # ----------------------------------------------------------------- history

    def page_shown(self) -> None:
        if not self._history_loaded and self.cards:
            self._load_history()
        for uuid, card in self.cards.items():
            self._show_facts(card, uuid)

    def _load_history(self) -> None:
        self._history_loaded = True
        ov = self.ctx.state.gpu.overview
        seconds = HISTORY_POINTS * (ov.sample_interval_s if ov is not None else 1.0)
        self.ctx.bridge.call(
            lambda c: c.gpu_history(seconds=seconds, points=HISTORY_POINTS), self._on_history
        )

    def _on_history(self, result: CallResult) -> None:
        if not result.ok or not isinstance(result.value, tuple):
            return
        for h in result.value:
            if isinstance(h, GPUHistory) and h.uuid in self.cards:
                self.cards[h.uuid].show_history(h)
        self.history_shown = True
