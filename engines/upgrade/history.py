"""The last guarded upgrade of each engine build (data/upgrade/ENGINE-DEVICE.json), which
`traylm engines upgrade ENGINE --undo` reads: the version it replaced and whether it switched.
Blocking file I/O: call from a thread."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from engines.config.tomlfile import write_bytes_atomic


@dataclass(frozen=True)
class Upgraded:
    engine: str
    device: str
    old: str
    new: str
    state: str  # an UpgradeState value, or "undone"
    at_s: float


class UpgradeHistory:
    def __init__(self, folder: Path) -> None:
        """No I/O."""
        self.folder = folder

    def save(self, record: Upgraded) -> None:
        path = self.folder / f"{record.engine}-{record.device}.json"
        write_bytes_atomic(path, json.dumps(asdict(record), indent=1).encode(), mode=0o600)

    def last(self, engine: str, device: str) -> Upgraded | None:
        try:
            data = json.loads((self.folder / f"{engine}-{device}.json").read_text())
            return Upgraded(**data)
        except (OSError, ValueError, TypeError):  # none, or unreadable: as if none
            return None
