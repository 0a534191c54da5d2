"""Fixtures for the tests that run the real `traylm` command in subprocesses."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
