"""The Models page against a real daemon whose REAL huggingface_hub client talks to the FAKE Hub
on loopback (tests/fakes/hub_server.py): search with filters, details and fit badges on one and
two (simulated) GPUs, a throttled download whose progress, pause, resume and cancel show up
live, the library with verify/delete and its served-by protection, and the per-model consent to
run a model's own code."""

from __future__ import annotations

import dataclasses
import json

import pytest

from desktop.app import DesktopApp
from desktop.daemon.notify import Notification
from desktop.dashboard.models_page import ModelsPage
from engines.core.procs import free_loopback_port
from engines.events import DownloadState
from tests.conftest import fast_settings
from tests.desktop.conftest import ThreadedDaemon, fast_hub
from tests.fakes.hub_server import FakeHub, bytes_file, tiny_llama_repo

TINY, BIG, CUSTOM = "traylm-test/tiny-llama", "traylm-test/big-llama", "traylm-test/custom"


@pytest.fixture
def app(hub_daemon_thread: ThreadedDaemon, app_factory) -> DesktopApp:  # type: ignore[no-untyped-def]
    return app_factory()


def _models_page(app: DesktopApp) -> ModelsPage:
    page = app.open_dashboard("models").page("models")
    assert isinstance(page, ModelsPage)
    return page


def _search(qtbot, page: ModelsPage, query: str, quant: str = "any") -> list[str]:
    search = page.search
    search.query.setText(query)
    search.quant.setCurrentText(quant)
    search.status.neutral("")
    search.search_button.click()
    qtbot.waitUntil(lambda: search.status.message.endswith("models"), timeout=10000)
    return [m.repo_id for m in search.results]


def _select(qtbot, page: ModelsPage, repo: str) -> None:
    search = page.search
    search.table.selectRow([m.repo_id for m in search.results].index(repo))
    qtbot.waitUntil(lambda: search.pull_button.isEnabled(), timeout=10000)


def test_search_filters_details_and_fit_badges(qtbot, app, fake_hub: FakeHub) -> None:
    fake_hub.add_repo(tiny_llama_repo("traylm-test/tiny-llama-awq", downloads=5,
                                      tags=("transformers", "text-generation", "awq")))  # fmt: skip
    page = _models_page(app)
    qtbot.waitUntil(lambda: "Hub: http://127.0.0.1" in page.search.access.text(), timeout=5000)
    assert "no token" in page.search.access.text()
    assert set(_search(qtbot, page, "tiny")) == {TINY, "traylm-test/tiny-llama-awq"}
    assert _search(qtbot, page, "tiny", quant="awq") == ["traylm-test/tiny-llama-awq"]
    assert page.search.table.item(0, 3).text() == "awq"
    _search(qtbot, page, "tiny")
    _select(qtbot, page, TINY)
    info = page.search.info.text()
    assert "LlamaForCausalLM" in info and "4,096 tokens" in info and "apache-2.0" in info
    fit = page.search.fit
    qtbot.waitUntil(lambda: len(fit.badges) == 4, timeout=10000)
    assert set(fit.badges) == {("vllm", 1), ("vllm", 2), ("trtllm", 1), ("trtllm", 2)}
    assert all(b.property("verdict") == "fits" for b in fit.badges.values())
    assert "RTX 4090" in fit.grid.itemAtPosition(0, 1).widget().text()
    assert "(example)" not in fit.grid.itemAtPosition(0, 1).widget().text()
    assert "Fits every engine" in fit.fixes.text()


def test_without_a_gpu_the_fit_badges_say_they_are_an_example(
    qtbot, paths, fake_env, fake_hub: FakeHub, app_factory
) -> None:
    """On a computer without NVIDIA the daemon judges a model on two
    RTX 4090s, and the page read as if this computer had them."""
    settings = dataclasses.replace(fast_settings(free_loopback_port()), hub=fast_hub())
    d = ThreadedDaemon(paths, settings).start()
    try:
        app = app_factory()
        qtbot.waitUntil(lambda: app.state.gpu.overview is not None, timeout=5000)
        page = _models_page(app)
        _search(qtbot, page, "tiny")
        _select(qtbot, page, TINY)
        fit = page.search.fit
        qtbot.waitUntil(lambda: len(fit.badges) == 4, timeout=10000)
        head = fit.grid.itemAtPosition(0, 1).widget().text()
        assert head == "<b>1 × NVIDIA GeForce RTX 4090</b> (example)"
        assert "This computer has no NVIDIA GPU" in fit.fixes.text()
        app.shutdown()
    finally:
        d.stop()
    assert page.search.pull_button.text().startswith("Download ")
    assert not page.search.trust.isVisibleTo(page)  # a plain Llama needs no code of its own


