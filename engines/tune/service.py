"""``TuneFeature``: `traylm tune MODEL`, one tuning run at a time, in the daemon.

Control API (token-protected like the rest of /api):
    POST /api/tune                 TuneConfig fields → 202 TuneJob (state running); a bad
                                   config, a model no candidate fits or a budget too small is
                                   answered at once, before anything is stopped
    GET  /api/tune                 {"job": the running or last TuneJob, or null}
    POST /api/tune/cancel          stops it, restores what ran before → TuneJob (cancelled)
    POST /api/tune/apply           writes the last finished tune's recommendation (as --apply
                                   would have) → TuneJob (applied); the dashboard's Apply
    POST /api/tune/undo            {"profile": NAME} → {"profile", "detail"}
    GET  /api/tune/previous        {"profiles": names whose pre-tune profile is kept for undo}
    GET  /api/tune/report          the last job's self-contained HTML page
    GET  /api/tune/targets         {"targets": what can be tuned here, "left_out": what cannot,
                                   each with why} (engines/tune/targets.py)
    GET  /api/tune/budget          ?model=NAME&repeat=N → TuneBudget: the least budget here
Events: tune.progress (TuneProgress), tune.finished (TuneFinished). /api/status gains "tune".

A run: the engines serving the model are stopped (kept in mind); each candidate is started as
engine ``tune-<profile>`` from an override of the profile (the profile file is not touched),
waited for, measured by one benchmark run through the gateway (engines/bench: BenchFeature
.run_to_end), and stopped; in rounds, so the repeats interleave (A B C A B C). Whatever way the
run ends (done, failed, cancelled, a crash), the candidate engine is stopped and the engines
that ran before are started again (``finally``). A power candidate's limit is set once its engine
is ready and lifted after its run and in that ``finally`` (engines/tune/power.py; the daemon
stopping lifts it too, and traylm-gpud lifts it when the daemon dies).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from engines.bench.replay import read_workload_file
from engines.bench.service import BenchFeature
from engines.config.live import SettingsView
from engines.config.profiles import Profile, ProfileStore, replica_base, replica_id
from engines.control.service import EngineControl
from engines.core.jobs import Job, JobKind
from engines.envs.manager import EnvManager
from engines.errors import TraylmError, TuneError
from engines.events.bench import BenchState
from engines.events.codec import Event
from engines.events.core import EngineState
from engines.events.tune import TuneConfig, TuneFinished, TuneJob, TuneMeasure, TuneProgress
from engines.events.tune import TuneState as State
from engines.ondemand.service import ModelsOnDemand
from engines.runtime.supervisor import ManagedEngine, Supervisor
from engines.tune import budget, workloads
from engines.tune.candidates import Candidate, engine_id
from engines.tune.figures import figures_of
from engines.tune.interrupted import RunningTuneFile
from engines.tune.plan import CandidatePlanner, Plan
from engines.tune.power import PowerLimits
from engines.tune.previous import PreviousProfiles
from engines.tune.variants import ModelOnDisk
from engines.tune.verdict import decide

log = logging.getLogger(__name__)
STOP_ALLOWANCE_S = budget.STOP_ALLOWANCE_S
DOWN = (EngineState.STOPPED, EngineState.FAILED)
CRASH_NOTICE_S = 5.0
"""How long after a failed bench run the engine's exit may still reach its supervisor (the
gateway sees the connection reset first); a run failed by a crash is then said to be one."""


@dataclasses.dataclass
class _Job:
    plan: Plan
    handle: Job[TuneJob] | None = None  # the runner's job, set as it starts
    measures: list[TuneMeasure] = dataclasses.field(default_factory=list)
    step: int = 0
    steps: int = 0
    simulated: bool = False  # a measurement's GPU figures came from simulated GPUs
    finishing: bool = False  # restoring and deciding: a cancel waits for it instead

    @property
    def job(self) -> TuneJob:
        assert self.handle is not None
        return self.handle.record

    @job.setter
    def job(self, value: TuneJob) -> None:
        assert self.handle is not None
        self.handle.record = value


class TuneFeature:
    name = "tune"

    def __init__(
        self,
        *,
        control: EngineControl,
        engines: Supervisor,
        bench: BenchFeature,
        ondemand: ModelsOnDemand,
        envs: EnvManager,
        profiles: ProfileStore,
        settings: SettingsView,
        gpu_count: Callable[[], Awaitable[int]],
        previous: PreviousProfiles,
        power: PowerLimits,
        local_models: Callable[[], list[ModelOnDisk]],
        publish: Callable[[Event], None],
        running_file: Path | None = None,
    ) -> None:
        """No I/O. ``running_file``: where what ran before a tune is kept while it runs
        (engines/tune/interrupted.py); none, in memory only."""
        self._running_file = RunningTuneFile(running_file) if running_file else None
        self._control = control
        self._engines = engines
        self._bench = bench
        self._profiles = profiles
        self._settings = settings
        self.planner = CandidatePlanner(
            control=control,
            engines=engines,
            ondemand=ondemand,
            envs=envs,
            profiles=profiles,
            gpu_count=gpu_count,
            power=power,
            local_models=local_models,
        )
        self._power = power
        self.previous = previous
        self.jobs: JobKind[TuneJob] = JobKind(
            "tune",
            publish=publish,
            finished=lambda s: TuneFinished(
                job_id=s.id, state=s.record.state, detail=s.record.detail
            ),
            busy=lambda s: (
                f"tune {s.id} of {s.record.profile} is running; wait for it or "
                "stop it with `traylm tune cancel`"
            ),
            error=TuneError,
        )
        self._publish = publish
        self._running: _Job | None = None
        self.last: TuneJob | None = None
        self._last_plan: Plan | None = None  # the last job's, for an apply after its end
        self._stopping = False
        self.interrupted: TuneJob | None = None  # a tune a killed daemon left, said once

    def status(self) -> TuneJob | None:
        """The running job; else a tune the last daemon was killed in, until the next tune."""
        if self._running is not None:
            return self._running.job
        return self.interrupted

    async def start(self) -> None:
        """A tune a killed daemon left running: start again what it had stopped, and keep the
        job as interrupted (GET /api/tune, /api/status) to say so."""
        if self._running_file is None:
            return
        left = await asyncio.to_thread(self._running_file.take)
        if left is None:
            return
        problems = []
        for profile in left.stopped:
            running = self._engines.get(profile.name)
            if running is not None and running.state not in DOWN:
                continue  # started already (autostart)
            try:
                await self._control.start_engine(profile)
            except TraylmError as exc:
                problems.append(f"{profile.name} was not started again: {exc.message}")
        names = ", ".join(p.name for p in left.stopped) or "nothing had been stopped yet"
        detail = (
            f"interrupted: the daemon stopped mid-tune (killed or crashed); what ran before "
            f"was started again: {names}"
        )
        if problems:
            detail = "; ".join((detail, *problems))
        log.warning("tune #%d of %s %s", left.job_id, left.profile, detail)
        self.interrupted = TuneJob(
            id=left.job_id,
            config=TuneConfig(model=left.profile),
            state=State.INTERRUPTED,
            profile=left.profile,
            started_s=left.started_s,
            finished_s=time.time(),
            detail=detail,
        )
        self.last = self.interrupted
        self.jobs.next_id = left.job_id + 1

    async def stop(self) -> None:
        """The daemon stops: the run is cancelled; its engines are not started again."""
        self._stopping = True
        if self._running is not None:
            await self.cancel()

    @property
    def current(self) -> TuneJob | None:
        return self._running.job if self._running is not None else self.last

    # ----------------------------------------------------------------- start

    async def start_tune(self, config: TuneConfig) -> TuneJob:
        """Check everything that can be checked, plan, and start the run (returns at once)."""
        workloads.check(config)
        self._refuse_if_running()
        await check_workload_file(config)
        plan = await self.planner.plan(config)
        return self._begin(config, plan).job

    async def run_planned(self, config: TuneConfig, plan: Plan) -> TuneJob:
        """Run a plan made elsewhere (a guarded upgrade: the profile on its engine version and
        on the new one, ``CandidatePlanner.pair``) as a tune, to its end: the same progress,
        table and restore as any tune's. Cancelling the caller cancels the tune, which restores
        what ran before, and then raises CancelledError."""
        running = self._begin(config, plan)
        assert running.handle is not None
        return await running.handle.result()

    def _refuse_if_running(self) -> None:
        self.jobs.refuse_if_running()

    def _begin(self, config: TuneConfig, plan: Plan) -> _Job:
        self._refuse_if_running()
        job = TuneJob(
            id=self.jobs.next_id,
            config=config,
            state=State.RUNNING,
            profile=plan.base.name,
            started_s=time.time(),
            concurrency=plan.concurrency,
            dropped=tuple(plan.dropped),
            currency=self._settings.current.energy.currency,
        )
        running = _Job(plan)
        handle = self.jobs.start(job, lambda _: self._run(running), job_id=job.id)
        running.handle = handle
        handle.on_cancel = lambda: None if running.finishing else handle.interrupt()
        self._running, self.interrupted = running, None
        return running

    # ----------------------------------------------------------------- the run

    async def _run(self, r: _Job) -> TuneJob:
        started = time.monotonic()
        stopped: list[Profile] = []
        state, detail = State.FAILED, ""
        try:
            await self._clear(r, stopped)
            await self._rounds(r, started)
            state = State.DONE
        except asyncio.CancelledError:
            state, detail = State.CANCELLED, "cancelled"
        except TraylmError as exc:
            detail = exc.message
        except Exception as exc:  # boundary: the restore below must run and the job end
            log.exception("the tune failed")
            detail = f"the tuner failed: {type(exc).__name__}: {exc}"
        finally:
            r.finishing = True
            self._progress(r, "restore", started, detail="starting what ran before")
            restored = await self._finish(r.plan, stopped)
        if restored:
            detail = "; ".join(x for x in (detail, restored) if x)
        r.job = dataclasses.replace(
            r.job,
            state=state,
            detail=detail,
            finished_s=time.time(),
            measures=tuple(r.measures),
            simulated=r.simulated,
        )
        if state == State.DONE:
            r.job = await self._decided(r)
        self.last, self._last_plan, self._running = r.job, r.plan, None
        if state == State.CANCELLED:
            raise asyncio.CancelledError  # the job ends cancelled, its record kept
        return r.job

    async def _rounds(self, r: _Job, started: float) -> None:
        config, plan = r.job.config, r.plan
        default, others = plan.candidates[0], plan.candidates[1:]  # the profile as it is first
        before = r.job.dropped  # left out by the plan; those over the budget are said below
        fit = len(others)
        if plan.per_run_s:  # estimated from the last start: the count planned from the start
            fit = self._fit(
                r, before, others, config.budget_s, plan.per_run_s, config.repeat, "estimated"
            )
        self._set_steps(r, config.repeat * (1 + fit))
        first = await self._measure(r, default, 0, started)
        if first.error:
            raise TuneError(f"your profile {plan.base.name} itself failed: {first.error}")
        per_run = time.monotonic() - started + STOP_ALLOWANCE_S
        left_s = config.budget_s - (time.monotonic() - started)
        fit = self._fit(r, before, others, left_s, per_run, config.repeat - 1, "measured")
        chosen = [default, *others[:fit]]
        self._set_steps(r, config.repeat * len(chosen))
        for round_ in range(config.repeat):
            for c in chosen:
                if round_ == 0 and c is default:
                    continue
                if time.monotonic() - started + per_run > config.budget_s:  # the hard bound
                    r.job = dataclasses.replace(
                        r.job,
                        dropped=(
                            *r.job.dropped,
                            f"{c.label}: run {round_ + 1} left out, the budget "
                            "was spent (slower starts than the first)",
                        ),
                    )
                    self._set_steps(r, r.steps - 1)
                    continue
                await self._measure(r, c, round_, started)

    def _fit(
        self,
        r: _Job,
        before: tuple[str, ...],
        others: list[Candidate],
        left_s: float,
        per_run_s: float,
        default_runs_left: int,
        how: str,
    ) -> int:
        """How many of ``others`` the time left holds; those that it does not, said in the
        job's ``dropped`` after ``before`` (one list, replaced as the estimate gets better)."""
        repeat = r.job.config.repeat
        fit = budget.candidates_that_fit(
            left_s=left_s,
            per_run_s=per_run_s,
            repeat=repeat,
            candidates=len(others),
            default_runs_left=default_runs_left,
        )
        over = [
            f"{c.label}: over the time budget ({per_run_s:.0f} s a measurement, {how})"
            for c in others[fit:]
        ]
        r.job = dataclasses.replace(r.job, dropped=(*before, *over))
        return fit

    def _set_steps(self, r: _Job, steps: int) -> None:
        """The measurements planned now: the one count the progress and the job say."""
        r.steps = steps
        r.job = dataclasses.replace(r.job, planned=steps)

    def _so_far(self, r: _Job, started: float, c: Candidate) -> None:
        """A measurement is in: the job's rows as they stand (GET /api/tune shows them while
        it runs), said by a ``measured`` progress event."""
        energy = self._settings.current.energy
        d = decide(
            r.plan.candidates,
            r.measures,
            goal=r.job.config.goal,
            concurrency=r.plan.concurrency,
            price_per_kwh=energy.electricity_price_per_kwh,
            currency=energy.currency,
        )
        r.job = dataclasses.replace(r.job, measures=tuple(r.measures), rows=d.rows)
        self._progress(r, "measured", started, c, r.measures[-1].round, f"measured {c.label}")

    async def _measure(self, r: _Job, c: Candidate, round_: int, started: float) -> TuneMeasure:
        plan = r.plan
        self._progress(r, "start", started, c, round_, f"starting {c.label}")
        profile = c.profile(plan.base, name=engine_id(plan.base.name))
        t0 = time.monotonic()
        measure = TuneMeasure(candidate=c.key, round=round_)
        try:
            engine = await self._started(profile)
            measure = dataclasses.replace(measure, cold_start_s=time.monotonic() - t0)
            held = await self._power.hold(engine, c.power_pct) if c.power_pct else ""
            self._progress(
                r,
                "measure",
                started,
                c,
                round_,
                f"measuring {c.label}" + (f" ({held})" if held else ""),
            )
            measure = await self._bench_on(engine, r, measure)
        except TraylmError as exc:
            measure = dataclasses.replace(measure, error=exc.message)
        finally:
            await self._stop_candidate(profile.name)
            await self._power.release()  # the engine gone: its GPUs back to what they had
        r.measures.append(measure)
        r.step += 1
        self._so_far(r, started, c)
        return measure

    async def _started(self, profile: Profile) -> ManagedEngine:
        """The candidate's engine, ready; with ``replicas`` each copy is an engine of its own
        (``NAME.r2``...), placed in turn, and the gateway balances the served name over them."""
        copies = [
            dataclasses.replace(profile, name=replica_id(profile.name, k), replicas=1)
            for k in range(1, profile.replicas + 1)
        ]
        for copy in copies:  # cold: the cold start is a measured figure, a warm process made
            # for the next start would compete with the measurement for the CPU, and would
            # take the place of the user's own (which restores their engine at the end)
            await self._control.start_engine(copy, warm=False)
        timeout = self._settings.current.engines.ready_timeout_s + 30
        for copy in copies:
            engine = self._control.engine(copy.name)
            try:
                ready = engine.wait_state((EngineState.READY, *DOWN))
                state = await asyncio.wait_for(ready, timeout)
            except TimeoutError:
                raise TuneError(f"did not become ready in {timeout:.0f} s") from None
            if state != EngineState.READY:
                raise TuneError(f"did not start: {engine.detail}")
        return self._control.engine(profile.name)

    async def _bench_on(self, engine: ManagedEngine, r: _Job, m: TuneMeasure) -> TuneMeasure:
        """One bench run through the gateway, cut short if the engine stops being ready."""
        plan, config = r.plan, r.job.config
        bench = workloads.bench_config(
            config,
            plan.base,
            served=plan.base.effective_served_name,
            name=f"tune {r.job.id} {m.candidate} #{m.round + 1}",
        )
        run_task = asyncio.create_task(self._bench.run_to_end(bench))
        gone = asyncio.create_task(
            engine.wait_state((EngineState.STARTING, EngineState.STOPPING, *DOWN))
        )
        try:
            await asyncio.wait({run_task, gone}, return_when=asyncio.FIRST_COMPLETED)
            if run_task.done() and not _completed(run_task):  # the crash that failed the run
                await asyncio.wait({gone}, timeout=CRASH_NOTICE_S)  # may not be known yet
        finally:
            for task in (run_task, gone):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, TraylmError):
                        await task
        if gone.done() and not gone.cancelled():
            return dataclasses.replace(
                m, error=f"the engine crashed during the measurement: {engine.detail}"
            )
        run = run_task.result()
        m = dataclasses.replace(m, bench_run_id=run.id)
        if run.state != BenchState.DONE or not run.levels:
            return dataclasses.replace(m, error=f"the benchmark {run.state}: {run.detail}")
        r.simulated = r.simulated or run.levels[0].telemetry.simulated
        return dataclasses.replace(m, figures=figures_of(run.levels[0], m.cold_start_s))

    # ----------------------------------------------------------------- engines in and out

    async def _clear(self, r: _Job, stopped: list[Profile]) -> None:
        """Stop every engine serving one of the plan's names (the candidates serve those);
        each one's profile, as it ran, goes into ``stopped`` and the running file before it
        stops (a cancel half-way restores those stopped so far; a killed daemon's next start,
        those in the file)."""
        for e in list(self._engines.engines.values()):
            if e.state not in DOWN and set(e.served_names) & r.plan.served:
                stopped.append(e.profile)
                # shielded: a cancel now must not leave it half-stopped (_finish waits for it)
                await asyncio.shield(self._kept_then_stopped(r, stopped, e.engine_id))

    async def _kept_then_stopped(self, r: _Job, stopped: list[Profile], engine_id: str) -> None:
        """Keep what the tune stopped in the running file, then stop ``engine_id``."""
        if self._running_file is not None:
            job = r.job
            await asyncio.to_thread(
                self._running_file.write, job.id, job.profile, job.started_s, stopped
            )
        await self._control.stop_engine(engine_id)

    async def _stop_candidate(self, name: str) -> None:
        """Stop the candidate's engine and its replicas' (``NAME.r2``...)."""
        for copy in [e for e in self._engines.engines if replica_base(e) == name]:
            with contextlib.suppress(TraylmError):
                await self._control.stop_engine(copy)
            self._engines.remove(copy)

    async def _finish(self, plan: Plan, stopped: list[Profile]) -> str:
        """Stop the candidate, start what ran before (unless the daemon stops): a note of what
        could not be restored, or ""."""
        await asyncio.shield(self._stop_candidate(engine_id(plan.base.name)))
        lifted = await asyncio.shield(self._power.release())
        problems = [lifted] if lifted else []
        if not self._stopping:
            for profile in stopped:
                try:
                    await self._stopped(profile.name)  # a cancel may have come mid-stop
                    await self._control.start_engine(profile)
                except TraylmError as exc:
                    problems.append(f"{profile.name} was not started again: {exc.message}")
        if self._running_file is not None:  # restored, or the daemon stops cleanly
            await asyncio.to_thread(self._running_file.clear)
        return "; ".join(problems)

    async def _stopped(self, engine_id: str) -> None:
        """Until ``engine_id`` is down (a cancel during ``_clear`` does not wait for the stop it
        began); TuneError when it is not within the stop timeout."""
        engine = self._engines.get(engine_id)
        if engine is None or engine.state in DOWN:
            return
        timeout = self._settings.current.engines.stop_timeout_s + 10
        try:
            await asyncio.wait_for(engine.wait_state(DOWN), timeout)
        except TimeoutError:
            raise TuneError(f"it did not stop within {timeout:.0f} s") from None

    # ----------------------------------------------------------------- the result

    async def _decided(self, r: _Job) -> TuneJob:
        config, energy = r.job.config, self._settings.current.energy
        d = decide(
            r.plan.candidates,
            r.measures,
            goal=config.goal,
            concurrency=r.plan.concurrency,
            price_per_kwh=energy.electricity_price_per_kwh,
            currency=energy.currency,
        )
        job = dataclasses.replace(
            r.job, rows=d.rows, recommended=d.recommended, recommendation=d.recommendation
        )
        if config.apply and d.recommended:
            try:
                return await self._apply(job, r.plan)
            except TraylmError as exc:
                return dataclasses.replace(job, detail=f"not applied: {exc.message}")
        return job

    async def _apply(self, job: TuneJob, plan: Plan) -> TuneJob:
        """Write the recommended candidate into the profile (the previous one kept); a power
        limit into the GPUs' persisted limit."""
        winner = next(c for c in plan.candidates if c.key == job.recommended)
        if winner.power_pct is not None:
            return await self._apply_power(job, winner.power_pct)
        path = await asyncio.to_thread(
            self.previous.apply, winner.applied(self._as_saved(plan.base))
        )
        return dataclasses.replace(
            job,
            applied=True,
            detail=f"written to {path}; `traylm tune --undo "
            f"{plan.base.name}` puts the previous one back; it applies at the next load",
        )

    def _as_saved(self, base: Profile) -> Profile:
        """The profile file as it is now; a model folder's or a downloaded model's profile
        (no file yet) as the tune measured it: the apply writes it as a profile of its own."""
        return self._profiles.load(base.name) if base.name in self._profiles.names() else base

    async def apply_last(self) -> TuneJob:
        """Write the last finished tune's recommendation now, as if it had run with --apply
        (the dashboard's Apply, after the user has read the table)."""
        job, plan = self.last, self._last_plan
        if self._running is not None:
            raise TuneError("a tune is running; its result can be applied when it ends")
        if job is None or plan is None or job.state != State.DONE:
            raise TuneError("no finished tune to apply since the daemon started; run one first")
        if not job.recommended:
            raise TuneError(f"the tune recommends keeping {job.profile} as it is: nothing to apply")
        self.last = await self._apply(job, plan)
        return self.last

    async def _apply_power(self, job: TuneJob, pct: int) -> TuneJob:
        """A power limit is the GPU's, not the profile's: it becomes the GPUs' persisted limit
        (engines/tune/power.py), and the profile file is left as it is."""
        try:
            previous = await self._power.persist(pct)
        except TraylmError as exc:
            return dataclasses.replace(job, detail=f"not applied: {exc.message}")
        await asyncio.to_thread(self.previous.keep_power, job.profile, previous)
        return dataclasses.replace(
            job,
            applied=True,
            detail=f"the GPUs' persisted power limit is now {pct} % of the "
            "default (a power limit belongs to the card, not to a profile: it applies to every "
            f"model on it); `traylm tune --undo {job.profile}` puts back the previous one",
        )

    def _progress(
        self,
        r: _Job,
        phase: str,
        started: float,
        c: Candidate | None = None,
        round_: int = 0,
        detail: str = "",
    ) -> None:
        self._publish(
            TuneProgress(
                job_id=r.job.id,
                phase=phase,
                candidate=c.key if c else "",
                round=round_,
                step=r.step,
                steps=r.steps,
                elapsed_s=time.monotonic() - started,
                budget_s=r.job.config.budget_s,
                detail=detail,
            )
        )

    # ----------------------------------------------------------------- cancel, undo

    async def cancel(self) -> TuneJob:
        """Stop the running tune; the restore and the decision (an --apply) run to the end."""
        if self._running is None:
            raise TuneError("no tune is running")
        return (await self.jobs.cancel()).record

    async def undo(self, profile: str) -> str:
        if self._running is not None and self._running.job.profile == profile:
            raise TuneError(f"a tune of {profile} is running; cancel it first")
        power = await asyncio.to_thread(self.previous.kept_power, profile)
        if power is None:
            said = await asyncio.to_thread(self.previous.undo, profile)
        else:
            said = await self._power.put_back(power)
            await asyncio.to_thread(self.previous.forget_power, profile)
            if await asyncio.to_thread(self.previous.kept, profile):
                said += "; " + await asyncio.to_thread(self.previous.undo, profile)
        if self.last is not None and self.last.applied and self.last.profile == profile:
            self.last = dataclasses.replace(
                self.last, applied=False, detail=f"applied, then undone: {said}"
            )
        return said


async def check_workload_file(config: TuneConfig) -> None:
    """A recorded workload that is not JSONL is said now, before anything stops."""
    if config.workload == "file":
        await asyncio.to_thread(read_workload_file, Path(config.workload_file), paced=True)


def _completed(run: asyncio.Task[Any]) -> bool:
    """Whether the finished bench task ended with a finished run (not an error, not a failed
    run)."""
    if run.cancelled() or run.exception() is not None:
        return False
    done = run.result()
    return bool(done.state == BenchState.DONE and done.levels)
