"""Profiles: the list, and an editor whose every change is checked by the daemon
(``PUT /api/profiles/{name}?dry_run=1``) a moment after typing stops."""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from desktop.daemon.messages import CallResult
from desktop.dashboard.page import PageContext
from desktop.dashboard.profile_form import ProfileForm
from desktop.widgets.confirm import second_click
from desktop.widgets.result_label import COLORS

VALIDATE_AFTER_MS = 300
PRESET_NOTE = "Shipped preset: saving writes your own copy under this name (it takes precedence)."
NAME_ROLE = Qt.ItemDataRole.UserRole
FOLDER_ROLE = Qt.ItemDataRole.UserRole + 1  # a library folder's path (the item is no profile)


class ProfileEditor(QWidget):
    def __init__(self, ctx: PageContext, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self._seq = itertools.count(1)
        self._latest = 0
        self.valid = False
        self._accepted = False  # the last check said valid: its "can start here" follows the list
        self.loaded_name = ""
        self._draft_folder = ""  # the folder a new profile is being made of
        self._drafting = False  # something is in the editor: a list re-read keeps it
        layout = QHBoxLayout(self)
        layout.addLayout(self._list_column())
        layout.addLayout(self._editor_column(), 1)
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(VALIDATE_AFTER_MS)
        self._timer.timeout.connect(self.validate_now)
        ctx.state.profiles_changed.connect(self.on_profiles_changed)
        ctx.state.servable_changed.connect(self.on_servable_changed)
        ctx.state.library_changed.connect(self.on_profiles_changed)
        self.on_profiles_changed()

    def _list_column(self) -> QVBoxLayout:
        left = QVBoxLayout()
        self.list = QListWidget()
        self.list.setObjectName("profileList")
        self.list.setFixedWidth(230)
        self.list.currentItemChanged.connect(self.on_profile_selected)
        left.addWidget(self.list, 1)
        new = QPushButton("New profile")
        new.setObjectName("newProfile")
        new.clicked.connect(self.on_new_clicked)
        left.addWidget(new)
        self.broken = QLabel()
        self.broken.setObjectName("brokenProfiles")
        self.broken.setWordWrap(True)
        left.addWidget(self.broken)
        return left

    def _editor_column(self) -> QVBoxLayout:
        right = QVBoxLayout()
        top = QHBoxLayout()
        top.addWidget(QLabel("Name"))
        self.name = QLineEdit()
        self.name.setObjectName("profileName")
        self.name.setToolTip("Letters, digits, '.', '_' or '-'; the file is profiles/NAME.toml")
        self.name.textChanged.connect(self.schedule_validation)
        top.addWidget(self.name, 1)
        right.addLayout(top)
        self.preset_note = QLabel(PRESET_NOTE)
        self.preset_note.setWordWrap(True)
        self.preset_note.setObjectName("presetNote")
        self.preset_note.setVisible(False)
        right.addWidget(self.preset_note)
        self.form = ProfileForm()
        self.form.library_folders = lambda: self.ctx.state.folders
        self.form.changed.connect(self.schedule_validation)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(self.form)
        right.addWidget(scroll, 1)
        self.validation = QLabel("")
        self.validation.setObjectName("profileValidation")
        self.validation.setWordWrap(True)
        self.validation.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        right.addWidget(self.validation)
        buttons = QHBoxLayout()
        self.save_button = QPushButton("Save")
        self.save_button.setObjectName("saveProfile")
        self.save_button.clicked.connect(self.on_save_clicked)
        self.start_button = QPushButton("Start")
        self.start_button.setObjectName("startProfile")
        self.start_button.clicked.connect(self.on_start_clicked)
        self.delete_button = QPushButton("Delete")
        self.delete_button.setObjectName("deleteProfile")
        self.delete_button.clicked.connect(self.on_delete_clicked)
        for b in (self.save_button, self.start_button, self.delete_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
        right.addLayout(buttons)
        return right

    # ----------------------------------------------------------------- list

    def on_profiles_changed(self) -> None:
        """Re-list; what the editor holds stays (a saved profile or the folder a draft is made
        of stays picked), and the first entry is picked only when it holds nothing."""
        selected = self.loaded_name
        self.list.blockSignals(True)
        self.list.clear()
        for entry in self.ctx.state.profiles:
            item = QListWidgetItem(f"{entry.name}{'  (preset)' if entry.preset else ''}")
            item.setData(NAME_ROLE, entry.name)
            item.setToolTip(entry.description)
            self.list.addItem(item)
            if entry.name == selected:
                self.list.setCurrentItem(item)
        for folder in self.ctx.state.folders:  # servable too: listed, to make a profile of
            item = QListWidgetItem(f"{folder.name}  (model folder)")
            item.setData(NAME_ROLE, folder.name)
            item.setData(FOLDER_ROLE, folder.path)
            served = folder.served_name
            item.setToolTip(
                f"{folder.path}: a library folder served as {served}; pick it to "
                "make a profile of your own from it"
            )
            self.list.addItem(item)
            if not selected and folder.name == self._draft_folder:
                self.list.setCurrentItem(item)
        self.list.blockSignals(False)
        broken = self.ctx.state.broken_profiles
        self.broken.setText("Broken profile files:\n" + "\n".join(broken) if broken else "")
        if not self._drafting and self.list.count():
            self.list.setCurrentRow(0)

    def on_profile_selected(self, item: QListWidgetItem | None, _old: object = None) -> None:
        if item is None:
            return
        folder = item.data(FOLDER_ROLE)
        if folder:
            self.load_folder(str(item.data(NAME_ROLE)), str(folder))
        else:
            self.load_profile(str(item.data(NAME_ROLE)))

    def load_folder(self, name: str, path: str) -> None:
        """A library folder: a new profile from it, named so it never clashes with the name
        the folder is served as (saving makes it; the folder stays as it is)."""
        taken = {p.name for p in self.ctx.state.profiles} | {f.name for f in self.ctx.state.folders}
        new = next(n for n in (f"{name}-custom{i or ''}" for i in range(100)) if n not in taken)
        self.loaded_name = ""
        self._draft_folder, self._drafting = name, True
        self.name.setText(new)
        self.form.load({"device": "auto", "model": path, "served_name": new})
        self.preset_note.setText(
            f"Model folder {name}: saving makes the profile {new} from it (served as {new}); "
            "the folder keeps serving as it is."
        )
        self.preset_note.setVisible(True)
        self.delete_button.setEnabled(False)
        self.validate_now()

    def load_profile(self, name: str) -> None:
        entry = self.ctx.state.profile(name)
        if entry is None:
            return
        self.loaded_name = name
        self._draft_folder, self._drafting = "", True
        self.name.blockSignals(True)
        self.name.setText(name)
        self.name.blockSignals(False)
        self.form.load(entry.fields)
        self.preset_note.setText(PRESET_NOTE)
        self.preset_note.setVisible(entry.preset)
        self.delete_button.setEnabled(not entry.preset)
        self.validate_now()

    def on_new_clicked(self) -> None:
        self.list.clearSelection()
        self.loaded_name = ""
        self._draft_folder, self._drafting = "", True
        self.name.setText("my-profile")
        self.form.load({"device": "auto", "model": ""})
        self.preset_note.setVisible(False)
        self.delete_button.setEnabled(False)
        self.name.setFocus()
        self.name.selectAll()

    def apply_suggestion(self, profile: str, suggested: Mapping[str, str]) -> None:
        """Open ``profile`` and fill in what a diagnosis suggests (then validate)."""
        self.load_profile(profile)
        for field, value in suggested.items():
            self.form.set_value(field, value)
        self.validate_now()

    # ----------------------------------------------------------------- validation

    def schedule_validation(self) -> None:
        self._accepted = False
        self.validation.setText("checking…")
        self._timer.start()

    def validate_now(self) -> None:
        self._timer.stop()
        name = self.name.text().strip()
        body, problems = self.form.values()
        if problems:
            self._show(False, "; ".join(problems))
            return
        if not name:
            self._show(False, "name is required")
            return
        seq = self._latest = next(self._seq)
        self.ctx.bridge.call(
            lambda c: c.save_profile(name, body, dry_run=True),
            lambda r: self._on_checked(seq, r),
        )

    def _on_checked(self, seq: int, result: CallResult) -> None:
        if seq != self._latest:
            return  # an older check answered after a newer one was sent
        self._accepted = result.ok
        if result.ok:
            self._say_accepted()
        else:
            self._show(False, result.error)

    def _say_accepted(self) -> None:
        """ "valid", and whether the profile as saved can start here: the daemon's servable
        list says, and says it again when it changes (a listing can come after the check)."""
        why = self.ctx.state.why_blocked(self.name.text().strip())  # as saved, here
        where = f"; as saved it cannot start on this computer: {why}" if why else ""
        self._show(True, f"✓ valid: the daemon accepts this profile{where}", blocked=bool(why))

    def on_servable_changed(self) -> None:
        if self._accepted:
            self._say_accepted()

    def _show(self, ok: bool, text: str, *, blocked: bool = False) -> None:
        """Green when the profile is valid and can start here, amber when it is valid but
        cannot start on this computer (green read as "all good"), red when it is refused."""
        self.valid = ok
        self.validation.setProperty("valid", ok)
        state = "error" if not ok else "warning" if blocked else "ok"
        self.validation.setStyleSheet(f"color: {COLORS[state]};")
        self.validation.setText(text)
        self.save_button.setEnabled(ok)

    # ----------------------------------------------------------------- actions

    def on_save_clicked(self) -> None:
        name = self.name.text().strip()
        body, _ = self.form.values()

        def saved(result: CallResult) -> None:
            if result.ok:
                self.loaded_name = name
                self.ctx.notifier.notify("info", "Profile saved", name, popup=False)
                self.ctx.actions.reload_profiles()
            else:
                self._show(False, result.error)

        self.ctx.bridge.call(lambda c: c.save_profile(name, body), saved)

    def on_start_clicked(self) -> None:
        name = self.name.text().strip()
        if name:
            self.ctx.actions.start_profile(name)

    def on_delete_clicked(self) -> None:
        name = self.loaded_name
        if not name:
            return
        if not second_click(self.delete_button):
            return
        self.loaded_name = ""
        self._drafting = False  # the list picks its first entry again
        self.ctx.bridge.call(
            lambda c: c.delete_profile(name), lambda _r: self.ctx.actions.reload_profiles()
        )
