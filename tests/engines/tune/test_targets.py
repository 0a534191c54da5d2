"""What the tuner takes here, through the real daemon and the FAKE vLLM env on this computer
without a GPU: GET /api/tune/targets lists a registered model folder and not the GPU presets
(those are listed apart, with why); `traylm tune FOLDER` (the real command) tunes the folder as
it is; a profile made for the folder, serving the folder's name, is tuned without a name
clash; a budget too small is answered with the smallest one, in words without option names,
and GET /api/tune/budget gives it as a number."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from engines.core.procs import free_loopback_port
from engines.errors import ControlAPIError
from engines.events import TuneConfig, TuneState
from tests.conftest import RunningDaemon
from tests.engines.tune.test_daemon import tune_to_end
from tests.fakes.fake_trt_env import make_tiny_hf_model
from tests.traylm_cli import traylm

pytestmark = pytest.mark.slow
NO_GPU = "needs an NVIDIA GPU (this computer has none)"


@pytest.fixture
async def d(daemon_factory: Any, fake_env: Path, monkeypatch: pytest.MonkeyPatch) -> RunningDaemon:
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_loopback_port()}")  # no Hub
    result: RunningDaemon = await daemon_factory()
    return result


async def add_folder(d: RunningDaemon, tmp_path: Path, name: str = "tiny") -> Path:
    model = make_tiny_hf_model(tmp_path / f"{name}-chat")
    await asyncio.to_thread(d.daemon.hub.folders.add, model, name=name)
    return model


async def test_the_targets_are_what_can_start_here(d: RunningDaemon, tmp_path: Path) -> None:
    await add_folder(d, tmp_path)
    targets, left_out = await d.client.tune_targets()
    by_name = {t.name: t for t in targets}
    assert by_name["tiny"].kind == "folder" and by_name["tiny"].blocked == ""
    assert "llama-3.1-8b-1gpu" not in by_name  # a GPU preset cannot start on this computer
    preset = next(t for t in left_out if t.name == "llama-3.1-8b-1gpu")
    assert preset.kind == "profile" and preset.blocked == NO_GPU
    code, out = await traylm("tune", "--targets")
    assert code == 0 and out.startswith("tiny  (folder, serves tiny)"), out
    assert "cannot start here:\n  " in out and f"llama-3.1-8b-1gpu  (profile): {NO_GPU}" in out


async def test_traylm_tune_folder_runs(d: RunningDaemon, tmp_path: Path) -> None:
    await add_folder(d, tmp_path)
    code, out = await traylm(
        "tune", "tiny", "--requests", "4", "--concurrency", "2", "--only", "max-num-seqs-8",
        "--json", timeout_s=300,
    )  # fmt: skip
    assert code == 0, out
    job = json.loads(out[out.index("{") :])
    assert job["state"] == "done" and job["profile"] == "tiny", job["detail"]
    assert [r["key"] for r in job["rows"]] == ["default", "max-num-seqs-8"]
    assert not (d.paths.profiles_dir / "tiny.toml").exists()  # nothing written without apply


async def test_a_profile_serving_the_folders_name_is_tuned_without_a_clash(
    d: RunningDaemon, tmp_path: Path
) -> None:
    model = await add_folder(d, tmp_path)
    d.write_profile("tiny-cpu", model=str(model), served_name="tiny", device="cpu")
    job = await tune_to_end(
        d, TuneConfig(model="tiny-cpu", concurrency=2, requests=4, only=("max-num-seqs-8",))
    )
    assert job.state == TuneState.DONE, job.detail
    assert job.profile == "tiny-cpu" and len(job.rows) == 2


async def test_a_budget_too_small_is_answered_with_the_smallest(
    d: RunningDaemon, tmp_path: Path
) -> None:
    await add_folder(d, tmp_path)
    with pytest.raises(ControlAPIError) as refused:
        await d.client.tune_start(TuneConfig(model="tiny", budget_s=180))
    message = refused.value.message
    assert refused.value.code == "tune_budget"
    assert "the smallest budget that fits 2 candidates is 9 min" in message  # 60 s a start
    assert "--" not in message  # words, not a command-line option
    least = await d.client.tune_least_budget("tiny", 2)
    assert least.least_budget_s == 520  # 4 runs of 60 s, 60 s, 10 s and least.words in message
    with pytest.raises(ControlAPIError, match="nothing to tune named 'nope'"):
        await d.client.tune_least_budget("nope", 2)
