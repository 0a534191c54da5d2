"""The GPUs page: where the numbers come from (SIMULATED in large letters when the simulator is the
source), the power supply's headroom, whether the gateway is paused, the efficiency profile
picker (desktop/dashboard/efficiency_view.py), and a card per GPU with live charts
(desktop/dashboard/gpu_card.py).

Samples arrive as ``gpu.sample`` events (one a second, all GPUs in each) through AppState; the
page opens with the last two minutes from ``GET /api/gpus/history``.
"""

from __future__ import annotations

import html
import re

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QLabel, QScrollArea, QVBoxLayout, QWidget

from desktop.daemon.boxes import Box, BoxReplica
from desktop.daemon.messages import CallResult
from desktop.dashboard.efficiency_view import EfficiencyView
from desktop.dashboard.gpu_card import HISTORY_POINTS, GPUCard
from desktop.dashboard.host_usage import HostUsage
from desktop.dashboard.page import Page, PageContext
from desktop.look.formatting import fmt_bytes
from engines.events import GPUHistory, GPUInfo, GPUSampled, GPUState, GuardLevel

RETRY_NOTE = re.compile(r" \(retrying in \d+ s\)$")


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
        self.host = QLabel("")  # CPU and RAM, the computer's and each engine's
        self.host.setObjectName("hostUsage")
        self.host.setWordWrap(True)
        self.host.setTextFormat(Qt.TextFormat.RichText)
        layout.addWidget(self.host)
        self._usage: HostUsage | None = None
        self._host_timer = QTimer(self)
        self._host_timer.setInterval(2000)
        self._host_timer.timeout.connect(self.on_host_tick)
        self.boxes = QLabel("")  # the paired boxes' GPUs: theirs, shown, not controlled here
        self.boxes.setObjectName("boxGPUs")
        self.boxes.setWordWrap(True)
        self.boxes.setTextFormat(Qt.TextFormat.RichText)
        self.boxes.setVisible(False)
        layout.addWidget(self.boxes)
        self.efficiency = EfficiencyView(ctx)  # shown while there are GPUs and profiles
        layout.addWidget(self.efficiency)
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
        ctx.state.status_changed.connect(self.on_boxes_changed)
        self.on_overview_changed()
        self.on_boxes_changed()

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
                "(the daemon was started with simulated GPUs), not from hardware.",
            )
        elif ov.state != GPUState.OK:
            # the daemon's "(retrying in 2 s)" was true once and then stood still on the page
            reason = RETRY_NOTE.sub("", ov.message)
            self._set_source(
                "unknown",
                f"<b>No GPU telemetry:</b> {html.escape(reason)}. This computer's CPU and RAM "
                "are below.",
            )
        else:
            self._set_source("live", f"Live readings through {html.escape(ov.backend.upper())}.")
        self._rebuild(gpu.infos())
        # no GPU: no power supply, fan control or charts to speak of (CPU and RAM are below)
        self.summary.setText(self._summary_html() if gpu.available else "")
        for uuid in gpu.latest:
            card = self.cards.get(uuid)
            if card is not None:
                self._show_facts(card, uuid)

    def on_boxes_changed(self) -> None:
        """Each paired box's GPUs under its name (nothing when none is paired)."""
        state = self.ctx.state
        self.boxes.setText(boxes_html(state.boxes, state.box_replicas))
        self.boxes.setVisible(bool(state.boxes))

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

    def on_host_tick(self) -> None:
        if self._usage is None:
            self._usage = HostUsage()
        self.host.setText(self._usage.text(self.ctx.state.live_engines()))

    def page_hidden(self) -> None:
        self._host_timer.stop()

    def page_shown(self) -> None:
        self.on_host_tick()
        self._host_timer.start()
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


def boxes_html(boxes: tuple[Box, ...], replicas: tuple[BoxReplica, ...]) -> str:
    """A section per paired box: its GPUs as it reports them (name, memory, the models it
    serves here on each), or why it is away."""
    parts = []
    for box in boxes:
        lines = [
            f"<h3>{html.escape(box.name)} <small>(paired box: its GPUs, read-only)</small></h3>"
        ]
        if box.problem:
            lines.append(f"<b style='color:#d62828'>away:</b> {html.escape(box.problem)}")
        on_box = [r for r in replicas if r.box == box.name]
        for g in box.gpus:
            memory = fmt_bytes(g.memory_total_bytes) if g.memory_total_bytes else "memory ?"
            serves = ", ".join(r.name for r in on_box if g.index in r.gpus)
            lines.append(
                f"GPU {g.index}: {html.escape(g.name)}, {memory}"
                + (f" — serves {html.escape(serves)}" if serves else "")
            )
        if not box.gpus and not box.problem:
            lines.append("no GPU (its models run on its CPU)")
        parts.append(lines[0] + "<br>".join(lines[1:]))  # a heading breaks its own line
    return "".join(parts)
