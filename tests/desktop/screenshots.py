"""Write a PNG of every window and dashboard page of the tray app, under Xvfb with a real tray.

    .venv/bin/python tests/desktop/screenshots.py [OUT_DIR] [--only-simulated|--only-no-gpus]

Every view is written twice, NAME-light.png and NAME-dark.png (desktop/look/theme.py's two palettes),
for two computers: OUT_DIR/simulated-gpus/ (two SIMULATED RTX 4090s) and OUT_DIR/no-gpus/ (this
machine's real NVML, which finds no GPU: the GPUs page shows CPU and RAM, Fans & power says
there is nothing to control). Default OUT_DIR: screenshots/.

It starts Xvfb and trayer (tests/desktop/install-x11-deps.sh installs them), the FAKE Hub, a
real daemon (``python -m engines serve``) on two SIMULATED GPUs with the FAKE vLLM and
TensorRT-LLM envs in a private TRAYLM_HOME, and the tray app in this process; then it drives the
app into each state and saves: the tray with its menu open (whole screen), the chat window (a
stored conversation with Markdown and code, a live reply, the inline error with its Start
button), each dashboard page and tab (GPUs, Engines with install progress and TensorRT-LLM,
Models search/downloads/library, Fans & power, Benchmarks with a comparison, Settings), the quit
dialog, the connection banner while the daemon is down, the fallback window used without a
system tray, the GPUs under load and the tray's hot state, the first-run setup (as it opens, and
with a refused folder), a notice with its fix button (tests/desktop/screenshot_scenes.py), and
the state icons on light and dark panels.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
THEMES = ("light", "dark")  # every view is written in both


def wait_for(cond: Callable[[], object], timeout_s: float = 20.0, what: str = "") -> None:
    from PySide6.QtCore import QEventLoop
    from PySide6.QtWidgets import QApplication

    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what or cond}")
        QApplication.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 50)


def settle(ms: int = 300) -> None:
    """Let layouts and paints finish before a grab (bounded: no condition tells 'painted')."""
    from PySide6.QtCore import QEventLoop, QTimer

    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()


class Session:
    """Xvfb + trayer + a daemon process (tests/desktop/x11.py), torn down in reverse order."""

    def __init__(self, out: Path, *, gpus: bool = True) -> None:
        from tests.desktop.x11 import XDesktop

        self.gpus = gpus  # False: a computer without NVIDIA GPUs (the real NVML says none)
        self.out = out
        self.home = Path(tempfile.mkdtemp(prefix="traylm-shots-"))
        self.x = XDesktop()
        self.app: object = None
        self.hub: object = None

    def start(self) -> None:
        from engines.config.sections import Paths
        from engines.core.procs import free_loopback_port
        from tests.desktop.screenshot_scenes import (
            HUB_CONFIG,
            NO_GPU_CONFIG,
            TRT_PROFILE,
            start_hub,
        )
        from tests.desktop.x11 import FAKE_PROFILE, missing_x_tools, prepare_home
        from tests.fakes.fake_trt_env import make_fake_trtllm_env, make_tiny_hf_model
        from tests.fakes.fake_vllm_env import make_fake_vllm_env

        missing = missing_x_tools()
        if missing:
            sys.exit(f"{', '.join(missing)} missing: run tests/desktop/install-x11-deps.sh")
        self.hub = hub = start_hub()
        os.environ["HF_ENDPOINT"] = hub.url
        profile = FAKE_PROFILE.format(args="--token-delay 0.02").replace("fake", "qwen-tiny")
        profile = profile.replace('device = "cpu"\n', 'device = "cpu"\ngpus = [0, 1]\n')
        model = self.model = make_tiny_hf_model(self.home / "models" / "tiny-llama")
        kv_line = (
            "ValueError: To serve at least one request with the max seq len (32768) of the model, "
            "(4.0 GiB KV cache is needed, which is larger than the available KV cache memory "
            "(1.0 GiB). Based on the available memory, the estimated maximum model length is 8192."
        )
        broken = FAKE_PROFILE.replace('"org/fake"', '"meta-llama/Llama-3.1-8B"').format(
            args=f"--print '{kv_line}' --exit-after-print 1"
        )
        profiles = {"qwen-tiny-cpu": profile, "llama-8b-long-context": broken}
        if self.gpus:  # a model on the (simulated) GPUs, and a TensorRT-LLM build for them
            profiles["qwen-tiny-gpu"] = profile.replace('"qwen-tiny"', '"qwen-gpu"').replace(
                'device = "cpu"', 'device = "cuda"'
            )
            profiles["llama-trt-fp8"] = TRT_PROFILE.format(model=model)
        env = prepare_home(
            self.home, free_loopback_port(), profiles, HUB_CONFIG if self.gpus else NO_GPU_CONFIG
        )
        make_fake_trtllm_env(Path(env["TRAYLM_ENVS_DIR"]))
        make_fake_vllm_env(Path(env["TRAYLM_ENVS_DIR"]), device="cuda")
        self.x.start_x()
        os.environ.update({**env, **self.x.env})
        self.paths = Paths.from_env()
        self.spawn_daemon()

    def spawn_daemon(self) -> None:
        from tests.desktop.x11 import start_daemon

        self.daemon = start_daemon(self.x, os.environ, self.home / "daemon.log")

    def stop_daemon(self) -> None:
        self.daemon.terminate()
        self.daemon.wait(30)

    def close(self) -> None:
        self.x.close()
        if self.hub is not None:
            self.hub.stop()  # type: ignore[attr-defined]
        shutil.rmtree(self.home, ignore_errors=True)

    def shot(self, widget: object, name: str) -> None:
        """``name-light.png`` and ``name-dark.png``: the same view in both themes."""
        for theme in THEMES:
            self.use_theme(theme)
            settle()
            path = self.out / f"{name}-{theme}.png"
            widget.grab().save(str(path))  # type: ignore[attr-defined]
            print(f"wrote {path}")
        self.use_theme(THEMES[0])

    def screen(self, name: str) -> None:
        for theme in THEMES:
            self.use_theme(theme)
            settle(500)
            print(f"wrote {self.x.screenshot(self.out / f'{name}-{theme}.png')}")
        self.use_theme(THEMES[0])

    @staticmethod
    def use_theme(theme: str) -> None:
        from PySide6.QtWidgets import QApplication

        from desktop.look.theme import apply_theme

        app = QApplication.instance()
        if isinstance(app, QApplication) and app.property("traylmTheme") != theme:
            apply_theme(app, theme)


def dashboard_pages(s: Session, dash: object) -> None:
    from desktop.dashboard.pages import PAGES
    from desktop.dashboard.window import DashboardWindow
    from tests.desktop.screenshot_scenes import bench_scene, fans_scene, models_tabs

    assert isinstance(dash, DashboardWindow)
    scenes = {"engines": engines_tabs, "models": models_tabs, "bench": bench_scene}
    if s.gpus:  # without a GPU the page says so: its default view is the scene
        scenes["fans"] = fans_scene
    for spec in PAGES:
        dash.show_page(spec.key)
        page = dash.page(spec.key)
        scene = scenes.get(spec.key)
        if scene is None:
            s.shot(dash, f"dashboard-{spec.key}")
        else:
            scene(s, dash, page)


def engines_tabs(s: Session, dash: object, page: object) -> None:
    from desktop.dashboard.engines_page import EnginesPage

    assert isinstance(page, EnginesPage)
    for index in range(page.tabs.count()):
        page.tabs.setCurrentIndex(index)
        tab = page.tabs.tabText(index).lower()
        if tab == "environments":
            wait_for(lambda: page.envs.table.rowCount() > 0, what="envs")
            page.envs.table.selectRow(0)
            page.envs.on_doctor_clicked()
            wait_for(lambda: "metadata" in page.envs.report.text(), what="doctor")
        if tab == "engines":
            wait_for(lambda: len(page.tokens_chart.series["all models"]) > 3, what="chart")
        if tab == "tensorrt-llm" and s.gpus:
            from tests.desktop.screenshot_scenes import trt_tab

            trt_tab(s, page)
        if tab == "logs":
            page.ctx.actions.start_profile("llama-8b-long-context")
            wait_for(lambda: page.logs.picker.findText("llama-8b-long-context") >= 0, what="eng")
            page.logs.picker.setCurrentText("llama-8b-long-context")
            wait_for(lambda: page.logs.diagnosis_list.count() > 0, what="diagnosis")
        s.shot(dash, f"dashboard-engines-{tab}")
    page.tabs.setCurrentIndex(0)


def icons_sheet(out: Path) -> None:
    from PySide6.QtCore import QRect
    from PySide6.QtGui import QColor, QPainter, QPixmap

    from desktop.tray.icons import TrayState, state_icon

    states = list(TrayState)
    rows = [("#f2f2f2", 22), ("#2b2b2b", 22), ("#dcdcdc", 48), ("#1e1f22", 48)]
    pm = QPixmap(len(states) * 90, sum(size + 16 for _, size in rows))
    painter = QPainter(pm)
    y = 0
    for bg, size in rows:
        painter.fillRect(0, y, pm.width(), size + 16, QColor(bg))
        for i, state in enumerate(states):
            state_icon(state).paint(painter, QRect(i * 90 + 30, y + 8, size, size))
        y += size + 16
    painter.end()
    pm.save(str(out / "icons.png"))
    print(f"wrote {out / 'icons.png'}")


def run(out: Path, *, gpus: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    session = Session(out, gpus=gpus)
    try:
        session.start()
        scenes(session)
    finally:
        session.close()


def scenes(s: Session) -> None:
    from PySide6.QtCore import QPoint
    from PySide6.QtWidgets import QApplication

    from desktop.app import DesktopApp
    from desktop.daemon.messages import LinkState
    from engines.events import EngineState

    qapp = QApplication([sys.argv[0]])
    qapp.setQuitOnLastWindowClosed(False)
    icons_sheet(s.out)
    app = DesktopApp(s.paths, spawn_daemon=False)
    s.app = app
    app.start()
    wait_for(lambda: app.state.connection.state == LinkState.CONNECTED, what="connection")
    wait_for(lambda: app.state.profiles, what="profiles")
    wait_for(lambda: app.tray.icon.geometry().width() > 0, what="tray icon in the panel")

    # stored conversation with Markdown and code, through the daemon like the chat window does
    async def seed(c: object) -> None:
        chat = await c.create_chat(title="Reverse a list", model="qwen-tiny")  # type: ignore[attr-defined]
        await c.add_chat_messages(  # type: ignore[attr-defined]
            chat.chat_id,
            [
                {"role": "user", "content": "How do I reverse a list in Python?"},
                {
                    "role": "assistant",
                    "model": "qwen-tiny",
                    "content": "Use **slicing** or `reversed()`:\n\n```python\nitems = [1, 2, 3]"
                    "\nprint(items[::-1])\nprint(list(reversed(items)))\n```\n\n- `[::-1]` makes "
                    "a copy\n- `items.reverse()` reverses in place",
                    "stats": {"ttft_s": 0.084, "tokens_per_s": 47.3, "completion_tokens": 61},
                    "finish_reason": "stop",
                },
            ],
        )

    done: list[object] = []
    app.bridge.call(seed, done.append)
    wait_for(lambda: done, what="seeded chat")

    # the chat window: sending to a model that is not loaded loads it (models on demand)
    chat = app.open_chat("")
    chat.resize(1000, 700)
    wait_for(lambda: chat.controller.summaries, what="chat list")
    chat.composer.setPlainText("Hello!")
    chat.select_model("qwen-tiny")
    chat.max_tokens.setValue(48)
    chat.on_send_clicked()
    wait_for(lambda: chat.status.text().startswith("Loading qwen-tiny")
             or len(chat.transcript.messages) >= 2, what="loading")  # fmt: skip
    s.shot(chat, "chat-loading-on-send")

    wait_for(
        lambda: (
            app.state.engines.get("qwen-tiny-cpu") is not None
            and app.state.engines["qwen-tiny-cpu"].state == EngineState.READY
        ),
        what="engine ready",
    )
    # the tray with its menu open, on the whole screen
    geo = app.tray.icon.geometry()
    app.tray.menu.popup(QPoint(geo.x(), geo.bottom() + 2))
    wait_for(lambda: app.tray.menu.isVisible(), what="tray menu")
    s.screen("tray-menu")
    app.tray.menu.hide()

    wait_for(lambda: chat.controller.streaming is None and len(chat.transcript.messages) >= 2,
             what="live reply")  # fmt: skip
    s.shot(chat, "chat-live-reply")
    first = chat.chat_list.item(chat.chat_list.count() - 1)
    chat.on_chat_clicked(first)
    wait_for(lambda: chat.controller.transcript and chat.controller.transcript.chat.title
             == "Reverse a list", what="stored chat")  # fmt: skip
    chat.params_toggle.setChecked(True)
    s.shot(chat, "chat-markdown")

    from tests.desktop.screenshot_scenes import notice_scene, setup_scenes

    setup_scenes(s, app)
    dash = app.open_dashboard("")
    dash.resize(1100, 760)  # the default size: every page must fit it
    dashboard_pages(s, dash)
    dash.show_page("engines")
    notice_scene(s, app, dash)

    app.request_quit()
    wait_for(lambda: app.quit_dialog is not None and app.quit_dialog.isVisible(), what="dialog")
    s.shot(app.quit_dialog, "quit-dialog")
    app.quit_dialog.on_button_clicked(app.quit_dialog.cancel_button)  # type: ignore[union-attr]
    app.quit_dialog = None

    s.stop_daemon()
    wait_for(lambda: app.state.connection.state == LinkState.UNREACHABLE, what="unreachable")
    dash.show_page("engines")
    s.shot(dash, "dashboard-daemon-unreachable")
    s.screen("tray-daemon-unreachable")
    app.shutdown()

    s.spawn_daemon()
    fallback = DesktopApp(s.paths, spawn_daemon=False, use_tray=False)
    fallback.start()
    wait_for(lambda: fallback.state.connection.state == LinkState.CONNECTED, what="reconnect")
    assert fallback.dashboard is not None
    fallback.dashboard.resize(1150, 780)
    s.shot(fallback.dashboard, "fallback-window-no-tray")
    fallback.shutdown()

    s.stop_daemon()
    if s.gpus:
        from tests.desktop.screenshot_scenes import live_gpu_scenes

        live_gpu_scenes(s, s.home)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    root = Path(args[0] if args else "screenshots").resolve()
    kinds = {"--only-simulated": (True,), "--only-no-gpus": (False,)}
    for gpus in next((kinds[a] for a in sys.argv[1:] if a in kinds), (True, False)):
        run(root / ("simulated-gpus" if gpus else "no-gpus"), gpus=gpus)
