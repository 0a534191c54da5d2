"""Tool calling for models run without a profile of their own: a registered model folder gets
its family's tool-call and reasoning parsers (as presets carry theirs), a setting of its own
(`traylm models add --tool-parser`, `traylm models set NAME tool_parser=...`), and a request
with tools that it cannot serve gets the command that fixes it for that kind of model (real
daemon, real CLI, FAKE vLLM engine). Downloaded (library) models get their family's parsers too.
"""

from __future__ import annotations

import dataclasses
import time
import tomllib
from pathlib import Path

import openai
import pytest

from engines.errors import ConfigError
from engines.events import DownloadState
from engines.events.hub import LocalModel
from engines.gateway.capabilities import Capabilities, tools_message
from engines.hub.folders import FolderRegistry
from engines.ondemand.catalog import LibrarySource
from tests.conftest import DaemonFactory, RunningDaemon
from tests.engines.hub.conftest import hub_settings, wait_download
from tests.engines.ondemand.conftest import settings
from tests.fakes.fake_trt_env import make_tiny_hf_model
from tests.fakes.hub_server import FakeHub
from tests.traylm_cli import traylm

REPO = "traylm-test/tiny-llama"
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
HI = [{"role": "user", "content": "x"}]


def qwen_folder(path: Path) -> Path:
    return make_tiny_hf_model(path, architecture="Qwen2ForCausalLM", model_type="qwen2")


def test_a_folder_gets_its_familys_parsers_and_a_setting_of_its_own(tmp_path: Path) -> None:
    registry = FolderRegistry(tmp_path / "models")
    folder = registry.add(qwen_folder(tmp_path / "qwen"), name="q")
    assert (folder.tool_parser, folder.reasoning_parser) == ("hermes", "")
    profile = registry.profile_for("q")
    assert profile is not None and profile.tool_parser == "hermes"

    plain = registry.add(make_tiny_hf_model(tmp_path / "plain"), settings={"tool_parser": "x_1"})
    assert plain.tool_parser == "x_1"  # given: kept as given (the engine's start checks it)
    changed = registry.update("plain", {"tool_parser": "llama3_json", "reasoning_parser": "r1"})
    assert (changed.tool_parser, changed.reasoning_parser) == ("llama3_json", "r1")
    assert registry.update("plain", {"reasoning_parser": ""}).reasoning_parser == ""
    again = registry.add(tmp_path / "plain")  # registered again: its settings stay
    assert (again.tool_parser, again.reasoning_parser) == ("llama3_json", "")
    profile = registry.profile_for("plain")
    assert profile is not None and profile.tool_parser == "llama3_json"

    with pytest.raises(ConfigError, match="no setting 'max_model_len'; it takes tool_parser"):
        registry.update("plain", {"max_model_len": "4096"})
    with pytest.raises(ConfigError, match="is not a parser name"):
        registry.update("plain", {"tool_parser": "../../x"})
    entry = tomllib.loads((tmp_path / "models" / "plain.toml").read_text())
    assert entry["tool_parser"] == "llama3_json"  # a refused change left the entry as it was

    # an entry written before folders had parsers: its family's when read
    old = tmp_path / "models" / "old.toml"
    qwen = qwen_folder(tmp_path / "qwen-old")
    old.write_text(f'path = "{qwen}"\nserved_name = "old"\nengine = "vllm"\n')
    assert registry.get("old").tool_parser == "hermes"


def test_a_downloaded_model_runs_with_its_familys_parsers(tmp_path: Path) -> None:
    snapshot = qwen_folder(tmp_path / "models--org--Qwen3-4B" / "snapshots" / "abc")
    model = LocalModel(
        repo_id="org/Qwen3-4B",
        commit_sha="abc",
        refs=("main",),
        size_bytes=1,
        files=1,
        snapshot_path=str(snapshot),
        verified="verified",
        verified_at_s=time.time(),
        problems=(),
        profiles=(),
        engines=("vllm",),
        served_by=(),
        trust_remote_code=False,
        needs_remote_code=False,
        last_modified_s=time.time(),
    )
    [entry] = LibrarySource(lambda: [model], set).entries()
    assert entry.profile is not None
    assert (entry.profile.tool_parser, entry.profile.reasoning_parser) == ("hermes", "qwen3")


