"""Simulated programs (engines/gpu/sim_programs.py) through a real daemon: what the
/api/gpus/{gpu}/programs routes answer to bad input and on real GPUs, and `traylm gpus program
start|list|stop` as a user runs it (a real subprocess)."""

from __future__ import annotations

import dataclasses
from typing import Any

import aiohttp
import pytest

from engines.config.sections import GPUSettings
from engines.core.procs import free_loopback_port
from tests.conftest import DaemonFactory, RunningDaemon, fast_settings
from tests.traylm_cli import traylm


@pytest.fixture
async def sim_daemon(daemon_factory: DaemonFactory) -> RunningDaemon:
    settings = fast_settings(free_loopback_port())
    d: RunningDaemon = await daemon_factory(
        dataclasses.replace(settings, gpu=GPUSettings(simulate_gpus=2))
    )
    return d


async def call(d: RunningDaemon, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """The control API's status and JSON for a raw request (``body``: bytes as sent, else JSON)."""
    info = d.client.info
    headers = {"Authorization": f"Bearer {info.token}"}
    data = body if isinstance(body, bytes) else None
    json = None if isinstance(body, bytes) else body
    async with (
        aiohttp.ClientSession(headers=headers) as http,
        http.request(method, info.url + path, json=json, data=data) as r,
    ):
        return r.status, await r.json(content_type=None)


def error(answer: tuple[int, Any]) -> tuple[int, str, str]:
    status, data = answer
    return status, data["error"]["type"], data["error"]["message"]


async def test_on_real_gpus_there_is_nothing_to_simulate(daemon: RunningDaemon) -> None:
    """This machine's GPUs (none: the real NVML backend) are not simulated: each route is a 409
    that says how to get simulated ones, whatever the body."""
    for method, path, body in (
        ("GET", "/api/gpus/0/programs", None),
        ("POST", "/api/gpus/0/programs", b"not json"),
        ("DELETE", "/api/gpus/0/programs/blender", None),
    ):
        status, code, message = error(await call(daemon, method, path, body))
        assert (status, code) == (409, "not_simulated"), (method, message)
        assert "only on simulated GPUs" in message
        assert "`traylm serve --simulate-gpus 2`" in message
    code, out = await traylm("gpus", "program", "list", "0")
    assert code != 0 and "Traceback" not in out
    assert out.strip().splitlines() == [out.strip()] and "--simulate-gpus 2" in out


NAME = '"name" must be the program\'s name, 1-64 characters, e.g. "blender"'
GIB = '"memory_gib" must be a number of GiB the program asks for, e.g. 12'


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"memory_gib": 12}, NAME),
        ({"name": " ", "memory_gib": 12}, NAME),
        ({"name": "x" * 65, "memory_gib": 12}, NAME),
        ({"name": 7, "memory_gib": 12}, NAME),
        ({"name": "blender"}, GIB),
        ({"name": "blender", "memory_gib": "12"}, GIB),
        ({"name": "blender", "memory_gib": True}, GIB),
        ({"name": "blender", "memory_gib": 0}, "memory_gib 0 is outside what GPU 1 has"),
        ({"name": "blender", "memory_gib": -2}, "more than 0, at most 24.0 GiB"),
        ({"name": "blender", "memory_gib": 25}, "memory_gib 25 is outside what GPU 1 has"),
        ({"name": "blender", "memory_gib": 1, "pid": 9}, "unknown fields pid; allowed: "),
    ],
)
async def test_a_bad_program_is_a_400_that_says_what_to_give(
    sim_daemon: RunningDaemon, body: dict[str, Any], says: str
) -> None:
    status, code, message = error(await call(sim_daemon, "POST", "/api/gpus/1/programs", body))
    assert (status, code) == (400, "config_invalid") and says in message
    assert await sim_daemon.client.sim_programs("1") == []  # nothing started


async def test_an_unknown_program_or_gpu_is_a_404_naming_those_there(
    sim_daemon: RunningDaemon,
) -> None:
    c = sim_daemon.client
    status, code, message = error(await call(sim_daemon, "DELETE", "/api/gpus/1/programs/gimp"))
    assert (status, code) == (404, "program_not_found")
    assert message == "no program 'gimp' on GPU 1; programs there: none"
    blender = await c.start_sim_program("1", "blender", 4)
    comfy = await c.start_sim_program("1", "comfyui", 2)
    status, code, message = error(await call(sim_daemon, "DELETE", "/api/gpus/1/programs/gimp"))
    assert (status, code) == (404, "program_not_found")
    assert message == (
        f"no program 'gimp' on GPU 1; programs there: blender (pid {blender.pid}), "
        f"comfyui (pid {comfy.pid})"
    )
    status, code, message = error(await call(sim_daemon, "GET", "/api/gpus/7/programs"))
    assert (status, code) == (404, "gpu_not_found") and "GPUs: 0 (" in message
    assert await c.stop_sim_program("1", str(comfy.pid)) == [comfy.pid]  # by pid
    assert [p.name for p in await c.sim_programs("1")] == ["blender"]


async def test_the_cli_starts_lists_and_stops_a_program(sim_daemon: RunningDaemon) -> None:
    code, out = await traylm("gpus", "program", "start", "1", "blender", "--gib", "12")
    assert code == 0, out
    (line,) = out.splitlines()
    pid = (await sim_daemon.client.sim_programs("1"))[0].pid
    assert line == f"GPU 1: blender (pid {pid}, simulated) holds 12.0 GiB"
    code, out = await traylm("gpus", "program", "list", "1")
    assert code == 0 and out.splitlines() == [line]
    code, out = await traylm("gpus", "program", "stop", "1", "blender")
    assert code == 0 and out.splitlines() == [f"GPU 1: blender exited (pid {pid}, simulated)"]
    code, out = await traylm("gpus", "program", "list", "1")
    assert code == 0 and out == ""


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("start", "1", "blender", "--gib", "0"), "memory_gib 0 is outside what GPU 1 has"),
        (("start", "1", " ", "--gib", "2"), NAME),
        (("start", "1", "blender", "--gib", "nan"), GIB),
        (("start", "7", "blender", "--gib", "2"), "no GPU '7'; GPUs: 0 ("),
        (("stop", "1", "gimp"), "no program 'gimp' on GPU 1; programs there: none"),
    ],
)
async def test_bad_cli_input_is_one_clear_line(
    sim_daemon: RunningDaemon, args: tuple[str, ...], says: str
) -> None:
    code, out = await traylm("gpus", "program", *args)
    assert code != 0 and "Traceback" not in out
    assert len(out.strip().splitlines()) == 1 and says in out, out
