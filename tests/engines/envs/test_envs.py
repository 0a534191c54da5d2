"""Engine environments: discovery, broken installs, doctor, and install failure/cancel leaving
nothing half-made behind (real venv + real pip on local packages; no network needed)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

import pytest

from engines.envs.manager import (
    META_FILE,
    RECIPES,
    ROUTES_FILE,
    EngineRecipe,
    EnvManager,
    load_flags,
    load_routes,
)
from engines.errors import EngineEnvError
from tests.fakes.fake_vllm_env import make_fake_vllm_env


def test_find_reports_missing_and_broken_envs(tmp_path: Path) -> None:
    manager = EnvManager(tmp_path)
    with pytest.raises(EngineEnvError, match=r"run `traylm engines install vllm --cpu`"):
        manager.find("vllm", device="cpu")
    make_fake_vllm_env(tmp_path, complete=False)  # an install that never finished
    with pytest.raises(EngineEnvError, match="is broken"):
        manager.find("vllm", device="cpu")
    (env,) = manager.list()
    assert not env.complete and env.version == "0.32.0" and env.device == "cpu"


def test_find_picks_the_newest_complete_version(tmp_path: Path) -> None:
    manager = EnvManager(tmp_path)
    make_fake_vllm_env(tmp_path)
    newer = tmp_path / "vllm-0.40.1-cpu"
    (newer / "bin").mkdir(parents=True)
    (newer / META_FILE).write_text(
        json.dumps({"engine": "vllm", "version": "0.40.1", "device": "cpu"})
    )
    assert manager.find("vllm", device="cpu").version == "0.40.1"
    assert manager.find("vllm", device="cpu", version="0.32.0").version == "0.32.0"
    with pytest.raises(EngineEnvError, match="CUDA|cuda"):
        manager.find("vllm", device="cuda")


async def test_doctor_on_a_good_and_a_broken_env(tmp_path: Path) -> None:
    manager = EnvManager(tmp_path)
    make_fake_vllm_env(tmp_path)
    env = manager.find("vllm", device="cpu")
    # the fake env's python is not a real vLLM: the import check must say so
    checks = {c.name: c for c in await manager.doctor(env)}
    assert checks["metadata"].ok and checks["flag allow-list"].ok
    assert not checks["imports"].ok and "reinstall" in checks["imports"].fix
    (env.path / "bin" / "python").unlink()
    checks = {c.name: c for c in await manager.doctor(env)}
    assert not checks["python"].ok


def test_flags_fall_back_to_the_shipped_list_and_refuse_unknown_versions(tmp_path: Path) -> None:
    assert load_flags("vllm", "0.32.0", tmp_path).version == "0.32.0"
    with pytest.raises(EngineEnvError, match="no flag allow-list for vllm 9.9.9"):
        load_flags("vllm", "9.9.9", tmp_path)


def write_local_package(
    root: Path, *, sleep_s: float = 0.0, broken: bool = False, started: Path | None = None
) -> Path:
    """A tiny local package for pip: optionally slow to build, or failing to build. ``started``:
    a file its build creates when it begins (before sleeping)."""
    pkg = root / "localpkg"
    pkg.mkdir(parents=True)
    mark = f"open({str(started)!r}, 'w').close()\n" if started is not None else ""
    body = (
        "raise SystemExit('build failed on purpose')"
        if broken
        else (
            f"{mark}import time; time.sleep({sleep_s})\n"
            "from setuptools import setup; setup(name='localpkg', version='1.0', py_modules=[])"
        )
    )
    (pkg / "setup.py").write_text(body)
    return pkg


@pytest.fixture
def local_recipe(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    def install(*, probe_routes: bool = False, **kw: object) -> None:
        pkg = write_local_package(tmp_path / "src", **kw)  # type: ignore[arg-type]
        recipe = EngineRecipe(
            "vllm",
            "cpu",
            "0.0.1",
            f"{pkg}",
            import_check="print('ok')",
            probe_flags=False,
            probe_routes=probe_routes,
        )
        monkeypatch.setitem(RECIPES, ("vllm", "cpu"), recipe)

    return install


@pytest.mark.slow
async def test_failed_install_leaves_nothing_behind(tmp_path: Path, local_recipe) -> None:  # type: ignore[no-untyped-def]
    local_recipe(broken=True)
    manager = EnvManager(tmp_path / "envs")
    lines: list[str] = []
    with pytest.raises(EngineEnvError, match="failed with exit code"):
        await manager.install(
            "vllm", device="cpu", progress=lambda p, ln: lines.append(p), extra_index_urls=()
        )
    assert manager.list() == []
    assert "create" in lines and "install" in lines


@pytest.mark.slow
async def test_cancelled_install_is_killed_and_removed(tmp_path: Path, local_recipe) -> None:  # type: ignore[no-untyped-def]
    building = tmp_path / "building"
    local_recipe(sleep_s=120, started=building)
    manager = EnvManager(tmp_path / "envs")
    task = asyncio.create_task(manager.install("vllm", device="cpu", extra_index_urls=()))
    deadline = time.monotonic() + 120
    while not building.exists():  # pip is building the slow package once this file is there
        assert not task.done(), task.result()
        assert time.monotonic() < deadline, "pip never started building the package"
        await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert manager.list() == []
    assert not (tmp_path / "envs" / "vllm-0.0.1-cpu").exists()


@pytest.mark.slow
async def test_successful_local_install_records_metadata(tmp_path: Path, local_recipe) -> None:  # type: ignore[no-untyped-def]
    local_recipe()
    manager = EnvManager(tmp_path / "envs")
    env = await manager.install("vllm", device="cpu", extra_index_urls=())
    assert env.complete and env.version == "0.0.1"
    again = await manager.install("vllm", device="cpu", extra_index_urls=())
    assert again.path == env.path  # already installed: nothing redone


@pytest.mark.slow
async def test_each_install_line_is_logged_once(
    tmp_path: Path,
    local_recipe,  # type: ignore[no-untyped-def]
    caplog: pytest.LogCaptureFixture,
) -> None:
    """pip's lines reach the daemon's log once each (they were written twice)."""
    local_recipe()
    manager = EnvManager(tmp_path / "envs")
    seen: list[str] = []
    with caplog.at_level(logging.INFO, logger="engines"):
        await manager.install(
            "vllm", device="cpu", progress=lambda p, ln: seen.append(ln), extra_index_urls=()
        )
    logged = [r.getMessage() for r in caplog.records if r.name == "engines.envs.steps"]
    twice = sorted({m for m in logged if logged.count(m) > 1})
    assert any("install: " in m and "localpkg" in m for m in logged)
    assert twice == []
    assert any("localpkg" in ln for ln in seen)  # the caller still hears every line


@pytest.mark.slow
async def test_a_failed_route_probe_does_not_fail_the_install(tmp_path: Path, local_recipe) -> None:  # type: ignore[no-untyped-def]
    """The route probe builds the engine's own app (internal API a release may move): without
    it the install still finishes, says so, and the gateway falls back to the engine's 404s."""
    local_recipe(probe_routes=True)  # the local package has no vLLM to probe
    manager = EnvManager(tmp_path / "envs")
    lines: list[tuple[str, str]] = []
    env = await manager.install(
        "vllm", device="cpu", progress=lambda p, ln: lines.append((p, ln)), extra_index_urls=()
    )
    assert env.complete and not (env.path / ROUTES_FILE).exists()
    assert any(p == "probe" and "could not record the engine's routes" in ln for p, ln in lines)
    assert load_routes("vllm", env.version, env.path) is None  # none shipped for 0.0.1 either


