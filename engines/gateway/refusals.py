"""Refusals the gateway answers itself (a wrong or missing key, a Host or Origin not allowed,
a path or method it does not serve), told in the daemon log once per client and kind: a client
with a wrong key (Open WebUI lists nothing and says not why) is seen there at once, and one that
retries every second does not fill the log.
"""

from __future__ import annotations

import collections
import logging

from aiohttp import web

from engines.gateway.shapes import error_message

log = logging.getLogger(__name__)

REFUSALS = frozenset({401, 403, 404, 405})
"""What is told and recorded whatever the method (GET and HEAD too, not only POST)."""
REMEMBERED = 1024
"""(client, kind) pairs already told; the oldest are forgotten first."""


class RefusalLog:
    """Says each refusal in the log the first time a client meets it."""

    def __init__(self, limit: int = REMEMBERED) -> None:
        self._told: collections.OrderedDict[tuple[str, str, int], None] = collections.OrderedDict()
        self._limit = limit

    def note(self, request: web.Request, resp: web.StreamResponse) -> None:
        """``resp`` answered ``request``: logged when it is a refusal this client (its address
        and User-Agent) has not met yet."""
        if resp.status not in REFUSALS:
            return
        agent = request.headers.get("User-Agent", "")[:80]
        told = (str(request.remote or ""), agent, resp.status)
        if told in self._told:
            return
        self._told[told] = None
        while len(self._told) > self._limit:
            self._told.popitem(last=False)
        body = resp.body if isinstance(resp, web.Response) else None
        why = error_message(body) if isinstance(body, bytes) else None
        log.warning(
            "refused %s %s from %s (%s) with %d: %s (said once per client and kind)",
            request.method,
            request.path[:200],
            request.remote,
            agent or "no User-Agent",
            resp.status,
            why or resp.reason,
        )
