"""The Tune page's result: this machine's table of candidates (each figure the mean of its runs
with its noise band, the cost per 100 M tokens, the verdict against the profile as it is, the
Pareto set marked), the recommendation in words, what was not measured and why. Figures that
came from SIMULATED GPUs say so in their cells and above the table."""

from __future__ import annotations

import html
from dataclasses import dataclass

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFont
from PySide6.QtWidgets import (
    QHeaderView,
    QLabel,
    QTableWidgetItem,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from desktop.look.formatting import fmt_when
from desktop.widgets.table import read_only_table
from engines.events import TuneJob, TuneRow, TuneState


@dataclass(frozen=True)
class Column:
    key: str  # the tuner's figure key (engines/tune/figures.py)
    header: str
    digits: int
    tip: str
    gpu: bool = False  # read from the GPUs' telemetry (simulated on simulated GPUs)


COLUMNS = (
    Column("output_tps", "Output\ntok/s", 1, "output tokens per second, all requests together"),
    Column("request_rps", "Req/s", 2, "requests finished per second"),
    Column("ttft_p50_ms", "TTFT\np50 ms", 1, "time to first token, median, ms"),
    Column("ttft_p95_ms", "TTFT\np95 ms", 1, "time to first token, 95th percentile, ms"),
    Column("tpot_p50_ms", "TPOT\np50 ms", 2, "time per output token after the first, median"),
    Column("vram_peak_gib", "VRAM\nGiB", 2, "GPU memory at its peak", gpu=True),
    Column("temperature_peak_c", "Peak\n°C", 0, "the hottest GPU's peak temperature", gpu=True),
    Column("power_mean_w", "Mean\nW", 1, "the GPUs' mean power draw", gpu=True),
    Column("joules_per_token", "J/token", 3, "energy per output token", gpu=True),
    Column("cold_start_s", "Cold\nstart s", 1, "from start to ready, for this candidate"),
)
COST = "Per 100 M\ntokens"
HEADERS = ("Candidate", "Verdict", *(c.header for c in COLUMNS), COST)
FIRST_FIGURE = 2  # the column of COLUMNS[0]
CANDIDATE_WIDTH = 140  # longer labels wrap ("tensor parallel on 2 GPUs")
PARETO_MARK = "★"
SHOWN_ROWS = 8  # rows the table shows whole without scrolling (more scroll)
VERDICT_COLORS = {"better": "#2f9e44", "worse": "#d62828", "failed": "#d62828", "mixed": "#b7791f"}


def cell_text(row: TuneRow, column: Column) -> str:
    """ "1234.5" over "±3%" (the runs' spread) or "one run: no spread", "–" when not measured
    here."""
    return row.figure_text(column.key, column.digits, sep="\n", missing="–")


def headers(simulated: bool) -> tuple[str, ...]:
    """The table's headers; on simulated GPUs the GPU figures' (and the cost's) say "sim"."""
    if not simulated:
        return HEADERS
    gpu = {c.header for c in COLUMNS if c.gpu} | {COST}
    return tuple(f"{h}\n(sim)" if h in gpu else h for h in HEADERS)


def cost_text(row: TuneRow, job: TuneJob) -> str:
    if row.cost_per_100m is None:
        return "–"
    return f"{row.cost_per_100m:.2f} {job.currency}"


def verdict_text(row: TuneRow) -> str:
    """The verdict against your profile, with the Pareto mark (as `traylm tune` prints it)."""
    if row.error and not row.runs:
        return f"failed: {row.error}"
    failed = ", a run failed (hover for why)" if row.error else ""
    return row.verdict + (f" {PARETO_MARK}" if row.pareto else "") + failed


def heading_html(job: TuneJob) -> str:
    c = job.config
    workload = (
        f"your recorded traffic ({c.workload_file})"
        if c.workload == "file"
        else (f"preset {c.workload}")
    )
    when = fmt_when(job.finished_s or job.started_s)
    title = f"<b>Tune #{job.id} of {html.escape(job.profile)}</b> · {job.state}"
    if job.state == TuneState.INTERRUPTED:  # a killed daemon's: only what its file kept
        return f"{title} · {when}<br>{_said(job.detail.removeprefix('interrupted: '))}"
    done = sum(1 for m in job.measures if not m.error)
    count = f"{done} of {job.planned} measurements · " if job.planned else ""
    heading = (
        f"{title} · {count}"
        f"{html.escape(workload)}, concurrency {job.concurrency}, goal {html.escape(c.goal)}, "
        f"{c.repeat} runs of each candidate, interleaved · {when}"
    )
    if job.state in (TuneState.FAILED, TuneState.CANCELLED) and job.detail not in ("", "cancelled"):
        heading += f"<br>{_said(job.detail)}"
    return heading


def _said(detail: str) -> str:
    """The daemon's words on how a tune ended, as a sentence."""
    text = detail.strip()
    return html.escape(text[:1].upper() + text[1:] + ("" if text.endswith(".") else "."))


class TuneResults(QWidget):
    """Shows one TuneJob; holds nothing else."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.heading = self._label("tuneHeading", "No tune has run since the daemon started.")
        self.simulated = self._label(
            "tuneSimulated",
            "<b>Simulated GPUs:</b> VRAM, °C, W, J/token and the cost come from the SIMULATED "
            "GPUs, not from real cards: their columns say (sim).",
        )
        self.simulated.setStyleSheet("color: #b7791f")
        self.recommendation = self._label("tuneRecommendation", "")
        self.table = read_only_table(HEADERS, "tuneTable")
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Interactive)
        self.table.setColumnWidth(0, CANDIDATE_WIDTH)
        self.note = self._label(
            "tuneNote",
            "± is the spread of the runs: half their range, relative to their mean (after one "
            "run there is none); a candidate is better or worse only outside the wider of its "
            f"and your profile's spread (2 % at least). {PARETO_MARK}: on the "
            "Pareto front (tokens/s, TTFT p95, J/token): nothing beats it on all three.",
        )
        self.dropped = self._label("tuneDropped", "")
        self.dropped_toggle = QToolButton()
        self.dropped_toggle.setObjectName("tuneDroppedToggle")
        self.dropped_toggle.setCheckable(True)
        self.dropped_toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextOnly)
        self.dropped_toggle.toggled.connect(self.dropped.setVisible)
        for w in (self.heading, self.simulated, self.recommendation):
            layout.addWidget(w)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.note)
        layout.addWidget(self.dropped_toggle)
        layout.addWidget(self.dropped)
        layout.addStretch(0)  # takes the room while there is no table (factor 0: not beside it)
        self.job: TuneJob | None = None
        self.show_job(None)

    @staticmethod
    def _label(name: str, text: str) -> QLabel:
        label = QLabel(text)
        label.setObjectName(name)
        label.setWordWrap(True)
        label.setTextFormat(Qt.TextFormat.RichText)
        label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        return label

    def show_job(self, job: TuneJob | None) -> None:
        self.job = job
        if job is None:
            self.heading.setText("No tune has run since the daemon started: start one above.")
        else:
            self.heading.setText(heading_html(job))
        self.simulated.setVisible(job is not None and job.simulated)
        self.recommendation.setText(self._recommendation(job))
        rows = job.rows if job is not None else ()
        shown = [c for c in COLUMNS if any(c.key in r.figures for r in rows)]
        simulated = job is not None and job.simulated
        self.table.setHorizontalHeaderLabels(list(headers(simulated)))
        for i, column in enumerate(COLUMNS, start=FIRST_FIGURE):
            item = self.table.horizontalHeaderItem(i)
            if item is not None:
                item.setToolTip(column.tip + "; ± the spread of the runs")
        for i, column in enumerate(COLUMNS, start=FIRST_FIGURE):
            self.table.setColumnHidden(i, column not in shown)  # no GPU columns on a CPU
        self.table.setRowCount(len(rows))
        for r, row in enumerate(rows):
            assert job is not None
            self._fill(r, row, job)
        self.table.resizeRowsToContents()  # two lines: the figure over its spread
        self.table.setMinimumHeight(self._rows_height(min(len(rows), SHOWN_ROWS)))
        self.table.setVisible(bool(rows))
        self.note.setVisible(bool(rows))
        dropped = job.dropped if job is not None else ()
        self.dropped.setText("<br>".join(html.escape(d) for d in dropped))
        self.dropped_toggle.setText(f"Not measured: {len(dropped)} (show why)")
        self.dropped_toggle.setVisible(bool(dropped))
        self.dropped.setVisible(bool(dropped) and self.dropped_toggle.isChecked())

    def _rows_height(self, rows: int) -> int:
        """The table's height that shows ``rows`` rows whole, with its header and frame."""
        height = self.table.horizontalHeader().sizeHint().height() + 2 * self.table.frameWidth()
        height += sum(self.table.rowHeight(r) for r in range(rows))
        scroll = self.table.horizontalScrollBar().sizeHint().height()
        return height + scroll

    def _fill(self, r: int, row: TuneRow, job: TuneJob) -> None:
        cells = [
            row.label,
            verdict_text(row),
            *(cell_text(row, c) for c in COLUMNS),
            cost_text(row, job),
        ]
        tip = "; ".join(row.changes) or "your profile as it is"
        for c, text in enumerate(cells):
            item = QTableWidgetItem(text)
            item.setToolTip(f"{row.label}: {tip}" + (f"\n{row.error}" if row.error else ""))
            if c >= FIRST_FIGURE and text != "–":
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            if c == 1 and row.verdict in VERDICT_COLORS:
                item.setForeground(QColor(VERDICT_COLORS[row.verdict]))
            if row.key == job.recommended:
                font = QFont(item.font())
                font.setBold(True)
                item.setFont(font)
            self.table.setItem(r, c, item)

    @staticmethod
    def _recommendation(job: TuneJob | None) -> str:
        if job is None or job.state == TuneState.RUNNING:
            return ""
        if job.state != TuneState.DONE:
            return ""
        text = html.escape(job.recommendation[:1].upper() + job.recommendation[1:])
        winner = next((r for r in job.rows if r.key == job.recommended), None)
        if winner is not None:
            text += "<br>Profile changes: " + html.escape("; ".join(winner.changes))
        return f"<b>Recommendation:</b> {text}"
