"""The results table of the Benchmarks page: one row per concurrency level of a run, or of two runs
side by side with the change from the first to the second. Latencies in milliseconds; the
definitions (vLLM's, as the daemon states them) sit above the table."""

from __future__ import annotations

import html

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QLabel,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from desktop.look.formatting import fmt_ms, fmt_when
from engines.events import BenchLevel, BenchRun, BenchState, LatencyStats

COLUMNS = (
    "Run",
    "Concurrency",
    "Done / failed",
    "Output tok/s",
    "Total tok/s",
    "TTFT p50 / p99",
    "TPOT p50 / p99",
    "ITL p50 / p99",
    "E2EL p50 / p99",
    "J/token",
    "Peak °C",
    "Mean W",
)


def header_label(name: str) -> str:
    """Two short lines per header, so that the table fits beside the page list."""
    for word in (" p50", " tok/s", " °C", " W"):
        name = name.replace(word, "\n" + word.strip(), 1)
    return name.replace(" / failed", " /\nfailed").replace("Concurrency", "Concur-\nrency")


HEADER_TIPS = {
    "TTFT p50 / p99": "time to first token, ms: median / 99th percentile",
    "TPOT p50 / p99": "time per output token after the first, ms (vLLM's TPOT; AIPerf calls it "
    "ITL): median / 99th percentile",
    "ITL p50 / p99": "inter-token latency, every gap between chunks pooled, ms: median / p99",
    "E2EL p50 / p99": "end-to-end latency of a request, ms: median / 99th percentile",
}


def _p(stats: LatencyStats, pct: str) -> float | None:
    return stats.percentiles_s.get(pct)


def _pair(stats: LatencyStats) -> str:
    return f"{fmt_ms(_p(stats, '50'))} / {fmt_ms(_p(stats, '99'))}"


def level_cells(run: BenchRun, level: BenchLevel) -> list[str]:
    t = level.telemetry
    sim = " (sim)" if t.simulated else ""
    return [
        f"#{run.id} {run.name}".strip(),
        str(level.concurrency) + (" (cut short)" if level.cancelled else ""),
        f"{level.completed} / {level.failed}",
        f"{level.output_throughput_tps:.1f}",
        f"{level.total_throughput_tps:.1f}",
        _pair(level.ttft),
        _pair(level.tpot),
        _pair(level.itl),
        _pair(level.e2el),
        f"{t.joules_per_token:.2f}{sim}" if t.joules_per_token is not None else "–",
        f"{t.temperature_peak_c:.0f}{sim}" if t.temperature_peak_c is not None else "–",
        f"{t.power_mean_w:.0f}{sim}" if t.power_mean_w is not None else "–",
    ]


def failure_text(level: BenchLevel) -> str:
    """Why a level's requests failed: each reason with how often, most frequent first."""
    reasons = sorted(level.errors.items(), key=lambda kv: -kv[1])
    if not reasons:
        return f"{level.failed} failed (no reason was recorded)"
    return "; ".join(f"{count} × {message}" for message, count in reasons[:5])


