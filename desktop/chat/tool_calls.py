"""The chat's tool calls on screen: each call with its arguments and the user's three answers
(Allow once / Always allow this tool / Deny), its result collapsed under a toggle, notices (a
server that did not start, a model that cannot call tools) in the transcript, and the Tools
menu (the configured MCP servers; import another app's mcpServers file)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from PySide6.QtCore import Signal
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QMenu,
    QPlainTextEdit,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from desktop.chat.mcp_config import MCPServerConfig, config_path, import_file, load_servers
from desktop.chat.tool_loop import ALLOW_ONCE, ALWAYS, DENY, ToolLoop, ToolRun
from desktop.daemon.bridge import Bridge
from desktop.daemon.fixes import in_words
from desktop.daemon.messages import CallResult
from engines.errors import ConfigError

OUTCOMES = {"allowed": "ran", "denied": "denied by you", "failed": "failed"}


class Run(Protocol):
    """A tool call as shown: the loop's ToolRun, or a stored ChatToolRun."""

    @property
    def name(self) -> str: ...
    @property
    def server(self) -> str: ...
    @property
    def arguments(self) -> str: ...
    @property
    def outcome(self) -> str: ...
    @property
    def result(self) -> str: ...


def _pretty(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except ValueError:
        return arguments


class ToolCallView(QFrame):
    """One tool call. While it waits, ``answered`` carries the user's answer."""

    answered = Signal(str)  # ALLOW_ONCE | ALWAYS | DENY

    def __init__(self, run: Run, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("toolCall")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 4, 8, 6)
        where = f" · {run.server}" if run.server else ""
        header = QHBoxLayout()
        self.title = QLabel(f"<b>Tool call: {run.name}</b>{where}")
        header.addWidget(self.title)
        self.state = QLabel("")
        self.state.setObjectName("toolOutcome")
        header.addWidget(self.state)
        header.addStretch(1)
        layout.addLayout(header)
        self.arguments = QLabel(_pretty(run.arguments))
        self.arguments.setObjectName("toolArguments")
        self.arguments.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.arguments.setWordWrap(True)
        layout.addWidget(self.arguments)
        self.buttons: dict[str, QPushButton] = {}
        row = QHBoxLayout()
        for decision, text, name in (
            (ALLOW_ONCE, "Allow once", "allowOnce"),
            (ALWAYS, "Always allow this tool", "alwaysAllow"),
            (DENY, "Deny", "denyTool"),
        ):
            button = QPushButton(text)
            button.setObjectName(name)
            button.clicked.connect(lambda _c=False, d=decision: self.on_answer_clicked(d))
            row.addWidget(button)
            self.buttons[decision] = button
        row.addStretch(1)
        layout.addLayout(row)
        self.result_toggle = QToolButton()
        self.result_toggle.setObjectName("toolResultToggle")
        self.result_toggle.setCheckable(True)
        self.result_toggle.setAutoRaise(True)
        self.result_toggle.toggled.connect(self.on_result_toggled)
        layout.addWidget(self.result_toggle)
        self.result = QPlainTextEdit()
        self.result.setObjectName("toolResult")
        self.result.setReadOnly(True)
        self.result.setMaximumHeight(160)
        layout.addWidget(self.result)
        self.show_outcome(run.outcome, run.result)

    def show_outcome(self, outcome: str, result: str) -> None:
        waiting = not outcome
        for button in self.buttons.values():
            button.setVisible(waiting)
        self.state.setText(f"— {OUTCOMES.get(outcome, outcome)}" if outcome else "— allow it?")
        self.result.setPlainText(result)
        self.result_toggle.setVisible(bool(outcome))
        self.result_toggle.setChecked(False)  # collapsed until asked for
        self.on_result_toggled(False)

    def show_running(self) -> None:
        for button in self.buttons.values():
            button.setVisible(False)
        self.state.setText("— running…")

    def on_answer_clicked(self, decision: str) -> None:
        if decision == DENY:
            self.state.setText("— denied by you")
            for button in self.buttons.values():
                button.setVisible(False)
        else:
            self.show_running()
        self.answered.emit(decision)

    def on_result_toggled(self, shown: bool) -> None:
        self.result.setVisible(shown)
        self.result_toggle.setText(("▾ " if shown else "▸ ") + "Result")


def notice_label(text: str) -> QLabel:
    """A line in the transcript about the tools (not from the model)."""
    label = QLabel(in_words(text))
    label.setObjectName("toolNotice")
    label.setWordWrap(True)
    return label


class ToolCallsShown:
    """Puts the loop's calls and notices into the transcript (``insert``) as they come."""

    def __init__(self, loop: ToolLoop, insert: Callable[[QWidget], None]) -> None:
        self.loop = loop
        self.insert = insert
        self.views: dict[str, ToolCallView] = {}
        loop.asked.connect(self.on_tool_asked)
        loop.ran.connect(self.on_tool_ran)
        loop.noticed.connect(lambda text: self.insert(notice_label(text)))

    def _new_view(self, run: ToolRun) -> ToolCallView:
        view = ToolCallView(run)
        self.insert(view)
        return view

    def on_tool_asked(self, run: ToolRun) -> None:
        view = self.views[run.call_id] = self._new_view(run)
        view.answered.connect(lambda decision: self.loop.answer(run.call_id, decision))

    def on_tool_ran(self, run: ToolRun) -> None:
        """Its result (a call always allowed was not asked: it is shown now)."""
        view = self.views.pop(run.call_id, None) or self._new_view(run)
        view.show_outcome(run.outcome, run.result)

    def forget(self) -> None:
        """The transcript was rebuilt (the views went with it)."""
        self.views.clear()


class ToolsButton(QToolButton):
    """The chat's Tools menu: its MCP servers, and Import. ``choose_file`` picks the file to
    import (a file dialog; tests replace it)."""

    imported = Signal(str)  # what the import did, to say

    def __init__(self, bridge: Bridge, loop: ToolLoop, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.bridge = bridge
        self.loop = loop
        self.setObjectName("toolsButton")
        self.setText("Tools")
        self.setToolTip("MCP servers whose tools the model may call (each call asks you first)")
        self.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.setMenu(QMenu(self))
        self.menu().aboutToShow.connect(self.on_menu_shown)
        self.choose_file: Callable[[], str] = self._ask_file
        self.on_menu_shown()

    def on_menu_shown(self) -> None:
        menu = self.menu()
        menu.clear()
        try:
            servers: tuple[MCPServerConfig, ...] = load_servers(self.bridge.paths)
            note = "" if servers else "No MCP servers yet"
        except ConfigError as exc:
            servers, note = (), f"mcp.json cannot be read: {exc.message}"
        for server in servers:
            where = server.url or " ".join((server.command, *server.args))
            menu.addAction(f"{server.name} — {where}"[:90]).setEnabled(False)
        if note:
            menu.addAction(note).setEnabled(False)
        menu.addSeparator()
        action = menu.addAction("Import MCP servers from a file…")
        action.setObjectName("importMcp")
        action.triggered.connect(self.on_import_clicked)

    def _ask_file(self) -> str:
        path, _filter = QFileDialog.getOpenFileName(
            self,
            "Import MCP servers (Claude Desktop, LM Studio: an mcpServers .json file)",
            str(Path.home()),
            "JSON (*.json);;All files (*)",
        )
        return path

    def on_import_clicked(self) -> None:
        path = self.choose_file()
        if not path:
            return
        paths = self.bridge.paths

        async def run(_gateway: object) -> int:
            return len(await asyncio.to_thread(import_file, paths, Path(path)))

        self.bridge.call_gateway(run, self._on_imported)

    def _on_imported(self, result: CallResult) -> None:
        if result.ok and isinstance(result.value, int):
            self.loop.close()  # the next chat sent with tools starts the servers anew
            where = config_path(self.bridge.paths)
            self.imported.emit(f"{result.value} MCP server(s) configured now (kept in {where})")
        else:
            self.imported.emit(f"Nothing was imported: {result.error}")
