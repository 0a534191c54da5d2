"""Hub search on the Models page: query, sort and quantization filter, results, and the chosen
model's details from its metadata (no weights downloaded) with fit badges, the consent to run its
own code when it needs that, and Download."""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QSplitter,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from desktop.daemon.fixes import Fix, fix_for
from desktop.daemon.messages import CallResult
from desktop.dashboard.page import PageContext
from desktop.look.formatting import fmt_bytes, fmt_count
from desktop.widgets.fit_badges import FitBadges
from desktop.widgets.result_label import ResultLabel
from desktop.widgets.table import read_only_table
from engines.events import DownloadStatus, FitResult, ModelDetails, ModelSummary

SORTS = ("downloads", "likes", "recent")
QUANTS = ("awq", "gptq", "fp8", "compressed-tensors", "bitsandbytes", "nvfp4", "mxfp4")
COLUMNS = (
    "Model",
    "Parameters",
    "Weights",
    "Quantization",
    "Downloads",
    "Likes",
    "Updated",
    "Access",
)


class SearchView(QWidget):
    def __init__(
        self,
        ctx: PageContext,
        trusted: Callable[[str], bool],
        on_trust: Callable[[str, bool], None],
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.trusted = trusted
        self.on_trust = on_trust
        self.results: tuple[ModelSummary, ...] = ()
        self.details: ModelDetails | None = None
        layout = QVBoxLayout(self)
        layout.addLayout(self._bar())
        self.access = QLabel("")
        self.access.setObjectName("hubAccess")
        self.access.setProperty("role", "hint")
        self.access.setWordWrap(True)
        layout.addWidget(self.access)
        status = QHBoxLayout()  # the whole width: an error says what happened and what to do
        self.status = ResultLabel("searchStatus")
        status.addWidget(self.status, 1)
        self.fix_button = QPushButton()
        self.fix_button.setObjectName("searchFix")
        self.fix_button.setVisible(False)
        self.fix_button.clicked.connect(self.on_fix_clicked)
        status.addWidget(self.fix_button)
        layout.addLayout(status)
        self.fix: Fix | None = None
        split = QSplitter(Qt.Orientation.Vertical)
        self.table = read_only_table(
            COLUMNS,
            "modelResults",
            stretch_column=0,
            on_select=self.on_result_selected,
        )
        split.addWidget(self.table)
        details = QScrollArea()
        details.setWidgetResizable(True)
        details.setFrameShape(QScrollArea.Shape.NoFrame)
        details.setWidget(self._details_panel())
        split.addWidget(details)
        split.setSizes([190, 450])
        layout.addWidget(split, 1)

    def _bar(self) -> QHBoxLayout:
        bar = QHBoxLayout()
        self.query = QLineEdit()
        self.query.setObjectName("modelQuery")
        self.query.setPlaceholderText("Search the Hugging Face Hub (e.g. qwen2.5 7b instruct)")
        self.query.returnPressed.connect(self.search)
        bar.addWidget(self.query, 1)
        bar.addWidget(QLabel("Sort"))
        self.sort = QComboBox()
        self.sort.setObjectName("modelSort")
        self.sort.addItems(SORTS)
        bar.addWidget(self.sort)
        bar.addWidget(QLabel("Quantization"))
        self.quant = QComboBox()
        self.quant.setObjectName("modelQuant")
        self.quant.addItem("any", "")
        for q in QUANTS:
            self.quant.addItem(q, q)
        bar.addWidget(self.quant)
        self.search_button = QPushButton("Search")
        self.search_button.setObjectName("searchModels")
        self.search_button.clicked.connect(self.search)
        bar.addWidget(self.search_button)
        return bar

    def _details_panel(self) -> QWidget:
        panel = QWidget()
        layout = QVBoxLayout(panel)
        layout.setContentsMargins(0, 6, 0, 0)
        self.info = QLabel("Pick a model to see its details and whether it fits your GPUs.")
        self.info.setObjectName("modelInfo")
        self.info.setWordWrap(True)
        self.info.setTextFormat(Qt.TextFormat.RichText)
        self.info.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.info)
        self.fit = FitBadges()
        self.fit.setObjectName("fitBadges")
        layout.addWidget(self.fit)
        self.trust = QCheckBox(
            "Allow this model's own Python code to run in the engine (trust_remote_code). "
            "Only for authors you trust: the code runs with your user's rights."
        )
        self.trust.setObjectName("trustModel")
        self.trust.setVisible(False)
        self.trust.toggled.connect(self.on_trust_toggled)
        layout.addWidget(self.trust)
        row = QHBoxLayout()
        self.pull_button = QPushButton("Download")
        self.pull_button.setObjectName("pullModel")
        self.pull_button.setEnabled(False)
        self.pull_button.clicked.connect(self.on_pull_clicked)
        row.addWidget(self.pull_button)
        row.addStretch(1)
        layout.addLayout(row)
        self.result = ResultLabel("searchResult")
        layout.addWidget(self.result)
        layout.addStretch(1)
        return panel

    # ----------------------------------------------------------------- search

    def load_access(self) -> None:
        self.ctx.bridge.call(lambda c: c.hub_access(), self._on_access)

    def _on_access(self, result: CallResult) -> None:
        if not result.ok or not isinstance(result.value, Mapping):
            self.access.setText(result.error)
            return
        get = result.value.get
        token = (
            "your token is sent"
            if get("token_sent")
            else (
                "no token (gated models need one: Settings)"
                if not get("token_found")
                else f"token NOT sent: {get('token_withheld_reason')}"
            )
        )
        self.access.setText(f"Hub: {get('endpoint')} · {token} · cache {get('cache_dir')}")

    def search(self) -> None:
        query, sort, quant = (
            self.query.text().strip(),
            self.sort.currentText(),
            self.quant.currentData(),
        )
        self.status.neutral("Searching…")
        self.search_button.setEnabled(False)
        self.ctx.bridge.call(
            lambda c: c.search_models(query, sort=sort, quant=quant or None, limit=30),
            self._on_results,
        )

    def _on_results(self, result: CallResult) -> None:
        self.search_button.setEnabled(True)
        self.fix = None
        self.fix_button.setVisible(False)
        if not result.ok or not isinstance(result.value, tuple):
            self.status.error(result.error)
            self.fix = fix_for(result.error_code, result.error)
            if self.fix is not None and self.fix.action:
                self.fix_button.setText(self.fix.label)
                self.fix_button.setVisible(True)
            return
        self.results = tuple(m for m in result.value if isinstance(m, ModelSummary))
        self.status.neutral(f"{len(self.results)} models")
        self.table.setRowCount(len(self.results))
        for r, m in enumerate(self.results):
            values = (
                m.repo_id,
                fmt_count(m.parameters),
                fmt_bytes(m.weights_bytes),
                m.quantization or "–",
                fmt_count(m.downloads),
                fmt_count(m.likes),
                m.last_modified[:10] or "–",
                {"": "open", "auto": "gated (auto)", "manual": "gated (approval)"}.get(
                    m.gated, m.gated
                ),
            )
            for c, value in enumerate(values):
                self.table.setItem(r, c, QTableWidgetItem(value))
        if self.results:
            self.table.selectRow(0)

    def on_fix_clicked(self) -> None:
        if self.fix is not None:
            self.ctx.run_fix(self.fix)

    # ----------------------------------------------------------------- details

    def selected_repo(self) -> str:
        row = self.table.currentRow()
        return self.results[row].repo_id if 0 <= row < len(self.results) else ""

    def on_result_selected(self) -> None:
        repo = self.selected_repo()
        if not repo:
            return
        self.details = None
        self.pull_button.setEnabled(False)
        self.trust.setVisible(False)
        self.info.setText(f"Reading {html.escape(repo)}…")
        self.fit.clear("estimating…")
        self.ctx.bridge.call(lambda c: c.model_details(repo), self._on_details)
        self.ctx.bridge.call(lambda c: c.model_fit(repo), self._on_fit)

    def _on_details(self, result: CallResult) -> None:
        if not result.ok or not isinstance(result.value, ModelDetails):
            self.info.setText(f"<span style='color:#d62828'>{html.escape(result.error)}</span>")
            return
        d = self.details = result.value
        if d.repo_id != self.selected_repo():
            return
        self.info.setText(details_html(d))
        self.trust.blockSignals(True)
        self.trust.setChecked(self.trusted(d.repo_id))
        self.trust.blockSignals(False)
        self.trust.setVisible(d.needs_remote_code)
        self.pull_button.setEnabled(True)
        self.pull_button.setText(f"Download {fmt_bytes(d.download_bytes)}")

    def _on_fit(self, result: CallResult) -> None:
        if not result.ok or not isinstance(result.value, tuple):
            self.fit.clear(f"no fit estimate: {result.error}")
            return
        fits = [r for r in result.value if isinstance(r, FitResult)]
        gpu = self.ctx.state.gpu
        self.fit.show_results(fits, example=gpu.overview is not None and not gpu.available)

    def on_trust_toggled(self, on: bool) -> None:
        if self.details is not None:
            self.on_trust(self.details.repo_id, on)

    def on_pull_clicked(self) -> None:
        if self.details is None:
            return
        repo, revision = self.details.repo_id, self.details.revision

        def done(result: CallResult) -> None:
            if result.ok and isinstance(result.value, DownloadStatus):
                self.result.ok(f"{repo} is in the download queue (Downloads tab).")
            else:
                self.result.error(result.error)

        self.ctx.bridge.call(lambda c: c.pull(repo, revision), done)


