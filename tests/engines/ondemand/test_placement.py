"""Placement on two simulated RTX 4090s through the real daemon (FAKE engines): the card with
the most room, memory another program holds, the reserved card, LRU eviction of idle models
(never busy or pinned ones), the 503 that says why, and vLLM's sleep mode as the first
eviction step (a FAKE CUDA env whose engine implements /sleep and /wake_up)."""

from __future__ import annotations

import asyncio
import dataclasses

import aiohttp
import openai
import pytest

from engines.errors import ControlAPIError
from engines.events import EngineState, ModelStateChanged
from engines.events.models import ModelLoading
from engines.gpu.sim import SimulatedBackend
from engines.ondemand.cli import _ps_line
from engines.runtime.adapters.memory import CUDA_CONTEXT_BYTES
from tests.conftest import DaemonFactory, RunningDaemon
from tests.engines.ondemand.conftest import ask, fake_profile, sdk, settings
from tests.fakes.fake_vllm_env import make_fake_vllm_env

GIB = 1 << 30


def sim(d: RunningDaemon) -> SimulatedBackend:
    backend = d.daemon.gpu.backend
    assert isinstance(backend, SimulatedBackend)
    return backend


async def until_sampled(d: RunningDaemon, check) -> None:
    """Wait until the sampler's latest snapshots show what ``check`` looks for."""
    while not check(d.daemon.gpu.sampler.latest):
        await asyncio.sleep(0.05)


def foreign_on(gpu: int):
    def check(snaps) -> bool:
        procs = snaps[gpu].processes if len(snaps) > gpu else None
        return bool(procs) and any(p.pid == 4242 for p in procs)

    return check


@pytest.fixture
async def two_gpus(daemon_factory: DaemonFactory, fake_env: object) -> RunningDaemon:
    d: RunningDaemon = await daemon_factory(settings(gpus=2))
    return d


def gpus_of(d: RunningDaemon, engine_id: str) -> tuple[int, ...]:
    return d.daemon.engine(engine_id).profile.gpus


async def test_auto_goes_to_the_card_another_program_leaves_free(two_gpus: RunningDaemon) -> None:
    d = two_gpus
    sim(d).hold_memory("0", pid=4242, used_memory_bytes=6 * GIB, name="game")
    await asyncio.wait_for(until_sampled(d, foreign_on(0)), 30)
    fake_profile(d, "auto1", gpus="auto")
    client = sdk(d)
    assert await ask(client, "auto1") == "w0 w1"
    assert gpus_of(d, "auto1") == (1,)  # GPU 0 has 6 GiB held: 0.9 of the card does not fit
    [row] = await d.client.loaded_models()
    # 0.9 of the card as CUDA sees it (NVML's 24564 MiB less the driver's 358), and the context
    assert row.gpus == (1,) and row.vram_bytes == int(24206 * 2**20 * 0.9) + CUDA_CONTEXT_BYTES
    await d.client.load_model("auto1", pin=True)
    fake_profile(d, "auto2", gpus="auto")
    with pytest.raises(openai.InternalServerError) as err:
        await ask(client, "auto2")
    message = str(err.value)
    assert "auto2 needs 21.8 GiB free on one of 1 GPU(s)" in message
    assert "GPU 0 (23.6 GiB after the driver's 0.3 GiB): 16.6 GiB free" in message
    # the game and the desktop GPU 0 drives
    assert "held by other programs and the driver (pid 4242 (game) 6.0 GiB, " in message
    assert "(Xorg) 0.6 GiB, pid 4194402 (gnome-shell) 0.5 GiB)" in message
    assert "auto1 21.8 GiB (pinned)" in message
    assert "traylm unload NAME" in message  # what to do
    await client.close()


