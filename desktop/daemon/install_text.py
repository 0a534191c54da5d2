"""What an engine install is doing, in words, from its ``env.install`` events: the installer's
phase, and while pip runs its step (resolving, downloading with bytes, installing). Shared by the
Environments tab and the first-run setup."""

from __future__ import annotations

from collections import deque

from desktop.look.formatting import fmt_bytes, fmt_duration, fmt_rate
from engines.events import EnvInstallProgress

PACE_WINDOW = 12  # the download rate is taken over the last few pip updates

PHASE_WORDS = {
    "create": "creating the virtual environment",
    "install": "installing packages (the long part)",
    "fix": "applying post-install fixes",
    "probe": "checking that the engine imports and reading its flags",
    "done": "installed",
    "failed": "failed",
    "cancelled": "cancelled",
}


class InstallPace:
    """How fast pip downloads, from the bytes and times of successive install events."""

    def __init__(self) -> None:
        self.samples: deque[tuple[float, int]] = deque(maxlen=PACE_WINDOW)

    def feed(self, e: EnvInstallProgress) -> None:
        if e.phase != "install" or not e.done_bytes:
            return
        if self.samples and e.done_bytes < self.samples[-1][1]:
            self.samples.clear()  # another install
        self.samples.append((e.elapsed_s, e.done_bytes))

    def bytes_per_s(self) -> float | None:
        if len(self.samples) < 2:
            return None
        (t0, b0), (t1, b1) = self.samples[0], self.samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 and b1 > b0 else None


def install_words(
    e: EnvInstallProgress, *, bytes_per_s: float | None = None, waited_s: float = 0.0
) -> str:
    """One line: what it does now (a download with its bytes, rate and time left), and for how
    long it has been at it (``waited_s``: time since the event, so that the clock ticks while
    pip is silent)."""
    words = PHASE_WORDS.get(e.phase, e.phase)
    if e.phase == "install" and e.step == "downloading" and e.package:
        if e.file_total_bytes:
            words = (
                f"downloading {e.package}: {fmt_bytes(e.file_done_bytes)} of "
                f"{fmt_bytes(e.file_total_bytes)}"
            )
            if bytes_per_s:
                left_s = max(0, e.file_total_bytes - e.file_done_bytes) / bytes_per_s
                words += f" · {fmt_rate(bytes_per_s)} · about {fmt_duration(left_s)} left"
            words += f" ({fmt_bytes(e.done_bytes)} downloaded so far)"
        else:
            words = f"fetching {e.package}"
    elif e.phase == "install" and e.step == "resolving" and e.package:
        words = f"finding {e.package} and what it needs"
    elif e.phase == "install" and e.step == "installing":
        words = "unpacking the downloaded packages (a few minutes)"
    return f"{words} · {fmt_duration(e.elapsed_s + max(0.0, waited_s))}"


def download_share(e: EnvInstallProgress) -> float | None:
    """How far the current download is (None: no figure to show)."""
    if e.phase == "install" and e.step == "downloading" and e.file_total_bytes:
        return min(1.0, e.file_done_bytes / e.file_total_bytes)
    return None
