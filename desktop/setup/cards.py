"""The setup's building blocks: a card per step (number, title, status, what is happening, a
progress bar on long waits, and with an error its fix button, Try again and the CLI command),
and a row per proposed model (with its size and its fit badge)."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QRadioButton,
    QVBoxLayout,
    QWidget,
)

from desktop.daemon.fixes import Fix
from desktop.look.formatting import fmt_bytes
from desktop.look.theme import SPACE_M, SPACE_S, SPACE_XS, primary, text_label
from desktop.setup.flow import StepView
from desktop.setup.proposals import Proposal
from desktop.widgets.fit_badges import VERDICTS
from engines.events import FitResult

STATUS_MARKS = {"done": "✓ done", "working": "working…", "error": "needs you", "waiting": ""}
STATUS_COLORS = {"done": "#2f9e44", "working": "#e67700", "error": "#d62828", "waiting": ""}


class StepCard(QFrame):
    def __init__(
        self,
        number: int,
        title: str,
        on_fix: Callable[[Fix], None],
        on_retry: Callable[[], None],
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setProperty("role", "card")
        self.on_fix = on_fix
        self.view = StepView("waiting", "")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(SPACE_M, SPACE_S, SPACE_M, SPACE_M)
        layout.setSpacing(SPACE_XS + 2)
        head = QHBoxLayout()
        heading = QLabel(f"{number}  {title}")
        heading.setProperty("role", "heading")
        head.addWidget(heading)
        head.addStretch(1)
        self.status = QLabel("")
        self.status.setObjectName("stepStatus")
        head.addWidget(self.status)
        layout.addLayout(head)
        self.text = text_label("stepText")
        layout.addWidget(self.text)
        self.extra = QVBoxLayout()  # step-specific widgets (the model list)
        layout.addLayout(self.extra)
        self.progress = QProgressBar()
        self.progress.setObjectName("stepProgress")
        self.progress.setTextVisible(False)
        self.progress.setMaximumHeight(10)
        layout.addWidget(self.progress)
        fix_row = QHBoxLayout()
        self.fix_button = primary(QPushButton())
        self.fix_button.setObjectName("stepFix")
        self.fix_button.clicked.connect(self.on_fix_clicked)
        self.retry_button = QPushButton("Try again")
        self.retry_button.setObjectName("stepRetry")
        self.retry_button.clicked.connect(on_retry)
        fix_row.addWidget(self.fix_button)
        fix_row.addWidget(self.retry_button)
        fix_row.addStretch(1)
        layout.addLayout(fix_row)
        self.hint = text_label("stepHint", "hint")
        layout.addWidget(self.hint)
        self.show_view(self.view)

    def show_view(self, view: StepView) -> None:
        self.view = view
        self.status.setText(STATUS_MARKS.get(view.status, view.status))
        color = STATUS_COLORS.get(view.status, "")
        self.status.setStyleSheet(f"color: {color}; font-weight: 600;" if color else "")
        self.text.setText(view.text)
        self.progress.setVisible(view.status == "working")
        if view.progress is None:
            self.progress.setRange(0, 0)  # busy: no figure to show
        else:
            self.progress.setRange(0, 1000)
            self.progress.setValue(int(view.progress * 1000))
        error = view.status == "error"
        fix = view.fix
        self.fix_button.setVisible(error and fix is not None and bool(fix.action))
        self.fix_button.setText(fix.label if fix is not None else "")
        self.retry_button.setVisible(error)
        hint = fix.cli if error and fix is not None else ""
        self.hint.setVisible(bool(hint))
        self.hint.setText(f"or in a terminal: {hint}" if hint else "")

    def on_fix_clicked(self) -> None:
        if self.view.fix is not None:
            self.on_fix(self.view.fix)


class ProposalRow(QWidget):
    """A proposed model: pick it with the radio button; its size and fit badge beside it."""

    def __init__(self, proposal: Proposal, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.proposal = proposal
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        top = QHBoxLayout()
        self.radio = QRadioButton(proposal.title)
        self.radio.setObjectName(f"proposal:{proposal.name}")
        top.addWidget(self.radio)
        top.addStretch(1)
        self.size_label = QLabel("")
        self.size_label.setProperty("role", "muted")
        top.addWidget(self.size_label)
        top.addSpacing(SPACE_S)
        self.badge = QLabel("")
        self.badge.setObjectName(f"fit:{proposal.name}")
        self.badge.setMinimumWidth(96)
        self.badge.setAlignment(Qt.AlignmentFlag.AlignCenter)
        top.addWidget(self.badge)
        layout.addLayout(top)
        about = QLabel(proposal.about)
        about.setProperty("role", "hint")
        about.setWordWrap(True)
        about.setContentsMargins(24, 0, 0, 0)
        layout.addWidget(about)

    def show_fit(self, fit: FitResult | None, error: str, *, offline: bool = False) -> None:
        """The size and fit badge; with ``error`` (the Hub did not answer) its reason as the
        badge's tooltip."""
        if fit is None:
            self.size_label.setText("")
            self.badge.setText(("offline" if offline else "?") if error else "…")
            self.badge.setProperty("verdict", "")
            self.badge.setToolTip(error)
            self.badge.setStyleSheet("")
            return
        self.size_label.setText(fmt_bytes(fit.weights_bytes_per_gpu))
        text, color = VERDICTS.get(fit.verdict, (fit.verdict, "#6c737d"))
        self.badge.setText(text)
        self.badge.setProperty("verdict", fit.verdict)
        self.badge.setToolTip(fit.reason)
        self.badge.setStyleSheet(
            f"background: {color}; color: white; border-radius: 4px; padding: 2px 8px;"
            "font-weight: 600;"
        )
