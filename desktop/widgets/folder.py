"""Asking for a model folder (Browse… buttons). Views keep the function in an attribute, so that
tests answer for the user instead of a native dialog."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtWidgets import QFileDialog, QWidget

ChooseFolder = Callable[[QWidget], str]  # "" when the user cancelled


def ask_for_folder(parent: QWidget) -> str:
    return QFileDialog.getExistingDirectory(
        parent, "A model folder (with config.json, the weights and the tokenizer)"
    )
