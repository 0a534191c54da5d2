"""The tuner's plan, made before anything stops: the profile to tune, its candidates on this
machine, each checked as a start would check it (the installed engine's flag allow-list, the
GPU count, trust) and against the fit estimate (engines/ondemand placement preview), and the
least budget two repetitions need. Every refusal is a clear error or a "dropped" line."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable

from engines.config.profiles import Profile, ProfileStore
from engines.control.service import EngineControl, resolve_device
from engines.envs.manager import EnvManager
from engines.errors import ConfigError, EngineEnvError, TraylmError, TuneError
from engines.events.tune import TuneBudget, TuneConfig
from engines.ondemand.service import ModelsOnDemand
from engines.runtime.supervisor import Supervisor
from engines.tune import budget, workloads
from engines.tune.candidates import DEFAULT, Candidate, Machine, engine_id, machine_candidates
from engines.tune.drafts import eagle3_draft
from engines.tune.power import PowerLimits
from engines.tune.targets import entry_for, target_profile
from engines.tune.variants import ModelOnDisk, Variant, quantized_variants

ENGINES = ("vllm", "sglang", "trtllm")


@dataclasses.dataclass
class Plan:
    base: Profile
    served: frozenset[str]
    candidates: list[Candidate]  # DEFAULT first
    dropped: list[str]
    concurrency: int
    per_run_s: float = 0.0  # a measurement's time, estimated before any (0: not estimated)


class CandidatePlanner:
    def __init__(
        self,
        *,
        control: EngineControl,
        engines: Supervisor,
        ondemand: ModelsOnDemand,
        envs: EnvManager,
        profiles: ProfileStore,
        gpu_count: Callable[[], Awaitable[int]],
        power: PowerLimits,
        local_models: Callable[[], list[ModelOnDisk]],
    ) -> None:
        """No I/O. ``local_models``: the models on this computer (blocking)."""
        self._control = control
        self._engines = engines
        self.ondemand = ondemand  # the servable list the targets come from (targets.py)
        self._envs = envs
        self._profiles = profiles
        self._gpu_count = gpu_count
        self._power = power
        self._local_models = local_models

    async def plan(self, config: TuneConfig) -> Plan:
        """The plan, or ConfigError / TuneError saying what stands in the way."""
        base = await target_profile(config.model, self._profiles, self.ondemand)
        device = resolve_device(base)
        gpus = await self._gpu_count() if device == "cuda" else 0
        installed = frozenset(e for e in ENGINES if self._installed(e, device))
        bench = workloads.bench_config(config, base, served=base.effective_served_name, name="")
        concurrency = bench.concurrency[0]
        variants, draft, absent = await asyncio.to_thread(self._local, base, device)
        machine = Machine(device, gpus, installed, concurrency, variants, draft)
        found = machine_candidates(base, machine)
        dropped: list[str] = [] if config.only else absent
        if config.only:
            unknown = set(config.only) - {c.key for c in found}
            if unknown:
                raise ConfigError(
                    f"no candidate {', '.join(sorted(unknown))} here; this machine has: "
                    + ", ".join(c.key for c in found[1:])
                )
            found = [c for c in found if c is DEFAULT or c.key in config.only]
        kept: list[Candidate] = []
        for c in found:
            why = await self._refusal(c, base)
            if why is None:
                kept.append(c)
            elif c is DEFAULT:
                raise TuneError(f"{base.name} fits no candidate on this machine: {why}")
            else:
                dropped.append(f"{c.label}: {why}")
        if len(kept) < 2:
            raise TuneError(
                f"{base.name} fits no candidate to compare with on this machine"
                + (f" ({'; '.join(dropped)})" if dropped else "")
            )
        cold_start_s = self._cold_start_prior(base, device)
        budget.check_minimum(config.budget_s, config.repeat, cold_start_s)
        per_run_s = budget.per_run_estimate_s(cold_start_s)
        return Plan(base, frozenset(base.served_names), kept, dropped, concurrency, per_run_s)

    async def check_base(self, config: TuneConfig, base: Profile) -> int:
        """TuneError unless ``base`` itself can start here and the budget holds the least
        comparison; the workload's concurrency."""
        why = await self._refusal(DEFAULT, base)
        if why is not None:
            raise TuneError(f"{base.name} cannot start on this machine: {why}")
        budget.check_minimum(
            config.budget_s, config.repeat, self._cold_start_prior(base, resolve_device(base))
        )
        bench = workloads.bench_config(config, base, served=base.effective_served_name, name="")
        return bench.concurrency[0]

    async def pair(
        self, config: TuneConfig, base: Profile, other: Candidate, *, label: str = DEFAULT.label
    ) -> Plan:
        """A plan of two: ``base`` as it is (its row called ``label``) against ``other`` (a
        guarded upgrade: the same profile on another engine version); TuneError saying why
        either cannot run."""
        concurrency = await self.check_base(config, base)
        why = await self._refusal(other, base)
        if why is not None:
            raise TuneError(f"{other.label}: {why}")
        first = dataclasses.replace(DEFAULT, label=label)
        return Plan(base, frozenset(base.served_names), [first, other], [], concurrency)

    async def least_budget(self, model: str, repeat: int) -> TuneBudget:
        """The smallest budget a tune of ``model`` with ``repeat`` runs works with here."""
        base = await target_profile(model, self._profiles, self.ondemand)
        cold_start_s = self._cold_start_prior(base, resolve_device(base))
        return TuneBudget(
            model=model,
            repeat=repeat,
            least_budget_s=budget.least_budget_s(repeat, cold_start_s),
            words=budget.least_words(repeat, cold_start_s),
        )

    def _local(self, base: Profile, device: str) -> tuple[tuple[Variant, ...], str, list[str]]:
        """From the models on this computer: the quantized variants of ``base``'s model, its
        EAGLE-3 draft's folder (GPU, vLLM), and why either is absent (blocking)."""
        local = self._local_models()
        variants = tuple(quantized_variants(base.model, local))
        absent = [] if variants else [f"quantized variants: none of {base.model} on this computer"]
        draft = ""
        if device == "cuda" and base.engine == "vllm":
            draft, why = eagle3_draft(base.model, local)
            absent += [why] if why else []
        return variants, draft, absent

    def _installed(self, engine: str, device: str) -> bool:
        try:
            self._envs.find(engine, device=device)
        except EngineEnvError:
            return False
        return True

    async def _refusal(self, c: Candidate, base: Profile) -> str | None:
        """Why ``c`` cannot run here (a flag the engine refuses, no room, no power control),
        or None."""
        if c.power_pct is not None and (no_power := self._power.refusal()):
            return no_power
        profile = c.profile(base, name=engine_id(base.name))
        # checked under a name of its own: the engines serving the model now are stopped
        # before the candidates start, so their names do not clash then
        alone = dataclasses.replace(profile, served_name=profile.name, aliases=())
        try:
            await self._control.check_start(alone)
        except TraylmError as exc:
            return exc.message
        entry = await entry_for(base, self.ondemand)
        if entry is None or entry.profile is None:
            return None
        placement = self.ondemand.placer.preview(dataclasses.replace(entry, profile=profile))
        return None if placement.fits else placement.reason

    def _cold_start_prior(self, base: Profile, device: str) -> float:
        for e in self._engines.engines.values():
            s = e.status()
            if base.name == e.engine_id and s.ready_at_s and s.started_at_s:
                return max(1.0, s.ready_at_s - s.started_at_s)
        return budget.TYPICAL_COLD_START_S.get(device, 90.0)
