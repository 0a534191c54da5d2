"""Blocking calls to the daemon's control API over the standard library's HTTP client on the
loopback socket: the transport of every call the CLI makes, and the whole client of a one-shot
command. ``traylm ps`` and ``traylm status`` run without an event loop: ``OneShotClient``, this
module and the event types the command reads are all they import
(tests/engines/cli/test_cli_start.py guards it; tests/perf/cli_start.py measures it). The async
client (base.py) runs the same ``exchange`` in a thread (plain_calls.py) and words its errors
with the same functions.
"""

from __future__ import annotations

import http.client
import json
import urllib.parse
from typing import TYPE_CHECKING, Any

from engines.client.daemon_info import DaemonInfo, wait_for_daemon
from engines.config.paths import Paths
from engines.errors import ControlAPIError, DaemonUnavailable
from engines.events.codec import from_plain

if TYPE_CHECKING:
    from engines.events.core import EngineStatus
    from engines.events.models import LoadedModel, ServableModel

JSON = dict[str, Any]
CONNECT_TIMEOUT_S = 3.0
SAFE_IN_PATH = "/%:@!$&'()*+,;=-._~"
"""What a request path keeps as it is: its separators, and escapes already made."""


class AnswerTimedOut(TimeoutError):
    """Connected and asked, but the answer did not come within the call's time."""


def request_target(path: str, params: dict[str, str] | None) -> str:
    """The request line's target: ``path`` percent-encoded where it must be (a space, a
    non-ASCII name; what is escaped already stays), then the query."""
    target = urllib.parse.quote(path, safe=SAFE_IN_PATH)
    return f"{target}?{urllib.parse.urlencode(params)}" if params else target


def exchange(
    url: str,
    token: str,
    method: str,
    target: str,
    json_body: Any,
    *,
    timeout_s: float,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
) -> tuple[int, bytes]:
    """One request on a fresh connection to ``url`` (http://127.0.0.1:PORT): the answer's HTTP
    status and body. Raises AnswerTimedOut (connected and asked, no answer within
    ``timeout_s``), OSError (no connection) or http.client.HTTPException (the connection broke
    off mid-answer)."""
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    body = None
    if json_body is not None:
        body = json.dumps(json_body).encode()
        headers["Content-Type"] = "application/json"
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(
        parts.hostname or "127.0.0.1", parts.port, timeout=connect_timeout_s
    )
    try:
        conn.connect()
        assert conn.sock is not None
        conn.sock.settimeout(timeout_s)
        try:
            conn.request(method, target, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        except TimeoutError as exc:
            raise AnswerTimedOut(f"no answer within {timeout_s:g} s") from exc
    finally:
        conn.close()


def api_error(status: int, data: Any) -> ControlAPIError:
    """The daemon's OpenAI-shaped error body (``{"error": {"message", "type"}}``) as an
    exception; any other body still gives one that names the HTTP status."""
    err = data.get("error", {}) if isinstance(data, dict) else {}
    return ControlAPIError(
        str(err.get("message", f"HTTP {status}")),
        code=str(err.get("type", "error")),
        http_status=status,
    )


def answer_data(status: int, body: bytes) -> Any:
    """The JSON of an answer; an error status raises the daemon's error (``api_error``)."""
    try:
        data = json.loads(body) if body.strip() else None
    except ValueError as exc:
        raise DaemonUnavailable(f"the daemon answered something that is not JSON ({exc})") from None
    if status >= 400:
        raise api_error(status, data)
    return data


def unreachable(url: str, exc: BaseException) -> DaemonUnavailable:
    """No connection to the daemon daemon.json names."""
    return DaemonUnavailable(
        f"the traylm daemon at {url} does not answer ({type(exc).__name__}); "
        "is it still running? `traylm serve` starts it"
    )


def busy(timeout_s: float) -> DaemonUnavailable:
    """Connected and asked, but no answer in time: the daemon runs and is busy; it is not
    "not running" (`Run doctor` once said so while the daemon served)."""
    return DaemonUnavailable(
        f"the traylm daemon took longer than {timeout_s:.0f} s to answer; it is running but "
        "busy: try again in a moment"
    )


class OneShotClient:
    """The control API's calls a one-shot command makes, blocking. No connection is kept: each
    call is one exchange, and a daemon that does not answer says so at the first call."""

    def __init__(self, info: DaemonInfo, *, timeout_s: float = 30.0) -> None:
        self.info = info
        self._timeout_s = timeout_s

    @classmethod
    def connect(cls, paths: Paths | None = None, *, timeout_s: float = 30.0) -> OneShotClient:
        """The client of the running daemon (daemon.json: raises DaemonUnavailable when none
        runs)."""
        return cls(wait_for_daemon(paths or Paths.from_env()), timeout_s=timeout_s)

    def _call(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: dict[str, str] | None = None,
    ) -> Any:
        try:
            status, body = exchange(
                self.info.url,
                self.info.token,
                method,
                request_target(path, params),
                json_body,
                timeout_s=self._timeout_s,
            )
        except AnswerTimedOut:
            raise busy(self._timeout_s) from None
        except (OSError, http.client.HTTPException) as exc:
            raise unreachable(self.info.url, exc) from None
        return answer_data(status, body)

    def status(self) -> JSON:
        """`traylm status`: the daemon's /api/status."""
        data: JSON = self._call("GET", "/api/status")
        return data

    def engines(self) -> list[EngineStatus]:
        """The engines the daemon runs (or ran)."""
        from engines.events.core import EngineStatus

        return [from_plain(EngineStatus, e) for e in self._call("GET", "/api/engines")]

    def loaded_models(self) -> list[LoadedModel]:
        """`traylm ps`: what holds resources now."""
        from engines.events.models import LoadedModel

        return [from_plain(LoadedModel, m) for m in self._call("GET", "/api/loaded")]

    def servable_models(self) -> list[ServableModel]:
        """`traylm ps --all`: every model a request may name, loaded or not."""
        from engines.events.models import ServableModel

        return [from_plain(ServableModel, m) for m in self._call("GET", "/api/servable")["models"]]
