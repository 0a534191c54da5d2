"""The ranks a follower box runs for its head box (engines/multinode/follower.py), each a real
process: a FAKE engine interpreter (a shell script that only sleeps) stands in for vLLM's, the
rest is real: the session, the log, the pid registry, the lease, the group kill."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from packaging.version import Version

from engines.config.profiles import Profile, profile_from_mapping, profile_to_mapping
from engines.core.procs import PidRegistry
from engines.envs.manager import EnvManager, load_flags
from engines.errors import ConfigError, ModelUnavailable
from engines.multinode.follower import FollowerRanks
from engines.runtime.adapters.base import EngineRuntime

FAKE_PYTHON = (
    "#!/bin/sh\n# FAKE engine interpreter: a rank that runs until it is ended\nexec sleep 600\n"
)


def ranks(tmp_path: Path, place: Any = None) -> FollowerRanks:
    python = tmp_path / "fake-python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    runtime = EngineRuntime("vllm", Version("0.32.0"), python, tmp_path, "cpu",
                            load_flags("vllm", "0.32.0"))  # fmt: skip

    async def resolve(profile: Profile) -> tuple[EngineRuntime, str]:
        return runtime, "/m/tiny"

    return FollowerRanks(envs=EnvManager(tmp_path / "envs"), logs_dir=tmp_path / "logs",
                         pids=PidRegistry(tmp_path / "pids.json"), box_name=lambda: "box-b",
                         resolve=resolve, place=place)  # fmt: skip


def request(lease_s: float) -> dict[str, Any]:
    profile = profile_from_mapping("big", {"model": "/m/tiny", "device": "cpu",
                                           "boxes": ["box-b"], "pipeline_parallel_size": 2})  # fmt: skip
    plan = {"nnodes": 2, "node_rank": 1, "master_addr": "127.0.0.1", "master_port": 29511}
    return {"engine_id": "big", "profile": profile_to_mapping(profile), "plan": plan,
            "lease_s": lease_s}  # fmt: skip


async def ended(follower: FollowerRanks, rank_id: str, timeout_s: float = 10) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while (state := follower.status(rank_id))["state"] == "running":
        assert time.monotonic() < deadline, state
        await asyncio.sleep(0.05)
    return state


def gone(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


async def test_a_rank_starts_headless_on_the_interface_and_stops_whole(tmp_path: Path) -> None:
    follower = ranks(tmp_path)
    started = await follower.start("box-a", request(lease_s=60))
    assert started["rank_id"] == "box-a.big" and started["interface"] == "lo"
    pid = started["pid"]
    assert follower.status("box-a.big")["state"] == "running"
    assert follower.running() == [{"rank_id": "box-a.big", "pid": pid}]
    assert "box-a.big" in PidRegistry(tmp_path / "pids.json").read()  # the reaper's record
    log = (tmp_path / "logs" / "engines" / "box-a.big.log").read_text()
    assert "--headless" in log and "--node-rank 1" in log and "interface lo (127.0.0.1)" in log
    assert await follower.stop("box-a.big")
    assert gone(pid) and follower.running() == []
    assert "box-a.big" not in PidRegistry(tmp_path / "pids.json").read()


async def test_a_rank_whose_head_stops_asking_ends_itself(tmp_path: Path) -> None:
    follower = ranks(tmp_path)
    pid = (await follower.start("box-a", request(lease_s=1)))["pid"]
    deadline = time.monotonic() + 10
    while not gone(pid):  # nobody asks: the lease lapses
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    state = await ended(follower, "box-a.big")
    assert state["state"] == "ended" and "box-a stopped asking about rank box-a.big" in state["why"]
    await follower.stop_all()


@pytest.mark.parametrize(
    ("sig", "why"),
    [(signal.SIGKILL, "exited with code -9"), (signal.SIGSTOP, "are stopped (SIGSTOP)")],
)
async def test_a_rank_that_dies_or_hangs_is_ended_and_reported(
    tmp_path: Path, sig: signal.Signals, why: str
) -> None:
    follower = ranks(tmp_path)
    pid = (await follower.start("box-a", request(lease_s=60)))["pid"]
    os.kill(pid, sig)
    state = await ended(follower, "box-a.big")
    assert why in state["why"] and "box-b" in state["why"]
    assert gone(pid)
    await follower.stop_all()


async def test_a_rank_that_does_not_fit_starts_nothing(tmp_path: Path) -> None:
    async def full(profile: Profile) -> Profile:
        raise ModelUnavailable(
            f"{profile.name} needs 40 GiB of host RAM but 2 GiB is free",
            code="insufficient_gpu_memory",
        )

    follower = ranks(tmp_path, place=full)
    with pytest.raises(ModelUnavailable, match="box-a.big needs 40 GiB"):
        await follower.start("box-a", request(lease_s=60))
    assert follower.running() == [] and PidRegistry(tmp_path / "pids.json").read() == {}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"trust_remote_code": True}, "does not run that for another box"),
        ({"env": {"LD_PRELOAD": "/tmp/x.so"}}, "sets LD_PRELOAD for the engine"),
    ],
)
async def test_a_head_cannot_make_this_box_run_code_it_did_not_choose(
    tmp_path: Path, fields: dict[str, Any], message: str
) -> None:
    follower = ranks(tmp_path)
    body = request(lease_s=60)
    body["profile"] = {**body["profile"], **fields}
    with pytest.raises(ConfigError, match=message):
        await follower.start("box-a", body)
    assert follower.running() == []
