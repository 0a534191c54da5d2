"""Request guards that run before anything reaches an engine or the control API.

- Path: the raw path must be canonical (no ``..``, ``//``, encoded ``.``/``/``/``\\``).
- Host: only loopback names (plus the user's additions) — the DNS-rebinding guard.
- Origin: an exact allow-list; no ``*``, no reflection, no credentials.
- API keys: SHA-256 digests compared with ``secrets.compare_digest``.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]", "::1"})
_BAD_PATH = re.compile(r"(^|/)\.\.?(/|$)|//|%2e|%2f|%5c|\\|%00", re.IGNORECASE)


def hash_key(key: str) -> str:
    return hashlib.sha256(header_bytes(key)).hexdigest()


def header_bytes(value: str) -> bytes:
    """A header value as the bytes the client sent. aiohttp decodes headers as UTF-8 with
    surrogate escapes, so a non-ASCII (or non-UTF-8) value still compares, and fails to match,
    instead of raising UnicodeEncodeError."""
    return value.encode("utf-8", "surrogateescape")


def new_api_key() -> str:
    return "tlm-" + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Guard:
    allowed_hosts: frozenset[str]
    allowed_origins: frozenset[str]
    key_digests: tuple[str, ...]
    port: int
    lan: bool
    keys_lan_only: bool = False  # gateway.keys_for = "lan": this computer needs no key
    internal_key: str = field(
        default="", repr=False
    )  # the daemon's own measurements' credential (memory only)

    @classmethod
    def build(
        cls,
        *,
        hosts: Iterable[str],
        origins: Iterable[str],
        key_digests: Iterable[str],
        port: int,
        lan: bool,
        keys_for: str = "all",
        internal_key: str = "",
    ) -> Guard:
        return cls(
            LOOPBACK_HOSTS | {h.lower() for h in hosts},
            frozenset(o.rstrip("/") for o in origins),
            tuple(key_digests),
            port,
            lan,
            keys_for == "lan",
            internal_key,
        )

    def path_problem(self, raw_path: str) -> str | None:
        path = raw_path.split("?", 1)[0]
        if not path.startswith("/") or _BAD_PATH.search(path):
            return "the request path is not canonical (no '..', '//' or encoded separators)"
        return None

    def host_ok(self, host_header: str | None) -> bool:
        if not host_header:
            return False
        host = host_header.strip().lower()
        name, port = _split_host(host)
        if port is not None and port != self.port:
            return False
        if name in self.allowed_hosts:
            return True
        if self.lan:
            # With LAN sharing on, clients use this machine's address. An IP literal cannot be a
            # DNS-rebinding attack (the attacker's page would carry its own domain name).
            try:
                ipaddress.ip_address(name.strip("[]"))
            except ValueError:
                return False
            return True
        return False

    def origin_ok(self, origin: str | None) -> bool:
        """No Origin (curl, SDKs, apps) is fine; a browser's Origin must be allow-listed."""
        if origin is None:
            return True
        return origin.rstrip("/") in self.allowed_origins

    @property
    def keys_required(self) -> bool:
        return bool(self.key_digests)

    def key_ok(
        self, authorization: str | None, x_api_key: str | None = None, *, loopback: bool = False
    ) -> bool:
        """The key from ``Authorization: Bearer KEY`` (OpenAI clients), else from Anthropic's
        ``x-api-key: KEY`` header; both are checked against the same digests. ``loopback``: the
        request comes from this computer (which needs no key with keys for the LAN only)."""
        if not self.key_digests or (self.keys_lan_only and loopback):
            return True
        return self.key_used(authorization, x_api_key) is not None or self.internal(
            authorization, x_api_key
        )

    def internal(self, authorization: str | None, x_api_key: str | None = None) -> bool:
        """The request carries the daemon's own credential: its tuner's and upgrade's
        measurements, which never need (nor see) the user's keys. Random for each daemon run,
        held in memory only."""
        if not self.internal_key:
            return False
        given = _given(authorization, x_api_key)
        return bool(given) and secrets.compare_digest(
            header_bytes(given), self.internal_key.encode()
        )

    def key_used(self, authorization: str | None, x_api_key: str | None = None) -> str | None:
        """The digest of the configured key the request carries, or None (none, or wrong)."""
        given = _given(authorization, x_api_key)
        if not given:
            return None
        digest = hash_key(given)
        found = None
        for expected in self.key_digests:  # no early exit: constant time over the key list
            if secrets.compare_digest(digest, expected):
                found = expected
        return found

    def caller(
        self, authorization: str | None, x_api_key: str | None, *, remote: str | None, local: bool
    ) -> str:
        """Who is asking, as far as ownership goes (a stored response belongs to who made it):
        with API keys on, the key (its digest; this computer when keys are for the LAN only and
        it sent none); with keys off, this computer (``local``: a loopback peer), or else the
        peer's address."""
        if self.key_digests:
            used = self.key_used(authorization, x_api_key)
            if used is not None or not (self.keys_lan_only and local):
                return "key:" + (used or "none")
        return "this computer" if local else f"peer:{remote}"


def _given(authorization: str | None, x_api_key: str | None) -> str:
    if authorization and authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    return (x_api_key or "").strip()


def _split_host(host: str) -> tuple[str, int | None]:
    if host.startswith("["):
        end = host.find("]")
        name, rest = host[: end + 1], host[end + 1 :]
        port = rest[1:] if rest.startswith(":") else None
    elif host.count(":") == 1:
        name, port = host.split(":")
    else:
        name, port = host, None
    try:
        return name, int(port) if port else None
    except ValueError:
        return name, -1
