"""The ranks this box runs for a paired head box (a model across boxes): each a headless
`vllm serve` in its own session, on the interface towards the head, watched here and ended
whole (every process of its group) when the head asks, when it exits, or when the head box
stops renewing its lease (the head daemon died or the link went down: a rank left waiting
would hold its memory and the rendezvous forever).

The head box drives everything (engines/multinode/head.py); this side only answers its peer
routes (engines/multinode/routes.py)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import psutil

from engines.config.profiles import Profile, profile_from_mapping
from engines.control.service import resolve_device, resolve_model
from engines.core.procs import (
    EngineRecord,
    PidRegistry,
    TrackedProcess,
    descendants,
    end_group,
    exit_code,
    vitals,
)
from engines.envs.manager import EnvManager, env_dir_name
from engines.errors import ConfigError, EngineEnvError, TraylmError
from engines.multinode.digest import model_digest
from engines.multinode.launch import RankPlan, has_rdma, rank_profile
from engines.multinode.network import route_to
from engines.multinode.preflight import Facts
from engines.runtime.adapters import adapter_for
from engines.runtime.adapters.base import EngineRuntime
from engines.runtime.output import last_error, open_engine_log, read_lines, strip_ansi
from engines.runtime.spawn import argv_text, engine_env, start_process, write_run_files

log = logging.getLogger(__name__)

PlaceRank = Callable[[Profile], Awaitable[Profile]]
"""Put a rank on this box's GPUs or host RAM, or refuse (ondemand Placer.place_rank)."""
Resolve = Callable[[Profile], Awaitable[tuple[EngineRuntime, str]]]
LEASE_CHECK_S = 0.5
ENV_PREFIXES = ("NCCL_", "GLOO_", "VLLM_CPU_", "OMP_", "CUDA_DEVICE_MAX_", "TORCH_NCCL_")
"""Engine environment a head box may set on this box (tuning, never a path to code)."""
STOP_GRACE_S = 10.0


@dataclass
class _Rank:
    rank_id: str
    head: str  # the head box's name
    proc: asyncio.subprocess.Process
    log_fh: TextIO
    lease_s: float
    renewed_s: float = field(default_factory=time.monotonic)
    ended: str = ""  # why it ended, once every process of it is gone; "" while it runs
    ending: str = ""  # why it is being ended (the first reason given)
    tail: list[str] = field(default_factory=list)
    tracked: list[TrackedProcess] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


async def resolve(envs: EnvManager, profile: Profile) -> tuple[EngineRuntime, str]:
    """The engine runtime and the model this box runs ``profile`` with; TraylmError says
    what is missing and how to get it."""
    device = resolve_device(profile)
    env = envs.find(profile.engine, device=device, version=profile.engine_version)
    runtime = await asyncio.to_thread(env.runtime)
    return runtime, resolve_model(profile)


async def local_digest(model: str, revision: str | None) -> str:
    """The digest of the model's files on this box; ConfigError when they are not here."""

    def folder() -> Path:
        if model.startswith("/"):
            return Path(model)
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        try:
            return Path(snapshot_download(model, revision=revision, local_files_only=True))
        except LocalEntryNotFoundError:
            raise ConfigError(f"{model} is not downloaded: `traylm models pull {model}`") from None

    path = await asyncio.to_thread(folder)
    return await asyncio.to_thread(model_digest, path)


