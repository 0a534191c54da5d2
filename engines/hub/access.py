"""Where the Hub is, which token goes there, and where the shared cache lives.

This is the ONE module that reads the Hugging Face environment (``HF_ENDPOINT``, ``HF_TOKEN``,
``HF_HOME``, ``HF_HUB_CACHE``) and the user's saved login (token.py writes and removes it).
Everything else receives a ``HubAccess`` and passes ``endpoint=``, ``token=`` and
``cache_dir=`` explicitly to huggingface_hub, so a child process or a test sees exactly the
same values.

Token rule: huggingface_hub sends the saved token to whatever endpoint is configured. traylm
sends it only to the official Hub or to an endpoint the user listed in
``hub.trusted_endpoints``; otherwise the token is withheld and errors say so.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from engines.config.sections import HubSettings
from engines.errors import ConfigError

OFFICIAL_ENDPOINT = "https://huggingface.co"


@dataclass(frozen=True)
class HubAccess:
    endpoint: str
    cache_dir: Path
    token: str | None  # the token traylm will send (None: anonymous)
    token_found: bool  # a token exists (env or saved login), sent or not
    token_withheld_reason: str  # why a found token is not sent ("" when sent or absent)

    @property
    def official(self) -> bool:
        return _origin(self.endpoint) == _origin(OFFICIAL_ENDPOINT)

    @property
    def hf_token_arg(self) -> str | bool:
        """The ``token=`` argument for huggingface_hub: the token, or False (never look one up)."""
        return self.token if self.token else False

    def worker_env(self, base: Mapping[str, str], *, read_timeout_s: float) -> dict[str, str]:
        """Environment of a download worker: the same endpoint and cache, no stray token."""
        env = {k: v for k, v in base.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
        env.update(
            HF_ENDPOINT=self.endpoint,
            HF_HUB_CACHE=str(self.cache_dir),
            HF_HUB_DOWNLOAD_TIMEOUT=str(max(1, round(read_timeout_s))),
            HF_HUB_ETAG_TIMEOUT=str(max(1, round(read_timeout_s))),
            HF_HUB_DISABLE_TELEMETRY="1",
            HF_HUB_DISABLE_PROGRESS_BARS="1",
            HF_HUB_DISABLE_IMPLICIT_TOKEN="1",  # noqa: S106 - a switch, not a secret
        )
        return env

    def gated_advice(self, repo_id: str) -> str:
        """What to do when a gated or private repo refuses us."""
        if self.token_withheld_reason:
            return self.token_withheld_reason
        if not self.token:
            return (
                f"{repo_id} is gated or private: accept its terms on the model page, then log in "
                "with `hf auth login` (or set HF_TOKEN) and try again"
            )
        return (
            f"your Hugging Face token has no access to {repo_id}: accept its terms on the model "
            "page (or ask the owner for access), then try again"
        )


def resolve_access(settings: HubSettings, environ: Mapping[str, str] | None = None) -> HubAccess:
    """Read the endpoint, token and cache folder once (settings first, then environment)."""
    env = os.environ if environ is None else environ
    endpoint = (settings.endpoint or env.get("HF_ENDPOINT") or OFFICIAL_ENDPOINT).rstrip("/")
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"hub endpoint {endpoint!r} is not an http(s) URL; fix hub.endpoint or HF_ENDPOINT"
        )
    token, _ = find_token(settings, env)
    reason = ""
    trusted = {_origin(e) for e in settings.trusted_endpoints} | {_origin(OFFICIAL_ENDPOINT)}
    if token and _origin(endpoint) not in trusted:
        reason = (
            f"your Hugging Face token is not sent to {endpoint} because it is not the official "
            "Hub; if you trust this endpoint, add it to hub.trusted_endpoints "
            f"(`traylm config set hub.trusted_endpoints '[\"{endpoint}\"]'`)"
        )
    return HubAccess(
        endpoint=endpoint,
        cache_dir=_cache_dir(env),
        token=None if reason else token,
        token_found=token is not None,
        token_withheld_reason=reason,
    )


def find_token(
    settings: HubSettings, environ: Mapping[str, str] | None = None
) -> tuple[str | None, str]:
    """The token and where it was found: the name of the variable that holds it, "file" (the
    saved login), or "" (none). Variables first, as huggingface_hub reads them."""
    env = os.environ if environ is None else environ
    for name in (settings.token_env, "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        value = env.get(name, "").strip() if name else ""
        if value:
            return value, name
    try:
        saved = token_file(env).read_text().strip()
    except OSError:
        return None, ""
    return (saved, "file") if saved else (None, "")


def token_file(environ: Mapping[str, str] | None = None) -> Path:
    """The saved login: huggingface_hub's HF_TOKEN_PATH, resolved now (that constant is fixed
    when huggingface_hub is imported): $HF_TOKEN_PATH, else $HF_HOME/token, else
    $XDG_CACHE_HOME/huggingface/token."""
    env = os.environ if environ is None else environ
    return (
        Path(env["HF_TOKEN_PATH"]).expanduser()
        if env.get("HF_TOKEN_PATH")
        else _hf_home(env) / "token"
    )


def _hf_home(env: Mapping[str, str]) -> Path:
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser()
    xdg = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface"


def _cache_dir(env: Mapping[str, str]) -> Path:
    explicit = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    return Path(explicit).expanduser() if explicit else _hf_home(env) / "hub"


def _origin(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url.rstrip("/"))
    scheme = parts.scheme.lower()
    port = parts.port or (443 if scheme == "https" else 80)
    return scheme, (parts.hostname or "").lower(), port
