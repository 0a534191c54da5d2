"""The conversation as widgets: one bubble per message (Markdown text, code blocks with a Copy
button, per-reply TTFT and tokens/s), an inline error card with its fix, and the scroll area
that holds them and follows a streaming reply."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QFontDatabase, QGuiApplication, QTextOption
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from desktop.chat.images import Thumbnails
from desktop.chat.markdown import Block, split_blocks
from desktop.chat.tool_calls import Run, ToolCallView
from desktop.daemon.fixes import in_words
from desktop.look.theme import text_label
from engines.events import ChatMessage

CODE_MAX_LINES = 30
CODE_WRAP_HINT_CHARS = 90  # longer lines likely need the horizontal scroll bar


def stats_text(stats: Mapping[str, float], finish: str) -> str:
    parts: list[str] = []
    ttft, rate, tokens = (
        stats.get("ttft_s"),
        stats.get("tokens_per_s"),
        stats.get("completion_tokens"),
    )
    load = stats.get("load_s")
    if load is not None:
        parts.append(f"loaded in {load:.1f} s")
    if ttft is not None:
        parts.append(f"TTFT {ttft:.2f} s")
    if rate is not None:
        parts.append(f"{rate:.1f} tok/s")
    if tokens is not None:
        parts.append(f"{int(tokens)} tokens")
    if finish == "stopped":
        parts.append("reply stopped by you")
    elif finish == "length":
        parts.append("cut at max tokens")
    elif finish == "context":
        parts.append("cut: the model's context is full")
    elif finish in ("error", "interrupted"):
        parts.append("interrupted")
    return " · ".join(parts)


class CodeBlockView(QFrame):
    def __init__(self, block: Block, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("codeBlock")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 4, 6, 6)
        layout.setSpacing(2)
        header = QHBoxLayout()
        self.language = QLabel(block.language or "code")
        self.language.setObjectName("codeLanguage")
        header.addWidget(self.language)
        header.addStretch(1)
        self.copy_button = QPushButton("Copy")
        self.copy_button.setObjectName("copyCode")
        self.copy_button.setCursor(Qt.CursorShape.PointingHandCursor)
        self.copy_button.clicked.connect(self.on_copy_clicked)
        header.addWidget(self.copy_button)
        layout.addLayout(header)
        self.editor = QPlainTextEdit()
        self.editor.setReadOnly(True)
        self.editor.setWordWrapMode(QTextOption.WrapMode.NoWrap)
        self.editor.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.editor.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        layout.addWidget(self.editor)
        self.set_block(block)

    def set_block(self, block: Block) -> None:
        self.language.setText(block.language or "code")
        if self.editor.toPlainText() != block.text:
            self.editor.setPlainText(block.text)
        rows = block.text.split("\n")
        lines = min(max(len(rows), 1), CODE_MAX_LINES)
        metrics = self.editor.fontMetrics()
        margin = int(self.editor.document().documentMargin() * 2) + 2 * self.editor.frameWidth()
        wide = max((len(r) for r in rows), default=0) > CODE_WRAP_HINT_CHARS
        scroll = self.editor.horizontalScrollBar().sizeHint().height() if wide else 0
        self.editor.setFixedHeight(lines * metrics.lineSpacing() + margin + scroll + 2)
        if lines >= CODE_MAX_LINES:
            self.editor.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)

    def on_copy_clicked(self) -> None:
        QGuiApplication.clipboard().setText(self.editor.toPlainText())
        self.copy_button.setText("Copied")
        QTimer.singleShot(1500, self.copy_button, lambda: self.copy_button.setText("Copy"))


def _text_label(text: str, *, markdown: bool = True) -> QLabel:
    label = QLabel()
    label.setObjectName("messageText")
    label.setTextFormat(Qt.TextFormat.MarkdownText if markdown else Qt.TextFormat.PlainText)
    label.setWordWrap(True)
    label.setOpenExternalLinks(True)
    label.setTextInteractionFlags(
        Qt.TextInteractionFlag.TextSelectableByMouse | Qt.TextInteractionFlag.LinksAccessibleByMouse
    )
    label.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
    label.setText(text)
    return label


class MessageView(QFrame):
    """One message. ``edit_requested``/``regenerate_requested`` carry its position."""

    edit_requested = Signal(int)
    regenerate_requested = Signal(int)

    def __init__(self, role: str, title: str, position: int, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.role = role
        self.position = position
        self.setObjectName(f"message-{role}")
        self.setProperty("role", role)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(10, 6, 10, 8)
        outer.setSpacing(4)
        header = QHBoxLayout()
        self.title = QLabel(f"<b>{title}</b>")
        header.addWidget(self.title)
        self.stats = QLabel("")
        self.stats.setObjectName("messageStats")
        header.addWidget(self.stats)
        header.addStretch(1)
        self.buttons: dict[str, QToolButton] = {}
        for name, text in (
            ("copy", "Copy"),
            ("edit", "Edit"),
            ("regenerate", "Regenerate"),
            ("retry", "Retry"),
        ):
            button = QToolButton()
            button.setText(text)
            button.setObjectName(f"{name}Message")
            button.setAutoRaise(True)
            button.setCursor(Qt.CursorShape.PointingHandCursor)
            button.setVisible(False)
            header.addWidget(button)
            self.buttons[name] = button
        self.buttons["copy"].setVisible(True)
        self.buttons["copy"].clicked.connect(self.on_copy_clicked)
        self.buttons["edit"].clicked.connect(lambda: self.edit_requested.emit(self.position))
        for name in ("regenerate", "retry"):
            self.buttons[name].clicked.connect(
                lambda: self.regenerate_requested.emit(self.position)
            )
        outer.addLayout(header)
        self.left_out_note = QLabel("Left out of what the model sees, to fit its context")
        self.left_out_note.setObjectName("leftOutNote")
        self.left_out_note.setVisible(False)
        outer.addWidget(self.left_out_note)
        self.images = Thumbnails(removable=False)
        outer.addWidget(self.images)
        self.tools = QVBoxLayout()  # the tool calls a reply made, before its text
        outer.addLayout(self.tools)
        self.body = QVBoxLayout()
        self.body.setSpacing(6)
        outer.addLayout(self.body)
        self._blocks: tuple[Block, ...] = ()
        self._views: list[QWidget] = []
        self.text = ""

    def set_left_out(self, left_out: bool) -> None:
        """Greyed with a note while the chat leaves this message out of its requests."""
        if bool(self.property("leftOut")) == left_out:
            return
        self.setProperty("leftOut", left_out)
        self.left_out_note.setVisible(left_out)
        self.style().unpolish(self)
        self.style().polish(self)

    def show_images(self, images: tuple[str, ...]) -> None:
        """The pictures the message carries, as thumbnails above its text."""
        self.images.set_images(images)

    def show_tools(self, runs: Sequence[Run]) -> None:
        """The tool calls the reply made, each with its result collapsed."""
        for run in runs:
            self.tools.addWidget(ToolCallView(run))

    def set_text(self, text: str) -> None:
        self.text = text
        # what the user typed is shown as typed (its line breaks kept); replies are Markdown
        markdown = self.role != "user"
        blocks = (split_blocks(text) if markdown else (Block("text", text),)) or (
            Block("text", ""),
        )
        same_shape = len(blocks) == len(self._blocks) and all(
            a.kind == b.kind for a, b in zip(blocks, self._blocks, strict=True)
        )
        if not same_shape:
            for view in self._views:
                view.deleteLater()
            self._views = []
            for block in blocks:
                widget: QWidget = (
                    CodeBlockView(block)
                    if block.kind == "code"
                    else _text_label(block.text, markdown=markdown)
                )
                self.body.addWidget(widget)
                self._views.append(widget)
        else:
            for view, old, new in zip(self._views, self._blocks, blocks, strict=True):
                if old == new:
                    continue
                if isinstance(view, CodeBlockView):
                    view.set_block(new)
                elif isinstance(view, QLabel):
                    view.setText(new.text)
        self._blocks = blocks

    def set_stats(self, text: str) -> None:
        self.stats.setText(text)

    def allow(self, *, edit: bool = False, regenerate: bool = False, retry: bool = False) -> None:
        self.buttons["edit"].setVisible(edit)
        self.buttons["regenerate"].setVisible(regenerate and not retry)
        self.buttons["retry"].setVisible(retry)

    def on_copy_clicked(self) -> None:
        QGuiApplication.clipboard().setText(self.text)


class ErrorCard(QFrame):
    """What went wrong, in words, and buttons that fix it."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("errorCard")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 8, 10, 8)
        self.title = QLabel("<b>⚠ No reply</b>")
        self.title.setObjectName("errorTitle")
        layout.addWidget(self.title)
        self.message = QLabel()
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.message)
        self.row = QHBoxLayout()
        layout.addLayout(self.row)
        self.hint = text_label("errorHint", "hint")
        layout.addWidget(self.hint)
        self.buttons: list[QPushButton] = []

    def show_error(
        self,
        text: str,
        fixes: Sequence[tuple[str, str, Callable[[], None]]],
        *,
        cli: str = "",
    ) -> None:
        """``fixes``: (object name, label, slot) for each button; ``cli``: the same fix as a
        command, shown under them as a hint."""
        self.message.setText(in_words(text))
        self.hint.setText(f"or in a terminal: {cli}" if cli else "")
        self.hint.setVisible(bool(cli))
        for button in self.buttons:
            button.deleteLater()
        self.buttons = []
        while self.row.count():
            self.row.takeAt(0)
        for name, label, slot in fixes:
            button = QPushButton(label)
            button.setObjectName(name)
            button.clicked.connect(lambda _c=False, s=slot: s())
            self.row.addWidget(button)
            self.buttons.append(button)
        self.row.addStretch(1)
        self.setVisible(True)

    def button(self, name: str) -> QPushButton | None:
        return next((b for b in self.buttons if b.objectName() == name), None)