class FollowerRanks:
    """The ranks this box runs for head boxes, by rank id (``HEAD.ENGINE``)."""

    def __init__(
        self,
        *,
        envs: EnvManager,
        logs_dir: Path,
        pids: PidRegistry,
        box_name: Callable[[], str],
        place: PlaceRank | None = None,
        cache_dir: Path | None = None,
        resolve: Resolve | None = None,
    ) -> None:
        """``place``: this box's planner for a rank; ``resolve``: finds the engine and the
        model for a profile (default: the installed envs and ``resolve_model``)."""
        self._resolve = resolve
        self._envs = envs
        self._logs_dir = logs_dir
        self._pids = pids
        self._box_name = box_name
        self._place = place
        self._cache_dir = cache_dir
        self._ranks: dict[str, _Rank] = {}

    async def resolve(self, profile: Profile) -> tuple[EngineRuntime, str]:
        """The engine runtime and model folder this box runs ``profile``'s rank with."""
        if self._resolve is not None:
            return await self._resolve(profile)
        return await resolve(self._envs, profile)

    async def facts(self, head: str, head_host: str, data: Mapping[str, Any]) -> Facts:
        """What this box would run the head's profile with (the head's preflight)."""
        profile = _profile(data)
        version = problem = digest = model_problem = ""
        model = profile.model
        try:
            runtime, model = await self.resolve(profile)
            version = str(runtime.version)
        except (EngineEnvError, ConfigError) as exc:
            problem = exc.message
        try:
            digest = await local_digest(model, profile.revision)
        except (TraylmError, OSError) as exc:
            model_problem = f"the model is not on {self._box_name()}: " + (
                exc.message if isinstance(exc, TraylmError) else str(exc)
            )
        route = await asyncio.to_thread(route_to, head_host, head)
        return Facts(
            box=self._box_name(),
            engine_version=version,
            engine_problem=problem,
            model_digest=digest,
            model_problem=model_problem,
            time_s=time.time(),
            interface=route.interface,
            address=route.address,
        )

    async def start(self, head: str, data: Mapping[str, Any]) -> dict[str, Any]:
        """Start the rank the head asks for (any earlier one of that id is ended first)."""
        engine_id = data.get("engine_id")
        plan = data.get("plan")
        lease_s = data.get("lease_s")
        if not isinstance(engine_id, str) or not isinstance(plan, dict):
            raise ConfigError("a rank start needs engine_id and plan")
        if not isinstance(lease_s, int | float) or not 1 <= lease_s <= 600:
            raise ConfigError("lease_s must be 1 to 600 seconds")
        rank_id = f"{head}.{engine_id}"
        await self.stop(rank_id)
        profile = _profile(data)
        runtime, model = await self.resolve(profile)
        if self._cache_dir is not None:
            folder = env_dir_name(runtime.engine, str(runtime.version), runtime.device)
            runtime = dataclasses.replace(runtime, cache_dir=self._cache_dir / folder)
        try:
            master = str(plan["master_addr"])
            route = await asyncio.to_thread(route_to, master, head)
            rank = RankPlan(
                nnodes=int(plan["nnodes"]),
                node_rank=int(plan["node_rank"]),
                master_addr=master,
                master_port=int(plan["master_port"]),
                interface=route.interface,
                host_ip=route.address,
                rdma=has_rdma(),
            )
        except (KeyError, TypeError, ValueError):
            raise ConfigError("the rank's plan is malformed") from None
        if self._place is not None:
            profile = await self._place(dataclasses.replace(profile, name=rank_id))
        spec = adapter_for(profile.engine).launch(
            rank_profile(profile, rank), runtime=runtime, port=0, model=model
        )
        spec = write_run_files(spec, self._logs_dir / "engines" / f"{rank_id}.run")
        fh = open_engine_log(
            self._logs_dir / "engines" / f"{rank_id}.log",
            rank_id,
            [
                f"===== rank {rank.node_rank} of {rank.nnodes} for {head}",
                f"===== argv: {argv_text(spec.argv)}",
                f"===== interface {rank.interface} ({rank.host_ip})",
            ],
        )
        try:
            proc = await start_process(spec.argv, engine_env(spec))
        except OSError as exc:
            fh.close()
            raise ConfigError(f"{self._box_name()} cannot start the rank: {exc}") from None
        leader = TrackedProcess.of(proc.pid)
        if leader is not None:
            await asyncio.to_thread(self._pids.put, EngineRecord(rank_id, proc.pid, leader))
        r = _Rank(rank_id, head, proc, fh, float(lease_s))
        self._ranks[rank_id] = r
        r.tasks = [
            asyncio.create_task(self._read(r), name=f"rank-log:{rank_id}"),
            asyncio.create_task(self._watch(r), name=f"rank:{rank_id}"),
        ]
        log.info("rank %s started for %s: pid %d on %s", rank_id, head, proc.pid, rank.interface)
        return {"rank_id": rank_id, "pid": proc.pid, "interface": rank.interface}

    def status(self, rank_id: str) -> dict[str, Any]:
        """The rank's state; each ask renews the head's lease."""
        r = self._ranks.get(rank_id)
        if r is None:
            return {"state": "unknown", "why": f"{self._box_name()} runs no rank {rank_id}"}
        r.renewed_s = time.monotonic()
        if r.ended:
            return {"state": "ended", "why": r.ended, "last_error": last_error(r.tail)}
        return {"state": "running", "pid": r.proc.pid}

    async def stop(self, rank_id: str) -> bool:
        r = self._ranks.pop(rank_id, None)
        if r is None:
            return False
        await self._end(r, "its head box asked")
        return True

    async def stop_all(self) -> None:
        await asyncio.gather(*(self.stop(k) for k in list(self._ranks)))

    def running(self) -> list[dict[str, object]]:
        """The ranks running here, for `traylm status` (``spread.ranks_here``)."""
        return [{"rank_id": k, "pid": r.proc.pid} for k, r in self._ranks.items() if not r.ended]

    async def _read(self, r: _Rank) -> None:
        assert r.proc.stdout is not None

        def line(text: str) -> None:
            clean = strip_ansi(text).rstrip()
            r.tail = [*r.tail[-199:], clean]
            r.log_fh.write(clean + "\n")
            r.log_fh.flush()

        await read_lines(r.proc.stdout, line)

    async def _watch(self, r: _Rank) -> None:
        while True:
            code = await exit_code(r.proc, LEASE_CHECK_S)
            if code is not None:
                why = f"rank {r.rank_id} on {self._box_name()} exited with code {code}"
                break
            if time.monotonic() - r.renewed_s > r.lease_s:
                why = (
                    f"{r.head} stopped asking about rank {r.rank_id} for {r.lease_s:.0f} s (its "
                    "daemon stopped or the link went down)"
                )
                break
            stopped = await self._stopped(r)
            if stopped:
                why = (
                    f"rank {r.rank_id} on {self._box_name()} hangs: its process(es) "
                    f"{stopped} are stopped (SIGSTOP) and cannot make progress"
                )
                break
        log.warning("%s; ending every process of it", why)
        await self._end(r, why, from_watch=True)

    async def _stopped(self, r: _Rank) -> list[int]:
        """The rank's stopped processes; its process tree recorded for the orphan reaper."""
        try:
            found = await asyncio.to_thread(descendants, r.proc.pid)
            known = {(p.pid, p.create_time) for p in r.tracked}
            new = [p for p in found if (p.pid, p.create_time) not in known]
            if new and (leader := TrackedProcess.of(r.proc.pid)) is not None:
                r.tracked.extend(new)
                record = EngineRecord(r.rank_id, r.proc.pid, leader, tuple(r.tracked))
                await asyncio.to_thread(self._pids.put, record)
            _, stopped = await asyncio.to_thread(vitals, r.proc.pid, r.tracked)
        except (OSError, psutil.Error) as exc:
            log.warning("rank %s: cannot read its processes (%s); retrying", r.rank_id, exc)
            return []
        return stopped

    async def _end(self, r: _Rank, why: str, *, from_watch: bool = False) -> None:
        r.ending = r.ending or why
        left = await end_group(r.proc, r.tracked, grace_s=STOP_GRACE_S, trouble=_trouble)
        if left:
            log.error("rank %s: processes %s survived SIGKILL", r.rank_id, left)
        r.ended = r.ending  # said only now: a head that reads "ended" finds nothing left
        await asyncio.to_thread(self._pids.drop, r.rank_id)
        for task in r.tasks:
            if not (from_watch and task is asyncio.current_task()):
                task.cancel()
        with contextlib.suppress(OSError):
            r.log_fh.close()


def _profile(data: Mapping[str, Any]) -> Profile:
    """The head's profile, refused where it would run code on this box that its user did not
    choose: a model's own code, or environment that loads code into the engine."""
    raw = data.get("profile")
    name = data.get("engine_id")
    if not isinstance(raw, dict) or not isinstance(name, str):
        raise ConfigError("the request carries no profile")
    profile = profile_from_mapping(name, raw, f"the head's profile {name!r}")
    if profile.trust_remote_code:
        raise ConfigError(
            f"profile {name!r} runs the model's own code (trust_remote_code); a paired box does "
            "not run that for another box: use a model vLLM supports without it"
        )
    foreign = sorted(k for k in profile.env if not k.startswith(ENV_PREFIXES))
    if foreign:
        raise ConfigError(
            f"profile {name!r} sets {', '.join(foreign)} for the engine; a paired box takes "
            f"only {', '.join(p + '*' for p in ENV_PREFIXES)} from another box"
        )
    return profile


def _trouble(what: str, exc: BaseException) -> None:
    log.warning("%s: %s", what, exc)
