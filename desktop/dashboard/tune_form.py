"""The Tune page's form: what to tune (a profile, a model folder, a downloaded model), against
which traffic (a preset, the recorded traffic, a file), for which goal, within which time; as the
daemon's TuneConfig. A refusal from the daemon names the field it is about: that field is marked
and gets the focus, so the fix starts where the cursor is."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import Qt
from PySide6.QtGui import QStandardItemModel
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
from engines.events import TuneConfig, TuneTarget

INVALID_STYLE = "border: 2px solid #d62828"
BLOCKED_ROLE = Qt.ItemDataRole.UserRole + 1  # why a greyed target cannot start here


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
        self.model.setToolTip(
            "What is tuned: a profile, a model folder or a downloaded model that can start on "
            "this computer, as it is (the tuner makes the settings it tries itself); those that "
            "cannot start here are greyed, with why"
        )
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

    def set_targets(
        self, targets: Sequence[TuneTarget], left_out: Sequence[TuneTarget], default: str
    ) -> None:
        """What can be tuned here (the daemon's list: profiles, model folders, downloaded
        models), then, greyed, what cannot start here with why as its tooltip. The pick stays;
        else ``default`` (the loaded or last-used model); else a loaded one; else the first."""
        current = self.selected_profile()
        items = [(_target_text(t), t.name, t.blocked) for t in (*targets, *left_out)]
        shown = [
            (self.model.itemText(i), self.model.itemData(i), self.model.itemData(i, BLOCKED_ROLE))
            for i in range(self.model.count())
        ]
        if items == shown:
            return
        self.model.blockSignals(True)
        self.model.clear()
        entries = self.model.model()
        assert isinstance(entries, QStandardItemModel)
        for i, (text, name, blocked) in enumerate(items):
            self.model.addItem(text, name)
            self.model.setItemData(i, blocked, BLOCKED_ROLE)
            if blocked:
                entry = entries.item(i)
                entry.setEnabled(False)
                entry.setToolTip(f"{name} cannot start on this computer: {blocked}")
        names = [t.name for t in targets]
        loaded = [t.name for t in targets if t.loaded]
        wanted = next((n for n in (current, default, *loaded) if n in names), None)
        self.model.setCurrentIndex(names.index(wanted) if wanted else (0 if names else -1))
        self.model.blockSignals(False)
        self.model.currentIndexChanged.emit(self.model.currentIndex())

    def selected_profile(self) -> str:
        """The target picked (what TuneConfig.model takes); "" for none or a greyed one."""
        data = self.model.currentData()
        return str(data) if data and not self.model.currentData(BLOCKED_ROLE) else ""

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


def _target_text(t: TuneTarget) -> str:
    """ "tiny (model folder, loaded)"; a greyed one says it cannot start here."""
    kind = {"folder": "model folder", "library": "downloaded model"}.get(t.kind, t.kind)
    said = ", loaded" if t.loaded else (": cannot start here" if t.blocked else "")
    return f"{t.name} ({kind}{said})"


def _combo(name: str) -> QComboBox:
    """A combo box whose long items do not widen the form (the open list shows them whole)."""
    combo = QComboBox()
    combo.setObjectName(name)
    combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
    combo.setMinimumContentsLength(22)
    return combo
