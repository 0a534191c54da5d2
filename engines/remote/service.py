"""The optional remote fallback: an OpenAI-compatible API that serves chosen model aliases when
no local engine can (not served, starting, failed, stopped) or the local queue is full.

Off by default (``[remote] enabled``). Only the aliases listed in ``remote.aliases`` ever leave
the machine. The key comes from the environment variable ``remote.api_key_env`` or the OS
keyring (service "traylm", user "remote-api-key"), never from config.toml. The key is sent only
over https (plain http only to a loopback address). Responses routed here carry
``X-Traylm-Route: remote`` (proxy.py) and are logged with ``remote = 1`` in the usage table.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
from collections.abc import Callable
from urllib.parse import urlsplit

from engines.config.sections import RemoteSettings
from engines.errors import ConfigError
from engines.events.codec import Event
from engines.events.remote import RemoteRouted, RemoteStatus
from engines.gateway.upstream import Upstream

log = logging.getLogger(__name__)

KEYRING_SERVICE = "traylm"
KEYRING_USER = "remote-api-key"
UPSTREAM_NAME = "remote"


def read_keyring() -> tuple[str | None, str]:
    """(key, detail) from the OS keyring; blocking (D-Bus), call from a thread."""
    try:
        import keyring
        import keyring.errors
    except ImportError:
        return None, "the keyring package is not installed"
    try:
        key = keyring.get_password(KEYRING_SERVICE, KEYRING_USER)
    except keyring.errors.KeyringError as exc:
        return None, f"no usable OS keyring ({type(exc).__name__})"
    return key, "" if key else "no key stored in the OS keyring"


def store_keyring(key: str | None) -> None:
    """Store (or with None, delete) the remote key in the OS keyring; blocking."""
    try:
        import keyring
        import keyring.errors
    except ImportError:
        raise ConfigError(
            "the keyring package is not installed; set the key in the environment variable "
            "named by remote.api_key_env instead"
        ) from None
    try:
        if key is None:
            try:
                keyring.delete_password(KEYRING_SERVICE, KEYRING_USER)
            except keyring.errors.PasswordDeleteError:
                pass
        else:
            keyring.set_password(KEYRING_SERVICE, KEYRING_USER, key)
    except keyring.errors.KeyringError as exc:
        raise ConfigError(
            f"no usable OS keyring ({type(exc).__name__}: {exc}); set the key in the "
            "environment variable named by remote.api_key_env (TRAYLM_REMOTE_API_KEY by "
            "default) for the daemon instead"
        ) from None


def base_url_problem(url: str) -> str:
    """ "" when ``url`` may receive the key; else why not."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"remote.base_url {url!r} is not an http(s) URL"
    if parts.scheme == "http" and not _loopback(parts.hostname):
        return (
            f"remote.base_url {url!r} uses plain http to another machine, which would send the "
            "API key in clear; use https"
        )
    return ""


def upstream_base(url: str) -> str:
    """The relay appends the request path (/v1/...), so a trailing /v1 is dropped."""
    base = url.rstrip("/")
    return base[:-3] if base.endswith("/v1") else base


class RemoteFallback:
    """The remote fallback feature; as ``GatewayContext.fallback``: (model, why) → the remote
    upstream, or None. /api/status gains "remote" (RemoteStatus); routes in routes.py."""

    name = "remote"

    def __init__(
        self,
        settings: Callable[[], RemoteSettings],
        publish: Callable[[Event], None],
        environ: dict[str, str] | None = None,
    ) -> None:
        self._settings = settings
        self._publish = publish
        self._environ = environ
        self._keyring_key: str | None = None
        self._keyring_detail = "not read yet"
        self._started = False
        self.routed = 0

    async def start(self) -> None:
        await self.refresh_key()
        self._started = True

    async def stop(self) -> None:
        return None

    async def refresh_key(self) -> None:
        """Read the keyring again (at start and after `traylm remote set-key`)."""
        self._keyring_key, self._keyring_detail = await asyncio.to_thread(read_keyring)

    def _key(self) -> tuple[str | None, str]:
        env = os.environ if self._environ is None else self._environ
        value = env.get(self._settings().api_key_env)
        if value:
            return value, "env"
        if self._keyring_key:
            return self._keyring_key, "keyring"
        return None, "none"

    def __call__(self, model: str, why: str) -> Upstream | None:
        s = self._settings()
        if not self._started:  # the keyring's key is not read yet: answer as if off
            return None
        if not s.enabled or model not in s.aliases or base_url_problem(s.base_url):
            return None
        key, _ = self._key()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.routed += 1
        self._publish(RemoteRouted(model=model, why=why))
        log.info("routing %s to the remote API (%s)", model, why)
        return Upstream(UPSTREAM_NAME, upstream_base(s.base_url), headers, remote=True)

    def status(self) -> RemoteStatus:
        s = self._settings()
        key, source = self._key()
        problem = base_url_problem(s.base_url) if s.base_url else "remote.base_url is not set"
        if not s.enabled:
            detail = "off (remote.enabled = false)"
        elif problem:
            detail = problem
        elif not s.aliases:
            detail = "on, but remote.aliases is empty: no model falls back"
        elif key is None:
            detail = (
                f"on for {', '.join(s.aliases)}; no API key ({self._keyring_detail}; "
                f"${s.api_key_env} is unset): requests go without one"
            )
        else:
            detail = f"on for {', '.join(s.aliases)} (key from {source})"
        return RemoteStatus(
            enabled=s.enabled,
            base_url=s.base_url,
            aliases=tuple(s.aliases),
            key_source=source,
            ready=s.enabled and not problem and bool(s.aliases),
            detail=detail,
            routed_requests=self.routed,
        )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
