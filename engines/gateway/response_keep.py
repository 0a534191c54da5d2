"""Responses kept by traylm, so that ``previous_response_id`` and retrieve work on every engine
(vLLM keeps none unless VLLM_ENABLE_RESPONSES_API_STORE=1, and then in memory, unbounded, lost
when the engine stops).

The gateway hands each new response to a ``ResponseStore`` (the flight recorder's, in
requests.db: engines/recorder/responses.py) before the client has its last byte, so that a
next turn sent the moment the reply ends finds it. A request naming ``previous_response_id``
is sent to the engine self-contained: the earlier turns' input and output items, then its own
input (``chained``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from engines.gateway.proxy import ReplySink
from engines.gateway.sse import ends_reply


@dataclass(frozen=True, slots=True)
class NewResponse:
    """A response to keep, as the gateway saw it; the store parses ``reply`` off the event
    loop (the whole JSON reply, or the stream's last events: ``response.completed``)."""

    caller: str
    engine_id: str
    input_items: list[Any]
    """The request's own input, as items (a string input is one user message)."""
    previous_id: str
    reply: bytes
    streamed: bool


class ResponseStore(Protocol):
    """Where responses are kept (the flight recorder). Each belongs to its ``caller``
    (``Guard.caller``): to anyone else it does not exist."""

    @property
    def enabled(self) -> bool:
        """Whether responses are kept (``requests.responses_keep`` > 0)."""
        ...

    def keep(self, new: NewResponse) -> None:
        """Queue ``new`` to be written (no I/O, never a wait)."""
        ...

    async def find(self, response_id: str, caller: str) -> dict[str, Any] | None:
        """The kept response: ``response`` (the object as the engine made it),
        ``input_items``, ``previous_id``; None when not kept for ``caller``."""
        ...

    async def history(self, response_id: str, caller: str) -> list[Any] | None:
        """The conversation up to and including ``response_id``: each turn's input items
        then its output items, oldest first; None when not kept for ``caller``."""
        ...

    async def delete(self, response_id: str, caller: str) -> bool:
        """Forget ``response_id``; False when it was not kept for ``caller``."""
        ...


def input_items(payload: Mapping[str, Any]) -> list[Any]:
    """A request's ``input`` as a list of items (a string is one user message)."""
    given = payload.get("input")
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    return list(given) if isinstance(given, list) else []


def chained(payload: Mapping[str, Any], history: list[Any]) -> dict[str, Any]:
    """A request with ``previous_response_id`` made self-contained for the engine: the
    earlier turns, then this request's input; no ``previous_response_id``."""
    body = {k: v for k, v in payload.items() if k != "previous_response_id"}
    body["input"] = [*history, *input_items(payload)]
    return body


class StreamKeeper:
    """A ``ReplySink`` that hands a streamed response to the store as its last event passes
    (before the client has it), then passes every event on to ``inner``."""

    __slots__ = ("_done", "_inner", "_keep")

    def __init__(self, keep: Any, inner: ReplySink | None) -> None:
        """``keep``: called once with the events that end the stream."""
        self._keep = keep
        self._inner = inner
        self._done = False

    def feed(self, events: bytes) -> None:
        if not self._done and ends_reply(events):
            self._done = True
            self._keep(events)
        if self._inner is not None:
            self._inner.feed(events)

    async def finish(self) -> None:
        if self._inner is not None:
            await self._inner.finish()
