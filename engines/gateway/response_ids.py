"""The ids of a response traylm keeps: its own, never the engine's.

An engine's ids repeat (another engine, the same one restarted: the FAKE's count from 1; two
vLLM replicas share no store), and the kept store would overwrite one conversation with
another. So a response traylm keeps gets an id of traylm's (``new_id``), written over the
engine's in the reply on its way (``ReplyIds``: every event of a stream, or the whole body),
before the store, the owners map and the client see it. The engine was sent a self-contained
request (no ``previous_response_id``): the reply gets back the one the client sent.
"""

from __future__ import annotations

import json
import re
import secrets

_ID_RE = re.compile(rb'"id"\s*:\s*"(resp_[A-Za-z0-9_-]{1,200})"')
_NO_PREVIOUS_RE = re.compile(rb'"previous_response_id"\s*:\s*null')


def new_id() -> str:
    """A response id of traylm's, in OpenAI's form."""
    return "resp_" + secrets.token_hex(24)


class ReplyIds:
    """A reply's response id replaced by ``own_id`` (the engine's is read from the first
    bytes that carry one: the whole JSON, or ``response.created``), and a null
    ``previous_response_id`` by ``previous`` when one was asked."""

    __slots__ = ("_engine", "_own", "_previous")

    def __init__(self, own_id: str, previous: str) -> None:
        self._own = b'"' + own_id.encode() + b'"'
        self._engine: bytes | None = None
        self._previous = (
            b'"previous_response_id": ' + json.dumps(previous).encode() if previous else b""
        )

    def __call__(self, data: bytes) -> bytes:
        if self._engine is None:
            found = _ID_RE.search(data)
            if found is not None:
                self._engine = b'"' + found.group(1) + b'"'
        if self._engine is not None:
            data = data.replace(self._engine, self._own)
        if self._previous:
            data = _NO_PREVIOUS_RE.sub(self._previous, data)
        return data
