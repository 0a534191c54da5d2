"""Making room on simulated GPUs through the real daemon (FAKE engines with sleep mode): a
simulated program takes 12 GiB on the card of an idle model, which sleeps and comes back once
the program exits; a pinned model, or one answering a request, is left alone; with the setting
off nothing happens."""

from __future__ import annotations

from engines.events import EngineState
from engines.events.gpu import GPUSampled
from engines.events.models import RoomMade
from tests.conftest import DaemonFactory, RunningDaemon
from tests.engines.ondemand.conftest import ask, fake_profile, sdk, settings

GIB = 1 << 30


async def loaded(d: RunningDaemon, events_of, args: str = "") -> tuple[RunningDaemon, object]:
    d.daemon.ondemand.placer.host_free_bytes = lambda: 64 * GIB
    fake_profile(d, "qwen", args=args, device="cuda", gpus=[1])
    events = events_of(d, "model.room", "notice", "gpu.sample")
    client = sdk(d)
    assert await ask(client, "qwen") == "w0 w1"
    await client.close()
    return d, events


async def test_a_program_gets_room_and_the_model_comes_back(
    daemon_factory: DaemonFactory, fake_env, events_of
) -> None:
    d = await daemon_factory(settings(gpus=2, make_room_return_s=1))
    d, events = await loaded(d, events_of)
    program = await d.client.start_sim_program("1", "blender", 12)
    assert program.simulated and program.wanted_bytes == 12 * GIB
    made = await events.wait(lambda e: isinstance(e, RoomMade) and e.phase == "made")
    assert made.message == (
        "Made room on GPU 1 for blender: qwen sleeps; it comes back when blender exits"
    )
    assert d.daemon.engine("qwen").state == EngineState.SLEEPING
    await events.wait(lambda e: getattr(e, "source", "") == "ondemand.room")  # the tray's notice

    def fits(e) -> bool:  # the program got all of its 12 GiB
        return isinstance(e, GPUSampled) and any(
            p.name == "blender" and p.used_memory_bytes == 12 * GIB
            for p in e.gpus[1].processes or ()
        )

    await events.wait(fits)
    await d.client.stop_sim_program("1", "blender")
    back = await events.wait(lambda e: isinstance(e, RoomMade) and e.phase == "back")
    assert back.message == "blender exited: qwen is back on GPU 1"
    assert d.daemon.engine("qwen").state == EngineState.READY


async def test_a_pinned_model_is_left_alone(
    daemon_factory: DaemonFactory, fake_env, events_of
) -> None:
    d = await daemon_factory(settings(gpus=2))
    d, events = await loaded(d, events_of)
    await d.client.load_model("qwen", pin=True)
    await d.client.start_sim_program("1", "blender", 12)
    kept = await events.wait(lambda e: isinstance(e, RoomMade))
    assert kept.phase == "kept" and "qwen (pinned) stays" in kept.message
    assert d.daemon.engine("qwen").state == EngineState.READY


async def test_with_the_setting_off_nothing_is_freed(
    daemon_factory: DaemonFactory, fake_env, events_of
) -> None:
    d = await daemon_factory(settings(gpus=2, make_room=False))
    d, events = await loaded(d, events_of)
    await d.client.start_sim_program("1", "blender", 12)
    seen: list[int] = []

    def lists_since(e) -> bool:  # three process lists that show the program
        if isinstance(e, GPUSampled) and any(
            p.name == "blender" for p in e.gpus[1].processes or ()
        ):
            seen.append(1)
        return len(seen) >= 3

    await events.wait(lists_since)
    assert not [e for e in events.drain() if isinstance(e, RoomMade)]
    assert d.daemon.engine("qwen").state == EngineState.READY


async def test_a_model_answering_a_request_is_left_alone(
    daemon_factory: DaemonFactory, fake_env, events_of
) -> None:
    """The claim says the model stays and why; the request finishes on a READY model; room is
    made once the model is idle (the program still needs the memory)."""
    d = await daemon_factory(settings(gpus=2))
    d, events = await loaded(d, events_of, args="--token-delay 0.05")
    client = sdk(d)
    stream = await client.chat.completions.create(
        model="qwen", messages=[{"role": "user", "content": "hi"}], max_tokens=100, stream=True
    )
    words = [chunk.choices[0].delta.content async for chunk in _first(stream)]
    await d.client.start_sim_program("1", "blender", 12)
    kept = await events.wait(lambda e: isinstance(e, RoomMade))
    assert kept.phase == "kept" and "qwen (answering requests) stays" in kept.message
    assert "`traylm unload NAME`" in kept.message
    assert d.daemon.engine("qwen").state == EngineState.READY
    words += [c.choices[0].delta.content async for c in stream if c.choices]
    assert len(words) == 100 and words[-1] == "w99 "  # the request ran to its end
    await client.close()
    made = await events.wait(lambda e: isinstance(e, RoomMade) and e.phase == "made")
    assert made.message.startswith("Made room on GPU 1 for blender: qwen sleeps")


async def _first(stream):  # the first token of a stream (the request is then in flight)
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            yield chunk
            return
