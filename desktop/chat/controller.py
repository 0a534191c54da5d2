"""The chat window's logic, on the GUI thread and without widgets: conversations (kept by the
daemon through /api/chats), models (from the gateway's /v1/models), and one streaming reply at
a time with regenerate, edit-and-resend and stop."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from PySide6.QtCore import QObject, QTimer, Signal

from desktop.bridge import Bridge
from desktop.chat.stream import (
    ChatDelta,
    ChatError,
    ChatLoading,
    ChatRequest,
    ChatStreamEnded,
    ModelsListed,
)
from desktop.messages import CallResult
from desktop.state import AppState
from engines.events import ChatChanged, ChatSummary, ChatTranscript, EngineState, EngineStateChanged

RELOAD_DEBOUNCE_MS = 150


@dataclass(frozen=True)
class ChatOptions:
    """What the window's controls say when Send is pressed."""

    model: str
    system_prompt: str
    temperature: float
    top_p: float
    max_tokens: int

    def params(self) -> dict[str, float]:
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": float(self.max_tokens),
        }


@dataclass(frozen=True)
class Streaming:
    request_id: int
    call_id: int
    chat_id: int
    model: str
    position: int  # where the reply goes (older messages from here on are replaced)


class ChatController(QObject):
    chats_changed = Signal()
    transcript_changed = Signal()
    models_changed = Signal()
    stream_started = Signal(object)  # Streaming
    stream_delta = Signal(str)  # the reply so far
    stream_loading = Signal(str)  # its model is loading: "loading NAME (starting: ..., 12 s)"
    stream_ended = Signal(object)  # ChatStreamEnded, or None when the call never ran
    error_raised = Signal(object)  # ChatError
    error_cleared = Signal()

    def __init__(self, bridge: Bridge, state: AppState, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.bridge = bridge
        self.state = state
        self.summaries: tuple[ChatSummary, ...] = ()
        self.transcript: ChatTranscript | None = None
        self.models: tuple[str, ...] = ()  # every servable model (sending loads one)
        self.loaded: tuple[str, ...] = ()  # those answering now
        self.models_error: ChatError | None = None
        self.streaming: Streaming | None = None
        self.reply = ""
        self.last_error: ChatError | None = None
        self.options: ChatOptions | None = None
        self.retry_when_served = ""  # a model: resend as soon as an engine serves it
        self.pending_replies: list[tuple[int, dict[str, object], int]] = []
        self._ids = itertools.count(1)
        self._reload_chats = _debounced(self, self.load_chats)
        self._reload_models = _debounced(self, self.load_models)
        bridge.message_received.connect(self.on_message_received)
        state.connection_changed.connect(self.on_connection_changed)
        # a new profile or library model is servable at once: the picker offers it
        state.profiles_changed.connect(self._reload_models.start)
        state.library_changed.connect(self._reload_models.start)
        state.envs_changed.connect(self.models_changed)  # an engine installed: a model can start

    # ----------------------------------------------------------------- loading

    def on_connection_changed(self, *_: object) -> None:
        if self.state.connected:
            self._reload_chats.start()
            self._reload_models.start()
            pending, self.pending_replies = self.pending_replies, []
            for chat_id, reply, position in pending:
                self._store_reply(chat_id, reply, position)

    def load_chats(self) -> None:
        self.bridge.call(lambda c: c.chats(), self._on_chats)

    def _on_chats(self, result: CallResult) -> None:
        if result.ok and isinstance(result.value, tuple):
            self.summaries = tuple(s for s in result.value if isinstance(s, ChatSummary))
            self.chats_changed.emit()
            if self.transcript and all(
                s.chat_id != self.transcript.chat.chat_id for s in self.summaries
            ):
                self.transcript = None  # deleted elsewhere
                self.transcript_changed.emit()

    def load_models(self) -> None:
        self.bridge.call_gateway(lambda g: g.models(), self._on_models)

    def _on_models(self, result: CallResult) -> None:
        if not result.ok or not isinstance(result.value, ModelsListed):
            return
        self.models, self.models_error = result.value.names, result.value.error
        self.loaded = result.value.loaded
        self.models_changed.emit()
        if self.retry_when_served and self.retry_when_served in self.loaded:
            self.retry_when_served = ""
            self.retry()

    def blocker(self, model: str) -> str:
        """Why a listed model cannot start here ("" when it can, or when no profile serves it:
        a library model or an attached server is left to the daemon to judge)."""
        entry = self.state.profile_serving(model) or self.state.profile(model)
        return self.state.blocker(entry) if entry is not None else ""

    def open_chat(self, chat_id: int) -> None:
        if self.streaming is not None:
            return
        self.bridge.call(lambda c: c.chat(chat_id), self._on_transcript)

    def _on_transcript(self, result: CallResult) -> None:
        if result.ok and isinstance(result.value, ChatTranscript):
            previous = self.transcript.chat.chat_id if self.transcript else None
            if previous != result.value.chat.chat_id and self.streaming is None:
                self.last_error = None
                self.error_cleared.emit()
            self.transcript = result.value
            self.transcript_changed.emit()
        elif not result.ok:
            self._raise(ChatError("http_error", result.error))

    def new_chat(self) -> None:
        if self.streaming is not None:
            return
        self.transcript = None
        self.error_cleared.emit()
        self.transcript_changed.emit()

    def delete_chat(self, chat_id: int) -> None:
        if self.transcript is not None and self.transcript.chat.chat_id == chat_id:
            self.stop()
            self.transcript = None
            self.transcript_changed.emit()
        self.bridge.call(lambda c: c.delete_chat(chat_id), lambda _r: self.load_chats())

    def set_api_key(self, key: str) -> None:
        async def apply(gateway: object) -> None:
            self.bridge.link.gateway.api_key = key

        self.bridge.call_gateway(apply, lambda _r: self.load_models())

    # ----------------------------------------------------------------- sending

    def send(self, text: str, options: ChatOptions, *, edit_position: int | None = None) -> bool:
        """Store the user's message (replacing from ``edit_position``), then stream a reply."""
        if self.streaming is not None or not text.strip():
            return False
        self.options = options
        self.error_cleared.emit()
        message = {"role": "user", "content": text}

        def with_chat(chat_id: int) -> None:
            self.bridge.call(
                lambda c: c.add_chat_messages(chat_id, [message], truncate_from=edit_position),
                self._after_user_message,
            )

        if self.transcript is None:
            self.bridge.call(
                lambda c: c.create_chat(
                    model=options.model,
                    system_prompt=options.system_prompt,
                    params=options.params(),
                ),
                lambda r: with_chat(r.value.chat_id) if r.ok else self._failed_store(r),  # type: ignore[attr-defined]
            )
        else:
            chat = self.transcript.chat
            self._save_options(chat, options)
            with_chat(chat.chat_id)
        return True

    def _save_options(self, chat: ChatSummary, options: ChatOptions) -> None:
        if (chat.model, chat.system_prompt, dict(chat.params)) != (
            options.model,
            options.system_prompt,
            options.params(),
        ):
            self.bridge.call(
                lambda c: c.update_chat(
                    chat.chat_id,
                    model=options.model,
                    system_prompt=options.system_prompt,
                    params=options.params(),
                )
            )

    def _failed_store(self, result: CallResult) -> None:
        self._raise(
            ChatError("gateway_unreachable", f"could not store the message: {result.error}")
        )

    def _after_user_message(self, result: CallResult) -> None:
        if not result.ok or not isinstance(result.value, ChatTranscript):
            self._failed_store(result)
            return
        self.transcript = result.value
        self.transcript_changed.emit()
        self._stream(len(result.value.messages))

    def regenerate(self) -> None:
        """Replace the last reply with a new one."""
        if self.transcript is None or self.streaming is not None:
            return
        messages = self.transcript.messages
        if messages and messages[-1].role == "assistant":
            self._stream(messages[-1].position)
        elif messages:
            self._stream(len(messages))

    retry = regenerate  # an unanswered or interrupted last message gets a (new) reply

    def _stream(self, position: int) -> None:
        assert self.transcript is not None
        options = self.options or self._options_from(self.transcript.chat)
        if not options.model:
            self._raise(ChatError("model_not_found", "no model is served: start an engine first"))
            return
        history = [(m.role, m.content) for m in self.transcript.messages if m.position < position]
        if options.system_prompt.strip():
            history.insert(0, ("system", options.system_prompt))
        request = ChatRequest(
            next(self._ids),
            options.model,
            tuple(history),
            options.temperature,
            options.top_p,
            options.max_tokens,
            chat_id=self.transcript.chat.chat_id,
            position=position,
        )
        call_id = self.bridge.call_gateway(lambda g: g.stream_chat(request), self._on_stream_done)
        self.streaming = Streaming(
            request.request_id, call_id, self.transcript.chat.chat_id, options.model, position
        )
        self.reply = ""
        self.last_error = None
        self.error_cleared.emit()
        self.state.set_local_streams(1)
        self.stream_started.emit(self.streaming)

    def _options_from(self, chat: ChatSummary) -> ChatOptions:
        p = chat.params
        return ChatOptions(
            chat.model or (self.models[0] if self.models else ""),
            chat.system_prompt,
            float(p.get("temperature", 0.7)),
            float(p.get("top_p", 1.0)),
            int(p.get("max_tokens", 1024)),
        )

    def stop(self) -> None:
        if self.streaming is not None:
            self.bridge.cancel(self.streaming.call_id)

    def on_message_received(self, message: object) -> None:
        if isinstance(message, ChatDelta):
            if self.streaming is not None and message.request_id == self.streaming.request_id:
                self.reply += message.text
                self.stream_delta.emit(self.reply)
        elif isinstance(message, ChatLoading):
            if self.streaming is not None and message.request_id == self.streaming.request_id:
                self.stream_loading.emit(message.text)
        elif isinstance(message, ChatChanged):
            self._reload_chats.start()
        elif isinstance(message, EngineStateChanged) and message.state in (
            EngineState.READY,
            EngineState.STOPPED,
            EngineState.FAILED,
        ):
            self._reload_models.start()

    def _on_stream_done(self, result: CallResult) -> None:
        streaming, self.streaming = self.streaming, None
        self.state.set_local_streams(0)
        ended = result.value
        if streaming is None or not isinstance(ended, ChatStreamEnded):
            self.stream_ended.emit(None)
            if not result.ok and not result.cancelled:
                self._raise(ChatError("http_error", result.error))
            return
        if ended.content:
            reply: dict[str, object] = {
                "role": "assistant",
                "content": ended.content,
                "model": ended.model,
                "stats": ended.stats(),
                "finish_reason": ended.finish_reason,
            }
            self._store_reply(streaming.chat_id, reply, streaming.position)
        self.stream_ended.emit(ended)
        if ended.error is not None:
            self._raise(ended.error)

    def _store_reply(self, chat_id: int, reply: dict[str, object], position: int) -> None:
        """Store a reply; while the daemon is away it waits and is stored once it is back."""

        def stored(result: CallResult) -> None:
            if result.ok:
                self._on_transcript(result)
            elif result.error_code == "daemon_unavailable":
                self.pending_replies.append((chat_id, reply, position))
            else:
                self._raise(ChatError("http_error", f"could not store the reply: {result.error}"))

        self.bridge.call(
            lambda c: c.add_chat_messages(chat_id, [reply], truncate_from=position), stored
        )

    def _raise(self, error: ChatError) -> None:
        self.last_error = error
        self.error_raised.emit(error)


def _debounced(owner: QObject, slot: object) -> QTimer:
    timer = QTimer(owner)
    timer.setSingleShot(True)
    timer.setInterval(RELOAD_DEBOUNCE_MS)
    timer.timeout.connect(slot)
    return timer
