"""Fuzzing every /api route (hypothesis) with the control token, through a real `traylm serve`
process with the FAKE engine: hostile query strings and bodies (numbers past Python's
int-string limit, lone surrogates, wrong types, arrays, deep nesting, long text) never get a
5xx, and every error is ``{"error": {"message": ..., "type": ...}}``; afterwards the daemon
still serves and its log holds no traceback.

The routes are read from the real daemon's router (``Daemon._app``), so a new /api route is
fuzzed without touching this file. Left out, each for the reason written beside it: the event
stream (it never ends) and the shutdown (it ends the daemon). Routes that start long work
(installs, downloads, benchmarks, tunes, upgrades, pairing) get only hostile bodies here, which
validation refuses; what gets past it reaches the FAKE engine, simulated GPUs, the Hub stand-in
and a pairing listener on a free loopback port. Deterministic: hypothesis runs derandomized."""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import tempfile
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from engines.config.sections import Paths
from engines.config.tomlfile import write_toml_atomic
from engines.core.procs import free_loopback_port
from engines.daemon import Daemon
from tests.conftest import fast_settings
from tests.engines.cli.test_cli import serve, serve_log, stop_daemon, traylm
from tests.fakes.fake_vllm_env import make_fake_vllm_env

LEFT_OUT = {
    ("GET", "/api/events"): "a stream that never ends",
    ("POST", "/api/shutdown"): "it stops the daemon under the fuzz",
    ("GET", "/api/models/search"): "the Hub stand-in answers 503 after retries (seconds each)",
}
FUZZ = settings(
    max_examples=int(os.environ.get("TRAYLM_API_FUZZ_EXAMPLES", "12")),
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def api_routes() -> list[tuple[str, str]]:
    """(method, path template) of every /api route of the real daemon's application."""
    with tempfile.TemporaryDirectory() as home:
        app = Daemon(Paths.from_env({"TRAYLM_HOME": home}), fast_settings(8000))._app()
        found = set()
        for route in app.router.routes():
            info = route.resource.get_info() if route.resource is not None else {}
            path = str(info.get("path") or info.get("formatter") or "")
            if path.startswith("/api") and route.method not in ("HEAD", "*"):
                found.add((route.method, path))
    return sorted(found)


ROUTES = api_routes()


def test_the_fuzz_reads_every_api_route() -> None:
    """The newer features' routes are among them, and what is left out still exists."""
    paths = {p for _, p in ROUTES}
    for prefix in ("/api/tune", "/api/upgrade", "/api/spread", "/api/peers", "/api/requests"):
        assert any(p.startswith(prefix) for p in paths), prefix
    assert ("PUT", "/api/hub/token") in ROUTES
    assert set(LEFT_OUT) <= set(ROUTES)
    assert len(ROUTES) > 80


@dataclass
class Served:
    port: int
    token: str
    proc: subprocess.Popen[str]
    log_path: Path

    def send(self, method: str, target: str, body: bytes | None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.putrequest(method, target, skip_accept_encoding=True)
            conn.putheader("Authorization", f"Bearer {self.token}")
            if body is not None:
                conn.putheader("Content-Type", "application/json")
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()


@pytest.fixture(autouse=True)
def no_leaked_processes() -> None:
    """Overrides the per-test leak guard: this module's one daemon outlives each test, and a
    restart it is sent starts an engine under it; the daemon's stop (the fixture's teardown)
    stops them all."""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, hub_stand_in: str) -> Iterator[Served]:
    home = tmp_path_factory.mktemp("apifuzz")
    env = {
        **os.environ,
        "TRAYLM_HOME": str(home / "home"),
        "TRAYLM_ENVS_DIR": str(home / "envs"),
        "HF_ENDPOINT": hub_stand_in,  # nothing reaches the network
        "HF_HOME": str(home / "hf"),
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",  # an install that gets past: no index
        "PIP_RETRIES": "0",
    }
    make_fake_vllm_env(home / "envs")
    paths = Paths.from_env(env)
    peers = {"host": "127.0.0.1", "port": free_loopback_port()}
    write_toml_atomic(paths.config_file, {"peers": peers})
    write_toml_atomic(
        paths.profiles_dir / "fake.toml",
        {"model": "org/fake", "served_name": "fake", "device": "cpu"},
    )
    proc = serve(env, "--port", str(free_loopback_port()), "--simulate-gpus", "2")
    try:
        started = traylm(env, "start", "fake", "--wait", "--timeout", "60", timeout=90)
        assert started.returncode == 0, started.stderr
        daemon = json.loads(paths.daemon_json.read_text())
        yield Served(daemon["port"], daemon["token"], proc, serve_log(env))
    finally:
        stop_daemon(proc)


# --------------------------------------------------------------------------- strategies

HUGE = "9" * 5000  # past Python's int-string limit (4,300 digits)
SURROGATE = "\ud800"
HOSTILE_TEXT = st.sampled_from(
    [HUGE, "1" * 30, "-1", "0", "²", "1e309", "nan", "-inf", "", " ", "x" * 3000, "a\x00b",
     SURROGATE, "\udcff", "é", "../..", "[]", "{}", "true", "null", "1,2", "%"]
)  # fmt: skip
PARAM_NAMES = st.sampled_from(
    ["limit", "before", "after", "tail", "points", "seconds", "dry_run", "check", "model",
     "gpus", "status", "client", "text", "q", "sort", "quant", "context", "concurrency",
     "engine", "device", "kv_cache_dtype", "revision", "ids", "kinds", "order", "x"]
)  # fmt: skip


def _query_part(value: str) -> str:
    """``value`` percent-encoded as a browser would; a lone surrogate as the UTF-8-like bytes
    a broken client sends (``%ED%A0%80``)."""
    raw = value.encode("utf-8", "surrogatepass")
    return urllib.parse.quote_from_bytes(raw, safe="")


QUERIES = st.lists(st.tuples(PARAM_NAMES, HOSTILE_TEXT), max_size=4).map(
    lambda pairs: "&".join(f"{name}={_query_part(v)}" for name, v in pairs)
)
SEGMENTS = st.sampled_from(
    ["fake", "1", "0", "-1", "1" * 30, HUGE, "x" * 3000, SURROGATE, "%ED%A0%80", "%FF", "a b",
     "..", "org", "req_" + "0" * 24, "all", "auto"]
)  # fmt: skip

FIELDS = st.sampled_from(
    ["model", "name", "profile", "engine", "device", "version", "messages", "content", "title",
     "params", "token", "repo_id", "revision", "trust_remote_code", "expires_in_s", "address",
     "code", "url", "gpus", "replicas", "ttl", "limit", "changes", "served_name", "points",
     "watts", "enabled", "close_apps", "path", "x"]
)  # fmt: skip
LEAVES = st.one_of(
    st.sampled_from([10**40, 2**64, 2**63, -(2**63) - 1, -1, 0, 1e308, -1e308, True, None]),
    st.sampled_from([SURROGATE, "a\udcffb", "x" * 3000, "", "²", "1" * 30]),
    st.floats(allow_nan=False),
)
VALUES = st.recursive(
    LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(FIELDS, inner, min_size=1, max_size=3)
    ),
    max_leaves=8,
)


