"""The Hugging Face token: where traylm would find one, and saving one where every Hugging Face
tool looks (the file ``hf auth login`` writes), readable only by the user. The daemon's hub
feature and the engines read it from there."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from engines.tomlfile import write_bytes_atomic


def token_path(environ: Mapping[str, str] | None = None) -> Path:
    """Resolved like huggingface_hub.constants.HF_TOKEN_PATH, but at call time (that constant
    is fixed when huggingface_hub is imported): $HF_TOKEN_PATH, else $HF_HOME/token, else
    $XDG_CACHE_HOME/huggingface/token, else ~/.cache/huggingface/token."""
    env = os.environ if environ is None else environ
    if env.get("HF_TOKEN_PATH"):
        return Path(env["HF_TOKEN_PATH"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "token"
    cache = env.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(cache) / "huggingface" / "token"


def token_source(token_env: str, environ: Mapping[str, str]) -> str:
    if token_env and environ.get(token_env):
        return f"A token is set in ${token_env} (the environment); it takes precedence."
    path = token_path(environ)
    try:
        if path.read_text().strip():
            return f"A token is saved in {path}."
    except OSError:
        pass
    return "No token: public models only (gated models such as Llama need one)."


def write_token(token: str, environ: Mapping[str, str] | None = None) -> Path:
    path = token_path(environ)
    write_bytes_atomic(path, token.strip().encode(), mode=0o600)
    return path
