"""The chat window past the model's context: it says so in words, offers what fits (leave the
oldest turns out, keep the first and the latest, a new chat), keeps the policy with the chat,
shows how full the context is, and labels a reply cut by it. Against the real daemon, with a
FAKE server of a small context attached to it (tests/fakes/context_server.py)."""

from __future__ import annotations

from desktop.chat.controller import SUMMARY_ASK
from tests.desktop.test_chat import _send, _stored, _stored_reply
from tests.fakes.context_server import FakeContextServer


def test_a_full_context_is_never_a_dead_end(qtbot, app, daemon_thread) -> None:
    """A model with a 40-token context (a FAKE server attached to the real daemon, refusing
    as vLLM does): the third question no longer fits. The chat says so in words (not the
    engine's raw 400) and offers what fits instead of a Retry that fails the same way; leaving
    the oldest turns out answers it, the conversation here stays whole, the policy is kept
    with the chat, and the context line says how full it is and what was left out."""
    server = FakeContextServer("tiny", 40).start()
    try:
        daemon_thread.run(lambda c: c.attach("tiny", server.url))
        chat = app.open_chat("")
        qtbot.waitUntil(lambda: "tiny" in chat.controller.models, timeout=10000)
        chat.select_model("tiny")
        question = "please tell me one more thing about this topic"  # 9 words: 10 tokens

        def answered(count: int) -> bool:
            shown = len(chat.transcript.messages) == count and chat.controller.streaming is None
            return shown and len(_stored(daemon_thread, chat)) == count

        _send(qtbot, chat, question, 5)
        qtbot.waitUntil(lambda: answered(2), timeout=10000)
        _send(qtbot, chat, question, 5)
        qtbot.waitUntil(lambda: answered(4), timeout=10000)
        assert len(chat.transcript.messages) == 4
        assert server.prompts == [10, 26]
        # the gateway's model list does not say the context's size: the engine's refusal will
        assert chat.context_label.text() == "Context: 31 tokens"

        _send(qtbot, chat, question, 5)  # 42 + 5 tokens: more than 40
        card = chat.transcript.error_card
        qtbot.waitUntil(card.isVisible, timeout=10000)
        # the meter agrees with the refusal (not the last reply's "31 tokens")
        assert chat.context_label.text() == "Context full: this chat needs 47 of 40 tokens"
        assert "no longer fits tiny's context (40 tokens)" in card.message.text()
        assert "maximum context length" not in card.message.text()  # not the raw 400
        assert card.button("retry") is None  # it would fail the same way
        assert not chat.transcript.messages[-1].buttons["retry"].isVisibleTo(chat)
        card.button("dropOldest").click()
        qtbot.waitUntil(
            lambda: len(chat.transcript.messages) == 6 and chat.controller.streaming is None,
            timeout=10000,
        )
        assert not card.isVisible()
        assert chat.transcript.messages[5].text == "w0 w1 w2 w3 w4 "
        assert server.prompts[-1] == 26  # the first turn left out of what the model saw
        assert server.prompts == [10, 26, 42, 26]  # one refusal, not one per turn tried
        assert len(_stored_reply(qtbot, daemon_thread, chat)) == 6  # the chat stays whole
        expected = "Context: 31 of 40 tokens (77 %) · 1 older turn left out to fit"
        assert chat.context_label.text() == expected
        # the turn left out looks it: greyed, with a note; the others do not
        left = [v.left_out_note.isVisibleTo(v) for v in chat.transcript.messages]
        assert left == [True, True, False, False, False, False]
        chat_id = chat.controller.transcript.chat.chat_id
        stored = daemon_thread.run(lambda c: c.chat(chat_id)).chat.params
        assert stored["context_policy"] == 1.0  # kept with the chat

        _send(qtbot, chat, question, 5)  # the policy does it on its own from now on
        qtbot.waitUntil(lambda: len(chat.transcript.messages) == 8, timeout=10000)
        assert not card.isVisible()
        assert "2 older turns left out" in chat.context_label.text()
        assert server.prompts[-2:] == [42, 26]  # refused once with one out, then fit
    finally:
        server.stop()


