"""Fixtures for the tests that run the real `traylm` command in subprocesses."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from engines.core.procs import free_loopback_port
from tests.engines.cli.test_cli import serve, stop_daemon
from tests.fakes.fake_vllm_env import make_fake_vllm_env


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The environment of a `traylm` subprocess: a private TRAYLM_HOME and the FAKE vLLM env."""
    e = {
        **os.environ,
        "TRAYLM_HOME": str(tmp_path / "home"),
        "TRAYLM_ENVS_DIR": str(tmp_path / "envs"),
    }
    make_fake_vllm_env(tmp_path / "envs")
    return e


@pytest.fixture
def served(env: dict[str, str]) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """`traylm serve` on a free port (the process and the port), stopped as a person would."""
    port = free_loopback_port()
    proc = serve(env, "--port", str(port))
    yield proc, port
    stop_daemon(proc)
