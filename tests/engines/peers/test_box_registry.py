"""Replicas across boxes without namespaces: BoxReplicas (what each paired box serves, away
and back) against a real HTTP server standing in for a box's /peer/models (plain http: the
mutual TLS is the namespace tests'), and the model router's balancing of this box's engines
with the boxes' replicas. test_box_replicas.py runs the whole path between two daemons."""

from __future__ import annotations

import asyncio
import types
from collections.abc import AsyncIterator, Collection
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from engines.config.live import LiveSettings
from engines.config.profiles import ProfileStore
from engines.config.sections import PeersSettings, Settings
from engines.core.bus import EventBus
from engines.core.procs import free_loopback_port
from engines.errors import PeerNotFound
from engines.events.codec import Event
from engines.events.core import EngineState
from engines.events.models import LoadedModel, ReplicaInfo, ServableModel
from engines.events.peers import BoxesChanged
from engines.gateway.balance import Affinity
from engines.gateway.upstream import Upstream
from engines.ondemand.parts import Parts
from engines.ondemand.service import ModelsOnDemand
from engines.peers.replicas import BoxReplicas
from engines.peers.store import Peer
from tests.conftest import RunningDaemon
from tests.engines.gateway.test_daemon_gateway import start_fake

SERVES = {
    "name": "box-b",
    "models": [
        {"name": "chat", "names": ["chat", "chat-alias"], "engine": "vllm", "gpus": [0],
         "in_flight": 1, "waiting": 0},
    ],
    "gpus": [{"index": 0, "name": "NVIDIA GeForce RTX 4090", "memory_total_bytes": 1}],
}  # fmt: skip


class FakeBox:
    """A real HTTP server answering /peer/models as told (``answer``: a status and body, or
    "slow": later than the client waits)."""

    def __init__(self) -> None:
        self.answer: tuple[int, Any] | str = (200, SERVES)
        self.asked = 0
        self.published: list[Event] = []  # what the BoxReplicas asking it published
        self.asked_event = asyncio.Event()
        self.released = asyncio.Event()

    async def models(self, request: web.Request) -> web.StreamResponse:
        self.asked += 1
        self.asked_event.set()
        if self.answer == "slow":
            await self.released.wait()  # the client gives up first; the fixture releases it
        assert not isinstance(self.answer, str)
        status, body = self.answer
        if isinstance(body, str):
            return web.Response(status=status, text=body)
        return web.json_response(body, status=status)


def changes(fake: FakeBox) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """The BoxesChanged events published: (boxes, away) of each."""
    assert all(isinstance(e, BoxesChanged) for e in fake.published)
    return [(e.boxes, e.away) for e in fake.published if isinstance(e, BoxesChanged)]