def test_routes_prefer_the_envs_probed_list(tmp_path: Path) -> None:
    assert load_routes("vllm", "0.32.0", tmp_path) == load_routes("vllm", "0.32.0")
    data = {"engine": "vllm", "version": "0.32.0", "tasks": {"generate": ["POST /v1/x"]}}
    (tmp_path / ROUTES_FILE).write_text(json.dumps(data))
    probed = load_routes("vllm", "0.32.0", tmp_path)
    assert probed is not None and probed.serves("POST", "/v1/x")
    assert not probed.serves("POST", "/v1/chat/completions")


def test_a_held_back_version_is_passed_over_unless_named(tmp_path: Path) -> None:
    """A guarded upgrade's version on trial or refused: profiles that name no version keep the
    older one; one that names it runs it; with only held ones left, the newest of them."""
    manager = EnvManager(tmp_path)
    make_fake_vllm_env(tmp_path, version="0.31.0")
    older = manager.find("vllm", device="cpu", version="0.31.0")
    make_fake_vllm_env(tmp_path, version="0.32.0")
    held = manager.hold(manager.find("vllm", device="cpu"), "refused: TTFT p95 worse by 20%")
    assert held.version == "0.32.0" and held.held.startswith("refused")
    assert manager.find("vllm", device="cpu").version == "0.31.0"
    assert manager.find("vllm", device="cpu", version="0.32.0").held == held.held
    manager.hold(older, "on trial")
    assert manager.find("vllm", device="cpu").version == "0.32.0"  # all held: the newest
    manager.release(held)
    manager.release(older)
    assert manager.find("vllm", device="cpu").version == "0.32.0"
    assert [e.held for e in manager.list()] == ["", ""]