def test_a_reply_cut_by_the_context_says_so(qtbot, app, daemon_thread) -> None:
    """A server that cuts a reply once its context is full (llama.cpp's way) ends it with
    finish_reason "length" before max_tokens: the reply is labelled as cut by the context,
    not "cut at max tokens"; one that reaches max_tokens keeps that label."""
    server = FakeContextServer("clamped", 20, clamp=True).start()
    try:
        daemon_thread.run(lambda c: c.attach("clamped", server.url))
        chat = app.open_chat("")
        qtbot.waitUntil(lambda: "clamped" in chat.controller.models, timeout=10000)
        chat.select_model("clamped")
        _send(qtbot, chat, "one two three", 3)  # 4 prompt tokens, 3 asked: max_tokens
        qtbot.waitUntil(lambda: len(_stored_reply(qtbot, daemon_thread, chat)) == 2)
        qtbot.waitUntil(lambda: "cut at max tokens" in chat.status.text(), timeout=5000)
        _send(qtbot, chat, "four five six", 50)  # 4 + 4 + 4 prompt tokens: 8 of 50 fit
        qtbot.waitUntil(lambda: len(chat.transcript.messages) == 4, timeout=10000)
        qtbot.waitUntil(lambda: chat.controller.streaming is None, timeout=10000)
        assert "cut: the model's context is full" in chat.status.text()
        assert "max tokens" not in chat.status.text()
        qtbot.waitUntil(lambda: len(_stored(daemon_thread, chat)) == 4, timeout=5000)
        assert _stored(daemon_thread, chat)[3].finish_reason == "context"
    finally:
        server.stop()


def test_a_full_chat_goes_on_in_a_new_chat_from_its_summary(qtbot, app, daemon_thread) -> None:
    """'New chat with a summary': the model summarizes the chat (its oldest turns left out
    until the request fits), a new chat starts with that summary as its system prompt, and
    the question the full chat could not answer waits in the composer."""
    server = FakeContextServer("small", 60).start()
    try:
        daemon_thread.run(lambda c: c.attach("small", server.url))
        chat = app.open_chat("")
        qtbot.waitUntil(lambda: "small" in chat.controller.models, timeout=10000)
        chat.select_model("small")
        question = "please tell me one more thing about this topic"

        def answered(count: int) -> bool:
            shown = len(chat.transcript.messages) == count and chat.controller.streaming is None
            return shown and len(_stored(daemon_thread, chat)) == count

        for count in (2, 4, 6):
            _send(qtbot, chat, question, 5)
            qtbot.waitUntil(lambda c=count: answered(c), timeout=10000)
        full_chat = chat.controller.transcript.chat.chat_id
        _send(qtbot, chat, question, 5)  # 58 + 5 tokens: more than 60
        card = chat.transcript.error_card
        qtbot.waitUntil(card.isVisible, timeout=10000)
        card.button("newSummary").click()
        qtbot.waitUntil(
            lambda: (
                chat.controller.transcript is not None
                and chat.controller.transcript.chat.chat_id != full_chat
            ),
            timeout=10000,
        )
        summary = "A summary of an earlier conversation:\nw0 w1 w2 w3 w4"
        qtbot.waitUntil(lambda: chat.system_prompt.toPlainText() == summary, timeout=5000)
        shown = chat.transcript.system_view  # the summary is in the chat, not only a setting
        qtbot.waitUntil(lambda: shown is not None and shown.isVisibleTo(chat), timeout=5000)
        assert shown.text == summary
        assert chat.composer.toPlainText() == question
        # the summary was asked with the first turn left out: two turns and the request
        assert server.prompts[-1] == 2 * (10 + 6) + len(SUMMARY_ASK.split()) + 1
        new_chat = chat.controller.transcript.chat.chat_id
        assert daemon_thread.run(lambda c: c.chat(new_chat)).chat.system_prompt == summary
        kept = daemon_thread.run(lambda c: c.chat(full_chat)).messages
        assert [m.role for m in kept][:7] == ["user", "assistant"] * 3 + ["user"]  # kept whole
    finally:
        server.stop()
