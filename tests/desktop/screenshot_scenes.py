"""The second round's scenes for tests/desktop/screenshots.py: the GPUs page on live SIMULATED
GPUs, Fans & power, the Models page on the FAKE Hub, Benchmarks, TensorRT-LLM, engine install
progress, and the tray's hot state.

Most scenes run against the daemon process of the screenshot session (`python -m engines serve`
with `gpu.simulate_gpus = 2`). The live-GPU scenes then restart the daemon in this process
(tests/desktop/threaded_daemon.py, same TRAYLM_HOME) so the simulator can be given load, a
power limit and a forced temperature: the daemon has no API for that, only tests do.
"""

from __future__ import annotations

import contextlib
import json
import struct
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.fakes.hub_server import FakeFile, FakeHub, FakeRepo, bytes_file, tiny_llama_repo

NO_GPU_CONFIG = "\n[hub]\nmin_free_gib = 0.0\nparallel_files = 1\n"
HUB_CONFIG = "\n[gpu]\nsimulate_gpus = 2\n" + NO_GPU_CONFIG
TRT_PROFILE = """model = "{model}"
engine = "trtllm"
device = "cuda"
served_name = "llama-trt"
description = "TensorRT-LLM engine build (FAKE tools), FP8, TP 2"
mode = "build"
quant_recipe = "fp8"
kv_cache_dtype = "fp8"
gpus = [0, 1]
tensor_parallel_size = 2
max_batch_size = 4
max_model_len = 2048
"""


def call(app: Any, fn: Callable[[Any], Any], timeout_s: float = 60.0) -> Any:
    """Run ``fn(client)`` through the app's bridge and wait for its value."""
    from tests.desktop.screenshots import wait_for

    box: list[Any] = []
    app.bridge.call(fn, box.append)
    wait_for(lambda: box, timeout_s, "a daemon call")
    if not box[0].ok:
        raise RuntimeError(box[0].error)
    return box[0].value


# --------------------------------------------------------------------------- the FAKE Hub


def metadata_only_safetensors(
    path: str, tensors: dict[str, tuple[str, tuple[int, ...]]]
) -> FakeFile:
    """FAKE: a safetensors file whose header is real (parameter counts for the fit estimator)
    and whose data is zeros with a made-up hash: for search and details only, never downloaded
    (70B parameters could not be hashed here)."""
    sizes = {"BF16": 2, "F16": 2, "I32": 4}
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for dim in shape:
            n *= dim
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    prefix = struct.pack("<Q", len(raw)) + raw
    size = len(prefix) + offset

    def read(off: int, length: int) -> bytes:
        length = max(0, min(length, size - off))
        head = prefix[off : off + length] if off < len(prefix) else b""
        return head + bytes(length - len(head))

    return FakeFile(path, size, True, read, "0" * 64, "0" * 40)


