"""The client's transport: finding the daemon (daemon_info.py), the calls over aiohttp or the
standard library (oneshot.py's exchange, in a thread: plain_calls.py), errors, the event stream;
``ClientBase`` is what every feature's calls build on (engines/client/__init__.py puts them
together as DaemonClient)."""

from __future__ import annotations

import asyncio
import http.client
import json
from collections.abc import AsyncIterator, Callable, Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self
from urllib.parse import quote

from engines import __version__
from engines.client.daemon_info import DAEMON_JSON_WAIT_S, DaemonInfo, pid_alive, wait_for_daemon
from engines.client.lines import lines
from engines.client.oneshot import (
    CONNECT_TIMEOUT_S,
    JSON,
    AnswerTimedOut,
    answer_data,
    api_error,
    busy,
    unreachable,
)
from engines.client.plain_calls import PlainCalls
from engines.config.paths import Paths
from engines.errors import ConfigError, ControlAPIError, DaemonUnavailable
from engines.events.codec import Event
from engines.events.registry import from_wire

if TYPE_CHECKING:
    import aiohttp

__all__ = [  # with what the feature calls take from oneshot.py and daemon_info.py through here
    "CONNECT_TIMEOUT_S",
    "DOCTOR_TIMEOUT_S",
    "JSON",
    "ClientBase",
    "DaemonInfo",
    "api_error",
    "api_path",
    "find_daemon",
    "invalid_name",
    "named_path",
    "pid_alive",
]

DOCTOR_TIMEOUT_S = 600.0


async def find_daemon(paths: Paths, *, wait_s: float = DAEMON_JSON_WAIT_S) -> DaemonInfo:
    """The running daemon's daemon.json (daemon_info.wait_for_daemon, in a worker thread)."""
    return await asyncio.to_thread(wait_for_daemon, paths, wait_s=wait_s)


def invalid_name(message: str) -> ControlAPIError:
    """The error the daemon answers for a name it refuses (400, ``invalid_name``)."""
    return ControlAPIError(message, code="invalid_name", http_status=400)


def api_path(template: str, *names: str | int) -> str:
    """``template`` with each ``{}`` filled by one name, quoted as ONE path segment
    (``quote(name, safe="")``): a name holding '/', '?', '#' or '%' stays that name and cannot
    reach another route. Every path this client builds from a name comes from here.

    '', '.' and '..' cannot travel as a segment (a URL resolves them as path steps): refused
    here with ``invalid_name``, as the daemon refuses a name it does not accept."""
    quoted = []
    for name in names:
        text = str(name)
        if text in ("", ".", ".."):
            raise invalid_name(f"{text!r} is not a name (an empty name, '.' or '..' names nothing)")
        quoted.append(quote(text, safe=""))
    return template.format(*quoted)


def named_path(template: str, name: str, what: str) -> str:
    """``api_path`` for a name with the form of a profile name, which engine ids, model folders
    and attached servers share; any other is refused here with the daemon's own check and
    words (config.profiles.check_name), not sent as a path its guard would refuse unexplained.
    ``what``: the kind of name, for the message."""
    from engines.config.profiles import check_name  # the settings' classes: only for a named call

    try:
        check_name(name, what)
    except ConfigError as exc:
        raise invalid_name(exc.message) from None
    return api_path(template, name)


def _repo_path(repo_id: str, tail: str = "") -> str:
    """/api/models/ORG/NAME + tail for a Hugging Face repo id: two segments, each quoted."""
    org, _, name = repo_id.partition("/")
    if repo_id.count("/") != 1 or {org, name} & {"", ".", ".."}:
        raise invalid_name(
            f"{repo_id[:120]!r} is not a Hugging Face model name: use org/name, "
            "e.g. Qwen/Qwen2.5-7B-Instruct"
        )
    return api_path("/api/models/{}/{}" + tail, org, name)


