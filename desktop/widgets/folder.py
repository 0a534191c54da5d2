"""Asking for a model folder (Browse… buttons). Views keep the function in an attribute, so that
tests answer for the user instead of a native dialog. The dialog opens where the last model
folder was found."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from PySide6.QtWidgets import QFileDialog, QWidget

from engines.events import LocalFolder

# (parent, where the dialog opens) → the folder, "" when the user cancelled
ChooseFolder = Callable[[QWidget, str], str]


def ask_for_folder(parent: QWidget, start_dir: str = "") -> str:
    return QFileDialog.getExistingDirectory(
        parent, "A model folder (with config.json, the weights and the tokenizer)", start_dir
    )


def start_dir(folders: Sequence[LocalFolder], current: str = "") -> str:
    """Where to look for a model folder: beside the folder ``current`` names (a field's value;
    not a Hub id), else beside the library's most recently added folder ("" when there is none:
    the dialog's own default)."""
    named = Path(current.strip()).expanduser() if current.strip() else None
    if named is not None and named.is_dir():
        return str(named.parent)
    if not folders:
        return ""
    return str(Path(max(folders, key=lambda f: f.added_s).path).parent)
