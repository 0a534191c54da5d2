"""Other programs on simulated GPUs, for users of `traylm serve --simulate-gpus N`: a stand-in
for a game or Blender appears on a card, asks for memory and exits (the /api/gpus/{gpu}/programs
routes, `traylm gpus program start|stop|list`). It holds what the card has free and takes the
rest as memory frees (engines/gpu/sim.py), so what traylm does for it (making room,
engines/ondemand/room_maker.py) shows the way it would on a real card.

On real GPUs there is nothing to start: the routes answer 409 ``not_simulated``.
"""

from __future__ import annotations

import math
from typing import Any

from engines.errors import ConfigError, GPUNotSupported, quoted
from engines.events.gpu import GPUInfo, SimulatedProgram
from engines.gpu.backend import GPUBackend, find_info
from engines.gpu.sim import SimulatedBackend

GIB = 1 << 30
NAME_MAX = 64


def simulator(backend: GPUBackend) -> SimulatedBackend:
    """The simulated backend, or GPUNotSupported (409) saying there is nothing to simulate."""
    if not isinstance(backend, SimulatedBackend):
        raise GPUNotSupported(
            f"the GPUs here are not simulated ({backend.name}): simulated programs exist only on "
            "simulated GPUs; start the daemon with `traylm serve --simulate-gpus 2` to try one",
            code="not_simulated",
        )
    return backend


def parse_start(body: dict[str, Any], info: GPUInfo) -> tuple[str, int]:
    """The name and the bytes of a program to start, from ``{"name": "blender",
    "memory_gib": 12}``; ConfigError (400) saying what is wrong."""
    extra = sorted(set(body) - {"name", "memory_gib"})
    if extra:
        raise ConfigError(f"unknown fields {', '.join(extra)}; allowed: memory_gib, name")
    name = body.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > NAME_MAX:
        raise ConfigError(
            f'"name" must be the program\'s name, 1-{NAME_MAX} characters, e.g. "blender"'
        )
    gib = body.get("memory_gib")
    if isinstance(gib, bool) or not isinstance(gib, int | float) or not math.isfinite(gib):
        raise ConfigError('"memory_gib" must be a number of GiB the program asks for, e.g. 12')
    total = info.memory_total_bytes or 0
    if gib <= 0 or (total and gib * GIB > total):
        raise ConfigError(
            f"memory_gib {gib:g} is outside what GPU {info.index} has: more than 0, at most "
            f"{total / GIB:.1f} GiB"
        )
    return name.strip(), int(gib * GIB)


def start(
    backend: GPUBackend, infos: tuple[GPUInfo, ...], gpu: str, body: dict[str, Any]
) -> SimulatedProgram:
    sim = simulator(backend)
    info = find_info(infos, gpu)
    name, wanted = parse_start(body, info)
    process = sim.start_program(info.uuid, name=name, used_memory_bytes=wanted)
    return _program(info, process.pid, name, wanted, process.used_memory_bytes or 0)


def listing(backend: GPUBackend, infos: tuple[GPUInfo, ...], gpu: str) -> list[SimulatedProgram]:
    sim = simulator(backend)
    info = find_info(infos, gpu)
    return [
        _program(info, p.pid, p.name, wanted, p.used_memory_bytes or 0)
        for p, wanted in sim.programs(info.uuid)
    ]


def stop(backend: GPUBackend, infos: tuple[GPUInfo, ...], gpu: str, which: str) -> list[int]:
    """Stop the programs on ``gpu`` with pid or name ``which``; the pids stopped. ConfigError
    (404) naming the programs there when none is."""
    sim = simulator(backend)
    info = find_info(infos, gpu)
    programs = [p for p, _ in sim.programs(info.uuid)]
    pids = [p.pid for p in programs if which in (str(p.pid), p.name)]
    if not pids:
        there = ", ".join(f"{p.name} (pid {p.pid})" for p in programs) or "none"
        error = ConfigError(
            f"no program {quoted(which)} on GPU {info.index}; programs there: {there}",
            code="program_not_found",
        )
        error.http_status = 404
        raise error
    for pid in pids:
        sim.release_memory(info.uuid, pid)
    return pids


def _program(info: GPUInfo, pid: int, name: str, wanted: int, held: int) -> SimulatedProgram:
    return SimulatedProgram(
        gpu_index=info.index,
        uuid=info.uuid,
        pid=pid,
        name=name,
        wanted_bytes=wanted,
        held_bytes=held,
    )
