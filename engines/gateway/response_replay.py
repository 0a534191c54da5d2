"""A kept response replayed as the events of its stream: ``GET /v1/responses/{id}?stream=true``
(the openai SDK's ``responses.retrieve(id, stream=True)``), with ``starting_after`` (a sequence
number) to resume after an event already read.

A kept response has ended, so the replay is whole at once: the events OpenAI's stream sends
for it (created, in progress, each output item added and done, a message's text as one delta,
then completed or incomplete), numbered from 0.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

_ENDS = {"completed": "response.completed", "incomplete": "response.incomplete"}


def replayable(response: Any) -> str | None:
    """Why ``response`` cannot be replayed as a stream, or None."""
    if not isinstance(response, dict) or not isinstance(response.get("output"), list):
        return "it was kept without its output items"
    if response.get("status") not in _ENDS:
        return f"its status is {response.get('status')!r}, not completed or incomplete"
    return None


def replay(response: dict[str, Any], starting_after: int = -1) -> bytes:
    """The server-sent events of ``response`` (``replayable``), those numbered after
    ``starting_after``."""
    out = []
    for n, event in enumerate(_events(response)):
        if n > starting_after:
            data = json.dumps({**event, "sequence_number": n})
            out.append(f"event: {event['type']}\ndata: {data}\n\n")
    return "".join(out).encode()


def _events(response: dict[str, Any]) -> Iterator[dict[str, Any]]:
    started = {**response, "status": "in_progress", "output": []}
    yield {"type": "response.created", "response": started}
    yield {"type": "response.in_progress", "response": started}
    for index, item in enumerate(response["output"]):
        yield from _item_events(index, item)
    yield {"type": _ENDS[response["status"]], "response": response}


def _item_events(index: int, item: Any) -> Iterator[dict[str, Any]]:
    if not isinstance(item, dict) or item.get("type") != "message":
        yield {"type": "response.output_item.added", "output_index": index, "item": item}
        yield {"type": "response.output_item.done", "output_index": index, "item": item}
        return
    added = {**item, "status": "in_progress", "content": []}
    yield {"type": "response.output_item.added", "output_index": index, "item": added}
    where = {"item_id": item.get("id", ""), "output_index": index}
    for part_index, part in enumerate(item.get("content") or []):
        at = {**where, "content_index": part_index}
        text = part.get("text", "") if isinstance(part, dict) else ""
        is_text = isinstance(part, dict) and part.get("type") == "output_text"
        empty = {**part, "text": ""} if is_text else part
        yield {"type": "response.content_part.added", **at, "part": empty}
        if is_text:
            yield {"type": "response.output_text.delta", **at, "delta": text, "logprobs": []}
            yield {"type": "response.output_text.done", **at, "text": text, "logprobs": []}
        yield {"type": "response.content_part.done", **at, "part": part}
    yield {"type": "response.output_item.done", "output_index": index, "item": item}
