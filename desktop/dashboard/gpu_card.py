"""One GPU on the GPUs page: what it reads now (in words) and live charts of the last two minutes.

Charts: temperature against the card's slowdown temperature; power draw against the enforced
limit (dashed); fans, utilization and VRAM in %; SM and memory clocks. Each redraws only while
visible (LiveChart), so a hidden page costs a few label updates a second.
"""

from __future__ import annotations

import html

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QGridLayout, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from desktop.widgets.chart import LiveChart
from engines.events import (
    EngineEnergy,
    FanControl,
    GPUHistory,
    GPUInfo,
    GPUSnapshot,
    GPUState,
    GuardLevel,
)

GIB = 1024**3
HISTORY_POINTS = 120  # two minutes at the default 1 s sampling
REASON_WORDS = {
    "idle": ("idle: nothing to run, clocks are low", "ok"),
    "power cap": ("held at the power limit (expected while a limit is set; not an alarm)", "ok"),
    "applications clocks setting": ("clocks fixed by an application-clocks setting", "ok"),
    "sync boost": ("clocks synchronised with another GPU (sync boost)", "ok"),
    "display clock setting": ("clocks held by the display", "ok"),
    "software thermal slowdown": (
        "THERMAL SLOWDOWN: the driver cuts clocks, the GPU is too hot",
        "bad",
    ),
    "hardware thermal slowdown": ("HARDWARE THERMAL SLOWDOWN: the GPU is far too hot", "bad"),
    "hardware slowdown": (
        "hardware slowdown (overheating or a power-supply signal): check cooling and the PSU",
        "bad",
    ),
    "power brake": ("power brake asserted by the board or the PSU: check the power cables", "bad"),
}
GUARD_WORDS = {
    GuardLevel.NOTICE: "guard: warned",
    GuardLevel.POWER: "guard: power lowered",
    GuardLevel.PAUSE: "guard: requests paused",
    GuardLevel.STOP: "guard: engines stopped",
}


def reasons_html(reasons: tuple[str, ...]) -> str:
    """Clock-event reasons in words; thermal and hardware ones in red."""
    if not reasons:
        return "none: clocks run free"
    parts = []
    for reason in reasons:
        words, kind = REASON_WORDS.get(reason, (reason, "ok"))
        text = html.escape(words)
        parts.append(f"<b style='color:#d62828'>{text}</b>" if kind == "bad" else text)
    return "; ".join(parts)


