"""Tools in the chat (MCP), through the real app against the real daemon, the FAKE vLLM engine
emitting tool calls (``--tool-call``) and a REAL stdio MCP server written with the same SDK
(tests/fakes/mcp_server.py): approve, always allow, deny, a call that times out, a server that
crashes at start, a model without a tool parser, the server's environment, and its process
gone when the chat window closes and when the app quits."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import psutil
import pytest
from PySide6.QtCore import Qt

from desktop.app import DesktopApp
from desktop.chat.tool_calls import ToolCallView
from desktop.chat.window import ChatWindow
from desktop.daemon.keyfile import write_key
from engines.config.sections import Paths
from engines.events import ChatMessage
from tests.desktop.conftest import ThreadedDaemon

SERVER = str(Path(__file__).parents[1] / "fakes" / "mcp_server.py")
KEY = "sk-traylm-user-key-never-for-servers"


def _servers(paths: Paths, **servers: list[str]) -> None:
    """mcp.json with these stdio servers (name: the test server's arguments)."""
    doc = {
        "mcpServers": {
            n: {"command": sys.executable, "args": [SERVER, *a]} for n, a in servers.items()
        }
    }
    paths.config_dir.mkdir(parents=True, exist_ok=True)
    (paths.config_dir / "mcp.json").write_text(json.dumps(doc))


def _chat(
    qtbot, app: DesktopApp, d: ThreadedDaemon, *calls: str, parser: str = "hermes"
) -> ChatWindow:
    args = " ".join(f"--tool-call {shlex.quote(c)}" for c in calls)
    d.write_fake_profile("fake", args=args, **({"tool_parser": parser} if parser else {}))
    app.actions.reload_profiles()  # a profile written behind the app's back: it hears of it
    app.actions.start_profile("fake")
    qtbot.waitUntil(lambda: app.state.served_models() == ["fake"], timeout=20000)
    chat = app.open_chat("")
    qtbot.waitUntil(lambda: chat.controller.loaded == ("fake",), timeout=5000)
    return chat


def _send(qtbot, chat: ChatWindow, text: str) -> None:
    chat.max_tokens.setValue(3)
    chat.composer.setPlainText(text)
    qtbot.keyClick(chat.composer, Qt.Key.Key_Return)


def _asking(qtbot, chat: ChatWindow, name: str) -> ToolCallView:
    """The call of ``name`` that waits for the user's answer."""

    def waiting() -> ToolCallView | None:
        for view in chat.findChildren(ToolCallView):
            if name in view.title.text() and not view.buttons["deny"].isHidden():
                return view
        return None

    qtbot.waitUntil(lambda: waiting() is not None, timeout=20000)
    view = waiting()
    assert view is not None
    return view


def _reply(qtbot, d: ThreadedDaemon, chat: ChatWindow, count: int = 2) -> ChatMessage:
    """The stored reply, once the window stored it (with its tool calls)."""

    def stored() -> tuple[ChatMessage, ...]:
        t = chat.controller.transcript
        return d.run(lambda c: c.chat(t.chat.chat_id)).messages if t else ()

    qtbot.waitUntil(
        lambda: len(stored()) >= count and "duration_s" in stored()[-1].stats, timeout=20000
    )  # (the daemon keeps the streamed text first; the window's own reply has its figures)
    return stored()[-1]


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_an_allowed_call_runs_its_result_goes_back_and_the_server_stops_with_the_window(
    qtbot, app, daemon_thread, paths: Paths, tmp_path: Path
) -> None:
    env_file = tmp_path / "env.json"
    _servers(paths, calc=["--env-file", str(env_file)])
    write_key(paths, KEY)
    chat = _chat(qtbot, app, daemon_thread, 'add:{"a": 2, "b": 40}')
    _send(qtbot, chat, "what is 2 + 40?")
    view = _asking(qtbot, chat, "add")
    assert '"a": 2' in view.arguments.text() and "calc" in view.title.text()
    assert not env_file.exists() or chat.controller.tools.runs == []  # nothing ran yet
    qtbot.mouseClick(view.buttons["once"], Qt.MouseButton.LeftButton)
    reply = _reply(qtbot, daemon_thread, chat)
    assert reply.content.startswith("tool said: 42 ")  # the result reached the model
    assert [(t.name, t.server, t.outcome, t.result) for t in reply.tools] == [
        ("add", "calc", "allowed", "42")
    ]
    qtbot.waitUntil(lambda: chat.transcript.messages[-1].findChildren(ToolCallView) != [])
    shown = chat.transcript.messages[-1].findChildren(ToolCallView)
    assert len(shown) == 1 and not shown[0].result_toggle.isHidden()
    assert shown[0].result.isHidden()  # collapsed
    shown[0].result_toggle.click()
    assert not shown[0].result.isHidden() and shown[0].result.toPlainText() == "42"

    info = json.loads(env_file.read_text())
    env = info["env"]
    assert not [k for k in env if k.startswith("TRAYLM")] and "PATH" in env
    assert KEY not in json.dumps(env)
    pid = int(info["pid"])
    assert not _gone(pid)
    chat.close()
    qtbot.waitUntil(lambda: _gone(pid), timeout=10000)


@pytest.mark.slow
def test_always_allow_asks_once(qtbot, app, daemon_thread, paths: Paths) -> None:
    _servers(paths, calc=[])
    chat = _chat(qtbot, app, daemon_thread, 'add:{"a": 1, "b": 2}')
    _send(qtbot, chat, "add")
    qtbot.mouseClick(_asking(qtbot, chat, "add").buttons["always"], Qt.MouseButton.LeftButton)
    _reply(qtbot, daemon_thread, chat)
    _send(qtbot, chat, "add again")
    reply = _reply(qtbot, daemon_thread, chat, count=4)
    assert reply.content.startswith("tool said: 3 ") and reply.tools[0].outcome == "allowed"


@pytest.mark.slow
def test_deny_tells_the_model_and_a_call_past_its_timeout_is_said(
    qtbot, app, daemon_thread, paths: Paths
) -> None:
    _servers(paths, calc=[])
    chat = _chat(qtbot, app, daemon_thread, 'add:{"a": 1, "b": 2}', 'slow:{"seconds": 60}')
    chat.controller.tools.call_timeout_s = 1.0
    _send(qtbot, chat, "add, then wait")
    qtbot.mouseClick(_asking(qtbot, chat, "add").buttons["deny"], Qt.MouseButton.LeftButton)
    qtbot.mouseClick(_asking(qtbot, chat, "slow").buttons["once"], Qt.MouseButton.LeftButton)
    reply = _reply(qtbot, daemon_thread, chat)
    assert [t.outcome for t in reply.tools] == ["denied", "failed"]
    assert reply.content.startswith("tool said: The user denied this tool call")
    assert "slow did not answer within 1 s (the call timed out)" in reply.content


def test_a_server_that_crashes_is_said_and_servers_end_when_the_app_quits(
    qtbot, app, daemon_thread, paths: Paths, tmp_path: Path
) -> None:
    env_file = tmp_path / "env.json"
    _servers(paths, broken=["--crash"], calc=["--env-file", str(env_file)])
    chat = _chat(qtbot, app, daemon_thread, 'add:{"a": 1, "b": 2}')
    _send(qtbot, chat, "add")
    qtbot.mouseClick(_asking(qtbot, chat, "add").buttons["once"], Qt.MouseButton.LeftButton)
    notices = [e.text() for e in chat.transcript.extras if e.objectName() == "toolNotice"]
    assert any("broken" in n and "crashing at start on purpose" in n for n in notices)
    assert _reply(qtbot, daemon_thread, chat).content.startswith("tool said: 3 ")
    pid = int(json.loads(env_file.read_text())["pid"])
    app.shutdown()
    assert _gone(pid)  # quitting waited for it


def test_a_model_without_a_tool_parser_is_said_and_asked_without_tools(
    qtbot, app, daemon_thread, paths: Paths
) -> None:
    _servers(paths, calc=[])
    chat = _chat(qtbot, app, daemon_thread, 'add:{"a": 1, "b": 2}', parser="")
    qtbot.waitUntil(  # the app's next read of the servable models (slow on a loaded box)
        lambda: bool(app.state.servable.get("fake") and app.state.servable["fake"].tools_blocked),
        timeout=30000,
    )
    _send(qtbot, chat, "add")
    qtbot.waitUntil(lambda: chat.transcript.extras != [], timeout=10000)
    notice = chat.transcript.extras[0].text()
    assert "'fake' cannot call tools" in notice and "tool_parser" in notice
    assert notice.count("cannot call tools") == 1  # said once, not twice over
    assert "asked without the MCP servers' tools" in notice
    assert "Tool calling format" in notice and "`traylm" not in notice  # words, not commands
    reply = _reply(qtbot, daemon_thread, chat)
    assert reply.content == "w0 w1 w2 " and reply.tools == ()


def test_the_tools_menu_imports_another_apps_file(qtbot, app, paths: Paths, tmp_path: Path) -> None:
    chat = app.open_chat("")
    button = chat.tools_button
    source = tmp_path / "claude_desktop_config.json"
    source.write_text(json.dumps({"mcpServers": {"calc": {"command": "calc-server"}}}))
    bad = tmp_path / "bad.json"
    bad.write_text('{"servers": {}}')
    chosen = iter([str(bad), str(source)])
    button.choose_file = lambda: next(chosen)

    def notices() -> list[str]:
        return [e.text() for e in chat.transcript.extras if e.objectName() == "toolNotice"]

    def import_now() -> None:
        button.menu().aboutToShow.emit()
        action = next(a for a in button.menu().actions() if a.objectName() == "importMcp")
        action.trigger()

    import_now()
    qtbot.waitUntil(lambda: len(notices()) == 1, timeout=5000)
    assert "Nothing was imported" in notices()[0] and '"mcpServers"' in notices()[0]
    assert not (paths.config_dir / "mcp.json").exists()
    import_now()
    qtbot.waitUntil(lambda: len(notices()) == 2, timeout=5000)
    assert "1 MCP server(s) configured now" in notices()[1]
    stored = json.loads((paths.config_dir / "mcp.json").read_text())
    assert stored == {"mcpServers": {"calc": {"command": "calc-server", "args": []}}}
    button.menu().aboutToShow.emit()
    assert any(a.text().startswith("calc — calc-server") for a in button.menu().actions())
