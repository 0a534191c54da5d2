"""Agent CLIs opened in a terminal window: "Open Claude Code in a terminal" in the tray's
Models menu and the chat window's Agents menu runs `traylm launch AGENT [--model M]` in the
first terminal emulator found on PATH (the menus hide the entries where there is none). When
the launch fails (a client not installed, a model that cannot call tools), the window stays
open with its message until Enter is pressed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass

AGENTS = (("claude", "Claude Code"), ("codex", "Codex"), ("opencode", "opencode"))
"""The agents `traylm launch` runs (engines/launch/agents.py), with the names menus show."""


@dataclass(frozen=True)
class Terminal:
    binary: str
    run: tuple[str, ...]
    """What goes between the terminal and the command it runs (``-e``, ``--``)."""


TERMINALS = (
    Terminal("x-terminal-emulator", ("-e",)),  # Debian's alternative: the user's choice
    Terminal("gnome-terminal", ("--",)),
    Terminal("konsole", ("-e",)),
    Terminal("xfce4-terminal", ("-x",)),
    Terminal("kitty", ()),
    Terminal("alacritty", ("-e",)),
    Terminal("foot", ()),
    Terminal("wezterm", ("start", "--")),
    Terminal("xterm", ("-e",)),
)
KEEP_OPEN = (
    '"$0" -m engines launch "$@" || { code=$?; printf "\\n[traylm launch exited %s] press Enter '
    'to close " "$code"; read _; exit "$code"; }'
)


_opened: list[subprocess.Popen[bytes]] = []
"""The windows opened, kept until they exit (a Popen dropped while it runs warns)."""


def find_terminal() -> Terminal | None:
    """The first terminal emulator on PATH, or None."""
    return next((t for t in TERMINALS if shutil.which(t.binary)), None)


def launch_argv(terminal: Terminal, agent: str, model: str = "") -> list[str]:
    chosen = ["--model", model] if model else []
    command = ["sh", "-c", KEEP_OPEN, sys.executable, agent, *chosen]
    return [terminal.binary, *terminal.run, *command]


def open_agent(agent: str, model: str = "") -> bool:
    """Open ``agent`` in a terminal window (not waited for); False when there is no terminal."""
    terminal = find_terminal()
    if terminal is None:
        return False
    _opened[:] = [p for p in _opened if p.poll() is None]
    window = subprocess.Popen(  # on its own: quitting the app leaves the window open
        launch_argv(terminal, agent, model),
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _opened.append(window)
    return True
