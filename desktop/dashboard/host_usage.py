"""This computer's CPU and memory, and each running engine's share of them (its process and
children), read with psutil on the desktop's side: the same machine as the daemon it started.
Shown on the GPUs page, so that a computer without NVIDIA still sees what its models use."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import psutil

from desktop.look.formatting import fmt_bytes
from engines.events import EngineStatus


class HostUsage:
    """Keeps the psutil processes between readings (a CPU share needs two)."""

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}
        psutil.cpu_percent(interval=None)  # the first reading starts the clock

    def _tree(self, pid: int) -> list[psutil.Process]:
        proc = self._procs.get(pid)
        if proc is None:
            proc = self._procs[pid] = psutil.Process(pid)
            proc.cpu_percent(interval=None)
        tree = [proc]
        for child in proc.children(recursive=True):
            tree.append(self._procs.setdefault(child.pid, child))
        return tree

    def engine_line(self, engine: EngineStatus) -> str:
        """ "fake: CPU 4 % · RAM 512.0 MB" (its processes together), "" when it is gone."""
        if not engine.pid:
            return ""
        cpu = rss = 0.0
        try:
            for proc in self._tree(engine.pid):
                with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                    cpu += proc.cpu_percent(interval=None)
                    rss += proc.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            self._procs.pop(engine.pid, None)
            return ""
        return f"{engine.engine_id}: CPU {cpu:.0f} % · RAM {fmt_bytes(rss)}"

    def text(self, engines: Iterable[EngineStatus]) -> str:
        """A few lines: the computer, then each running engine."""
        memory = psutil.virtual_memory()
        cores = psutil.cpu_count() or 1
        lines = [
            f"<b>This computer:</b> CPU {psutil.cpu_percent(interval=None):.0f} % of {cores} "
            f"cores · RAM {fmt_bytes(memory.total - memory.available)} of "
            f"{fmt_bytes(memory.total)} in use ({memory.percent:.0f} %)"
        ]
        running = [line for e in engines if (line := self.engine_line(e))]
        lines += running or ["No engine running."]
        return "<br>".join(lines)
