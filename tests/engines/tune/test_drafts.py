"""EAGLE-3 as a tuner candidate: only where a draft is known for the model and is in the local
Hugging Face cache (a tune downloads nothing); GPU-only, on SIMULATED GPUs with the FAKE CUDA
engine here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engines.config.profiles import profile_from_mapping
from engines.events import TuneConfig, TuneState
from engines.tune.candidates import Machine, machine_candidates
from engines.tune.drafts import eagle3_draft
from engines.tune.variants import ModelOnDisk
from tests.conftest import RunningDaemon
from tests.engines.gpu.test_daemon import sim_settings
from tests.engines.tune.test_daemon import TOKEN_S, nothing_of_the_tune_left, tune_to_end
from tests.fakes.fake_vllm_env import make_fake_vllm_env

TARGET, DRAFT = "meta-llama/Llama-3.1-8B-Instruct", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"


def test_a_known_draft_is_a_candidate_only_when_it_is_here_and_on_a_gpu() -> None:
    assert eagle3_draft("org/chat", []) == ("", "EAGLE-3: no draft is known for org/chat")
    folder, why = eagle3_draft(TARGET, [])
    assert not folder and f"`traylm models pull {DRAFT}`" in why
    here = [ModelOnDisk(DRAFT.lower(), Path("/cache/draft"))]
    assert eagle3_draft(TARGET.lower(), here) == ("/cache/draft", "")
    base = profile_from_mapping("llama", {"model": TARGET})
    gpu = Machine("cuda", 1, frozenset({"vllm"}), 8, eagle3_draft="/cache/draft")
    (spec,) = [c for c in machine_candidates(base, gpu) if c.key == "eagle3-spec"]
    assert spec.gpu_only and spec.flags[0] == "--speculative-config"
    assert json.loads(spec.flags[1]) == {
        "method": "eagle3", "model": "/cache/draft", "num_speculative_tokens": 3,
    }  # fmt: skip
    cpu = Machine("cpu", 0, frozenset({"vllm"}), 8, eagle3_draft="/cache/draft")
    assert "eagle3-spec" not in {c.key for c in machine_candidates(base, cpu)}


def cache_repo(cache: Path, repo_id: str) -> Path:
    """A repo in the Hugging Face cache layout (a config.json only: the FAKE engine reads
    nothing)."""
    commit = "a" * 40
    folder = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(commit)
    return snapshot


@pytest.mark.slow
async def test_eagle3_runs_from_the_cached_draft_and_says_why_when_absent(
    daemon_factory: Any, fake_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # a private cache, never the user's
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    d: RunningDaemon = await daemon_factory(sim_settings())
    make_fake_vllm_env(d.paths.envs_dir, device="cuda")
    d.write_profile("llama", model=TARGET, served_name="llama", device="cuda",
                    env={"FAKE_ENGINE_ARGS": f"--token-delay {TOKEN_S}"})  # fmt: skip
    job = await d.client.tune_start(TuneConfig(model="llama", budget_s=900))
    await d.client.tune_cancel()
    assert f"EAGLE-3: its draft {DRAFT} is not on this computer" in " ".join(job.dropped)
    assert f"quantized variants: none of {TARGET} on this computer" in job.dropped
    cache = d.daemon.hub.access().cache_dir
    assert cache == tmp_path / "hf" / "hub"
    snapshot = cache_repo(cache, DRAFT)
    config = TuneConfig(model="llama", concurrency=2, requests=4, only=("eagle3-spec",),
                        budget_s=900)  # fmt: skip
    done = await tune_to_end(d, config)
    assert done.state == TuneState.DONE, done.detail
    assert next(r for r in done.rows if r.key == "eagle3-spec").runs == 2
    log = (d.paths.logs_dir / "engines" / "tune-llama.log").read_text()
    assert f'"method":"eagle3","model":"{snapshot}"' in log
    await nothing_of_the_tune_left(d, set())
