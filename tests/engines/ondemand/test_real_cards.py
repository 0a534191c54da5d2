"""Placement on two simulated RTX 4090s as unkind as real ones (the simulator's default): the
driver reserves 358 MiB outside NVML's "used" (CUDA sees 23.64 GiB of 24564 MiB), GPU 0 drives
the desktop (Xorg and gnome-shell hold 1.07 GiB), and each engine needs its CUDA context and,
with tensor parallel, NCCL on top of its budget. Through the real daemon: what a real card
would refuse is refused (vLLM's "Free memory on device ... less than desired GPU memory
utilization"), what it would take is placed, and every shipped preset is re-checked here."""

from __future__ import annotations

import asyncio
import dataclasses
import tomllib
from pathlib import Path

import pytest

from engines.config.sections import resources_dir
from engines.gpu.sim import DESKTOP, DESKTOP_BYTES, IDLE_USED_BYTES, SimulatedBackend
from engines.ondemand import occupancy
from tests.conftest import DaemonFactory, RunningDaemon
from tests.engines.ondemand.conftest import settings

PRESETS = sorted((resources_dir() / "profiles").glob("*.toml"))


@pytest.fixture
async def box(daemon_factory: DaemonFactory, fake_cuda_env: Path) -> RunningDaemon:
    d: RunningDaemon = await daemon_factory(settings(gpus=2))
    return d


def sim(d: RunningDaemon) -> SimulatedBackend:
    backend = d.daemon.gpu.backend
    assert isinstance(backend, SimulatedBackend)
    return backend


def served_name(preset: Path) -> str:
    return str(tomllib.loads(preset.read_text())["served_name"])


@pytest.mark.parametrize("desktop_mib", [0, 430], ids=["desktop-1.1GiB", "desktop-1.5GiB"])
@pytest.mark.parametrize("preset", PRESETS, ids=[p.stem for p in PRESETS])
async def test_each_preset_fits_the_real_dual_4090(
    box: RunningDaemon, preset: Path, desktop_mib: int
) -> None:
    """Each shipped preset places on its GPUs beside a desktop on GPU 0, up to the 1.5 GiB a
    desktop with a browser open takes (the simulator's 1.07 GiB, and 430 MiB more)."""
    if desktop_mib:
        sim(box).hold_memory(
            "0", pid=4_194_403, used_memory_bytes=desktop_mib << 20, name="firefox"
        )
        await asyncio.wait_for(until_used_over(box, (1100 + desktop_mib - 1) << 20), 30)
    found = await box.client.placement(served_name(preset))
    assert found.fits, f"preset {preset.name} no longer fits a dual 4090: {found.reason}"
    assert found.gpus == tuple(tomllib.loads(preset.read_text())["gpus"])


async def until_used_over(d: RunningDaemon, used_bytes: int) -> None:
    while True:
        latest = d.daemon.gpu.sampler.latest
        if latest and (latest[0].memory_used_bytes or 0) > used_bytes:
            return
        await asyncio.sleep(0.05)


async def test_the_70b_preset_at_0_95_is_refused_on_the_desktop_card(box: RunningDaemon) -> None:
    """At 0.95 vLLM wants 22.5 GiB of the 23.6 GiB CUDA sees, plus its context and NCCL: GPU 1
    has that, GPU 0 (its desktop holds 1.07 GiB) does not, and vLLM would refuse to start. The
    refusal names the desktop; closed, the same profile fits."""
    data = tomllib.loads((resources_dir() / "profiles" / "llama-3.3-70b-awq-tp2.toml").read_text())
    box.write_profile(
        "seventy", **{**data, "served_name": "seventy", "gpu_memory_utilization": 0.95}
    )
    found = await box.client.placement("seventy")
    assert not found.fits
    assert "needs 23.3 GiB free on each of 2 GPU(s)" in found.reason
    assert "plus 0.8 GiB for its CUDA context and NCCL" in found.reason
    assert "GPU 0 (23.6 GiB after the driver's 0.3 GiB): 22.6 GiB free" in found.reason
    assert "(Xorg) 0.6 GiB" in found.reason and "(gnome-shell) 0.5 GiB" in found.reason
    assert "lower gpu_memory_utilization" in found.reason
    for pid, _, _ in DESKTOP:
        sim(box).release_memory("0", pid)
    await asyncio.wait_for(until_desktop_gone(box), 30)
    closed = await box.client.placement("seventy")
    assert closed.fits and closed.gpus == (0, 1)


async def until_desktop_gone(d: RunningDaemon) -> None:
    """Until the sampler's latest reading of GPU 0 shows the desktop's memory freed."""
    while True:
        latest = d.daemon.gpu.sampler.latest
        if latest and (latest[0].memory_used_bytes or 0) < 100 << 20:
            return
        await asyncio.sleep(0.05)


async def test_a_single_card_model_that_needs_all_of_a_card_goes_to_the_one_without_desktop(
    box: RunningDaemon,
) -> None:
    box.write_profile(
        "big",
        engine="vllm",
        device="cuda",
        model="org/big",
        served_name="big",
        gpus="auto",
        gpu_memory_utilization=0.95,
    )
    found = await box.client.placement("big")
    assert found.fits and found.gpus == (1,)
    refused = await box.client.placement("big", gpus=[0])
    assert not refused.fits and "big needs 23.0 GiB free on one of 1 GPU(s)" in refused.reason


def test_the_card_is_what_cuda_sees_and_an_unread_card_says_so() -> None:
    """From one simulated reading: the total less the driver's reserve, the desktop as another
    program's memory. A v1 reading (no reserve known) has the same free memory; a card whose
    memory NVML does not report is taken as empty and says it."""
    backend = SimulatedBackend(1)
    infos = backend.infos()
    (snap,) = backend.sample(slow=True)
    (card,) = occupancy.cards(infos, [snap], [], {}, ())
    mib = 2**20
    assert card.total_bytes == 24206 * mib and card.driver_reserve_bytes == 358 * mib
    assert card.other_bytes == IDLE_USED_BYTES + DESKTOP_BYTES
    assert card.others[0] == f"pid {DESKTOP[0][0]} (Xorg) 0.6 GiB"
    v1 = dataclasses.replace(
        snap, memory_reserved_bytes=None, memory_used_bytes=snap.memory_used_bytes + 358 * mib
    )
    (old,) = occupancy.cards(infos, [v1], [], {}, ())
    assert old.total_bytes - old.other_bytes == card.total_bytes - card.other_bytes
    unread = dataclasses.replace(snap, memory_used_bytes=None, memory_free_bytes=None)
    (blind,) = occupancy.cards(infos, [unread], [], {}, ())
    assert blind.other_bytes == 0 and blind.others == (occupancy.UNREAD,)
