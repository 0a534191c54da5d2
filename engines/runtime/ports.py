"""What a ManagedEngine is given by its callers: where its events go, and the work plugged
into its start (a TensorRT engine build, the ranks on other boxes)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from engines.config.profiles import Profile
from engines.events.codec import Event

Publish = Callable[[Event], None]
LogSink = Callable[[str], None]
Prepare = Callable[[LogSink], Awaitable[tuple[Profile, str]]]
"""Work before the first spawn of a start (a TensorRT engine build): gets a sink for its log
lines (they are diagnosed like engine output) and returns the profile and model to launch with.
It runs in state ``starting`` and is cancelled by ``stop()``; a TraylmError fails the start."""


class Ranks(Protocol):
    """The other ranks of a model across boxes (vLLM multi-node), supervised with this engine
    (the head rank, which serves the API) as one: started before each life of it, checked
    while it starts and runs, ended with it (engines/multinode/head.py)."""

    async def begin(self, sink: LogSink) -> Profile:
        """Check every box and start the other ranks for one life; returns the profile this
        box's rank launches with. Raises TraylmError (naming the box and the fix); nothing is
        left running on any box then."""
        ...

    def problem(self) -> str | None:
        """Why the ranks cannot go on (a rank ended, its box went silent), or None."""
        ...

    async def end(self) -> None:
        """End the other ranks (every process of each); returns once their boxes said so or
        could not be reached."""
        ...
