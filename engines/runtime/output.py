"""An engine's output: split into lines (``\\n``, ``\\r\\n`` and the bare ``\\r`` of progress
bars), ANSI codes stripped, kept in a log file that is rotated once it grows past 20 MB; and the
most telling error line of a log tail."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07")
LOG_FILE_MAX_BYTES = 20 * 1024 * 1024
_ERROR_LINE = re.compile(r"\b[\w.]*(Error|Exception)\b:|\bERROR\b")


def strip_ansi(text: str) -> str:
    return ANSI_RE.sub("", text)


def open_engine_log(path: Path, engine_id: str, header: list[str]) -> TextIO:
    """The engine's log file opened for appending, after a line that says this start began and
    the ``header`` lines; a file past LOG_FILE_MAX_BYTES is moved to ``.log.1`` first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.stat().st_size > LOG_FILE_MAX_BYTES:
        path.replace(path.with_suffix(".log.1"))
    fh = path.open("a", encoding="utf-8")
    fh.write(f"\n===== traylm: starting {engine_id} at {time.ctime()}\n")
    fh.writelines(line + "\n" for line in header)
    fh.flush()
    return fh


async def read_lines(stream: asyncio.StreamReader, on_line: Callable[[str], None]) -> None:
    """Call ``on_line`` with each line of ``stream`` (decoded, undecodable bytes replaced) until
    it ends; a last line without its line break is passed too."""
    buffer = b""
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            break
        buffer += chunk
        *complete, buffer = re.split(rb"\r\n|\n|\r", buffer)
        for raw in complete:
            on_line(raw.decode(errors="replace"))
    if buffer:
        on_line(buffer.decode(errors="replace"))


def last_error(lines: list[str]) -> str:
    """The most telling error of a log tail: the last ``SomethingError: ...`` line, with the
    indented line after it when that carries the message (pydantic puts it there)."""
    for i in range(len(lines) - 1, -1, -1):
        if _ERROR_LINE.search(lines[i]):
            text = lines[i].strip()
            following = lines[i + 1] if i + 1 < len(lines) else ""
            if following.startswith((" ", "\t")) and "errors.pydantic.dev" not in following:
                text += " " + following.strip()
            return text
    return ""
