"""Which replica serves a request, when several upstreams serve one model name.

A replica is any upstream by its name and how many requests it has outstanding (running and
queued): a local engine, or a paired box serving the same model (``chat@box-b``). The rule:

- a conversation whose stored state lives on one replica (a Responses ``previous_response_id``)
  goes there whatever its load: no other replica has it;
- a conversation already served by a replica (same start: its system prompt and first
  messages, ``affinity_key``) goes back to it while that replica has at most ``slack`` more
  outstanding than the least busy one: its prefix cache already holds the conversation;
- everything else goes to the replica with the fewest outstanding; ties rotate, so that
  concurrent streams spread;
- before any of that but the first, a replica whose requests have waited ``QUIET_S`` with no
  reply byte (``quiet_s``: a stopped, hung or crashed engine, before its verdict) is passed
  over while another is not: the age of what it has outstanding counts, not only how much.

Pure and in memory: the map of conversations is bounded (the newest ``remember`` kept), and a
replica that is gone is simply not among the candidates (its conversations move on to another).
"""

from __future__ import annotations

import collections
import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

AFFINITY_SLACK = 2
"""How many more outstanding requests a conversation's replica may have than the least busy
one before the conversation moves."""
REMEMBERED = 4096
PREFIX_CHARS = 4096
"""Of a prompt string, the start that names its conversation."""
LEADING_ROLES = frozenset({"system", "developer"})
QUIET_S = 1.0
"""How long a replica's requests may wait with no reply byte before new ones go elsewhere (a
stream's tokens come far more often; the hang verdict, engines.stall_timeout_s, far later)."""


@dataclass(frozen=True)
class Replica:
    name: str
    outstanding: int
    quiet_s: float = 0.0
    """How long its requests in flight have had no reply byte (0: none in flight, or progress)."""


@dataclass(frozen=True)
class Affinity:
    """What ties a request to a replica: its body's conversation start (``key``, a digest made
    only when there is a choice), ``owner`` the replica that holds its stored state (must go
    there)."""

    payload: Mapping[str, Any] = field(default_factory=dict)
    owner: str | None = None
    avoid: frozenset[str] = frozenset()
    """Replicas this request found unreachable: another is taken while one is left."""
    boxes: bool = False
    """Whether a paired box's replica may take it (engines/peers/replicas.py): a route paired
    boxes serve, asked by this box's own client (a request a paired box sent is never relayed
    on to another box)."""

    @functools.cached_property
    def key(self) -> str | None:
        return affinity_key(self.payload)


class Balancer:
    def __init__(self, *, slack: int = AFFINITY_SLACK, remember: int = REMEMBERED) -> None:
        self.slack = slack
        self._remember = remember
        self._sticky: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._turn = 0

    def pick(self, replicas: Sequence[Replica], affinity: Affinity | None = None) -> Replica:
        """The replica for this request (``replicas`` not empty), remembered for its
        conversation."""
        affinity = affinity or Affinity()
        replicas = [r for r in replicas if r.name not in affinity.avoid] or list(replicas)
        by_name = {r.name: r for r in replicas}
        if affinity.owner is not None and affinity.owner in by_name:
            return self._keep(affinity.key, by_name[affinity.owner])
        replicas = [r for r in replicas if r.quiet_s < QUIET_S] or replicas
        by_name = {r.name: r for r in replicas}
        fewest = min(r.outstanding for r in replicas)
        sticky = by_name.get(self._sticky.get(affinity.key, "")) if affinity.key else None
        if sticky is not None and sticky.outstanding <= fewest + self.slack:
            return self._keep(affinity.key, sticky)
        least = [r for r in replicas if r.outstanding == fewest]
        self._turn += 1
        return self._keep(affinity.key, least[self._turn % len(least)])

    def _keep(self, key: str | None, replica: Replica) -> Replica:
        if key is not None:
            self._sticky[key] = replica.name
            self._sticky.move_to_end(key)
            while len(self._sticky) > self._remember:
                self._sticky.popitem(last=False)
        return replica

    def replica_of(self, key: str) -> str | None:
        """The replica a conversation went to last (None: not seen, or forgotten)."""
        return self._sticky.get(key)


def affinity_key(payload: Mapping[str, Any]) -> str | None:
    """A digest of the start of the conversation a request continues: its system prompt and
    first user message (chat, Anthropic messages), instructions and first input item
    (Responses), or the prompt's start (completions); None when the body has none of these."""
    start: list[Any] = []
    for key in ("system", "instructions"):
        if payload.get(key):
            start.append(payload[key])
    for key in ("messages", "input"):
        value = payload.get(key)
        if isinstance(value, list):
            start += _first_turn(value)
        elif isinstance(value, str):
            start.append(value[:PREFIX_CHARS])
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        start.append(prompt[:PREFIX_CHARS])
    if not start:
        return None
    text = json.dumps([payload.get("model"), start], sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


def _first_turn(messages: list[Any]) -> list[Any]:
    """The leading system/developer messages and the first message after them: what every
    later request of the same conversation starts with too."""
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, Mapping) else None
        if role not in LEADING_ROLES:
            return messages[: i + 1]
    return messages
