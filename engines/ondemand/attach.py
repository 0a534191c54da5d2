"""Attached servers: OpenAI-compatible servers traylm did not start (a user's own `vllm serve`,
llama-server, another box on the LAN). traylm routes requests to them like to an engine and
checks their health, but never starts or stops them.

Kept in ``attached.toml`` in the config dir: name, URL and the NAME of the environment variable
holding the key; the key itself is never written anywhere. The daemon reads that variable from
its own environment, or keeps the value the CLI sent with `traylm attach` in memory only.
Only loopback and private-network (LAN) addresses are accepted: a public API is the remote
fallback's job, where the user's consent and key handling are explicit.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import re
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from engines.config.profiles import NAME_RULE, valid_name
from engines.config.tomlfile import read_toml, write_toml_atomic
from engines.errors import ConfigError, quoted
from engines.events.codec import Event
from engines.events.models import AttachedChanged, AttachedServer
from engines.gateway.upstream import Upstream
from engines.ondemand.catalog import EXPLICIT, IMPLICIT, Entry

log = logging.getLogger(__name__)

CHECK_PERIOD_S = 15.0
CHECK_TIMEOUT_S = 5.0
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ADMISSION_PREFIX = "attached:"


class AttachError(ConfigError):
    code = "attach_failed"


class AttachedServers:
    """The attached servers, their health, and their upstreams. Implements the catalog's
    ``Source`` (kind ``attached``)."""

    kind = "attached"

    def __init__(self, path: Path, publish: Callable[[Event], None]) -> None:
        self._path = path
        self._publish = publish
        self.servers: dict[str, AttachedServer] = {}
        self._keys: dict[str, str] = {}
        self._task: asyncio.Task[None] | None = None
        self._http: aiohttp.ClientSession | None = None

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        self._http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=CHECK_TIMEOUT_S), trust_env=False
        )
        for name, fields in (await asyncio.to_thread(self._read)).items():
            self.servers[name] = AttachedServer(
                name, fields["url"], fields.get("key_env", ""), "unreachable", (), "not checked"
            )
        self._task = asyncio.create_task(self._health_loop(), name="attached servers")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._http is not None:
            await self._http.close()

    # ----------------------------------------------------------------- attach, detach

    async def attach(
        self, name: str, url: str, *, key_env: str = "", key: str = ""
    ) -> AttachedServer:
        """Check the server answers like OpenAI, then keep it. Raises AttachError with the
        reason (bad name or URL, down, not OpenAI, a public address)."""
        if not valid_name(name):
            raise AttachError(f"name {quoted(name)} must be {NAME_RULE}")
        if key_env and not _ENV_RE.match(key_env):
            raise AttachError(f"--key-env {key_env!r} is not an environment variable name")
        base = await asyncio.to_thread(check_url, url)
        secret = key or (os.environ.get(key_env, "") if key_env else "")
        if key_env and not secret:
            raise AttachError(
                f"the environment variable {key_env} is empty (in the CLI's and the daemon's "
                f"environment); export {key_env}=... and attach again"
            )
        models = await self._probe(base, secret)
        if secret:
            self._keys[name] = secret
        server = AttachedServer(name, base, key_env, "ready", models, "", time.time())
        self.servers[name] = server
        await asyncio.to_thread(self._write)
        self._publish(AttachedChanged(server=server))
        return server

    async def detach(self, name: str) -> AttachedServer:
        server = self.servers.pop(name, None)
        if server is None:
            known = ", ".join(sorted(self.servers)) or "none"
            raise AttachError(f"no attached server named {quoted(name)}; attached: {known}")
        self._keys.pop(name, None)
        await asyncio.to_thread(self._write)
        gone = replace(server, state="detached", detail="detached")
        self._publish(AttachedChanged(server=gone))
        return gone

    # ----------------------------------------------------------------- routing

    def upstream(self, name: str, requested: str) -> Upstream | None:
        """The upstream of a ready server; the body's model is rewritten to the server's own
        model id when the request used the attach name and the server serves one model."""
        server = self.servers.get(name)
        if server is None or server.state != "ready":
            return None
        key = self._key(server)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        one = server.models[0] if len(server.models) == 1 else None
        rename = one if requested not in server.models else None
        return Upstream(ADMISSION_PREFIX + name, server.url, headers, model_name=rename)

    def entries(self) -> list[Entry]:
        return [
            Entry(
                name=s.name,
                kind=self.kind,
                engine_id=s.name,
                claims=((s.name, EXPLICIT), *((m, IMPLICIT) for m in s.models)),
                listed=tuple(m for m in s.models if m != s.name),
                url=s.url,
            )
            for s in list(self.servers.values())
        ]

    # ----------------------------------------------------------------- health

    async def check(self, name: str) -> AttachedServer:
        server = self.servers[name]
        key = self._key(server)
        try:
            models = await self._probe(server.url, key)
            new = replace(server, state="ready", models=models, detail="", checked_at_s=time.time())
        except AttachError as exc:
            new = replace(server, state="unreachable", detail=exc.message, checked_at_s=time.time())
        if self.servers.get(name) is server:
            self.servers[name] = new
            if (new.state, new.models) != (server.state, server.models):
                log.info("attached server %s: %s %s", name, new.state, new.detail)
                self._publish(AttachedChanged(server=new))
        return new

    def _key(self, server: AttachedServer) -> str:
        held = self._keys.get(server.name)
        if held:
            return held
        return os.environ.get(server.key_env, "") if server.key_env else ""

    async def _health_loop(self) -> None:
        while True:
            for name in list(self.servers):
                with contextlib.suppress(KeyError):
                    await self.check(name)
            await asyncio.sleep(CHECK_PERIOD_S)

    async def _probe(self, base: str, key: str) -> tuple[str, ...]:
        """GET /v1/models; the model ids, or AttachError saying why not."""
        assert self._http is not None, "start() first"
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        try:
            async with self._http.get(f"{base}/v1/models", headers=headers) as resp:
                if resp.status in (401, 403):
                    raise AttachError(
                        f"{base} refused the key ({resp.status}); attach with --key-env VAR "
                        "naming the variable that holds its API key"
                    )
                if resp.status != 200:
                    raise AttachError(
                        f"{base}/v1/models answered {resp.status}: not an OpenAI-compatible "
                        "server (or its API is not under /v1)"
                    )
                data = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise AttachError(
                f"{base} does not answer ({type(exc).__name__}); start the server, or check "
                "the URL and port"
            ) from None
        except ValueError:
            raise AttachError(f"{base}/v1/models is not JSON: not an OpenAI server") from None
        items = data.get("data") if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise AttachError(
                f"{base}/v1/models has no 'data' list: not an OpenAI-compatible model list"
            )
        return tuple(str(m["id"]) for m in items if isinstance(m, dict) and "id" in m)

    # ----------------------------------------------------------------- file

    def _read(self) -> dict[str, dict[str, str]]:
        if not self._path.exists():
            return {}
        data = read_toml(self._path)
        return {
            name: {"url": str(v.get("url", "")), "key_env": str(v.get("key_env", ""))}
            for name, v in data.items()
            if isinstance(v, dict) and v.get("url")
        }

    def _write(self) -> None:
        data = {
            s.name: {"url": s.url, **({"key_env": s.key_env} if s.key_env else {})}
            for s in self.servers.values()
        }
        write_toml_atomic(self._path, data)


def check_url(url: str) -> str:
    """The server's base URL (scheme://host:port, no /v1), if it is on this machine or the LAN.
    Blocking (it resolves the host name). Raises AttachError."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise AttachError(f"{url!r} is not an http(s) URL such as http://127.0.0.1:9000/v1")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise AttachError(f"{url!r} has an invalid port") from None
    host = parts.hostname
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
    except OSError:
        raise AttachError(f"cannot resolve {host!r}; check the host name") from None
    for address in addresses:
        ip = ipaddress.ip_address(str(address).split("%", 1)[0])
        if not (ip.is_loopback or ip.is_private or ip.is_link_local):
            raise AttachError(
                f"{host} is a public address ({ip}); traylm attaches servers on this machine "
                "or your LAN only (for a public API use the remote fallback: `traylm remote`)"
            )
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    if path:
        raise AttachError(
            f"{url!r} has a path ({parts.path}); give the server's base URL (its API under /v1)"
        )
    shown = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{shown}:{port}"
