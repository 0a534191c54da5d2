"""A list whose rows fit its width: a long row ends in "…" inside the visible list instead of
running under the vertical scroll bar or needing a sideways one."""

from __future__ import annotations

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, QSize, Qt
from PySide6.QtWidgets import QListView, QStyledItemDelegate, QStyleOptionViewItem


class _RowFitsWidth(QStyledItemDelegate):
    """Asks for no width: the view then gives each row its viewport's width, and the delegate
    elides the text to it."""

    def sizeHint(
        self, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex
    ) -> QSize:
        return QSize(0, super().sizeHint(option, index).height())


def elide_rows(view: QListView) -> None:
    view.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    view.setTextElideMode(Qt.TextElideMode.ElideRight)
    view.setItemDelegate(_RowFitsWidth(view))
