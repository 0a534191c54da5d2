"""The first-run setup's logic, without widgets: four steps (this computer, the engine, a model,
start and chat), each shown as a ``StepView`` built from the daemon's state and events, so what
the setup says is always what the daemon says.

``advance()`` does the next thing that is missing (install the engine, download the model,
start it, open the chat with a first question); after "Set it all up" it keeps advancing on its
own as each step finishes, and stops at the first error, which carries its fix.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtCore import QObject, QTimer, Signal

from desktop.daemon.actions import Actions
from desktop.daemon.bridge import Bridge
from desktop.daemon.fixes import ENGINE_LOG, INSTALL_ENGINE, LOCAL_FOLDER, Fix, fix_for
from desktop.daemon.install_text import download_share
from desktop.daemon.messages import CallResult
from desktop.daemon.state import AppState
from desktop.look.formatting import fmt_bytes, fmt_duration, fmt_rate
from desktop.setup.proposals import Proposal, folder_proposal, from_daemon
from engines.client import DaemonClient
from engines.events import (
    DownloadProgress,
    DownloadState,
    DownloadStateChanged,
    EngineState,
    EnvInstallProgress,
    Event,
    FitResult,
    LocalFolder,
    SetupProposal,
)

STEPS = ("hardware", "engine", "model", "start")
GREETING = "Hello! In one sentence: who are you?"
OFFLINE_CODES = ("hub_unavailable", "network")


@dataclass(frozen=True)
class StepView:
    status: str  # waiting | working | done | error
    text: str
    progress: float | None = None  # 0..1 while working; None: busy without a figure
    fix: Fix | None = None  # with an error: the button that fixes it, and the CLI command


OpenChat = Callable[[str], object]


class SetupFlow(QObject):
    changed = Signal()
    completed = Signal()  # the first answer came: the setup is done

    def __init__(
        self, bridge: Bridge, state: AppState, actions: Actions, open_chat: OpenChat
    ) -> None:
        super().__init__()
        self.bridge = bridge
        self.state = state
        self.actions = actions
        self.open_chat = open_chat
        self.proposals: list[Proposal] = []
        self.fits: dict[str, FitResult] = {}
        self.fit_errors: dict[str, tuple[str, str]] = {}  # name → (code, message)
        self.choice: Proposal | None = None
        self.auto = False
        self.chatting = False
        self.done = False
        self.errors: dict[str, StepView] = {}  # a step's error until it is retried
        self.download: DownloadProgress | None = None
        self.install_cancelled = False
        self.asked: set[str] = set()  # "install", "download": asked for, not yet under way
        self.download_failed: DownloadStateChanged | None = None
        self.started_s: float | None = None
        self._ticker = QTimer(self)
        self._ticker.setInterval(1000)  # elapsed time on a long wait
        self._ticker.timeout.connect(self.changed)
        self._listed_for: tuple[int, tuple[tuple[str, str], ...]] | None = None  # _listing_inputs()
        for signal in (
            state.envs_changed,
            state.library_changed,
            state.engines_changed,
        ):
            signal.connect(self.on_state_changed)
        for signal in (
            state.profiles_changed,
            state.gpu.overview_changed,
            state.servable_changed,
        ):
            signal.connect(self.on_hardware_changed)
        state.event_received.connect(self.on_event_received)

    # ----------------------------------------------------------------- reading the state

    def begin(self) -> None:
        """Ask the daemon what to serve on this computer (its proposals, then each one's fit).
        A setup that finished starts over: run again, it picks another model."""
        if self.done:
            self.done = self.auto = self.chatting = False
            self.errors, self.asked = {}, set()
            self.started_s, self.download, self.download_failed = None, None, None
        self._listed_for = self._listing_inputs()
        self.bridge.call(lambda c: c.setup_proposals(), self._on_proposals)

    def _on_proposals(self, result: CallResult) -> None:
        """The daemon's proposals (none when it could not answer: the folders remain), then
        the folders registered here or chosen meanwhile."""
        offered = result.value if result.ok and isinstance(result.value, tuple) else ()
        chosen = [p for p in self.proposals if p.kind == "folder"]
        self.proposals = [from_daemon(p) for p in offered if isinstance(p, SetupProposal)]
        for folder in [*chosen, *self._folders()]:
            if folder.name not in self._names():
                self.proposals.append(folder)
        if self.choice is None or self.choice.name not in self._names():
            self.choice = self._first_fitting()
        self.fits, self.fit_errors = {}, {}
        for proposal in self.proposals:
            if proposal.repo_id:
                self._load_fit(proposal)
        self.changed.emit()

    def _listing_inputs(self) -> tuple[int, tuple[tuple[str, str], ...]]:
        """What the proposals depend on: the GPUs, the profiles, and whether the daemon says
        each needs GPUs this computer lacks."""
        profiles = self.state.profiles
        return self.state.real_gpus, tuple(
            (p.name, self.state.blocked_code(p.name)) for p in profiles
        )

    def _names(self) -> set[str]:
        return {p.name for p in self.proposals}

    def _folders(self) -> list[Proposal]:
        return [
            folder_proposal(f.name, f.path, f.served_name, f.family)
            for f in self.state.folders
            if not f.problems
        ]

    def _first_fitting(self) -> Proposal | None:
        """The default: the first that fits; offline, only a folder on this computer (a Hub
        model's download would fail, and so would the install made for it)."""
        if self.offline:
            return next((p for p in self.proposals if p.kind == "folder"), None)
        fitting = [p for p in self.proposals if self.fit_verdict(p) != "wont_fit"]
        candidates = fitting or self.proposals
        return candidates[0] if candidates else None

    def _load_fit(self, proposal: Proposal) -> None:
        on_cpu = proposal.device == "cpu"
        repo = proposal.repo_id
        fields = proposal.profile
        context = fields.get("max_model_len")  # the profile's context, not the model's longest
        kv = str(fields.get("kv_cache_dtype") or "auto")
        tp = int(str(fields.get("tensor_parallel_size", 1)))

        async def fit(c: DaemonClient) -> list[FitResult]:
            length = int(str(context)) if context else None
            if on_cpu:
                return await c.model_fit(repo, device="cpu", context=length)
            return await c.model_fit(
                repo, engine="vllm", gpus=tp, context=length, kv_cache_dtype=kv
            )

        def done(result: CallResult) -> None:
            if result.ok and isinstance(result.value, tuple) and result.value:
                self.fits[proposal.name] = result.value[0]
            elif not result.ok:
                self.fit_errors[proposal.name] = (result.error_code, result.error)
            choice = self.choice
            wont_fit = choice is not None and self.fit_verdict(choice) == "wont_fit"
            from_hub = choice is not None and choice.kind != "folder"
            if (wont_fit or (self.offline and from_hub)) and not self.auto:
                self.choice = self._first_fitting()
            self.changed.emit()

        self.bridge.call(fit, done)

    def fit_verdict(self, proposal: Proposal) -> str:
        result = self.fits.get(proposal.name)
        return result.verdict if result is not None else ""

    @property
    def offline(self) -> bool:
        """The Hub answered no fit at all because it cannot be reached."""
        return (
            bool(self.fit_errors)
            and all(code in OFFLINE_CODES for code, _ in self.fit_errors.values())
            and not self.fits
        )

    def device(self) -> str:
        return "cuda" if self.state.real_gpus else "cpu"

    def view(self, step: str) -> StepView:
        if step in self.errors:
            return self.errors[step]
        return {
            "hardware": self._hardware,
            "engine": self._engine,
            "model": self._model,
            "start": self._start,
        }[step]()

    def _hardware(self) -> StepView:
        gpu = self.state.gpu
        if self.state.real_gpus:
            infos = gpu.infos()
            memory = fmt_bytes(infos[0].memory_total_bytes) if infos else "?"
            names = {i.name for i in infos}
            text = f"{len(infos)} × {', '.join(sorted(names))} ({memory} each)"
            return StepView("done", f"{text}: models run on the GPUs.")
        if gpu.simulated:
            return StepView(
                "done",
                f"{len(gpu.infos())} simulated GPUs show in the GPU pages; no NVIDIA GPU to run "
                "models: they run on the CPU with vLLM's CPU build (good for small models).",
            )
        if gpu.overview is None and not gpu.error:
            return StepView("working", "looking at this computer…")
        return StepView(
            "done",
            "No NVIDIA GPU: models run on the CPU with vLLM's CPU build, which is fine for "
            "small models (up to a few billion parameters), slow for big ones.",
        )

    def env_ready(self) -> bool:
        device = self.device()
        envs = self.state.envs or ()
        return any(e.complete and e.engine == "vllm" and e.device == device for e in envs)

    def _engine(self) -> StepView:
        device = self.device()
        build = "CPU build" if device == "cpu" else "CUDA build"
        install = self.state.install
        if install is not None:
            return StepView(
                "working",
                f"Installing vLLM ({build}): {self.state.install_text()}",
                download_share(install),
            )
        if self.state.envs is None:
            return StepView("working", "checking the installed engines…")
        for env in self.state.envs:
            if env.complete and env.engine == "vllm" and env.device == device:
                return StepView("done", f"vLLM {env.version} ({build}) is installed.")
        size = "about 3.5 GB" if device == "cpu" else "about 8 GB"
        text = f"vLLM ({build}) is not installed yet: {size}, a few minutes."
        if self.install_cancelled:
            text = f"The install was cancelled and nothing was left behind. {text}"
        return StepView("waiting", text)

    def model_ready(self) -> bool:
        choice = self.choice
        if choice is None:
            return False
        if choice.kind == "folder":
            return True
        return any(
            m.repo_id == choice.repo_id and m.verified not in ("incomplete", "corrupt")
            for m in self.state.cached_models
        )

    def _model(self) -> StepView:
        choice = self.choice
        if choice is None and self.offline:  # asked first: nothing to install or fetch for
            return StepView(
                "waiting",
                "Choose a model folder on this computer first (the button below): nothing is "
                "installed or downloaded until then.",
            )
        if choice is None:
            return StepView("waiting", "Pick a model below, or a folder on this computer.")
        if self.model_ready():
            where = choice.path if choice.kind == "folder" else "in the library"
            return StepView("done", f"{choice.title} is ready ({where}).")
        d = self.download
        if d is not None and d.repo_id == choice.repo_id:
            share = d.done_bytes / d.total_bytes if d.total_bytes else None
            eta = f", {fmt_duration(d.eta_s)} left" if d.eta_s is not None else ""
            return StepView(
                "working",
                f"Downloading {choice.repo_id}: {fmt_bytes(d.done_bytes)} of "
                f"{fmt_bytes(d.total_bytes)} · {fmt_rate(d.rate_bytes_per_s)}{eta}",
                share,
            )
        fit = self.fits.get(choice.name)
        size = f" ({fmt_bytes(fit.weights_bytes_per_gpu)})" if fit is not None else ""
        return StepView("waiting", f"{choice.title}{size} will be downloaded from the Hub.")

    def _start(self) -> StepView:
        choice = self.choice
        if choice is None:
            return StepView("waiting", "")
        engine = self.state.engines.get(choice.name)
        state = engine.state if engine is not None else None
        if state == EngineState.READY:
            if self.done:
                return StepView("done", f"{choice.served_name} answered in the chat.")
            return StepView(
                "done", f"Serving {choice.served_name}; the chat opens with a first question."
            )
        if state == EngineState.STARTING and engine is not None:
            since = ""
            if self.started_s is not None:
                since = f" · {fmt_duration(time.monotonic() - self.started_s)}"
            return StepView("working", f"Starting {choice.name}: {engine.stage}{since}")
        if state == EngineState.FAILED and engine is not None:
            text = engine.detail
            if engine.diagnosis is not None:
                text = f"{engine.diagnosis.summary}. {engine.diagnosis.advice}"
            fix = Fix(ENGINE_LOG, "Open its log", choice.name, f"traylm logs {choice.name}")
            return StepView("error", f"{choice.name} failed to start: {text}", fix=fix)
        return StepView("waiting", f"{choice.name} starts once the engine and the model are here.")

    # ----------------------------------------------------------------- doing

    def choose(self, proposal: Proposal) -> None:
        self.choice = proposal
        self.errors.pop("model", None)
        self.errors.pop("start", None)
        self.changed.emit()

    def set_all_up(self) -> None:
        self.auto = True
        self.advance()

    def advance(self) -> None:
        """Do the next missing thing (each at most once at a time)."""
        choice = self.choice
        if self.errors or choice is None or self.done:
            return
        engine = self.state.engines.get(choice.name)
        state = engine.state if engine is not None else EngineState.STOPPED
        if not self.env_ready():
            idle = self.state.install is None and "install" not in self.asked
            if idle and self.state.envs is not None:
                self.install_engine()
        elif not self.model_ready():
            if self.download is None and "download" not in self.asked:
                self.fetch_model()
        elif state == EngineState.STOPPED:
            if self.started_s is None:
                self.start_model()
        elif state == EngineState.READY and not self.chatting:
            self.first_answer()

    def retry(self, step: str) -> None:
        """Try a failed step again (the button under its error)."""
        self.errors.pop(step, None)
        if step == "model":
            self.download, self.download_failed = None, None
            self.asked.discard("download")
            self.begin()
        self.changed.emit()
        if step == "start":
            self.start_model()
        else:
            self.advance()

    def _fail(self, step: str, text: str, fix: Fix | None) -> None:
        self.errors[step] = StepView("error", text, fix=fix)
        self._ticker.stop()
        self.changed.emit()

    def install_engine(self) -> None:
        self.install_cancelled = False
        cli = "traylm engines install vllm" + (" --cpu" if self.device() == "cpu" else "")

        def done(result: CallResult) -> None:
            if not result.ok:
                self.asked.discard("install")
                retry = Fix(INSTALL_ENGINE, "Try the install again", "vllm", cli)
                self._fail("engine", f"The install did not start: {result.error}", retry)

        self.asked.add("install")  # until its first event: no second request meanwhile
        self._ticker.start()
        self.bridge.call(lambda c: c.install_env("vllm", device="auto"), done)

    def cancel_install(self) -> None:
        """Stop the install (the daemon removes what it had made)."""

        def done(result: CallResult) -> None:
            if not result.ok:
                self._fail("engine", result.error, None)

        self.bridge.call(lambda c: c.cancel_install(), done)

    def _install_failed(self, message: str) -> None:
        cli = "traylm engines install vllm" + (" --cpu" if self.device() == "cpu" else "")
        retry = Fix(INSTALL_ENGINE, "Install again", "vllm", cli)
        self._fail("engine", f"The engine install failed: {message}", retry)

    def fetch_model(self) -> None:
        choice = self.choice
        assert choice is not None and choice.repo_id
        repo = choice.repo_id

        def done(result: CallResult) -> None:
            if not result.ok:
                self.asked.discard("download")
                words = result.error
                if result.error_code in OFFLINE_CODES:
                    words = _offline_words(repo, result.error)
                self._fail("model", words, self._offline_fix(result.error_code, repo))

        self.download_failed = None
        self.asked.add("download")
        self.bridge.call(lambda c: c.pull(repo), done)

    def _offline_fix(self, code: str, repo: str) -> Fix | None:
        cli = f"traylm models pull {repo}"
        if code in OFFLINE_CODES:
            return Fix(LOCAL_FOLDER, "Use a folder on this computer…", repo, cli)
        fix = fix_for(code, "", target=repo)
        return Fix(fix.action, fix.label, repo, cli) if fix is not None else Fix("", "", repo, cli)

    def start_model(self) -> None:
        choice = self.choice
        assert choice is not None
        name, fields = choice.name, dict(choice.profile)
        kind = choice.kind

        async def start(c: DaemonClient) -> object:
            if kind == "starter":
                await c.save_profile(name, fields)
            return await c.start(name)

        def done(result: CallResult) -> None:
            if not result.ok:
                fix = fix_for(result.error_code, result.error, target=name)
                self._fail("start", f"{name} could not start: {result.error}", fix)
            elif kind == "starter":
                self.actions.reload_profiles()

        self.started_s = time.monotonic()
        self._ticker.start()
        self.actions.remember_profile(name)  # the tray's Start acts on it from now on
        self.bridge.call(start, done)

    def use_folder(self, path: str) -> None:
        """Register a model folder (the daemon checks it) and choose it."""

        def done(result: CallResult) -> None:
            if not result.ok or not isinstance(result.value, LocalFolder):
                again = Fix(LOCAL_FOLDER, "Choose another folder…", "", "traylm models add PATH")
                self._fail("model", result.error, again)
                return
            f = result.value
            proposal = folder_proposal(f.name, f.path, f.served_name, f.family)
            self.proposals = [p for p in self.proposals if p.name != f.name] + [proposal]
            self.choose(proposal)

        self.bridge.call(lambda c: c.add_local_folder(path), done)

    def first_answer(self) -> None:
        """Open the chat on the served model and ask the first question."""
        choice = self.choice
        assert choice is not None
        self.chatting = True
        chat = self.open_chat(choice.served_name)
        ask = getattr(chat, "ask", None)
        if ask is not None:
            ask(choice.served_name, GREETING, self._on_answer)

    def _on_answer(self, answered: bool) -> None:
        if answered:
            self.done = True
            self._ticker.stop()
            self.actions.update_settings({"ui.setup_done": True})
            self.changed.emit()
            self.completed.emit()

    # ----------------------------------------------------------------- events

    def on_hardware_changed(self) -> None:
        """The GPUs or the profiles changed: list the proposals again (once per change)."""
        listed = self._listing_inputs()
        if self._listed_for is not None and listed != self._listed_for:
            self.begin()
        self.changed.emit()

    def on_state_changed(self) -> None:
        names = self._names()
        self.proposals += [p for p in self._folders() if p.name not in names]
        self.changed.emit()
        if self.auto:
            self.advance()

    def on_event_received(self, event: Event) -> None:
        if isinstance(event, EnvInstallProgress):
            self.asked.discard("install")  # it is under way (or over): the state says now
            if event.phase == "failed":
                self._install_failed(event.line)
            elif event.phase == "cancelled":
                self.install_cancelled = True
                self.auto = False  # the user stopped it: nothing goes on by itself
                self._ticker.stop()
            self.changed.emit()
        elif isinstance(event, DownloadProgress):
            self.download = event
            self.changed.emit()
        elif isinstance(event, DownloadStateChanged):
            self._on_download_state(event)

    def _on_download_state(self, event: DownloadStateChanged) -> None:
        status = event.status
        choice = self.choice
        if choice is None or status.repo_id != choice.repo_id:
            return
        if status.state == DownloadState.FAILED:
            self.download = None
            self.asked.discard("download")
            self.download_failed = event
            fix = self._offline_fix(status.error_code, status.repo_id)
            words = status.message
            if status.error_code in OFFLINE_CODES:
                words = _offline_words(status.repo_id, status.message)
            self._fail("model", words, fix)
        elif status.state in (DownloadState.READY, DownloadState.CANCELLED):
            self.download = None
            self.asked.discard("download")
            self.changed.emit()


def _offline_words(repo: str, detail: str) -> str:
    return (
        f"The Hugging Face Hub cannot be reached (no network?), so {repo} cannot be downloaded "
        f"now: pull it while online, or use a model folder on this computer. ({detail})"
    )
