"""`traylm` with tray-app options: engines/cli.py hands them to desktop.app.main instead of
failing on them (`traylm --show chat`, `traylm --page models`, which is also a subcommand name),
subcommands still parse as before, bad options get one clear error, and a second
`traylm --show chat` opens the chat window of the tray app already running (real processes,
offscreen)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

import desktop.app
from desktop.session.instance import send_command
from engines import __version__
from engines.cli import main as cli_main
from engines.config.sections import Paths

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def desktop_calls(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    calls: list[list[str]] = []

    def fake_main(argv: Sequence[str] = ()) -> int:
        calls.append(list(argv))
        return 0

    monkeypatch.setattr(desktop.app, "main", fake_main)
    return calls


@pytest.mark.parametrize(
    "words",
    [[], ["-v"], ["--show", "chat"], ["-v", "--page", "models"], ["--no-tray", "--show=dashboard"]],
)
def test_tray_app_options_go_to_the_tray_app(words, desktop_calls) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli_main(words)
    assert exit_.value.code == 0
    assert desktop_calls == [words]


def test_subcommands_still_parse_as_before(desktop_calls, paths, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli_main(["--version"])
    assert exit_.value.code == 0 and __version__ in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        cli_main(["status"])  # no daemon in this private TRAYLM_HOME
    assert exit_.value.code == 1 and "traylm:" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        cli_main(["--help"])
    assert exit_.value.code == 0 and "--show chat|dashboard" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        cli_main(["bogus"])
    assert exit_.value.code == 2 and "invalid choice: 'bogus'" in capsys.readouterr().err
    assert desktop_calls == []


def _traylm(*words: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "engines", *words],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def _env(paths: Paths) -> dict[str, str]:
    assert Paths.from_env().state_dir == paths.state_dir  # TRAYLM_HOME is the test's own
    return {**os.environ, "QT_QPA_PLATFORM": "offscreen"}


def test_bad_tray_app_options_get_one_clear_error(paths: Paths) -> None:
    bad = _traylm("--page", "nope", env=_env(paths))
    assert bad.returncode == 2
    assert "no dashboard page 'nope'; pages: gpus, engines, models" in bad.stderr
    bogus = _traylm("--bogus", env=_env(paths))
    assert bogus.returncode == 2 and "unrecognized arguments: --bogus" in bogus.stderr


@pytest.mark.slow
def test_second_traylm_show_chat_opens_the_running_apps_chat(qtbot, paths: Paths) -> None:
    env = _env(paths)
    first = subprocess.Popen(
        [sys.executable, "-m", "engines", "--no-daemon-start", "--no-tray"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        status: dict[str, object] = {}
        while not status.get("ok"):
            assert first.poll() is None and time.monotonic() < deadline, "the app did not start"
            status = send_command(paths, {"cmd": "status"}, timeout_s=1.0) or {}
        assert status["fallback"] is True and status["chat_visible"] is False
        second = _traylm("--show", "chat", env=env)
        assert second.returncode == 0, second.stderr
        status = send_command(paths, {"cmd": "status"}) or {}
        assert status["chat_visible"] is True
        assert send_command(paths, {"cmd": "quit", "action": "leave"}) == {"ok": True}
        assert first.wait(20) == 0
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)


def test_top_help_names_every_dashboard_page() -> None:
    """`traylm --page PAGE` takes any page of the dashboard; the help lists them all."""
    from desktop.dashboard.pages import PAGES
    from engines.cli import build_parser

    text = " ".join(build_parser().format_help().split())
    for page in PAGES:
        assert page.key in text.split("--page PAGE (", 1)[1].split(")", 1)[0], page.key
