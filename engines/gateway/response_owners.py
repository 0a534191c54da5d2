"""Which engine made each Responses API response, and for whom: retrieve, cancel, delete and
input_items carry only the id.

A bounded map (the newest ids kept) filled from the replies to POST /v1/responses: the whole
JSON, or the first events of a stream (``response.created`` carries the id). Each response
belongs to the caller that made it (``Guard.caller``: the API key, or this computer when keys
are off); to anyone else it does not exist.
"""

from __future__ import annotations

import collections
import re

MAX_REMEMBERED = 10_000
"""Response ids remembered (about 2 MB); the oldest are forgotten first."""
_ID_RE = re.compile(rb'"id"\s*:\s*"(resp_[A-Za-z0-9_-]{1,200})"')


class ResponseOwners:
    """Response id → (the engine id that made it, the caller it belongs to), the newest
    ``limit`` ids."""

    def __init__(self, limit: int = MAX_REMEMBERED) -> None:
        self._owners: collections.OrderedDict[str, tuple[str, str]] = collections.OrderedDict()
        self._limit = limit

    def remember(self, response_id: str, engine_id: str, caller: str) -> None:
        self._owners[response_id] = (engine_id, caller)
        self._owners.move_to_end(response_id)
        while len(self._owners) > self._limit:
            self._owners.popitem(last=False)

    def engine_for(self, response_id: str, caller: str) -> str | None:
        """The engine that made ``response_id`` for ``caller``; None when it is unknown or
        belongs to another caller (the two are not told apart)."""
        found = self._owners.get(response_id)
        return found[0] if found is not None and found[1] == caller else None

    def forget(self, response_id: str) -> None:
        """A response deleted: no longer routed to its engine."""
        self._owners.pop(response_id, None)

    def engine_of(self, response_id: str) -> str | None:
        """The engine that made ``response_id``, whoever asks: a routing hint only, for a
        request whose caller was already checked (``responses.on_create``)."""
        found = self._owners.get(response_id)
        return found[0] if found is not None else None

    def __contains__(self, response_id: object) -> bool:
        return response_id in self._owners

    def __len__(self) -> int:
        return len(self._owners)

    def record(self, engine_id: str, data: bytes, *, caller: str) -> None:
        """The reply hook of POST /v1/responses: remember the response id in the first bytes
        of a reply (the whole JSON, or a stream's first events: ``response.created``)."""
        found = _ID_RE.search(data)
        if found is not None:
            self.remember(found.group(1).decode(), engine_id, caller)
