"""Model folders on this computer (``traylm models add PATH``): checked (config, weights,
tokenizer), registered in the library, servable by name like a profile through the real daemon,
CLI and FAKE vLLM engine; a folder that is not a model, or one deleted while registered, gets a
clear message and is never served."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from engines.errors import ConfigError, ModelNotFound
from engines.events import EngineState, LibraryChanged
from engines.hub.folders import FolderRegistry, check_folder
from tests.conftest import RunningDaemon
from tests.fakes.fake_trt_env import make_tiny_hf_model
from tests.traylm_cli import traylm


def test_the_check_says_what_a_folder_lacks(tmp_path: Path) -> None:
    model = make_tiny_hf_model(tmp_path / "tiny")
    assert check_folder(model).problems == ()
    assert check_folder(tmp_path / "nope").problems == (f"{tmp_path / 'nope'} does not exist",)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "README.md").write_text("hello")
    assert check_folder(tmp_path / "notes").problems == (
        "no config.json",
        "no weights (*.safetensors or pytorch_model*.bin)",
        "no tokenizer (tokenizer.json or tokenizer.model)",
    )
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors",
                            "b": "model-00002-of-00002.safetensors"}}  # fmt: skip
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    (model / "model-00001-of-00002.safetensors").write_bytes(b"\0" * 16)
    assert check_folder(model).problems == (
        "weight shards missing: model-00002-of-00002.safetensors",
    )


def test_registry_adds_lists_and_forgets(tmp_path: Path) -> None:
    registry = FolderRegistry(tmp_path / "models")
    model = make_tiny_hf_model(tmp_path / "My Tiny Llama")
    folder = registry.add(model)
    assert (folder.name, folder.served_name, folder.family) == ("My-Tiny-Llama",) * 2 + ("llama",)
    assert folder.engines == ("vllm", "trtllm") and folder.size_bytes == 2 * 2**20
    profile = registry.profile_for("My-Tiny-Llama")
    assert profile is not None and profile.model == str(model)
    assert profile.served_names == ("My-Tiny-Llama",)
    with pytest.raises(ConfigError, match="already names"):
        registry.add(make_tiny_hf_model(tmp_path / "other"), name="My-Tiny-Llama")
    with pytest.raises(ConfigError, match="is not a model folder: no config.json"):
        registry.add(tmp_path / "models")  # the registry's own folder is not a model
    assert registry.remove("My-Tiny-Llama").path == str(model)
    assert registry.list() == [] and model.is_dir()  # forgetting leaves the files alone
    with pytest.raises(ModelNotFound, match="no model folder named"):
        registry.get("My-Tiny-Llama")


@pytest.mark.slow
async def test_add_then_start_by_name_then_delete_the_folder(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    model = make_tiny_hf_model(tmp_path / "tiny-chat")
    with daemon.daemon.bus.subscribe(frozenset({"library"})) as sub:
        code, out = await traylm("models", "add", str(model), "--name", "tiny")
        assert code == 0, out
        assert "added tiny" in out and "traylm start tiny --wait" in out
        event = await asyncio.wait_for(sub.get(), 10)
    assert isinstance(event, LibraryChanged) and (event.repo_id, event.reason) == ("tiny", "added")
    code, out = await traylm("models", "ls")
    assert code == 0 and "tiny" in out and str(model) in out and "ok" in out

    # servable by name, like a profile (the FAKE engine stands in for vLLM)
    code, out = await traylm("start", "tiny", "--wait", "--timeout", "60")
    assert code == 0, out
    assert "ready: point apps at" in out and "'tiny'" in out
    engine = await daemon.client.wait_for_engine("tiny", (EngineState.READY,), 10)
    assert engine.served_names == ("tiny",)
    code, out = await traylm("models", "rm", "tiny")
    assert code == 1 and "being served by engine tiny" in out
    # another name for the same folder is not served itself: it may go
    code, out = await traylm("models", "add", str(model), "--name", "tiny2")
    assert code == 0, out
    code, out = await traylm("models", "rm", "tiny2")
    assert code == 0 and "removed tiny2" in out, out
    await daemon.client.stop("tiny")

    # deleted while registered: listed with what is missing, never started
    shutil.rmtree(model)
    [folder] = await daemon.client.local_folders()
    assert folder.problems == (f"{model} does not exist",)
    code, out = await traylm("start", "tiny")
    assert code == 1
    assert "cannot be served" in out and "traylm models rm tiny" in out
    code, out = await traylm("models", "rm", "tiny")
    assert code == 0 and "removed tiny" in out
    assert await daemon.client.local_folders() == []


async def test_a_folder_that_is_not_a_model_is_refused_in_words(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    (tmp_path / "photos").mkdir()
    code, out = await traylm("models", "add", str(tmp_path / "photos"))
    assert code == 1
    assert "is not a model folder: no config.json" in out
    assert "point at the folder that holds config.json" in out
    assert await daemon.client.local_folders() == []
    code, out = await traylm("models", "add", str(tmp_path / "missing"))
    assert code == 1 and "does not exist" in out


async def test_a_folder_served_with_model_joins_the_library(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    model = make_tiny_hf_model(tmp_path / "quick")
    code, out = await traylm("start", "--model", str(model), "--device", "cpu", "--wait",
                             "--timeout", "60")  # fmt: skip
    assert code == 0, out
    [folder] = await daemon.client.local_folders()
    assert (folder.name, folder.path) == ("quick", str(model))
    await daemon.client.stop("quick")
    code, out = await traylm("start", "quick", "--wait", "--timeout", "60")  # by name, later
    assert code == 0, out
    code, out = await traylm("start", "--model", str(model), "--device", "cpu", "--name", "again")
    assert [f.name for f in await daemon.client.local_folders()] == ["quick"]  # listed once