async def test_the_reserved_card_stays_out(daemon_factory: DaemonFactory, fake_env: object) -> None:
    d = await daemon_factory(settings(gpus=2, reserved=(0,)))
    fake_profile(d, "r1", gpus="auto", gpu_memory_utilization=0.3)
    fake_profile(d, "r2", gpus="auto", gpu_memory_utilization=0.3)
    client = sdk(d)
    assert await ask(client, "r1") == "w0 w1"
    assert await ask(client, "r2") == "w0 w1"
    assert gpus_of(d, "r1") == gpus_of(d, "r2") == (1,)  # both on GPU 1; GPU 0 stays free
    with pytest.raises(ControlAPIError, match="GPU 3 does not exist; the GPUs here are 0, 1"):
        await d.client.load_model("r1", gpus=[3])
    fixed = await d.client.placement("r1", gpus=[0])  # a named GPU may be a reserved one
    assert fixed.fits and fixed.gpus == (0,)
    await client.close()


async def test_eviction_takes_the_lru_idle_model_never_busy_or_pinned(
    two_gpus: RunningDaemon, events_of
) -> None:
    d = two_gpus
    for name in ("a", "b", "c", "e"):
        fake_profile(d, name, gpus="auto", args="--token-delay 0.05")
    events = events_of(d, "model.state")
    client = sdk(d, timeout=60)
    assert await ask(client, "a") == "w0 w1"
    assert await ask(client, "b") == "w0 w1"
    assert {gpus_of(d, "a"), gpus_of(d, "b")} == {(0,), (1,)}
    assert await ask(client, "a") == "w0 w1"  # b is now the least recently used
    assert await ask(client, "c") == "w0 w1"
    evicted = await events.wait(
        lambda e: isinstance(e, ModelStateChanged) and e.reason == "evicted"
    )
    assert evicted.name == "b"
    assert d.daemon.engine("a").state == EngineState.READY
    # now: a busy with a stream, c pinned → e has no room, and the 503 says why
    await d.client.load_model("c", pin=True)
    stream = await client.chat.completions.create(
        model="a", messages=[{"role": "user", "content": "x"}], max_tokens=200, stream=True
    )
    async for _ in stream:
        break
    async with (
        aiohttp.ClientSession() as http,
        http.post(d.url + "/v1/chat/completions", json={"model": "e", "messages": []}) as r,
    ):
        assert r.status == 503
        assert r.headers["Retry-After"] == "5" and r.headers["x-should-retry"] == "true"
        message = (await r.json())["error"]["message"]
    assert "a 21.8 GiB (busy)" in message and "c 21.8 GiB (pinned)" in message
    assert "retry shortly" in message
    await stream.close()
    assert d.daemon.engine("a").state == EngineState.READY
    assert d.daemon.engine("c").state == EngineState.READY
    await client.close()


async def test_a_client_following_a_load_sees_it_evict(two_gpus: RunningDaemon) -> None:
    """A load that must make room says so: a client following the load on the daemon's event
    stream sees the phase "evicting", naming the model stopped for it, before the load starts
    its engine."""
    d = two_gpus
    for name in ("a", "b", "c"):
        fake_profile(d, name, gpus="auto")
    client = sdk(d, timeout=60)
    assert await ask(client, "a") == "w0 w1"
    assert await ask(client, "b") == "w0 w1"
    assert await ask(client, "a") == "w0 w1"  # b is now the least recently used
    opened = asyncio.Event()

    async def follow() -> list[tuple[str, str]]:
        phases: list[tuple[str, str]] = []
        async for event in d.client.events(kinds=("model.loading",), opened=opened.set):
            if isinstance(event, ModelLoading) and event.engine_id == "c":
                phases.append((event.phase, event.detail))
                if event.phase == "starting":
                    return phases
        return phases

    follower = asyncio.create_task(follow())
    await asyncio.wait_for(opened.wait(), 30)
    await d.client.load_model("c")
    phases = await asyncio.wait_for(follower, 30)
    assert ("evicting", "stop b") in phases, phases
    assert [p for p, _ in phases].index("evicting") < [p for p, _ in phases].index("starting")
    assert d.daemon.engine("a").state == EngineState.READY
    await client.close()


