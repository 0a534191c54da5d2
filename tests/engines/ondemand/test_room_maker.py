"""Making room on simulated GPUs through the real daemon (FAKE engines with sleep mode): a
simulated program takes 12 GiB on the card of an idle model, which sleeps and comes back once
the program exits; a pinned model, or one answering a request, is left alone; with the setting
off, or for a program in make_room_ignore, nothing happens; one in make_room_always gets room
on a card with plenty free. Against flapping: a program back within the return time keeps the
model asleep, and room made again soon after a return doubles the return time."""

from __future__ import annotations

import time

import pytest

from engines.events import EngineState, Notice
from engines.events.gpu import GPUSampled
from engines.events.models import RoomMade
from tests.conftest import DaemonFactory, RunningDaemon
from tests.engines.ondemand.conftest import ask, fake_profile, sdk, settings

pytestmark = pytest.mark.slow  # each waits for samples, sleeps and returns: 3-16 s
GIB = 1 << 30


async def loaded(
    d: RunningDaemon, events_of, args: str = "", **fields
) -> tuple[RunningDaemon, object]:
    d.daemon.ondemand.placer.host_free_bytes = lambda: 64 * GIB
    fake_profile(d, "qwen", args=args, device="cuda", gpus=[1], **fields)
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
    await events.wait(lists_showing("blender", 3))
    assert not [e for e in events.drain() if isinstance(e, RoomMade)]
    assert d.daemon.engine("qwen").state == EngineState.READY


def lists_showing(name: str, n: int):
    """An event match: true at the n-th process list of GPU 1 that shows ``name``."""
    seen: list[int] = []

    def match(e) -> bool:
        if isinstance(e, GPUSampled) and any(p.name == name for p in e.gpus[1].processes or ()):
            seen.append(1)
        return len(seen) >= n

    return match


async def test_an_ignored_program_never_claims_the_card(
    daemon_factory: DaemonFactory, fake_env, events_of
) -> None:
    d = await daemon_factory(settings(gpus=2, make_room_ignore=("Xorg", "blend*")))
    d, events = await loaded(d, events_of)
    await d.client.start_sim_program("1", "Blender", 12)  # patterns ignore case
    await events.wait(lists_showing("Blender", 3))
    assert not [e for e in events.drain() if isinstance(e, RoomMade)]
    assert d.daemon.engine("qwen").state == EngineState.READY


async def test_a_program_always_made_room_for_claims_a_roomy_card(
    daemon_factory: DaemonFactory, fake_env, events_of
) -> None:
    d = await daemon_factory(settings(gpus=2, make_room_always=("comfy*",)))
    d, events = await loaded(d, events_of, gpu_memory_utilization=0.5)

    def engine_shown(e) -> bool:  # a sample that counts the engine's memory
        return isinstance(e, GPUSampled) and any(
            p.engine_id and p.used_memory_bytes for p in e.gpus[1].processes or ()
        )

    sample = await events.wait(engine_shown)
    assert sample.gpus[1].memory_free_bytes > 8 * GIB  # plenty free: no other program claims
    await d.client.start_sim_program("1", "ComfyUI", 1)
    made = await events.wait(lambda e: isinstance(e, RoomMade))
    assert made.phase == "made" and made.message.startswith(
        "Made room on GPU 1 for ComfyUI: qwen sleeps"
    )
    assert d.daemon.engine("qwen").state == EngineState.SLEEPING


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
    assert "`traylm unload qwen`" in kept.message and "NAME" not in kept.message
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


def made(phase: str):
    return lambda e: isinstance(e, RoomMade) and e.phase == phase


def since(t_s: float, match):
    """``match``, for events published after wall-clock time ``t_s`` only."""
    return lambda e: e.ts_s > t_s and match(e)


def without(name: str):
    """An event match: a process list of GPU 1 without ``name``."""
    return lambda e: (
        isinstance(e, GPUSampled) and all(p.name != name for p in e.gpus[1].processes or ())
    )


async def test_a_program_back_within_the_return_time_keeps_the_models_asleep(
    daemon_factory: DaemonFactory, fake_env, events_of
) -> None:
    """blender exits and starts again (a new pid, 2 GiB so far: the model would fit beside it)
    before the 2 s return time: the model stays asleep while it runs, and comes back once it
    exits for good."""
    d = await daemon_factory(settings(gpus=2, make_room_return_s=2))
    d, events = await loaded(d, events_of, gpu_memory_utilization=0.5)
    await d.client.start_sim_program("1", "blender", 16)
    await events.wait(made("made"))
    stopped_s = time.time()
    await d.client.stop_sim_program("1", "blender")
    gone = await events.wait(since(stopped_s, without("blender")))  # the return time starts
    await d.client.start_sim_program("1", "blender", 2)

    def past_return(e) -> bool:  # blender listed again, 2 s past the return time since it exited
        return lists_showing("blender", 1)(e) and e.ts_s > gone.ts_s + 2 + 2

    await events.wait(past_return)
    assert not [e for e in events.drain() if made("back")(e)]
    assert d.daemon.engine("qwen").state == EngineState.SLEEPING
    stopped_s = time.time()
    await d.client.stop_sim_program("1", "blender")
    gone = await events.wait(since(stopped_s, without("blender")))
    back = await events.wait(made("back"))
    assert back.message == "blender exited: qwen is back on GPU 1"
    assert back.ts_s - gone.ts_s >= 2  # the return time counted from this exit, not the first
    assert d.daemon.engine("qwen").state == EngineState.READY


async def test_room_made_again_soon_after_doubles_the_return_time(
    daemon_factory: DaemonFactory, fake_env, events_of
) -> None:
    d = await daemon_factory(settings(gpus=2, make_room_return_s=1))
    d, events = await loaded(d, events_of)
    await d.client.start_sim_program("1", "blender", 12)
    await events.wait(made("made"))
    await d.client.stop_sim_program("1", "blender")
    first = await events.wait(made("back"))
    await d.client.start_sim_program("1", "blender", 12)
    again = await events.wait(lambda e: made("made")(e) and e.ts_s > first.ts_s)
    assert again.message == (
        "Made room on GPU 1 for blender: qwen sleeps; it comes back 2 s after blender exits "
        "(blender came back soon after last time)"
    )
    notice = await events.wait(lambda e: isinstance(e, Notice) and e.message == again.message)
    assert notice.source == "ondemand.room" and notice.title == "Made room on GPU 1"
    stopped_s = time.time()
    await d.client.stop_sim_program("1", "blender")
    gone = await events.wait(since(stopped_s, without("blender")))
    back = await events.wait(lambda e: made("back")(e) and e.ts_s > again.ts_s)
    assert back.ts_s - gone.ts_s >= 2  # the doubled return time, not the 1 s set
