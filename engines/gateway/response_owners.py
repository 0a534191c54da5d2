"""Which engine made each Responses API response: retrieve and cancel carry only the id.

A bounded map (the newest ids kept) filled from the replies to POST /v1/responses: the whole
JSON, or the first events of a stream (``response.created`` carries the id).
"""

from __future__ import annotations

import collections
import re

MAX_REMEMBERED = 10_000
"""Response ids remembered (about 1 MB); the oldest are forgotten first."""
_ID_RE = re.compile(rb'"id"\s*:\s*"(resp_[A-Za-z0-9_-]{1,200})"')


class ResponseOwners:
    """Response id → the engine id that made it, the newest ``limit`` ids."""

    def __init__(self, limit: int = MAX_REMEMBERED) -> None:
        self._owners: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._limit = limit

    def remember(self, response_id: str, engine_id: str) -> None:
        self._owners[response_id] = engine_id
        self._owners.move_to_end(response_id)
        while len(self._owners) > self._limit:
            self._owners.popitem(last=False)

    def owner(self, response_id: str) -> str | None:
        return self._owners.get(response_id)

    def __len__(self) -> int:
        return len(self._owners)

    def record(self, engine_id: str, data: bytes) -> None:
        """The reply hook of POST /v1/responses: remember the response id in the first bytes
        of a reply (the whole JSON, or a stream's first events: ``response.created``)."""
        found = _ID_RE.search(data)
        if found is not None:
            self.remember(found.group(1).decode(), engine_id)
