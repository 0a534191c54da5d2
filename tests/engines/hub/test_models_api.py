"""/api/models through the real daemon and client: search, details from metadata only, fit
badges, the library (verify on demand, delete with protection, models from other tools) and
consent to run a repo's code."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from engines.errors import ControlAPIError
from engines.events import DownloadState
from tests.conftest import RunningDaemon
from tests.engines.hub.conftest import cache_repo, wait_download, wait_for
from tests.fakes.hub_server import FakeHub, bytes_file, tiny_llama_repo

REPO = "traylm-test/tiny-llama"


def _add_catalogue(hub: FakeHub) -> None:
    hub.add_repo(tiny_llama_repo("acme/llama-3-8b", downloads=900, likes=10))
    hub.add_repo(
        tiny_llama_repo(
            "acme/llama-3-8b-awq",
            downloads=500,
            likes=50,
            tags=("transformers", "safetensors", "awq", "4-bit"),
            last_modified="2025-06-01T00:00:00.000Z",
        )
    )
    hub.add_repo(tiny_llama_repo("acme/whisper", pipeline_tag="automatic-speech-recognition"))


async def test_search_sorts_filters_and_keeps_to_text_generation(
    hub_daemon: RunningDaemon, fake_hub: FakeHub
) -> None:
    _add_catalogue(fake_hub)
    by_downloads = await hub_daemon.client.search_models("llama")
    assert [m.repo_id for m in by_downloads][:2] == ["acme/llama-3-8b", "acme/llama-3-8b-awq"]
    by_likes = await hub_daemon.client.search_models("llama", sort="likes")
    assert by_likes[0].repo_id == "acme/llama-3-8b-awq"
    recent = await hub_daemon.client.search_models("acme", sort="recent")
    assert recent[0].repo_id == "acme/llama-3-8b-awq"
    awq = await hub_daemon.client.search_models("", quant="awq")
    assert [m.repo_id for m in awq] == ["acme/llama-3-8b-awq"]
    assert awq[0].quantization == "awq" and awq[0].weights_bytes == 4 << 20
    assert all(m.repo_id != "acme/whisper" for m in await hub_daemon.client.search_models("acme"))
    with pytest.raises(ControlAPIError) as err:
        await hub_daemon.client.search_models("x", quant="gguf")
    assert "awq" in err.value.message


async def test_details_come_from_metadata_without_downloading_weights(
    hub_daemon: RunningDaemon, fake_hub: FakeHub, hf_home: Path
) -> None:
    d = await hub_daemon.client.model_details(REPO)
    assert (d.architecture, d.model_type, d.num_layers, d.hidden_size) == (
        "LlamaForCausalLM",
        "llama",
        4,
        256,
    )
    assert (d.num_attention_heads, d.num_kv_heads, d.head_dim, d.vocab_size) == (4, 2, 64, 1000)
    assert d.max_context == 4096 and d.dtype == "bfloat16" and d.quantization is None
    assert d.parameters == 2 * 1024 * 1024 and d.parameters_by_dtype == {"BF16": 2 << 20}
    assert d.license == "apache-2.0" and d.gated == "" and d.commit_sha == fake_hub.repos[REPO].sha
    assert {f.path for f in d.files if f.kind == "weights"} == {
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    }
    assert any(s.startswith("pytorch_model.bin (pickle") for s in d.skipped_files)
    assert d.download_bytes == sum(f.size_bytes for f in d.files)
    assert not any(r.path.startswith("/cdn/") for r in fake_hub.requests), "no weights fetched"
    assert not (hf_home / "hub").exists(), "browsing writes nothing to the shared cache"


async def test_unknown_models_and_typos_get_one_clear_message(
    hub_daemon: RunningDaemon, fake_hub: FakeHub
) -> None:
    with pytest.raises(ControlAPIError) as err:
        await hub_daemon.client.model_details("traylm-test/tiny-lama")
    assert err.value.http_status == 404 and err.value.code == "model_not_found"
    assert "did you mean traylm-test/tiny-llama?" in err.value.message
    with pytest.raises(ControlAPIError) as err:
        await hub_daemon.client.pull(REPO, revision="v9")
    assert err.value.http_status == 404 and "has no revision 'v9'" in err.value.message


async def test_the_hub_being_down_is_a_clear_error(
    hub_daemon: RunningDaemon, fake_hub: FakeHub
) -> None:
    fake_hub.faults.fail("/api/models/*", status=503, times=None)
    with pytest.raises(ControlAPIError) as err:
        await hub_daemon.client.pull(REPO)
    assert err.value.http_status == 503 and "try again" in err.value.message


async def test_fit_badges_for_each_engine_on_one_and_two_gpus(
    hub_daemon: RunningDaemon, fake_hub: FakeHub
) -> None:
    results = await hub_daemon.client.model_fit(REPO, concurrency=4)
    assert [(r.engine, r.tensor_parallel) for r in results] == [
        ("vllm", 1),
        ("vllm", 2),
        ("trtllm", 1),
        ("trtllm", 2),
    ]
    assert all(r.verdict == "fits" for r in results)
    # 2 (K,V) x 4 layers x 2 KV heads x 64 x 2 bytes
    assert results[0].kv_bytes_per_token == 2048
    one = await hub_daemon.client.model_fit(REPO, engine="vllm", gpus=1, context=1024)
    assert len(one) == 1 and one[0].context_len == 1024


async def test_library_verifies_on_demand_and_catches_a_changed_file(
    hub_daemon: RunningDaemon, fake_hub: FakeHub, hf_home: Path
) -> None:
    status = await hub_daemon.client.pull(REPO)
    await wait_download(hub_daemon, status.id, (DownloadState.READY,))
    sha = fake_hub.repos[REPO].sha
    shard = cache_repo(hf_home, REPO) / "snapshots" / sha / "model-00002-of-00002.safetensors"
    blob = shard.resolve()
    data = bytearray(blob.read_bytes())
    data[1000] ^= 0xFF  # a flipped bit on disk, same size
    blob.write_bytes(bytes(data))
    [checked] = await hub_daemon.client.verify_model(REPO)
    assert checked.verified == "corrupt"
    [listed] = await hub_daemon.client.local_models()
    assert listed.verified == "corrupt"
    blob.unlink()
    [listed] = await hub_daemon.client.local_models()
    assert listed.verified == "incomplete" and "model-00002-of-00002.safetensors is missing" in (
        listed.problems
    )


async def test_a_model_fetched_by_another_tool_is_listed_unverified_until_verified(
    hub_daemon: RunningDaemon, fake_hub: FakeHub, hf_home: Path
) -> None:
    env = dict(os.environ, HF_ENDPOINT=fake_hub.url, HF_HOME=str(hf_home))
    hf = Path(sys.executable).with_name("hf")
    proc = await asyncio.create_subprocess_exec(
        str(hf),
        "download",
        REPO,
        "--include",
        "*.json",
        "--include",
        "*.safetensors",
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert await proc.wait() == 0
    [listed] = await hub_daemon.client.local_models()
    assert listed.verified == "unverified" and listed.refs == ("main",)
    [checked] = await hub_daemon.client.verify_model(REPO)
    assert checked.verified == "verified"


async def test_delete_is_refused_while_an_engine_serves_the_model(
    hub_daemon: RunningDaemon, fake_hub: FakeHub, hf_home: Path, fake_env: Path
) -> None:
    """The engine is the FAKE vLLM env (tests/fakes/fake_vllm_env.py) serving the snapshot."""
    status = await hub_daemon.client.pull(REPO)
    final = await wait_download(hub_daemon, status.id, (DownloadState.READY,))
    engine = await hub_daemon.client.start(
        model=final.snapshot_path, engine="vllm", device="cpu", name="tiny"
    )
    await hub_daemon.client.wait_for_engine(engine.engine_id, ("ready",), 30)  # type: ignore[arg-type]
    with pytest.raises(ControlAPIError) as err:
        await hub_daemon.client.delete_model(REPO)
    assert err.value.code == "model_in_use" and "traylm stop tiny" in err.value.message
    assert err.value.http_status == 409
    [listed] = await hub_daemon.client.local_models()
    assert listed.served_by == ("tiny",)
    await hub_daemon.client.stop("tiny")
    deleted = await hub_daemon.client.delete_model(REPO)
    assert deleted["freed_bytes"] > 4 << 20
    assert await hub_daemon.client.local_models() == []
    assert not (cache_repo(hf_home, REPO) / "snapshots" / fake_hub.repos[REPO].sha).exists()


async def test_repo_code_is_fetched_only_after_the_user_trusts_the_model(
    hub_daemon: RunningDaemon, fake_hub: FakeHub, hf_home: Path
) -> None:
    config = json.loads(fake_hub.repos[REPO].files["config.json"].read(0, 10_000))
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_tiny.TinyForCausalLM"}
    code = {
        "config.json": bytes_file("config.json", json.dumps(config).encode()),
        "modeling_tiny.py": bytes_file("modeling_tiny.py", b"import os\n"),
    }
    fake_hub.add_repo(tiny_llama_repo("traylm-test/custom", extra=code))
    d = await hub_daemon.client.model_details("traylm-test/custom")
    assert d.needs_remote_code and all(f.kind != "code" for f in d.files)
    await hub_daemon.client.trust_model("traylm-test/custom", True)
    d = await hub_daemon.client.model_details("traylm-test/custom")
    assert [f.path for f in d.files if f.kind == "code"] == ["modeling_tiny.py"]
    status = await hub_daemon.client.pull("traylm-test/custom")
    await wait_download(hub_daemon, status.id, (DownloadState.READY,))
    [listed] = [m for m in await hub_daemon.client.local_models() if m.repo_id.endswith("custom")]
    assert listed.trust_remote_code and listed.needs_remote_code


async def test_a_lookup_still_running_when_the_user_trusts_the_model_is_not_reused(
    hub_daemon: RunningDaemon, fake_hub: FakeHub
) -> None:
    """The details and the fit of one selection look the model up together; if the user trusts
    it meanwhile, the older lookup (without the code files) must not answer for the new consent."""
    config = json.loads(fake_hub.repos[REPO].files["config.json"].read(0, 10_000))
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_tiny.TinyForCausalLM"}
    code = {
        "config.json": bytes_file("config.json", json.dumps(config).encode()),
        "modeling_tiny.py": bytes_file("modeling_tiny.py", b"import os\n"),
    }
    fake_hub.add_repo(tiny_llama_repo("traylm-test/custom", extra=code))
    fake_hub.faults.stall("*/custom/resolve/*/config.json", after_bytes=0)
    before = asyncio.create_task(hub_daemon.client.model_details("traylm-test/custom"))
    await wait_for(lambda: any(r.path.endswith("config.json") for r in fake_hub.requests), 10)
    await hub_daemon.client.trust_model("traylm-test/custom", True)
    after = await hub_daemon.client.model_details("traylm-test/custom")
    fake_hub.faults.release_stalls()
    assert all(f.kind != "code" for f in (await before).files)  # asked before the consent
    for d in (after, await hub_daemon.client.model_details("traylm-test/custom")):
        assert [f.path for f in d.files if f.kind == "code"] == ["modeling_tiny.py"]