class StubPeers:
    """PeersFeature as BoxReplicas reads it, towards FakeBox over plain http."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.paired: dict[str, Peer] = {}
        self.waiting = asyncio.Event()  # set while the poll waits for a pairing
        self._pairing = asyncio.Event()

    def pair(self) -> None:
        self.paired["box-b"] = Peer("box-b", self.address, "ff", "", 0.0)
        self._pairing.set()

    def names(self) -> list[str]:
        return list(self.paired)

    def peer(self, name: str) -> Peer:
        if name not in self.paired:
            raise PeerNotFound(f"no paired box is named {name!r}")
        return self.paired[name]

    async def until_paired(self) -> None:
        while not self.paired:
            self._pairing.clear()
            self.waiting.set()
            await self._pairing.wait()

    def client_context(self, name: str) -> None:
        return None

    def session(self, name: str) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            base_url=f"http://{self.peer(name).address}",
            timeout=aiohttp.ClientTimeout(total=0.5),
        )


@pytest.fixture
async def box(tmp_path: Path) -> AsyncIterator[tuple[FakeBox, BoxReplicas, list[tuple[str, str]]]]:
    fast = Settings(peers=PeersSettings(replicas_poll_s=0.5))
    settings = LiveSettings(fast, config_file=tmp_path / "config.toml")
    fake = FakeBox()
    app = web.Application()
    app.router.add_get("/peer/models", fake.models)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    peers = StubPeers(f"127.0.0.1:{server.port}")
    peers.pair()
    ended: list[tuple[str, str]] = []

    def end(name: str, why: str) -> int:
        ended.append((name, why))
        return 1

    replicas = BoxReplicas(
        peers=peers,  # type: ignore[arg-type]
        settings=settings,
        end_requests=end,
        publish=fake.published.append,
    )
    yield fake, replicas, ended
    await replicas.stop()
    fake.released.set()
    await server.close()


async def test_a_box_that_answers_has_its_models_as_replicas(box: Any) -> None:
    _, replicas, ended = box
    await replicas.refresh()
    [up] = replicas.serving("chat")
    address = replicas._peers.address
    assert (up.name, up.box, up.base_url) == ("chat@box-b", "box-b", f"https://{address}")
    assert replicas.serving("chat-alias") == [up]  # every name that routes to it there
    assert replicas.serving("other") == [] and replicas.away("chat") == ""
    [row] = replicas.rows()
    assert isinstance(row, LoadedModel)
    assert (row.name, row.box, row.state, row.gpus) == ("chat", "box-b", "ready", (0,))
    assert row.detail == "on box-b: GPU 0 NVIDIA GeForce RTX 4090"
    assert replicas.status() == {
        "box-b": {"problem": "", "models": ["chat"], "gpus": SERVES["gpus"]}  # with memory
    }
    assert replicas.listed({"chat"}) == []  # a name this box serves itself is listed once
    [listed] = replicas.listed(set())
    assert isinstance(listed, ServableModel)
    assert (listed.name, listed.kind, listed.engine_id) == ("chat", "box", "chat@box-b")
    # a model this box lists itself: the box's copy is among its replicas, by any name
    [copy] = replicas.copies(("chat-alias", "x"))
    assert (copy.engine_id, copy.state, copy.gpus) == ("chat@box-b", "ready", (0,))
    assert replicas.copies(("other",)) == ()
    assert ended == []


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ((500, {"error": {"message": "boom"}}), "box 'box-b' refused to say what it serves: boom"),
        ((200, "not json"), "box 'box-b' answered /peer/models with something not JSON"),
        ((200, {"models": [{"name": 3}]}), "box 'box-b' gave a malformed list"),
        ("slow", "box 'box-b' at 127.0.0.1:"),
    ],
)
async def test_a_box_that_fails_is_away_named_and_comes_back(
    box: Any, answer: Any, said: str
) -> None:
    fake, replicas, ended = box
    await replicas.refresh()
    await replicas.refresh()  # nothing changed: nothing said
    assert changes(fake) == [(("box-b",), ())]
    fake.answer = answer
    await replicas.refresh()
    assert changes(fake)[-1] == (("box-b",), ("box-b",))
    assert replicas.serving("chat") == []
    problem = replicas.away("chat")
    assert said in problem, problem
    if answer == "slow":
        assert "did not answer in time" in problem
    assert ended == [("chat@box-b", problem)]  # its requests in flight are told why
    [row] = replicas.rows()
    assert (row.state, row.detail) == ("away", problem)
    assert replicas.listed(set()) == []

    fake.answer = (200, SERVES)
    await replicas.refresh()
    assert [u.name for u in replicas.serving("chat")] == ["chat@box-b"]
    assert replicas.away("chat") == ""
    assert changes(fake) == [(("box-b",), ()), (("box-b",), ("box-b",)), (("box-b",), ())]


async def test_nothing_is_asked_while_no_box_is_paired(box: Any) -> None:
    fake, replicas, _ = box
    peers = replicas._peers
    peers.paired.clear()
    await replicas.start()
    await asyncio.wait_for(peers.waiting.wait(), 10)  # the poll waits for a pairing
    assert fake.asked == 0
    peers.pair()
    await asyncio.wait_for(fake.asked_event.wait(), 10)
    await _until(lambda: replicas.serving("chat"))


# --------------------------------------------------------------------------- the router


class StubBoxes:
    """ondemand's Boxes: fixed replicas on paired boxes."""

    def __init__(self, *ups: Upstream) -> None:
        self.ups = ups

    def serving(self, model: str) -> list[Upstream]:
        return [u for u in self.ups if u.name.partition("@")[0] == model]

    def away(self, model: str) -> str:
        return ""

    def rows(self) -> list[LoadedModel]:
        return []

    def listed(self, known: set[str]) -> list[ServableModel]:
        return []

    def copies(self, names: Collection[str]) -> tuple[ReplicaInfo, ...]:
        return tuple(
            ReplicaInfo(u.name, "ready") for u in self.ups if u.name.partition("@")[0] in names
        )