def test_the_fix_is_named_where_the_engines_settings_live() -> None:
    def caps(served_as: str, suggested: str = "hermes") -> Capabilities:
        return Capabilities(
            engine_id="m",
            profile="m",
            label="vllm 0.32.0",
            routes=None,
            tasks=None,
            architectures=(),
            tool_parser="",
            suggested_tool_parser=suggested,
            checks_tools=True,
            stores_responses=False,
            served_name="org/M",
            served_as=served_as,
        )

    folder = tools_message(caps("folder"), "m")
    assert "`traylm models set m tool_parser=hermes`; loaded already" in folder
    assert "until `traylm unload m`" in folder
    assert "profile" not in folder
    unknown = tools_message(caps("folder", ""), "m")
    assert "`traylm models set m tool_parser=FORMAT`" in unknown and "hermes for Qwen" in unknown
    library = tools_message(caps("library"), "org/M")
    assert "`traylm models set org/M tool_parser=hermes` (a profile 'm' then serves" in library
    preset = tools_message(caps("preset"), "m")
    assert "shipped preset (read-only): save your own profile named 'm'" in preset
    adhoc = tools_message(caps(""), "m")
    assert "`traylm models add PATH --tool-parser hermes`" in adhoc
    assert "`traylm models set m tool_parser=hermes` does" in preset
    profile = tools_message(caps("profile"), "m")
    assert "Set tool_parser = \"hermes\" in profile 'm'" in profile
    assert "`traylm models set m tool_parser=hermes` does" in profile


