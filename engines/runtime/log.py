"""An engine's output and what it says went wrong: each line (ANSI codes stripped) is kept in
a ring for `traylm logs`, appended to the engine's log file, published, fed to the start
phases and to the adapter's diagnosis; the last error found is the engine's diagnosis."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from engines.events.core import Diagnosis, EngineDiagnosed, EngineLogLine
from engines.runtime.adapters.base import EngineAdapter
from engines.runtime.output import last_error, open_engine_log, read_lines, strip_ansi
from engines.runtime.ports import Publish


class EngineLog:
    """The log of one engine, across its lives."""

    def __init__(
        self,
        engine_id: str,
        *,
        path: Path,
        ring_lines: int,
        adapter: EngineAdapter,
        publish: Publish,
        on_line: Callable[[str], None],
    ) -> None:
        """``on_line``: told each line after it was published (the start phases read it)."""
        self.engine_id = engine_id
        self.path = path
        self.adapter = adapter
        self.ring: collections.deque[str] = collections.deque(maxlen=ring_lines)
        self.diagnosis: Diagnosis | None = None
        self._publish = publish
        self._on_line = on_line
        self._fh: TextIO | None = None

    def open(self, header: list[str]) -> None:
        self._fh = open_engine_log(self.path, self.engine_id, header)

    def close(self) -> None:
        fh = self._fh
        if fh is not None:
            fh.close()
            self._fh = None

    async def read(self, proc: asyncio.subprocess.Process) -> None:
        """Feed the process's output, line by line, until it closes."""
        assert proc.stdout is not None
        await read_lines(proc.stdout, self.line)

    def line(self, text: str) -> None:
        line = strip_ansi(text).rstrip()
        if not line:
            return
        self.ring.append(line)
        fh = self._fh
        if fh is not None:
            fh.write(line + "\n")
            fh.flush()
        self._publish(EngineLogLine(engine_id=self.engine_id, line=line))
        self._on_line(line)
        found = self.adapter.diagnose(line)
        if found is not None:
            if found.severity == "error":
                self.diagnosis = found
            self._publish(EngineDiagnosed(engine_id=self.engine_id, diagnosis=found))

    def tail(self, lines: int) -> list[str]:
        """The last ``lines`` lines kept (all of them for 0 or less)."""
        kept = list(self.ring)
        return kept[-lines:] if lines > 0 else kept

    def failure_text(self, what: str, exit_code: int | None) -> str:
        """``what`` went wrong, with the diagnosis or else the last error line, and where to
        read on."""
        if self.diagnosis is not None:
            return f"{what}: {self.diagnosis.summary}. {self.diagnosis.advice}"
        tail = last_error(list(self.ring))
        exit_text = f" (exit code {exit_code})" if exit_code is not None else ""
        hint = f"; last error line: {tail[:300]}" if tail else ""
        return f"{what}{exit_text}{hint}. See `traylm logs {self.engine_id}`."
