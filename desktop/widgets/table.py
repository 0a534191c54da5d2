"""The read-only, row-selecting table every dashboard list uses."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableWidget

SelectionMode = QAbstractItemView.SelectionMode


def read_only_table(
    columns: Sequence[str],
    object_name: str,
    *,
    stretch_column: int | None = None,
    selection: SelectionMode = SelectionMode.SingleSelection,
    on_select: Callable[[], None] | None = None,
) -> QTableWidget:
    """Columns sized to their contents; ``stretch_column`` (default: the last) takes the rest."""
    table = QTableWidget(0, len(columns))
    table.setObjectName(object_name)
    table.setHorizontalHeaderLabels(list(columns))
    header = table.horizontalHeader()
    header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    if stretch_column is None:
        header.setStretchLastSection(True)
    else:
        header.setSectionResizeMode(stretch_column, QHeaderView.ResizeMode.Stretch)
    table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    table.setSelectionMode(selection)
    table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    table.verticalHeader().setVisible(False)
    if on_select is not None:
        table.itemSelectionChanged.connect(on_select)
    return table