class BenchResults(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.heading = QLabel("Pick a run to see its figures; pick two and press Compare.")
        self.heading.setObjectName("benchHeading")
        self.heading.setWordWrap(True)
        self.heading.setTextFormat(Qt.TextFormat.RichText)
        layout.addWidget(self.heading)
        self.definitions = QLabel("")
        self.definitions.setObjectName("benchDefinitions")
        self.definitions.setWordWrap(True)
        layout.addWidget(self.definitions)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setObjectName("benchResults")
        self.table.setHorizontalHeaderLabels([header_label(c) for c in COLUMNS])
        for i, name in enumerate(COLUMNS):
            header_item = self.table.horizontalHeaderItem(i)
            if name in HEADER_TIPS and header_item is not None:
                header_item.setToolTip(HEADER_TIPS[name])
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        layout.addWidget(self.table, 1)
        self.failures = QLabel("")  # why requests failed, in the engine's or the load's words
        self.failures.setObjectName("benchFailures")
        self.failures.setWordWrap(True)
        self.failures.setVisible(False)
        layout.addWidget(self.failures)
        self.comparison = QLabel("")
        self.comparison.setObjectName("benchComparison")
        self.comparison.setWordWrap(True)
        self.comparison.setTextFormat(Qt.TextFormat.RichText)
        layout.addWidget(self.comparison)
        self.runs: tuple[BenchRun, ...] = ()

    def show_runs(self, runs: tuple[BenchRun, ...]) -> None:
        self.runs = runs
        rows = [(run, level) for run in runs for level in run.levels]
        self.table.setRowCount(len(rows))
        for r, (run, level) in enumerate(rows):
            for c, text in enumerate(level_cells(run, level)):
                item = QTableWidgetItem(text)
                if c and text != "–":
                    item.setTextAlignment(
                        Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
                    )
                if c == 2 and level.failed:
                    item.setForeground(QColor("#d62828"))
                    item.setToolTip(failure_text(level))
                self.table.setItem(r, c, item)
        self.table.setColumnHidden(0, len(runs) < 2)
        self.heading.setText("<br>".join(_run_line(run) for run in runs))
        definitions = next((run.definitions for run in runs if run.definitions), "")
        self.definitions.setText(
            "Latencies in milliseconds. "
            + (definitions or "Latency definitions: not stated by this daemon (older run).")
        )
        failures = [
            f"Run #{run.id}, concurrency {level.concurrency}: {failure_text(level)}"
            for run, level in rows
            if level.failed
        ]
        failures += [
            f"Run #{run.id}'s log names each failed request (Requests lists them under the "
            f"client 'a benchmark'): {run.log_path}"
            for run in runs
            if run.log_path
            and (run.state == BenchState.FAILED or any(lv.failed for lv in run.levels))
        ]
        self.failures.setText("\n".join(failures))
        self.failures.setVisible(bool(failures))
        self.comparison.setText(compare_html(runs[0], runs[1]) if len(runs) == 2 else "")
        telemetry = [lv.telemetry for run in runs for lv in run.levels]
        if any(t.simulated for t in telemetry):
            self.comparison.setText(
                self.comparison.text() + "<br><i>(sim): GPU figures from the SIMULATED GPUs.</i>"
            )


def _run_line(run: BenchRun) -> str:
    c = run.config
    levels = ", ".join(map(str, c.concurrency))
    engine = run.engine.get("engine", "")
    if engine:
        engine = f" on {engine} {run.engine.get('version', '')} ({run.engine.get('device', '')})"
    text = (
        f"<b>#{run.id} {html.escape(run.name)}</b> · {run.state} · {html.escape(c.model)}{engine}"
        f" · {c.workload}, {c.input_len} in / {c.output_len} out tokens, concurrency {levels}"
        f" · {fmt_when(run.created_s)}"
    )
    if run.detail:
        text += f"<br><span style='color:#d62828'>{html.escape(run.detail)}</span>"
    return text


def compare_html(a: BenchRun, b: BenchRun) -> str:
    """Per concurrency level both runs measured: output tokens/s, TTFT p50 and J/token of b
    relative to a."""
    lines = [f"<b>#{b.id} against #{a.id}</b>, at the concurrency levels both measured:"]
    by_level = {lv.concurrency: lv for lv in a.levels}
    found = False
    for lv in b.levels:
        base = by_level.get(lv.concurrency)
        if base is None:
            continue
        found = True
        tps = _change(base.output_throughput_tps, lv.output_throughput_tps, True)
        parts = [f"concurrency {lv.concurrency}: output tok/s {tps}"]
        parts.append(f"TTFT p50 {_change(_p(base.ttft, '50'), _p(lv.ttft, '50'), False)}")
        parts.append(
            "J/token "
            + _change(base.telemetry.joules_per_token, lv.telemetry.joules_per_token, False)
        )
        lines.append(" · ".join(parts))
    if not found:
        lines.append("no concurrency level in common")
    return "<br>".join(lines)


def _change(old: float | None, new: float | None, higher_is_better: bool) -> str:
    if old is None or new is None or old == 0:
        return "–"
    pct = (new - old) / old * 100
    better = (pct > 0) == higher_is_better
    color = "#2f9e44" if better else "#d62828"
    if abs(pct) < 1:
        return "about the same"
    return f"<span style='color:{color}'>{pct:+.0f} %</span>"