async def test_traylm_load_says_it_evicts_before_the_engine_starts(
    two_gpus: RunningDaemon,
) -> None:
    """`traylm load` (client/model_wait.py) subscribes before it asks for the load: the
    daemon answers once the model is placed, so a follower that subscribed after would never
    print the eviction."""
    from engines.client.model_wait import load_and_wait

    d = two_gpus
    for name in ("a", "b", "c"):
        fake_profile(d, name, gpus="auto")
    client = sdk(d, timeout=60)
    assert await ask(client, "a") == "w0 w1"
    assert await ask(client, "b") == "w0 w1"
    assert await ask(client, "a") == "w0 w1"  # b is now the least recently used
    said: list[str] = []
    await load_and_wait(d.client, "c", timeout_s=60, say=said.append)
    assert any(line.startswith("  evicting: stop b") for line in said), said
    assert said[-1] == "c: ready"
    await client.close()


async def test_sleep_mode_frees_the_card_and_wakes_on_the_next_request(
    daemon_factory: DaemonFactory, paths, events_of
) -> None:
    make_fake_vllm_env(paths.envs_dir, device="cuda")
    d = await daemon_factory(settings(gpus=1))
    d.daemon.ondemand.placer.host_free_bytes = lambda: 64 * GIB
    # 0.8 of the card each: on the desktop's card a sleeping engine's 1 GiB and a second 0.9
    # (21.3 GiB and its 0.8 GiB context) do not fit together, so s1 would have to stop
    fake_profile(d, "s1", device="cuda", gpus="auto", gpu_memory_utilization=0.8)
    fake_profile(d, "s2", device="cuda", gpus="auto", gpu_memory_utilization=0.8)
    events = events_of(d, "model.state")
    client = sdk(d)
    assert await ask(client, "s1") == "w0 w1"
    assert await ask(client, "s2") == "w0 w1"  # s1 goes to sleep to make room
    slept = await events.wait(
        lambda e: isinstance(e, ModelStateChanged) and e.name == "s1" and e.reason == "evicted"
    )
    assert slept.state == "sleeping"
    s1 = d.daemon.engine("s1")
    assert s1.state == EngineState.SLEEPING and s1.pid is not None  # the process lives on
    async with aiohttp.ClientSession() as http, http.get(f"{s1.base_url}/fake/stats") as r:
        assert (await r.json())["sleeping"] == 1
    rows = {r.engine_id: r for r in await d.client.loaded_models()}
    assert rows["s1"].vram_bytes == GIB  # what sleep mode keeps
    assert await ask(client, "s1") == "w0 w1"  # s2 sleeps, s1 wakes (no cold start)
    assert s1.state == EngineState.READY and d.daemon.engine("s2").state == EngineState.SLEEPING
    async with aiohttp.ClientSession() as http, http.get(f"{s1.base_url}/fake/stats") as r:
        stats = await r.json()
    assert stats["wakes"] == 1 and stats["sleeping"] == 0
    await client.close()


@pytest.mark.slow
async def test_an_engine_asleep_or_waking_is_not_taken_for_dead(
    daemon_factory: DaemonFactory, paths
) -> None:
    """vLLM's /health may not answer while its EngineCore sleeps or moves the weights back
    (here the FAKE engine's does not, and its wake takes 8 s): the supervisor judges a
    sleeping or waking engine by its exit code only, so the engine wakes and serves, neither
    declared crashed nor restarted (awake, two unanswered probes in a row with no sign of life
    would be)."""
    make_fake_vllm_env(paths.envs_dir, device="cuda")
    d = await daemon_factory(settings(gpus=1))
    d.daemon.ondemand.placer.host_free_bytes = lambda: 64 * GIB
    fake_profile(d, "s1", device="cuda", gpus="auto", args="--silent-asleep 8")
    client = sdk(d)
    assert await ask(client, "s1") == "w0 w1"
    s1 = d.daemon.engine("s1")
    leader = s1.pid
    await s1.sleep()
    assert await ask(client, "s1") == "w0 w1"  # wakes it: 8 s without an answer to /health
    assert s1.state == EngineState.READY and s1.pid == leader and s1.restarts == 0
    async with aiohttp.ClientSession() as http, http.get(f"{s1.base_url}/fake/stats") as r:
        assert (await r.json())["wakes"] == 1
    await client.close()