def details_html(d: ModelDetails) -> str:
    if d.architecture:
        architecture = f"{d.architecture} ({d.model_type})"
    else:
        architecture = "unknown: config.json could not be read" + (
            " (gated: accept the terms on the Hub and save your token in Settings)"
            if d.gated
            else ""
        )
    rows = [
        ("Architecture", architecture),
        ("Parameters", fmt_count(d.parameters)),
        ("Context", f"{d.max_context:,} tokens" if d.max_context else "?"),
        ("Weights", (d.dtype or "?") + (f", {d.quantization}" if d.quantization else "")),
        (
            "Layers · heads · KV heads",
            " · ".join(
                str(v) if v else "?" for v in (d.num_layers, d.num_attention_heads, d.num_kv_heads)
            ),
        ),
        ("Download", f"{fmt_bytes(d.download_bytes)} in {len(d.files)} files"),
        ("License", d.license or "?"),
        (
            "Access",
            {
                "": "open",
                "auto": "gated: accept the terms on the Hub",
                "manual": "gated: the authors approve each request",
            }.get(d.gated, d.gated),
        ),
    ]
    body = "".join(
        f"<tr><td style='padding-right:14px'><b>{html.escape(k)}</b></td>"
        f"<td>{html.escape(str(v))}</td></tr>"
        for k, v in rows
    )
    head = f"<h3>{html.escape(d.repo_id)}</h3>"
    note = ""
    if d.needs_remote_code:
        note = (
            "<p style='color:#b7791f'><b>This model ships its own Python code</b> "
            "(config.json has auto_map): engines run it only with your consent below.</p>"
        )
    if d.skipped_files:
        note += f"<p>Not downloaded: {html.escape(', '.join(d.skipped_files[:6]))}</p>"
    return f"{head}<table>{body}</table>{note}"
