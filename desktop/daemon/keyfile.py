"""The API key the chat window sends when the gateway requires one (LAN sharing on).

The daemon keeps only SHA-256 digests of keys, so the chat window keeps its own copy of one
key, readable only by the user (mode 0600), next to traylm's config."""

from __future__ import annotations

from pathlib import Path

from engines.config.sections import Paths
from engines.config.tomlfile import write_bytes_atomic


def key_path(paths: Paths) -> Path:
    return paths.config_dir / "desktop" / "chat-api-key"


def read_key(paths: Paths) -> str:
    try:
        return key_path(paths).read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return ""


def write_key(paths: Paths, key: str) -> None:
    write_bytes_atomic(key_path(paths), key.strip().encode(), mode=0o600)
