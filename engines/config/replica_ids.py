"""Replica engine ids: the profile's name for the first copy, ``NAME.r2``,
``NAME.r3``... for the others. No imports: `traylm status` reads them without loading the
settings' classes (tests/engines/cli/test_cli_start.py)."""

from __future__ import annotations

MAX_REPLICAS = 8
REPLICA_SEP = ".r"
"""A replica's engine id: the profile's name for the first, ``NAME.r2``, ``NAME.r3``... for
the others (``replica_id``): a valid name itself, so every route, log file and client check of
engine ids takes it unchanged."""


def replica_id(name: str, index: int) -> str:
    """The engine id of replica ``index`` (1-based) of profile ``name``."""
    return name if index == 1 else f"{name}{REPLICA_SEP}{index}"


def replica_base(engine_id: str) -> str:
    """The profile name a replica's engine id was made from (the id itself for the first)."""
    return engine_id if replica_index(engine_id) == 1 else engine_id.rpartition(REPLICA_SEP)[0]


def replica_index(engine_id: str) -> int:
    """Which replica an engine id names (1: the profile's own)."""
    base, sep, index = engine_id.rpartition(REPLICA_SEP)
    if sep and base and index.isdigit() and 2 <= int(index) <= MAX_REPLICAS:
        return int(index)
    return 1
