"""The tray's Models menu and the chat window's Agents menu open an agent CLI in a terminal
(`traylm launch AGENT`) where a terminal emulator is on PATH: a FAKE ``xterm`` that records its
argv stands in for one; with none on PATH the entries are hidden. Against a real daemon with
the FAKE vLLM engine."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest
from PySide6.QtGui import QAction

from desktop.app import DesktopApp
from tests.desktop.conftest import ThreadedDaemon

FAKE_XTERM = f"""#!{sys.executable}
# FAKE xterm: records the command it was asked to run, one word a line, and exits
import os, sys
record = os.environ["FAKE_XTERM_RECORD"]
with open(record + ".tmp", "w") as fh:
    fh.write("\\n".join(sys.argv[1:]))
os.replace(record + ".tmp", record)
"""


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PATH is this folder alone: no terminal emulator unless a test puts one there."""
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", str(folder))
    monkeypatch.setenv("FAKE_XTERM_RECORD", str(tmp_path / "xterm.args"))
    return folder


def install_fake_xterm(bin_dir: Path) -> None:
    xterm = bin_dir / "xterm"
    xterm.write_text(FAKE_XTERM)
    xterm.chmod(xterm.stat().st_mode | stat.S_IXUSR)


def tray_agents(app: DesktopApp) -> list[QAction]:
    app.tray.menu.aboutToShow.emit()  # the menus refresh themselves when opened
    return [a for a in app.tray.models_menu.actions() if a.objectName().startswith("agent:")]


def ran(qtbot, tmp_path: Path) -> list[str]:
    record = tmp_path / "xterm.args"
    qtbot.waitUntil(record.exists, timeout=10000)
    words = record.read_text().splitlines()
    record.unlink()
    return words


def test_with_a_terminal_both_menus_open_the_agent_in_it(
    qtbot, bin_dir: Path, tmp_path: Path, daemon_thread: ThreadedDaemon, app_factory
) -> None:
    install_fake_xterm(bin_dir)
    daemon_thread.write_fake_profile("fake")
    app = app_factory()
    app.actions.start_profile("fake")
    qtbot.waitUntil(lambda: app.state.served_models() == ["fake"], timeout=20000)
    actions = tray_agents(app)
    assert [a.text() for a in actions] == [
        "Open Claude Code in a terminal",
        "Open Codex in a terminal",
        "Open opencode in a terminal",
    ]
    actions[0].trigger()
    words = ran(qtbot, tmp_path)
    assert words[:4] == ["-e", "sh", "-c", words[3]] and "launch" in words[3]
    assert words[-1] == "claude"  # no --model: launch takes the loaded one that can
    chat = app.open_chat("fake")
    qtbot.waitUntil(lambda: chat.model_picker.currentText() == "fake", timeout=5000)
    button = chat.findChild(type(chat.params_toggle), "agentsButton")
    assert button is not None and not button.isHidden()
    [codex] = [a for a in button.menu().actions() if a.objectName() == "agent:codex"]
    codex.trigger()
    assert ran(qtbot, tmp_path)[-3:] == ["codex", "--model", "fake"]


def test_without_a_terminal_no_entry(
    qtbot, bin_dir: Path, daemon_thread: ThreadedDaemon, app_factory
) -> None:
    daemon_thread.write_fake_profile("fake")
    app = app_factory()
    app.actions.start_profile("fake")
    qtbot.waitUntil(lambda: app.state.served_models() == ["fake"], timeout=20000)
    assert tray_agents(app) == []
    chat = app.open_chat("fake")
    button = chat.findChild(type(chat.params_toggle), "agentsButton")
    assert button is not None and button.isHidden()
