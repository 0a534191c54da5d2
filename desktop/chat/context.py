"""A conversation longer than the model's context: which turns a request leaves out, by the
chat's policy (stop and say so, leave the oldest turns out, or keep the first turn and the
latest ones), as LM Studio offers. Plain functions, no Qt."""

from __future__ import annotations

from collections.abc import Sequence

from desktop.daemon.gateway import Message

STOP, DROP_OLDEST, KEEP_FIRST = 0, 1, 2
POLICIES = {
    STOP: "Stop and say so",
    DROP_OLDEST: "Leave the oldest turns out",
    KEEP_FIRST: "Keep the first turn and the latest",
}


def turns(history: Sequence[Message]) -> list[list[Message]]:
    """The conversation in turns: each starts at a user message (what comes before the first
    one, a system prompt, is a turn of its own)."""
    out: list[list[Message]] = []
    for message in history:
        if message[0] == "user" or not out:
            out.append([])
        out[-1].append(message)
    return out


def left_out(history: Sequence[Message], policy: int, drop: int) -> tuple[Message, ...] | None:
    """``history`` with ``drop`` turns left out by ``policy``; None when that many cannot go
    (the latest question always stays, and so does a system prompt)."""
    if drop <= 0:
        return tuple(history)
    parts = turns(history)
    system = parts[0] if parts and parts[0][0][0] == "system" else []
    rest = parts[1:] if system else parts
    keep_first = 1 if policy == KEEP_FIRST else 0
    if policy not in (DROP_OLDEST, KEEP_FIRST) or drop > len(rest) - 1 - keep_first:
        return None
    kept = rest[:keep_first] + rest[keep_first + drop :]
    return tuple(m for turn in ([system] if system else []) + kept for m in turn)


def dropped_positions(
    messages: Sequence[tuple[int, str]], policy: int, drop: int
) -> frozenset[int]:
    """The positions of the messages (position, role) that leaving ``drop`` turns out by
    ``policy`` leaves out of a request, as ``left_out`` does (the chat's system prompt is not
    among them)."""
    if drop <= 0 or policy not in (DROP_OLDEST, KEEP_FIRST):
        return frozenset()
    groups: list[list[int]] = []
    for position, role in messages:
        if role == "user" or not groups:
            groups.append([])
        groups[-1].append(position)
    rest = groups[1:] if messages and messages[0][1] == "system" else groups
    keep_first = 1 if policy == KEEP_FIRST else 0
    return frozenset(p for turn in rest[keep_first : keep_first + drop] for p in turn)


def full_text(needed: int | None, size: int | None) -> str:
    """The meter once the engine refused the conversation as too long for its context."""
    if needed is not None and size:
        return f"Context full: this chat needs {needed:,} of {size:,} tokens"
    return f"Context full ({size:,} tokens)" if size else "Context full"


def context_text(used: int | None, size: int | None, dropped: int) -> str:
    """'Context: 1,234 of 4,096 tokens (30 %)', and the turns left out to fit; before the
    first reply, the model's context where it is known."""
    if used is None:
        return f"Context: up to {size:,} tokens" if size else ""
    text = (
        f"Context: {used:,} of {size:,} tokens ({100 * used // size} %)"
        if size
        else (f"Context: {used:,} tokens")
    )
    if dropped:
        text += f" · {dropped} older turn{'s' if dropped > 1 else ''} left out to fit"
    return text