class TranscriptView(QScrollArea):
    """All messages of the open conversation plus the reply streaming in."""

    edit_requested = Signal(int)
    regenerate_requested = Signal(int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("transcript")
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        inner = QWidget()
        inner.setObjectName("transcriptInner")
        self.column = QVBoxLayout(inner)
        self.column.setContentsMargins(12, 12, 12, 12)
        self.column.setSpacing(10)
        self.placeholder = QLabel(
            "Ask something. Enter sends, Shift+Enter starts a new line, Esc stops a reply.\n"
            "The conversation is kept by the traylm daemon."
        )
        self.placeholder.setObjectName("placeholder")
        self.placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.column.addWidget(self.placeholder)
        self.error_card = ErrorCard()
        self.error_card.setVisible(False)
        self.column.addWidget(self.error_card)
        self.column.addStretch(1)
        self.setWidget(inner)
        self.messages: list[MessageView] = []
        self.retry_view: MessageView | None = None
        self.streaming: MessageView | None = None
        self._follow = True
        self.system_view: MessageView | None = None
        self.extras: list[QWidget] = []  # the streaming reply's tool calls and notices
        self._chat_id: int | None = None
        self.verticalScrollBar().rangeChanged.connect(self.on_range_changed)
        self.verticalScrollBar().valueChanged.connect(self.on_scrolled)

    def _insert(self, view: QWidget) -> None:
        self.column.insertWidget(self.column.indexOf(self.error_card), view)

    def add_extra(self, view: QWidget) -> None:
        """A tool call or notice of the reply being made (gone when the chat is shown anew:
        the stored reply shows its tool calls itself)."""
        self._insert(view)
        self.extras.append(view)
        self.placeholder.setVisible(False)
        self._follow = True

    def set_messages(self, messages: Sequence[ChatMessage], assistant_name: str) -> None:
        self.clear_streaming()
        chat_id = messages[0].chat_id if messages else None
        # notices (a server that did not start) stay while the same chat is shown, after its
        # messages; the live tool calls go: the stored reply shows them itself
        kept = [e for e in self.extras if e.objectName() == "toolNotice"]
        kept = kept if chat_id is not None and chat_id == self._chat_id else []
        for extra in self.extras:
            if extra in kept:
                self.column.removeWidget(extra)
            else:
                extra.deleteLater()
        self.extras = []
        self._chat_id = chat_id
        for view in self.messages:
            view.deleteLater()
        self.messages = []
        last_user = max((m.position for m in messages if m.role == "user"), default=-1)
        last = messages[-1].position if messages else -1
        self.retry_view = None
        for msg in messages:
            title = "You" if msg.role == "user" else (msg.model or assistant_name or msg.role)
            if msg.role == "system":
                title = "System"
            view = MessageView(msg.role, title, msg.position)
            view.set_text(msg.content)
            view.show_images(msg.images)
            view.show_tools(msg.tools)
            view.set_stats(stats_text(msg.stats, msg.finish_reason))
            # the last message unanswered (the app or the daemon died before the reply) or
            # answered only in part: Retry asks for a (new) reply
            unfinished = msg.position == last and (
                msg.role == "user" or msg.finish_reason == "interrupted"
            )
            view.allow(
                edit=msg.role == "user" and msg.position == last_user,
                regenerate=msg.role == "assistant" and msg.position == last,
                retry=unfinished,
            )
            if unfinished:
                self.retry_view = view
            view.edit_requested.connect(self.edit_requested)
            view.regenerate_requested.connect(self.regenerate_requested)
            self._insert(view)
            self.messages.append(view)
        for notice in kept:
            self.add_extra(notice)
        self.placeholder.setVisible(not messages)
        self._follow = True

    def mark_left_out(self, positions: frozenset[int]) -> None:
        for view in self.messages:
            view.set_left_out(view.position in positions)

    def show_system_prompt(self, text: str) -> None:
        """The chat's system prompt (a summary of an earlier chat, say) above its messages,
        where the user sees it; none, no card."""
        if self.system_view is None:
            self.system_view = MessageView("system", "System prompt (under Parameters)", -1)
            self.column.insertWidget(0, self.system_view)
        self.system_view.set_text(text)
        self.system_view.setVisible(bool(text.strip()))

    def offer_retry(self, on: bool) -> None:
        """Retry is offered only while no reply streams."""
        if self.retry_view is not None:
            self.retry_view.buttons["retry"].setVisible(on)

    def hide_from(self, position: int) -> None:
        """While regenerating, the old reply at ``position`` and after is hidden."""
        for view in self.messages:
            view.setVisible(view.position < position)

    def begin_streaming(self, model: str) -> MessageView:
        self.clear_streaming()
        self.placeholder.setVisible(False)
        view = MessageView("assistant", model, -1)
        view.buttons["copy"].setVisible(False)
        view.set_text("")
        view.set_stats("waiting for the first token…")
        self._insert(view)
        self.streaming = view
        self._follow = True
        return view

    def clear_streaming(self) -> None:
        if self.streaming is not None:
            self.streaming.deleteLater()
            self.streaming = None

    def on_range_changed(self, _min: int, maximum: int) -> None:
        if self._follow:
            self.verticalScrollBar().setValue(maximum)

    def on_scrolled(self, value: int) -> None:
        self._follow = value >= self.verticalScrollBar().maximum() - 24