def _engine(engine_id: str) -> Any:
    profile = types.SimpleNamespace(engine="vllm", effective_served_name="chat")
    return types.SimpleNamespace(
        engine_id=engine_id, state=EngineState.READY, port=4321, served_names=("chat",),
        profile=profile, quiet_s=lambda now_s: 0.0,  # its requests make progress
    )  # fmt: skip


def _router(tmp_path: Path, engines: dict[str, Any], outstanding: dict[str, int]) -> ModelsOnDemand:
    router = ModelsOnDemand(
        settings=LiveSettings(Settings(), config_file=tmp_path / "config.toml"),
        engines=types.SimpleNamespace(engines=engines, route=lambda model: None),  # type: ignore[arg-type]
        profiles=ProfileStore(tmp_path / "profiles"),
        publish=lambda event: None,
        attached_file=tmp_path / "attached.toml",
        bus=EventBus(),
        boxes=StubBoxes(Upstream("chat@box-b", "https://10.0.0.2:8471", {}, box="box-b")),
    )
    traffic = types.SimpleNamespace(activity=lambda name: (outstanding.get(name, 0), 0, None))
    router.connect(Parts(control=None, gateway=traffic, gpus=None, hub=None))  # type: ignore[arg-type]
    return router


def _ask(text: str, **kw: Any) -> Affinity:
    return Affinity({"model": "chat", "messages": [{"role": "user", "content": text}]}, **kw)


def test_a_box_replica_is_offered_only_to_this_box_s_own_clients(tmp_path: Path) -> None:
    router = _router(tmp_path, {}, {})
    up = router.upstream("chat", _ask("hi", boxes=True))
    assert up is not None and up.box == "box-b"
    assert router.upstream("chat", _ask("hi")) is None  # a paired box's request: never relayed on
    assert router.upstream("chat") is None


def test_local_and_box_replicas_share_the_requests(tmp_path: Path) -> None:
    outstanding: dict[str, int] = {}
    router = _router(tmp_path, {"chat": _engine("chat")}, outstanding)
    picked = [router.upstream("chat", _ask(f"q{i}", boxes=True)) for i in range(4)]
    assert sorted(u.name for u in picked if u) == ["chat", "chat", "chat@box-b", "chat@box-b"]
    outstanding["chat"] = 3  # fewest outstanding wins
    assert {router.upstream("chat", _ask(f"n{i}", boxes=True)).name for i in range(3)} == {
        "chat@box-b"
    }
    outstanding["chat"], outstanding["chat@box-b"] = 0, 5
    assert router.upstream("chat", _ask("other", boxes=True)).name == "chat"


def test_a_conversation_sticks_and_an_unreachable_box_is_avoided(tmp_path: Path) -> None:
    router = _router(tmp_path, {"chat": _engine("chat")}, {})
    first = router.upstream("chat", _ask("same", boxes=True))
    assert first is not None
    again = {router.upstream("chat", _ask("same", boxes=True)).name for _ in range(3)}
    assert again == {first.name}
    avoid = _ask("x", boxes=True, avoid=frozenset({"chat@box-b"}))
    assert router.upstream("chat", avoid).name == "chat"  # the box did not take the connection
    avoid = _ask("y", boxes=True, avoid=frozenset({"chat"}))
    assert router.upstream("chat", avoid).name == "chat@box-b"


