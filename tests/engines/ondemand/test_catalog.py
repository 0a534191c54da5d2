"""The servable catalog: names and their precedence (an explicit name beats a profile name,
which beats a repo id), ambiguous names refused with the fix, library models servable by repo
id and short name (FAKE Hub download, FAKE engine), and the catalog's pluggable sources."""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path

import aiohttp
import openai
import pytest

from engines.config.profiles import ProfileStore
from engines.config.tomlfile import write_toml_atomic
from engines.events import DownloadState
from engines.ondemand.catalog import Catalog, Entry, ProfileSource, build_index
from tests.conftest import DaemonFactory, RunningDaemon
from tests.engines.hub.conftest import hub_settings, wait_download
from tests.engines.ondemand.conftest import ask, fake_profile, sdk, settings
from tests.fakes.fake_trt_env import make_tiny_hf_model
from tests.fakes.hub_server import FakeHub

REPO = "traylm-test/tiny-llama"


def store(tmp_path: Path, **profiles: dict[str, object]) -> ProfileStore:
    presets = tmp_path / "presets"
    presets.mkdir(exist_ok=True)
    for name, fields in profiles.items():
        write_toml_atomic(tmp_path / "profiles" / f"{name}.toml", fields)
    return ProfileStore(tmp_path / "profiles", presets)


def index_of(tmp_path: Path, **profiles: dict[str, object]):
    return build_index(ProfileSource(store(tmp_path, **profiles), lambda repo: None).entries())


def test_an_alias_wins_over_a_repo_id_and_the_choice_is_said(tmp_path: Path) -> None:
    index = index_of(
        tmp_path,
        fast={"model": "org/small", "served_name": "fast", "aliases": ["org/big"]},
        big={"model": "org/big", "served_name": "big"},
    )
    assert index.by_name["org/big"].engine_id == "fast"
    assert (
        index.by_name["big"].engine_id == "big" and index.by_name["org/small"].engine_id == "fast"
    )
    [note] = index.notes
    assert "'org/big' goes to profile fast" in note and "not to profile big" in note


def test_a_name_claimed_twice_at_one_level_is_ambiguous_with_the_fix(tmp_path: Path) -> None:
    index = index_of(
        tmp_path,
        one={"model": "org/m", "served_name": "chat"},
        two={"model": "org/m", "served_name": "chat2", "aliases": ["chat"]},
    )
    assert "chat" not in index.by_name and "org/m" not in index.by_name
    assert "give one of them another served_name or alias" in index.ambiguous["chat"]
    assert "ask for one of them by its name: chat, chat2" in index.ambiguous["org/m"]
    assert index.by_name["one"].engine_id == "one"  # profile names still route


async def test_sources_plug_in_and_a_broken_one_does_not_hide_the_rest(tmp_path: Path) -> None:
    class Folders:
        kind = "folder"

        def entries(self) -> list[Entry]:
            return [Entry("mine", self.kind, "mine", (("mine", 1),))]

    class Broken:
        kind = "broken"

        def entries(self) -> list[Entry]:
            raise OSError("disk gone")

    catalog = Catalog(
        [ProfileSource(store(tmp_path, p={"model": "org/p"}), lambda r: None), Folders(), Broken()]
    )
    await catalog.refresh()
    assert catalog.find("mine") is not None and catalog.find("p") is not None
    assert catalog.index.broken == ["broken: disk gone"]


async def test_two_sources_with_one_engine_id_keep_the_first_and_say_why() -> None:
    """A model folder registered under a library model's short name would share its engine."""

    class Source:
        def __init__(self, kind: str, name: str) -> None:
            self.kind, self._name = kind, name

        def entries(self) -> list[Entry]:
            return [Entry(self._name, self.kind, "tiny-llama", ((self._name, 1),))]

    catalog = Catalog([Source("library", "org/tiny-llama"), Source("folder", "tiny-llama")])
    await catalog.refresh()
    assert [e.kind for e in catalog.index.entries] == ["library"]
    assert catalog.find("tiny-llama") is None
    [why] = catalog.index.broken
    assert why.startswith("folder tiny-llama is left out: its name 'tiny-llama' is taken by ")
    assert "`traylm models add PATH --name NEW`" in why


async def test_an_ambiguous_request_gets_409_naming_both(od: RunningDaemon) -> None:
    fake_profile(od, "x1", aliases=["shared"])
    fake_profile(od, "x2", aliases=["shared"])
    async with aiohttp.ClientSession() as http:
        body = {"model": "shared", "messages": []}
        async with http.post(od.url + "/v1/chat/completions", json=body) as r:
            assert r.status == 409
            message = (await r.json())["error"]["message"]
    assert "'shared' is a served name or alias of both profile 'x1' and profile 'x2'" in message
    problems = await od.client.catalog_problems()
    assert "shared" in problems["ambiguous"]


async def test_a_verified_library_model_is_servable_by_repo_id_and_short_name(
    daemon_factory: DaemonFactory, fake_env: object, fake_hub: FakeHub, hf_home: Path
) -> None:
    import dataclasses

    d = await daemon_factory(dataclasses.replace(settings(gpus=2), hub=hub_settings()))
    status = await d.client.pull(REPO)
    await wait_download(d, status.id, (DownloadState.READY,))
    models = {m.name: m for m in await d.client.servable_models()}
    entry = models[REPO]
    assert entry.kind == "library" and entry.status == "unloaded"
    # device "auto" on a computer whose GPUs are simulated: the engine runs on the CPU
    assert not entry.gpus_planned and entry.gpus == () and not entry.blocked
    assert "tiny-llama" in entry.names
    client = sdk(d, timeout=60)
    assert await ask(client, REPO) == "w0 w1"
    assert await ask(client, "tiny-llama") == "w0 w1"
    [row] = await d.client.loaded_models()
    assert row.name == REPO and row.gpus == () and row.origin == "jit"
    assert row.vram_bytes == 0 and row.ram_bytes > 0  # booked in host RAM
    listed = {m.id: m for m in (await client.models.list()).data}
    assert listed[REPO].status["value"] == "loaded"  # type: ignore[attr-defined]
    with pytest.raises(openai.NotFoundError):
        await ask(client, "traylm-test/other")
    await client.close()


