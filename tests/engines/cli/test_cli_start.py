"""A snappy `traylm`: each command imports what it uses. A command that only calls the daemon
imports neither aiohttp nor the daemon's parts, and parses its command line with only its own
package's parser; its calls go over the standard library (engines/client/plain_calls.py). A
one-shot command (`traylm ps`, `traylm status`) runs without an event loop and loads only the
event types it reads (engines/client/oneshot.py). Real subprocesses against a real `traylm
serve`; tests/perf/cli_start.py measures the time."""

from __future__ import annotations

import argparse
import http.server
import importlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from engines.cli import FEATURE_COMMANDS, build_parser
from engines.client.oneshot import request_target
from engines.core.procs import free_loopback_port


def commands_of(parser: argparse.ArgumentParser) -> set[str]:
    for action in parser._actions:  # argparse keeps its subcommands only there
        if isinstance(action, argparse._SubParsersAction):
            return set(action.choices)
    return set()


def test_the_feature_table_names_every_command_each_feature_adds() -> None:
    for adder in set(FEATURE_COMMANDS.values()):
        module, _, function = adder.partition(":")
        parser = argparse.ArgumentParser()
        getattr(importlib.import_module(module), function)(parser.add_subparsers())
        listed = {word for word, a in FEATURE_COMMANDS.items() if a == adder}
        assert commands_of(parser) == listed, adder
    assert set(FEATURE_COMMANDS) <= commands_of(build_parser())


@pytest.mark.parametrize(
    "argv",
    [
        ["ps", "--all"],
        ["status", "--json"],
        ["-v", "load", "m", "--gpus", "0,1"],
        ["bench", "ls"],
        ["engines", "cache", "ls"],
        ["engines", "list"],
        ["models", "ls"],
        ["fans", "presets"],
        ["config", "get", "gateway.port"],
        ["doctor", "--json"],
    ],
)
def test_a_command_parses_alike_with_only_its_own_parser(argv: list[str]) -> None:
    word = next(w for w in argv if not w.startswith("-"))
    alone: dict[str, Any] = vars(build_parser(word).parse_args(argv))
    whole: dict[str, Any] = vars(build_parser().parse_args(argv))
    assert alone == whole


def test_an_unknown_command_gets_the_list_of_all() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "engines", "nosuch"], capture_output=True, text=True, check=False
    )
    assert out.returncode == 2
    assert "invalid choice: 'nosuch'" in out.stderr
    for word in ("ps", "bench", "doctor", "models", "serve"):
        assert f"'{word}'" in out.stderr


def imported(env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run `traylm ARGS` under ``python -X importtime``: its result and the modules it
    imported."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "engines", *args],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    modules = {
        line.rsplit("|", 1)[1].strip()
        for line in out.stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }
    return out, modules


HEAVY = (
    "aiohttp",
    "engines.config.sections",  # the settings' classes: finding the daemon needs only engines.config.paths
    "engines.daemon",
    "engines.envs.manager",
    "engines.gateway",
    "engines.runtime.supervisor",
)


ONE_SHOT_NEVER = (
    *HEAVY,
    "asyncio",  # a blocking call on the loopback socket answers a one-shot command
    "engines.client.base",  # the async client
    "engines.client.daemon_client",  # every feature's calls and event types
    "engines.events.registry",
    "psutil",
    "pydantic",
    "tomli_w",
)
ONE_SHOT_EVENT_TYPES = {"engines.events.codec", "engines.events.core", "engines.events.models"}
"""The event modules `traylm ps` and `traylm status` may load: the types they read."""


def heavy(modules: set[str], never: tuple[str, ...] = HEAVY) -> list[str]:
    """The modules of ``never`` (and their submodules) among ``modules``."""
    return sorted(m for m in modules if any(m == h or m.startswith(f"{h}.") for h in never))


def one_shot_extras(modules: set[str]) -> list[str]:
    """What a one-shot command imported that it must not: ``ONE_SHOT_NEVER``, and event types
    other than those it reads."""
    events = {m for m in modules if m.startswith("engines.events.")}
    return heavy(modules, ONE_SHOT_NEVER) + sorted(events - ONE_SHOT_EVENT_TYPES)


