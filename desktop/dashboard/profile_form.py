"""A form generated from the ``Profile`` dataclass: one widget per field, chosen by its type and
bounds, with the field's doc line as tooltip. It turns widget contents into the JSON the control
API validates (``PUT /api/profiles/{name}?dry_run=1``); it does not validate by itself beyond
telling apart what cannot even be parsed."""

from __future__ import annotations

import dataclasses
import shlex
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Union, get_args, get_origin, get_type_hints

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QWidget,
)

from desktop.widgets.folder import ChooseFolder, ask_for_folder, start_dir
from engines.config.fields import doc
from engines.config.profiles import Profile
from engines.events import LocalFolder

SKIPPED = frozenset({"name"})
FieldWidget = QLineEdit | QComboBox | QCheckBox | QPlainTextEdit


def _optional(tp: Any) -> tuple[Any, bool]:
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        return args[0], True
    return tp, False


class ProfileForm(QWidget):
    changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.choose_folder: ChooseFolder = ask_for_folder  # tests answer for the user
        # the library's folders (Browse… opens beside the newest when the field is empty)
        self.library_folders: Callable[[], Sequence[LocalFolder]] = tuple
        self.layout_ = QFormLayout(self)
        self.widgets: dict[str, FieldWidget] = {}
        self.types: dict[str, tuple[Any, bool]] = {}
        hints = get_type_hints(Profile)
        for f in dataclasses.fields(Profile):
            if f.name in SKIPPED:
                continue
            tp, optional = _optional(hints[f.name])
            self.types[f.name] = (tp, optional)
            widget = self._widget(f, tp)
            widget.setObjectName(f"field-{f.name}")
            widget.setToolTip(doc(Profile, f.name))
            self.widgets[f.name] = widget
            label = f.metadata.get("label") or f.name.replace("_", " ")
            if f.name == "model" and isinstance(widget, QLineEdit):
                self.layout_.addRow(label, self._with_browse(widget))
            else:
                self.layout_.addRow(label, widget)
        self.load({})

    def _with_browse(self, line: QLineEdit) -> QHBoxLayout:
        """The model field takes a repo id or a folder: Browse… fills in a folder."""
        row = QHBoxLayout()
        row.addWidget(line, 1)
        browse = QPushButton("Browse…")
        browse.setObjectName("browseModel")
        browse.setToolTip("A model folder on this computer (config.json, weights, tokenizer)")
        browse.clicked.connect(lambda: self.on_browse_clicked(line))
        row.addWidget(browse)
        return row

    def on_browse_clicked(self, line: QLineEdit) -> None:
        folder = self.choose_folder(self, start_dir(self.library_folders(), line.text()))
        if folder:
            line.setText(folder)

    def _widget(self, f: dataclasses.Field[Any], tp: Any) -> FieldWidget:
        choices = f.metadata.get("choices")
        suggestions = f.metadata.get("suggestions")
        if suggestions:  # common values offered, any other typed in; empty means off
            open_combo = QComboBox()
            open_combo.setEditable(True)
            open_combo.addItems(["", *suggestions])
            line_edit = open_combo.lineEdit()
            if line_edit is not None:
                line_edit.setPlaceholderText("off")
            open_combo.currentTextChanged.connect(lambda _t: self.changed.emit())
            return open_combo
        if choices:
            combo = QComboBox()
            combo.addItems(list(choices))
            combo.currentTextChanged.connect(lambda _t: self.changed.emit())
            return combo
        if tp is bool:
            box = QCheckBox()
            box.toggled.connect(lambda _b: self.changed.emit())
            return box
        if get_origin(tp) is dict:
            text = QPlainTextEdit()
            text.setPlaceholderText("KEY=VALUE, one a line")
            text.setMaximumHeight(70)
            text.textChanged.connect(self.changed.emit)
            return text
        line = QLineEdit()
        if get_origin(tp) is tuple:
            line.setPlaceholderText(
                "--flag value --other" if f.name == "extra_flags" else "comma-separated"
            )
        elif f.default is None:
            line.setPlaceholderText("default")
        line.textChanged.connect(lambda _t: self.changed.emit())
        return line

    # ----------------------------------------------------------------- load / read

    def load(self, fields: Mapping[str, object]) -> None:
        defaults = {f.name: _default(f) for f in dataclasses.fields(Profile)}
        for name, widget in self.widgets.items():
            value = fields.get(name, defaults[name])
            widget.blockSignals(True)
            if isinstance(widget, QComboBox):
                widget.setCurrentText(str(value))
            elif isinstance(widget, QCheckBox):
                widget.setChecked(bool(value))
            elif isinstance(widget, QPlainTextEdit):
                env = value if isinstance(value, Mapping) else {}
                widget.setPlainText("\n".join(f"{k}={v}" for k, v in env.items()))
            else:
                widget.setText(_to_text(name, value))
            widget.blockSignals(False)

    def set_value(self, name: str, raw: str) -> None:
        """Put ``raw`` (as a diagnosis suggests it, e.g. "4096") into one field."""
        widget = self.widgets.get(name)
        if isinstance(widget, QLineEdit):
            widget.setText(raw)
        elif isinstance(widget, QComboBox):
            widget.setCurrentText(raw)
        elif isinstance(widget, QCheckBox):
            widget.setChecked(raw.lower() in ("1", "true", "yes", "on"))

    def values(self) -> tuple[dict[str, object], list[str]]:
        """The JSON body for the control API, and problems found while reading the widgets."""
        out: dict[str, object] = {}
        problems: list[str] = []
        for name, widget in self.widgets.items():
            tp, optional = self.types[name]
            if isinstance(widget, QComboBox):
                out[name] = widget.currentText()
            elif isinstance(widget, QCheckBox):
                out[name] = widget.isChecked()
            elif isinstance(widget, QPlainTextEdit):
                env: dict[str, str] = {}
                for line in widget.toPlainText().splitlines():
                    if not line.strip():
                        continue
                    key, sep, val = line.partition("=")
                    if not sep:
                        problems.append(f"env line {line!r} needs KEY=VALUE")
                        continue
                    env[key.strip()] = val.strip()
                out[name] = env
            else:
                text = widget.text().strip()
                if not text:
                    if optional:
                        out[name] = None
                    elif tp is str or get_origin(tp) is tuple:
                        out[name] = () if get_origin(tp) is tuple else ""
                    continue
                out[name] = _parse(name, tp, text, problems)
        return out, problems


def _default(f: dataclasses.Field[Any]) -> object:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _to_text(name: str, value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, tuple | list):
        if name == "extra_flags":
            return shlex.join(str(v) for v in value)
        return ", ".join(str(v) for v in value)
    if isinstance(value, float) and value.is_integer() and name != "gpu_memory_utilization":
        return str(value)
    return str(value)


def _parse(name: str, tp: Any, text: str, problems: list[str]) -> object:
    if tp is int:
        try:
            return int(text)
        except ValueError:
            return text  # the daemon answers "must be a whole number"
    if tp is float:
        try:
            return float(text)
        except ValueError:
            return text
    if get_origin(tp) is tuple:
        if name == "extra_flags":
            try:
                return shlex.split(text)
            except ValueError as exc:
                problems.append(f"extra_flags: {exc}")
                return []
        items = [p.strip() for p in text.replace(";", ",").split(",") if p.strip()]
        (item_type,) = get_args(tp)[:1]
        if item_type is int:
            parsed: list[object] = []
            for item in items:
                try:
                    parsed.append(int(item))
                except ValueError:
                    parsed.append(item)
            return parsed
        return items
    return text
