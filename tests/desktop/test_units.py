"""The pure parts of the desktop app: Markdown splitting, the
tray's state and tooltip, the SSE collector, the autostart entry, the profile form; and the
PySide6 signal refcount regression that made 6.12.0 unusable."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import MappingProxyType

import pytest
from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QComboBox

from desktop.chat.markdown import Block, split_blocks
from desktop.daemon.batches import batch_text
from desktop.daemon.gateway import ChatRequest, _Collector, error_from_body
from desktop.daemon.messages import LinkState, ProfileEntry, freeze
from desktop.dashboard.profile_form import ProfileForm
from desktop.session import autostart
from desktop.tray.icon_state import tooltip_text, tray_state
from desktop.tray.icons import TrayState
from engines.events import EngineState, EngineStatus


def test_markdown_blocks() -> None:
    text = "Intro **bold**\n\n```py\nx = 1\n```\nmiddle\n~~~\nopen"
    assert split_blocks(text) == (
        Block("text", "Intro **bold**"),
        Block("code", "x = 1", "py"),
        Block("text", "middle"),
        Block("code", "open", "", closed=False),  # still streaming
    )
    assert split_blocks("````md\n```py\ninner\n```\n````") == (
        Block("code", "```py\ninner\n```", "md"),
    )
    assert split_blocks("") == ()


def _status(engine_id: str, state: EngineState) -> EngineStatus:
    return EngineStatus(
        engine_id, "vllm", state, (engine_id,), 1234, 99, 0, "", None, None, None, engine_id,
        "cpu", "0.32.0",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("link", "states", "busy", "hot", "expected"),
    [
        (LinkState.CONNECTED, [], False, False, TrayState.STOPPED),
        (LinkState.CONNECTED, [EngineState.STOPPED], False, False, TrayState.STOPPED),
        (LinkState.CONNECTED, [EngineState.STARTING], False, False, TrayState.STARTING),
        (LinkState.CONNECTED, [EngineState.READY], False, False, TrayState.READY),
        (LinkState.CONNECTED, [EngineState.SLEEPING], False, False, TrayState.READY),
        (LinkState.CONNECTED, [EngineState.READY], True, False, TrayState.BUSY),
        (LinkState.CONNECTED, [EngineState.READY, EngineState.FAILED], True, False, "error"),
        (LinkState.CONNECTED, [EngineState.READY], True, True, TrayState.HOT),
        (LinkState.UNREACHABLE, [EngineState.READY], False, False, TrayState.ERROR),
        (LinkState.VERSION_MISMATCH, [], False, False, TrayState.ERROR),
        (LinkState.STARTING_DAEMON, [], False, False, TrayState.STARTING),
    ],
)
def test_tray_state_priorities(link, states, busy, hot, expected) -> None:
    engines = [_status(f"e{i}", s) for i, s in enumerate(states)]
    assert tray_state(link, engines, busy=busy, hot=hot) == expected


def test_tooltip_text() -> None:
    text = tooltip_text(
        link=LinkState.CONNECTED,
        link_message="",
        endpoint="http://127.0.0.1:8000/v1",
        engines=[_status("llama", EngineState.READY), _status("old", EngineState.STOPPED)],
        tokens_per_s=41.26,
        lan_sharing=True,
    )
    assert text == "traylm — http://127.0.0.1:8000/v1 (LAN)\nllama: ready\n41.3 tokens/s"
    down = tooltip_text(
        link=LinkState.UNREACHABLE,
        link_message="the daemon is not running",
        endpoint="",
        engines=[],
        tokens_per_s=None,
        lan_sharing=False,
    )
    assert down == "traylm — the daemon is not running"


def test_the_tooltip_says_how_far_the_running_batch_is() -> None:
    running = {"request_counts": {"total": 1000, "completed": 400, "failed": 20}}
    assert batch_text({"batches": [running, dict(running)]}) == "batch: 420/1000 done (+1 waiting)"
    assert batch_text({"batches": []}) == "" and batch_text({}) == ""
    text = tooltip_text(
        link=LinkState.CONNECTED,
        link_message="",
        endpoint="http://127.0.0.1:8000/v1",
        engines=[_status("llama", EngineState.READY)],
        tokens_per_s=None,
        lan_sharing=False,
        batches=batch_text({"batches": [running]}),
    )
    assert text.splitlines()[-1] == "batch: 420/1000 done"


def _collector(posted: list[object]) -> _Collector:
    return _Collector(ChatRequest(7, "m", (("user", "hi", ()),), 0.7, 1.0, 16), posted.append)


def _line(data: object) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n"


def test_sse_collector_counts_tokens_and_reads_errors() -> None:
    posted: list[object] = []
    c = _collector(posted)
    assert c.feed(b": keep-alive\n")
    assert c.feed(_line({"choices": [{"delta": {"role": "assistant"}}]}))
    for word in ("Hel", "lo", "!"):
        assert c.feed(_line({"choices": [{"delta": {"content": word}}]}))
    assert c.feed(_line({"choices": [{"delta": {}, "finish_reason": "length"}]}))
    assert c.feed(_line({"choices": [], "usage": {"completion_tokens": 16}}))
    assert not c.feed(b"data: [DONE]\n")
    ended = c.ended("")
    assert ended.content == "Hello!" and ended.finish_reason == "length"  # max_tokens (16)
    assert ended.completion_tokens == 16  # usage wins over counted chunks
    assert ended.ttft_s is not None and ended.ttft_s >= 0
    assert "".join(getattr(p, "text", "") for p in posted) == "Hello!"  # nothing lost

    broken = _collector([])
    broken.feed(_line({"choices": [{"delta": {"content": "w0 "}}]}))
    broken.feed(_line({"error": {"message": "engine fake stopped in the middle of the reply"}}))
    ended = broken.ended("")
    assert ended.finish_reason == "error" and ended.content == "w0 "
    assert ended.error is not None and ended.error.kind == "engine_error"

    stopping = _collector([])  # traylm itself stopped: kept as interrupted, with Retry
    stopping.feed(_line({"choices": [{"delta": {"content": "w0 "}}]}))
    stopping.feed(_line({"error": {"message": "traylm is stopping", "type": "traylm_stopping"}}))
    ended = stopping.ended("")
    assert ended.finish_reason == "interrupted" and ended.content == "w0 "
    assert ended.error is not None and ended.error.kind == "connection_lost"


def test_gateway_errors_become_kinds() -> None:
    body = json.dumps({"error": {"message": "m is starting", "type": "engine_starting"}})
    assert error_from_body(503, body.encode()).kind == "engine_starting"
    assert error_from_body(401, b'{"error": {"message": "key"}}').kind == "unauthorized"
    assert error_from_body(404, b"not json").kind == "model_not_found"
    assert error_from_body(500, b"boom").kind == "http_error"


def test_freeze_makes_everything_read_only() -> None:
    frozen = freeze({"a": [1, {"b": [2]}]})
    assert isinstance(frozen, MappingProxyType)
    inner = frozen["a"]
    assert inner == (1, MappingProxyType({"b": (2,)}))
    with pytest.raises(TypeError):
        frozen["c"] = 1  # type: ignore[index]


def test_profile_entry_served_names() -> None:
    entry = ProfileEntry("p", False, freeze({"model": "org/Name-7B", "aliases": ["x"]}))  # type: ignore[arg-type]
    assert entry.served_names == ("Name-7B", "x")
    named = ProfileEntry("p", False, freeze({"model": "org/y", "served_name": "s"}))  # type: ignore[arg-type]
    assert named.served_names == ("s",)


def test_autostart_entry(tmp_path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path / "cfg"), "HOME": str(tmp_path)}
    assert autostart.autostart_path(env) == tmp_path / "cfg" / "autostart" / "traylm.desktop"
    assert autostart.autostart_path({"HOME": str(tmp_path)}) == (
        tmp_path / ".config" / "autostart" / "traylm.desktop"
    )
    assert not autostart.is_enabled(env)
    path = autostart.set_enabled(True, env)
    assert autostart.is_enabled(env)
    text = path.read_text()
    assert text.startswith("[Desktop Entry]\nType=Application\n")
    assert "\nExec=" in text and "traylm.svg" in text
    autostart.set_enabled(False, env)
    assert not path.exists() and not autostart.is_enabled(env)


def test_profile_form_round_trip(qtbot) -> None:
    form = ProfileForm()
    qtbot.addWidget(form)
    form.load(
        {
            "model": "org/m",
            "gpus": (0, 1),
            "tensor_parallel_size": 2,
            "extra_flags": ("--max-num-seqs", "8", "--enforce-eager"),
            "env": MappingProxyType({"A": "1"}),
            "max_model_len": None,
        }
    )
    values, problems = form.values()
    assert problems == []
    assert values["gpus"] == [0, 1] and values["tensor_parallel_size"] == 2
    assert values["extra_flags"] == ["--max-num-seqs", "8", "--enforce-eager"]
    assert values["env"] == {"A": "1"} and values["max_model_len"] is None
    form.widgets["env"].setPlainText("NOEQUALS")  # type: ignore[union-attr]
    _, problems = form.values()
    assert problems == ["env line 'NOEQUALS' needs KEY=VALUE"]


def test_profile_form_shows_the_parsers_in_plain_words(qtbot) -> None:
    form = ProfileForm()
    qtbot.addWidget(form)
    tools = form.widgets["tool_parser"]
    assert isinstance(tools, QComboBox) and tools.isEditable()
    label = form.layout_.labelForField(tools)
    assert label is not None and label.text() == "Tool calling format"  # type: ignore[attr-defined]
    reasoning = form.layout_.labelForField(form.widgets["reasoning_parser"])
    assert reasoning.text() == "Reasoning (thinking) format"  # type: ignore[union-attr]
    assert tools.itemText(0) == "" and "llama3_json" in [
        tools.itemText(i) for i in range(tools.count())
    ]
    form.load({"model": "org/m"})
    values, _ = form.values()
    assert values["tool_parser"] == "" and values["reasoning_parser"] == ""  # empty: off
    form.load({"model": "org/m", "tool_parser": "my_plugin_parser"})  # any name can be typed
    assert form.values()[0]["tool_parser"] == "my_plugin_parser"
    form.set_value("reasoning_parser", "qwen3")
    assert form.values()[0]["reasoning_parser"] == "qwen3"


class _Emitter(QObject):
    fired = Signal(object)


def test_signal_emit_keeps_refcounts() -> None:
    """PySide6 6.12.0 drops a reference to True on every Python emit(); on CPython < 3.12 the
    app then aborts with 'deallocating True' after a few hundred signals. pyproject excludes
    that version; this test fails on it."""
    emitter = _Emitter()
    emitter.fired.connect(lambda _v: None)
    before = sys.getrefcount(True)
    for _ in range(200):
        emitter.fired.emit(object())
    assert sys.getrefcount(True) >= before - 5


def test_no_display_gives_a_clear_message_instead_of_a_qt_abort(tmp_path: Path) -> None:
    import subprocess
    import sys

    from desktop.app import no_display_reason

    assert no_display_reason({"DISPLAY": ":0"}) is None
    assert no_display_reason({"QT_QPA_PLATFORM": "offscreen"}) is None
    env = {
        k: v
        for k, v in __import__("os").environ.items()
        if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")
    }
    out = subprocess.run(
        [sys.executable, "-m", "engines"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2
    assert "no graphical session here" in out.stderr and "traylm serve" in out.stderr
    assert "platform plugin" not in out.stderr


def test_a_delete_confirmation_counts_down_then_goes_back(qtbot, monkeypatch) -> None:
    from PySide6.QtWidgets import QPushButton

    from desktop.widgets import confirm

    monkeypatch.setattr(confirm, "CONFIRM_WINDOW_S", 2)
    button = QPushButton("Delete")
    qtbot.addWidget(button)
    assert not confirm.second_click(button)
    assert button.text() == "Confirm delete (2 s)"
    qtbot.waitUntil(lambda: button.text() == "Confirm delete (1 s)", timeout=3000)
    qtbot.waitUntil(lambda: button.text() == "Delete", timeout=3000)
    assert not confirm.second_click(button)  # asks again
    assert confirm.second_click(button) and button.text() == "Delete"


def test_the_daemons_commands_are_said_as_clicks_in_the_app() -> None:
    from desktop.daemon.fixes import in_words

    cases = {
        "needs the vLLM engine (CUDA build): traylm engines install vllm": (
            "needs the vLLM engine (CUDA build): install the vLLM engine in Engines ▸ Environments"
        ),
        "run `traylm engines install sglang` first": (
            "install the SGLang engine in Engines ▸ Environments first"
        ),
        "add it with `traylm models add PATH`": "add the folder in Models ▸ Library (Add a folder…)",
        "no key (`traylm remote set-key`)": "no key (set the key in Engines ▸ Remote fallback)",
        "the Hub (hub.endpoint / HF_ENDPOINT) cannot be reached": (
            "the Hub (the Hub address in Settings) cannot be reached"
        ),
        "too small: give --budget 8m or more": "too small: give a budget of 8m or more",
        "`traylm logs tiny` shows why": "`traylm logs tiny` shows why",  # no click does it
        (
            "Set tool_parser = \"hermes\" in profile 'fake' (`traylm models set fake "
            'tool_parser=hermes` does; the dashboard calls it "Tool calling format"), then '
            "stop and start the engine: `traylm stop fake` and `traylm start fake`."
        ): (
            'Set tool_parser = "hermes" in profile \'fake\' ("Tool calling format" in Engines '
            "▸ Profiles), then restart engine fake (Restart in Engines, or in the tray)."
        ),
    }
    for message, words in cases.items():
        assert in_words(message) == words
