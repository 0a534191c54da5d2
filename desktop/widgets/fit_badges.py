"""Fit badges: does a model fit each engine on one GPU and on two, and if not, what would fix it.
Verdicts come from the daemon's estimator (``GET /api/models/{repo}/fit``); the badge only colours
them and the text below repeats its reason and its first suggested fix."""

from __future__ import annotations

import html

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QGridLayout, QLabel, QVBoxLayout, QWidget

from desktop.look.formatting import fmt_bytes
from engines.events import FitResult

ENGINE_NAMES = {"vllm": "vLLM", "trtllm": "TensorRT-LLM", "sglang": "SGLang"}
VERDICTS = {
    "fits": ("fits", "#2f9e44"),
    "tight": ("tight", "#e67700"),
    "wont_fit": ("won't fit", "#d62828"),
    "unsupported": ("not supported", "#6c737d"),
}


def verdict_of(result: FitResult) -> str:
    return result.verdict if result.supported else "unsupported"


class FitBadges(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.results: list[FitResult] = []
        self.badges: dict[tuple[str, int], QLabel] = {}
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.grid = QGridLayout()
        self.grid.setHorizontalSpacing(10)
        layout.addLayout(self.grid)
        self.fixes = QLabel("")
        self.fixes.setObjectName("fitFixes")
        self.fixes.setWordWrap(True)
        self.fixes.setTextFormat(Qt.TextFormat.RichText)
        layout.addWidget(self.fixes)

    def clear(self, text: str = "") -> None:
        while self.grid.count():
            item = self.grid.takeAt(0)
            widget = item.widget() if item is not None else None
            if widget is not None:
                widget.deleteLater()
        self.badges = {}
        self.results = []
        self.fixes.setText(html.escape(text))

    def show_results(self, results: list[FitResult], *, example: bool = False) -> None:
        """The verdicts per engine and GPU count. ``example``: this computer has no NVIDIA GPU,
        so the daemon judged the model on two RTX 4090s; the heads and the text say so (they
        read as this computer's GPUs otherwise)."""
        self.clear()
        self.results = results
        engines = list(dict.fromkeys(r.engine for r in results))
        counts = sorted({len(r.gpus) for r in results})
        for c, n in enumerate(counts):
            name = results[0].gpus[0].name if results else "GPU"
            head = QLabel(f"<b>{n} × {name}</b>" + (" (example)" if example else ""))
            self.grid.addWidget(head, 0, c + 1)
        for row, engine in enumerate(engines, start=1):
            self.grid.addWidget(QLabel(ENGINE_NAMES.get(engine, engine)), row, 0)
            for c, n in enumerate(counts):
                result = next((r for r in results if r.engine == engine and len(r.gpus) == n), None)
                if result is not None:
                    self.grid.addWidget(self._badge(result), row, c + 1)
        self.grid.setColumnStretch(len(counts) + 1, 1)
        note = (
            "<b>This computer has no NVIDIA GPU:</b> the badges say how the model would fit on "
            "RTX 4090s. Here models run on the CPU (small ones: the first-run setup proposes "
            "some).<br>"
            if example
            else ""
        )
        self.fixes.setText(note + self._fixes_html())

    def _badge(self, r: FitResult) -> QLabel:
        verdict = verdict_of(r)
        text, color = VERDICTS.get(verdict, (verdict, "#6c737d"))
        badge = QLabel(text)
        badge.setObjectName(f"fit-{r.engine}-{len(r.gpus)}")
        badge.setProperty("verdict", verdict)
        badge.setAlignment(Qt.AlignmentFlag.AlignCenter)
        badge.setMinimumWidth(110)
        badge.setStyleSheet(
            f"background: {color}; color: white; border-radius: 4px; padding: 3px 8px;"
            "font-weight: bold;"
        )
        tip = [
            r.reason,
            f"weights {fmt_bytes(r.weights_bytes_per_gpu)} per GPU, KV cache for "
            f"{r.kv_tokens:,} tokens ({r.sequences_fit} × {r.context_len:,}-token sequences)",
            *r.notes,
        ]
        badge.setToolTip("\n".join(t for t in tip if t))
        self.badges[(r.engine, len(r.gpus))] = badge
        return badge

    def _fixes_html(self) -> str:
        lines = []
        for r in self.results:
            verdict = verdict_of(r)
            if verdict == "fits":
                continue
            where = f"{ENGINE_NAMES.get(r.engine, r.engine)} on {len(r.gpus)} GPU"
            where += "s" if len(r.gpus) > 1 else ""
            line = f"<b>{html.escape(where)}</b>: {html.escape(r.reason)}"
            if r.fixes:
                fix = r.fixes[0]
                after = VERDICTS.get(fix.verdict, (fix.verdict, ""))[0]
                line += f" <i>Fix: {html.escape(fix.description)} (then: {after}).</i>"
            lines.append(line)
        return "<br>".join(lines) or "Fits every engine on one GPU and on two."