def _dumps(value: Any) -> bytes:
    """JSON as a client would send it, lone surrogates as ``\\ud800`` escapes (valid JSON)."""
    return json.dumps(value, ensure_ascii=True).encode()


def _deep(n: int) -> bytes:
    return b'{"model": ' + b"[" * n + b"]" * n + b"}"


BODIES = st.one_of(
    st.dictionaries(FIELDS, VALUES, min_size=1, max_size=4).map(_dumps),  # every value hostile
    st.lists(VALUES, max_size=3).map(_dumps),  # an array
    VALUES.map(_dumps),  # a number, text, null
    st.integers(1, 4000).map(_deep),  # deep nesting
    st.sampled_from([b"", b"{", b"\xff\xfe", b'{"model": 1' + b"0" * 5000 + b"}"]),
)


def _target(template: str, segments: list[str], query: str) -> str:
    names = re.findall(r"\{[^}]+\}", template)
    path = template
    for name, segment in zip(names, segments, strict=False):
        shown = segment if "%" in segment else _query_part(segment)
        path = path.replace(name, shown, 1)
    return path + ("?" + query if query else "")


MAX_LINE = 8000
"""A request line past 8,190 bytes is refused by aiohttp's parser (a plain-text 400) before any
route sees it: the fuzz stays under it."""


def check(method: str, target: str, status: int, body: bytes) -> None:
    """No 5xx (but the Hub stand-in's honest "unavailable": it holds no models); every error
    is ``{"error": {"message": str, "type": str, ...}}``."""
    where = (method, target[:200], status, body[:300])
    if status >= 400:
        try:
            error = json.loads(body)["error"]
        except (ValueError, KeyError, TypeError):
            raise AssertionError(f"not a JSON error: {where}") from None
        assert status < 500 or (status == 503 and error["type"] == "hub_unavailable"), where
        assert isinstance(error["message"], str) and error["message"], where
        assert isinstance(error["type"], str) and error["type"], where
        assert len(error["message"]) < 4000, where  # a client's 3,000 characters are not echoed


# --------------------------------------------------------------------------- the fuzz

FUZZED = [r for r in ROUTES if r not in LEFT_OUT]


@pytest.mark.parametrize(("method", "template"), FUZZED, ids=[f"{m} {p}" for m, p in FUZZED])
@FUZZ
@example(segments=["fake"] * 3, query="limit=" + HUGE, body=_dumps({"model": SURROGATE}))
@example(segments=["1"] * 3, query="tail=1e3&points=%C2%B2", body=_dumps({"title": SURROGATE}))
@example(segments=["1" * 30] * 3, query="", body=_dumps([SURROGATE]))
@given(
    segments=st.lists(SEGMENTS, min_size=3, max_size=3),
    query=QUERIES,
    body=BODIES,
)
def test_api_route_answers_hostile_input_with_a_json_error(
    served: Served, method: str, template: str, segments: list[str], query: str, body: bytes
) -> None:
    target = _target(template, segments, query)
    assume(len(target) < MAX_LINE)
    sent = body if method in ("POST", "PUT", "PATCH") else None
    status, answer = served.send(method, target, sent)
    check(method, target, status, answer)


def test_after_the_fuzz_the_daemon_serves_and_logged_no_traceback(served: Served) -> None:
    status, body = served.send("GET", "/api/status", None)
    assert status == 200, body[:300]
    assert served.proc.poll() is None
    log = served.log_path.read_text(errors="replace")
    assert "Traceback" not in log and " ERROR " not in log, log[-4000:]
