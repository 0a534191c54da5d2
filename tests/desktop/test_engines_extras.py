"""The Engines page's second round against a real daemon: installing an engine from the dashboard
with its progress (a tiny local package stands in for vLLM's wheels, as in
tests/engines/gateway/test_daemon_gateway.py), a TensorRT-LLM build's progress and the engine cache with
the FAKE TensorRT-LLM tools on two SIMULATED GPUs, and the remote fallback shown on the page and
in the tray (a second FAKE OpenAI server plays the remote API)."""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from desktop.app import DesktopApp
from desktop.dashboard.engines_page import EnginesPage
from engines.config.sections import Paths, RemoteSettings
from engines.core.procs import free_loopback_port
from engines.events import TRTBuildProgress
from tests.desktop.conftest import AppFactory, ThreadedDaemon, sim_settings
from tests.fakes.fake_trt_env import make_fake_trtllm_env, make_tiny_hf_model

ROOT = Path(__file__).resolve().parents[2]


def _engines_page(app: DesktopApp, tab: str) -> EnginesPage:
    page = app.open_dashboard("engines").page("engines")
    assert isinstance(page, EnginesPage)
    titles = [page.tabs.tabText(i) for i in range(page.tabs.count())]
    page.tabs.setCurrentIndex(titles.index(tab))
    return page


@pytest.mark.slow
def test_install_an_engine_from_the_dashboard_with_progress(
    qtbot, app: DesktopApp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engines.envs.manager import RECIPES, EngineRecipe

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "setup.py").write_text("from setuptools import setup; setup(name='p', version='1')")
    recipe = EngineRecipe("vllm", "cpu", "0.0.9", str(pkg), import_check="print('ok')",
                          probe_flags=False, extra_index_urls=())  # fmt: skip
    monkeypatch.setitem(RECIPES, ("vllm", "cpu"), recipe)
    page = _engines_page(app, "Environments")
    envs = page.envs
    qtbot.waitUntil(lambda: envs.table.rowCount() == 1, timeout=5000)  # the FAKE env
    envs.engine.setCurrentIndex(envs.engine.findData("vllm"))
    envs.device.setCurrentIndex(envs.device.findData("cpu"))
    envs.install_button.click()
    assert not envs.install_button.isEnabled()
    qtbot.waitUntil(lambda: "[create]" in envs.install_log.toPlainText(), timeout=30000)
    assert "creating the virtual environment" in envs.install_bar.format()
    qtbot.waitUntil(lambda: envs.install_status.state in ("ok", "error"), timeout=180000)
    assert envs.install_status.state == "ok", envs.install_log.toPlainText()
    log = envs.install_log.toPlainText()
    assert "[install]" in log and "[probe]" in log and "[done]" in log
    assert envs.install_bar.value() == envs.install_bar.maximum()
    assert envs.install_button.isEnabled()
    qtbot.waitUntil(lambda: envs.table.rowCount() == 2, timeout=10000)
    names = {envs.table.item(r, 0).text() for r in range(2)}
    assert "vllm-0.0.9-cpu" in names


def test_install_refusal_is_shown(qtbot, app: DesktopApp) -> None:
    envs = _engines_page(app, "Environments").envs
    envs.engine.setCurrentIndex(envs.engine.findData("sglang"))
    envs.device.setCurrentIndex(envs.device.findData("cpu"))
    envs.install_button.click()
    qtbot.waitUntil(lambda: envs.install_status.state == "error", timeout=5000)
    assert "cannot install 'sglang' for cpu" in envs.install_status.message
    assert envs.install_button.isEnabled()


@pytest.fixture
def trt_daemon(paths: Paths, fake_env: Path) -> Iterator[ThreadedDaemon]:
    make_fake_trtllm_env(paths.envs_dir)
    d = ThreadedDaemon(paths, sim_settings()).start()
    yield d
    d.stop()