class GPUCard(QFrame):
    def __init__(self, info: GPUInfo, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.info = info
        self.setObjectName("gpuCard")
        self.setProperty("guard", "normal")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 10, 12, 10)
        layout.addLayout(self._header())
        self.facts: dict[str, QLabel] = {}
        grid = QGridLayout()
        grid.setHorizontalSpacing(18)
        grid.setVerticalSpacing(3)
        names = (
            "Temperature",
            "Power",
            "Fans",
            "Load",
            "VRAM",
            "Clocks",
            "PCIe link",
            "Clock events",
            "Energy",
        )
        for i, name in enumerate(names):
            row, col = (i, 0) if i < 5 else (i - 5, 2)
            key = QLabel(name)
            key.setObjectName("factKey")
            value = QLabel("–")
            value.setObjectName(f"fact-{name.lower().replace(' ', '-')}")
            value.setTextFormat(Qt.TextFormat.RichText)
            value.setWordWrap(True)
            grid.addWidget(key, row, col, Qt.AlignmentFlag.AlignTop)
            grid.addWidget(value, row, col + 1, Qt.AlignmentFlag.AlignTop)
            self.facts[name] = value
        grid.setColumnStretch(1, 1)
        grid.setColumnStretch(3, 2)
        layout.addLayout(grid)
        layout.addLayout(self._charts())

    def _header(self) -> QHBoxLayout:
        row = QHBoxLayout()
        title = QLabel(f"<b>GPU {self.info.index}</b> · {html.escape(self.info.name)}")
        title.setObjectName("gpuTitle")
        row.addWidget(title)
        self.sim_badge = QLabel("SIMULATED")
        self.sim_badge.setObjectName("simBadge")
        self.sim_badge.setToolTip(
            "These numbers come from traylm's GPU simulator (the daemon was started with "
            "simulated GPUs), not from hardware."
        )
        self.sim_badge.setVisible(self.info.simulated)
        row.addWidget(self.sim_badge)
        self.guard_badge = QLabel("")
        self.guard_badge.setObjectName("guardBadge")
        self.guard_badge.setVisible(False)
        row.addWidget(self.guard_badge)
        row.addStretch(1)
        ids = QLabel(f"{self.info.pci_bus_id}  ·  driver {html.escape(self.info.driver_version)}")
        ids.setObjectName("gpuIds")
        ids.setToolTip(self.info.uuid)
        row.addWidget(ids)
        return row

    def _charts(self) -> QGridLayout:
        info = self.info
        grid = QGridLayout()
        self.temp_chart = LiveChart("Temperature", "°C", capacity=HISTORY_POINTS, fixed_max=100)
        self.temp_chart.add_series("GPU", "#d9480f")
        if info.slowdown_temperature_c:
            self.temp_chart.add_series("slowdown", "#868e96", dashed=True)
        max_w = (info.power_max_mw or info.power_default_mw or 100_000) / 1000
        self.power_chart = LiveChart("Power", "W", capacity=HISTORY_POINTS, minimum_max=max_w)
        self.power_chart.add_series("draw", "#1971c2")
        self.power_chart.add_series("limit", "#e03131", dashed=True)
        self.pct_chart = LiveChart(
            "Fans · load · VRAM", "%", capacity=HISTORY_POINTS, fixed_max=100
        )
        self.pct_chart.add_series("fan", "#0c8599")
        self.pct_chart.add_series("util", "#2f9e44")
        self.pct_chart.add_series("VRAM", "#9c36b5")
        self.clock_chart = LiveChart("Clocks", "MHz", capacity=HISTORY_POINTS, minimum_max=3000)
        self.clock_chart.add_series("SM", "#e67700")
        self.clock_chart.add_series("memory", "#5f3dc4")
        for i, chart in enumerate(
            (self.temp_chart, self.power_chart, self.pct_chart, self.clock_chart)
        ):
            chart.setObjectName(f"gpu{info.index}-chart{i}")
            chart.setMinimumHeight(130)
            grid.addWidget(chart, i // 2, i % 2)
        return grid

    # ----------------------------------------------------------------- data → widgets

    def show_snapshot(
        self,
        snap: GPUSnapshot,
        level: GuardLevel,
        energy: list[EngineEnergy],
        controls: tuple[FanControl, ...] = (),
        *,
        charts: bool = True,
    ) -> None:
        """``controls``: what traylm-gpud does with this GPU's fans (curve, or another
        program's manual setting); ``charts=False`` rewrites the words only (the same sample
        must not reach the charts twice)."""
        self._show_guard(level)
        f = self.facts
        if snap.state != GPUState.OK:
            text = (
                "<b style='color:#d62828'>LOST: the GPU fell off the bus; reboot to get it back. "
                "traylm no longer controls it.</b>"
                if snap.state == GPUState.LOST
                else "unavailable"
            )
            f["Temperature"].setText(text)
            return
        f["Temperature"].setText(self._temperature(snap))
        f["Power"].setText(self._power(snap))
        f["Fans"].setText(_fans(snap, controls))
        f["Load"].setText(
            f"GPU {_pct(snap.utilization_gpu_pct)} · memory bus {_pct(snap.utilization_memory_pct)}"
        )
        f["VRAM"].setText(_vram(snap))
        f["Clocks"].setText(
            f"SM {_num(snap.sm_clock_mhz, 'MHz')} · memory {_num(snap.memory_clock_mhz, 'MHz')}"
        )
        f["PCIe link"].setText(self._pcie(snap))
        f["Clock events"].setText(reasons_html(snap.clock_event_reasons))
        f["Energy"].setText(energy_html(energy))
        if charts:
            self.append(snap)

    def _show_guard(self, level: GuardLevel) -> None:
        words = GUARD_WORDS.get(level, "")
        self.guard_badge.setText(words)
        self.guard_badge.setVisible(bool(words))
        state = "hot" if level > GuardLevel.NORMAL else "normal"
        if self.property("guard") != state:
            self.setProperty("guard", state)
            self.style().unpolish(self)
            self.style().polish(self)

    def _temperature(self, snap: GPUSnapshot) -> str:
        if snap.temperature_c is None:
            return "N/A on this card"
        text = f"<b>{snap.temperature_c} °C</b>"
        if snap.temperature_margin_c is not None:
            text += f" · {snap.temperature_margin_c} °C below slowdown"
        elif self.info.slowdown_temperature_c:
            text += f" · slows down at {self.info.slowdown_temperature_c} °C"
        return text

    def _power(self, snap: GPUSnapshot) -> str:
        text = f"<b>{_w(snap.power_draw_mw)}</b> of a {_w(snap.power_limit_mw)} limit"
        default = self.info.power_default_mw
        if default and snap.power_limit_mw and snap.power_limit_mw != default:
            text += f" (default {_w(default)})"
        return text

    def _pcie(self, snap: GPUSnapshot) -> str:
        gen, width = snap.pcie_generation, snap.pcie_width
        if gen is None and width is None:
            return "N/A"
        text = f"Gen {gen or '?'} ×{width or '?'}"
        gmax, wmax = self.info.pcie_generation_max, self.info.pcie_width_max
        if gmax and wmax:
            text += f" (card max Gen {gmax} ×{wmax}"
            text += ", lower while idle: power saving)" if (gen or 0) < gmax else ")"
        if snap.pcie_rx_kbps is not None and snap.pcie_tx_kbps is not None:
            text += (
                f" · rx {snap.pcie_rx_kbps / 1e6:.2f} GB/s, tx {snap.pcie_tx_kbps / 1e6:.2f} GB/s"
            )
        return text

    def append(self, snap: GPUSnapshot) -> None:
        """Only the charts (a hidden page keeps its history without rewriting labels)."""
        if snap.temperature_c is not None:
            self.temp_chart.append("GPU", float(snap.temperature_c))
            if "slowdown" in self.temp_chart.series:
                self.temp_chart.append("slowdown", float(self.info.slowdown_temperature_c or 0))
        if snap.power_draw_mw is not None:
            self.power_chart.append("draw", snap.power_draw_mw / 1000)
        if snap.power_limit_mw is not None:
            self.power_chart.append("limit", snap.power_limit_mw / 1000)
        fan = _fan_pct(snap)
        if fan is not None:
            self.pct_chart.append("fan", fan)
        if snap.utilization_gpu_pct is not None:
            self.pct_chart.append("util", float(snap.utilization_gpu_pct))
        vram = _vram_pct(snap)
        if vram is not None:
            self.pct_chart.append("VRAM", vram)
        if snap.sm_clock_mhz is not None:
            self.clock_chart.append("SM", float(snap.sm_clock_mhz))
        if snap.memory_clock_mhz is not None:
            self.clock_chart.append("memory", float(snap.memory_clock_mhz))

    def show_history(self, h: GPUHistory) -> None:
        """Fill the charts with the daemon's recent history (when the page opens)."""
        total = h.memory_used_bytes and self.info.memory_total_bytes
        columns = (
            (self.temp_chart, "GPU", h.temperature_c, 1.0),
            (self.power_chart, "draw", h.power_draw_w, 1.0),
            (self.power_chart, "limit", h.power_limit_w, 1.0),
            (self.pct_chart, "fan", h.fan_speed_pct, 1.0),
            (self.pct_chart, "util", h.utilization_gpu_pct, 1.0),
            (self.pct_chart, "VRAM", h.memory_used_bytes, 100 / total if total else 0.0),
            (self.clock_chart, "SM", h.sm_clock_mhz, 1.0),
        )
        for chart, name, values, scale in columns:
            if scale:
                chart.set_values(name, [v * scale for v in values if v is not None])
        if "slowdown" in self.temp_chart.series:
            slowdown = float(self.info.slowdown_temperature_c or 0)
            self.temp_chart.set_values("slowdown", [slowdown] * len(self.temp_chart.series["GPU"]))


def energy_html(energy: list[EngineEnergy]) -> str:
    if not energy:
        return "no engine generating on this GPU"
    parts = []
    for e in energy:
        if e.joules_per_token is None:
            parts.append(f"{html.escape(e.engine_id)}: {e.power_w:.0f} W, no tokens in the window")
            continue
        cost = (
            f", {e.cost_per_mtok:.2f} {html.escape(e.currency)} per million tokens"
            if e.cost_per_mtok is not None
            else ""
        )
        gpus = f" on {len(e.gpus)} GPUs" if len(e.gpus) > 1 else ""
        parts.append(
            f"{html.escape(e.engine_id)}: <b>{e.joules_per_token:.2f} J/token</b>{cost} "
            f"({e.power_w:.0f} W{gpus} over {e.window_s:.0f} s)"
        )
    return "<br>".join(parts)


def _fans(snap: GPUSnapshot, controls: tuple[FanControl, ...]) -> str:
    if not snap.fans:
        return "N/A on this card"
    parts = []
    for fan in snap.fans:
        control = next((c for c in controls if c.fan == fan.index), None)
        mode = {True: "manual", False: "auto", None: "?"}[fan.manual]
        if control is not None and control.mode == "curve":
            mode = "traylm curve" if fan.manual else "curve; firmware below its first point"
        elif control is not None and control.mode == "foreign":
            mode = "<b style='color:#b7791f'>set by another program</b>"
        parts.append(f"fan {fan.index}: {_pct(fan.speed_pct)} ({mode})")
    return " · ".join(parts)


def _fan_pct(snap: GPUSnapshot) -> float | None:
    speeds = [f.speed_pct for f in snap.fans if f.speed_pct is not None]
    return sum(speeds) / len(speeds) if speeds else None


def _vram_pct(snap: GPUSnapshot) -> float | None:
    if snap.memory_used_bytes is None or not snap.memory_total_bytes:
        return None
    return 100 * snap.memory_used_bytes / snap.memory_total_bytes


def _vram(snap: GPUSnapshot) -> str:
    if snap.memory_used_bytes is None or not snap.memory_total_bytes:
        return "N/A"
    used, total = snap.memory_used_bytes / GIB, snap.memory_total_bytes / GIB
    return f"{used:.1f} of {total:.1f} GiB ({_vram_pct(snap):.0f} %)"


def _w(mw: int | None) -> str:
    return "? W" if mw is None else f"{mw / 1000:.0f} W"


def _pct(value: int | None) -> str:
    return "N/A" if value is None else f"{value} %"


def _num(value: int | None, unit: str) -> str:
    return "N/A" if value is None else f"{value} {unit}"
