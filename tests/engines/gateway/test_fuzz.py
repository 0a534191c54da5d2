"""Fuzzing the gateway (hypothesis) through a real `traylm serve` process with a FAKE engine:
request bodies, headers and paths for /v1 and /api. Whatever comes in, the answer is never a
5xx, and every error is the OpenAI error shape the gateway and the control API share
(``{"error": {"message": "...", "type": "..."}}``); afterwards the daemon still serves and its
log holds no traceback.

Scope: every method on every /v1 and /api path without the control token (guards, routing,
path checks); with it, reads of every /api route and the writes that touch only this test's own
files (chats, profiles, trust records). Left out with the token: what starts processes or stops
the daemon (engines, envs, benchmarks, downloads, shutdown), fans and power, the event stream
(it never ends), and the Hub's network routes."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from engines.config.sections import Paths
from engines.config.tomlfile import write_toml_atomic
from engines.core.procs import free_loopback_port
from engines.gateway.security import hash_key
from tests.engines.cli.test_cli import serve, serve_log, stop_daemon, traylm
from tests.fakes.fake_vllm_env import make_fake_vllm_env

API_KEY = "tlm-fuzz-key"
FUZZ = settings(
    max_examples=int(os.environ.get("TRAYLM_FUZZ_EXAMPLES", "250")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@dataclass
class Served:
    port: int
    token: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def send(
        self,
        method: str,
        path: str,
        *,
        headers: dict[str, bytes] | None = None,
        body: bytes | None = None,
        host: bytes | None = None,
    ) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            conn.putheader("Host", host if host is not None else f"localhost:{self.port}")
            for name, value in (headers or {}).items():
                conn.putheader(name, value)
            if body is not None:
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, hub_stand_in: str) -> Iterator[Served]:
    home = tmp_path_factory.mktemp("fuzz")
    env = {
        **os.environ,
        "TRAYLM_HOME": str(home / "home"),
        "TRAYLM_ENVS_DIR": str(home / "envs"),
        # nothing reaches the network whatever runs; the start of "org/fake" goes on as online
        "HF_ENDPOINT": hub_stand_in,
        "HF_HOME": str(home / "hf"),
    }
    make_fake_vllm_env(home / "envs")
    paths = Paths.from_env(env)
    write_toml_atomic(paths.config_file, {"gateway": {"api_key_sha256": [hash_key(API_KEY)]}})
    write_toml_atomic(
        paths.profiles_dir / "fake.toml",
        {"model": "org/fake", "served_name": "fake", "device": "cpu"},
    )
    port = free_loopback_port()
    proc = serve(env, "--port", str(port))
    try:
        started = traylm(env, "start", "fake", "--wait", "--timeout", "60", timeout=90)
        assert started.returncode == 0, started.stderr
        token = json.loads(paths.daemon_json.read_text())["token"]
        yield Served(port, token, proc, serve_log(env))
    finally:
        stop_daemon(proc)


def check(method: str, path: str, status: int, body: bytes) -> None:
    """No 5xx; every error is ``{"error": {"message": str, "type": str, ...}}``."""
    assert status < 500, (method, path, status, body[:500])
    if status < 400 or method == "HEAD":
        if body.startswith(b"data: "):  # a stream: each event is JSON (or [DONE])
            for line in body.split(b"\n"):
                if line.startswith(b"data: {"):
                    json.loads(line[6:])
        return
    data = json.loads(body)
    error = data["error"]
    assert isinstance(error["message"], str) and error["message"], data
    assert isinstance(error["type"], str) and error["type"], data


# --------------------------------------------------------------------------- strategies

SEGMENT = st.text(
    alphabet=st.sampled_from("abcxyz019-_.~%!$&'()*+,;=:@/"),
    min_size=0,
    max_size=12,
)
V1_PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models"]
API_PATHS = [
    "/api/status",
    "/api/engines",
    "/api/engines/fake/logs",
    "/api/profiles",
    "/api/profiles/fake",
    "/api/settings",
    "/api/envs",
    "/api/metrics",
    "/api/chats",
    "/api/chats/1",
    "/api/chats/1/messages",
    "/api/models",
    "/api/models/org/name/trust",
    "/api/downloads",
    "/api/gpus",
    "/api/gpus/history",
    "/api/gpus/guard",
    "/api/gpus/presets",
    "/api/remote",
    "/api/trt/builds",
    "/api/trt/cache",
    "/api/bench/runs",
    "/api/bench/current",
]
METHODS = st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"])


@st.composite
def paths(draw: st.DrawFn, known: list[str]) -> str:
    base = draw(st.sampled_from(known))
    extra = draw(st.one_of(st.just(""), SEGMENT.map(lambda s: "/" + s)))
    query = draw(st.one_of(st.just(""), SEGMENT.map(lambda s: "?" + s.replace("/", "="))))
    return base + extra + query


HEADER_VALUE = st.binary(min_size=0, max_size=40).map(
    lambda b: bytes(c for c in b if c >= 0x20 and c != 0x7F).strip()
)
JSON_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=30),
)
JSON_VALUE = st.recursive(
    JSON_LEAF,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=25,
)


@st.composite
def openai_payloads(draw: st.DrawFn) -> dict[str, Any]:
    """Mostly-valid OpenAI bodies with odd values where a client can put them."""
    payload: dict[str, Any] = {
        "model": draw(st.one_of(st.just("fake"), st.text(max_size=20), JSON_VALUE)),
        "max_tokens": draw(st.one_of(st.integers(1, 24), JSON_VALUE)),
    }
    for key, value in (
        ("messages", st.lists(st.dictionaries(st.text(max_size=8), JSON_VALUE, max_size=3))),
        ("stream", st.one_of(st.booleans(), JSON_VALUE)),
        ("n", st.one_of(st.integers(-3, 40), JSON_VALUE)),
        ("stream_options", st.one_of(st.just({"include_usage": True}), JSON_VALUE)),
        ("prompt", JSON_VALUE),
        ("input", JSON_VALUE),
        ("temperature", JSON_VALUE),
    ):
        if draw(st.booleans()):
            payload[key] = draw(value)
    return payload


DEEP = st.integers(1, 5000).map(lambda n: b'{"model": ' + b"[" * n + b"]" * n + b"}")
BODIES = st.one_of(
    st.none(),
    st.binary(max_size=200),
    JSON_VALUE.map(lambda v: json.dumps(v).encode()),
    openai_payloads().map(lambda v: json.dumps(v).encode()),
    DEEP,
)
HEADER_SETS = st.dictionaries(
    st.sampled_from(
        ["Authorization", "Content-Type", "Origin", "Accept", "Transfer-Encoding-X", "X-Any"]
    ),
    HEADER_VALUE,
    max_size=4,
)


# --------------------------------------------------------------------------- the fuzz


NESTED = b"[" * 3000 + b"]" * 3000


@FUZZ
@example(method="POST", path="/v1/chat/completions", headers={}, body=NESTED)
@example(  # an Accept that is not UTF-8 reached the engine's request head as surrogates: 500
    method="POST",
    path="/v1/chat/completions",
    headers={"Accept": b"text/\xff\xfe"},
    body=b'{"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}',
)
@example(
    method="GET", path="/v1/models", headers={"Authorization": b"Bearer \xc3\xa9\xff"}, body=None
)
@given(
    method=METHODS,
    path=paths([*V1_PATHS, "/health", "/metrics", "/v1", "/"]),
    headers=HEADER_SETS,
    body=BODIES,
)
@pytest.mark.slow
def test_v1_any_request(
    served: Served, method: str, path: str, headers: dict[str, bytes], body: bytes | None
) -> None:
    headers.setdefault("Authorization", f"Bearer {API_KEY}".encode())
    status, answer = served.send(method, path, headers=headers, body=body)
    check(method, path, status, answer)


@FUZZ
@given(payload=openai_payloads(), route=st.sampled_from(V1_PATHS[:3]))
@pytest.mark.slow
def test_v1_payloads_reach_the_engine(served: Served, route: str, payload: dict[str, Any]) -> None:
    body = json.dumps(payload).encode()
    headers = {"Content-Type": b"application/json", "Authorization": f"Bearer {API_KEY}".encode()}
    status, answer = served.send("POST", route, headers=headers, body=body)
    check("POST", route, status, answer)


@FUZZ
@example(
    method="GET",
    path="/api/status",
    headers={"Authorization": b"Bearer \xff\xfe"},
    body=None,
    host=None,
)
@given(
    method=METHODS,
    path=paths([*API_PATHS, "/api", "/api/shutdown", "/api/engines/fake/stop"]),
    headers=HEADER_SETS,
    body=BODIES,
    host=st.one_of(st.none(), HEADER_VALUE),
)
@pytest.mark.slow
def test_api_without_the_token_is_refused(
    served: Served,
    method: str,
    path: str,
    headers: dict[str, bytes],
    body: bytes | None,
    host: bytes | None,
) -> None:
    assert headers.get("Authorization") != f"Bearer {served.token}".encode()
    status, answer = served.send(method, path, headers=headers, body=body, host=host)
    check(method, path, status, answer)
    assert status in (400, 401, 403, 404), (method, path, status)


SAFE_WRITES = {
    "POST": ["/api/chats", "/api/chats/1/messages", "/api/chats/2/messages"],
    "PATCH": ["/api/chats/1", "/api/chats/x"],
    "PUT": ["/api/profiles/fz", "/api/profiles/fz?dry_run=1", "/api/models/org/name/trust"],
    "DELETE": ["/api/chats/3", "/api/profiles/fz", "/api/profiles/nosuch"],
}


@st.composite
def token_requests(draw: st.DrawFn) -> tuple[str, str]:
    method = draw(st.sampled_from(["GET", *SAFE_WRITES]))
    if method == "GET":
        return method, draw(paths(API_PATHS))
    return method, draw(st.sampled_from(SAFE_WRITES[method]))


@FUZZ
@example(request=("PATCH", "/api/chats/1"), body=NESTED)
@given(
    request=token_requests(),
    body=st.one_of(BODIES, JSON_VALUE.map(lambda v: json.dumps({"messages": [v]}).encode())),
)
@pytest.mark.slow
def test_api_with_the_token(served: Served, request: tuple[str, str], body: bytes | None) -> None:
    method, path = request
    headers = {"Authorization": f"Bearer {served.token}".encode()}
    status, answer = served.send(method, path, headers=headers, body=body)
    check(method, path, status, answer)


def test_after_the_fuzz_the_daemon_serves_and_logged_no_traceback(served: Served) -> None:
    key = {"Authorization": f"Bearer {API_KEY}".encode()}
    status, body = served.send("GET", "/v1/models", headers=key)
    assert status == 200 and b'"fake"' in body
    assert served.proc.poll() is None
    log = served.log_path.read_text(errors="replace")
    assert "Traceback" not in log and " ERROR " not in log, log[-4000:]
