"""TOML files read with an error that says what to fix, and files written atomically
(temp-then-rename): a crash at any moment leaves either the old or the new file."""

from __future__ import annotations

import os
import tempfile
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from engines.errors import ConfigError


def read_toml(path: Path) -> dict[str, Any]:
    """The file's table. Raises ConfigError (not TOML, not UTF-8, unreadable) saying what to do."""
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc}); fix the file or delete it") from exc
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{path}: not UTF-8 text (line {line} has the byte {exc.object[exc.start]:#04x}); "
            "save it as UTF-8, or delete it"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror})") from exc


def write_toml_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Write TOML so that a crash at any moment leaves either the old or the new file. Settings
    and profiles are the user's own: readable by nobody else (0600). The writer is imported
    here: a command that only reads settings never loads it."""
    import tomli_w

    write_bytes_atomic(path, tomli_w.dumps(dict(data)).encode(), mode=0o600)


def write_bytes_atomic(path: Path, payload: bytes, mode: int = 0o644) -> None:
    """Write ``payload`` temp-then-rename (fsynced, parent folders made) with ``mode``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        Path(tmp).chmod(mode)
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
