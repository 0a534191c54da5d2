"""What the app offers to fix an error: a button that does it here (open the setup, the engine
installer, the engine's log, the Hugging Face token field, ...) and, as a secondary hint, the
CLI command the daemon's message names.

``fix_for`` reads the daemon's error code (``TraylmError.code``, carried by failed calls and by
``Notice.source``) and its message; ``desktop.app.DesktopApp.run_fix`` carries a fix out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# what a fix does (DesktopApp.run_fix): a window, a dashboard page (and tab), or an action
SETUP = "setup"  # the first-run setup
INSTALL_ENGINE = "install_engine"  # the setup's engine step (or Engines → Environments)
ENGINE_LOG = "engine_log"  # Engines → Logs for Fix.target
PROFILES = "profiles"  # Engines → Profiles (Fix.target: the profile)
LOCAL_FOLDER = "local_folder"  # Models → Library → Add a folder…
LIBRARY = "library"  # Models → Library
HUB_LOGIN = "hub_login"  # Settings → Hugging Face token
SETTINGS = "settings"
FANS = "fans"  # Fans & power (how to install traylm-gpud)
START_DAEMON = "start_daemon"

# the dashboard page each fix opens (the others open a window or act: app.py)
FIX_PAGES = {
    ENGINE_LOG: "engines",
    PROFILES: "engines",
    LOCAL_FOLDER: "models",
    LIBRARY: "models",
    HUB_LOGIN: "settings",
    SETTINGS: "settings",
    FANS: "fans",
}

_CLI = re.compile(r"`(traylm [^`]+)`")


@dataclass(frozen=True)
class Fix:
    action: str  # one of the names above
    label: str  # the button's text
    target: str = ""  # the engine, profile or model it is about
    cli: str = ""  # the same fix as a command, shown as a secondary hint


ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}

_LEAD = r"(?:(?:run|use|with|try|add it with|add one with)\s+)?"  # a verb the words replace

# the daemon speaks to the CLI and the app alike; in the app its commands become words (the
# fix button beside them does it, and the command stays as the button's secondary hint)
_IN_WORDS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(_LEAD + r"`?traylm engines install (vllm|sglang|trtllm) --cpu`?"),
        "install the {engine} engine (CPU build) in Engines ▸ Environments",
    ),
    (
        re.compile(_LEAD + r"`?traylm engines install (vllm|sglang|trtllm)`?"),
        "install the {engine} engine in Engines ▸ Environments",
    ),
    (
        re.compile(_LEAD + r"`?traylm models add (?:PATH|FOLDER)`?"),
        "add the folder in Models ▸ Library (Add a folder…)",
    ),
    (re.compile(_LEAD + r"`?traylm remote set-key`?"), "set the key in Engines ▸ Remote fallback"),
    (re.compile(r"hub\.endpoint / HF_ENDPOINT"), "the Hub address in Settings"),
    (re.compile(r"(?:give|use) --budget (\w+)"), "give a budget of {0}"),
    (  # a profile's tool parser (a preset's and a profile's wording)
        re.compile(
            r"\(`traylm models set [^`]+` does; (?:so does the dashboard's|the dashboard calls "
            r"it) \"Tool calling format\"\)"
        ),
        '("Tool calling format" in Engines ▸ Profiles)',
    ),
    (
        re.compile(r"stop and start the engine: `traylm stop ([\w.-]+)` and `traylm start [^`]+`"),
        "restart engine {0} (Restart in Engines, or in the tray)",
    ),
)


def in_words(message: str) -> str:
    """A daemon message for the app: the commands it names that the app does with a click
    said as where to click instead (the CLI keeps the daemon's own words)."""
    for pattern, words in _IN_WORDS:

        def said(found: re.Match[str], words: str = words) -> str:
            engine = ENGINE_NAMES.get(found.group(1), "") if found.groups() else ""
            return words.format(*found.groups(), engine=engine)

        message = pattern.sub(said, message)
    return message


def cli_hint(message: str) -> str:
    """The first ``traylm ...`` command a daemon message names (in backquotes), or ""."""
    found = _CLI.search(message)
    return found.group(1) if found else ""


def fix_for(code: str, message: str, *, target: str = "") -> Fix | None:
    """The in-app fix for a daemon error (its code and message), or None when there is none
    better than reading the message."""
    cli = cli_hint(message)
    lowered = message.lower()
    if code == "engine_env" or "engines install" in cli:
        return Fix(INSTALL_ENGINE, "Install the engine…", target, cli)
    if code in ("hub_unavailable", "network") or ("cannot reach" in lowered and "hub" in lowered):
        return Fix(LOCAL_FOLDER, "Use a model folder on this computer…", target, cli)
    if code == "gated" or "hugging face token" in lowered:
        return Fix(HUB_LOGIN, "Add a Hugging Face token…", target, cli)
    if code == "disk_full":
        return Fix(LIBRARY, "Free space: open the library", target, cli)
    if code in ("helper_unavailable", "gpu_no_permission"):
        return Fix(FANS, "How to install traylm-gpud", target, cli)
    if code == "port_in_use":
        return Fix(SETTINGS, "Change the port…", target, cli)
    if code in ("profile_not_found", "config_invalid", "unknown_flag") and target:
        return Fix(PROFILES, f"Edit {target}", target, cli)
    if code == "daemon_unavailable":
        return Fix(START_DAEMON, "Start the daemon", target, cli)
    if code in ("engine_failed", "model_load_failed") and target:
        return Fix(ENGINE_LOG, f"Open the log of {target}", target, cli or f"traylm logs {target}")
    if cli:
        return Fix("", "", target, cli)  # no button, but the command is worth showing
    return None
