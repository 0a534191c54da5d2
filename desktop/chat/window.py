"""The chat window: conversations on the left; model, parameters, the transcript and the
composer on the right. Enter sends (Shift+Enter starts a new line), Esc stops a streaming reply
or cancels an edit."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import cast

from PySide6.QtCore import QEvent, QObject, Qt, QTimer
from PySide6.QtGui import QCloseEvent, QKeyEvent, QKeySequence, QShortcut, QStandardItemModel
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QMenu,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QSplitter,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from desktop.chat.context import DROP_OLDEST, KEEP_FIRST, POLICIES, context_text, full_text
from desktop.chat.controller import ChatController, ChatOptions, Streaming
from desktop.chat.images import (
    IMAGE_FILES,
    MAX_IMAGES,
    ImageComposer,
    Thumbnails,
    data_url,
    read_image,
)
from desktop.chat.start_card import StartCard
from desktop.chat.tool_calls import ToolCallsShown, ToolsButton, notice_label
from desktop.chat.transcript import TranscriptView, stats_text
from desktop.daemon.actions import Actions
from desktop.daemon.bridge import Bridge
from desktop.daemon.fixes import Fix, fix_for
from desktop.daemon.gateway import ChatError, ChatStreamEnded
from desktop.daemon.keyfile import read_key, write_key
from desktop.daemon.state import AppState
from desktop.daemon.terminal import AGENTS, find_terminal, open_agent
from desktop.look.theme import primary
from desktop.widgets.banner import ConnectionBanner
from desktop.widgets.confirm import second_click
from desktop.widgets.elided_label import ElidedLabel
from desktop.widgets.elided_list import elide_rows
from desktop.widgets.sizing import resize_within_screen

NO_MODEL = "(no model served)"
SERVERS_STOP_S = 10.0  # how long quitting waits for the MCP servers to end
CHAT_ID_ROLE = Qt.ItemDataRole.UserRole


class ChatWindow(QMainWindow):
    def __init__(
        self,
        bridge: Bridge,
        state: AppState,
        actions: Actions,
        *,
        run_fix: Callable[[Fix], None] = lambda _fix: None,
        open_setup: Callable[[], object] = lambda: None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setObjectName("chatWindow")
        self.setWindowTitle("traylm — Chat")
        resize_within_screen(self, 1000, 720)
        self.state = state
        self.app_actions = actions
        self.bridge = bridge
        self.controller = ChatController(bridge, state, self)
        self.editing: int | None = None
        self._draft = ""  # what the composer held before Edit (Cancel puts it back)
        self._shown_chat: int | None = None
        self.run_fix = run_fix
        self.open_setup = open_setup
        self._answered: Callable[[bool], None] | None = None
        self._build()
        self.start_card = StartCard(
            self.transcript.error_card,
            state,
            self.controller,
            start_again=self.on_start_fix,
            run_fix=run_fix,
            parent=self,
        )
        c = self.controller
        c.chats_changed.connect(self.on_chats_changed)
        c.transcript_changed.connect(self.on_transcript_changed)
        c.models_changed.connect(self.on_models_changed)
        c.stream_started.connect(self.on_stream_started)
        c.stream_delta.connect(self.on_stream_delta)
        c.stream_loading.connect(self.on_stream_loading)
        c.stream_ended.connect(self.on_stream_ended)
        c.error_raised.connect(self.on_error_raised)
        c.error_cleared.connect(lambda: self.transcript.error_card.setVisible(False))
        self.tool_calls = ToolCallsShown(c.tools, self.transcript.add_extra)
        c.transcript_changed.connect(self.tool_calls.forget)
        self.tools_button.imported.connect(lambda t: self.transcript.add_extra(notice_label(t)))
        key = read_key(bridge.paths)
        if key:
            c.set_api_key(key)
        if state.connected:
            c.load_chats()
            c.load_models()
        self.on_models_changed()
        self._update_buttons()

    # ----------------------------------------------------------------- layout

    def _build(self) -> None:
        splitter = QSplitter()
        splitter.addWidget(self._sidebar())
        splitter.addWidget(self._main_column())
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([230, 770])
        central = QWidget()
        layout = QVBoxLayout(central)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        self.banner = ConnectionBanner(self.state, self.app_actions)
        layout.addWidget(self.banner)
        layout.addWidget(splitter)
        self.setCentralWidget(central)
        QShortcut(QKeySequence("Ctrl+Return"), self, self.on_send_clicked)
        QShortcut(QKeySequence("Ctrl+Enter"), self, self.on_send_clicked)
        QShortcut(QKeySequence(Qt.Key.Key_Escape), self, self.on_escape_pressed)

    def _sidebar(self) -> QWidget:
        side = QWidget()
        layout = QVBoxLayout(side)
        layout.setContentsMargins(8, 8, 4, 8)
        self.new_button = QPushButton("New chat")
        self.new_button.setObjectName("newChat")
        self.new_button.clicked.connect(self.on_new_clicked)
        layout.addWidget(self.new_button)
        self.chat_list = QListWidget()
        self.chat_list.setObjectName("chatList")
        elide_rows(self.chat_list)  # a long title ends in "…" (whole in its tooltip)
        self.chat_list.itemClicked.connect(self.on_chat_clicked)
        layout.addWidget(self.chat_list, 1)
        self.delete_button = QPushButton("Delete")
        self.delete_button.setObjectName("deleteChat")
        self.delete_button.clicked.connect(self.on_delete_clicked)
        layout.addWidget(self.delete_button)
        return side

    def _main_column(self) -> QWidget:
        main = QWidget()
        layout = QVBoxLayout(main)
        layout.setContentsMargins(4, 8, 8, 8)
        top = QHBoxLayout()
        top.addWidget(QLabel("Model"))
        self.model_picker = QComboBox()
        self.model_picker.setObjectName("modelPicker")
        self.model_picker.setMinimumWidth(240)
        top.addWidget(self.model_picker, 1)
        refresh = QToolButton()
        refresh.setText("↻")
        refresh.setToolTip("Reload the list of served models")
        refresh.clicked.connect(self.controller.load_models)
        top.addWidget(refresh)
        top.addWidget(self._agents_button())
        self.params_toggle = QToolButton()
        self.params_toggle.setText("Parameters")
        self.params_toggle.setCheckable(True)
        self.params_toggle.setObjectName("paramsToggle")
        top.addWidget(self.params_toggle)
        self.tools_button = ToolsButton(self.bridge, self.controller.tools)
        top.addWidget(self.tools_button)
        layout.addLayout(top)
        layout.addWidget(self._params_panel())
        self.transcript = TranscriptView()
        self.transcript.edit_requested.connect(self.on_edit_requested)
        self.transcript.regenerate_requested.connect(lambda _p: self.controller.regenerate())
        layout.addWidget(self.transcript, 1)
        layout.addWidget(self._edit_bar())
        self.pending = Thumbnails(removable=True)
        self.pending.setObjectName("pendingImages")
        layout.addWidget(self.pending)
        self.image_note = QLabel("")
        self.image_note.setObjectName("imageNote")
        self.image_note.setWordWrap(True)
        self.image_note.setVisible(False)
        layout.addWidget(self.image_note)
        self.pending.changed.connect(self.on_pending_changed)
        self.model_picker.currentTextChanged.connect(lambda _model: self.on_pending_changed())
        layout.addLayout(self._composer_row())
        bottom = QHBoxLayout()
        self.status = ElidedLabel("")
        self.status.setObjectName("chatStatus")
        bottom.addWidget(self.status, 1)
        self.context_label = QLabel("")  # how full the model's context is
        self.context_label.setObjectName("contextUsage")
        bottom.addWidget(self.context_label)
        layout.addLayout(bottom)
        return main

    def _agents_button(self) -> QToolButton:
        """An agent CLI in a terminal with the picked model (`traylm launch AGENT --model M`);
        hidden where no terminal emulator is installed."""
        button = QToolButton()
        button.setText("Agents")
        button.setObjectName("agentsButton")
        button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        menu = QMenu(button)
        menu.setObjectName("agentsMenu")
        for agent, title in AGENTS:
            action = menu.addAction(f"Open {title} in a terminal")
            action.setObjectName(f"agent:{agent}")
            action.triggered.connect(lambda _c=False, a=agent: open_agent(a, self._agent_model()))
        button.setMenu(menu)
        button.setVisible(find_terminal() is not None)
        return button

    def _agent_model(self) -> str:
        model = self.model_picker.currentText()
        return "" if model == NO_MODEL else model

    def _edit_bar(self) -> QWidget:
        """Shown while a message is edited: what Send will replace, and a way back."""
        self.edit_note = QFrame()
        self.edit_note.setObjectName("editNote")
        row = QHBoxLayout(self.edit_note)
        row.setContentsMargins(6, 4, 6, 4)
        self.edit_text = QLabel(
            "Editing your last message: Send replaces it and the reply after it."
        )
        self.edit_text.setWordWrap(True)
        row.addWidget(self.edit_text, 1)
        self.cancel_edit_button = QPushButton("Cancel edit")
        self.cancel_edit_button.setObjectName("cancelEdit")
        self.cancel_edit_button.setToolTip("Esc: keep the message and its reply as they are")
        self.cancel_edit_button.clicked.connect(self.on_cancel_edit_clicked)
        row.addWidget(self.cancel_edit_button)
        self.edit_note.setVisible(False)
        return self.edit_note

    def _composer_row(self) -> QHBoxLayout:
        row = QHBoxLayout()
        self.composer = ImageComposer()
        self.composer.setObjectName("composer")
        self.composer.setPlaceholderText(
            "Message (Enter sends, Shift+Enter new line, Esc stops; paste or drop an image)"
        )
        self.composer.image_added.connect(self.on_image_added)
        self.composer.setMaximumHeight(110)
        self.composer.installEventFilter(self)
        row.addWidget(self.composer, 1)
        buttons = QVBoxLayout()
        self.send_button = primary(QPushButton("Send"))
        self.send_button.setObjectName("send")
        self.send_button.setToolTip("Enter (Shift+Enter starts a new line)")
        self.send_button.clicked.connect(self.on_send_clicked)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setObjectName("stop")
        self.stop_button.setToolTip("Esc")
        self.stop_button.clicked.connect(self.on_stop_clicked)
        self.image_button = QPushButton("Image…")
        self.image_button.setObjectName("attachImage")
        self.image_button.setToolTip(
            "Add a picture for a vision model (you can also paste or drop one on the message)"
        )
        self.image_button.clicked.connect(self.on_image_clicked)
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        buttons.addWidget(self.image_button)
        buttons.addStretch(1)
        row.addLayout(buttons)
        return row

    def _params_panel(self) -> QWidget:
        panel = QFrame()
        panel.setObjectName("paramsPanel")
        form = QFormLayout(panel)
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setObjectName("systemPrompt")
        self.system_prompt.setPlaceholderText("System prompt (optional)")
        self.system_prompt.setMaximumHeight(70)
        form.addRow("System prompt", self.system_prompt)
        self.temperature = QDoubleSpinBox(decimals=2, minimum=0.0, maximum=2.0, singleStep=0.1)
        self.temperature.setValue(0.7)
        self.temperature.setToolTip("Sampling temperature: 0 is deterministic, higher is freer")
        self.top_p = QDoubleSpinBox(decimals=2, minimum=0.0, maximum=1.0, singleStep=0.05)
        self.top_p.setValue(1.0)
        self.top_p.setToolTip("Nucleus sampling: keep the most likely tokens up to this mass")
        self.max_tokens = QSpinBox(minimum=1, maximum=1_048_576)
        self.max_tokens.setValue(1024)
        self.max_tokens.setToolTip("Longest reply, in tokens")
        row = QHBoxLayout()
        for label, widget in (
            ("Temperature", self.temperature),
            ("Top-p", self.top_p),
            ("Max tokens", self.max_tokens),
        ):
            row.addWidget(QLabel(label))
            row.addWidget(widget)
        row.addStretch(1)
        form.addRow(row)
        self.context_policy = QComboBox()
        self.context_policy.setObjectName("contextPolicy")
        for value, text in POLICIES.items():
            self.context_policy.addItem(text, value)
        self.context_policy.setToolTip(
            "What happens once this conversation no longer fits the model's context"
        )
        form.addRow("When the context is full", self.context_policy)
        panel.setVisible(False)
        self.params_toggle.toggled.connect(panel.setVisible)
        return panel

    # ----------------------------------------------------------------- API for the app

    def select_model(self, model: str) -> None:
        index = self.model_picker.findText(model)
        if index < 0:
            self.model_picker.addItem(model)
            index = self.model_picker.findText(model)
        self.model_picker.setCurrentIndex(index)

    def prepare_close(self) -> None:
        self.controller.stop()
        self.controller.close_tools(wait_s=SERVERS_STOP_S)  # the app quits: none left behind

    def options(self) -> ChatOptions:
        model = self.model_picker.currentText()
        return ChatOptions(
            "" if model == NO_MODEL else model,
            self.system_prompt.toPlainText(),
            self.temperature.value(),
            self.top_p.value(),
            self.max_tokens.value(),
            int(self.context_policy.currentData()),
        )

    def _show_context(self) -> None:
        c = self.controller
        size = c.context_sizes.get(self.options().model)
        if c.context_refused:  # the meter agrees with the refusal, never the old figure
            self.context_label.setText(full_text(c.context_full, size))
        else:
            self.context_label.setText(context_text(c.context_used, size, c.dropped))
        self.transcript.mark_left_out(c.left_out_positions())

    # ----------------------------------------------------------------- slots: controller

    def on_chats_changed(self) -> None:
        current = self.controller.transcript.chat.chat_id if self.controller.transcript else None
        self.chat_list.clear()
        for s in self.controller.summaries:
            title = s.title or "(untitled)"
            item = QListWidgetItem(title)
            item.setData(CHAT_ID_ROLE, s.chat_id)
            item.setToolTip(f"{title}\n{s.model or 'no model'} · {s.message_count} messages")
            self.chat_list.addItem(item)
            if s.chat_id == current:
                item.setSelected(True)

    def on_transcript_changed(self) -> None:
        t = self.controller.transcript
        if self.editing is not None and (
            t is None or all(m.position != self.editing or m.role != "user" for m in t.messages)
        ):
            self.on_cancel_edit_clicked()  # the edited message is gone (deleted elsewhere)
        self.transcript.show_system_prompt(t.chat.system_prompt if t is not None else "")
        if t is None:
            self.transcript.set_messages((), "")
            self.setWindowTitle("traylm — Chat")
            if not self.controller.streaming:
                self.status.setText("")  # the last reply's figures belong to the chat left
            self._shown_chat = None
        else:
            self.transcript.set_messages(t.messages, t.chat.model)
            for row in range(self.chat_list.count()):
                item = self.chat_list.item(row)
                item.setSelected(item.data(CHAT_ID_ROLE) == t.chat.chat_id)
            self.setWindowTitle(f"traylm — {t.chat.title or 'Chat'}")
            if not self.controller.streaming:
                self._load_options(t.chat.model, t.chat.system_prompt, t.chat.params)
                if self._shown_chat != t.chat.chat_id:
                    self.status.setText("")
            self._shown_chat = t.chat.chat_id
        self._show_context()
        self._update_buttons()

    def _load_options(self, model: str, system: str, params: object) -> None:
        if model:
            self.select_model(model)
        if self.system_prompt.toPlainText() != system:
            self.system_prompt.setPlainText(system)
        get = getattr(params, "get", None)
        if get is not None:
            self.temperature.setValue(float(get("temperature", self.temperature.value())))
            self.top_p.setValue(float(get("top_p", self.top_p.value())))
            self.max_tokens.setValue(int(get("max_tokens", self.max_tokens.value())))
            policy = self.context_policy.findData(int(get("context_policy", 0)))
            self.context_policy.setCurrentIndex(max(policy, 0))

    def on_models_changed(self) -> None:
        current = self.model_picker.currentText()
        models = self.controller.models
        self.model_picker.blockSignals(True)
        self.model_picker.clear()
        blocked = {m: self.controller.blocker(m) for m in models}
        # a model that cannot start here (a 2x4090 preset without a GPU) is listed last, greyed,
        # saying why: picked, it would only fail
        for model in sorted(models, key=lambda m: bool(blocked[m])):
            self.model_picker.addItem(model)
            if model in self.controller.loaded:
                continue
            index = self.model_picker.count() - 1
            if blocked[model]:
                tip = f"cannot start here: {blocked[model]}"
                item = cast(QStandardItemModel, self.model_picker.model()).item(index)
                item.setEnabled(False)
            else:  # models on demand: sending loads it
                tip = "not loaded: sending a message loads it"
            self.model_picker.setItemData(index, tip, Qt.ItemDataRole.ToolTipRole)
        if not models:
            self.model_picker.addItem(NO_MODEL)
        if current and current != NO_MODEL:
            self.select_model(current)
        self.model_picker.blockSignals(False)
        error = self.controller.models_error
        if not models and error is not None:
            self.status.setText(error.message)
        self.on_pending_changed()
        last = self.controller.last_error
        card = self.transcript.error_card
        model = self.options().model
        waiting = ("model_not_found", "engine_unavailable", "engine_starting")
        served = model in self.controller.loaded
        if card.isVisible() and last is not None and last.kind in waiting and served:
            card.show_error(f"{model} is served now.", [("retry", "Retry", self.controller.retry)])

    def on_stream_started(self, streaming: Streaming) -> None:
        self.transcript.hide_from(streaming.position)
        self.transcript.begin_streaming(streaming.model)
        self.status.setText(f"{streaming.model} is answering… (Esc stops)")
        self._update_buttons()

    def on_stream_loading(self, text: str) -> None:
        """Its model loads before it answers (models on demand): which step, how long."""
        self.status.setText(f"{text[:1].upper()}{text[1:]}… the reply follows (Esc stops)")
        view = self.transcript.streaming
        if view is not None:
            view.set_stats("loading the model…")

    def on_stream_delta(self, text: str) -> None:
        view = self.transcript.streaming
        if view is not None:
            view.set_text(text)
            view.set_stats("streaming…")
        streaming = self.controller.streaming
        if streaming is not None and self.status.text().startswith("Loading "):  # it loaded
            self.status.setText(f"{streaming.model} is answering… (Esc stops)")

    def ask(self, model: str, text: str, answered: Callable[[bool], None] | None = None) -> None:
        """Ask ``model`` in a new conversation (the setup's first question); ``answered`` hears
        whether a reply came."""
        if self.controller.streaming is not None:
            return
        self.on_new_clicked()
        self.select_model(model)
        self.controller.options = None
        self._answered = answered
        self.composer.setPlainText(text)
        self.on_send_clicked()

    def _tell_answered(self, answered: bool) -> None:
        callback, self._answered = self._answered, None
        if callback is not None:
            callback(answered)

    def on_stream_ended(self, ended: ChatStreamEnded | None) -> None:
        view = self.transcript.streaming
        if ended is not None and view is not None and ended.content:
            view.set_stats(stats_text(ended.stats(), ended.finish_reason))
        elif view is not None:
            self.transcript.clear_streaming()
            self.transcript.hide_from(1 << 30)
        if ended is not None:
            summary = stats_text(ended.stats(), ended.finish_reason)
            self.status.setText(f"{ended.model}: {summary}" if summary else "")
            self._tell_answered(bool(ended.content) and ended.error is None)
        self._show_context()
        self._update_buttons()

    def on_error_raised(self, error: ChatError) -> None:
        self.status.setText("")
        if error.kind == "context_full":
            self._context_full(error)
            return
        fix = self._load_fix(error)
        fixes = self._fixes(error)
        if fix is not None and fix.action:
            fixes.insert(0, ("loadFix", fix.label, lambda: self.run_fix(fix)))
        cli = fix.cli if fix is not None else ""
        self.transcript.error_card.show_error(error.message, fixes, cli=cli)

    def _context_full(self, error: ChatError) -> None:
        """Past the model's context every message would fail the same way: say so plainly and
        offer what fits (leave turns out, by this chat's policy from now on; a new chat)."""
        model = self.options().model
        size = self.controller.context_sizes.get(model)
        within = f" ({size:,} tokens)" if size else ""
        tried = self.context_policy.currentData() != 0  # it left out what it could
        text = f"This conversation no longer fits {model}'s context{within}" + (
            ", even with older turns left out. Start a new chat."
            if tried
            else ". Leave older turns out of what the model sees (the conversation here stays "
            "whole), or start a new chat."
        )
        fixes: list[tuple[str, str, Callable[[], None]]] = [
            ("dropOldest", POLICIES[DROP_OLDEST], lambda: self.on_policy_fix(DROP_OLDEST)),
            ("keepFirst", POLICIES[KEEP_FIRST], lambda: self.on_policy_fix(KEEP_FIRST)),
            ("newSummary", "New chat with a summary", self.on_summary_fix),
            ("newChat", "New chat", self.on_new_clicked),
        ]
        self.transcript.error_card.show_error(text, fixes[2:] if tried else fixes)
        self._update_buttons()  # no Retry: it would fail the same way

    def on_summary_fix(self) -> None:
        """A new chat that starts from the model's summary of this one, the unanswered
        question in its composer."""
        self.transcript.error_card.setVisible(False)
        self.status.setText(f"Asking {self.options().model} for a summary of this chat…")
        self.controller.summarize_into_new_chat(self.on_summary_opened)

    def on_summary_opened(self, question: str) -> None:
        self.status.setText("A new chat from the summary (its system prompt, under Parameters)")
        self.composer.setPlainText(question)
        self.composer.setFocus()

    def on_policy_fix(self, policy: int) -> None:
        self.context_policy.setCurrentIndex(self.context_policy.findData(policy))
        self.controller.options = self.options()
        t = self.controller.transcript
        if t is not None:
            self.controller.save_options(t.chat, self.controller.options)
        self.controller.retry_to_fit()

    def _load_fix(self, error: ChatError) -> Fix | None:
        """A failed load (models on demand) says why; its fix: the engine's log, or what the
        daemon's error code points at (a model folder when the Hub cannot be reached)."""
        if error.kind != "model_load_failed":
            return None
        model = self.options().model
        entry = self.state.profile_serving(model) if model else None
        return fix_for(error.code, error.message, target=entry.name if entry else model)

    def _fixes(self, error: ChatError) -> list[tuple[str, str, Callable[[], None]]]:
        c = self.controller
        model = self.options().model
        fixes: list[tuple[str, str, Callable[[], None]]] = []
        if error.kind == "images_not_accepted":
            return fixes  # a retry would be refused the same way: the message says what to do
        if error.kind in ("model_not_found", "engine_unavailable"):
            entry = self.state.profile_serving(model) if model else None
            profile = entry.name if entry else self.state.current_profile()
            if entry is not None and self.state.blocker(entry):
                profile = ""  # it cannot start here: the setup says what is missing
            if profile:
                fixes.append(
                    ("startEngine", f"Start {profile}", lambda: self.on_start_fix(profile))
                )
            else:
                fixes.append(("openSetup", "Set up traylm…", self.on_setup_fix))
        if error.kind == "engine_starting":
            c.retry_when_served = model
        if error.kind == "unauthorized":
            fixes.append(("enterKey", "Enter API key…", self.on_enter_key))
        fixes.append(("retry", "Retry", c.retry))
        return fixes

    def on_start_fix(self, profile: str) -> None:
        entry = self.state.profile(profile)
        served = entry.served_names[0] if entry else profile
        self.controller.retry_when_served = served
        if self.model_picker.currentText() in ("", NO_MODEL):
            self.select_model(served)
            self.controller.options = None
        self.start_card.follow(profile)
        self.app_actions.start_profile(profile, then=self.start_card.on_start_answered)

    def on_setup_fix(self) -> None:
        self.open_setup()

    def on_enter_key(self) -> None:
        dialog = QInputDialog(self)
        dialog.setWindowTitle("Gateway API key")
        dialog.setLabelText("The gateway requires an API key (Settings → API keys creates one):")
        dialog.setTextEchoMode(QLineEdit.EchoMode.Password)
        dialog.textValueSelected.connect(self.on_key_entered)
        dialog.open()

    def on_key_entered(self, key: str) -> None:
        if key.strip():
            write_key(self.bridge.paths, key)
            self.controller.set_api_key(key.strip())
            QTimer.singleShot(0, self, self.controller.retry)

    # ----------------------------------------------------------------- slots: widgets

    def on_send_clicked(self) -> None:
        text = self.composer.toPlainText()
        images = self.pending.images
        options = self.options()
        if self.controller.send(text, options, edit_position=self.editing, images=images):
            if self.state.startable(options.model):  # the tray's Start and the next chat
                self.app_actions.remember_profile(options.model)
            self.composer.clear()
            self.pending.clear()
            self._end_edit()

    def on_image_clicked(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Add an image", "", IMAGE_FILES)
        if path:
            self.add_image_file(path)

    def add_image_file(self, path: str) -> None:
        image = read_image(Path(path))
        if image is None:
            self.status.setText(f"{Path(path).name} is not a picture traylm can read")
            return
        self.on_image_added(data_url(image))

    def on_image_added(self, url: str) -> None:
        """A picture for the next message (the note beside it says at once when the model
        cannot take it; sending then says so too, and keeps it here)."""
        if not self.pending.add(url):
            self.status.setText(f"A message carries at most {MAX_IMAGES} images")
            return

    def on_pending_changed(self) -> None:
        """While the composer holds pictures the picked model cannot take, the note beside
        them says so and what to do; typing does not hide it, only a fix does."""
        model = self.options().model
        refused = (
            bool(self.pending.images) and bool(model) and not self.controller.accepts_images(model)
        )
        self.image_note.setText(
            f"{model} does not take images. Pick a vision model, or remove the pictures (×) "
            "to send the text alone."
            if refused
            else ""
        )
        self.image_note.setVisible(refused)

    def on_stop_clicked(self) -> None:
        self.controller.stop()

    def on_escape_pressed(self) -> None:
        """Esc stops a streaming reply; otherwise it cancels an edit."""
        if self.controller.streaming is not None:
            self.on_stop_clicked()
        elif self.editing is not None:
            self.on_cancel_edit_clicked()

    def on_cancel_edit_clicked(self) -> None:
        """The edited message and its reply stay; the composer gets back what it held."""
        if self.editing is None:
            return
        self.composer.setPlainText(self._draft)
        self._end_edit()

    def _end_edit(self) -> None:
        self.editing = None
        self._draft = ""
        self.edit_note.setVisible(False)
        self.send_button.setText("Send")

    def on_new_clicked(self) -> None:
        if self.controller.streaming is not None:
            return
        self.on_cancel_edit_clicked()
        self.chat_list.clearSelection()
        self.controller.new_chat()

    def on_chat_clicked(self, item: QListWidgetItem) -> None:
        self.on_cancel_edit_clicked()
        self.controller.open_chat(int(item.data(CHAT_ID_ROLE)))

    def on_delete_clicked(self) -> None:
        item = self.chat_list.currentItem()
        if item is None:
            return
        if not second_click(self.delete_button):
            return
        self.controller.delete_chat(int(item.data(CHAT_ID_ROLE)))

    def on_edit_requested(self, position: int) -> None:
        t = self.controller.transcript
        if t is None:
            return
        message = next((m for m in t.messages if m.position == position), None)
        if message is not None:
            if self.editing is None:
                self._draft = self.composer.toPlainText()
            self.editing = position
            self.composer.setPlainText(message.content)
            self.composer.setFocus()
            self.edit_note.setVisible(True)
            self.send_button.setText("Send edit")

    def _update_buttons(self) -> None:
        streaming = self.controller.streaming is not None
        self.send_button.setEnabled(not streaming)
        self.stop_button.setEnabled(streaming)
        self.new_button.setEnabled(not streaming)
        last = self.controller.last_error
        full = last is not None and last.kind == "context_full"
        self.transcript.offer_retry(not streaming and not full)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        """Enter sends and Shift+Enter starts a new line in the composer (as in LM Studio and
        Jan); Esc stops. Also when the window-wide shortcuts cannot fire (the window is not the
        active one)."""
        if watched is self.composer and event.type() == QEvent.Type.KeyPress:
            assert isinstance(event, QKeyEvent)
            enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
            if enter and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
                self.on_send_clicked()
                return True
            if event.key() == Qt.Key.Key_Escape:
                self.on_escape_pressed()
                return True
        return super().eventFilter(watched, event)

    def closeEvent(self, event: QCloseEvent) -> None:
        self.controller.close_tools()  # its MCP servers stop with it (they start again)
        event.accept()  # the window hides; the app keeps running in the tray