@pytest.mark.slow
def test_trt_build_progress_then_the_cache(
    qtbot, trt_daemon: ThreadedDaemon, app_factory: AppFactory, tmp_path: Path
) -> None:
    app = app_factory()
    model = make_tiny_hf_model(tmp_path / "models" / "tiny-llama")
    trt_daemon.write_profile(
        "built", engine="trtllm", device="cuda", served_name="built", model=str(model),
        mode="build", quant_recipe="fp8", kv_cache_dtype="fp8", gpus=[0, 1],
        tensor_parallel_size=2, max_batch_size=4, max_model_len=2048,
    )  # fmt: skip
    page = _engines_page(app, "TensorRT-LLM")
    trt = page.trt
    qtbot.waitUntil(lambda: trt.table.rowCount() == 0 and "No TensorRT" in trt.detail.text())
    app.actions.reload_profiles()
    qtbot.waitUntil(lambda: app.state.profile("built") is not None)
    shown: list[tuple[str, int, str]] = []  # what the build's bar said while it ran

    def on_event(event: object) -> None:
        if isinstance(event, TRTBuildProgress) and "built" in trt.bars:
            shown.append((event.state, trt.bars["built"].value(), trt.bars["built"].format()))

    app.state.event_received.connect(on_event)
    app.actions.start_profile("built")
    qtbot.waitUntil(lambda: "built" in trt.bars, timeout=30000)
    qtbot.waitUntil(lambda: "built" in app.state.served_models(), timeout=60000)
    running = [s for s in shown if s[0] == "running"]
    assert running and "step 1/2 quantize" in running[0][2] and running[0][1] < 1000
    assert any("step 2/2 build" in s[2] and s[1] >= 500 for s in running)
    assert trt.builds["built"].state == "done"
    assert trt.bars["built"].value() == 1000 and "build done after" in trt.bars["built"].format()
    qtbot.waitUntil(lambda: trt.table.rowCount() == 1, timeout=10000)
    assert trt.table.item(0, 1).text() == "fp8" and trt.table.item(0, 2).text() == "2 × 1"
    qtbot.waitUntil(lambda: trt.table.item(0, 6).text() == "built", timeout=10000)
    assert not trt.remove_button.isEnabled()
    assert "stop it first" in trt.remove_button.toolTip()
    assert "tensorrt_llm 1.2.1" in trt.detail.text()
    app.actions.stop_engine("built")
    qtbot.waitUntil(lambda: "built" not in app.state.served_models(), timeout=20000)
    qtbot.waitUntil(lambda: trt.table.item(0, 6).text() == "–", timeout=10000)
    trt.table.selectRow(0)
    assert trt.remove_button.isEnabled()
    trt.remove_button.click()
    qtbot.waitUntil(lambda: trt.table.rowCount() == 0, timeout=10000)
    assert trt.result.state == "ok" and not trt_daemon.run(lambda c: c.trt_cache())
    trt.result.neutral("")
    trt.prune_stale.click()  # compared with the (FAKE) installed TensorRT-LLM and GPUs
    qtbot.waitUntil(lambda: trt.result.state == "ok", timeout=10000)
    assert trt.result.message == "Removed 0 engines (0 B)."
    assert trt.budget.value() == 200  # trt.cache_budget_gib


@pytest.fixture
def remote_server() -> Iterator[int]:
    """A FAKE OpenAI server (tests/fakes/openai_engine.py) standing in for a remote API."""
    port = free_loopback_port()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests/fakes/openai_engine.py"), "--port", str(port),
         "--served-model-name", "far-model"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "remote did not start"
            time.sleep(0.05)
    yield port
    proc.terminate()
    proc.wait(10)


def test_remote_fallback_on_the_page_and_in_the_tray(
    qtbot, paths: Paths, fake_env: Path, app_factory: AppFactory, remote_server: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("TRAYLM_REMOTE_API_KEY", "sk-test")
    remote = RemoteSettings(
        enabled=True, base_url=f"http://127.0.0.1:{remote_server}/v1", aliases=("far-model",)
    )
    d = ThreadedDaemon(paths, dataclasses.replace(sim_settings(), remote=remote)).start()
    try:
        app = app_factory()
        page = _engines_page(app, "Engines")
        assert "Remote fallback: ON" in page.remote.text() and "far-model" in page.remote.text()
        assert "0 requests sent there" in page.remote.text()
        assert "Remote fallback: ON" in app.tray.icon.toolTip()
        app.tray.menu.aboutToShow.emit()
        assert app.tray.remote_action.isVisible()
        body = b'{"model": "far-model", "messages": [], "max_tokens": 3}'
        request = urllib.request.Request(
            f"{d.url}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request) as resp:
            assert resp.headers["X-Traylm-Route"] == "remote"
        qtbot.waitUntil(lambda: "1 requests sent there" in page.remote.text(), timeout=10000)
        assert "1 requests sent there" in app.tray.icon.toolTip()
    finally:
        app.shutdown()
        d.stop()
