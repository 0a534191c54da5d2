"""The Hugging Face token the daemon sends: which one it finds, saving one, removing the saved
one. The daemon owns the login file (``hf auth login``'s, so every Hugging Face tool finds the
same token), written whole or not at all, readable only by the user. huggingface_hub's own
``login`` checks the token online first and reads the file's place once at import; traylm saves
offline and resolves the place at each call (access.token_file).
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from pathlib import Path

from engines.config.sections import HubSettings
from engines.config.tomlfile import write_bytes_atomic
from engines.errors import ConfigError
from engines.events.hub import HFTokenStatus
from engines.hub.access import find_token, resolve_access, token_file

TOKEN_MAX_CHARS = 1000
_TOKEN_CHARS = frozenset(string.ascii_letters + string.digits + "_-.")


def token_status(settings: HubSettings, environ: Mapping[str, str] | None = None) -> HFTokenStatus:
    _, where = find_token(settings, environ)
    access = resolve_access(settings, environ)
    return HFTokenStatus(
        source="file" if where == "file" else ("env" if where else ""),
        env_var="" if where == "file" else where,
        path=str(token_file(environ)),
        sent=access.token is not None,
        withheld_reason=access.token_withheld_reason,
    )


def save_token(token: str, environ: Mapping[str, str] | None = None) -> Path:
    """Save ``token`` as the login (0600). Raises ConfigError for what cannot be a token,
    OSError when the file cannot be written."""
    token = token.strip()
    if not token:
        raise ConfigError(
            "the Hugging Face token is empty; paste it from huggingface.co/settings/tokens"
        )
    if len(token) > TOKEN_MAX_CHARS or not set(token) <= _TOKEN_CHARS:
        raise ConfigError(
            "that is not a Hugging Face token (letters, digits, _ - . only, one line); copy it "
            "again from huggingface.co/settings/tokens"
        )
    path = token_file(environ)
    write_bytes_atomic(path, token.encode(), mode=0o600)
    return path


def clear_token(environ: Mapping[str, str] | None = None) -> bool:
    """Remove the saved login; False when there was none. A token in the environment stays
    (the daemon cannot change its own environment)."""
    path = token_file(environ)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True
