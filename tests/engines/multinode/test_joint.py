"""Joint supervision of a model across boxes: the head engine (the FAKE engine, a real
process) with the ranks on other boxes (FakeRanks, standing in for the paired boxes). A rank
that ends ends the head engine's whole process group too, and both come back together; a
preflight failure starts nothing; a stop ends the other ranks."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import psutil

from engines.config.profiles import Profile, profile_from_mapping
from engines.config.sections import EngineSettings
from engines.core.procs import PidRegistry
from engines.errors import PreflightFailed
from engines.events import EngineState
from engines.runtime.supervisor import LogSink, ManagedEngine
from tests.engines.runtime.test_supervisor import RUNTIME, FakeEngineAdapter


class FakeRanks:
    """FAKE other boxes: counts the lives begun and ended; ``fail`` makes the preflight fail,
    ``problem_text`` is what the heartbeat would have found."""

    def __init__(self, profile: Profile, fail: str = "") -> None:
        self.profile = profile
        self.fail = fail
        self.begun = 0
        self.ended = 0
        self.problem_text: str | None = None
        self.lost: str | None = None

    async def begin(self, sink: LogSink) -> Profile:
        if self.fail:
            raise PreflightFailed(self.fail)
        self.begun += 1
        self.problem_text = self.lost
        sink(f"rank 1 started on box-b (life {self.begun})")
        return self.profile

    def problem(self) -> str | None:
        return self.problem_text

    async def end(self) -> None:
        self.ended += 1


def make(tmp_path: Path, fail: str = "") -> tuple[ManagedEngine, FakeRanks]:
    profile = profile_from_mapping(
        "big", {"model": "/m", "served_name": "big", "device": "cpu", "boxes": ["box-b"],
                "pipeline_parallel_size": 2},
    )  # fmt: skip
    ranks = FakeRanks(profile, fail)
    settings = EngineSettings(ready_timeout_s=20, stop_timeout_s=2, restart_backoff_s=0.1,
                              restart_backoff_max_s=0.4, restart_max=2)  # fmt: skip
    engine = ManagedEngine(
        "big", profile=profile, adapter=FakeEngineAdapter(), runtime=RUNTIME, model="/m",
        settings=settings, log_path=tmp_path / "big.log", pids=PidRegistry(tmp_path / "p.json"),
        publish=lambda _: None, ranks=ranks,
    )  # fmt: skip
    return engine, ranks


async def until(condition: object, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_a_rank_that_ends_ends_the_head_and_both_come_back_together(tmp_path: Path) -> None:
    engine, ranks = make(tmp_path)
    await engine.start()
    await engine.wait_ready(20)
    first = engine.pid
    assert first is not None and ranks.begun == 1
    ranks.problem_text = "the rank on box-b ended: exited with code -9"
    await until(lambda: engine.state == EngineState.STARTING)
    assert "the rank on box-b ended" in engine.detail
    await until(lambda: engine.state == EngineState.READY and engine.pid != first)
    assert ranks.begun == 2 and ranks.ended >= 1  # every rank ended, then all began again
    assert not psutil.pid_exists(first) or psutil.Process(first).status() == "zombie"
    assert engine.restarts == 1
    await engine.stop()
    assert ranks.ended >= 2  # a stop ends the other boxes' ranks too
    assert "rank 1 started on box-b (life 2)" in (tmp_path / "big.log").read_text()


async def test_a_failed_preflight_starts_nothing_and_says_which_box(tmp_path: Path) -> None:
    engine, ranks = make(tmp_path, fail="box-b runs vLLM 0.31.0, box-a runs 0.32.0: ...")
    await engine.start()
    await until(lambda: engine.state == EngineState.FAILED)
    assert engine.pid is None and ranks.begun == 0
    assert "box-b runs vLLM 0.31.0" in engine.detail


async def test_a_rank_lost_while_starting_fails_the_start(tmp_path: Path) -> None:
    engine, ranks = make(tmp_path)
    ranks.lost = "box-b stopped answering"  # found as soon as the ranks began
    await engine.start()
    await until(lambda: engine.state == EngineState.FAILED)
    assert "box-b stopped answering" in engine.detail
    assert engine.pid is None and ranks.ended >= 1
