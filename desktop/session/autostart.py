"""Start the tray app at login through the XDG autostart entry
(``$XDG_CONFIG_HOME/autostart/traylm.desktop``, usually ``~/.config/autostart``)."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

from engines.config.sections import resources_dir
from engines.config.tomlfile import write_bytes_atomic

ENTRY_NAME = "traylm.desktop"


def autostart_path(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".config")
    return Path(base) / "autostart" / ENTRY_NAME


def launch_command() -> str:
    """The command the entry runs: the installed ``traylm`` script, else this interpreter."""
    script = shutil.which("traylm") or str(Path(sys.executable).with_name("traylm"))
    if Path(script).is_file():
        return shlex.quote(script)
    return f"{shlex.quote(sys.executable)} -m desktop"


def entry_text() -> str:
    icon = resources_dir() / "icons" / "traylm.svg"
    return (
        "[Desktop Entry]\n"
        "Type=Application\n"
        "Name=traylm\n"
        "Comment=Local LLM inference in the system tray\n"
        f"Exec={launch_command()} --at-login\n"
        f"Icon={icon}\n"
        "Terminal=false\n"
        "Categories=Utility;Development;\n"
        "X-GNOME-Autostart-enabled=true\n"
    )


def is_enabled(environ: Mapping[str, str] | None = None) -> bool:
    path = autostart_path(environ)
    try:
        text = path.read_text()
    except OSError:
        return False
    return "Hidden=true" not in text and "X-GNOME-Autostart-enabled=false" not in text


def set_enabled(enabled: bool, environ: Mapping[str, str] | None = None) -> Path:
    """Write or remove the entry. Blocking (tiny file I/O)."""
    path = autostart_path(environ)
    if enabled:
        write_bytes_atomic(path, entry_text().encode())
    else:
        path.unlink(missing_ok=True)
    return path