# --------------------------------------------------------------------------- the gateway


async def test_a_box_that_refuses_or_cannot_be_reached_moves_the_request_here(
    daemon: RunningDaemon,
) -> None:
    """Through the real daemon: "fake" is this box's engine and a paired box's replica (a
    real HTTP server standing in for that box's gateway, answering 503 "not loaded here",
    then a port nobody listens on). Every request is answered by this box's engine; the box
    was tried."""
    await start_fake(daemon)
    refused: list[str] = []

    async def not_loaded(request: web.Request) -> web.Response:
        refused.append(request.path)
        return web.json_response({"error": {"message": "not loaded here"}}, status=503)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", not_loaded)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        for url in (f"http://127.0.0.1:{server.port}", f"http://127.0.0.1:{free_loopback_port()}"):
            box = Upstream("fake@box-b", url, {}, box="box-b")
            daemon.daemon.ondemand._boxes = StubBoxes(box)
            async with aiohttp.ClientSession() as http:
                for i in range(4):  # new conversations: the balancer alternates
                    body = {"model": "fake", "max_tokens": 2,
                            "messages": [{"role": "user", "content": f"{url} {i}"}]}  # fmt: skip
                    async with http.post(daemon.url + "/v1/chat/completions", json=body) as r:
                        assert r.status == 200, await r.text()
                        assert r.headers["X-Traylm-Engine"] == "fake"
        assert refused, "the box was never tried"
    finally:
        await server.close()


async def test_v1_models_lists_a_box_s_copy_beside_this_box_s_engine(
    daemon: RunningDaemon,
) -> None:
    await start_fake(daemon)
    daemon.daemon.ondemand._boxes = StubBoxes(Upstream("fake@box-b", "https://x", {}, box="box-b"))
    async with aiohttp.ClientSession() as http, http.get(daemon.url + "/v1/models") as r:
        data = (await r.json())["data"]
    [fake] = [m for m in data if m["id"] == "fake"]
    replicas = [(r["engine_id"], r["state"]) for r in fake["traylm"]["replicas"]]
    assert replicas == [("fake", "ready"), ("fake@box-b", "ready")]
    assert not [m for m in data if m["id"].endswith("@box-b")]  # listed once, by its name


async def _until(condition: Any) -> None:
    async with asyncio.timeout(10):
        while not condition():
            await asyncio.sleep(0.01)


async def test_an_unpaired_box_is_forgotten_and_its_requests_ended(box: Any) -> None:
    _, replicas, ended = box
    await replicas.start()
    await _until(lambda: replicas.serving("chat"))
    replicas._peers.paired.clear()  # `traylm unpair box-b`: the last paired box
    await _until(lambda: not replicas.serving("chat"))
    assert replicas.rows() == []
    assert ended == [("chat@box-b", "box 'box-b' is no longer paired")]


async def test_responses_for_a_model_only_a_box_serves_say_they_stay_here(
    daemon: RunningDaemon,
) -> None:
    """Chat for "chat" goes to the paired box; the Responses API does not (its kept responses
    live on this box): the 404 says so and why, not "not served"."""
    daemon.daemon.ondemand._boxes = StubBoxes(Upstream("chat@box-b", "https://x", {}, box="box-b"))
    async with aiohttp.ClientSession() as http:
        body = {"model": "chat", "input": "hi"}
        async with http.post(daemon.url + "/v1/responses", json=body) as r:
            assert r.status == 404
            error = (await r.json())["error"]
    assert "served here only by the paired box 'box-b'" in error["message"], error
    assert "the Responses API stays on this box" in error["message"]
    assert "/v1/chat/completions" in error["message"] and error["param"] == "model"
