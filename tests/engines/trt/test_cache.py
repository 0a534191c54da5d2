"""The engine cache on real files: key, hit, refusal across versions, LRU eviction under a
budget, in-use protection, partial builds; the ETA model; the flag probe on the fake tools."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from engines.config.sections import resources_dir
from engines.errors import ConfigError, EngineError
from engines.trt.build import ETAModel
from engines.trt.cache import CacheKey, EngineCache, differences

ENV = {
    "tensorrt_llm": "1.2.1",
    "tensorrt": "10.13.3.9",
    "gpu": "NVIDIA GeForce RTX 4090",
    "compute_capability": "8.9",
    "driver_major": "570",
    "cuda_major": "12",
}


def key(model: str = "org/m@abc", tp: str = "1", **env: str) -> CacheKey:
    identity = {"model": model, "tensor_parallel_size": tp, "build.max_batch_size": "8"}
    return CacheKey(identity, {**ENV, **env})


def built(
    cache: EngineCache,
    k: CacheKey,
    size: int = 1000,
    version: str = "1.2.1",
    plugins: dict[str, Any] | None = None,
) -> str:
    staging = cache.begin(k)
    engine = staging / "engine"
    engine.mkdir()
    config = {"version": version, "build_config": {"plugin_config": plugins or {}}}
    (engine / "config.json").write_text(json.dumps(config))
    (engine / "rank0.engine").write_bytes(b"\1" * size)
    (staging / "checkpoint").mkdir()  # intermediate output is dropped on commit
    return cache.commit(staging, k, model=k.identity["model"], build_s=1.0, extra={}).id


def test_key_changes_with_every_part_and_hit_needs_the_same_environment(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path, 10**9)
    assert key().id != key(tp="2").id
    assert key().id != key(driver_major="580").id
    assert key().identity_id == key(driver_major="580").identity_id
    entry_id = built(cache, key())
    assert not (tmp_path / entry_id / "checkpoint").exists()
    lookup = cache.lookup(key())
    assert lookup.hit is not None and lookup.hit.id == entry_id
    assert cache.lookup(key(tp="2")).hit is None and not cache.lookup(key(tp="2")).refused
    other = cache.lookup(key(tensorrt_llm="1.3.0", compute_capability="9.0"))
    assert other.hit is None
    ((entry, why),) = other.refused
    assert entry.id == entry_id
    assert "compute_capability 8.9 (installed/here: 9.0)" in why
    assert "tensorrt_llm 1.2.1 (installed/here: 1.3.0)" in why


def test_an_engine_whose_config_contradicts_its_key_is_refused(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path, 10**9)
    built(cache, key(), version="1.1.0")  # e.g. a folder copied in by hand
    lookup = cache.lookup(key())
    assert lookup.hit is None
    assert "config.json says TensorRT-LLM 1.1.0" in lookup.refused[0][1]


def test_an_engine_whose_fp8_attention_differs_from_its_key_is_refused(tmp_path: Path) -> None:
    """TensorRT-LLM's builder turns FP8 context FMHA back on when paged context FMHA meets an
    FP8 KV cache, whatever was asked: an entry whose key says "disable" (as traylm's old Ada rule
    asked) while its engine holds it on does not describe that engine."""
    cache = EngineCache(tmp_path, 10**9)
    asked_off = CacheKey({**key().identity, "build.use_fp8_context_fmha": "disable"}, ENV)
    built(cache, asked_off, plugins={"use_fp8_context_fmha": True})
    lookup = cache.lookup(asked_off)
    assert lookup.hit is None
    assert "use_fp8_context_fmha on, the key asks for disable" in lookup.refused[0][1]
    asked_on = CacheKey({**key().identity, "build.use_fp8_context_fmha": "enable"}, ENV)
    entry_id = built(cache, asked_on, plugins={"use_fp8_context_fmha": True})
    hit = cache.lookup(asked_on).hit
    assert hit is not None and hit.id == entry_id


def test_commit_refuses_a_build_without_engine_files(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path, 10**9)
    staging = cache.begin(key())
    (staging / "engine").mkdir()
    with pytest.raises(EngineError, match=r"rank\*\.engine"):
        cache.commit(staging, key(), model="m", build_s=1, extra={})


def test_lru_eviction_keeps_the_budget_and_never_removes_what_is_in_use(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path, 0)
    ids = []
    for i in range(3):
        ids.append(built(cache, key(model=f"m{i}"), size=1000))
        time.sleep(0.01)
    cache.touch(ids[0])  # m0 is now the most recently used
    sizes = sorted(e.size_bytes for e in cache.entries())
    cache.budget_bytes = sizes[-1] + sizes[-2] + 100  # room for two, not three
    removed = cache.prune(in_use={ids[1]: ["engine-a"]})
    assert [e.id for e in removed] == [ids[2]]  # m1 is older but in use
    assert {e.id for e in cache.entries()} == {ids[0], ids[1]}
    assert cache.prune(in_use={}, budget_bytes=0, keep=ids[0])[0].id == ids[1]
    with pytest.raises(ConfigError, match="no cached engine"):
        cache.remove("nope", {})
    with pytest.raises(EngineError, match="in use by engine-b"):
        cache.remove(ids[0], {ids[0]: ["engine-b"]})


def test_prune_stale_removes_engines_of_another_environment(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path, 10**12)
    old = built(cache, key(model="a", tensorrt_llm="1.2.0"))
    current = built(cache, key(model="b"))
    removed = cache.prune(in_use={}, environment=ENV)
    assert [e.id for e in removed] == [old]
    assert [e.id for e in cache.entries()] == [current]
    assert differences(ENV, ENV) == ""


def test_partial_builds_are_cleaned_at_start(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path, 10**9)
    staging = cache.begin(key())
    (staging / "junk").write_text("x")
    assert cache.clean_partials() == 1
    assert list(tmp_path.iterdir()) == []


def test_eta_from_builds_of_similar_size() -> None:
    history = [
        {"weights_bytes": 1_000, "steps": {"quantize": 10.0, "build": 20.0}},
        {"weights_bytes": 1_200, "steps": {"quantize": 12.0, "build": 24.0}},
        {"weights_bytes": 100_000, "steps": {"quantize": 5.0, "build": 5.0}},  # not similar
    ]
    eta = ETAModel(history, 2_000)
    assert eta.remaining_s(["quantize", "build"], 0, 0.0) == pytest.approx(60.0)
    assert eta.remaining_s(["quantize", "build"], 0, 15.0) == pytest.approx(45.0)
    assert eta.remaining_s(["quantize", "build"], 1, 50.0) == pytest.approx(0.0)
    assert ETAModel([], 2_000).remaining_s(["build"], 0, 0.0) is None
    assert ETAModel(history, 2_000).remaining_s(["convert", "build"], 0, 0.0) is None


def test_flag_probe_reads_a_script_parser_like_the_shipped_list() -> None:
    """The install-time probe (run in the engine env) captures a script's argparse parser; on
    the fake quantize.py it must reproduce the shipped allow-list it was built from."""
    probe = resources_dir() / "probes" / "argparse_flags.py"
    script = Path(__file__).parents[2] / "fakes" / "fake_quantize.py"
    out = subprocess.run(
        [sys.executable, str(probe), "script", str(script), "trtllm-quantize"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    probed = json.loads(out)["flags"]
    shipped = json.loads((resources_dir() / "flags" / "trtllm-quantize-1.2.json").read_text())
    assert set(probed) == set(shipped["flags"])
    assert probed["--qformat"]["choices"] == shipped["flags"]["--qformat"]["choices"]
    assert probed["--quantize_lm_head"]["takes_value"] is False


def test_click_probe_describes_trtllm_serve_options() -> None:
    sys.path.insert(0, str(resources_dir() / "probes"))
    try:
        import argparse_flags  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    from tests.fakes.fake_trtllm_serve import command

    flags = argparse_flags._describe_click(command())
    shipped = json.loads((resources_dir() / "flags" / "trtllm-1.2.json").read_text())["flags"]
    assert set(flags) == set(shipped)
    assert flags["--tp_size"]["dest"] == "tensor_parallel_size"
    assert flags["--trust_remote_code"]["takes_value"] is False


def test_build_mode_finds_a_repo_in_the_hugging_face_cache(
    tmp_path: Path, monkeypatch: Any
) -> None:
    import huggingface_hub.constants

    from engines.trt.model import local_model_dir, read_model_facts
    from tests.fakes.fake_trt_env import make_tiny_hf_model

    repo = tmp_path / "hub" / "models--org--tiny"
    commit = "0123456789abcdef0123456789abcdef01234567"
    make_tiny_hf_model(repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    folder, source = local_model_dir("org/tiny", None)
    assert folder == repo / "snapshots" / commit
    assert source == f"org/tiny@{commit}"
    assert read_model_facts(folder, source).source_id == f"org/tiny@{commit}"
    with pytest.raises(ConfigError, match="traylm models pull org/absent"):
        local_model_dir("org/absent", None)


def test_build_events_and_cache_entries_cross_the_wire() -> None:
    from engines.events import TRTBuildProgress, TRTCacheEntry, from_plain, from_wire, to_plain

    event = TRTBuildProgress(
        engine_id="e",
        cache_id="c",
        state="running",
        step="build",
        step_index=2,
        steps_total=2,
        elapsed_s=3.5,
        eta_s=None,
    )
    assert from_wire(event.to_wire()) == event
    entry = TRTCacheEntry(
        id="c",
        model="m",
        quant_recipe="fp8",
        tensor_parallel_size=2,
        pipeline_parallel_size=1,
        arguments={"build.workers": "2"},
        environment=ENV,
        size_bytes=1,
        created_s=1.0,
        last_used_s=2.0,
        build_s=3.0,
        path="/x",
        in_use_by=("e",),
    )
    assert from_plain(TRTCacheEntry, to_plain(entry)) == entry
