"""Server-sent events from an engine made valid UTF-8 before they reach a client.

An engine that cuts a multi-byte character between two tokens puts bytes that are not UTF-8 in
an event; the openai SDK then raises a bare ``UnicodeDecodeError`` (not ``APIError``) and the
rest of the reply is lost. The relay passes each chunk of whole events through
``Utf8Events.clean``: plain ASCII and valid UTF-8 pass as they are (one check, no copy: the
common case), an event that is not valid UTF-8 is repaired.

Repair works on the event's JSON where it parses (with the bad bytes kept as surrogate escapes):
a character cut at the end of a string value (``delta.content``, ``text``) is held back and put
in front of the same value of the next event, so it arrives whole; whatever is still not UTF-8
becomes U+FFFD. An event that is not JSON has its bad bytes replaced as they are.
"""

from __future__ import annotations

import json
from typing import Any

_CONTINUATION = range(0x80, 0xC0)


class Utf8Events:
    """One stream's repair state: the start of a character held back per string value."""

    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held: dict[tuple[Any, ...], bytes] = {}
        """Starts of characters held back, per string value: while there are any, the next
        events must go through ``clean``."""

    def clean(self, events: bytes) -> bytes:
        """``events`` (whole events) as valid UTF-8."""
        if not self.held:
            try:
                events.decode()
            except UnicodeDecodeError:
                pass
            else:
                return events
        sep = b"\r\n\r\n" if b"\r\n\r\n" in events else b"\n\n"
        return sep.join(self._event(e) for e in events.split(sep))

    def _event(self, event: bytes) -> bytes:
        lines = event.split(b"\n")
        for i, line in enumerate(lines):
            if line.startswith(b"data: {"):
                lines[i] = b"data: " + self._data(line[6:])
            else:
                lines[i] = line.decode(errors="replace").encode()
        return b"\n".join(lines)

    def _data(self, raw: bytes) -> bytes:
        try:
            raw.decode()
            valid = True
        except UnicodeDecodeError:
            valid = False
        if valid and not self.held:
            return raw
        try:
            data = json.loads(raw.decode(errors="surrogateescape"))
        except ValueError:
            return raw.decode(errors="replace").encode()
        data = self._walk(data, ())
        return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()

    def _walk(self, value: Any, path: tuple[Any, ...]) -> Any:
        if isinstance(value, dict):
            return {_valid(k): self._walk(v, (*path, k)) for k, v in value.items()}
        if isinstance(value, list):
            # a choice keeps its place by its "index", not its position in this event
            return [
                self._walk(v, (*path, v.get("index", n) if isinstance(v, dict) else n))
                for n, v in enumerate(value)
            ]
        if isinstance(value, str):
            return self._text(value, path)
        return value

    def _text(self, text: str, path: tuple[Any, ...]) -> str:
        raw = self.held.pop(path, b"") + text.encode(errors="surrogateescape")
        cut = _cut_character(raw)
        if cut < len(raw):
            self.held[path] = raw[cut:]
        return raw[:cut].decode(errors="replace")


def _valid(text: str) -> str:
    return text.encode(errors="surrogateescape").decode(errors="replace")


def _cut_character(raw: bytes) -> int:
    """Where a multi-byte character that is not complete yet starts at the end of ``raw``, or
    ``len(raw)`` when the end is complete (or not the start of a character at all)."""
    end = len(raw)
    for back in range(1, min(4, end) + 1):
        byte = raw[-back]
        if byte in _CONTINUATION:  # look further back for the character's first byte
            continue
        if 0xC2 <= byte <= 0xDF:
            need = 2
        elif 0xE0 <= byte <= 0xEF:
            need = 3
        elif 0xF0 <= byte <= 0xF4:
            need = 4
        else:
            return end  # ASCII, or a byte no character starts with
        return end - back if back < need else end
    return end
