"""The chat window's logic, on the GUI thread and without widgets: conversations (kept by the
daemon through /api/chats), models (from the gateway's /v1/models), and one streaming reply at
a time with regenerate, edit-and-resend and stop."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtCore import QObject, QTimer, Signal

from desktop.chat.context import DROP_OLDEST, STOP, dropped_positions, left_out
from desktop.chat.tool_loop import ToolLoop
from desktop.daemon.bridge import Bridge
from desktop.daemon.gateway import (
    ChatDelta,
    ChatError,
    ChatLoading,
    ChatRequest,
    ChatStreamEnded,
    Message,
    ModelsListed,
    context_tokens,
    requested_tokens,
)
from desktop.daemon.messages import CallResult
from desktop.daemon.state import AppState
from engines.events import ChatChanged, ChatSummary, ChatTranscript, EngineState, EngineStateChanged

RELOAD_DEBOUNCE_MS = 150
SUMMARY_ASK = (
    "Summarize our conversation so far in a few sentences: the facts, decisions and open "
    "questions someone continuing it would need."
)
SUMMARY_MAX_TOKENS = 512


@dataclass(frozen=True)
class ChatOptions:
    """What the window's controls say when Send is pressed."""

    model: str
    system_prompt: str
    temperature: float
    top_p: float
    max_tokens: int
    context_policy: int = STOP  # desktop/chat/context.py: what a too-long conversation does

    def params(self) -> dict[str, float]:
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": float(self.max_tokens),
            "context_policy": float(self.context_policy),
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
        self.context_sizes: dict[str, int] = {}  # each model's context, where known
        self.context_used: int | None = None  # tokens the open chat's last reply took
        self.dropped = 0  # turns of the open chat left out of its requests to fit
        self.context_full: int | None = None  # refused as too long: the tokens it needed
        self.context_refused = False  # the last request was refused as too long
        self.summarizing = False  # a summary for a new chat is being asked
        self._ids = itertools.count(1)
        self.tools = ToolLoop(bridge, state, parent=self)  # MCP servers' tools, on demand
        self._reload_chats = _debounced(self, self.load_chats)
        self._reload_models = _debounced(self, self.load_models)
        bridge.message_received.connect(self.on_message_received)
        state.connection_changed.connect(self.on_connection_changed)
        # a new profile or library model is servable at once: the picker offers it
        state.profiles_changed.connect(self._reload_models.start)
        state.library_changed.connect(self._reload_models.start)
        state.envs_changed.connect(self.models_changed)  # an engine installed: a model can start
        state.servable_changed.connect(self.models_changed)  # why each cannot start, anew

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
        self.context_sizes.update(result.value.context_tokens)
        self.models_changed.emit()
        if self.retry_when_served and self.retry_when_served in self.loaded:
            self.retry_when_served = ""
            self.retry()

    def accepts_images(self, model: str) -> bool:
        """The daemon read a vision encoder in ``model``'s config.json."""
        served = self.state.servable.get(model)
        return served is not None and served.accepts_images

    def blocker(self, model: str) -> str:
        """Why a listed model cannot start here ("" when it can): the daemon's answer."""
        return self.state.why_blocked(model)

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
                self._forget_context(result.value)
            self.transcript = result.value
            self.transcript_changed.emit()
        elif not result.ok:
            self._raise(ChatError("http_error", result.error))

    def new_chat(self) -> None:
        if self.streaming is not None:
            return
        self.transcript = None
        self._forget_context(None)
        self.error_cleared.emit()
        self.transcript_changed.emit()

    def _forget_context(self, transcript: ChatTranscript | None) -> None:
        """Another chat: nothing left out yet; its last reply says how full the context is."""
        self.dropped = 0
        self.context_used = None
        self.context_refused, self.context_full = False, None
        for m in reversed(transcript.messages if transcript else ()):
            if m.role == "assistant" and "prompt_tokens" in m.stats:
                used = m.stats["prompt_tokens"] + m.stats.get("completion_tokens", 0)
                self.context_used = int(used)
                break

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

    def send(
        self,
        text: str,
        options: ChatOptions,
        *,
        edit_position: int | None = None,
        images: tuple[str, ...] = (),
    ) -> bool:
        """Store the user's message (replacing from ``edit_position``), then stream a reply.
        Images go only to a model whose config says it takes them; for another the chat says
        why instead of sending (vLLM would answer "not a multimodal model")."""
        if self.streaming is not None or not (text.strip() or images):
            return False
        if images and not self.accepts_images(options.model):
            self._raise(
                ChatError(
                    "images_not_accepted",
                    f"{options.model or 'this model'} does not take images: its config.json "
                    "describes no vision encoder. Pick a vision model (LLaVA, Qwen2-VL, "
                    "Gemma 3, ...) or leave the images out.",
                )
            )
            return False
        self.options = options
        self.error_cleared.emit()
        message: dict[str, object] = {"role": "user", "content": text}
        if images:
            message["images"] = list(images)

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
            self.save_options(chat, options)
            with_chat(chat.chat_id)
        return True

    def save_options(self, chat: ChatSummary, options: ChatOptions) -> None:
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

    def _stream(self, position: int, *, continuing: bool = False) -> None:
        """Ask for the reply at ``position``; ``continuing``: after its tool calls ran."""
        assert self.transcript is not None
        options = self.options or self._options_from(self.transcript.chat)
        if not options.model:
            self._raise(ChatError("model_not_found", "no model is served: start an engine first"))
            return
        if not continuing:
            self.tools.new_reply()
            if not self.tools.prepare(options.model, lambda: self._stream(position)):
                return  # the MCP servers start first
        history = self._history(position, options, self.dropped)
        if history is None:  # nothing more can be left out
            self.dropped = 0
            history = self._history(position, options, 0) or ()
        request = ChatRequest(
            next(self._ids),
            options.model,
            history,
            options.temperature,
            options.top_p,
            options.max_tokens,
            chat_id=self.transcript.chat.chat_id,
            position=position,
            tools_json=self.tools.tools_json(options.model),
            tool_turns_json=self.tools.turns_json(),
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

    def _history(
        self, position: int, options: ChatOptions, drop: int
    ) -> tuple[Message, ...] | None:
        """The messages a reply at ``position`` is asked with: the system prompt, then the
        conversation with ``drop`` turns left out by the chat's policy (None: not possible)."""
        assert self.transcript is not None
        history: list[Message] = [
            (m.role, m.content, m.images) for m in self.transcript.messages if m.position < position
        ]
        if options.system_prompt.strip():
            history.insert(0, ("system", options.system_prompt, ()))
        return left_out(history, options.context_policy, drop)

    def left_out_positions(self) -> frozenset[int]:
        """The open chat's messages its requests leave out now, to fit the context."""
        t = self.transcript
        if t is None or not self.dropped:
            return frozenset()
        options = self.options or self._options_from(t.chat)
        roles = [(m.position, m.role) for m in t.messages]
        if options.system_prompt.strip():
            roles.insert(0, (-1, "system"))
        return dropped_positions(roles, options.context_policy, self.dropped)

    def _options_from(self, chat: ChatSummary) -> ChatOptions:
        p = chat.params
        return ChatOptions(
            chat.model or (self.models[0] if self.models else ""),
            chat.system_prompt,
            float(p.get("temperature", 0.7)),
            float(p.get("top_p", 1.0)),
            int(p.get("max_tokens", 1024)),
            int(p.get("context_policy", STOP)),
        )

    def stop(self) -> None:
        if self.streaming is None:
            return
        if self.tools.stop():  # it waited for the user or a tool: the reply ends here
            self.streaming = None
            self.state.set_local_streams(0)
            self.stream_ended.emit(None)
            return
        self.bridge.cancel(self.streaming.call_id)

    def close_tools(self, *, wait_s: float = 0.0) -> None:
        """Stop the MCP servers (a reply waiting on a tool ends); ``wait_s``: until they are."""
        if self.tools.busy:
            self.stop()
        self.tools.close(wait_s=wait_s)

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
        position = streaming.position
        if self.tools.handle(ended, lambda: self._stream(position, continuing=True)):
            self.streaming = streaming  # still this reply: its tool calls first
            self.state.set_local_streams(1)
            self.stream_ended.emit(None)
            return
        if self._leave_out_more(streaming, ended):
            self.stream_ended.emit(None)
            self._stream(streaming.position)  # again, with one more turn left out
            return
        self.context_refused = ended.error is not None and ended.error.kind == "context_full"
        self.context_full = requested_tokens(ended.error.message) if ended.error else None
        if ended.content and ended.prompt_tokens is not None:
            self.context_used = ended.prompt_tokens + ended.completion_tokens
        if ended.content or self.tools.runs:
            reply: dict[str, object] = {
                "role": "assistant",
                "content": ended.content,
                "model": ended.model,
                "stats": ended.stats(),
                "finish_reason": ended.finish_reason,
            }
            if self.tools.runs:
                reply["tools"] = [run.stored() for run in self.tools.runs]
            self._store_reply(streaming.chat_id, reply, streaming.position)
        self.stream_ended.emit(ended)
        if ended.error is not None:
            self._raise(ended.error)

    def summarize_into_new_chat(self, opened: Callable[[str], None]) -> None:
        """A new chat that starts from a summary of this one (asked of the model with as many
        of the oldest turns left out as it takes to fit), its system prompt; ``opened`` gets
        the question this chat could not answer, to ask it there."""
        t = self.transcript
        if t is None or self.streaming is not None or self.summarizing:
            return
        options = self.options or self._options_from(t.chat)
        messages: list[Message] = [(m.role, m.content, m.images) for m in t.messages]
        question = messages.pop()[1] if messages and messages[-1][0] == "user" else ""
        self.summarizing = True

        def ask(drop: int) -> None:
            kept = left_out(messages, DROP_OLDEST, drop)
            if kept is None:
                self.summarizing = False
                self._raise(ChatError("context_full", "not even one turn fits the context"))
                return
            request = ChatRequest(
                next(self._ids),
                options.model,
                (*kept, ("user", SUMMARY_ASK, ())),
                options.temperature,
                options.top_p,
                min(SUMMARY_MAX_TOKENS, options.max_tokens),
            )
            self.bridge.call_gateway(lambda g: g.stream_chat(request), lambda r: got(r, drop))

        def got(result: CallResult, drop: int) -> None:
            ended = result.value
            if not isinstance(ended, ChatStreamEnded) or (ended.error and not ended.content):
                error = ended.error if isinstance(ended, ChatStreamEnded) else None
                if error is not None and error.kind == "context_full":
                    ask(drop + 1)
                    return
                self.summarizing = False
                self._raise(error or ChatError("http_error", result.error))
                return
            system = f"A summary of an earlier conversation:\n{ended.content.strip()}"
            new_options = ChatOptions(
                options.model,
                system,
                options.temperature,
                options.top_p,
                options.max_tokens,
                options.context_policy,
            )

            def created(r: CallResult) -> None:
                self.summarizing = False
                if r.ok and isinstance(r.value, ChatSummary):
                    self.options = new_options
                    self.open_chat(r.value.chat_id)
                    opened(question)
                else:
                    self._failed_store(r)

            self.bridge.call(
                lambda c: c.create_chat(
                    model=options.model, system_prompt=system, params=new_options.params()
                ),
                created,
            )

        ask(0)

    def _leave_out_more(self, streaming: Streaming, ended: ChatStreamEnded) -> bool:
        """The conversation does not fit the model's context: with a policy that allows it,
        leave one more turn out (True: the reply is asked again)."""
        error = ended.error
        if error is None or error.kind != "context_full" or ended.content:
            return False
        size = context_tokens(error.message)
        if size is not None:
            self.context_sizes[streaming.model] = size
        if self.transcript is None or self.transcript.chat.chat_id != streaming.chat_id:
            return False
        options = self.options or self._options_from(self.transcript.chat)
        if self._history(streaming.position, options, self.dropped + 1) is None:
            return False
        self.dropped += 1
        return True

    def retry_to_fit(self) -> None:
        """Retry a reply refused as too long now that the chat's policy leaves turns out: with
        one more turn left out at once (as it was, it would only be refused again)."""
        t, error = self.transcript, self.last_error
        if t is None or self.streaming is not None or not t.messages:
            return
        if error is not None and error.kind == "context_full":
            options = self.options or self._options_from(t.chat)
            last = t.messages[-1]
            position = last.position if last.role == "assistant" else len(t.messages)
            if self._history(position, options, self.dropped + 1) is not None:
                self.dropped += 1
        self.retry()

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