async def test_fit_badges_carry_the_planners_placement_now(
    daemon_factory: DaemonFactory, fake_env: object, fake_hub: FakeHub, hf_home: Path
) -> None:
    import dataclasses

    from engines.gpu.sim import SimulatedBackend

    d = await daemon_factory(dataclasses.replace(settings(gpus=2), hub=hub_settings()))
    backend = d.daemon.gpu.backend
    assert isinstance(backend, SimulatedBackend)
    backend.hold_memory("0", pid=4242, used_memory_bytes=8 << 30, name="game")
    while not any(p.pid == 4242 for p in d.daemon.gpu.sampler.latest[0].processes or ()):
        await asyncio.sleep(0.05)
    rows = await d.client.model_fit(REPO)
    one = [r for r in rows if r.tensor_parallel == 1 and r.engine == "vllm"]
    two = [r for r in rows if r.tensor_parallel == 2 and r.engine == "vllm"]
    assert one[0].placement is not None and one[0].placement.gpus == (1,)  # GPU 0 is busy
    assert two[0].placement is not None and not two[0].placement.fits
    assert "pid 4242 (game) 8.0 GiB" in two[0].placement.reason


async def test_a_registered_model_folder_loads_by_name_on_its_first_request(
    daemon_factory: DaemonFactory, fake_env: object, tmp_path: Path
) -> None:
    """`traylm models add PATH` makes a folder servable like a downloaded model: listed unloaded
    loaded on the first request (FAKE engine) on the CPU (device "auto", and
    the two GPUs here are simulated: no GPU memory booked); a profile of the same name keeps it;
    a deleted folder is not offered."""
    d = await daemon_factory(settings(gpus=2))
    model = make_tiny_hf_model(tmp_path / "tiny-chat")
    await asyncio.to_thread(d.daemon.hub.folders.add, model, name="tiny")
    models = {m.name: m for m in await d.client.servable_models()}
    entry = models["tiny"]
    assert (entry.kind, entry.engine_id, entry.model) == ("folder", "tiny", str(model))
    assert entry.status == "unloaded" and not entry.blocked and entry.gpus == ()
    client = sdk(d, timeout=60)
    assert await ask(client, "tiny") == "w0 w1"
    [row] = await d.client.loaded_models()
    assert (row.name, row.origin, row.gpus, row.vram_bytes) == ("tiny", "jit", (), 0)
    assert d.daemon.engine("tiny").profile.model == str(model)
    await d.client.unload_model("tiny")

    fake_profile(d, "dup")  # a profile's name wins over a folder's (as `traylm start dup`)
    await asyncio.to_thread(
        d.daemon.hub.folders.add, make_tiny_hf_model(tmp_path / "d"), name="dup"
    )
    assert await ask(client, "dup") == "w0 w1"
    assert d.daemon.engine("dup").profile.model == "org/dup"

    shutil.rmtree(model)  # gone while registered: `traylm models ls` says so; not servable
    await d.daemon.ondemand.catalog.refresh_fresh()
    with pytest.raises(openai.NotFoundError):
        await ask(client, "tiny")
    await client.close()


async def test_what_cannot_be_served_is_logged_once_and_when_it_changes(
    od: RunningDaemon, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The catalog is read every 30 s (and for each /v1/models): a folder that a profile's
    name hides, or a broken profile, is said once, again when its reason changes, and once when
    it can be served again; never on every read."""
    caplog.set_level(logging.INFO, logger="engines.ondemand.catalog")
    d = od
    model = make_tiny_hf_model(tmp_path / "dup-folder")
    await asyncio.to_thread(d.daemon.hub.folders.add, model, name="dup")
    fake_profile(d, "dup")
    d.write_profile("broken", model="org/broken", tensor_parallel_size=0)

    async def reads(n: int) -> None:
        """``n`` reads of the catalog: half through GET /v1/models, half directly."""
        async with aiohttp.ClientSession() as http:
            for i in range(n):
                if i % 2:
                    await d.daemon.ondemand.catalog.refresh_fresh()
                    continue
                async with http.get(d.url + "/v1/models") as r:
                    assert r.status == 200

    def said(text: str) -> list[str]:
        return [r.getMessage() for r in caplog.records if text in r.getMessage()]

    await reads(6)
    [hidden] = said("model folder dup not servable")
    assert "a profile has its name" in hidden and "rename the profile" in hidden
    [broken] = said("profile not servable")
    assert "broken" in broken and "tensor_parallel_size" in broken

    shutil.rmtree(model)  # the reason changes: said once more
    await reads(4)
    assert len(said("model folder dup not servable")) == 2
    assert "does not exist" in said("model folder dup not servable")[-1]

    (d.paths.profiles_dir / "dup.toml").unlink()
    make_tiny_hf_model(model)  # back, and no profile hides it now
    await reads(4)
    assert said("model folder dup can be served now") == ["model folder dup can be served now"]
    assert len(said("model folder dup not servable")) == 2
    assert len(said("profile not servable")) == 1
    assert "dup" in {m.name for m in await d.client.servable_models() if m.kind == "folder"}
