"""``UpgradeFeature``: `traylm engines upgrade ENGINE`, a guarded engine upgrade in the daemon.

Control API (token-protected like the rest of /api):
    POST /api/upgrade          UpgradeConfig fields → 202 UpgradeJob (running), or 200 with
                               state ``current`` when nothing newer exists; bad input (an
                               unknown engine, none installed, no profile using it, a budget
                               too small) is answered at once, before anything is installed
    GET  /api/upgrade          {"job": the running or last UpgradeJob, or null}
    POST /api/upgrade/cancel   stops it; what ran before runs again → UpgradeJob (cancelled)
    POST /api/upgrade/undo     {"engine", "device"} → {"detail"}: back to the version before
Events: upgrade.progress, upgrade.finished; the install's env.install, the measurement's
tune.progress. /api/status gains "upgrade".

A run: the new version is installed beside the one in use (EnvManager: one venv per engine,
version and build), held back from the first moment it is complete, so that no profile starts
on it by itself; then the tuner measures one profile on both versions (``TuneFeature
.run_planned``: the same starts, bench runs through the gateway, interleaved repeats, noise
bands and restore as a tune; the old version is the profile pinned to it, the new one a
candidate that sets ``engine_version``); guard.py judges. Switched: the hold is lifted, and the
profiles that name no version use the new one from their next start. Refused: it stays
installed and held back (a re-download costs minutes to hours; the user may still name it in a
profile); `traylm engines list` says why. Profiles are never rewritten.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path

from engines.config.profiles import Profile, ProfileStore
from engines.control.service import EngineControl, auto_device, resolve_device
from engines.core.jobs import Job, JobKind, JobState
from engines.envs.manager import ENGINE_NAMES, RECIPES, EnvInfo, EnvManager
from engines.errors import ConfigError, TraylmError, UpgradeError, quoted
from engines.events.codec import Event
from engines.events.core import EngineState
from engines.events.tune import TuneConfig, TuneJob, TuneState
from engines.events.upgrade import UpgradeConfig, UpgradeFinished, UpgradeJob, UpgradeProgress
from engines.events.upgrade import UpgradeState as State
from engines.runtime.supervisor import Supervisor
from engines.tune import workloads
from engines.tune.candidates import Candidate
from engines.tune.service import TuneFeature, check_workload_file
from engines.upgrade.guard import judge
from engines.upgrade.history import Upgraded, UpgradeHistory
from engines.upgrade.versions import newer, newest_available

log = logging.getLogger(__name__)
TRIAL = "on trial: the guarded upgrade is measuring it against the version in use"


@dataclasses.dataclass
class _Run:
    base: Profile  # the profile, pinned to the version in use
    tune: TuneConfig
    started: float
    handle: Job[UpgradeJob] | None = None  # the runner's job, set as it starts

    @property
    def job(self) -> UpgradeJob:
        assert self.handle is not None
        return self.handle.record

    @job.setter
    def job(self, value: UpgradeJob) -> None:
        assert self.handle is not None
        self.handle.record = value


class UpgradeFeature:
    name = "upgrade"

    def __init__(
        self,
        *,
        control: EngineControl,
        tune: TuneFeature,
        envs: EnvManager,
        profiles: ProfileStore,
        engines: Supervisor,
        history: UpgradeHistory,
        publish: Callable[[Event], None],
    ) -> None:
        """No I/O."""
        self._control = control
        self._tune = tune
        self._envs = envs
        self._profiles = profiles
        self._engines = engines
        self._history = history
        self.jobs: JobKind[UpgradeJob] = JobKind(
            "upgrade",
            publish=publish,
            finished=lambda s: UpgradeFinished(
                job_id=s.id, state=s.record.state, detail=s.record.detail
            ),
            busy=lambda s: (
                f"upgrade {s.id} of {s.record.engine} is running; wait for it or "
                "stop it with `traylm engines upgrade cancel`"
            ),
            error=UpgradeError,
        )
        self._publish = publish
        self._running: _Run | None = None
        self.last: UpgradeJob | None = None
        self._starting = asyncio.Lock()

    def status(self) -> UpgradeJob | None:
        return self._running.job if self._running is not None else None

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        """The daemon stops: the tune is stopped first (the daemon stopping, it starts nothing
        again), then the upgrade ends as cancelled."""
        if self._running is not None:
            await self._tune.stop()
            await self.cancel()

    @property
    def current(self) -> UpgradeJob | None:
        return self._running.job if self._running is not None else self.last

    # ----------------------------------------------------------------- start

    async def start_upgrade(self, config: UpgradeConfig) -> UpgradeJob:
        """Check what can be checked, then start (returns at once), or a finished job of state
        ``current`` when the version in use is the newest."""
        async with self._starting:  # the look-up awaits: two starts must not both pass
            return await self._start(config)

    async def _start(self, config: UpgradeConfig) -> UpgradeJob:
        engine, device = _target(config)
        self.jobs.refuse_if_running()
        if self._tune.status() is not None:
            raise UpgradeError("a tune is running; wait for it or `traylm tune cancel`")
        old = self._envs.find(engine, device=device)
        new = config.version or await newest_available(old, RECIPES[(engine, device)])
        job = UpgradeJob(
            id=self.jobs.next_id,
            config=config,
            state=State.RUNNING,
            engine=engine,
            device=device,
            old_version=old.version,
            new_version=new,
            started_s=time.time(),
        )
        if not newer(new, old.version):
            self.jobs.next_id += 1
            return self._current(job, old)
        profiles, _ = await asyncio.to_thread(self._profiles.load_all)
        mine = [p for p in profiles if p.engine == engine and resolve_device(p) == device]
        base = dataclasses.replace(
            self._profile(config.model, mine, engine, device), engine_version=old.version
        )
        tune = self._tune_config(config, base)
        workloads.check(tune)
        await check_workload_file(tune)
        await self._tune.planner.check_base(tune, base)  # it runs, and the budget holds two
        what = tune.workload_file if tune.workload == "file" else f"preset {tune.workload}"
        job = dataclasses.replace(job, profile=base.name, workload=what)
        run = _Run(base, tune, time.monotonic())
        run.handle = self.jobs.start(job, lambda _: self._run(run), job_id=job.id)
        self._running = run
        return job

    def _current(self, job: UpgradeJob, old: EnvInfo) -> UpgradeJob:
        if job.config.version and newer(old.version, job.new_version):
            raise ConfigError(
                f"{job.new_version} is older than the {old.version} in use; a guarded upgrade "
                "goes to a newer version (a profile's engine_version runs an older one)"
            )
        done = dataclasses.replace(
            job,
            state=State.CURRENT,
            finished_s=time.time(),
            detail=(
                f"{_name(job)} {old.version} ({job.device}) is the newest"
                + ("" if job.config.version else " the package index has")
                + "; nothing to upgrade"
            ),
        )
        self.last = done
        return done

    def _profile(self, model: str, mine: list[Profile], engine: str, device: str) -> Profile:
        """The profile to measure on, of ``mine`` (those that run ``engine`` on ``device``):
        ``model`` (a profile name or a name it serves), else of the user's own that name no
        version, the one running now, else the first by name."""
        if model:
            named = [p for p in mine if p.name == model or model in p.served_names]
            if not named:
                raise ConfigError(
                    f"no {engine} profile ({device}) named or serving {quoted(model)}; "
                    "`traylm profiles` lists them"
                )
            return named[0]
        using = [
            p for p in mine if p.engine_version is None and not self._profiles.is_preset(p.name)
        ]
        if not using:
            raise UpgradeError(
                f"no profile of yours runs {engine} ({device}): the upgrade measures one on both "
                "versions; make one (`traylm profiles`) or name one with --model"
            )
        running = {
            e.engine_id for e in self._engines.engines.values() if e.state == EngineState.READY
        }
        return next((p for p in using if p.name in running), using[0])

    def _tune_config(self, config: UpgradeConfig, base: Profile) -> TuneConfig:
        """The tuner's config: the given workload, else the last tune's recorded file for
        this profile (the traffic the user pinned), else the chat preset. Goal throughput: a
        recorded file is replayed as fast as possible, which shows a throughput loss too."""
        workload, file = config.workload, config.workload_file
        if not workload and (recorded := self._recorded(base.name)):
            workload, file = "file", recorded
        return TuneConfig(
            model=base.name,
            workload=workload or "chat",
            workload_file=file,
            goal="throughput",
            budget_s=config.budget_s,
            repeat=config.repeat,
            requests=config.requests,
            concurrency=config.concurrency,
        )

    def _recorded(self, profile: str) -> str:
        """The recorded traffic the last tune of ``profile`` replayed, if it is still there."""
        last = self._tune.last
        if last is None or last.profile != profile or last.config.workload != "file":
            return ""
        return last.config.workload_file if Path(last.config.workload_file).is_file() else ""

    # ----------------------------------------------------------------- the run

    async def _run(self, r: _Run) -> UpgradeJob:
        state, why, tune = State.FAILED, "", None
        try:
            await self._install(r)
            state, why, tune = await self._compared(r)
        except _Kept as exc:
            state, why = State.KEPT, exc.message
        except asyncio.CancelledError:
            state = State.CANCELLED
        except TraylmError as exc:
            why = exc.message
        except Exception as exc:  # boundary: the job must end and say so
            log.exception("the upgrade failed")
            why = f"the upgrade failed: {type(exc).__name__}: {exc}"
        detail = await self._settled(r.job, state, why)
        r.job = dataclasses.replace(
            r.job, state=state, detail=detail, finished_s=time.time(), tune=tune or r.job.tune
        )
        if state in (State.SWITCHED, State.KEPT):
            record = Upgraded(
                r.job.engine,
                r.job.device,
                r.job.old_version,
                r.job.new_version,
                state.value,
                time.time(),
            )
            await asyncio.to_thread(self._history.save, record)
        self.last, self._running = r.job, None
        if state == State.CANCELLED:
            raise asyncio.CancelledError  # the job ends cancelled, its record kept
        return r.job

    async def _install(self, r: _Run) -> None:
        """The new version, installed beside the old one and held back (_Kept when it does
        not install: the manager removed the half-made folder)."""
        job = r.job
        self._progress(
            r, "install", f"installing {_name(job)} {job.new_version} beside {job.old_version}"
        )
        install = self._control.begin_install(
            job.engine, device=job.device, version=job.new_version, held=TRIAL
        )
        env = await install.result()
        if install.state == JobState.CANCELLED:
            raise asyncio.CancelledError  # the install cancelled (`traylm engines install`)
        if env is None:
            raise _Kept(f"{job.new_version} did not install: {install.message}")
        await asyncio.to_thread(self._envs.hold, env, TRIAL)  # one installed before, too

    async def _compared(self, r: _Run) -> tuple[State, str, TuneJob | None]:
        """SWITCHED, KEPT or FAILED (could not compare), the reason, the tune."""
        job = r.job
        other = Candidate(
            f"version-{job.new_version}",
            f"{_name(job)} {job.new_version}",
            fields={"engine_version": job.new_version},
        )
        label = f"{_name(job)} {job.old_version} (in use)"
        try:
            plan = await self._tune.planner.pair(r.tune, r.base, other, label=label)
        except TraylmError as exc:  # the new version refuses the profile (a flag it dropped)
            return State.KEPT, f"{job.new_version} cannot run {r.base.name}: {exc.message}", None
        self._progress(
            r,
            "measure",
            f"measuring {r.base.name} on {job.old_version} and {job.new_version} ({job.workload})",
        )
        tune = await self._tune.run_planned(r.tune, plan)
        if tune.state == TuneState.CANCELLED:
            raise asyncio.CancelledError  # `traylm tune cancel` stopped the measurement
        verdict = judge(tune, other.key)
        r.job = dataclasses.replace(r.job, changes=verdict.changes, worse=verdict.worse)
        self._progress(r, "decide", verdict.words)
        if not verdict.measured:
            return State.FAILED, verdict.words, tune
        return (State.SWITCHED if verdict.switch else State.KEPT), verdict.words, tune

    async def _settled(self, job: UpgradeJob, state: State, why: str) -> str:
        """The new version's environment set as the outcome says (the hold lifted, or kept
        with the reason), and the outcome in words."""
        name, old, new = _name(job), job.old_version, job.new_version
        try:
            env: EnvInfo | None = self._envs.find(job.engine, device=job.device, version=new)
        except TraylmError:
            env = None  # not installed (failed, or cancelled during the install)
        if state == State.SWITCHED and env is not None:
            await asyncio.to_thread(self._envs.release, env)
            return (
                f"switched to {name} {new}: {why}. Profiles that name no version use it from "
                f"their next start (`traylm restart PROFILE` for one running now); "
                f"`traylm engines upgrade {job.engine} --undo` goes back to {old}"
            )
        if env is not None:
            held = (
                f"refused by the guarded upgrade: {why}"
                if state == State.KEPT
                else f"not switched to: its guarded upgrade {state.value}"
            )
            await asyncio.to_thread(self._envs.hold, env, held)
        head = {
            State.KEPT: f"kept {name} {old}: {why}",
            State.CANCELLED: f"cancelled: what ran before runs again, on {old}",
        }.get(state, f"could not compare the versions: {why}; {old} stays in use")
        if env is None:
            return head
        cpu = " --cpu" if job.device == "cpu" else ""
        return (
            f"{head}. {new} stays installed but held back (`traylm engines list`): "
            f"`traylm engines remove {job.engine}{cpu} --version {new}` deletes it, "
            f'engine_version = "{new}" in a profile runs it anyway'
        )

    def _progress(self, r: _Run, phase: str, detail: str) -> None:
        self._publish(
            UpgradeProgress(
                job_id=r.job.id, phase=phase, detail=detail, elapsed_s=time.monotonic() - r.started
            )
        )

    # ----------------------------------------------------------------- cancel, undo

    async def cancel(self) -> UpgradeJob:
        if self._running is None:
            raise UpgradeError("no engine upgrade is running")
        return (await self.jobs.cancel()).record

    async def undo(self, engine: str, device: str) -> str:
        """Hold back the version the last upgrade of ``engine`` switched to: profiles that
        name no version go back to the one it replaced."""
        device = auto_device(device)
        if self._running is not None and self._running.job.engine == engine:
            raise UpgradeError(f"an upgrade of {engine} is running; cancel it first")
        last = await asyncio.to_thread(self._history.last, engine, device)
        name = f"{ENGINE_NAMES.get(engine, engine)} ({device})"
        if last is None or last.state not in (State.SWITCHED, State.KEPT):
            raise ConfigError(
                f"nothing to undo: no guarded upgrade of {name} switched versions"
                + (" (the last one was undone)" if last else "")
            )
        if last.state == State.KEPT:
            return (
                f"the last upgrade of {name} kept {last.old}: nothing to undo; {last.new} "
                "stays installed but held back"
            )
        new = self._envs.find(engine, device=device, version=last.new)
        self._envs.find(engine, device=device, version=last.old)  # there is one to go back to
        await asyncio.to_thread(
            self._envs.hold, new, f"held back by `traylm engines upgrade {engine} --undo`"
        )
        undone = dataclasses.replace(last, state="undone", at_s=time.time())
        await asyncio.to_thread(self._history.save, undone)
        return (
            f"{name}: {last.new} is held back again; profiles that name no version use "
            f"{last.old} from their next start"
        )


class _Kept(UpgradeError):
    """The new version cannot be tried (it did not install)."""


def _target(config: UpgradeConfig) -> tuple[str, str]:
    """(engine, device), or ConfigError naming what traylm can upgrade."""
    engine = config.engine
    cuda_only = engine != "vllm" and config.device != "cpu"  # TensorRT-LLM, SGLang: CUDA only
    device = "cuda" if cuda_only else auto_device(config.device)
    if (engine, device) not in RECIPES:
        known = ", ".join(sorted({e for e, _ in RECIPES}))
        raise ConfigError(f"traylm cannot upgrade {engine!r} ({device}); it installs: {known}")
    return engine, device


def _name(job: UpgradeJob) -> str:
    return ENGINE_NAMES.get(job.engine, job.engine)
