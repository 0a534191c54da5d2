"""The chat window against a real daemon and gateway with the FAKE vLLM engine: streaming,
Stop (Esc), Enter sends and Shift+Enter starts a new line, history kept by the daemon across app restarts, regenerate,
edit-and-resend, delete, per-reply figures, and inline errors with their fix."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication, QLabel

from desktop.app import DesktopApp
from desktop.chat.transcript import CodeBlockView, TranscriptView
from desktop.chat.window import ChatWindow
from engines.events import ChatMessage, EngineState
from tests.desktop.conftest import AppFactory, ThreadedDaemon


def _ready_chat(qtbot, app: DesktopApp, d: ThreadedDaemon, args: str = "") -> ChatWindow:
    d.write_fake_profile("fake", args=args)
    app.actions.start_profile("fake")
    qtbot.waitUntil(lambda: app.state.served_models() == ["fake"], timeout=20000)
    chat = app.open_chat("")
    qtbot.waitUntil(lambda: chat.controller.loaded == ("fake",), timeout=5000)
    assert chat.model_picker.currentText() == "fake"
    return chat


def _send(qtbot, chat: ChatWindow, text: str, max_tokens: int) -> None:
    chat.max_tokens.setValue(max_tokens)
    chat.composer.setPlainText(text)
    qtbot.keyClick(chat.composer, Qt.Key.Key_Return)


def _stored(d: ThreadedDaemon, chat: ChatWindow) -> tuple[ChatMessage, ...]:
    t = chat.controller.transcript
    assert t is not None
    return d.run(lambda c: c.chat(t.chat.chat_id)).messages


def _stored_reply(qtbot, d: ThreadedDaemon, chat: ChatWindow) -> tuple[ChatMessage, ...]:
    """The stored conversation once the reply is in it (the window shows the streamed reply
    before the daemon has stored it)."""
    qtbot.waitUntil(lambda: len(_stored(d, chat)) >= 2, timeout=5000)
    return _stored(d, chat)


def test_chat_streams_with_figures_and_is_stored(qtbot, app, daemon_thread) -> None:
    chat = _ready_chat(qtbot, app, daemon_thread, "--token-delay 0.01")
    _send(qtbot, chat, "hello there", 6)  # Enter sends
    qtbot.waitUntil(lambda: chat.controller.streaming is not None, timeout=5000)
    assert not chat.send_button.isEnabled() and chat.stop_button.isEnabled()
    qtbot.waitUntil(lambda: len(chat.transcript.messages) == 2, timeout=10000)
    reply = chat.transcript.messages[1]
    assert reply.text == "w0 w1 w2 w3 w4 w5 "
    assert "TTFT" in reply.stats.text() and "tok/s" in reply.stats.text()
    assert "6 tokens" in reply.stats.text()
    stored = _stored_reply(qtbot, daemon_thread, chat)
    assert [(m.role, m.content) for m in stored] == [
        ("user", "hello there"),
        ("assistant", "w0 w1 w2 w3 w4 w5 "),
    ]
    assert stored[1].finish_reason == "stop"  # [DONE] without a finish_reason (the FAKE's way)
    assert stored[1].stats["completion_tokens"] == 6
    assert stored[1].stats["ttft_s"] > 0 and stored[1].stats["tokens_per_s"] > 0
    qtbot.waitUntil(lambda: chat.chat_list.count() == 1)  # refreshed by the chat.changed event
    assert chat.chat_list.item(0).text() == "hello there"


def test_enter_sends_and_shift_enter_starts_a_new_line(qtbot, app, daemon_thread) -> None:
    chat = _ready_chat(qtbot, app, daemon_thread)
    chat.max_tokens.setValue(3)
    qtbot.keyClicks(chat.composer, "first line")
    qtbot.keyClick(chat.composer, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(chat.composer, "second line")
    assert chat.composer.toPlainText() == "first line\nsecond line"
    assert chat.controller.streaming is None and chat.controller.transcript is None
    qtbot.keyClick(chat.composer, Qt.Key.Key_Enter)  # the keypad's Enter sends too
    qtbot.waitUntil(lambda: len(chat.transcript.messages) == 2, timeout=10000)
    assert chat.composer.toPlainText() == ""
    assert _stored(daemon_thread, chat)[0].content == "first line\nsecond line"
    # the sent message is shown as typed: two lines, not Markdown's one paragraph
    label = chat.transcript.messages[0].findChild(QLabel, "messageText")
    lines = label.heightForWidth(600) / label.fontMetrics().lineSpacing()
    assert 2 <= lines < 3, lines
    assert "TTFT" in chat.status.text()  # the reply's figures...
    chat.new_button.click()
    assert chat.status.text() == ""  # ...belong to the chat left, not to the new one


def test_esc_stops_a_streaming_reply(qtbot, app, daemon_thread) -> None:
    chat = _ready_chat(qtbot, app, daemon_thread, "--token-delay 0.05")
    engine = daemon_thread.engine("fake")
    assert engine is not None and engine.port
    _send(qtbot, chat, "tell me everything", 2000)
    qtbot.waitUntil(lambda: len(chat.controller.reply.split()) >= 3, timeout=10000)
    qtbot.keyClick(chat.composer, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: len(chat.transcript.messages) == 2, timeout=10000)
    stored = _stored_reply(qtbot, daemon_thread, chat)
    assert stored[1].finish_reason == "stopped"  # the partial reply is kept
    assert 3 <= len(stored[1].content.split()) < 200
    # the reply was stopped (by the user), not the model
    assert "reply stopped by you" in chat.transcript.messages[1].stats.text()
    assert "reply stopped by you" in chat.status.text()
    # the gateway closed the upstream request, so the engine stopped generating for nobody
    stats_url = f"http://127.0.0.1:{engine.port}/fake/stats"
    qtbot.waitUntil(
        lambda: json.loads(urllib.request.urlopen(stats_url).read())["aborted"] == 1,
        timeout=5000,
    )


def test_history_survives_a_restart_of_the_app(
    qtbot, daemon_thread, app_factory: AppFactory
) -> None:
    first = app_factory()
    chat = _ready_chat(qtbot, first, daemon_thread)
    chat.system_prompt.setPlainText("Answer in numbered words.")
    chat.temperature.setValue(0.3)
    _send(qtbot, chat, "remember this", 3)
    qtbot.waitUntil(lambda: len(chat.transcript.messages) == 2, timeout=10000)
    first.shutdown()

    second = app_factory()
    chat2 = second.open_chat("")
    qtbot.waitUntil(lambda: chat2.chat_list.count() == 1, timeout=5000)
    chat2.on_chat_clicked(chat2.chat_list.item(0))
    qtbot.waitUntil(lambda: len(chat2.transcript.messages) == 2, timeout=5000)
    assert [m.text for m in chat2.transcript.messages] == ["remember this", "w0 w1 w2 "]
    assert "TTFT" in chat2.transcript.messages[1].stats.text()
    assert chat2.system_prompt.toPlainText() == "Answer in numbered words."
    assert chat2.temperature.value() == 0.3 and chat2.max_tokens.value() == 3


def test_regenerate_edit_and_delete(qtbot, app, daemon_thread) -> None:
    chat = _ready_chat(qtbot, app, daemon_thread)
    _send(qtbot, chat, "first question", 2)
    # the daemon keeps the reply as it streams (shown as interrupted meanwhile); once it is
    # stored complete, Regenerate is offered
    qtbot.waitUntil(
        lambda: (
            len(chat.transcript.messages) == 2
            and chat.transcript.messages[1].buttons["regenerate"].isVisibleTo(chat)
        ),
        timeout=10000,
    )
    chat.max_tokens.setValue(4)
    chat.controller.options = chat.options()
    chat.transcript.messages[1].buttons["regenerate"].click()
    qtbot.waitUntil(
        lambda: (
            len(chat.transcript.messages) == 2
            and chat.transcript.messages[1].text == "w0 w1 w2 w3 "
        ),
        timeout=10000,
    )
    # the window shows the streamed reply before the daemon has stored it
    qtbot.waitUntil(
        lambda: (
            [m.content for m in _stored(daemon_thread, chat)] == ["first question", "w0 w1 w2 w3 "]
        ),
        timeout=5000,
    )

    chat.transcript.messages[0].buttons["edit"].click()
    assert chat.composer.toPlainText() == "first question" and chat.edit_note.isVisible()
    chat.composer.setPlainText("edited question")
    chat.max_tokens.setValue(1)
    chat.on_send_clicked()
    qtbot.waitUntil(
        lambda: [m.text for m in chat.transcript.messages] == ["edited question", "w0 "],
        timeout=10000,
    )
    qtbot.waitUntil(
        lambda: [m.content for m in _stored(daemon_thread, chat)] == ["edited question", "w0 "],
        timeout=5000,
    )

    qtbot.waitUntil(lambda: chat.chat_list.count() == 1)
    chat.chat_list.setCurrentRow(0)
    chat.delete_button.click()
    assert chat.delete_button.text() == "Confirm delete (10 s)"  # a second click deletes
    chat.delete_button.click()
    qtbot.waitUntil(lambda: chat.chat_list.count() == 0, timeout=5000)
    assert daemon_thread.run(lambda c: c.chats()) == []
    assert chat.controller.transcript is None


def test_an_edit_can_be_cancelled_and_a_sent_edit_retitles_the_chat(
    qtbot, app, daemon_thread
) -> None:
    """Esc or Cancel leaves an edit: the message and its reply stay, the composer gets back
    what it held, and the next Send appends. A sent edit of the first question gives the chat
    that question as its title; a title the user gave stays."""
    chat = _ready_chat(qtbot, app, daemon_thread)
    _send(qtbot, chat, "first question", 1)
    qtbot.waitUntil(lambda: len(_stored(daemon_thread, chat)) == 2, timeout=10000)
    qtbot.waitUntil(lambda: chat.chat_list.count() == 1 and len(chat.transcript.messages) == 2)

    def edit(index: int) -> None:
        button = chat.transcript.messages[index].buttons["edit"]
        qtbot.waitUntil(lambda: button.isVisibleTo(chat), timeout=5000)  # once its reply ended
        button.click()

    chat.composer.setPlainText("a draft")
    edit(0)
    assert chat.composer.toPlainText() == "first question" and chat.edit_note.isVisibleTo(chat)
    assert chat.send_button.text() == "Send edit"
    qtbot.keyClick(chat.composer, Qt.Key.Key_Escape)
    assert chat.editing is None and not chat.edit_note.isVisibleTo(chat)
    assert chat.composer.toPlainText() == "a draft" and chat.send_button.text() == "Send"
    edit(0)
    chat.cancel_edit_button.click()
    assert chat.editing is None and chat.composer.toPlainText() == "a draft"

    edit(0)  # the first question: the chat's title follows it
    chat.composer.setPlainText("a new\n  opening")
    chat.on_send_clicked()
    qtbot.waitUntil(lambda: chat.chat_list.item(0).text() == "a new opening", timeout=10000)
    assert chat.windowTitle() == "traylm — a new opening"
    qtbot.waitUntil(lambda: len(_stored(daemon_thread, chat)) == 2, timeout=10000)
    qtbot.waitUntil(lambda: len(chat.transcript.messages) == 2, timeout=5000)

    chat.composer.setPlainText("second question")
    chat.on_send_clicked()  # appended: the first turn stays
    qtbot.waitUntil(
        lambda: (
            [m.content for m in _stored(daemon_thread, chat)]
            == ["a new\n  opening", "w0 ", "second question", "w0 "]
        ),
        timeout=10000,
    )
    qtbot.waitUntil(lambda: len(chat.transcript.messages) == 4, timeout=5000)
    edit(2)  # a later question: the title stays
    chat.composer.setPlainText("second, edited")
    chat.on_send_clicked()
    qtbot.waitUntil(
        lambda: [m.content for m in _stored(daemon_thread, chat)][2:] == ["second, edited", "w0 "],
        timeout=10000,
    )
    assert daemon_thread.run(lambda c: c.chats())[0].title == "a new opening"

    chat_id = chat.controller.transcript.chat.chat_id
    daemon_thread.run(lambda c: c.update_chat(chat_id, title="my own title"))
    daemon_thread.run(lambda c: c.add_chat_messages(
        chat_id, [{"role": "user", "content": "again"}], truncate_from=0
    ))  # fmt: skip
    assert daemon_thread.run(lambda c: c.chats())[0].title == "my own title"


@pytest.mark.slow
def test_a_model_whose_engine_is_not_running_loads_on_send(qtbot, app, daemon_thread):
    """Models on demand: the picker lists a servable model that is not loaded (saying that
    sending loads it); sending starts its engine, the window says how the load goes (the
    engine's start phases), and the reply follows."""
    daemon_thread.write_fake_profile("slow", args="--startup-delay 4")
    chat = app.open_chat("")
    app.actions.reload_profiles()  # a new profile: the picker hears of it
    qtbot.waitUntil(lambda: "slow" in chat.controller.models, timeout=10000)
    assert "slow" not in chat.controller.loaded
    index = chat.model_picker.findText("slow")
    tip = chat.model_picker.itemData(index, Qt.ItemDataRole.ToolTipRole)
    assert tip == "not loaded: sending a message loads it"
    chat.model_picker.setCurrentIndex(index)
    loading: list[str] = []
    chat.controller.stream_loading.connect(lambda text: loading.append(chat.status.text()))
    _send(qtbot, chat, "are you there?", 2)
    qtbot.waitUntil(lambda: len(chat.transcript.messages) == 2, timeout=30000)
    assert chat.transcript.messages[1].text == "w0 w1 "
    assert not chat.transcript.error_card.isVisible()
    assert daemon_thread.engine_state("slow") == EngineState.READY
    assert loading and all(t.startswith("Loading slow (") for t in loading), loading
    assert any(t.startswith("Loading slow (starting: ") for t in loading), loading  # a phase
    # the load is said apart from the time to the first token (4 s of start-up is no TTFT)
    figures = chat.status.text()
    load_s = float(re.search(r"loaded in ([\d.]+) s", figures).group(1))
    ttft_s = float(re.search(r"TTFT ([\d.]+) s", figures).group(1))
    assert load_s >= 4 and ttft_s < load_s, figures
    qtbot.waitUntil(lambda: "slow" in chat.controller.loaded, timeout=5000)
    assert chat.model_picker.findText("slow") == 0  # loaded ones come first, without the tip
    assert chat.model_picker.itemData(0, Qt.ItemDataRole.ToolTipRole) is None
    # the model chatted with is the one the tray's Start and the next chat name
    # (remembered by a settings write the app reads back: wait for the read, not for
    # current_profile, which already names the one live engine before the write lands)
    qtbot.waitUntil(
        lambda: app.state.settings is not None and app.state.settings.ui.last_profile == "slow",
        timeout=10000,
    )
    assert app.state.current_profile() == "slow"


def test_a_preset_that_cannot_start_here_is_not_offered(qtbot, app, daemon_thread):
    """No NVIDIA GPU here: the gateway leaves the 2x4090 presets out of /v1/models (picking
    one would only fail), so the chat's picker does not offer them; the app still knows why
    each cannot start."""
    daemon_thread.write_fake_profile("fake")
    chat = app.open_chat("")
    app.actions.reload_profiles()
    qtbot.waitUntil(
        lambda: "fake" in chat.controller.models and bool(app.state.why_blocked("llama-3.1-8b")),
        timeout=10000,
    )
    chat.on_models_changed()
    picker = chat.model_picker
    names = [picker.itemText(i) for i in range(picker.count())]
    assert "fake" in names and "llama-3.1-8b" not in names
    assert app.state.why_blocked("llama-3.1-8b") == "needs an NVIDIA GPU (this computer has none)"


def test_engine_dying_mid_reply_is_shown_inline_and_retry_works(qtbot, app, daemon_thread):
    chat = _ready_chat(qtbot, app, daemon_thread, "--crash-after-tokens 3 --token-delay 0.02")
    _send(qtbot, chat, "crash please", 50)
    card = chat.transcript.error_card
    qtbot.waitUntil(card.isVisible, timeout=10000)
    assert "stopped in the middle of the reply" in card.message.text()
    qtbot.waitUntil(lambda: len(chat.transcript.messages) == 2, timeout=5000)
    stored = _stored_reply(qtbot, daemon_thread, chat)
    assert stored[1].finish_reason == "error" and stored[1].content == "w0 w1 w2 "

    # the supervisor restarts the engine; Retry replaces the interrupted reply. (Until the app
    # has heard of the crash it still lists "fake" as served: wait for the restarted engine.)
    def restarted() -> bool:
        status = daemon_thread.engine("fake")
        return status is not None and status.restarts == 1 and status.state == EngineState.READY

    qtbot.waitUntil(restarted, timeout=20000)
    qtbot.waitUntil(lambda: app.state.served_models() == ["fake"], timeout=20000)
    chat.max_tokens.setValue(2)
    chat.controller.options = chat.options()
    card.button("retry").click()
    qtbot.waitUntil(lambda: chat.transcript.messages[-1].text == "w0 w1 ", timeout=10000)
    assert not card.isVisible()


def test_lost_daemon_mid_reply_recovers_on_its_own(qtbot, app, daemon_thread) -> None:
    chat = _ready_chat(qtbot, app, daemon_thread, "--token-delay 0.05")
    _send(qtbot, chat, "long answer", 2000)
    qtbot.waitUntil(lambda: len(chat.controller.reply.split()) >= 3, timeout=10000)
    daemon_thread.stop()  # the daemon goes away in the middle of the reply
    card = chat.transcript.error_card
    qtbot.waitUntil(card.isVisible, timeout=15000)
    qtbot.waitUntil(chat.banner.isVisible, timeout=5000)  # "lost the daemon …; waiting …"
    partial = chat.transcript.streaming
    assert partial is not None and len(partial.text.split()) >= 3  # still on screen
    qtbot.waitUntil(lambda: len(chat.controller.pending_replies) == 1, timeout=5000)

    daemon_thread.start()  # it comes back: the app reconnects and stores the kept reply
    qtbot.waitUntil(lambda: not chat.banner.isVisible(), timeout=15000)
    qtbot.waitUntil(lambda: chat.controller.pending_replies == [], timeout=5000)
    qtbot.waitUntil(lambda: len(chat.transcript.messages) == 2, timeout=5000)
    stored = _stored_reply(qtbot, daemon_thread, chat)
    assert stored[1].finish_reason == "interrupted" and len(stored[1].content.split()) >= 3
    # Retry is offered as soon as the stored reply is shown
    qtbot.waitUntil(
        lambda: chat.transcript.messages[1].buttons["retry"].isVisibleTo(chat), timeout=5000
    )


def test_markdown_code_block_has_a_working_copy_button(qtbot) -> None:
    view = TranscriptView()
    qtbot.addWidget(view)
    text = "Try this:\n\n```python\nprint('hi')\nx = 1\n```\n\nThen **run** it."
    message = ChatMessage(1, 1, 0, "assistant", text, "m", {"ttft_s": 0.25}, "stop", 0.0)
    view.set_messages([message], "m")
    view.show()
    (code,) = view.findChildren(CodeBlockView)
    assert code.language.text() == "python"
    code.copy_button.click()
    assert QGuiApplication.clipboard().text() == "print('hi')\nx = 1"
    labels = [w.text() for w in view.messages[0].findChildren(type(view.placeholder))]
    assert "Try this:" in labels and "Then **run** it." in labels
    assert view.messages[0].stats.text() == "TTFT 0.25 s"


def _open_stored_chat(
    qtbot, app: DesktopApp, d: ThreadedDaemon, messages: list[dict]
) -> ChatWindow:
    """A conversation as a killed app or daemon left it, opened in a fresh chat window."""
    chat_id = d.run(lambda c: c.create_chat(model="fake")).chat_id
    d.run(lambda c: c.add_chat_messages(chat_id, messages))
    chat = _ready_chat(qtbot, app, d)
    qtbot.waitUntil(lambda: chat.chat_list.count() == 1, timeout=5000)
    chat.on_chat_clicked(chat.chat_list.item(0))
    qtbot.waitUntil(lambda: len(chat.transcript.messages) == len(messages), timeout=5000)
    _wait_shown(qtbot, chat)
    return chat


def _wait_shown(qtbot, chat: ChatWindow) -> None:
    """Until the transcript's message views are on screen: Qt shows a widget added to a shown
    layout by a queued call, so right after the transcript is rebuilt none is visible yet."""
    qtbot.waitUntil(
        lambda: all(m.isVisibleTo(chat) for m in chat.transcript.messages), timeout=5000
    )


def test_an_interrupted_reply_offers_retry(qtbot, app, daemon_thread) -> None:
    chat = _open_stored_chat(
        qtbot,
        app,
        daemon_thread,
        [
            {"role": "user", "content": "tell me"},
            {"role": "assistant", "content": "w0 w1", "finish_reason": "interrupted"},
        ],
    )
    reply = chat.transcript.messages[1]
    assert "interrupted" in reply.stats.text()
    assert reply.buttons["retry"].isVisibleTo(chat)
    assert not reply.buttons["regenerate"].isVisibleTo(chat)
    chat.max_tokens.setValue(3)
    chat.controller.options = chat.options()
    reply.buttons["retry"].click()
    qtbot.waitUntil(lambda: chat.controller.streaming is not None, timeout=5000)
    qtbot.waitUntil(
        lambda: [m.text for m in chat.transcript.messages] == ["tell me", "w0 w1 w2 "],
        timeout=10000,
    )
    stored = _stored(daemon_thread, chat)
    assert stored[1].finish_reason == "stop" and stored[1].content == "w0 w1 w2 "
    _wait_shown(qtbot, chat)
    assert not chat.transcript.messages[1].buttons["retry"].isVisibleTo(chat)


def test_an_unanswered_message_offers_retry(qtbot, app, daemon_thread) -> None:
    chat = _open_stored_chat(qtbot, app, daemon_thread, [{"role": "user", "content": "hello?"}])
    question = chat.transcript.messages[0]
    assert question.buttons["retry"].isVisibleTo(chat)
    chat.max_tokens.setValue(2)
    chat.controller.options = chat.options()
    question.buttons["retry"].click()
    qtbot.waitUntil(lambda: chat.controller.streaming is not None, timeout=5000)
    assert not question.buttons["retry"].isVisibleTo(chat)  # not while a reply streams
    qtbot.waitUntil(lambda: len(chat.transcript.messages) == 2, timeout=10000)
    assert [m.content for m in _stored(daemon_thread, chat)] == ["hello?", "w0 w1 "]


def test_long_chat_titles_are_not_clipped_behind_the_scrollbar(qtbot, app, daemon_thread) -> None:
    """Many chats with long titles: the list scrolls up and down only, each title ends in "…"
    inside the visible list (the whole title in its tooltip), none runs under the scroll bar."""
    long = "a question long enough to need more room than the list has to show it whole"
    for i in range(25):
        daemon_thread.run(lambda c, i=i: c.create_chat(title=f"{i} {long}"))
    chat = app.open_chat("")
    chat.show()
    qtbot.waitUntil(lambda: chat.chat_list.count() == 25, timeout=5000)
    chat.chat_list.verticalScrollBar().setValue(0)
    QApplication.processEvents()
    lst = chat.chat_list
    assert lst.verticalScrollBar().isVisible()
    assert lst.horizontalScrollBar().maximum() == 0  # no sideways scrolling to read a title
    item = lst.item(0)
    assert lst.visualItemRect(item).right() <= lst.viewport().width()
    assert item.toolTip().startswith(item.text())


def test_a_long_status_line_does_not_widen_the_window(qtbot, app, daemon_thread) -> None:
    chat = app.open_chat("")
    qtbot.waitExposed(chat)
    width = chat.width()
    before = chat.minimumSizeHint().width()
    long = "the engine said: " + "no room " * 400
    chat.status.setText(long)
    chat.adjustSize()
    assert chat.minimumSizeHint().width() <= before
    assert chat.width() <= max(width, before)
    assert chat.status.toolTip() == long and chat.status.text() == long
    assert chat.status.elided().endswith("…") and len(chat.status.elided()) < len(long)
