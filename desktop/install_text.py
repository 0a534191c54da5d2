"""What an engine install is doing, in words, from its ``env.install`` events: the installer's
phase, and while pip runs its step (resolving, downloading with bytes, installing). Shared by the
Environments tab and the first-run setup."""

from __future__ import annotations

from desktop.formatting import fmt_bytes, fmt_duration
from engines.events import EnvInstallProgress

PHASE_WORDS = {
    "create": "creating the virtual environment",
    "install": "installing packages (the long part)",
    "fix": "applying post-install fixes",
    "probe": "checking that the engine imports and reading its flags",
    "done": "installed",
    "failed": "failed",
    "cancelled": "cancelled",
}


def install_words(e: EnvInstallProgress) -> str:
    """One line: what it does now, and for how long it has been at it."""
    words = PHASE_WORDS.get(e.phase, e.phase)
    if e.phase == "install" and e.step == "downloading" and e.package:
        if e.file_total_bytes:
            words = (
                f"downloading {e.package}: {fmt_bytes(e.file_done_bytes)} of "
                f"{fmt_bytes(e.file_total_bytes)} ({fmt_bytes(e.done_bytes)} downloaded so far)"
            )
        else:
            words = f"fetching {e.package}"
    elif e.phase == "install" and e.step == "resolving" and e.package:
        words = f"finding {e.package} and what it needs"
    elif e.phase == "install" and e.step == "installing":
        words = "unpacking the downloaded packages (a few minutes)"
    return f"{words} · {fmt_duration(e.elapsed_s)}"


def download_share(e: EnvInstallProgress) -> float | None:
    """How far the current download is (None: no figure to show)."""
    if e.phase == "install" and e.step == "downloading" and e.file_total_bytes:
        return min(1.0, e.file_done_bytes / e.file_total_bytes)
    return None
