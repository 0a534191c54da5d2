"""`traylm models ...` as a user runs it: a real subprocess talking to the real daemon."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from tests.conftest import RunningDaemon
from tests.fakes.hub_server import FakeHub

REPO = "traylm-test/tiny-llama"


async def traylm(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("traylm")),
        "models",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=dict(os.environ),
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


@pytest.mark.slow
async def test_models_commands_end_to_end(hub_daemon: RunningDaemon, fake_hub: FakeHub) -> None:
    code, out = await traylm("search", "tiny")
    assert code == 0 and REPO in out

    code, out = await traylm("info", REPO)
    assert code == 0 and "LlamaForCausalLM" in out and "kv heads 2" in out
    assert "skipped: pytorch_model.bin (pickle weights are never fetched)" in out

    code, out = await traylm("fit", REPO, "--context", "2048", "--concurrency", "4")
    assert code == 0 and out.count("FITS") == 4 and "trtllm" in out

    code, out = await traylm("pull", REPO)
    assert code == 0, out
    assert "100.0%" in out and "ready: all 8 files match the Hub's hashes" in out
    assert "snapshot: " in out

    code, out = await traylm("ls")
    assert code == 0 and REPO in out and "verified" in out and "engines vllm,trtllm" in out

    code, out = await traylm("verify", REPO)
    assert code == 0 and ": verified" in out

    code, out = await traylm("downloads")
    assert code == 0 and "ready" in out

    code, out = await traylm("rm", REPO)
    assert code == 0 and "freed" in out
    code, out = await traylm("ls")
    assert "no models in the Hugging Face cache" in out


async def test_bad_input_gets_one_line_that_says_what_to_do(
    hub_daemon: RunningDaemon, fake_hub: FakeHub
) -> None:
    code, out = await traylm("pull", "../../etc/passwd")
    assert code == 1 and out.startswith("traylm: ") and "org/name" in out
    assert "Traceback" not in out
    code, out = await traylm("info", "traylm-test/tiny-lama")
    assert code == 1 and "did you mean traylm-test/tiny-llama?" in out
    code, out = await traylm("cancel", "nope")
    assert code == 1 and "traylm models downloads" in out


async def test_ctrl_c_in_pull_pauses_the_download(
    hub_daemon: RunningDaemon, fake_hub: FakeHub
) -> None:
    """The follower's Ctrl-C (engines/client/follow.py) for a download is a pause: the download
    stays, paused, and `traylm models resume ID` goes on from there."""
    import signal

    from engines.events import DownloadProgress, DownloadState

    fake_hub.faults.throttle(256 * 1024, "/cdn/*")  # slow enough to be caught mid-way
    with hub_daemon.daemon.bus.subscribe(frozenset({"download.progress"})) as sub:
        proc = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).with_name("traylm")),
            *("models", "pull", REPO),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=dict(os.environ),
        )
        try:
            while True:  # the worker downloads, and the CLI follows it from its start
                event = await asyncio.wait_for(sub.get(), 60)
                if isinstance(event, DownloadProgress) and event.done_bytes > 0:
                    break
            proc.send_signal(signal.SIGINT)
            out, _ = await asyncio.wait_for(proc.communicate(), 60)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert proc.returncode == 130, out.decode()
    [status] = await hub_daemon.client.downloads()
    assert status.state == DownloadState.PAUSED
    assert f"`traylm models resume {status.id}` goes on from there" in out.decode()