async def test_models_on_the_cpu_take_host_ram_and_no_gpu(
    two_gpus: RunningDaemon, events_of
) -> None:
    """Two simulated GPUs and FAKE engines with ``device = "cpu"``: each books its host RAM
    (2 GiB of KV cache + 1 GiB of runtime; weights unknown) and no GPU memory, so a second one
    does not evict the first, and a GPU model still finds both cards free. RAM for two, not
    three: the third stops the least recently used idle one; with the others pinned, it is
    refused with what holds the RAM."""
    d = two_gpus
    d.daemon.ondemand.placer.host_free_bytes = lambda: 11 * GIB  # 4 GiB kept: room for 7
    for name in ("c1", "c2", "c3", "c4"):
        fake_profile(d, name, device="cpu", cpu_kv_cache_gib=2)
    fake_profile(d, "g", device="cuda", gpus="auto")
    events = events_of(d, "model.state")
    client = sdk(d)
    assert await ask(client, "c1") == "w0 w1"
    assert await ask(client, "c2") == "w0 w1"
    assert d.daemon.engine("c1").state == EngineState.READY  # not evicted by c2
    rows = {r.engine_id: r for r in await d.client.loaded_models()}
    assert rows["c1"].gpus == () and rows["c1"].vram_bytes == 0
    assert rows["c1"].ram_bytes == 3 * GIB
    assert _ps_line(rows["c1"]).split()[2] == "cpu"  # `traylm ps` shows it on the CPU
    fits = await d.client.placement("g")
    # the card without the desktop, all of it free as CUDA sees it
    assert fits.fits and fits.gpus == (1,) and fits.free_bytes_per_gpu[0] > 23 * GIB
    assert await ask(client, "g") == "w0 w1"
    assert gpus_of(d, "g") == (1,)
    assert await ask(client, "c1") == "w0 w1"  # c2 is now the least recently used CPU model
    assert await ask(client, "c3") == "w0 w1"
    evicted = await events.wait(
        lambda e: isinstance(e, ModelStateChanged) and e.reason == "evicted"
    )
    assert evicted.name == "c2"
    assert d.daemon.engine("c1").state == EngineState.READY
    assert d.daemon.engine("g").state == EngineState.READY  # the GPU model is not in the way
    await d.client.load_model("c1", pin=True)
    await d.client.load_model("c3", pin=True)
    with pytest.raises(openai.InternalServerError) as err:
        await ask(client, "c4")
    message = str(err.value)
    assert "c4 needs 3.0 GiB of host RAM" in message
    assert "c1 3.0 GiB (pinned)" in message and "c3 3.0 GiB (pinned)" in message
    assert "cpu_kv_cache_gib" in message  # what to do
    await client.close()


async def test_a_load_right_after_a_stop_sees_the_stopped_engines_memory_freed(
    daemon_factory: DaemonFactory, fake_env: object
) -> None:
    """A stop, then at once a model that needs the card the stopped engine held (the tuner's
    next candidate, `traylm load` after `traylm stop`): the planner waits for a snapshot taken
    after the stop instead of counting the stopped engine's memory as another program's. The
    process list is read rarely here, so it never showed the engine (as for a fresh one). Warm
    starts off: a SIGKILLed warm-launched engine (a slow stop beside CPU hogs) can leave its
    asyncio transport unclosed (test_replicas.py says the same)."""
    base = settings(gpus=2, warm_starts=0)
    d = await daemon_factory(
        dataclasses.replace(base, gpu=dataclasses.replace(base.gpu, process_interval_s=3600))
    )
    fake_profile(d, "one", gpus=[0])
    fake_profile(d, "both", gpus="auto", tensor_parallel_size=2)
    await d.client.load_model("one")
    await d.client.wait_for_model("one", 30)
    held = 20 * GIB  # vLLM's 0.9 of the card and its context: 21.8 GiB

    def shows_one(snaps) -> bool:
        return bool(snaps) and (snaps[0].memory_used_bytes or 0) > held

    await asyncio.wait_for(until_sampled(d, shows_one), 30)
    await d.client.stop("one")
    await d.client.load_model("both")  # refused ("needs 21.8 GiB free") with a stale snapshot
    assert gpus_of(d, "both") == (0, 1)
    await d.client.wait_for_model("both", 30)