@pytest.mark.slow
async def test_a_folder_without_a_parser_says_the_command_and_the_command_fixes_it(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    """Refused before any load (it cost a 30 s cold load for a 400), with the command; the
    command then makes tools work; a change while loaded applies after `traylm unload`."""
    model = make_tiny_hf_model(tmp_path / "tiny-chat")  # a family with no known tool format
    code, out = await traylm("models", "add", str(model), "--name", "tiny")
    assert code == 0, out
    assert "tool calling off" in out
    client = openai.AsyncOpenAI(
        base_url=daemon.url + "/v1", api_key="unused", max_retries=0, timeout=60
    )
    try:
        with pytest.raises(openai.BadRequestError) as err:
            await client.chat.completions.create(model="tiny", messages=HI, tools=TOOLS)
        text = str(err.value)
        assert "`traylm models set tiny tool_parser=FORMAT`" in text, text
        assert "in profile" not in text
        assert err.value.body["code"] == "tool_parser_missing"  # type: ignore[index]
        assert await daemon.client.loaded_models() == []  # refused without loading it

        code, out = await traylm("models", "set", "tiny", "tool_parser=llama3_json")
        assert code == 0, out
        assert out.strip() == "tiny: tool calling: llama3_json, reasoning parser: off"
        reply = await client.chat.completions.create(
            model="tiny", messages=HI, tools=TOOLS, max_tokens=1
        )
        assert reply.choices
        assert daemon.daemon.engine("tiny").profile.tool_parser == "llama3_json"

        code, out = await traylm("models", "set", "tiny", "tool_parser=")
        assert code == 0 and "tool calling off" in out, out
        assert "until it is unloaded: `traylm unload tiny`" in out  # loaded: says so
        code, out = await traylm("unload", "tiny")
        assert code == 0, out
        with pytest.raises(openai.BadRequestError, match="traylm models set tiny"):
            await client.chat.completions.create(model="tiny", messages=HI, tools=TOOLS)

        code, out = await traylm("models", "set", "tiny", "max_model_len=4")
        assert code != 0 and "it takes tool_parser and reasoning_parser" in out
    finally:
        await client.close()


async def test_models_add_takes_the_parsers_and_defaults_to_the_family(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    code, out = await traylm("models", "add", str(qwen_folder(tmp_path / "qwen")), "--name", "q")
    assert code == 0 and "tool calling: hermes" in out, out
    code, out = await traylm(
        "models",
        "add",
        str(make_tiny_hf_model(tmp_path / "other")),
        "--name",
        "o",
        "--tool-parser",
        "mistral",
        "--reasoning-parser",
        "mistral",
    )
    assert code == 0 and "tool calling: mistral, reasoning parser: mistral" in out, out
    folders = {f.name: f for f in await daemon.client.local_folders()}
    assert (folders["q"].tool_parser, folders["o"].reasoning_parser) == ("hermes", "mistral")
    entry = tomllib.loads((daemon.paths.local_models_dir / "o.toml").read_text())
    assert (entry["tool_parser"], entry["reasoning_parser"]) == ("mistral", "mistral")


async def test_a_profile_without_a_parser_is_refused_before_its_cold_load(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    llama = make_tiny_hf_model(tmp_path / "Llama-3-8B", architecture="LlamaForCausalLM")
    daemon.write_profile("plain", model=str(llama), served_name="plain", device="cpu")
    client = openai.AsyncOpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
    try:
        with pytest.raises(openai.BadRequestError) as err:
            await client.chat.completions.create(model="plain", messages=HI, tools=TOOLS)
        assert "Set tool_parser = \"llama3_json\" in profile 'plain'" in str(err.value)
        assert await daemon.client.loaded_models() == []
        code, out = await traylm("models", "set", "plain", "tool_parser=llama3_json")
        assert code == 0 and "profile 'plain' serves it now, tool calling: llama3_json" in out
        reply = await client.chat.completions.create(
            model="plain", messages=HI, tools=TOOLS, max_tokens=1
        )
        assert reply.choices
        saved = tomllib.loads((daemon.paths.profiles_dir / "plain.toml").read_text())
        assert saved == {
            "model": str(llama),
            "served_name": "plain",
            "device": "cpu",
            "tool_parser": "llama3_json",
        }
    finally:
        await client.close()

    # a preset: the change goes into your own profile of its name, which replaces it
    code, out = await traylm("models", "set", "llama-3.1-8b-1gpu", "reasoning_parser=deepseek_r1")
    assert code == 0, out
    copy = tomllib.loads((daemon.paths.profiles_dir / "llama-3.1-8b-1gpu.toml").read_text())
    assert (copy["tool_parser"], copy["reasoning_parser"]) == ("llama3_json", "deepseek_r1")


async def test_models_ls_shows_a_folders_parsers_and_set_names_what_it_lacks(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    code, out = await traylm("models", "add", str(qwen_folder(tmp_path / "qwen")), "--name", "q")
    assert code == 0, out
    code, out = await traylm("models", "ls")
    assert code == 0 and "tool calling: hermes, reasoning parser: off" in out, out
    code, out = await traylm("models", "set", "Qwen/Qwen2.5-7B-Instruct", "tool_parser=hermes")
    assert code != 0 and "is neither a downloaded model nor a registered folder" in out, out
    code, out = await traylm("models", "set", "nope", "tool_parser=hermes")
    assert code != 0 and "no model folder named 'nope'" in out, out


async def test_a_downloaded_model_without_a_known_format_gets_one_with_models_set(
    daemon_factory: DaemonFactory, fake_env: object, fake_hub: FakeHub, hf_home: Path
) -> None:
    """The library model (FAKE Hub download) of a family with no known tool format: the 400
    names `traylm models set REPO tool_parser=...`, which saves a profile serving it by the same
    names; the next request calls tools. A second `models set` edits that profile."""
    d = await daemon_factory(dataclasses.replace(settings(gpus=2), hub=hub_settings()))
    status = await d.client.pull(REPO)
    await wait_download(d, status.id, (DownloadState.READY,))
    client = openai.AsyncOpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0)
    try:
        with pytest.raises(openai.BadRequestError) as err:
            await client.chat.completions.create(model=REPO, messages=HI, tools=TOOLS)
        assert f"`traylm models set {REPO} tool_parser=FORMAT`" in str(err.value)
        code, out = await traylm("models", "set", REPO, "tool_parser=llama3_json")
        assert code == 0 and "profile 'tiny-llama' serves it now, tool calling: llama3_json" in (
            out
        ), out
        for name in (REPO, "tiny-llama"):  # by the same names as before
            reply = await client.chat.completions.create(
                model=name, messages=HI, tools=TOOLS, max_tokens=1
            )
            assert reply.choices
        assert d.daemon.engine("tiny-llama").profile.tool_parser == "llama3_json"
        code, out = await traylm("models", "set", REPO, "reasoning_parser=deepseek_r1")
        assert code == 0 and "tool calling: llama3_json" in out, out
        assert "until `traylm unload tiny-llama`" in out  # loaded: says so
        saved = tomllib.loads((d.paths.profiles_dir / "tiny-llama.toml").read_text())
        assert (saved["model"], saved["tool_parser"], saved["reasoning_parser"]) == (
            REPO,
            "llama3_json",
            "deepseek_r1",
        )
    finally:
        await client.close()
