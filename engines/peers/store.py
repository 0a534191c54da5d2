"""The paired boxes, kept in one JSON file (0600, written temp-then-rename) so that a restart
keeps every pairing."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from engines.config.tomlfile import write_bytes_atomic
from engines.errors import ConfigError


@dataclass(frozen=True)
class Peer:
    """A paired box: its name, where its peer listener is, and the certificate pinned."""

    name: str
    address: str  # host:port
    fingerprint: str  # SHA-256 of cert_pem's DER, hex
    cert_pem: str
    paired_at_s: float
    last_seen_s: float | None = None


def load(path: Path) -> list[Peer]:
    """The peers in ``path`` (none when it does not exist); ConfigError when it is damaged."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{path} cannot be read ({exc}); move it away and pair the boxes again"
        ) from None
    fields = {f.name for f in dataclasses.fields(Peer)}
    try:
        return [Peer(**{k: v for k, v in row.items() if k in fields}) for row in data["peers"]]
    except (KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(
            f"{path} is not a traylm peers file ({exc}); move it away and pair the boxes again"
        ) from None


def load_or_set_aside(path: Path) -> tuple[list[Peer], str]:
    """``load``, except that a damaged file is renamed to ``<name>.damaged`` (kept for the
    user, out of the way of the next pairing) and no peers are returned: (peers, what was done
    about a damaged file, or "")."""
    try:
        return load(path), ""
    except ConfigError as exc:
        aside = path.with_name(path.name + ".damaged")
        path.replace(aside)
        return [], f"{exc.message}; it was moved to {aside}"


def save(path: Path, peers: list[Peer]) -> None:
    """Write every peer (blocking: call in a thread)."""
    body = {"version": 1, "peers": [dataclasses.asdict(p) for p in peers]}
    write_bytes_atomic(path, json.dumps(body, indent=1).encode(), mode=0o600)