@pytest.mark.slow
def test_download_progress_pause_resume_and_finish(qtbot, app, fake_hub: FakeHub) -> None:
    fake_hub.add_repo(tiny_llama_repo(BIG, weight_bytes=32 << 20))
    fake_hub.faults.throttle(6e6, "/cdn/*")
    notes: list[Notification] = []
    app.notifier.notified.connect(notes.append)
    page = _models_page(app)
    _search(qtbot, page, "big")
    _select(qtbot, page, BIG)
    page.search.pull_button.click()
    qtbot.waitUntil(lambda: page.search.result.state == "ok", timeout=10000)
    downloads = page.downloads
    page.tabs.setCurrentWidget(downloads)
    qtbot.waitUntil(lambda: bool(downloads.rows) and downloads.downloads[downloads.rows[0]].state
                    == DownloadState.DOWNLOADING, timeout=10000)  # fmt: skip
    download_id = downloads.rows[0]
    bar = downloads.table.cellWidget(0, 2)
    qtbot.waitUntil(lambda: 0 < bar.value() < 1000, timeout=15000)
    qtbot.waitUntil(lambda: downloads.table.item(0, 4).text().endswith("/s"), timeout=5000)
    assert " of 33.6 MB" in downloads.table.item(0, 3).text()
    assert downloads.table.item(0, 6).text().endswith(".safetensors")
    assert downloads.table.item(0, 5).text() != "–"  # an ETA
    downloads.table.selectRow(0)
    assert downloads.pause_button.isEnabled()
    downloads.pause_button.click()
    qtbot.waitUntil(lambda: downloads.table.item(0, 1).text() == "paused", timeout=10000)
    assert "starts again from its beginning" in downloads.note.text()
    assert downloads.resume_button.isEnabled() and not downloads.pause_button.isEnabled()
    fake_hub.faults.throttle(None)
    downloads.resume_button.click()
    qtbot.waitUntil(lambda: downloads.table.item(0, 1).text() == "ready", timeout=60000)
    assert bar.value() == 1000
    qtbot.waitUntil(lambda: any(n.title == "Download finished" for n in notes), timeout=5000)
    note = next(n for n in notes if n.title == "Download finished")
    assert BIG in note.message and "verified" in note.message
    library = page.library
    qtbot.waitUntil(lambda: any(m.repo_id == BIG for m in library.models), timeout=10000)
    [model] = [m for m in library.models if m.repo_id == BIG]
    assert model.verified == "verified" and download_id


def test_cancel_removes_what_the_download_added(qtbot, app, fake_hub, hub_daemon_thread) -> None:
    fake_hub.add_repo(tiny_llama_repo(BIG, weight_bytes=32 << 20))
    fake_hub.faults.throttle(4e6, "/cdn/*")
    page = _models_page(app)
    page.tabs.setCurrentWidget(page.downloads)
    status = hub_daemon_thread.run(lambda c: c.pull(BIG))
    downloads = page.downloads
    qtbot.waitUntil(lambda: status.id in downloads.rows and
                    downloads.downloads[status.id].done_bytes > 0, timeout=15000)  # fmt: skip
    downloads.table.selectRow(downloads.rows.index(status.id))
    downloads.cancel_button.click()
    row = downloads.rows.index(status.id)
    qtbot.waitUntil(lambda: downloads.table.item(row, 1).text() == "cancelled", timeout=10000)
    assert not downloads.cancel_button.isEnabled() and not downloads.resume_button.isEnabled()
    assert hub_daemon_thread.run(lambda c: c.local_models()) == []


def test_library_verify_delete_and_served_by_protection(
    qtbot, app, hub_daemon_thread: ThreadedDaemon
) -> None:
    d = hub_daemon_thread
    status = d.run(lambda c: c.pull(TINY))
    page = _models_page(app)
    library = page.library
    page.show_library()
    qtbot.waitUntil(lambda: [m.repo_id for m in library.models] == [TINY], timeout=30000)
    assert status.repo_id == TINY
    library.table.selectRow(0)
    library.verify_button.click()
    qtbot.waitUntil(lambda: library.result.state == "ok", timeout=20000)
    assert "every file matches" in library.result.message
    d.write_profile("tiny", model=TINY, served_name="tiny", device="cpu", env={})
    app.actions.reload_profiles()
    app.actions.start_profile("tiny")
    qtbot.waitUntil(lambda: "tiny" in app.state.served_models(), timeout=20000)
    qtbot.waitUntil(lambda: bool(library.models) and library.models[0].served_by == ("tiny",))
    assert library.table.item(0, 5).text() == "tiny" and library.table.item(0, 6).text() == "tiny"
    assert not library.delete_button.isEnabled()
    assert "served by tiny: stop that engine first" in library.delete_button.toolTip()
    app.actions.stop_engine("tiny")
    qtbot.waitUntil(lambda: library.delete_button.isEnabled(), timeout=20000)
    asked: list[str] = []
    library.confirm = lambda text: asked.append(text) or True
    library.delete_button.click()
    qtbot.waitUntil(lambda: library.result.state == "ok" and not library.models, timeout=10000)
    assert "Delete traylm-test/tiny-llama" in asked[0]


def test_consent_to_run_a_models_own_code(qtbot, app, fake_hub, hub_daemon_thread) -> None:
    config = json.loads(fake_hub.repos[TINY].files["config.json"].read(0, 10_000))
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_tiny.TinyForCausalLM"}
    code = {
        "config.json": bytes_file("config.json", json.dumps(config).encode()),
        "modeling_tiny.py": bytes_file("modeling_tiny.py", b"import os\n"),
    }
    fake_hub.add_repo(tiny_llama_repo(CUSTOM, extra=code))
    page = _models_page(app)
    _search(qtbot, page, "custom")
    _select(qtbot, page, CUSTOM)
    search = page.search
    assert "ships its own Python code" in search.info.text()
    assert search.trust.isVisibleTo(page) and not search.trust.isChecked()
    assert all(f.kind != "code" for f in search.details.files)
    search.trust.setChecked(True)
    qtbot.waitUntil(lambda: search.details is not None and any(
        f.kind == "code" for f in search.details.files), timeout=10000)  # fmt: skip
    assert search.trust.isChecked()  # remembered for a model that is not downloaded yet
    status = hub_daemon_thread.run(lambda c: c.pull(CUSTOM))
    library = page.library
    qtbot.waitUntil(lambda: any(m.repo_id == CUSTOM for m in library.models), timeout=30000)
    library.table.selectRow(0)
    assert library.table.item(0, 8).text() == "allowed" and library.trust.isChecked()
    library.trust.setChecked(False)
    qtbot.waitUntil(lambda: bool(library.models) and not library.models[0].trust_remote_code)
    assert library.table.item(0, 8).text() == "not allowed" and status.repo_id == CUSTOM