def llama_70b(repo_id: str, *, awq: bool = False, **kw: Any) -> FakeRepo:
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
        "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
        "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
        "max_position_embeddings": 131072, "torch_dtype": "bfloat16",
    }  # fmt: skip
    if awq:
        config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 128}
        tensors = {"qweight": ("I32", (70_000_000_000 // 8 // 8192, 8192)),
                   "scales": ("F16", (70_000_000_000 // 128 // 8192, 8192))}  # fmt: skip
    else:
        tensors = {"weight": ("BF16", (70_000_000_000 // 8192, 8192))}
    weights = metadata_only_safetensors("model-00001-of-00001.safetensors", tensors)
    index = {"metadata": {"total_size": weights.size},
             "weight_map": {n: weights.path for n in tensors}}  # fmt: skip
    files = {
        "config.json": bytes_file("config.json", json.dumps(config).encode()),
        "generation_config.json": bytes_file("generation_config.json", b"{}"),
        "tokenizer.json": bytes_file("tokenizer.json", b'{"version": "1.0"}'),
        "tokenizer_config.json": bytes_file("tokenizer_config.json", b"{}"),
        "model.safetensors.index.json": bytes_file(
            "model.safetensors.index.json", json.dumps(index).encode()
        ),
        weights.path: weights,
    }
    tags = ("transformers", "safetensors", "text-generation", *(("awq",) if awq else ()))
    return FakeRepo(repo_id, files, tags=tags, license="llama3.3", **kw)


def start_hub() -> FakeHub:
    hub = FakeHub(page_size=50).start()
    for repo in (
        "Qwen/Qwen2.5-0.5B-Instruct",
        "Qwen/Qwen2.5-1.5B-Instruct",
        "HuggingFaceTB/SmolLM2-1.7B-Instruct",
    ):  # the setup's CPU starters
        hub.add_repo(tiny_llama_repo(repo, weight_bytes=8 << 20))  # fmt: skip
    hub.add_repo(tiny_llama_repo("traylm-demo/tiny-llama-chat", downloads=15_200, likes=87))
    hub.add_repo(tiny_llama_repo("traylm-demo/llama-mini-1b", weight_bytes=160 << 20,
                                 downloads=48_000, likes=310))  # fmt: skip
    hub.add_repo(llama_70b("traylm-demo/Llama-3.3-70B-Instruct", downloads=1_250_000,
                           likes=2_400))  # fmt: skip
    hub.add_repo(tiny_llama_repo("traylm-demo/llama-gated-8b", gated="manual", downloads=900))
    hub.add_repo(llama_70b("traylm-demo/Llama-3.3-70B-Instruct-AWQ", awq=True,
                           downloads=410_000, likes=380))  # fmt: skip
    return hub


# --------------------------------------------------------------------------- scenes


def models_tabs(s: Any, dash: Any, page: Any) -> None:
    from tests.desktop.screenshots import wait_for

    app, hub = s.app, s.hub
    call(app, lambda c: c.pull("traylm-demo/tiny-llama-chat"))
    wait_for(lambda: any(m.repo_id == "traylm-demo/tiny-llama-chat"
                         for m in page.library.models), 60, "library")  # fmt: skip
    hub.faults.throttle(2.5e6, "/cdn/*")
    call(app, lambda c: c.pull("traylm-demo/llama-mini-1b"))
    search = page.search
    search.query.setText("llama")
    search.search_button.click()
    wait_for(lambda: len(search.results) >= 4, 20, "search results")
    repos = [m.repo_id for m in search.results]
    search.table.selectRow(repos.index("traylm-demo/Llama-3.3-70B-Instruct"))
    wait_for(lambda: len(search.fit.badges) == 4 and search.details is not None, 20, "fit")
    page.tabs.setCurrentWidget(search)
    s.shot(dash, "dashboard-models-search")
    search.table.selectRow(repos.index("traylm-demo/Llama-3.3-70B-Instruct-AWQ"))
    wait_for(lambda: len(search.fit.badges) == 4 and search.details is not None
             and search.details.repo_id.endswith("AWQ"), 20, "fit AWQ")  # fmt: skip
    s.shot(dash, "dashboard-models-search-awq")
    downloads = page.downloads
    page.tabs.setCurrentWidget(downloads)
    wait_for(lambda: any(d.done_bytes > 20 << 20 and d.state == "downloading"
                         for d in downloads.downloads.values()), 60, "a download")  # fmt: skip
    downloads.table.selectRow(0)
    s.shot(dash, "dashboard-models-downloads")
    downloads.pause_button.click()
    wait_for(lambda: downloads.table.item(0, 1).text() == "paused", 20, "paused")
    s.shot(dash, "dashboard-models-downloads-paused")
    hub.faults.throttle(None)
    page.show_library()
    page.library.table.selectRow(0)
    page.folders.add_folder(str(s.model))  # a model folder on this computer
    wait_for(lambda: page.folders.table.rowCount() == 1, 20, "folder")
    page.folders.table.selectRow(0)
    s.shot(dash, "dashboard-models-library")
    downloads.resume_button.click()


def bench_scene(s: Any, dash: Any, page: Any) -> None:
    from engines.events import BenchConfig
    from tests.desktop.screenshots import wait_for

    app = s.app
    for name, levels in (("baseline", (1, 4)), ("more requests", (1, 4, 8))):
        config = BenchConfig(model="qwen-tiny", concurrency=levels, output_len=32, input_len=64,
                             requests=8, name=name)  # fmt: skip
        run = call(app, lambda c, cfg=config: c.bench_start(cfg))
        wait_for(lambda r=run: page.running is None and any(
            x.id == r.id and x.state != "running" for x in page.summaries), 120, "bench")  # fmt: skip
    page.reload()
    wait_for(lambda: len(page.summaries) >= 2, 20, "runs")
    page.table.selectRow(0)
    wait_for(lambda: page.results.table.rowCount() >= 3, 20, "results")
    s.shot(dash, "dashboard-bench")
    from PySide6.QtCore import QItemSelectionModel

    flags = QItemSelectionModel.SelectionFlag.Select | QItemSelectionModel.SelectionFlag.Rows
    page.table.selectionModel().select(page.table.model().index(1, 0), flags)
    page.compare_button.click()
    wait_for(lambda: len(page.results.runs) == 2, 20, "compare")
    s.shot(dash, "dashboard-bench-compare")


def fans_scene(s: Any, dash: Any, page: Any) -> None:
    from tests.desktop.screenshots import wait_for

    view = page.fans
    wait_for(lambda: view.preset_picker.count() > 0 and view.status is not None, 20, "presets")
    view.preset_picker.setCurrentText("balanced")
    view.on_load_preset_clicked()
    wait_for(lambda: view.validation.state == "ok", 20, "validation")
    wait_for(lambda: page.guard.status is not None, 20, "guard")
    s.shot(dash, "dashboard-fans")
    for index, name in ((1, "power"), (2, "guard")):
        page.tabs.setCurrentIndex(index)
        s.shot(dash, f"dashboard-fans-{name}")
    page.tabs.setCurrentIndex(0)
    editor = view.editor
    editor.points[0] = (40.0, 12.0)  # as if dragged below the fan floor
    editor.curve_edited.emit(editor.curve_points())
    view.on_curve_edited()
    wait_for(lambda: view.validation.state == "error", 20, "refusal")
    s.shot(dash, "dashboard-fans-invalid-curve")
    view.on_load_preset_clicked()
    wait_for(lambda: view.validation.state == "ok", 20, "valid again")


def trt_tab(s: Any, page: Any) -> None:
    from tests.desktop.screenshots import wait_for

    app = s.app
    app.actions.start_profile("llama-trt-fp8")
    wait_for(lambda: "llama-trt" in app.state.served_models(), 120, "TensorRT engine built")
    page.trt.reload()
    wait_for(lambda: page.trt.table.rowCount() == 1 and page.trt.table.item(0, 6).text()
             == "llama-trt-fp8", 20, "the cache")  # fmt: skip
    page.trt.table.selectRow(0)


# --------------------------------------------------------------------------- live GPUs


def request_loop(port: int, model: str, stop: threading.Event) -> None:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 24}).encode()  # fmt: skip
    while not stop.is_set():
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        urllib.request.urlopen(req).read()
        stop.wait(0.3)


def live_gpu_scenes(s: Any, home: Path) -> None:
    """The daemon in this process on SIMULATED GPUs under load; the tray app attached to it."""
    from desktop.app import DesktopApp
    from desktop.daemon.messages import LinkState
    from desktop.tray.icons import TrayState
    from engines.config.sections import load_settings
    from engines.events import EngineState
    from engines.gpu.sim import sim_uuid
    from tests.desktop.screenshots import settle, wait_for
    from tests.desktop.threaded_daemon import ThreadedDaemon

    d = ThreadedDaemon(s.paths, load_settings(s.paths.config_file)).start()
    sim = d.feature("gpu").backend
    gpu0, gpu1 = sim_uuid(0), sim_uuid(1)
    sim.set_load(gpu0, 0.92, memory_used_bytes=21 << 30)
    sim.set_load(gpu1, 0.45, memory_used_bytes=9 << 30)
    d.run(lambda c: c.set_power_limit(gpu1, watts=300))
    app = DesktopApp(s.paths, spawn_daemon=False)
    app.start()
    stop = threading.Event()
    try:
        wait_for(lambda: app.state.connection.state == LinkState.CONNECTED, 30, "connection")
        app.actions.start_profile("qwen-tiny-gpu")  # on the simulated GPUs (FAKE CUDA env)
        wait_for(lambda: app.state.engines.get("qwen-tiny-gpu") is not None
                 and app.state.engines["qwen-tiny-gpu"].state == EngineState.READY, 30, "ready")  # fmt: skip
        traffic = threading.Thread(
            target=request_loop, args=(d.port, "qwen-gpu", stop), daemon=True
        )
        traffic.start()
        dash = app.open_dashboard("gpus")
        dash.resize(1200, 1280)
        page = dash.page("gpus")
        wait_for(lambda: "J/token" in page.cards[gpu0].facts["Energy"].text(), 60, "energy")
        wait_for(lambda: len(page.cards[gpu0].temp_chart.series["GPU"]) >= 40, 60, "charts")
        s.shot(dash, "dashboard-gpus")
        fans = dash.page("fans")
        dash.show_page("fans")
        dash.resize(1150, 900)
        wait_for(lambda: fans.fans.preset_picker.count() > 0, 20, "presets")
        fans.fans.preset_picker.setCurrentText("performance")
        fans.fans.on_load_preset_clicked()
        wait_for(lambda: fans.fans.apply_button.isEnabled(), 20, "valid curve")
        fans.fans.apply_button.click()
        wait_for(lambda: "by traylm-gpud" in fans.fans.fan_state.text(), 20, "curve applied")
        settle(1500)
        s.shot(dash, "dashboard-fans-applied")
        # the thermal guard acts: the tray turns hot
        sim.inject(gpu0, force_temperature_c=84.0)
        wait_for(lambda: app.tray.current == TrayState.HOT, 20, "hot")
        dash.show_page("gpus")
        dash.resize(1200, 1280)
        wait_for(lambda: page.cards[gpu0].guard_badge.isVisible(), 20, "guard badge")
        s.shot(dash, "dashboard-gpus-guard-acting")
        dash.hide()
        tray_hot(s, app)
        sim.inject(gpu0, force_temperature_c=None)
        envs_install(s, app, dash)
    finally:
        stop.set()
        app.shutdown()
        d.stop()


def tray_hot(s: Any, app: Any) -> None:
    from PySide6.QtCore import QPoint
    from PySide6.QtWidgets import QToolTip

    from desktop.tray.icon import BALLOON_MS
    from tests.desktop.screenshots import settle, wait_for

    geo = app.tray.icon.geometry()
    wait_for(lambda: geo.width() > 0, 10, "icon in the panel")
    s.screen("tray-hot-notification")  # the guard's balloon
    done: list[object] = []
    app.actions.update_settings({"ui.notifications": False}, then=done.append)
    wait_for(lambda: done, 10, "notifications off")  # the next guard steps pop up nothing
    settle(BALLOON_MS + 500)  # the balloon has gone
    app.tray.menu.popup(QPoint(geo.x(), geo.bottom() + 2))
    wait_for(lambda: app.tray.menu.isVisible(), 10, "menu")
    s.screen("tray-hot-menu")
    app.tray.menu.hide()
    for _attempt in range(3):  # hover the icon until Qt shows its tooltip
        s.x.xdotool("mousemove", "700", "500")
        settle(300)
        s.x.xdotool("mousemove", str(geo.center().x()), str(geo.center().y()))
        with contextlib.suppress(TimeoutError):
            wait_for(QToolTip.isVisible, 5, "the tooltip")
            break
    s.screen("tray-hot-tooltip")
    s.x.xdotool("mousemove", "700", "500")
    app.actions.update_settings({"ui.notifications": True})


def envs_install(s: Any, app: Any, dash: Any) -> None:
    """Install an engine from the dashboard: a tiny local package stands in for vLLM's wheels
    (engines.envs.RECIPES is patched in this process, where the daemon now runs)."""
    from engines.envs.manager import RECIPES, EngineRecipe
    from tests.desktop.screenshots import wait_for

    pkg = s.home / "pkg"
    pkg.mkdir(exist_ok=True)
    (pkg / "setup.py").write_text("from setuptools import setup; setup(name='p', version='1')")
    old = RECIPES[("vllm", "cpu")]
    RECIPES[("vllm", "cpu")] = EngineRecipe("vllm", "cpu", "0.0.9", str(pkg),
                                            import_check="print('ok')", probe_flags=False)  # fmt: skip
    try:
        dash.resize(1150, 780)
        dash.show_page("engines")
        dash.show()
        page = dash.page("engines")
        page.tabs.setCurrentWidget(page.envs)
        envs = page.envs
        envs.device.setCurrentIndex(envs.device.findData("cpu"))
        envs.install_button.click()
        wait_for(lambda: "[install]" in envs.install_log.toPlainText(), 60, "install running")
        s.shot(dash, "dashboard-engines-install-running")
        wait_for(lambda: envs.install_status.state in ("ok", "error"), 300, "install done")
        wait_for(lambda: envs.table.rowCount() >= 3, 20, "the new env listed")
        s.shot(dash, "dashboard-engines-install-done")
    finally:
        RECIPES[("vllm", "cpu")] = old


def setup_scenes(s: Any, app: Any) -> None:
    """The first-run setup as it opens (two SIMULATED GPUs: the CPU starters), and with a
    folder that is not a model refused in words, with its fix button."""
    from tests.desktop.screenshots import wait_for

    setup = app.open_setup()
    wait_for(lambda: setup.rows and all(r.badge.text() not in ("", "…")
                                        for r in setup.rows.values()), 30, "fit badges")  # fmt: skip
    s.shot(setup, "setup")
    setup.flow.use_folder(str(s.home))  # TRAYLM_HOME: a folder, not a model
    wait_for(lambda: setup.cards["model"].view.status == "error", 20, "refusal")
    s.shot(setup, "setup-not-a-model")
    setup.flow.retry("model")
    setup.close()


def notice_scene(s: Any, app: Any, dash: Any) -> None:
    """A start the daemon refuses at once: the notice bar with its fix and the CLI hint."""
    from tests.desktop.screenshots import wait_for

    call(app, lambda c: c.save_profile("llama-8b-gpu", {"model": "org/llama", "device": "cuda"}))
    app.actions.reload_profiles()
    app.actions.start_profile("llama-8b-gpu")
    wait_for(lambda: dash.notice.isVisible(), 20, "notice")
    s.shot(dash, "dashboard-notice-with-fix")
    dash.notice.dismiss()
