"""The Tune page's form: what to tune (a profile), against which traffic (a preset, the recorded
traffic, a file), for which goal, within which time; as the daemon's TuneConfig. A refusal
from the daemon names the field it is about (the CLI's option names): that field is marked
and gets the focus, so the fix starts where the cursor is."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QWidget,
)

from desktop.dashboard.tune_workload import FILE, GOALS, RECORDED, WORKLOADS
from engines.events import TuneConfig

INVALID_STYLE = "border: 2px solid #d62828"


class TuneForm(QGroupBox):
    def __init__(self, parent: QWidget | None = None) -> None:
        """Two columns: what to tune and for what | how long and how much."""
        super().__init__("New tune", parent)
        self._invalid: QWidget | None = None
        columns = QHBoxLayout(self)
        form, more = QFormLayout(), QFormLayout()
        columns.addLayout(form, 3)
        columns.addLayout(more, 2)
        self._rows = form
        self.model = _combo("tuneModel")
        self.model.setToolTip("The profile whose settings are tuned (loaded ones are marked)")
        form.addRow("&Model", self.model)
        self.workload = _combo("tuneWorkload")
        for key, text in WORKLOADS:
            self.workload.addItem(text, key)
        self.workload.setToolTip(
            "The traffic each candidate is measured with: a preset, what the request recorder "
            "kept of this computer's own traffic (exported when the tune starts), or a file "
            "written by `traylm requests export`"
        )
        self.workload.currentIndexChanged.connect(self._on_workload_changed)
        form.addRow("&Workload", self.workload)
        self.workload_file = QLineEdit()
        self.workload_file.setObjectName("tuneWorkloadFile")
        self.workload_file.setPlaceholderText("a .jsonl file from `traylm requests export`")
        browse = QPushButton("&Browse…")
        browse.setObjectName("tuneBrowse")
        browse.clicked.connect(self.on_browse_clicked)
        row = QHBoxLayout()
        row.addWidget(self.workload_file, 1)
        row.addWidget(browse)
        form.addRow("File", row)
        self.goal = _combo("tuneGoal")
        for key, text in GOALS:
            self.goal.addItem(text, key)
        form.addRow("&Goal", self.goal)
        self.budget = QSpinBox(minimum=1, maximum=7 * 24 * 60, value=20, suffix=" min")
        self.budget.setObjectName("tuneBudget")
        self.budget.setToolTip("Time for the whole tune, the engine starts included")
        more.addRow("B&udget", self.budget)
        self.repeat = QSpinBox(minimum=2, maximum=10, value=2)
        self.repeat.setObjectName("tuneRepeat")
        self.repeat.setToolTip("Runs of each candidate, interleaved: two at least for a noise band")
        more.addRow("Runs of each", self.repeat)
        self.requests = QSpinBox(minimum=0, maximum=10000, value=0)
        self.requests.setObjectName("tuneRequests")
        self.requests.setSpecialValueText("the workload's")
        self.concurrency = QSpinBox(minimum=0, maximum=4096, value=0)
        self.concurrency.setObjectName("tuneConcurrency")
        self.concurrency.setSpecialValueText("the workload's")
        more.addRow("Requests a run", self.requests)
        more.addRow("In flight", self.concurrency)
        self.only = QLineEdit()
        self.only.setObjectName("tuneOnly")
        self.only.setPlaceholderText("all that fit here; or keys, e.g. max-num-seqs-32")
        self.only.setToolTip("Candidate keys to try, comma-separated (your profile always runs)")
        form.addRow("Candidates", self.only)
        for field in (self.workload_file, self.only):
            field.textEdited.connect(self.clear_invalid)
        for spin in (self.budget, self.repeat, self.requests, self.concurrency):
            spin.valueChanged.connect(self.clear_invalid)
        self._on_workload_changed()

    def set_profiles(self, names: list[str], loaded: set[str]) -> None:
        """The profiles to pick from, those loaded now marked (and picked first)."""
        current = self.model.currentData()
        items = [(f"{n} (loaded)" if n in loaded else n, n) for n in names]
        if items == [(self.model.itemText(i), self.model.itemData(i))
                     for i in range(self.model.count())]:  # fmt: skip
            return
        self.model.clear()
        for text, name in items:
            self.model.addItem(text, name)
        wanted = current if current in names else next((n for n in names if n in loaded), None)
        if wanted is not None:
            self.model.setCurrentIndex(names.index(wanted))

    def selected_profile(self) -> str:
        data = self.model.currentData()
        return str(data) if data else ""

    def _on_workload_changed(self) -> None:
        is_file = self.workload.currentData() == FILE
        self._rows.setRowVisible(2, is_file)
        if is_file:
            self.workload_file.setFocus()

    def on_browse_clicked(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Workload file", self.workload_file.text(), "JSONL (*.jsonl);;All files (*)"
        )
        if path:
            self.workload_file.setText(path)

    def config(self) -> TuneConfig:
        """The form as a TuneConfig ("recorded" stays a file workload without its file yet:
        the export is written when the tune starts)."""
        workload = str(self.workload.currentData())
        path = self.workload_file.text().strip()
        if workload == FILE and not path:
            self.mark_invalid(self.workload_file)
            raise ValueError("pick the workload file (Browse…), or choose a preset")
        return TuneConfig(
            model=self.selected_profile(),
            workload=FILE if workload in (FILE, RECORDED) else workload,
            workload_file=path if workload == FILE else "",
            goal=str(self.goal.currentData()),
            budget_s=self.budget.value() * 60.0,
            repeat=self.repeat.value(),
            requests=self.requests.value(),
            concurrency=self.concurrency.value(),
            only=tuple(k.strip() for k in self.only.text().split(",") if k.strip()),
        )

    def field_for(self, message: str) -> QWidget | None:
        """The form field a daemon's refusal is about (its words name the CLI's options)."""
        text = message.lower()
        checks: tuple[tuple[tuple[str, ...], QWidget], ...] = (
            (("budget",), self.budget),
            (("--repeat", "noise band needs"), self.repeat),
            (("--requests", "--concurrency"), self.requests),
            (("no candidate ",), self.only),
            (("json", "workload", "recorder", "preset"), self._workload_field()),
            (("goal",), self.goal),
            (("profile", "fits no candidate"), self.model),
        )
        return next((w for words, w in checks if any(x in text for x in words)), None)

    def _workload_field(self) -> QWidget:
        return self.workload_file if self.workload.currentData() == FILE else self.workload

    def mark_invalid(self, widget: QWidget | None) -> None:
        if widget is None:
            return
        self.clear_invalid()
        self._invalid = widget
        widget.setStyleSheet(INVALID_STYLE)
        widget.setFocus(Qt.FocusReason.OtherFocusReason)

    def clear_invalid(self, *_: object) -> None:
        if self._invalid is not None:
            self._invalid.setStyleSheet("")
            self._invalid = None


def _combo(name: str) -> QComboBox:
    """A combo box whose long items do not widen the form (the open list shows them whole)."""
    combo = QComboBox()
    combo.setObjectName(name)
    combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
    combo.setMinimumContentsLength(22)
    return combo