class ClientBase:
    def __init__(
        self, info: DaemonInfo, *, timeout_s: float = 30.0, plain_calls: bool = False
    ) -> None:
        """``plain_calls``: calls through the standard library, not aiohttp (a CLI command)."""
        self.info = info
        self._timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        self._plain = (
            PlainCalls(
                info.url, info.token, timeout_s=timeout_s, connect_timeout_s=CONNECT_TIMEOUT_S
            )
            if plain_calls
            else None
        )

    @classmethod
    async def connect(
        cls, paths: Paths | None = None, *, timeout_s: float = 30.0, plain_calls: bool = False
    ) -> Self:
        info = await find_daemon(paths or Paths.from_env())
        client = cls(info, timeout_s=timeout_s, plain_calls=plain_calls)
        try:
            await client.status()
        except BaseException:
            await client.close()
            raise
        return client

    @property
    def version_matches(self) -> bool:
        return self.info.version == __version__

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close its connections; a call made later (a task that outlived its owner) is
        refused instead of opening a session nobody would close."""
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._closed:
            raise DaemonUnavailable("this connection to the daemon was closed")
        if self._session is None:
            import aiohttp  # here: a command that only calls never needs it (150 ms to import)

            self._session = aiohttp.ClientSession(
                base_url=self.info.url,
                timeout=aiohttp.ClientTimeout(
                    total=self._timeout_s, sock_connect=CONNECT_TIMEOUT_S
                ),
                headers={"Authorization": f"Bearer {self.info.token}"},
            )
        return self._session

    async def _call(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        """``timeout_s``: how long this call may take, instead of the client's timeout."""
        timeout = self._timeout_s if timeout_s is None else timeout_s
        if self._plain is not None:
            try:
                status, body = await self._plain.request(
                    method, path, json_body=json_body, params=params, timeout_s=timeout
                )
            except AnswerTimedOut:
                raise busy(timeout) from None
            except (OSError, http.client.HTTPException) as exc:
                raise unreachable(self.info.url, exc) from None
        else:
            status, body = await self._aiohttp_call(method, path, json_body, params, timeout)
        return answer_data(status, body)

    async def _aiohttp_call(
        self,
        method: str,
        path: str,
        json_body: Any,
        params: dict[str, str] | None,
        timeout_s: float,
    ) -> tuple[int, bytes]:
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=CONNECT_TIMEOUT_S)
        try:
            async with self._http().request(
                method, path, json=json_body, params=params, timeout=timeout
            ) as resp:
                return resp.status, await resp.read()
        except aiohttp.ClientConnectionError as exc:  # no connection (a connect timeout too)
            raise unreachable(self.info.url, exc) from None
        except TimeoutError:
            raise busy(timeout_s) from None

    async def _text(self, path: str, params: dict[str, str] | None = None) -> str:
        """A GET answered with a page (HTML), not JSON; errors as for ``_call``."""
        import aiohttp

        try:
            async with self._http().get(path, params=params) as resp:
                if resp.status != 200:
                    data = await resp.json(content_type=None)
                    raise api_error(resp.status, data)
                return await resp.text()
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            raise DaemonUnavailable(
                f"the traylm daemon at {self.info.url} does not answer ({type(exc).__name__})"
            ) from None

    async def status(self) -> JSON:
        data: JSON = await self._call("GET", "/api/status")
        return data

    async def events(
        self, kinds: Iterable[str] | None = None, *, opened: Callable[[], None] | None = None
    ) -> AsyncIterator[Event]:
        """Yield events until the daemon closes the stream. Unknown kinds (a newer daemon) are
        skipped. ``opened`` is called once the daemon has subscribed this stream: nothing
        published after that is missed."""
        import aiohttp

        params = {"kinds": ",".join(kinds)} if kinds else None
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=60)
        try:
            async with self._http().get("/api/events", params=params, timeout=timeout) as resp:
                if resp.status != 200:
                    raise ControlAPIError(
                        f"events stream refused: HTTP {resp.status}",
                        code="events",
                        http_status=resp.status,
                    )
                if opened is not None:
                    opened()
                async for raw in lines(resp.content):
                    line = raw.decode(errors="replace").strip()
                    if not line.startswith("data:"):
                        continue
                    try:
                        yield from_wire(json.loads(line[5:]))
                    except (KeyError, ValueError, TypeError):
                        continue
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError):
            raise DaemonUnavailable(f"lost the event stream from {self.info.url}") from None