@pytest.mark.parametrize(
    ("args", "one_shot"),
    [
        (("ps",), True),
        (("ps", "--all"), True),
        (("status",), True),
        (("status", "--json"), True),
        (("bench", "ls"), False),  # a coroutine: the event loop, but still no aiohttp
    ],
)
@pytest.mark.slow
def test_a_command_that_only_calls_the_daemon_imports_no_aiohttp(
    env: dict[str, str],
    served: tuple[subprocess.Popen[str], int],
    args: tuple[str, ...],
    one_shot: bool,
) -> None:
    out, modules = imported(env, *args)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "engines.client.oneshot" in modules  # it did talk to the daemon
    assert (one_shot_extras(modules) if one_shot else heavy(modules)) == []


@pytest.mark.parametrize("command", ["ps", "status"])
def test_without_a_daemon_a_command_says_so_quickly(env: dict[str, str], command: str) -> None:
    out, modules = imported(env, command)
    assert out.returncode == 1
    assert "the traylm daemon is not running; start it with `traylm serve`" in out.stderr
    assert one_shot_extras(modules) == []


READ_ONLY_NEVER = (
    "aiohttp",
    "asyncio",
    "engines.client",
    "engines.daemon",
    "psutil",
    "pydantic",
    "tomli_w",  # the TOML writer: reading needs only the standard library's tomllib
)
"""What a command that reads traylm's own files (settings, profiles) does without."""


@pytest.mark.parametrize(
    "args", [("config", "get"), ("config", "get", "gateway.port"), ("profiles",)]
)
def test_a_command_that_reads_settings_loads_no_event_loop_nor_the_toml_writer(
    env: dict[str, str], args: tuple[str, ...]
) -> None:
    out, modules = imported(env, *args)
    assert out.returncode == 0, out.stdout + out.stderr
    assert heavy(modules, READ_ONLY_NEVER) == []


def test_the_version_needs_no_command_parser(env: dict[str, str]) -> None:
    out, modules = imported(env, "--version")
    assert out.returncode == 0
    assert out.stdout.startswith("traylm ")
    assert not {m for m in modules if m.endswith(".cli") and m != "engines.cli"}


def test_names_with_spaces_reach_the_daemon_and_get_its_answer(
    env: dict[str, str], served: tuple[subprocess.Popen[str], int]
) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "engines", "stop", "no such engine"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 1
    assert out.stderr.startswith("traylm: ") and "no such engine" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_request_target_is_escaped_once() -> None:
    assert request_target("/api/engines/a b/stop", None) == "/api/engines/a%20b/stop"
    assert request_target("/api/engines/a%2Fb/stop", None) == "/api/engines/a%2Fb/stop"
    assert request_target("/api/models/org/m", {"revision": "a b&c"}) == (
        "/api/models/org/m?revision=a+b%26c"
    )
    assert request_target("/api/loaded", {"model": "é"}) == "/api/loaded?model=%C3%A9"


class NotTheDaemon(http.server.BaseHTTPRequestHandler):
    """Another program on the port daemon.json names: it answers HTML."""

    def do_GET(self) -> None:
        body = b"<html>not traylm</html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return None


def point_daemon_json_at(env: dict[str, str], port: int) -> None:
    """daemon.json as a running daemon writes it, naming a live process (this one) and
    ``port``."""
    state = Path(env["TRAYLM_HOME"]) / "state"
    state.mkdir(parents=True, exist_ok=True)
    info = {
        "pid": os.getpid(), "url": f"http://127.0.0.1:{port}", "port": port, "token": "t",
        "version": "0", "started_at_s": 0.0,
    }  # fmt: skip
    (state / "daemon.json").write_text(json.dumps(info))


def test_a_daemon_that_does_not_answer_is_said_plainly(env: dict[str, str]) -> None:
    port = free_loopback_port()
    point_daemon_json_at(env, port)
    out = subprocess.run(
        [sys.executable, "-m", "engines", "status"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 1
    assert out.stderr.strip() == (
        f"traylm: the traylm daemon at http://127.0.0.1:{port} does not answer "
        "(ConnectionRefusedError); is it still running? `traylm serve` starts it"
    )


def test_another_program_on_the_daemons_port_is_said_plainly(env: dict[str, str]) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotTheDaemon)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        point_daemon_json_at(env, server.server_address[1])
        out = subprocess.run(
            [sys.executable, "-m", "engines", "ps"],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert out.returncode == 1
    assert out.stderr.startswith("traylm: the daemon answered something that is not JSON (")
    assert "Traceback" not in out.stderr
